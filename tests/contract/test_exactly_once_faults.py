"""Exactly-once under the faults an adversarial review found: a slot's attempts claiming out of
order, a shard's last batch whose promotion fails, a transaction retried while its first try is in
progress. No Kinesis is needed: what the redo would read is already staged or refused."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

import botocore.exceptions
import pyarrow as pa

from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.lifecycle.lease_lifecycle import apply_cleanup, create_child_leases, plan_lease_cleanup
from lease_core.model.lease import HashKeyRange, Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.memory_store import InMemoryLeaseStore
from spark_jobs.lease_consumer import LeaseBudget, LeaseConsumer, LeaseContext, make_committed_visible
from spark_jobs.round_report import LeaseReport, Outcome, RoundReport, RoundTotals, SlotReport
from spark_jobs.sinks.batch_sink import BatchRange, StagedBatch, Visibility
from spark_jobs.sinks.parquet import ParquetSink, visible_path
from spark_jobs.sinks.record_columns import RECORD_SCHEMA
from spark_jobs.slot_task import SlotTask
from tests.support.faults import FaultInjectingClient, client_error
from tests.support.stores import FAST_RETRIES, dynamodb_store

ESN = ExtendedSequenceNumber
SLOT = "app-worker-0"
OTHER_SLOT = "app-worker-1"
PARENT = "shardId-000000000000"
CHILDREN = ("shardId-000000000001", "shardId-000000000002")
DURATION = 10_000
SINGLE = LeaseKeyScheme()


def slot_attempt(store: InMemoryLeaseStore, attempt: int, started_millis: int) -> SlotTask:
    """A slot task of `SLOT` with only what `SlotTask._claim` uses (no AWS clients)."""
    task = object.__new__(SlotTask)
    task.store = store  # type: ignore[assignment]
    task.worker_id = SLOT
    task.attempt = attempt
    task.started_millis = started_millis
    task.config = SimpleNamespace(failover_time_millis=DURATION)  # type: ignore[assignment]
    task.spec = SimpleNamespace(round_number=1)  # type: ignore[assignment]
    task.context = SimpleNamespace(wall_clock_millis=lambda: started_millis)  # type: ignore[assignment]
    return task


def split_of_parent() -> tuple[ChildShard, ...]:
    """The two children of a split of PARENT, each with half of its hash range."""
    half = (2**128 - 1) // 2
    ranges = (HashKeyRange(0, half), HashKeyRange(half + 1, 2**128 - 1))
    return tuple(ChildShard(child, frozenset({PARENT}), hash_range) for child, hash_range in zip(CHILDREN, ranges))


def owned(store: InMemoryLeaseStore, key: str, owner: str = SLOT, **fields: object) -> Lease:
    assert store.create_lease_if_not_exists(Lease(key, **fields))  # type: ignore[arg-type]
    lease = store.get_lease(key, consistent=True)
    assert lease is not None
    result = store.assign_lease(lease, owner)
    assert result.applied and result.lease is not None
    return result.lease


# --- 1. "the newest attempt wins" ------------------------------------------------------------------


def test_an_older_attempt_that_claims_late_does_not_fence_the_newer_attempt_of_its_slot():
    """Spark gave up on attempt 0 (its executor stopped answering) and runs attempt 1, which claims the
    lease. Attempt 0's Python worker goes on and reaches its claim with the lease as it listed it: its
    claim fails, it reads the lease again, sees its own slot as owner and claims over attempt 1."""
    store = InMemoryLeaseStore()
    listed = owned(store, PARENT, checkpoint=TRIM_HORIZON)

    newer = slot_attempt(store, attempt=1, started_millis=2_000)._claim(listed)
    assert not newer.is_lost
    older = slot_attempt(store, attempt=0, started_millis=1_000)._claim(listed)

    assert newer.renew(), f"the newer attempt lost its lease to the older one: {newer.lost_reason}"
    assert older.is_lost


# --- 2. a committed file that nobody will ever promote ---------------------------------------------


class PromoteFails:
    """The slot's sink, except that making a batch visible fails (an S3 503 on the CopyObject, or the
    executor dying between the commit and the promotion)."""

    def __init__(self, sink: ParquetSink) -> None:
        self._sink = sink

    def __getattr__(self, name: str):
        return getattr(self._sink, name)

    def make_visible(self, record: str | None):
        raise OSError("injected: the promotion never happened")


def three_rows() -> pa.Table:
    arrival = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    return pa.Table.from_pylist(
        [
            {
                "sequence_number": str(n),
                "sub_sequence_number": 0,
                "partition_key": "k",
                "approximate_arrival_timestamp": arrival,
                "data": b"x",
                "explicit_hash_key": None,
            }
            for n in (101, 102, 103)
        ],
        schema=RECORD_SCHEMA,
    )


def test_cleanup_never_deletes_a_finished_lease_whose_committed_batch_was_not_made_visible(tmp_path: Path):
    """A prepared (C, SHARD_END] batch (the earlier version's last-batch form, which the redo still
    supports) is redone: its file is staged (pre-staged here, so that no Kinesis is needed), SHARD_END is
    committed naming it, and the promotion fails (a 503 on the CopyObject, or the executor dies). The
    children already had leases (shard sync created them), so their slots read them as soon as the
    parent reached SHARD_END. Next round, cleanup runs before any slot: the parent is finished, its
    children started, so it is deleted, and with it the only record that the staged file is committed.
    Its records are never visible, and nothing reports them. (A fix may also avoid SHARD_END here.)"""
    store = InMemoryLeaseStore()
    children = split_of_parent()
    for child in children:  # created by shard sync, assigned to another slot for this round
        owned(
            store,
            child.shard_id,
            OTHER_SLOT,
            checkpoint=TRIM_HORIZON,
            parent_shard_ids=frozenset({PARENT}),
            hash_key_range=child.hash_key_range,
        )

    sink = ParquetSink.from_uri(str(tmp_path / "lake"))
    checkpoint = ESN("100")
    batch = BatchRange(PARENT, "stream", PARENT, checkpoint, ESN("101"), SHARD_END)
    path = sink.batch_name(batch)
    lease = owned(store, PARENT, checkpoint=checkpoint, hash_key_range=HashKeyRange(0, 2**128 - 1))
    described = PendingBatch(
        checkpoint, SHARD_END, ESN("101"), path, 3, children, staged=sink.staged_token(batch, "earlier")
    )
    prepared = store.prepare_checkpoint(lease, SHARD_END, described.encode()).lease
    assert prepared is not None
    sink.stage(batch, three_rows(), "earlier")

    held = HeldLease(store, prepared, DURATION, claim_token=f"{SLOT}/attempt-0")
    assert held.claim()
    context = LeaseContext(
        store=store,
        kinesis=None,
        sink=PromoteFails(sink),  # type: ignore[arg-type]
        transform_spec=None,
        transform=None,
        retry_policy=FAST_RETRIES,
        at_timestamp=None,
        budget=LeaseBudget(),
    )
    LeaseConsumer(held, "stream", PARENT, SINGLE, SLOT, context).run()  # fails at the promotion

    for child in CHILDREN:  # the children's slots saw their parent at SHARD_END and read them
        started = store.get_lease(child, consistent=True)
        assert started is not None and store.checkpoint(started, ESN("500")).applied
    apply_cleanup(store, plan_lease_cleanup(store.list_leases(), None, SINGLE))  # the next round's shard sync

    still_known = store.get_lease(PARENT, consistent=True) is not None
    assert sink.exists(path) or still_known, (
        "the parent lease was deleted while its committed last batch is still staged: nobody will promote it"
    )


class StagedFileDeleted(PromoteFails):
    """The slot's sink, except that the staged file is gone when it is promoted (a lifecycle rule or
    another tool deleted it between this attempt's stage and its promotion)."""

    def make_visible(self, record: str | None):
        if record is not None:
            (Path(self._sink.root) / record).unlink()
        return self._sink.make_visible(record)


def redo_staged_batch(store: InMemoryLeaseStore, sink: object, tmp_path: Path):
    """A lease with a prepared (100, 103] whose file an earlier attempt staged; this attempt redoes it
    through `sink`: it copies the file to its own staged name, commits, and promotes."""
    lake = ParquetSink.from_uri(str(tmp_path / "lake"))
    checkpoint, end = ESN("100"), ESN("103")
    batch = BatchRange(PARENT, "stream", PARENT, checkpoint, ESN("101"), end)
    path = lake.batch_name(batch)
    earlier = lake.stage(batch, three_rows(), "earlier").token
    lease = owned(store, PARENT, checkpoint=checkpoint)
    prepared = store.prepare_checkpoint(
        lease, end, PendingBatch(checkpoint, end, ESN("101"), path, 3, staged=earlier).encode()
    )
    assert prepared.lease is not None
    held = HeldLease(store, prepared.lease, DURATION, claim_token=f"{SLOT}/attempt-1")
    assert held.claim()
    context = LeaseContext(
        store=store,
        kinesis=None,
        sink=sink,  # type: ignore[arg-type]
        transform_spec=None,
        transform=None,
        retry_policy=FAST_RETRIES,
        at_timestamp=None,
        budget=LeaseBudget(max_records=1),  # the redo only: no fresh read (no Kinesis here)
    )
    return LeaseConsumer(held, "stream", PARENT, SINGLE, SLOT, context).run(), lake, path


def round_of(report: LeaseReport) -> RoundReport:
    return RoundReport.build(
        "app", 1, ["stream"], "lake", "2026-11-26T00:00:00", 1.0, [SlotReport(SLOT, 1, 1.0, -1, (report,))]
    )


def test_a_committed_batch_whose_promotion_fails_is_named_by_the_report_and_made_visible_by_the_next_holder(
    tmp_path: Path,
):
    store = InMemoryLeaseStore()
    lake = ParquetSink.from_uri(str(tmp_path / "lake"))
    report, lake, path = redo_staged_batch(store, PromoteFails(lake), tmp_path)

    lease = store.get_lease(PARENT, consistent=True)
    assert lease is not None and lease.checkpoint == ESN("103") and not lake.exists(path)
    assert (report.outcome, report.unpromoted_batch) == ("failed", path)
    totals = RoundTotals.of([SlotReport(SLOT, 1, 1.0, -1, (report,))])
    assert totals.unpromoted_batches == (f"{PARENT}: {path}",)
    assert f"NOT VISIBLE YET: {PARENT}: {path}" in round_of(report).summary()
    assert lake.awaiting_visibility(lease.committed_batch) == (path,), "the idle check would take it for idle"

    make_committed_visible(lake, lease)  # the next round's holder, first thing in `_work`
    assert lake.exists(path) and lake.awaiting_visibility(lease.committed_batch) == ()


def test_a_committed_batch_whose_staged_file_is_deleted_before_promotion_is_reported_as_lost(tmp_path: Path):
    store = InMemoryLeaseStore()
    lake = ParquetSink.from_uri(str(tmp_path / "lake"))
    report, lake, path = redo_staged_batch(store, StagedFileDeleted(lake), tmp_path)

    assert (report.missing_batches, report.unpromoted_batch) == ((path,), None)
    totals = RoundTotals.of([SlotReport(SLOT, 1, 1.0, -1, (report,))])
    assert totals.missing_batches == (f"{PARENT}: {path}",)
    assert f"LOSS: {PARENT}: {path}: committed, but its file was deleted" in round_of(report).summary()


# --- 3. a transaction retried while the first try is still in progress ------------------------------


class InProgressOnRetry(FaultInjectingClient):
    """The first TransactWriteItems is applied and its answer lost; the retry (same ClientRequestToken)
    is answered TransactionInProgressException, as DynamoDB does while the first is still being applied."""

    def __init__(self, client) -> None:
        super().__init__(client, lambda name, number: None)

    def _perform(self, name: str, number: int, real_call):
        if name != "transact_write_items" or number > 2:
            return real_call()
        if number == 1:
            real_call()
            raise botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1/answer-lost")
        raise client_error("TransactionInProgressException", "TransactWriteItems")


def test_child_creation_whose_retry_finds_its_first_try_in_progress_is_retried_again(moto_endpoint, unique_name):
    """A retryable answer (AWS: retry TransactionInProgressException) becomes a non-retryable
    AccessError here, which fails the lease's shard end for this round."""
    healthy = dynamodb_store(moto_endpoint, unique_name)
    assert healthy.create_lease_if_not_exists(Lease(PARENT, checkpoint=ESN("1500")))
    assigned = healthy.assign_lease(healthy.get_lease(PARENT, consistent=True), SLOT).lease
    assert assigned is not None
    parent = healthy.claim_lease(assigned, "attempt-0").lease
    assert parent is not None
    store = DynamoDBLeaseStore(InProgressOnRetry(healthy.client), healthy.table_name, retry_policy=FAST_RETRIES)
    outcome = create_child_leases(store, parent, split_of_parent(), SINGLE)

    assert outcome.child_ids_recorded
    assert sorted(lease.lease_key for lease in healthy.list_leases()) == [PARENT, *CHILDREN]


def test_an_older_attempt_that_wrote_the_lease_after_it_was_listed_is_claimed_over_by_the_newer_one():
    store = InMemoryLeaseStore()
    listed = owned(store, PARENT, checkpoint=TRIM_HORIZON)
    older = slot_attempt(store, attempt=0, started_millis=1_000)._claim(listed)
    assert older.renew()  # the older attempt's heartbeat: the lease changed since the newer one listed it

    newer = slot_attempt(store, attempt=1, started_millis=2_000)._claim(listed)

    assert not newer.is_lost and older.renew() is False


def test_a_zombies_late_staged_copy_of_a_promoted_file_is_never_made_visible(tmp_path: Path):
    """Attempt 0 was inside its upload of the staged file when attempt 1 claimed the lease, redid
    (C, E], committed and promoted it; attempt 0's upload then landed. When the visible file is
    removed later (retention, compaction), the next holder must not bring the zombie's copy back."""
    store = InMemoryLeaseStore()
    sink = ParquetSink.from_uri(str(tmp_path / "lake"))
    checkpoint, end = ESN("100"), ESN("103")
    batch = BatchRange(PARENT, "stream", PARENT, checkpoint, ESN("101"), end)
    path = sink.batch_name(batch)
    newer = HeldLease(store, owned(store, PARENT, checkpoint=checkpoint), DURATION, claim_token=f"{SLOT}/attempt-1")
    assert newer.claim()
    ours = sink.staged_token(batch, newer.claim_token)
    newer.prepare(end, PendingBatch(checkpoint, end, ESN("101"), path, 3, staged=ours).encode())
    newer.commit(end, record=sink.commit_record(None, sink.stage(batch, three_rows(), newer.claim_token)))
    sink.make_visible(ours)
    sink.stage(batch, three_rows(), f"{SLOT}/attempt-0")  # the zombie's upload lands
    (tmp_path / "lake" / path).unlink()  # retention or compaction removes the visible file

    lease = store.get_lease(PARENT, consistent=True)
    assert lease is not None and lease.committed_batch == ours and visible_path(ours) == path
    make_committed_visible(sink, lease)  # the next round's holder, first thing in `_work`

    assert not sink.exists(path), "a file promoted once, then removed, came back from a zombie's staged copy"


# --- 4. a shard end under a sink that makes batches visible at the round's end -----------------------


class RoundEndSink:
    """A table sink in miniature: committed batches become visible when the round ends, so a lease's
    record names them until then. The prepared batch is found visible already (no Kinesis needed)."""

    uri = "memory://table"

    def batch_name(self, batch: BatchRange) -> str:
        return f"{batch.shard_id}/{batch.start}_{batch.end}"

    def adopt(self, staged: str | None, batch: BatchRange, attempt: str) -> StagedBatch | None:
        return StagedBatch(None, rows=3, bytes=0)

    def commit_record(self, previous: str | None, staged: StagedBatch | None) -> str | None:
        return previous if staged is None or staged.token is None else f"{previous} {staged.token}"

    def make_visible(self, record: str | None) -> Visibility:
        return Visibility.AT_ROUND_END


def test_a_shard_end_keeps_the_record_of_batches_that_become_visible_only_at_the_round_end():
    """Committing SHARD_END without the sink's record would forget the lease's committed batches the
    round's publication has yet to make visible."""
    store = InMemoryLeaseStore()
    checkpoint = ESN("100")
    lease = owned(store, PARENT, checkpoint=checkpoint, hash_key_range=HashKeyRange(0, 2**128 - 1))
    committed = store.checkpoint(lease, checkpoint).lease
    assert committed is not None
    waiting = store.update_lease(committed.replace(committed_batch="batches up to 100")).lease
    assert waiting is not None
    described = PendingBatch(checkpoint, SHARD_END, ESN("101"), None, 3, split_of_parent())
    prepared = store.prepare_checkpoint(waiting, SHARD_END, described.encode()).lease
    assert prepared is not None
    held = HeldLease(store, prepared, DURATION, claim_token=f"{SLOT}/attempt-0")
    assert held.claim()
    context = LeaseContext(
        store=store,
        kinesis=None,
        sink=RoundEndSink(),  # type: ignore[arg-type]
        transform_spec=None,
        transform=None,
        retry_policy=FAST_RETRIES,
        at_timestamp=None,
        budget=LeaseBudget(),
    )

    report = LeaseConsumer(held, "stream", PARENT, SINGLE, SLOT, context).run()

    ended = store.get_lease(PARENT, consistent=True)
    assert report.outcome == Outcome.SHARD_END, report.detail
    assert ended is not None and (ended.checkpoint, ended.committed_batch) == (SHARD_END, "batches up to 100")
