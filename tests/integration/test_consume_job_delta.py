"""The consume job landing in a Delta table through delta-rs, on a real local SparkSession against
kinesis-mock and moto: every record produced is in the table exactly once through rounds, reshards
and a slot killed in the middle of a batch, each round's batches added in one commit that says which
round and application made it, in a local folder and on S3 (moto); `leasectl verify` and `restore`
read the table's record of what landed, and `maintain` compacts it without changing what it holds."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from devtools.kinesis_streams import merge_shards, split_shard
from sinks.table.committer import SUMMARY_APPLICATION, SUMMARY_ROUND
from sinks.table.delta import DeltaSink
from tests.integration.test_consume_job import assert_exactly_once, control
from tests.integration.test_leasectl_landed import leasectl, verify
from tests.support.leasectl import run_leasectl
from tests.support.pipeline import ConsumerPipeline, pipeline_on_new_stream
from tests.support.shard_ends import KinesisShardEnds

STEER = "tests.support.spark_transforms:steer"


@pytest.fixture
def delta_pipeline(unique_name, kinesis_endpoint, moto_endpoint, tmp_path: Path) -> ConsumerPipeline:
    """A consumer application on a new 4-shard stream landing in a Delta table in a local folder."""
    pipeline = pipeline_on_new_stream(
        unique_name,
        4,
        kinesis_endpoint,
        moto_endpoint,
        tmp_path,
        initial_position_in_stream="TRIM_HORIZON",
        failover_time_millis=6000,
    )
    pipeline.output_uri = f"delta:{tmp_path / 'orders'}"
    return pipeline


def test_rounds_and_reshards_land_every_record_once_in_one_delta_commit_per_round(
    spark, delta_pipeline, shard_ends: KinesisShardEnds
):
    pipeline = delta_pipeline
    pipeline.data_plane_kinesis = shard_ends.endpoint
    pipeline.produce(300, hot_keys=3)
    first = pipeline.round(spark, workers=2)
    assert first.succeeded, first.summary()
    assert first.publication is not None and first.publication.commits == 1
    shards = sorted({record.shard_id for record in pipeline.produced})
    split_shard(pipeline.kinesis, pipeline.streams[0], shards[0])
    merge_shards(pipeline.kinesis, pipeline.streams[0], shards[2], shards[3])
    pipeline.produce(300)
    for _ in range(3):
        assert pipeline.round(spark, workers=2).succeeded
    assert_exactly_once(pipeline)
    publishing = [report for report in pipeline.reports if report.publication and report.publication.commits]
    table = DeltaSink(pipeline.output_uri, pipeline.application_name).table()
    assert table is not None
    own = [entry for entry in table.history() if entry.get(SUMMARY_APPLICATION) == pipeline.application_name]
    assert sorted(int(entry[SUMMARY_ROUND]) for entry in own) == [report.round_number for report in publishing]
    assert {report.publication.snapshot_id for report in publishing} == {entry["version"] for entry in own}


def test_rounds_land_every_record_once_in_a_delta_table_on_s3_where_leasectl_verifies_them(spark, delta_pipeline):
    pipeline = delta_pipeline
    bucket = f"lake-{pipeline.application_name.lower()}"[:63].rstrip("-.")
    boto3.client("s3", endpoint_url=pipeline.dynamodb_endpoint).create_bucket(Bucket=bucket)  # moto serves S3 too
    pipeline.output_uri = f"delta:s3://{bucket}/tables/orders"
    for produced in (300, 100):
        pipeline.produce(produced)
        report = pipeline.round(spark, workers=2)
        assert report.succeeded and report.publication is not None, report.summary()
        assert report.publication.commits == 1

    assert_exactly_once(pipeline)
    verified = run_leasectl(
        *("--app", pipeline.application_name, "--set", "aws_region=us-east-1"),
        *("verify", "--output-uri", pipeline.output_uri, "--json"),
        dynamodb=pipeline.dynamodb_endpoint,
        kinesis=pipeline.kinesis_endpoint,
        AWS_ENDPOINT_URL_S3=pipeline.dynamodb_endpoint,
    )
    assert verified.returncode == 0, verified.stderr
    document = json.loads(verified.stdout)
    assert document["findings"] == [] and document["batches"] >= 4, document


def test_a_slot_task_killed_in_the_middle_of_a_batch_lands_nothing_twice_in_a_delta_table(
    spark, delta_pipeline, spark_control_dir
):
    pipeline = delta_pipeline
    pipeline.produce(400)
    victim = sorted({record.shard_id for record in pipeline.produced})[0]
    control(spark_control_dir, "crash-once", pipeline, victim).touch()
    report = pipeline.round(spark, workers=2, transform=STEER)
    assert control(spark_control_dir, "crashed", pipeline, victim).exists()
    assert report.succeeded, report.summary()
    assert_exactly_once(pipeline)


def test_leasectl_verifies_the_checkpoints_against_the_delta_table_and_restores_a_lost_lease_table_from_it(
    spark, delta_pipeline
):
    pipeline = delta_pipeline
    pipeline.produce(300)
    assert pipeline.round(spark, workers=2).succeeded
    status, document = verify(pipeline)
    assert status == 0 and document["findings"] == [] and document["batches"] >= 4, document
    held = {key: lease.checkpoint for key, lease in pipeline.leases().items()}
    # The lease table is lost and made again: the sync starts every lease at TRIM_HORIZON.
    dynamodb = boto3.client("dynamodb", endpoint_url=pipeline.dynamodb_endpoint, region_name="us-east-1")
    dynamodb.delete_table(TableName=pipeline.config.lease_table)
    dynamodb.get_waiter("table_not_exists").wait(TableName=pipeline.config.lease_table)
    assert leasectl(pipeline, "init").returncode == 0
    pipeline.sync()

    assert {finding["finding"] for finding in verify(pipeline)[1]["findings"]} == {"sink ahead of the checkpoint"}
    restored = leasectl(pipeline, "restore", "--output-uri", pipeline.output_uri, "--yes")
    assert restored.returncode == 0, restored.stderr

    assert {key: lease.checkpoint for key, lease in pipeline.leases().items()} == held
    pipeline.produce(100)
    assert pipeline.round(spark, workers=2).succeeded
    assert_exactly_once(pipeline)
    maintained = leasectl(pipeline, "maintain", "--output-uri", pipeline.output_uri, "--yes")
    assert maintained.returncode == 0, maintained.stderr
    assert "compacted" in maintained.stdout and "checkpointed the log" in maintained.stdout, maintained.stdout
    table = DeltaSink(pipeline.output_uri, pipeline.application_name).table()
    assert table is not None and table.history(1)[0]["operation"] == "OPTIMIZE"
    assert_exactly_once(pipeline)
