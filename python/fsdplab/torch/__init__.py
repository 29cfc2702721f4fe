"""fsdplab.torch: record FSDP training steps as fsdplab traces, and apply exported policies.

    from fsdplab.torch import Recorder, apply_policy

Imports torch (the rest of the fsdplab package does not) and not the compiled extension: from a
source tree, PYTHONPATH=python is enough. `python -m fsdplab.torch.bench_collectives` (under
torchrun) times the ranks' collectives for `fsdplab calibrate`.
"""

from __future__ import annotations

from .. import _applier_source as applier_source
from .apply import PolicyError, apply_policy, fully_shard_kwargs, load_policy
from .recorder import Recorder
from .units import detect_units, trace_dtype
from .writer import rank_path

__all__ = ["Recorder", "detect_units", "trace_dtype", "rank_path", "apply_policy", "load_policy",
           "fully_shard_kwargs", "PolicyError", "applier_source"]
