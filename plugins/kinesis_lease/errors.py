"""The one place lease_core's errors become Airflow outcomes.

A retryable error (throttling after every retry, a 5xx, a table still being created, another
round holding the leader lock) raises `AirflowException`: the task fails this try and Airflow
retries it per the task's `retries`. Anything else (bad configuration, a missing stream or table,
a table that is not the application's, a corrupt lease, a refusal from AWS) raises
`AirflowFailException`: retrying cannot help, so the task fails at once and the message says what
to fix.

The consume job's errors come the same way: its driver reports the error that stopped it
(`spark_jobs.job_errors`), and the step raises it as a `ReportedError` with the job's own name,
message and retryability.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from lease_core.errors import LeaseCoreError


def airflow_error(error: LeaseCoreError) -> AirflowException:
    message = f"{error.kind}: {error}"
    return AirflowException(message) if error.retryable else AirflowFailException(message)


@contextmanager
def airflow_outcomes() -> Iterator[None]:
    try:
        yield
    except LeaseCoreError as error:
        raise airflow_error(error) from error
