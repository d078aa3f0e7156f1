"""Input errors: one line naming the field, the value and what is allowed.

The CLI turns an InputError into exit code 2 with its message and no traceback, and a
MeasurementError (the machine gave no measurement) into exit code 1 with its first line.
An infeasible plan is not an error: it is a Result with feasible=False.
"""

from __future__ import annotations


class InputError(ValueError):
    """A bad input: `field` got `value`, and `allowed` says what would do."""

    def __init__(self, field: str, value, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        shown = repr(value)
        if len(shown) > 80:
            # both ends: a path's file name and a list's last items say as much as their start
            shown = shown[:38] + "..." + shown[-39:]
        super().__init__(f"{field}: got {shown}; {allowed}")


class MeasurementError(RuntimeError):
    """`llmsim calibrate` or `validate --torch` got no measurement from this machine: a measuring
    process died or ran past its time. Not bad input and not a bug in the model; the first line
    says which, the rest carries the processes' tracebacks."""
