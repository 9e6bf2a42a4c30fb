"""Retention losses are reported, never silent (docs/architecture.md, "Exactly once"), even if their try dies.

Both holes were found by the fault campaign (bench/chaos.py):
1. A loss was known only to the try that read across the gap, in the round report its driver writes
   at the end; a driver that died after its slot committed past the gap left no report, and no later
   round could meet the gap again. The lease now carries the loss until a kept report names it.
2. A redo of a prepared batch reads from the batch's first record inclusive; when that record aged
   out, the loss said "records after <first record>", leaving the first record unnamed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.fault_proxy import FaultProxy
from devtools.stream_records import StreamRecord
from spark_jobs.round_report import RetentionLoss
from spark_jobs.slot_task import SlotTask
from tests.support.pipeline import ConsumerPipeline, pipeline_on_new_stream

STEER = "tests.support.spark_transforms:steer"


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    return pipeline_on_new_stream(
        unique_name,
        1,
        kinesis_endpoint,
        moto_endpoint,
        tmp_path,
        initial_position_in_stream="TRIM_HORIZON",
        failover_time_millis=6000,
    )


def test_a_retention_loss_crossed_by_a_try_whose_driver_dies_is_still_reported_by_a_later_round(
    spark, pipeline, kinesis_endpoint
):
    with FaultProxy(kinesis_endpoint) as proxy:
        pipeline.data_plane_kinesis = proxy.endpoint
        read = pipeline.produce(50)
        assert pipeline.round(spark, workers=1).succeeded
        later = pipeline.produce(100)
        first_kept = later[40]
        proxy.trim(pipeline.streams[0], first_kept.shard_id, first_kept.sequence_number)
        pipeline.sync()
        assignment = pipeline.assign(1)
        # The try's only slot reads across the gap and commits past it, as in a real round; then its
        # driver dies before it folds the slot reports into the round report: this slot report is all
        # there ever was.
        crossed = SlotTask(pipeline.spec(1, assignment.round_number), slot_index=0).run()
        assert [loss.lease_key for lease in crossed.leases for loss in lease.retention_losses] == [first_kept.shard_id]
        lease = pipeline.leases()[first_kept.shard_id]
        assert lease.checkpoint.sequence_number == later[-1].sequence_number
        assert [aged_out.first_available for aged_out in lease.unreported_losses] == [first_kept.sequence_number]
        pipeline.produce(10)
        reports = [pipeline.round(spark, workers=1) for _ in range(2)]
    reported = [loss for report in reports for loss in report.totals.retention_losses]
    assert [(loss.lease_key, loss.after, loss.first_available) for loss in reported] == [
        (first_kept.shard_id, read[-1].sequence_number, first_kept.sequence_number)
    ], "the aged-out records were never reported, or reported again after a kept report"
    assert pipeline.leases()[first_kept.shard_id].unreported_losses == frozenset()


def test_a_redo_whose_first_record_aged_out_names_that_record_in_the_reported_loss(
    spark, pipeline, kinesis_endpoint, spark_control_dir
):
    with FaultProxy(kinesis_endpoint) as proxy:
        pipeline.data_plane_kinesis = proxy.endpoint
        pipeline.produce(20)
        assert pipeline.round(spark, workers=1).succeeded
        later = pipeline.produce(60)
        shard = later[0].shard_id
        failing = spark_control_dir / f"fail-{pipeline.streams[0]}-{shard}"
        failing.touch()
        pipeline.round(spark, workers=1, transform=STEER)  # prepares (C, P] from later[0], commits nothing
        failing.unlink()
        assert pipeline.leases()[shard].pending_checkpoint is not None
        proxy.trim(pipeline.streams[0], shard, later[10].sequence_number)  # later[0..9] age out
        report = pipeline.round(spark, workers=1, transform=STEER)
    landed = set(pipeline.landed())
    aged_out = [record for record in pipeline.produced if record not in landed]
    assert aged_out == later[:10]
    losses = report.totals.retention_losses
    unnamed = [record.sequence_number for record in aged_out if not any(_holds(loss, record) for loss in losses)]
    assert unnamed == [], f"aged out but named by no reported loss ({losses})"


def _holds(loss: RetentionLoss, record: StreamRecord) -> bool:
    first_available = loss.first_available
    return int(loss.after) < int(record.sequence_number) and (
        first_available is None or int(record.sequence_number) < int(first_available)
    )
