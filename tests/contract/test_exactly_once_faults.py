"""Exactly-once under the faults an adversarial review found: a slot's attempts claiming out of
order, a committed batch its sink cannot make visible or whose staged data is deleted first, a
zombie's late copy of a batch, a finished lease whose last batch is not visible yet, a transaction
retried while its first try is in progress. The cases that depend on the sink run over every sink
(`tests/support/sinks_under_test.py`): a Parquet dataset, whose slots make each batch visible right
after its commit, and an Iceberg table, whose driver makes a round's batches visible at its end.
Kinesis is a shard in memory (`devtools/memory_shard.py`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import botocore.exceptions

from devtools.memory_shard import InMemoryShard
from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.lifecycle.lease_lifecycle import apply_cleanup, create_child_leases, plan_lease_cleanup
from lease_core.model.lease import HashKeyRange, Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard
from lease_core.retrieval.polling.polling_retrieval import PollingRetrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.memory_store import InMemoryLeaseStore
from sinks.batch_sink import BatchRange, BatchSink, StagedBatch, Visibility
from spark_jobs.lease_consumer import LeaseBudget, LeaseConsumer, LeaseContext
from spark_jobs.round_report import LeaseReport, Outcome, RoundReport, SlotReport
from spark_jobs.slot_task import SlotTask
from tests.support.faults import FaultInjectingClient, client_error
from tests.support.sinks_under_test import APPLICATION, STREAM, SinkUnderTest, StagedDataGone, end_round
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


# --- 2. committed batches every sink must make visible exactly once -----------------------------------
# Each test runs over every sink (`tests/support/sinks_under_test.py`). A round is the consume job's: the
# slot's lease consumer, then the driver's publication of every committed batch the lease table names.

START, FIRST, END = ESN("100"), ESN("101"), ESN("103")
BATCH = BatchRange(PARENT, STREAM, PARENT, START, FIRST, END)
LANDED = ["101", "102", "103"]
OPEN_SHARD = InMemoryShard(range(100, 104))
CLOSED_SHARD = InMemoryShard(range(100, 104), split_of_parent())


def a_round(
    store: InMemoryLeaseStore, number: int, sinks: Callable[[], BatchSink], shard: InMemoryShard
) -> RoundReport:
    """Round `number` on PARENT: attempt `number` of SLOT claims it and does its work, then the driver
    publishes; each opens its own sink (`sinks`), as the slot's and the driver's processes do."""
    lease = store.get_lease(PARENT, consistent=True)
    assert lease is not None
    held = HeldLease(store, lease, DURATION, claim_token=f"{SLOT}/attempt-{number}")
    assert held.claim()
    context = LeaseContext(
        store=store,
        retrieval=PollingRetrieval(shard, FAST_RETRIES, read_bytes_per_second=None),
        shards=KinesisShardSource(shard, retry_policy=FAST_RETRIES),
        sink=sinks(),
        transform_spec=None,
        transform=None,
        at_timestamp=None,
        budget=LeaseBudget(),
        closed_shards={PARENT: None} if shard.children else {},
    )
    report = LeaseConsumer(held, STREAM, PARENT, SINGLE, SLOT, context).run()
    driver = sinks()
    publication, gone = end_round(driver, store, number)
    slots = [SlotReport(SLOT, number, 1.0, -1, (report,))]
    return RoundReport.build(
        APPLICATION,
        number,
        [STREAM],
        driver.uri,
        "2026-11-26T00:00:00",
        1.0,
        slots,
        publication=publication,
        unpublishable_batches=gone,
    )


def lease_report(report: RoundReport) -> LeaseReport:
    ((lease,),) = (slot.leases for slot in report.slots)
    return lease


def prepared_and_staged_by_an_earlier_attempt(store: InMemoryLeaseStore, sink: BatchSink) -> None:
    """PARENT at 100 with (100, 103] prepared and staged by an attempt that died before its commit."""
    earlier = sink.stage(BATCH, OPEN_SHARD.rows(101, 103), "earlier")
    lease = owned(store, PARENT, checkpoint=START)
    described = PendingBatch(START, END, FIRST, sink.batch_name(BATCH), 3, staged=earlier.token)
    assert store.prepare_checkpoint(lease, END, described.encode()).applied


@dataclass(frozen=True)
class NotVisibleYet:
    """What a round whose sink cannot make its committed batch visible says of it."""

    outcome: str  # the lease's, in its slot's report
    named_by_the_lease: bool  # the lease's report names the batch: its slot's step to make it visible failed
    publication_error: str  # the round's publication failed as well


NOT_VISIBLE_YET = {
    # The slot's promotion fails, and so does the driver's of what the slot left staged.
    "parquet": NotVisibleYet(Outcome.FAILED, True, "injected: the promotion failed"),
    # The slot only stages and commits; the round's one table commit fails.
    "iceberg": NotVisibleYet(Outcome.CAUGHT_UP, False, "injected: the catalog cannot be reached to commit"),
    "delta": NotVisibleYet(Outcome.CAUGHT_UP, False, "injected: the Delta log cannot be written to commit"),
}


def test_a_committed_batch_its_sink_cannot_make_visible_is_reported_and_made_visible_once_by_the_next_round(
    sink_under_test: SinkUnderTest,
):
    """(100, 103] was prepared and staged by an attempt that died; this round's attempt redoes it (takes
    the staged batch over, or reads it again) and commits it, and the sink cannot make it visible all
    round long (an S3 503 on every promotion, a catalog that cannot be reached to commit)."""
    under = sink_under_test
    store = InMemoryLeaseStore()
    prepared_and_staged_by_an_earlier_attempt(store, under.sink())

    report = a_round(store, 1, under.visibility_failing, OPEN_SHARD)

    expected = NOT_VISIBLE_YET[under.family]
    lease = store.get_lease(PARENT, consistent=True)
    assert lease is not None and lease.checkpoint == END and under.visible_sequence_numbers() == []
    named = under.sink().batch_name(BATCH) if expected.named_by_the_lease else None
    assert (lease_report(report).outcome, lease_report(report).unpromoted_batch) == (expected.outcome, named)
    assert report.totals.unpromoted_batches == ((f"{PARENT}: {named}",) if named else ())
    assert not report.succeeded and report.publication is not None
    assert expected.publication_error in (report.publication.error or "")
    assert "NOT VISIBLE YET: the round's committed batches were not published" in report.summary()
    assert under.sink().awaiting_visibility(lease.committed_batch) != (), "the idle check would take it for idle"

    healed = a_round(store, 2, under.sink, OPEN_SHARD)  # the next holder, then the driver

    assert healed.succeeded and healed.totals.missing_batches == ()
    assert under.visible_sequence_numbers() == LANDED
    assert under.sink().awaiting_visibility(lease.committed_batch) == ()
    end_round(under.sink(), store, 3)  # a driver publishing again
    assert under.visible_sequence_numbers() == LANDED


# How a round's report names a committed batch whose staged data is gone: "lease key: batch".
LOST_BATCHES = {
    "parquet": f"{PARENT}: stream_name={STREAM}/shard_id={PARENT}/100-0_103-0.parquet",
    "iceberg": f"{PARENT}: the batch up to 103",
    "delta": f"{PARENT}: the batch up to 103",
}


def a_round_losing_its_batch(under: SinkUnderTest) -> RoundReport:
    """(100, 103] prepared and staged by an attempt that died, redone and committed by this round's; a
    lifecycle rule or an orphan-file cleanup deletes its staged data before each step to make it visible."""
    store = InMemoryLeaseStore()
    prepared_and_staged_by_an_earlier_attempt(store, under.sink())
    return a_round(store, 1, lambda: StagedDataGone(under.sink(), under.remove_staged), OPEN_SHARD)


def test_a_committed_batch_whose_staged_data_is_deleted_before_it_is_visible_is_reported_as_lost(
    sink_under_test: SinkUnderTest,
):
    report = a_round_losing_its_batch(sink_under_test)

    lost = LOST_BATCHES[sink_under_test.family]
    assert lost in report.totals.missing_batches and report.totals.unpromoted_batches == ()
    assert f"LOSS: {lost}: committed, but its file was deleted before it was visible in the sink" in report.summary()
    assert sink_under_test.visible_sequence_numbers() == []


def test_a_round_names_a_lost_batch_once_by_its_lease(sink_under_test: SinkUnderTest):
    """The slot that finds the batch's staged data gone names it, and so does the driver's publication
    after it: the round's report (its LOSS lines, the alert `records_lost` raises) names it once."""
    report = a_round_losing_its_batch(sink_under_test)

    assert report.totals.missing_batches == (LOST_BATCHES[sink_under_test.family],)


def test_a_zombies_late_staged_copy_of_a_batch_made_visible_is_never_made_visible(sink_under_test: SinkUnderTest):
    """Attempt 0 was inside its upload of (100, 103] when attempt 1 claimed the lease, read the batch,
    committed it and made it visible; attempt 0's upload lands then. The next rounds' steps to make
    committed batches visible never bring the zombie's copy to readers: not while the batch is visible
    (no second copy), nor once retention or compaction removed the batch's rows."""
    under = sink_under_test
    store = InMemoryLeaseStore()
    owned(store, PARENT, checkpoint=START)
    assert a_round(store, 1, under.sink, OPEN_SHARD).succeeded
    assert under.visible_sequence_numbers() == LANDED

    under.sink().stage(BATCH, OPEN_SHARD.rows(101, 103), f"{SLOT}/attempt-0")  # the zombie's upload lands
    assert a_round(store, 2, under.sink, OPEN_SHARD).succeeded
    assert under.visible_sequence_numbers() == LANDED, "a zombie's staged copy was made visible as well"

    under.remove_visible_rows(PARENT)
    a_round(store, 3, under.sink, OPEN_SHARD)
    assert under.visible_sequence_numbers() == [], "a batch made visible, then removed, came back from a zombie's copy"


# Where a closed shard's lease stands after a round whose sink could not make its last batch visible.
AFTER_AN_UNSEEN_LAST_BATCH = {
    "parquet": END,  # its slot's promotion failed, so the slot stopped before the shard's end
    "iceberg": SHARD_END,  # a table's batches wait for the round's end: the lease ends its shard, naming them
    "delta": SHARD_END,
}


def shard_sync_cleanup(store: InMemoryLeaseStore, sink: BatchSink) -> None:
    """The next round's shard sync, before any slot: cleanup asks the sink which committed batches wait."""

    def waiting(lease: Lease) -> bool:
        return bool(sink.awaiting_visibility(lease.committed_batch))

    apply_cleanup(store, plan_lease_cleanup(store.list_leases(), None, SINGLE, awaiting_visibility=waiting))


def test_cleanup_never_deletes_a_finished_lease_whose_committed_batch_is_not_visible_yet(
    sink_under_test: SinkUnderTest,
):
    """The closed shard's last batch (100, 103] is committed and the round cannot make it visible. The
    children already had leases (shard sync created them), and their slots read them as soon as the
    parent reached SHARD_END. Deleting the parent then would delete the only record that its batch is
    committed: nobody would ever make it visible, and nothing would report it."""
    under = sink_under_test
    store = InMemoryLeaseStore()
    for child in split_of_parent():  # created by shard sync, assigned to another slot for this round
        owned(
            store,
            child.shard_id,
            OTHER_SLOT,
            checkpoint=TRIM_HORIZON,
            parent_shard_ids=frozenset({PARENT}),
            hash_key_range=child.hash_key_range,
        )
    owned(store, PARENT, checkpoint=START, hash_key_range=HashKeyRange(0, 2**128 - 1))

    a_round(store, 1, under.visibility_failing, CLOSED_SHARD)
    parent = store.get_lease(PARENT, consistent=True)
    assert parent is not None and parent.checkpoint == AFTER_AN_UNSEEN_LAST_BATCH[under.family]
    assert under.sink().awaiting_visibility(parent.committed_batch) != ()
    for child in CHILDREN:  # the children's slots read them
        started = store.get_lease(child, consistent=True)
        assert started is not None and store.checkpoint(started, ESN("500")).applied
    shard_sync_cleanup(store, under.sink())
    assert store.get_lease(PARENT, consistent=True) is not None, "deleted while its committed batch is not visible"

    assert a_round(store, 2, under.sink, CLOSED_SHARD).succeeded
    shard_sync_cleanup(store, under.sink())
    assert store.get_lease(PARENT, consistent=True) is None, "finished, its batch visible: cleanup deletes it"
    assert under.visible_sequence_numbers() == LANDED


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
        retrieval=PollingRetrieval(None, FAST_RETRIES),
        shards=KinesisShardSource(None, retry_policy=FAST_RETRIES),
        sink=RoundEndSink(),  # type: ignore[arg-type]
        transform_spec=None,
        transform=None,
        at_timestamp=None,
        budget=LeaseBudget(),
    )

    report = LeaseConsumer(held, "stream", PARENT, SINGLE, SLOT, context).run()

    ended = store.get_lease(PARENT, consistent=True)
    assert report.outcome == Outcome.SHARD_END, report.detail
    assert ended is not None and (ended.checkpoint, ended.committed_batch) == (SHARD_END, "batches up to 100")
