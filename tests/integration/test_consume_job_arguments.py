"""The consume job's driver refuses bad input before Spark starts, with an error that names it."""

from __future__ import annotations

import pytest

from devtools.kinesis_streams import create_stream, kinesis_client
from spark_jobs.consume_job import EXIT_FAILED, EXIT_USAGE, main
from tests.support.stores import dynamodb_store


@pytest.fixture
def ready(unique_name, kinesis_endpoint, moto_endpoint, monkeypatch, tmp_path) -> dict[str, str]:
    """An application whose tables and stream exist; endpoints come from boto3's variables."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_KINESIS", kinesis_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    dynamodb_store(moto_endpoint, unique_name)
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    return {"app": unique_name, "stream": unique_name, "output": str(tmp_path / "lake")}


def arguments(ready: dict[str, str], **changes: str | None) -> list[str]:
    values = {
        "--application-name": ready["app"],
        "--stream": ready["stream"],
        "--workers": "2",
        "--output-uri": ready["output"],
        **changes,
    }
    return [item for name, value in values.items() if value is not None for item in (name, value)]


CASES = [
    pytest.param({"--workers": "0"}, EXIT_USAGE, "--workers: must be at least 1", id="no-workers"),
    pytest.param({"--stream": None}, EXIT_USAGE, "--stream", id="no-stream"),
    pytest.param(
        {"--set": "failover_time_milis=5"}, EXIT_USAGE, "did you mean 'failover_time_millis'", id="typo-setting"
    ),
    pytest.param({"--stop-at-arrival": "yesterday"}, EXIT_USAGE, "--stop-at-arrival", id="bad-window-end"),
    pytest.param({"--leader-record-version": "v1"}, EXIT_USAGE, "needs --leader-owner", id="version-without-owner"),
    pytest.param({"--application-name": "no-such-app"}, EXIT_FAILED, "'no-such-app' does not exist", id="no-tables"),
    pytest.param(
        {"--stream": "no-such-stream"}, EXIT_FAILED, "'no-such-stream' does not exist", id="no-stream-in-kinesis"
    ),
    pytest.param({"--output-uri": "s3://no-such-bucket/x"}, EXIT_FAILED, "no-such-bucket", id="no-bucket"),
    pytest.param({"--output-uri": "gs://bucket/x"}, EXIT_FAILED, "is not a local path", id="unsupported-sink"),
    pytest.param({"--transform": "json:no_such_function"}, EXIT_FAILED, "no_such_function", id="bad-transform"),
]


@pytest.mark.parametrize(("changes", "status", "message"), CASES)
def test_bad_input_exits_before_spark_with_a_message_naming_it(ready, capsys, changes, status, message):
    assert main(arguments(ready, **changes)) == status
    assert message in capsys.readouterr().err
