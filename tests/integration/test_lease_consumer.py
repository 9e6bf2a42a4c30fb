"""A slot's lease work in the cases a round rarely shows: redoing prepared batches, backfill window
ends, waiting for parents and for a merge's other parent. Slots run in-process (no Spark needed)
against kinesis-mock and moto."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devtools.kinesis_streams import create_stream, kinesis_client, merge_shards
from devtools.stream_records import StreamRecord
from lease_core.leader.assignment_round import slot_ids
from lease_core.model.lease import Lease, MeasurementBeforeClaim
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from sinks.batch_sink import BatchRange
from sinks.dead_lettering import DeadLetteringSink
from sinks.parquet import ParquetSink, visible_path
from sinks.record_columns import records_table
from spark_jobs.lease_consumer import LeaseBudget
from spark_jobs.round_report import LeaseReport, Outcome
from spark_jobs.slot_task import SlotTask
from tests.support.pipeline import ConsumerPipeline, duplicates, pipeline_on_new_stream

ESN = ExtendedSequenceNumber


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    return pipeline_on_new_stream(
        unique_name, 1, kinesis_endpoint, moto_endpoint, tmp_path, initial_position_in_stream="TRIM_HORIZON"
    )


def run_slot(pipeline: ConsumerPipeline, budget: LeaseBudget | None = None) -> dict[str, LeaseReport]:
    report = SlotTask(pipeline.spec(1, 1, budget=budget), slot_index=0).run()
    return {lease.lease_key: lease for lease in report.leases}


def owned_lease(pipeline: ConsumerPipeline) -> Lease:
    pipeline.sync()
    pipeline.assign(1)
    (lease,) = pipeline.leases().values()
    return lease


def landed_sorted(pipeline: ConsumerPipeline) -> list[StreamRecord]:
    return sorted(pipeline.landed(), key=lambda record: int(record.sequence_number))


def prepare(pipeline: ConsumerPipeline, lease: Lease, end: ESN, state: bytes | None) -> Lease:
    result = pipeline.store.update_lease(lease.with_pending_checkpoint(end, state))
    assert result.applied and result.lease is not None
    return result.lease


def test_a_prepared_batch_whose_file_was_staged_is_copied_committed_and_promoted_without_reading(pipeline):
    produced = pipeline.produce(30)
    lease = owned_lease(pipeline)
    end = ESN(produced[19].sequence_number)
    sink = ParquetSink.from_uri(pipeline.output_uri)
    first = ESN(produced[0].sequence_number)
    batch = BatchRange(lease.lease_key, pipeline.streams[0], lease.lease_key, TRIM_HORIZON, first, end)
    staged = sink.staged_token(batch, "crashed-attempt")
    described = PendingBatch(TRIM_HORIZON, end, first, sink.batch_name(batch), 20, staged=staged)
    prepare(pipeline, lease, end, described.encode())
    # The crashed attempt had staged its file: a stand-in with the same 20 records.
    crashed_attempt = SlotTask(pipeline.spec(1, 1), 0)
    records = _read_records(crashed_attempt, produced[:20])
    sink.stage(batch, records_table(records), "crashed-attempt")
    assert pipeline.landed() == [], "a staged file is invisible until its range is committed"
    report = run_slot(pipeline)[lease.lease_key]
    assert (report.outcome, report.replayed_batches, report.records) == (Outcome.CAUGHT_UP, 1, 30)
    assert [record.data for record in landed_sorted(pipeline)] == [record.data for record in produced]


def _read_records(task: SlotTask, produced: list[StreamRecord]):
    from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead

    source = task.context.retrieval.open(
        ShardToRead(task.spec.streams[0], produced[0].shard_id), ReadStart(TRIM_HORIZON)
    )
    return source.read(ReadLimits(stop_at=ESN(produced[-1].sequence_number))).records


def test_a_prepared_batch_described_by_someone_else_is_replayed_from_the_checkpoint(pipeline):
    produced = pipeline.produce(40)
    lease = owned_lease(pipeline)
    committed = pipeline.store.checkpoint(lease, ESN(produced[9].sequence_number)).lease
    assert committed is not None
    prepare(pipeline, committed, ESN(produced[24].sequence_number), b"state of a KCL application")
    report = run_slot(pipeline)[lease.lease_key]
    assert (report.outcome, report.replayed_batches, report.records) == (Outcome.CAUGHT_UP, 1, 30)
    assert [record.data for record in landed_sorted(pipeline)] == [record.data for record in produced[10:]]


def test_a_replay_asks_kinesis_for_answers_of_the_lease_share_and_lands_the_prepared_batch_whole(pipeline):
    """A retried slot replays every prepared batch at once: each asks GetRecords for its share of the
    slot's buffer, not for whole answers of up to 10 MB (`ReadLimits.max_bytes` on each part)."""
    produced = pipeline.produce(30)
    lease = owned_lease(pipeline)
    prepare(pipeline, lease, ESN(produced[-1].sequence_number), b"state of a KCL application")
    share = sum(len(record.data) for record in produced[:5])
    report = run_slot(pipeline, LeaseBudget(file_max_bytes=share))[lease.lease_key]
    assert (report.outcome, report.replayed_batches, report.records) == (Outcome.CAUGHT_UP, 1, 30)
    assert [record.data for record in landed_sorted(pipeline)] == [record.data for record in produced]
    # The prepared range lands as the one batch it was prepared as, read in answers of about 5 records
    # (a read's first call asks for one): 30 records need 7 calls at least, then one at the tip.
    assert report.files == 1
    assert report.read_calls >= 8


def test_a_foreign_prepared_batch_after_latest_cannot_be_replayed_and_says_so(pipeline):
    produced = pipeline.produce(5)
    lease = owned_lease(pipeline)
    at_latest = pipeline.store.update_lease(lease.replace(checkpoint=LATEST)).lease
    assert at_latest is not None
    prepare(pipeline, at_latest, ESN(produced[-1].sequence_number), b"opaque")
    report = run_slot(pipeline)[lease.lease_key]
    assert report.outcome == Outcome.FAILED
    assert "cannot be replayed" in (report.detail or "")
    assert pipeline.landed() == []


def test_a_backfill_window_end_stops_before_the_first_later_record(pipeline):
    early = pipeline.produce(25)
    lease = owned_lease(pipeline)
    window_end = datetime.now(UTC) + timedelta(seconds=1)
    time.sleep(max(0.0, (window_end - datetime.now(UTC)).total_seconds()) + 1.1)
    pipeline.produce(10)
    report = run_slot(pipeline, LeaseBudget(stop_at_arrival=window_end))[lease.lease_key]
    assert report.outcome == Outcome.WINDOW_END
    assert [record.data for record in landed_sorted(pipeline)] == [record.data for record in early]
    assert pipeline.leases()[lease.lease_key].checkpoint == ESN(early[-1].sequence_number)


def test_a_merged_parent_waits_at_its_end_until_the_other_parent_has_a_lease(
    unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, unique_name, 2)
    pipeline = ConsumerPipeline(
        unique_name,
        (unique_name,),
        kinesis_endpoint,
        moto_endpoint,
        str(tmp_path / "lake"),
        settings={"initial_position_in_stream": "TRIM_HORIZON"},
    )
    produced = pipeline.produce(40)
    pipeline.sync()
    pipeline.assign(1)
    left, right = sorted(pipeline.leases())
    child = merge_shards(kinesis, unique_name, left, right)
    pipeline.store.delete_lease(right)  # the other parent's lease is not there (yet)
    first = run_slot(pipeline)[left]
    assert first.outcome == Outcome.MERGE_DEFERRED
    waiting = pipeline.leases()[left]
    last_of_left = max((r for r in produced if r.shard_id == left), key=lambda r: int(r.sequence_number))
    # Its records are landed and committed; only the shard end waits.
    assert (waiting.checkpoint, waiting.pending_checkpoint) == (ESN(last_of_left.sequence_number), None)
    assert child not in pipeline.leases()
    pipeline.store.create_lease_if_not_exists(Lease(right, checkpoint=TRIM_HORIZON))
    assert pipeline.store.assign_lease(pipeline.leases()[right], slot_ids(unique_name, 1)[0]).applied
    second = run_slot(pipeline)
    assert (second[left].outcome, second[left].records) == (Outcome.SHARD_END, 0)
    assert child in second[left].children_created or child in second[right].children_created
    assert pipeline.leases()[left].checkpoint == SHARD_END
    assert duplicates(pipeline.landed()) == []
    assert sorted(pipeline.landed(), key=lambda r: r.data) == sorted(pipeline.produced, key=lambda r: r.data)


def test_a_child_whose_parent_is_unfinished_waits_and_is_reported(
    unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, unique_name, 1)
    pipeline = ConsumerPipeline(
        unique_name,
        (unique_name,),
        kinesis_endpoint,
        moto_endpoint,
        str(tmp_path / "lake"),
        settings={"initial_position_in_stream": "TRIM_HORIZON"},
    )
    pipeline.sync()
    (parent,) = pipeline.leases()
    worker = slot_ids(unique_name, 1)[0]
    pipeline.store.create_lease_if_not_exists(Lease("shardId-000000000099", parent_shard_ids={parent}))
    assert pipeline.store.assign_lease(pipeline.leases()["shardId-000000000099"], worker).applied
    reports = SlotTask(pipeline.spec(1, 1), 0).run().leases
    (waiting,) = [report for report in reports if report.lease_key == "shardId-000000000099"]
    assert waiting.outcome == Outcome.WAITING_FOR_PARENTS
    assert parent in (waiting.detail or "")


# --- zombies and twins (issue 13, holes 1 and 4) ---------------------------------------------------


class PausingSink:
    """The slot's real sink, except that its first `stage` waits, inside the call (the attempt is past
    its last check of the lease), until the test lets it go on."""

    def __init__(self, sink: ParquetSink) -> None:
        self._sink = sink
        self.paused = threading.Event()
        self.resume = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._sink, name)

    def stage(self, batch: BatchRange, table, attempt: str):
        if not self.paused.is_set():
            self.paused.set()
            assert self.resume.wait(60), "the test never let the paused attempt go on"
        return self._sink.stage(batch, table, attempt)


def paused_attempt(pipeline: ConsumerPipeline, attempt: int) -> tuple[SlotTask, PausingSink]:
    task = SlotTask(pipeline.spec(1, 1), slot_index=0, attempt=attempt)
    round_sink = task.context.sink
    assert isinstance(round_sink, DeadLetteringSink) and isinstance(round_sink.output, ParquetSink)
    sink = PausingSink(round_sink.output)
    task.context = dataclasses.replace(task.context, sink=sink)  # type: ignore[arg-type]
    return task, sink


def run_in_background(task: SlotTask) -> tuple[threading.Thread, list[LeaseReport]]:
    reports: list[LeaseReport] = []
    thread = threading.Thread(target=lambda: reports.extend(task.run().leases), daemon=True)
    thread.start()
    return thread, reports


def test_a_batch_discarded_by_a_reset_and_staged_late_by_its_zombie_never_shows(pipeline):
    """Hole 4: the zombie staged (C, r30] after the reset; the next round landed (C, r40]."""
    produced = pipeline.produce(30)
    lease = owned_lease(pipeline)
    zombie, sink = paused_attempt(pipeline, attempt=0)
    thread, zombie_reports = run_in_background(zombie)
    assert sink.paused.wait(60)
    prepared = pipeline.leases()[lease.lease_key]
    assert prepared.pending_checkpoint == ESN(produced[-1].sequence_number)
    assert pipeline.store.reset_checkpoint(prepared, TRIM_HORIZON).applied  # what `leasectl reset` writes
    produced += pipeline.produce(10)

    next_round = run_slot(pipeline)[lease.lease_key]
    sink.resume.set()
    thread.join(60)

    assert (next_round.outcome, next_round.records) == (Outcome.CAUGHT_UP, 40)
    assert [report.outcome for report in zombie_reports] == [Outcome.LOST]
    assert duplicates(pipeline.landed()) == []
    assert [record.data for record in landed_sorted(pipeline)] == [record.data for record in produced]
    zombie_file = PendingBatch.decode(prepared).staged
    assert zombie_file is not None and sink.exists(zombie_file), "written..."
    assert not sink.exists(visible_path(zombie_file)), "...never shown"


def test_an_older_attempt_of_a_slot_running_beside_its_retry_lands_nothing_twice(pipeline):
    """Hole 1: Spark (or Airflow) retried the slot while its first attempt still runs."""
    produced = pipeline.produce(30)
    lease = owned_lease(pipeline)
    older, sink = paused_attempt(pipeline, attempt=0)
    thread, older_reports = run_in_background(older)
    assert sink.paused.wait(60)
    produced += pipeline.produce(10)

    newer = {report.lease_key: report for report in SlotTask(pipeline.spec(1, 1), 0, attempt=1).run().leases}
    sink.resume.set()
    thread.join(60)

    assert (newer[lease.lease_key].outcome, newer[lease.lease_key].replayed_batches) == (Outcome.CAUGHT_UP, 1)
    assert [report.outcome for report in older_reports] == [Outcome.LOST]
    assert "claimed by another attempt" in (older_reports[0].detail or "")
    assert duplicates(pipeline.landed()) == []
    assert [record.data for record in landed_sorted(pipeline)] == [record.data for record in produced]
    stored = pipeline.leases()[lease.lease_key]
    assert (stored.checkpoint, stored.pending_checkpoint) == (ESN(produced[-1].sequence_number), None)
    assert stored.claim_token is not None and stored.claim_token.startswith(f"{stored.lease_owner}/attempt-1/")


def measured_lease(pipeline: ConsumerPipeline, throughput_kbps: float, seconds_ago: float) -> Lease:
    """The slot's lease with a throughput measured through `seconds_ago` (as an earlier round leaves it)."""
    lease = owned_lease(pipeline)
    read_through = int((time.time() - seconds_ago) * 1000)
    stored = pipeline.store.renew_lease(
        lease.replace(throughput_kbps=throughput_kbps, read_through_millis=read_through)
    )
    assert stored.applied and stored.lease is not None
    return stored.lease


def test_a_slot_that_read_its_lease_stamps_its_worker_metrics_in_epoch_seconds_as_kcl_reads_lut(pipeline):
    """KCL's leader counts a worker active while now - `lut` <= 60 s, in seconds (docs/protocol.md §5.1):
    a `lut` in milliseconds would keep a slot active for KCL forever after a handover."""
    pipeline.produce(20)
    owned_lease(pipeline)
    before = int(time.time())
    run_slot(pipeline)
    stats = pipeline.metrics.get(slot_ids(pipeline.application_name, 1)[0])
    assert stats is not None
    assert before <= stats.last_update_epoch_seconds <= int(time.time())


def test_a_lease_with_nothing_new_costs_the_round_one_write_its_claim_which_also_decays_its_throughput(pipeline):
    before = measured_lease(pipeline, 100.0, seconds_ago=30)
    report = run_slot(pipeline)[before.lease_key]
    after = pipeline.leases()[before.lease_key]
    assert (report.outcome, report.records) == (Outcome.CAUGHT_UP, 0)
    assert after.lease_counter - before.lease_counter == 1
    # What a round that reads nothing measures: no data arrived since the last read (KCL's EMA, alpha 0.5).
    assert after.throughput_kbps == 50.0
    assert before.read_through_millis < after.read_through_millis <= time.time() * 1000
    assert report.throughput_kbps == 50.0 and report.covered_seconds == pytest.approx(30, abs=5)
    # The measurement it stood in for is kept aside for the round's other attempts, if any.
    assert after.measured_before_claim == MeasurementBeforeClaim(1, 100.0, before.read_through_millis)


def test_a_later_round_takes_the_stand_in_of_a_round_that_read_nothing_as_its_measurement(pipeline):
    before = measured_lease(pipeline, 100.0, seconds_ago=30)
    run_slot(pipeline)
    SlotTask(pipeline.spec(1, 2), slot_index=0).run()
    after = pipeline.leases()[before.lease_key]
    assert (after.throughput_kbps, after.lease_counter - before.lease_counter) == (25.0, 2)
    assert after.measured_before_claim is not None and after.measured_before_claim.throughput_kbps == 50.0


def test_an_attempt_that_claimed_and_died_leaves_its_retry_the_measurement_it_stood_in_for(pipeline):
    before = measured_lease(pipeline, 100.0, seconds_ago=20)
    SlotTask(pipeline.spec(1, 1), slot_index=0, attempt=0)._claim(before)  # then the attempt is killed
    assert pipeline.leases()[before.lease_key].throughput_kbps == 50.0
    produced = pipeline.produce(30)
    report = SlotTask(pipeline.spec(1, 1), slot_index=0, attempt=1).run().leases[0]
    after = pipeline.leases()[before.lease_key]
    assert (report.outcome, report.records) == (Outcome.CAUGHT_UP, 30)
    window_seconds = (after.read_through_millis - before.read_through_millis) / 1000
    arrived_kbps = sum(len(record.data) for record in produced) / 1024 / window_seconds
    # From 100 KB/s and the data time since the read before the round: not from the dead claim's 50.
    assert after.throughput_kbps == pytest.approx(0.5 * 100.0 + 0.5 * arrived_kbps, abs=1e-5)
    assert after.measured_before_claim is None


def test_a_lease_with_new_data_measures_from_its_values_before_the_claim(pipeline):
    before = measured_lease(pipeline, 100.0, seconds_ago=20)
    produced = pipeline.produce(30)
    report = run_slot(pipeline)[before.lease_key]
    after = pipeline.leases()[before.lease_key]
    assert (report.outcome, report.records) == (Outcome.CAUGHT_UP, 30)
    assert after.lease_counter - before.lease_counter == 4  # claim, prepare, commit, the measurement
    window_seconds = (after.read_through_millis - before.read_through_millis) / 1000
    arrived_kbps = sum(len(record.data) for record in produced) / 1024 / window_seconds
    # From 100 KB/s as stored before the round, not from the 50 its claim stored ahead of the read.
    assert after.throughput_kbps == pytest.approx(0.5 * 100.0 + 0.5 * arrived_kbps, abs=1e-5)
    assert window_seconds == pytest.approx(20, abs=5)


def test_a_lease_that_read_nothing_for_want_of_time_gets_its_former_measurement_back(pipeline):
    before = measured_lease(pipeline, 100.0, seconds_ago=20)
    pipeline.produce(5)
    report = run_slot(pipeline, LeaseBudget(max_seconds=0))[before.lease_key]
    after = pipeline.leases()[before.lease_key]
    assert (report.outcome, report.records) == (Outcome.LIMIT, 0)
    # The claim said "nothing arrived"; records did, unread: the measurement goes back as it was.
    assert (after.throughput_kbps, after.read_through_millis) == (100.0, before.read_through_millis)
    assert after.lease_counter - before.lease_counter == 2 and after.measured_before_claim is None
