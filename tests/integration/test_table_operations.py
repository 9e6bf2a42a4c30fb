"""The table's record of what landed against what other tools do to tables (issue: expiry, rollback,
RESTORE, a re-created stream, a checkpoint behind the table, a round that could not describe its
stream), on each table format where the format has the operation. Rounds are real lease consumers
over a shard in memory and the driver's publication (`tests/contract/test_exactly_once_faults.py`'s
harness); the record is read as `leasectl verify` and `restore` read it (`audit_landed`,
`plan_restore` over the sink's `landed_batches`)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyiceberg.table.snapshots import ancestors_of

from devtools.memory_shard import InMemoryShard
from devtools.table_operations import DeltaAtHand, IcebergAtHand, TableAtHand, library_identities, table_at_hand
from devtools.table_rounds import SHARDS, TableRounds
from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.ops.landed_audit import Finding, audit_landed, plan_restore
from lease_core.retrieval.polling.polling_retrieval import PollingRetrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.memory_store import InMemoryLeaseStore
from sinks.batch_sink import RoundIdentity, StreamIncarnations
from sinks.table.committer import TableCommitter
from sinks.table.delta import DeltaSink
from sinks.table.iceberg import IcebergSink
from sinks.table.iceberg_maintenance import expire_snapshots
from spark_jobs.lease_consumer import LeaseBudget, LeaseConsumer, LeaseContext
from spark_jobs.round_publication import publish_committed_batches
from tests.support.iceberg_tables import URI, faulty_catalog
from tests.support.stores import FAST_RETRIES

APPLICATION = "app"
STREAM = "stream"
SHARD = "shardId-000000000000"
SLOT = "app-worker-0"
FIRST_INCARNATION = {STREAM: (f"arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}", 1_764_000_000)}
SECOND_INCARNATION = {STREAM: (f"arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}", 1_764_500_000)}


@dataclass
class TableUnderTest:
    family: str
    open: Callable[[StreamIncarnations], TableCommitter]

    def sink(self, streams: StreamIncarnations = FIRST_INCARNATION) -> TableCommitter:
        return self.open(streams)


@pytest.fixture(params=["iceberg", "delta"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> TableUnderTest:
    if request.param == "iceberg":
        return TableUnderTest(
            "iceberg", lambda streams: IcebergSink(URI, APPLICATION, faulty_catalog(tmp_path), None, streams)
        )
    return TableUnderTest("delta", lambda streams: DeltaSink(f"delta:{tmp_path / 'lake'}", APPLICATION, streams))


@dataclass
class Rounds:
    """Rounds of one lease of one shard whose records are numbered from `first`; each round reads to the
    shard's tip (`produce` adds records)."""

    table: TableUnderTest
    store: InMemoryLeaseStore
    first: int = 100
    count: int = 0
    number: int = 0
    streams: StreamIncarnations = field(default_factory=lambda: FIRST_INCARNATION)

    def produce(self, records: int) -> None:
        self.count += records

    def run(self, *, publish: bool = True) -> list[str]:
        """One round: the slot's lease consumer, then (unless its driver dies first) the driver's
        publication; the publication's losses."""
        self.number += 1
        shard = InMemoryShard(range(self.first, self.first + self.count))
        lease = self.store.get_lease(SHARD, consistent=True)
        assert lease is not None
        held = HeldLease(self.store, lease, 10_000, claim_token=f"{SLOT}/round-{self.number}")
        assert held.claim()
        context = LeaseContext(
            store=self.store,
            retrieval=PollingRetrieval(shard, FAST_RETRIES, read_bytes_per_second=None),
            shards=KinesisShardSource(shard, retry_policy=FAST_RETRIES),
            sink=self.table.sink(self.streams),
            transform_spec=None,
            transform=None,
            at_timestamp=None,
            budget=LeaseBudget(),
            closed_shards={},
        )
        LeaseConsumer(held, STREAM, SHARD, LeaseKeyScheme(), SLOT, context).run()
        if not publish:
            return []
        identity = RoundIdentity(APPLICATION, self.number, self.streams)
        publication, gone = publish_committed_batches(self.table.sink(self.streams), identity, self.store.list_leases())
        assert publication.error is None, publication.error
        return list(gone)

    def checkpoint(self) -> ExtendedSequenceNumber:
        lease = self.store.get_lease(SHARD, consistent=True)
        assert lease is not None
        return lease.checkpoint


def rounds_of(table: TableUnderTest) -> Rounds:
    store = InMemoryLeaseStore()
    assert store.create_lease_if_not_exists(Lease(SHARD, checkpoint=TRIM_HORIZON))
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None and store.assign_lease(lease, SLOT).applied
    return Rounds(table, store)


def visible(sink: TableCommitter) -> list[int]:
    rows = sink.visible_rows(["sequence_number"])
    return sorted(int(number) for number in ([] if rows is None else rows.column("sequence_number").to_pylist()))


def verify(rounds: Rounds, streams: StreamIncarnations | None = None) -> list[Finding]:
    """`leasectl verify`'s findings: the sink's record against the lease table."""
    sink = rounds.table.sink(streams or rounds.streams)
    leases = rounds.store.list_leases()
    awaiting = {lease.lease_key: start for lease in leases if (start := sink.awaiting_from(lease)) is not None}
    return [finding.finding for finding in audit_landed(leases, sink.landed_batches(), awaiting)]


def three_rounds(table: TableUnderTest) -> Rounds:
    rounds = rounds_of(table)
    for _ in range(3):
        rounds.produce(4)
        assert rounds.run() == []
    assert visible(table.sink()) == list(range(100, 112))
    return rounds


# --- 1. another tool's expiry; a checkpoint behind the table ----------------------------------------


def test_verify_and_restore_read_the_table_after_another_tool_expired_all_but_its_head(tmp_path):
    """Spark's `expire_snapshots(retain_last=1)`: none of the application's snapshots is left in `main`'s
    history, and the table property names the position map."""
    table = TableUnderTest(
        "iceberg", lambda streams: IcebergSink(URI, APPLICATION, faulty_catalog(tmp_path), None, streams)
    )
    rounds = three_rounds(table)
    iceberg = IcebergSink(URI, APPLICATION, faulty_catalog(tmp_path)).table(refresh=True)
    assert iceberg is not None
    head = iceberg.current_snapshot()
    assert head is not None
    iceberg.maintenance.expire_snapshots().by_ids(
        [snapshot.snapshot_id for snapshot in iceberg.snapshots() if snapshot.snapshot_id != head.snapshot_id]
    ).commit()
    iceberg.append(iceberg.scan(limit=0).to_arrow())  # another writer's commit on top, not the application's

    assert [finding for finding in verify(rounds) if finding.is_fault] == []
    fresh = Lease(SHARD, checkpoint=TRIM_HORIZON)  # the lease table lost and made again
    restores, _ = plan_restore([fresh], table.sink().landed_batches())
    assert [(restore.lease.lease_key, restore.target) for restore in restores] == [(SHARD, rounds.checkpoint())]


def test_a_checkpoint_moved_back_behind_the_table_lands_only_what_the_table_lacks(table):
    """A backward reset (or a lease table rebuilt without restore): the next batch starts before the
    table's position and ends after it; only its records past the position land."""
    rounds = three_rounds(table)
    lease = rounds.store.get_lease(SHARD, consistent=True)
    assert lease is not None and rounds.store.reset_checkpoint(lease, ExtendedSequenceNumber("105")).applied
    rounds.produce(4)

    assert rounds.run() == []

    assert visible(table.sink()) == list(range(100, 116))
    assert [finding for finding in verify(rounds) if finding.is_fault] == []


def test_a_checkpoint_moved_back_within_what_the_table_holds_lands_nothing(table):
    rounds = three_rounds(table)
    lease = rounds.store.get_lease(SHARD, consistent=True)
    assert lease is not None and rounds.store.reset_checkpoint(lease, ExtendedSequenceNumber("103")).applied

    assert rounds.run() == []

    assert visible(table.sink()) == list(range(100, 112))


# --- 2. a stream deleted and created again under its name ----------------------------------------


def test_a_recreated_streams_lease_is_neither_restored_to_nor_judged_by_the_old_streams_positions(table):
    three_rounds(table)
    # The stream is deleted and created again: the application's lease table is made anew, and the new
    # stream's shard has the same id and sequence numbers that start over.
    again = rounds_of(table)
    again.streams, again.first = SECOND_INCARNATION, 1

    restores, _ = plan_restore(again.store.list_leases(), table.sink(SECOND_INCARNATION).landed_batches())
    assert restores == []
    assert [finding for finding in verify(again) if finding.is_fault] == []
    again.produce(5)
    assert again.run() == []
    assert visible(table.sink()) == [1, 2, 3, 4, 5, *range(100, 112)]


# --- 3 and 4. rollback: a Delta RESTORE, an Iceberg rollback then expiry ---------------------------


def roll_back_to_the_first_round(table: TableUnderTest, tmp_path: Path) -> None:
    if table.family == "delta":
        delta = DeltaTable(str(tmp_path / "lake"))
        first_commit = min(
            int(entry["version"]) for entry in delta.history() if entry.get("kinesis.application") == APPLICATION
        )
        delta.restore(first_commit)
        return
    iceberg = IcebergSink(URI, APPLICATION, faulty_catalog(tmp_path)).table(refresh=True)
    assert iceberg is not None
    own = [
        snapshot
        for snapshot in ancestors_of(iceberg.current_snapshot(), iceberg.metadata)
        if snapshot.summary is not None and snapshot.summary.get("kinesis.application") == APPLICATION
    ]
    iceberg.manage_snapshots().rollback_to_snapshot(own[-1].snapshot_id).commit()
    rolled_back = [snapshot.snapshot_id for snapshot in own[:-1]]
    iceberg.maintenance.expire_snapshots().by_ids(rolled_back).commit()  # nothing shows the rollback now


def test_a_rollback_past_the_applications_commits_is_a_fault_for_verify_and_a_loss_named_by_the_next_round(
    table, tmp_path
):
    """Rounds 2 and 3 are rolled back. Round 3's batch is still named by the lease's record (its next
    commit drops what the table holds), so the next round publishes it again; round 2's is named by
    nothing: the next round's publication names it as a loss, and verify reports the gap for good."""
    rounds = three_rounds(table)
    roll_back_to_the_first_round(table, tmp_path)

    assert visible(table.sink()) == list(range(100, 104))
    assert any(finding.is_fault for finding in verify(rounds)), "verify must not agree over a loss"
    rounds.produce(4)
    losses = rounds.run()
    assert len(losses) == 1 and "through 103" in losses[0] and "after 107" in losses[0], losses
    assert visible(table.sink()) == [*range(100, 104), *range(108, 116)]
    assert Finding.GAP in verify(rounds)


def test_the_applications_own_expiry_keeps_the_snapshot_the_table_property_names(tmp_path):
    table = TableUnderTest(
        "iceberg", lambda streams: IcebergSink(URI, APPLICATION, faulty_catalog(tmp_path), None, streams)
    )
    three_rounds(table)
    sink = IcebergSink(URI, APPLICATION, faulty_catalog(tmp_path))
    iceberg = sink.table(refresh=True)
    assert iceberg is not None
    first = list(ancestors_of(iceberg.current_snapshot(), iceberg.metadata))[-1]
    iceberg.manage_snapshots().rollback_to_snapshot(first.snapshot_id).commit()
    iceberg.append(iceberg.scan(limit=0).to_arrow())

    expire_snapshots(sink, now=None)  # nothing is old enough but the property's snapshot must stay anyway
    reloaded = sink.table(refresh=True)
    assert reloaded is not None
    named = reloaded.properties[sink.positions_property].split(" ")[0]
    assert any(
        snapshot.summary is not None and snapshot.summary.get("kinesis.commit-id") == named
        for snapshot in reloaded.snapshots()
    )


# --- 5. a round that could not describe its stream ----------------------------------------------


def test_a_round_that_could_not_describe_its_stream_publishes_nothing_and_the_next_round_lands_it(table):
    rounds = rounds_of(table)
    rounds.produce(4)
    rounds.streams = {}
    with pytest.raises(AssertionError, match="could not be described"):
        rounds.run()
    assert visible(table.sink()) == []

    rounds.streams = FIRST_INCARNATION
    assert rounds.run() == []
    assert visible(table.sink()) == list(range(100, 104))


# --- 6. found by the table-operations campaign (bench/table_operations.py) ------------------------


@pytest.fixture(params=["iceberg", "delta"])
def at_hand(request: pytest.FixtureRequest, tmp_path: Path) -> TableAtHand:
    return table_at_hand(request.param, tmp_path)


def landed(at_hand: TableAtHand) -> list[int]:
    return sorted(int(identity[2]) for identity in library_identities(at_hand.open_sink({})))


def test_batches_whose_staged_data_files_an_orphan_removal_deleted_are_named_lost_and_never_committed(at_hand):
    """The driver died before publishing; an orphan removal that leaves the sink's own folders alone
    (`metadata/kinesis-*`, `_kinesis/`) but has no grace period deletes the staged data files, which
    no snapshot or log entry references. Committing them would leave every reader failing on files
    that are gone (Iceberg did): the next round names the batches lost instead."""
    rounds = TableRounds(at_hand.open_sink)
    rounds.produce(SHARDS[0], 2)
    assert rounds.run().named_losses == ()
    rounds.produce(SHARDS[0], 3)
    assert not rounds.run(publish=False).published
    at_hand.operations()["orphan removal (exclusions kept)"](random.Random(1))

    result = rounds.run()

    assert result.error is None
    assert result.named_losses == (f"{SHARDS[0]}: the batch after {rounds.base + 2} up to {rounds.base + 5}",)
    assert landed(at_hand) == [rounds.base + 1, rounds.base + 2]
    analyst = at_hand.analyst()
    assert analyst is not None and analyst.count() == 2
    assert any(finding.finding.is_fault for finding in rounds.verify())


def test_a_table_another_writer_deleted_from_with_delta_rs_is_read_whole(tmp_path):
    """delta-rs' DELETE rewrites a file with `string_view` columns: the sink's reads take every file in
    the table's types."""
    at_hand = DeltaAtHand(tmp_path)
    rounds = TableRounds(at_hand.open_sink)
    rounds.produce(SHARDS[0], 3)
    rounds.run()
    delta = at_hand.table()
    assert delta is not None
    delta.delete(f"sequence_number = '{rounds.base + 2}'")  # the file's other rows are written anew
    rounds.produce(SHARDS[0], 1)
    rounds.run()
    assert landed(at_hand) == [rounds.base + 1, rounds.base + 3, rounds.base + 4]


def roll_back_to(at_hand: TableAtHand, commit: int) -> None:
    """Another tool's rollback (Iceberg) or RESTORE (Delta) to the table as of `commit` (a snapshot id, a version)."""
    if isinstance(at_hand, DeltaAtHand):
        delta = at_hand.table()
        assert delta is not None
        delta.restore(commit)
        return
    assert isinstance(at_hand, IcebergAtHand)
    iceberg = at_hand.table()
    assert iceberg is not None
    iceberg.manage_snapshots().rollback_to_snapshot(commit).commit()


def head_of(at_hand: TableAtHand) -> int:
    if isinstance(at_hand, DeltaAtHand):
        delta = at_hand.table()
        assert delta is not None
        return delta.version()
    assert isinstance(at_hand, IcebergAtHand)
    iceberg = at_hand.table()
    assert iceberg is not None and iceberg.current_snapshot() is not None
    return iceberg.current_snapshot().snapshot_id  # type: ignore[union-attr]


def test_a_rollback_past_a_recreated_streams_first_commits_is_named_by_the_next_round(at_hand):
    """The table holds nothing of the new stream's lease any more, and the lease's record dropped its
    first batch (its next commit found it in the table): the batch the record still names starts after
    records the table lacks. Before, the publication had no position to compare with and landed it
    without a word."""
    rounds = TableRounds(at_hand.open_sink)
    rounds.produce(SHARDS[1], 2)
    assert rounds.run().named_losses == ()
    before_the_new_stream = head_of(at_hand)
    rounds.recreate_stream()
    rounds.produce(SHARDS[1], 3)
    assert rounds.run().named_losses == ()
    rounds.produce(SHARDS[1], 1)
    assert rounds.run().named_losses == ()
    roll_back_to(at_hand, before_the_new_stream)
    rounds.produce(SHARDS[1], 1)

    losses = rounds.run().named_losses

    assert losses == (
        f"{SHARDS[1]}: the table holds none of the lease's records, but its next batch starts after "
        f"{rounds.base + 3}: the records up to there are not in the table (rolled back, or skipped)",
    )
    assert [finding.finding for finding in rounds.verify() if finding.finding.is_fault] == [Finding.GAP]


def cut_the_history(at_hand: TableAtHand) -> None:
    """Another tool's expiry of every snapshot but the head (Iceberg), or a checkpoint and log cleanup (Delta)."""
    operation = "expire all but head" if at_hand.family == "iceberg" else "log cleanup after a checkpoint"
    assert at_hand.operations()[operation](random.Random(1)) is not None


def test_a_named_loss_stays_on_verifys_record_after_the_history_that_showed_it_is_gone(at_hand):
    """A rollback, a named gap, then expiry (or log cleanup) of the commits on both sides of it: the
    position maps carry every loss a round named, so verify never agrees over it."""
    rounds = TableRounds(at_hand.open_sink)
    rounds.produce(SHARDS[0], 2)
    rounds.run()
    first = head_of(at_hand)
    rounds.produce(SHARDS[0], 2)
    rounds.run()
    rounds.produce(SHARDS[0], 2)
    rounds.run()
    roll_back_to(at_hand, first)
    rounds.produce(SHARDS[0], 2)
    assert len(rounds.run().named_losses) == 1
    rounds.produce(SHARDS[0], 1)
    rounds.run()

    cut_the_history(at_hand)

    assert landed(at_hand) == [rounds.base + number for number in (1, 2, 5, 6, 7, 8, 9)]
    findings = [finding.render() for finding in rounds.verify() if finding.finding.is_fault]
    assert findings == [
        f"{SHARDS[0]}: gap: round 4 named the records after {rounds.base + 2} through {rounds.base + 4} lost: the "
        "sink does not hold them"
    ]


def test_a_restore_to_the_version_log_cleanup_starts_from_leaves_the_rounds_going(tmp_path):
    """The log before a checkpoint cleaned up, then a RESTORE to the checkpoint's version: the table as
    of the oldest entry left names the application's map (the sink loaded the version before it, which
    is gone, and every round failed)."""
    at_hand = DeltaAtHand(tmp_path)
    rounds = TableRounds(at_hand.open_sink)
    for _ in range(3):
        rounds.produce(SHARDS[0], 2)
        rounds.run()
    cut_the_history(at_hand)
    checkpointed = head_of(at_hand)
    rounds.produce(SHARDS[0], 2)
    rounds.run()
    roll_back_to(at_hand, checkpointed)
    rounds.produce(SHARDS[0], 1)

    result = rounds.run()

    assert (result.error, result.named_losses) == (None, ())
    assert landed(at_hand) == [rounds.base + number for number in range(1, 10)]
    assert [finding for finding in rounds.verify() if finding.finding.is_fault] == []


# --- losses the publication names once and the table keeps on record ---------------------------------


def test_a_lease_committed_past_the_table_with_no_batch_waiting_is_named_once_and_kept_on_record(table):
    """An operator's forward reset skips records (as a rollback that took out batches the lease's record
    had already dropped leaves them): the next publication names the records between the table's
    position and the checkpoint, once, and verify reports them from then on."""
    rounds = three_rounds(table)
    rounds.produce(4)
    lease = rounds.store.get_lease(SHARD, consistent=True)
    assert lease is not None and rounds.store.reset_checkpoint(lease, ExtendedSequenceNumber("115")).applied

    losses = rounds.run()

    assert len(losses) == 1 and "through 111" in losses[0] and "committed through 115" in losses[0], losses
    assert Finding.GAP in verify(rounds)
    rounds.produce(2)
    assert rounds.run() == [], "named once"
    assert visible(table.sink()) == [*range(100, 112), 116, 117]
    assert Finding.GAP in verify(rounds)


def test_a_batch_whose_staged_data_was_deleted_before_its_publication_is_named_once_and_kept_on_record(table):
    rounds = three_rounds(table)
    rounds.produce(4)
    rounds.run(publish=False)  # the driver died: (111, 115] is committed and staged, not published
    delete_staged_batches(table)

    losses = rounds.run()

    assert len(losses) == 1 and "after 111 up to 115" in losses[0], losses
    rounds.produce(2)
    assert rounds.run() == [], "named once"
    assert visible(table.sink()) == [*range(100, 112), 116, 117]
    assert Finding.GAP in verify(rounds)


def delete_staged_batches(table: TableUnderTest) -> None:
    """What an orphan removal run with too short a grace period deletes: every staged receipt."""
    sink = table.sink()
    if isinstance(sink, DeltaSink):
        staged = [file.path for file in sink.storage.listing("_kinesis/staged")]
        sink.storage.delete(staged)
        return
    assert isinstance(sink, IcebergSink)
    iceberg = sink.table(refresh=True)
    assert iceberg is not None
    folder = Path(sink.staging_location(iceberg).removeprefix("file://"))
    for receipt in folder.glob("*.json"):
        receipt.unlink()
