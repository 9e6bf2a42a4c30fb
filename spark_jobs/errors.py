"""The errors only the consume job raises of its own: the user's processing's (the sinks' is `sinks.errors`),
and the error its driver reports to the step that started it.

They extend lease_core's hierarchy, so the driver and the operators map them like any other error,
and pickle by value as every error raised in a Spark executor must.
"""

from __future__ import annotations

from dataclasses import dataclass

from lease_core.errors import LeaseCoreError


@dataclass(eq=False, repr=False)
class TransformError(LeaseCoreError):
    """The user's processing failed: the decoder or the transform (`role`) named by `spec` raised, or
    returned something other than a row or a table. Not retryable: the same batch fails the same way."""

    spec: str
    problem: str
    role: str = "transform"  # or "decoder"

    def __str__(self) -> str:
        return f"{self.role} {self.spec!r}: {self.problem}"


@dataclass(eq=False, repr=False)
class FunctionLoadError(TransformError):
    """The decoder or transform named by `spec` cannot be loaded: its module is not found or fails to
    import, it has no such attribute, the attribute is not callable, or it declares columns it cannot
    have. Raised before anything is read; not retryable: the pipeline names the wrong function."""

    def __str__(self) -> str:
        return f"{self.role} {self.spec!r} cannot be loaded: {self.problem}"


@dataclass(eq=False, repr=False)
class ReportedError(LeaseCoreError):
    """An error the consume job's driver reported before it exited (`spark_jobs.job_errors`): its
    class name, its message, and whether a retry can succeed, as the driver knew them."""

    name: str
    message: str
    retryable: bool = False

    def __str__(self) -> str:
        return self.message

    @property
    def kind(self) -> str:
        return self.name
