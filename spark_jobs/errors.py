"""The errors only the data plane raises: the sink and the user transform.

They extend lease_core's hierarchy, so the driver and the operators map them like any other error,
and pickle by value as every error raised in a Spark executor must.
"""

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


@dataclass(eq=False, repr=False)
class TransformError(LeaseCoreError):
    """The user transform could not be loaded, raised, or returned something other than a table."""

    spec: str
    problem: str

    def __str__(self) -> str:
        return f"transform {self.spec!r}: {self.problem}"
