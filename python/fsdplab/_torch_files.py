"""Where the recorder and the applier (fsdplab_record.py, fsdplab_apply.py) are: beside
fsdplab/torch/__init__.py when installed, tools/torch/ in a source checkout. Imports no torch."""

from __future__ import annotations

import os

_TORCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch")
DIRECTORY = next(d for d in (_TORCH, os.path.join(_TORCH, "..", "..", "..", "tools", "torch"))
                 if os.path.exists(os.path.join(d, "fsdplab_record.py")))


def applier_source() -> str:
    """The applier's source text (export_policy(format="python") writes it into its script)."""
    with open(os.path.join(DIRECTORY, "fsdplab_apply.py"), encoding="utf-8") as f:
        return f.read()
