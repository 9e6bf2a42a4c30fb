"""The error only the consume job raises of its own: the user transform's (the sinks' is `sinks.errors`).

It extends lease_core's hierarchy, so the driver and the operators map it like any other error,
and pickles by value as every error raised in a Spark executor must.
"""

from __future__ import annotations

from dataclasses import dataclass

from lease_core.errors import LeaseCoreError


@dataclass(eq=False, repr=False)
class TransformError(LeaseCoreError):
    """The user transform could not be loaded, raised, or returned something other than a table."""

    spec: str
    problem: str

    def __str__(self) -> str:
        return f"transform {self.spec!r}: {self.problem}"
