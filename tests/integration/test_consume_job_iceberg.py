"""The consume job landing in an Iceberg table, on a real local SparkSession against kinesis-mock and
moto, with pyiceberg's SQL catalog on a SQLite file configured as a user configures it (environment
variables): every record produced is in the table exactly once through rounds, reshards, a crashed
slot, a zombie, and drivers that die before their round's commit or cannot make it."""

from __future__ import annotations

from devtools.kinesis_streams import merge_shards, split_shard
from lease_core.leader.assignment_round import slot_ids
from sinks.errors import SinkError
from sinks.table.committer import SUMMARY_APPLICATION, SUMMARY_RANGES, SUMMARY_ROUND
from sinks.table.iceberg import IcebergSink
from spark_jobs import consume_job
from spark_jobs.consume_job import with_round_start
from spark_jobs.round_report import Outcome
from spark_jobs.slot_task import SlotTask, slot_reports
from tests.integration.test_consume_job import BackgroundRound, assert_exactly_once, control, wait_for
from tests.support.pipeline import ConsumerPipeline
from tests.support.shard_ends import KinesisShardEnds

STEER = "tests.support.spark_transforms:steer"


def table_of(pipeline: ConsumerPipeline) -> IcebergSink:
    return IcebergSink(pipeline.output_uri, pipeline.application_name)


def own_snapshots(pipeline: ConsumerPipeline) -> list[dict[str, str]]:
    table = table_of(pipeline).table(refresh=True)
    assert table is not None
    return [
        dict(snapshot.summary.additional_properties)
        for snapshot in table.snapshots()
        if snapshot.summary is not None and snapshot.summary.get(SUMMARY_APPLICATION) == pipeline.application_name
    ]


def test_rounds_and_reshards_land_every_record_once_in_one_table_commit_per_round(
    spark, table_pipeline, shard_ends: KinesisShardEnds
):
    pipeline = table_pipeline
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
    snapshots = own_snapshots(pipeline)
    assert len(snapshots) == len(publishing)
    assert [int(summary[SUMMARY_ROUND]) for summary in snapshots] == [report.round_number for report in publishing]
    assert {report.publication.snapshot_id for report in publishing} <= {
        snapshot.snapshot_id for snapshot in table_of(pipeline).table(refresh=True).snapshots()
    }
    assert all(lease.checkpoint for lease in pipeline.leases().values())
    assert "shardId-" in snapshots[0][SUMMARY_RANGES]


def test_a_slot_task_killed_in_the_middle_of_a_batch_lands_nothing_twice(spark, table_pipeline, spark_control_dir):
    pipeline = table_pipeline
    pipeline.produce(400)
    victim = sorted({record.shard_id for record in pipeline.produced})[0]
    control(spark_control_dir, "crash-once", pipeline, victim).touch()
    report = pipeline.round(spark, workers=2, transform=STEER)
    assert control(spark_control_dir, "crashed", pipeline, victim).exists()
    assert report.succeeded, report.summary()
    assert_exactly_once(pipeline)


def test_a_zombie_that_lost_its_lease_lands_nothing_twice(spark, table_pipeline, spark_control_dir):
    pipeline = table_pipeline
    pipeline.produce(300)
    pipeline.sync()
    assignment = pipeline.assign(1)
    victim = sorted({record.shard_id for record in pipeline.produced})[0]
    control(spark_control_dir, "block", pipeline, victim).touch()
    job = BackgroundRound(lambda: pipeline.consume(spark, 1, assignment.round_number, transform=STEER))
    wait_for(control(spark_control_dir, "blocked", pipeline, victim))
    lease = pipeline.leases()[victim]
    assert pipeline.store.assign_lease(lease, slot_ids(pipeline.application_name, 2)[1]).applied
    spec = with_round_start(spark, pipeline.spec(2, assignment.round_number))
    rescuer = SlotTask(spec, slot_index=1).run()
    assert [lease.outcome for lease in rescuer.leases] == [Outcome.CAUGHT_UP]
    control(spark_control_dir, "release", pipeline, victim).touch()
    zombie = {lease.shard_id: lease for slot in job.join(timeout=120).slots for lease in slot.leases}
    assert zombie[victim].outcome == Outcome.LOST
    pipeline.round(spark, workers=2)  # publishes what the rescuer committed, if the zombie's round did not
    assert_exactly_once(pipeline)


def test_batches_committed_by_a_round_whose_driver_died_before_its_commit_land_with_the_next_round(
    spark, table_pipeline
):
    pipeline = table_pipeline
    pipeline.produce(250)
    pipeline.sync()
    assignment = pipeline.assign(2)
    # The slots commit their checkpoints; the driver dies before the round's table commit.
    slot_reports(spark, with_round_start(spark, pipeline.spec(2, assignment.round_number)))
    assert pipeline.landed() == []
    assert all(lease.committed_batch for lease in pipeline.leases().values())

    report = pipeline.round(spark, workers=2)

    assert report.totals.records == 0 and report.publication is not None
    assert report.publication.batches_published >= 4
    assert_exactly_once(pipeline)


class CatalogDownAtPublication:
    """The driver's sink, except that the round's commit cannot reach the catalog (the slots, in their
    own processes, stage through theirs)."""

    def __init__(self, sink: IcebergSink) -> None:
        self._sink = sink

    def __getattr__(self, name: str):
        return getattr(self._sink, name)

    def publish_round(self, records, identity):
        raise SinkError(self._sink.uri, "cannot reach the catalog: connection refused", retryable=True)


def test_a_round_that_cannot_reach_the_catalog_at_its_end_says_so_and_the_next_one_publishes(
    spark, table_pipeline, monkeypatch
):
    pipeline = table_pipeline
    pipeline.produce(200)
    opened = consume_job.open_round_sink
    monkeypatch.setattr(
        consume_job, "open_round_sink", lambda *args, **kwargs: CatalogDownAtPublication(opened(*args, **kwargs))
    )

    report = pipeline.round(spark, workers=2)

    assert not report.succeeded and report.totals.records == 200
    assert report.publication is not None and "cannot reach the catalog" in (report.publication.error or "")
    assert "NOT VISIBLE YET: the round's committed batches were not published" in report.summary()
    assert pipeline.landed() == []
    monkeypatch.setattr(consume_job, "open_round_sink", opened)
    assert pipeline.round(spark, workers=2).succeeded
    assert_exactly_once(pipeline)
