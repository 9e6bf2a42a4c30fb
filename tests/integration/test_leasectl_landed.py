"""`leasectl verify` and `leasectl restore`, the installed command as a process, against an Iceberg table
that real rounds (a local SparkSession, kinesis-mock, moto) landed into: the table as the record of
what landed, checked against the checkpoints and used to rebuild a lost lease table."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import boto3

from devtools.kinesis_streams import create_stream
from lease_core.model.sequence import TRIM_HORIZON
from sinks.batch_sink import BatchRange
from sinks.table.iceberg import IcebergSink
from spark_jobs.consume_job import with_round_start
from spark_jobs.slot_task import slot_reports
from tests.integration.test_consume_job import assert_exactly_once
from tests.support.iceberg_tables import rows
from tests.support.leasectl import run_leasectl
from tests.support.pipeline import ConsumerPipeline


def leasectl(pipeline: ConsumerPipeline, *arguments: str):
    return run_leasectl(
        "--app",
        pipeline.application_name,
        "--set",
        "aws_region=us-east-1",
        *arguments,
        dynamodb=pipeline.dynamodb_endpoint,
        kinesis=pipeline.kinesis_endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
    )


def verify(pipeline: ConsumerPipeline) -> tuple[int, dict]:
    result = leasectl(pipeline, "verify", "--output-uri", pipeline.output_uri, "--json")
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def test_verify_finds_the_table_and_the_checkpoints_in_agreement_after_rounds(spark, table_pipeline):
    pipeline = table_pipeline
    for produced in (200, 150):
        pipeline.produce(produced)
        assert pipeline.round(spark, workers=2).succeeded

    status, document = verify(pipeline)

    assert status == 0, document
    assert document["findings"] == [] and document["batches"] >= 4


def test_verify_notes_committed_batches_awaiting_the_next_rounds_commit_and_is_not_alarmed(spark, table_pipeline):
    pipeline = table_pipeline
    pipeline.produce(200)
    assert pipeline.round(spark, workers=2).succeeded
    pipeline.produce(100)
    pipeline.sync()
    assignment = pipeline.assign(2)
    slot_reports(spark, with_round_start(spark, pipeline.spec(2, assignment.round_number)))  # the driver died

    status, document = verify(pipeline)

    assert status == 0, document
    assert {finding["finding"] for finding in document["findings"]} == {"awaiting publication"}


def test_a_lost_lease_table_is_restored_from_the_table_and_nothing_lands_twice(spark, table_pipeline):
    pipeline = table_pipeline
    pipeline.produce(300)
    assert pipeline.round(spark, workers=2).succeeded
    held = {key: lease.checkpoint for key, lease in pipeline.leases().items()}
    # The lease table is lost and made again: the sync starts every lease at TRIM_HORIZON.
    dynamodb = boto3.client("dynamodb", endpoint_url=pipeline.dynamodb_endpoint, region_name="us-east-1")
    dynamodb.delete_table(TableName=pipeline.config.lease_table)
    dynamodb.get_waiter("table_not_exists").wait(TableName=pipeline.config.lease_table)
    assert leasectl(pipeline, "init").returncode == 0
    pipeline.sync()
    assert {lease.checkpoint for lease in pipeline.leases().values()} == {TRIM_HORIZON}

    status, document = verify(pipeline)
    assert status == 1
    assert {finding["finding"] for finding in document["findings"]} == {"sink ahead of the checkpoint"}
    refused = leasectl(pipeline, "restore", "--output-uri", pipeline.output_uri)
    assert refused.returncode == 2 and "add --yes" in refused.stderr
    restored = leasectl(pipeline, "restore", "--output-uri", pipeline.output_uri, "--yes")
    assert restored.returncode == 0, restored.stderr

    assert {key: lease.checkpoint for key, lease in pipeline.leases().items()} == held
    assert verify(pipeline)[0] == 0
    pipeline.produce(100)
    assert pipeline.round(spark, workers=2).succeeded
    assert_exactly_once(pipeline)


def test_verify_and_restore_judge_a_recreated_stream_by_its_own_positions_only(spark, table_pipeline):
    """The stream is deleted and created again under its name, and the application starts over with a
    new lease table: its single-stream lease keys are the old ones (bare shard ids), and the new
    stream's sequence numbers start over. The table's positions of the old stream are neither a fault
    of the new leases nor a checkpoint to restore them to, and the new stream's records land."""
    pipeline = table_pipeline
    pipeline.produce(200)
    assert pipeline.round(spark, workers=2).succeeded
    stream = pipeline.streams[0]
    pipeline.kinesis.delete_stream(StreamName=stream)
    pipeline.kinesis.get_waiter("stream_not_exists").wait(StreamName=stream, WaiterConfig={"Delay": 1})
    time.sleep(1.1)  # a creation time of its own (the incarnation is told by ARN and creation second)
    create_stream(pipeline.kinesis, stream, 4)
    assert leasectl(pipeline, "teardown", "--yes").returncode == 0
    assert leasectl(pipeline, "init").returncode == 0
    pipeline.sync()

    status, document = verify(pipeline)
    assert status == 0, document
    restored = leasectl(pipeline, "restore", "--output-uri", pipeline.output_uri, "--yes")
    assert restored.returncode == 0 and "restored" not in restored.stdout, restored.stdout
    assert {lease.checkpoint for lease in pipeline.leases().values()} == {TRIM_HORIZON}

    pipeline.produce(100)
    assert pipeline.round(spark, workers=2).succeeded
    assert len(rows_of(pipeline)) == 300
    assert verify(pipeline)[0] == 0


def test_verify_of_a_parquet_dataset_says_it_records_nothing_to_verify(table_pipeline, tmp_path):
    result = leasectl(table_pipeline, "verify", "--output-uri", str(tmp_path / "lake"))
    assert result.returncode == 2
    assert "is a Parquet dataset, which does not record what landed" in result.stderr


def test_maintain_removes_what_a_fenced_attempt_staged_and_keeps_the_table_whole(spark, table_pipeline):
    pipeline = table_pipeline
    pipeline.produce(200)
    assert pipeline.round(spark, workers=2).succeeded
    sink = IcebergSink(pipeline.output_uri, pipeline.application_name)
    warehouse = Path(sink.table().metadata.location.removeprefix("file://"))
    before = {path for path in warehouse.rglob("*") if path.is_file()}
    zombie = BatchRange(
        "shardId-000000000000", pipeline.streams[0], "shardId-000000000000", TRIM_HORIZON, None, TRIM_HORIZON
    )
    sink.stage(zombie, rows(1, 5), "a-fenced-attempt")
    staged = {path for path in warehouse.rglob("*") if path.is_file()} - before
    days_ago = time.time() - 4 * 86400
    for path in warehouse.rglob("*"):
        if path.is_file():
            os.utime(path, (days_ago, days_ago))

    refused = leasectl(pipeline, "maintain", "--output-uri", pipeline.output_uri)
    assert refused.returncode == 2 and "add --yes" in refused.stderr
    result = leasectl(pipeline, "maintain", "--output-uri", pipeline.output_uri, "--yes")

    assert result.returncode == 0, result.stderr
    removed = {
        Path(line.split("removed ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("  removed ")
    }
    assert staged <= removed
    assert verify(pipeline)[0] == 0
    assert_exactly_once(pipeline)


def rows_of(pipeline: ConsumerPipeline) -> list[dict]:
    table = IcebergSink(pipeline.output_uri, pipeline.application_name).table(refresh=True)
    assert table is not None
    return table.scan(selected_fields=("sequence_number",)).to_arrow().to_pylist()
