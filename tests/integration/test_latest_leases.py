"""Leases at LATEST across rounds, against kinesis-mock and moto with slots run in-process.

A round opens its shards anew, so a lease still at LATEST must not be opened at "now" again: what
arrived on a quiet shard between two rounds would be skipped, round after round, and nothing would
say so. The sync pins the leases it creates at LATEST, a claim pins one that is not pinned yet, and
every read (the slot's and the leader's idle check) opens AT_TIMESTAMP of the pin.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from lease_core.model.sequence import LATEST, ExtendedSequenceNumber
from lease_core.retrieval.pending_work import PendingWork, find_pending_work
from lease_core.retrieval.polling.polling_retrieval import idle_check_retrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.sync.step import sync_streams
from spark_jobs.round_report import LeaseReport, Outcome
from spark_jobs.slot_task import SlotTask
from tests.support.pipeline import ConsumerPipeline, duplicates, pipeline_on_new_stream
from tests.support.stores import FAST_RETRIES

# Arrival times are the emulator's, pins the host's (the same clock here, in milliseconds): a record
# put this long before a pin is before it for certain.
CLOCK_STEP_SECONDS = 0.02


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    return pipeline_on_new_stream(
        unique_name, 1, kinesis_endpoint, moto_endpoint, tmp_path, initial_position_in_stream="LATEST"
    )


def slot_round(pipeline: ConsumerPipeline, round_number: int, clock_ahead_millis: int = 0) -> LeaseReport:
    """One round of the one slot; its host's clock `clock_ahead_millis` ahead of Kinesis'."""
    pipeline.assign(1)
    task = SlotTask(pipeline.spec(1, round_number), slot_index=0)
    if clock_ahead_millis:
        task.context = replace(task.context, wall_clock_millis=lambda: now_millis() + clock_ahead_millis)
    (report,) = task.run().leases
    return report


def now_millis() -> int:
    return time.time_ns() // 1_000_000


def set_attributes(pipeline: ConsumerPipeline, key: str, expression: str, values: dict, names: dict | None = None):
    """A write by another tool (the DynamoDB console, KCL): straight to the item, no condition."""
    pipeline.dynamodb.update_item(
        TableName=pipeline.config.lease_table,
        Key={"leaseKey": {"S": key}},
        UpdateExpression=expression,
        ExpressionAttributeValues=values,
        **({"ExpressionAttributeNames": names} if names else {}),
    )


def idle_check(pipeline: ConsumerPipeline) -> PendingWork:
    leases = list(pipeline.leases().values())
    return find_pending_work(
        leases, pipeline.streams, idle_check_retrieval(pipeline.kinesis, FAST_RETRIES), pipeline.config
    )


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


# --- clocks, other writers, values that do not read ------------------------------------------------
# (kinesis-mock checks an AT_TIMESTAMP against its clock only once the shard holds a record.)


def test_a_claim_on_a_host_whose_clock_runs_ahead_of_kinesis_still_reads_the_lease(pipeline):
    pipeline.produce(2)
    pipeline.sync()
    (key,) = pipeline.leases()
    unpinned = pipeline.leases()[key].replace(latest_start_millis=None)
    pipeline.store.delete_lease(key)
    assert pipeline.store.create_lease_if_not_exists(unpinned)
    # The claim pins 2 s into Kinesis' future, which refuses that AT_TIMESTAMP: the read opens LATEST.
    first = slot_round(pipeline, 1, clock_ahead_millis=2_000)
    assert (first.outcome, first.records) == (Outcome.CAUGHT_UP, 0)
    pin = pipeline.leases()[key].latest_start_millis
    assert pin is not None and pin > now_millis()
    # What arrives before the pin (in Kinesis' time) is before the lease's start: the clocks' difference
    # is how far a pin can be off (docs/kcl-compatibility.md). After it, every record is read.
    time.sleep((pin - now_millis()) / 1000 + CLOCK_STEP_SECONDS)
    produced = pipeline.produce(3)
    assert slot_round(pipeline, 2).records == 3
    assert landed_data(pipeline) == sorted(record.data for record in produced)


def test_a_pin_ahead_of_the_claiming_host_moves_back_to_the_claim_and_the_lease_reads(pipeline):
    pipeline.produce(2)
    source = KinesisShardSource(pipeline.kinesis, retry_policy=FAST_RETRIES)
    # A sync host a day ahead pins every lease it creates in Kinesis' future.
    sync_streams(
        pipeline.streams, pipeline.config, pipeline.store, source, pipeline.state, lambda: now_millis() + 86_400_000
    )
    (key,) = pipeline.leases()
    work = idle_check(pipeline)
    assert work.idle, "the check reads from LATEST when Kinesis refuses the pin: nothing after it"
    claimed_before = now_millis()
    first = slot_round(pipeline, 1)
    assert (first.outcome, first.records) == (Outcome.CAUGHT_UP, 0)
    pin = pipeline.leases()[key].latest_start_millis
    assert pin is not None and claimed_before <= pin <= now_millis(), "the claim moved the pin back to its time"
    produced = pipeline.produce(3)
    assert slot_round(pipeline, 2).records == 3
    assert landed_data(pipeline) == sorted(record.data for record in produced)


def test_a_pin_another_writer_left_beside_its_checkpoint_is_dropped_by_the_next_claim(pipeline):
    pipeline.sync()
    (key,) = pipeline.leases()
    early = pipeline.produce(3)
    assert slot_round(pipeline, 1).records == 3
    # A writer that does not know the pin (KCL's checkpoint) left one beside a sequence checkpoint.
    set_attributes(pipeline, key, "SET latestStartMillis = :pin", {":pin": {"N": str(now_millis() - 60_000)}})
    assert pipeline.leases()[key].latest_since is None, "beside a sequence checkpoint a pin means nothing"
    assert slot_round(pipeline, 2).records == 0
    assert pipeline.leases()[key].latest_start_millis is None, "the claim removed it"
    time.sleep(CLOCK_STEP_SECONDS)
    # Then that writer sets LATEST again (no claim in between would leave the old pin live: docs).
    lease = pipeline.leases()[key]
    set_attributes(
        pipeline,
        key,
        "SET #c = :latest, checkpointSubSequenceNumber = :zero, leaseCounter = :n",
        {":latest": {"S": "LATEST"}, ":zero": {"N": "0"}, ":n": {"N": str(lease.lease_counter + 2)}},
        {"#c": "checkpoint"},
    )
    assert slot_round(pipeline, 3).records == 0, "LATEST set by the other writer skips what was there"
    assert landed_data(pipeline) == sorted(record.data for record in early)
    assert duplicates(pipeline.landed()) == []


def test_a_pin_that_is_no_moment_in_milliseconds_is_a_corrupt_lease_item(pipeline):
    pipeline.sync()
    (key,) = pipeline.leases()
    set_attributes(pipeline, key, "SET latestStartMillis = :pin", {":pin": {"N": str(time.time_ns())}})
    scan = pipeline.store.scan_leases()
    assert scan.leases == ()
    ((corrupt_key, error),) = [(error.lease_key, error) for error in scan.corrupt]
    assert (corrupt_key, error.attribute) == (key, "latestStartMillis")
