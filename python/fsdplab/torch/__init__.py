"""fsdplab.torch: record FSDP training steps as fsdplab traces, and apply exported policies.

    from fsdplab.torch import Recorder, apply_policy

Imports torch (the rest of the fsdplab package does not). The recorder and the applier are the
modules fsdplab_record and fsdplab_apply (one copy each: tools/torch/ in the source tree, which
`pip install .` installs beside this file).
"""

from __future__ import annotations

import sys

from .._torch_files import DIRECTORY, applier_source

if DIRECTORY not in sys.path:
    sys.path.insert(0, DIRECTORY)

from fsdplab_apply import PolicyError, apply_policy, fully_shard_kwargs, load_policy  # noqa: E402
from fsdplab_record import Recorder, detect_units  # noqa: E402

__all__ = ["Recorder", "detect_units", "apply_policy", "load_policy", "fully_shard_kwargs",
           "PolicyError", "applier_source"]
