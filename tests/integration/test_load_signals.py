"""The figures a round reports for the next assignment measure load (docs/protocol.md §5.2, §6).

A lease's `throughputKBps` is the rate at which data arrives on it, measured over the data time the
rounds' reads covered, end to end: not how fast a round happened to read it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lease_core.metrics.throughput import ema_throughput
from tests.support.pipeline import ConsumerPipeline, pipeline_on_new_stream

RECORD_BYTES = 1000
HOT_KEY, COLD_KEY = "1", str(2**127 + 1)  # explicit hash keys in the first and second shard of two


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    return pipeline_on_new_stream(
        unique_name, 2, kinesis_endpoint, moto_endpoint, tmp_path, initial_position_in_stream="TRIM_HORIZON"
    )


def put(pipeline: ConsumerPipeline, hot: int, cold: int) -> None:
    for count, key in ((hot, HOT_KEY), (cold, COLD_KEY)):
        records = [{"Data": b"x" * RECORD_BYTES, "PartitionKey": "p", "ExplicitHashKey": key} for _ in range(count)]
        for start in range(0, len(records), 500):
            result = pipeline.kinesis.put_records(StreamName=pipeline.streams[0], Records=records[start : start + 500])
            assert result["FailedRecordCount"] == 0


def test_a_leases_throughput_is_the_rate_data_arrives_on_it_over_the_data_time_the_rounds_covered(spark, pipeline):
    put(pipeline, hot=300, cold=30)
    first = pipeline.round(spark, workers=1)
    before = pipeline.leases()
    put(pipeline, hot=300, cold=30)
    time.sleep(2)  # the second window spans this pause although no round reads during it
    second = pipeline.round(spark, workers=1)
    after = pipeline.leases()

    landed = {lease.lease_key: lease.bytes for lease in second.slots[0].leases}
    rates = {}
    for key, lease in after.items():
        window_seconds = (lease.read_through_millis - before[key].read_through_millis) / 1000
        assert window_seconds >= 2
        rates[key] = landed[key] / 1024 / window_seconds
        assert lease.throughput_kbps == pytest.approx(ema_throughput(before[key].throughput_kbps, rates[key]), rel=1e-6)
    hot, cold = sorted(rates.values(), reverse=True)
    # The second round's windows start where the first round's reads reached the tip and end where
    # this round's did, each pair a moment apart, over 2 s and more: its rates keep the 10:1 of the
    # bytes. (The first round's windows start at each shard's first arrival, which the put of the
    # hot shard's records delays for the cold one by a share of a short window: they need not.)
    assert 8 < hot / cold < 12.5
    assert all(lease.outcome == "caught_up" for report in (first, second) for lease in report.slots[0].leases)


def test_each_slot_publishes_its_own_utilization_and_a_slot_that_read_no_lease_publishes_none(spark, pipeline):
    put(pipeline, hot=300, cold=30)
    report = pipeline.round(spark, workers=3)
    by_slot = {slot.worker_id: slot for slot in report.slots}
    idle = [worker for worker, slot in by_slot.items() if not slot.leases]
    assert len(idle) == 1
    assert by_slot[idle[0]].cpu_percent == -1 and pipeline.metrics.get(idle[0]) is None
    for worker, slot in by_slot.items():
        if slot.leases:
            stored = pipeline.metrics.get(worker)
            assert stored is not None and stored.round == report.round_number
            assert stored.stats["C"] == (slot.cpu_percent,) and 0 <= slot.cpu_percent <= 100
