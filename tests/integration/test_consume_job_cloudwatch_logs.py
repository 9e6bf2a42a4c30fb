"""CloudWatch Logs subscription records through the consume job (a real local SparkSession,
kinesis-mock, moto) into an Iceberg table: one row per log event, exactly once across a slot task
killed in the middle of a batch and a second round, control messages left out and counted."""

from __future__ import annotations

from devtools.kinesis_streams import put_entries
from sinks.table.iceberg import IcebergSink
from spark_jobs.record_processing import RecordProcessing
from tests.integration.test_consume_job import control
from tests.support.cloudwatch_logs import control_message, data_message, log_events
from tests.support.pipeline import ConsumerPipeline

STEER = "tests.support.spark_transforms:steer"  # kills the slot's first attempt at the instructed shard


def produce_logs(pipeline: ConsumerPipeline, first: int, records: int) -> tuple[set[str], list[dict]]:
    """Data messages `first`..`first + records - 1`, of 1 to 5 events each, and a control message on
    every fifth key."""
    entries, ids = [], set()
    for n in range(first, first + records):
        events = log_events(f"/app/{n % 3}", n * 10, 1 + n % 5)
        ids.update(str(event["id"]) for event in events)
        entries.append({"Data": data_message(f"/app/{n % 3}", f"i-{n}", events), "PartitionKey": f"key-{n}"})
        if n % 5 == 0:
            entries.append({"Data": control_message(), "PartitionKey": f"key-{n}"})
    written = put_entries(pipeline.kinesis, pipeline.streams[0], entries)
    return ids, [result for _, result in written]


def test_a_cloudwatch_logs_stream_lands_one_row_per_log_event_exactly_once_across_a_killed_slot(
    spark, table_pipeline, spark_control_dir
):
    pipeline = table_pipeline
    ids, written = produce_logs(pipeline, 0, 120)
    victim = sorted({result["ShardId"] for result in written})[0]
    control(spark_control_dir, "crash-once", pipeline, victim).touch()
    processing = RecordProcessing.from_options({"decode": "cloudwatch_logs", "transform": STEER})

    report = pipeline.round(spark, workers=2, processing=processing)
    more_ids, _ = produce_logs(pipeline, 120, 30)
    again = pipeline.round(spark, workers=2, processing=processing)

    assert control(spark_control_dir, "crashed", pipeline, victim).exists()
    assert report.succeeded and again.succeeded, report.summary()
    # A round's report counts what its slots' finishing attempts decoded. The victim's slot dies in both
    # rounds (its first attempt at the shard, in each round's job), and what that attempt committed of
    # its other lease before it died is in the table but not in the report: a control message is
    # counted at most once, and the victim's, which only the retry commits, always.
    assert 0 < report.totals.left_out <= 24 and 0 < again.totals.left_out <= 6, "left out, counted at most once"
    assert "LEFT OUT: " in report.summary()
    table = IcebergSink(pipeline.output_uri, pipeline.application_name).table(refresh=True)
    assert table is not None
    rows = table.scan().to_arrow()
    landed = rows.column("id").to_pylist()
    assert sorted(landed) == sorted(ids | more_ids), "every log event once"
    assert "" not in landed, "no control message"
    positions = set(zip(rows.column("shard_id").to_pylist(), rows.column("sequence_number").to_pylist(), strict=True))
    assert len(positions) == 150, "each data message's events keep its record's position"
