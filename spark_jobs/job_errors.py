"""The error the consume job's driver reports to the step that started it.

A driver that stops without running its round (a usage error, a setting out of range, a decoder or
transform that cannot be loaded, an output it cannot open, a missing table or stream, DynamoDB or
Kinesis unreachable, the leader lock held by another round) writes its error to `--error-file` as a
small JSON document: the error's name, its whole message, and whether a retry can succeed. The
Airflow step passes a fresh path and reads it after spark-submit exits non-zero, so the step fails
with the job's own error (`ReportedError`, mapped like any other: retried only when it is retryable),
not with spark-submit's exit status. A round that ran writes its round report instead, which says
what failed in it.

The path is on the machine that runs the driver: the step's own when spark-submit runs the driver
there (client deploy mode, the default). A driver that runs elsewhere (cluster deploy mode) cannot
write it, and its error is in its own log only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from lease_core.errors import LeaseCoreError
from lease_core.ops.command_line import UsageError
from spark_jobs.errors import ReportedError

log = logging.getLogger(__name__)


def write_job_error(path: str, error: BaseException) -> None:
    """`error` as the driver's reported error at `path`; a path that cannot be written is logged, not raised
    (the driver's exit status and its log still say that it failed). An error of ours says whether a
    retry can succeed; bad arguments never; any other error is not known not to, as Airflow retries it."""
    if isinstance(error, LeaseCoreError):
        name, retryable = error.kind, error.retryable
    else:
        name, retryable = type(error).__name__, not isinstance(error, UsageError)
    document = {"error": name, "message": str(error), "retryable": retryable}
    try:
        Path(path).write_text(json.dumps(document))
    except OSError as failure:
        log.warning("the job's error could not be written to %s (%s)", path, failure)


def read_job_error(path: str) -> ReportedError | None:
    """The error the driver reported at `path`; None when it reported none (or not in a form written above)."""
    try:
        document = json.loads(Path(path).read_text())
        return ReportedError(str(document["error"]), str(document["message"]), document["retryable"] is True)
    except (OSError, ValueError, KeyError, TypeError) as failure:
        log.info("the consume job reported no error at %s (%s)", path, failure)
        return None
