"""The consume job's driver refuses bad input before Spark starts, with an error that names it."""

from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType

from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.model.lease import Lease, StreamIdentifier
from spark_jobs.consume_job import EXIT_FAILED, EXIT_USAGE, main
from tests.support.iceberg_tables import URI, catalog_properties
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
    pytest.param(
        {"--bad-records": "dead_letter"},
        EXIT_USAGE,
        "--bad-records: dead_letter needs a decoder (decode)",
        id="dead-letters-no-decoder",
    ),
    pytest.param(
        {"--bad-records": "skip"},
        EXIT_USAGE,
        "--bad-records: must be one of fail, dead_letter, got 'skip'",
        id="unknown-bad-records",
    ),
    pytest.param({"--dead-letter-max-share": "2"}, EXIT_USAGE, "above 0 and at most 1, got '2'", id="share-above-one"),
    pytest.param({"--round": "0"}, EXIT_USAGE, "argument --round: must be at least 1, got 0", id="round-zero"),
    pytest.param(
        {"--report-uri": "hdfs://namenode/round.json"},
        EXIT_USAGE,
        "argument --report-uri: must be a local path",
        id="report-on-hdfs",
    ),
    pytest.param(
        {"--report-uri": "s3://bucket"},
        EXIT_USAGE,
        "argument --report-uri: an S3 report URI needs a bucket and a key",
        id="report-without-key",
    ),
    pytest.param(
        {"--report-uri": "s3://no-such-bucket/round.json"},
        EXIT_USAGE,
        "--report-uri: bucket 'no-such-bucket' of 's3://no-such-bucket/round.json' does not exist",
        id="report-bucket-missing",
    ),
]


@pytest.mark.parametrize(("changes", "status", "message"), CASES)
def test_bad_input_exits_before_spark_with_a_message_naming_it(ready, capsys, changes, status, message):
    assert main(arguments(ready, **changes)) == status
    error = capsys.readouterr().err
    assert message in error
    assert error.startswith("consume_job: ") and "consume_job: consume_job" not in error


def test_a_report_directory_that_cannot_be_created_exits_2_before_spark(ready, capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(arguments(ready, **{"--report-uri": str(blocker / "rounds" / "round.json")})) == EXIT_USAGE
    error = capsys.readouterr().err
    assert f"--report-uri: directory {str(blocker / 'rounds')!r} cannot be created or written" in error


def test_a_config_file_that_is_not_utf8_exits_2_naming_the_file(ready, capsys, tmp_path):
    config = tmp_path / "consumer.toml"
    config.write_bytes('lease_assignment_strategy = "café"\n'.encode("latin-1"))
    assert main(arguments(ready, **{"--config": str(config)})) == EXIT_USAGE
    error = capsys.readouterr().err
    assert str(config) in error and "not UTF-8" in error


def test_a_lease_table_keyed_in_the_other_mode_is_refused_before_any_slot_runs(ready, moto_endpoint, capsys):
    """A multi-stream table read in single-stream mode: every slot would skip every lease."""
    store = dynamodb_store(moto_endpoint, ready["app"])
    stream = StreamIdentifier("123456789012", ready["stream"], 1)
    store.create_lease_if_not_exists(
        Lease.for_stream(stream, "shardId-000000000000", lease_owner=f"{ready['app']}-worker-1")
    )
    assert main(arguments(ready)) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "'multi_stream'" in error and "this consume job runs in single-stream mode" in error


def test_an_iceberg_table_that_cannot_hold_the_records_exits_before_spark(
    ready, capsys, iceberg_catalog, tmp_path, monkeypatch
):
    for key, value in {"type": "sql", **catalog_properties(tmp_path)}.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__LAKE__{key.upper()}", value)
    iceberg_catalog.create_table(("kinesis", "orders"), schema=Schema(NestedField(1, "data", StringType())))

    assert main(arguments(ready, **{"--output-uri": URI})) == EXIT_FAILED
    assert "column 'data' is binary in the batch but string in the table" in capsys.readouterr().err
