"""Leases at LATEST across rounds, against kinesis-mock and moto with slots run in-process.

A round opens its shards anew, so a lease still at LATEST must not be opened at "now" again: what
arrived on a quiet shard between two rounds would be skipped, round after round, and nothing would
say so. The sync pins the leases it creates at LATEST, a claim pins one that is not pinned yet, and
every read (the slot's and the leader's idle check) opens AT_TIMESTAMP of the pin.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.model.sequence import LATEST, ExtendedSequenceNumber
from lease_core.retrieval.pending_work import PendingWork, find_pending_work
from spark_jobs.round_report import LeaseReport, Outcome
from spark_jobs.slot_task import SlotTask
from tests.support.pipeline import ConsumerPipeline, duplicates
from tests.support.stores import FAST_RETRIES

# Arrival times are the emulator's, pins the host's (the same clock here, in milliseconds): a record
# put this long before a pin is before it for certain.
CLOCK_STEP_SECONDS = 0.02


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    return ConsumerPipeline(
        unique_name,
        (unique_name,),
        kinesis_endpoint,
        moto_endpoint,
        str(tmp_path / "lake"),
        settings={"initial_position_in_stream": "LATEST"},
    )


def slot_round(pipeline: ConsumerPipeline, round_number: int) -> LeaseReport:
    pipeline.assign(1)
    (report,) = SlotTask(pipeline.spec(1, round_number), slot_index=0).run().leases
    return report


def idle_check(pipeline: ConsumerPipeline) -> PendingWork:
    leases = list(pipeline.leases().values())
    return find_pending_work(leases, pipeline.streams, pipeline.kinesis, pipeline.config, FAST_RETRIES)


def landed_data(pipeline: ConsumerPipeline) -> list[bytes]:
    return sorted(record.data for record in pipeline.landed())


def test_records_put_between_rounds_on_a_quiet_latest_shard_land_in_the_next_round(pipeline):
    before = pipeline.produce(5)
    time.sleep(CLOCK_STEP_SECONDS)
    pipeline.sync()
    (lease,) = pipeline.leases().values()
    assert lease.checkpoint == LATEST and lease.latest_since is not None, "the sync pins what it creates at LATEST"

    first = slot_round(pipeline, 1)
    assert (first.outcome, first.records) == (Outcome.CAUGHT_UP, 0), "what came before the lease is skipped"
    assert idle_check(pipeline).idle, "a pinned LATEST lease with nothing after its pin is idle"

    between = pipeline.produce(3)
    work = idle_check(pipeline)
    assert (work.idle, work.reason) == (False, "records after its checkpoint")
    second = slot_round(pipeline, 2)
    assert (second.outcome, second.records) == (Outcome.CAUGHT_UP, 3)
    assert landed_data(pipeline) == sorted(record.data for record in between)
    assert not {record.data for record in before} & set(landed_data(pipeline))

    after = pipeline.produce(2)
    third = slot_round(pipeline, 3)
    assert third.records == 2 and duplicates(pipeline.landed()) == []
    assert landed_data(pipeline) == sorted(record.data for record in between + after)
    assert pipeline.leases()[lease.lease_key].latest_start_millis is None, "a checkpoint off LATEST drops the pin"


def test_a_latest_lease_without_a_pin_is_pinned_by_its_first_claim(pipeline):
    pipeline.sync()
    (key,) = pipeline.leases()
    # A lease as an earlier version (or KCL) created it: at LATEST, with no pin.
    unpinned = pipeline.leases()[key].replace(latest_start_millis=None)
    pipeline.store.delete_lease(key)
    assert pipeline.store.create_lease_if_not_exists(unpinned)
    work = idle_check(pipeline)
    assert (work.idle, work.lease_key) == (False, key), "an unpinned LATEST lease is work until a claim pins it"

    first = slot_round(pipeline, 1)
    assert first.records == 0
    pinned = pipeline.leases()[key]
    assert pinned.checkpoint == LATEST and pinned.latest_since is not None
    produced = pipeline.produce(4)
    second = slot_round(pipeline, 2)
    assert second.records == 4
    assert landed_data(pipeline) == sorted(record.data for record in produced)


def test_a_reset_to_latest_unpins_so_the_next_claim_starts_afresh(pipeline):
    pipeline.sync()
    (key,) = pipeline.leases()
    first = pipeline.produce(3)
    assert slot_round(pipeline, 1).records == 3
    skipped = pipeline.produce(4)
    time.sleep(CLOCK_STEP_SECONDS)
    lease = pipeline.leases()[key]
    assert lease.checkpoint == ExtendedSequenceNumber(first[-1].sequence_number)
    reset = pipeline.store.reset_checkpoint(lease, LATEST)
    assert reset.applied and reset.lease is not None and reset.lease.latest_start_millis is None
    # Reset again over a lease pinned long ago: the old pin must not come back as a start.
    repinned = pipeline.store.update_lease(reset.lease.replace(latest_start_millis=1))
    assert repinned.applied and repinned.lease is not None
    assert pipeline.store.reset_checkpoint(repinned.lease, LATEST).applied
    assert pipeline.leases()[key].latest_start_millis is None

    assert slot_round(pipeline, 2).records == 0, "LATEST after a reset starts at the next claim"
    later = pipeline.produce(2)
    assert slot_round(pipeline, 3).records == 2
    landed = set(landed_data(pipeline))
    assert landed == {record.data for record in first + later}
    assert not {record.data for record in skipped} & landed


def test_a_retried_attempt_reads_from_the_pin_its_first_attempt_wrote(pipeline):
    pipeline.sync()
    (key,) = pipeline.leases()
    unpinned = pipeline.leases()[key].replace(latest_start_millis=None)
    pipeline.store.delete_lease(key)
    assert pipeline.store.create_lease_if_not_exists(unpinned)
    pipeline.assign(1)
    (first,) = SlotTask(pipeline.spec(1, 1), slot_index=0, attempt=0).run().leases
    assert first.records == 0
    pin = pipeline.leases()[key].latest_start_millis
    assert pin is not None
    time.sleep(CLOCK_STEP_SECONDS)
    produced = pipeline.produce(3)
    # The same round's retry claims the lease anew: it keeps the pin, so it finds what came since.
    (retry,) = SlotTask(pipeline.spec(1, 1), slot_index=0, attempt=1).run().leases
    assert (retry.outcome, retry.records) == (Outcome.CAUGHT_UP, 3)
    assert landed_data(pipeline) == sorted(record.data for record in produced)
    assert duplicates(pipeline.landed()) == []
