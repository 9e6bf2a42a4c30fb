"""What the consume job reports when it stops without a round, what the step makes of it, and how much of
a round's error its history keeps."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from kinesis_lease.errors import airflow_error

from lease_core.errors import ConfigurationError, LeadershipUnavailableError, ThrottledError
from lease_core.ops.command_line import UsageError
from sinks.errors import SinkError
from spark_jobs.errors import FunctionLoadError
from spark_jobs.job_errors import read_job_error, write_job_error
from spark_jobs.round_report import ROUND_ERROR_CHARACTERS, abridged

REPORTED = [
    pytest.param(
        FunctionLoadError("my_company.evnts:decode", "No module named 'my_company.evnts'", "decoder"),
        "FunctionLoadError: decoder 'my_company.evnts:decode' cannot be loaded: No module named 'my_company.evnts'",
        False,
        id="a decoder that cannot be loaded",
    ),
    pytest.param(
        ConfigurationError("failover_time_millis", "must be positive, got -5"),
        "ConfigurationError: configuration key 'failover_time_millis': must be positive, got -5",
        False,
        id="a setting out of range",
    ),
    pytest.param(
        SinkError("/lake", "Not a directory"), "SinkError: sink '/lake': Not a directory", False, id="a bad output"
    ),
    pytest.param(UsageError("--workers: must be at least 1"), "UsageError: --workers: must be at least 1", False),
    pytest.param(
        ThrottledError("dynamodb", "DescribeTable", "ThrottlingException", 6),
        "ThrottledError: dynamodb DescribeTable failed after 6 attempt(s): ThrottlingException",
        True,
        id="throttling",
    ),
    pytest.param(
        LeadershipUnavailableError("dag/run/1"),
        "LeadershipUnavailableError: the leader lock is held by 'dag/run/1'; only one round of an application "
        "runs at a time",
        True,
        id="another round's lock",
    ),
    pytest.param(
        SinkError("s3://lake", "503 SlowDown", retryable=True),
        "SinkError: sink 's3://lake': 503 SlowDown",
        True,
        id="a storage failure that may pass",
    ),
    pytest.param(
        KeyError("credentials"), "KeyError: 'credentials'", True, id="an error not ours, retried as Airflow would"
    ),
]


@pytest.mark.parametrize(("error", "text", "retryable"), REPORTED)
def test_the_jobs_reported_error_fails_the_step_with_its_own_name_and_message_retried_only_if_it_may_pass(
    error, text, retryable, tmp_path
):
    write_job_error(str(tmp_path / "error.json"), error)
    reported = read_job_error(str(tmp_path / "error.json"))
    assert reported is not None
    outcome = airflow_error(reported)
    assert str(outcome) == text
    assert isinstance(outcome, AirflowException) and isinstance(outcome, AirflowFailException) is not retryable


def test_no_reported_error_when_the_job_wrote_none_or_something_else(tmp_path):
    (tmp_path / "other.json").write_text('{"records": 3}')
    assert read_job_error(str(tmp_path / "none.json")) is None
    assert read_job_error(str(tmp_path / "other.json")) is None


def test_a_round_error_that_fits_is_kept_whole_and_a_longer_one_keeps_its_beginning_and_its_end():
    cause = "FunctionLoadError: decoder 'a:b' cannot be loaded: No module named 'a'"
    assert abridged(cause) == cause and abridged(None) is None
    long = cause + " " + "x" * 5000 + " exit status 1"
    kept = abridged(long)
    assert kept is not None and len(kept) == ROUND_ERROR_CHARACTERS
    assert kept.startswith(cause) and kept.endswith("exit status 1") and " […] " in kept
