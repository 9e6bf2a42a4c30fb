"""The sinks' error. It extends lease_core's hierarchy, so the driver and the operators map it like any
other error, and pickles by value as every error raised in a Spark executor must."""

from __future__ import annotations

from dataclasses import dataclass

from lease_core.errors import LeaseCoreError


@dataclass(eq=False, repr=False)
class SinkError(LeaseCoreError):
    """The output dataset cannot be written where the job was told to write it.

    Retryable when the storage answered with a failure that may go away (a 5xx, a dropped
    connection); not retryable for a missing bucket, a path that is not a directory, or a refusal.
    """

    uri: str
    problem: str
    retryable: bool = False

    def __str__(self) -> str:
        return f"sink {self.uri!r}: {self.problem}"
