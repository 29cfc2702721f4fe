"""The exceptions of the fsdplab package: one per exit status of the command line."""

from __future__ import annotations

from typing import Any


class Error(Exception):
    """Anything fsdplab refuses or fails at; the message is the command line's."""


class UsageError(Error, ValueError):
    """Bad options or impossible values (the command's exit status 1)."""


class InvalidInput(Error):
    """A malformed or inconsistent trace, policy, cluster or profile (exit status 2)."""


class StepFailed(Error):
    """The simulated step would fail: missing plane, divergence, deadlock, out of memory, or
    no policy under the cap (exit status 3). `result` is what the command still writes: the
    report of simulate(), the table of sweep(), the search of tune()."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result
