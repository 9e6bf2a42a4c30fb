"""A lease's life after shard sync: parents block children, SHARD_END creates children, cleanup deletes.

docs/protocol.md §3.7, §3.8 and §3.10; the deciders over snapshots, the coordinators over the in-memory store.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field

import pytest

from devtools.shard_lineage import LineageBuilder, shard_id
from lease_core.errors import InvalidShardLineageError, LeaseLostError
from lease_core.lifecycle.lease_lifecycle import (
    ChildIdsRecord,
    ChildLeaseOutcome,
    CleanupOutcome,
    CleanupPlan,
    CleanupReason,
    LeaseDeletion,
    apply_cleanup,
    blocking_parents,
    create_child_leases,
    forget_reported_losses,
    parents_have_finished,
    plan_lease_cleanup,
    unlisted_leases,
)
from lease_core.model.lease import AgedOutRange, HashKeyRange, Lease, StreamIdentifier
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard, Shard
from lease_core.store.memory_store import InMemoryLeaseStore

S = shard_id
SINGLE = LeaseKeyScheme()
READING = ExtendedSequenceNumber("1500")
HALF = HashKeyRange(0, 2**127 - 1)
OWNER = "app-worker-0"
OTHER_HALF = HashKeyRange(2**127, 2**128 - 1)


def lease(n: int, checkpoint: ExtendedSequenceNumber = READING, parents=(), children=()) -> Lease:
    return Lease(
        S(n),
        checkpoint=checkpoint,
        parent_shard_ids=frozenset(S(p) for p in parents),
        child_shard_ids=frozenset(S(c) for c in children),
    )


def held(n: int, checkpoint: ExtendedSequenceNumber = READING) -> Lease:
    """Lease n as its holder sees it: the parent whose shard end creates children."""
    return lease(n, checkpoint).replace(lease_owner=OWNER)


def by_key(*leases: Lease) -> dict[str, Lease]:
    return {item.lease_key: item for item in leases}


def store_with(*leases: Lease) -> InMemoryLeaseStore:
    store = InMemoryLeaseStore()
    for item in leases:
        assert store.create_lease_if_not_exists(item)
    return store


def stored(store: InMemoryLeaseStore, key: str) -> Lease:
    found = store.get_lease(key)
    assert found is not None, f"lease {key} should exist"
    return found


# --- §3.7: parents block their children ----------------------------------------------------------

BLOCKING_CASES = [
    pytest.param(lease(2), [], set(), id="no-parents-never-blocks"),
    pytest.param(lease(2, parents=[0]), [lease(0, SHARD_END)], set(), id="parent-at-shard-end-lets-child-read"),
    pytest.param(lease(2, parents=[0]), [lease(0, READING)], {S(0)}, id="parent-still-reading-blocks"),
    pytest.param(lease(2, parents=[0]), [lease(0, TRIM_HORIZON)], {S(0)}, id="parent-not-started-blocks"),
    pytest.param(lease(2, parents=[0]), [], set(), id="deleted-parent-does-not-block"),
    pytest.param(
        lease(2, parents=[0, 1]), [lease(0, SHARD_END), lease(1, LATEST)], {S(1)}, id="merge-one-parent-unfinished"
    ),
    pytest.param(lease(2, parents=[0, 1]), [lease(0, SHARD_END)], set(), id="merge-one-finished-one-deleted"),
]


@pytest.mark.parametrize(("child", "parents", "expected"), BLOCKING_CASES)
def test_blocking_parents_in_a_snapshot(child, parents, expected):
    assert blocking_parents(child, by_key(child, *parents), SINGLE) == expected


@pytest.mark.parametrize(("child", "parents", "expected"), BLOCKING_CASES)
def test_parents_have_finished_reads_the_store(child, parents, expected):
    store = store_with(child, *parents)
    assert parents_have_finished(store, child, SINGLE) is (not expected)


def test_multi_stream_parents_are_looked_up_under_the_stream_key():
    scheme = LeaseKeyScheme(StreamIdentifier("123456789012", "orders", 1700000000))
    child = scheme.new_lease(S(2), TRIM_HORIZON, {S(0)}, HALF)
    parent = scheme.new_lease(S(0), READING, (), HALF)
    # A single-stream lease with the bare parent id belongs to no stream and must not be consulted.
    store = store_with(child, parent, Lease(S(0), checkpoint=SHARD_END))
    assert blocking_parents(child, by_key(child, parent), scheme) == {parent.lease_key}
    assert not parents_have_finished(store, child, scheme)


# --- §3.8: child leases at SHARD_END -------------------------------------------------------------


def split_children() -> tuple[Shard, list[ChildShard]]:
    lineage = LineageBuilder(1)
    lineage.split(S(0))
    shards = {shard.shard_id: shard for shard in lineage.shards()}
    children = [ChildShard(s, frozenset({S(0)}), shards[s].hash_key_range) for s in (S(1), S(2))]
    return shards[S(0)], children


def merged_child(parents: frozenset[str] = frozenset({S(0), S(1)})) -> ChildShard:
    return ChildShard(S(2), parents, HashKeyRange(0, 2**128 - 1))


def test_a_split_creates_both_children_at_trim_horizon_and_records_them_on_the_parent():
    parent_shard, children = split_children()
    parent = held(0).replace(hash_key_range=parent_shard.hash_key_range)
    store = store_with(parent)

    outcome = create_child_leases(store, parent, children, SINGLE)

    assert outcome == ChildLeaseOutcome(created=(S(1), S(2)), existing=(), child_ids_recorded=True)
    assert stored(store, S(0)).child_shard_ids == {S(1), S(2)}
    for child in children:
        created = stored(store, child.shard_id)
        assert (created.checkpoint, created.parent_shard_ids) == (TRIM_HORIZON, {S(0)})
        assert created.hash_key_range == child.hash_key_range
        assert (created.lease_owner, created.lease_counter) == (None, 0)


def test_running_child_creation_again_creates_nothing_and_keeps_the_children():
    _parent_shard, children = split_children()
    parent = held(0)
    store = store_with(parent)
    create_child_leases(store, parent, children, SINGLE)
    started = store.checkpoint(stored(store, S(1)), READING).lease

    again = create_child_leases(store, stored(store, S(0)), children, SINGLE)

    assert (again.created, again.existing, again.deferred) == ((), (S(1), S(2)), False)
    assert stored(store, S(1)) == started, "an existing child lease is never overwritten"


@pytest.mark.parametrize(
    ("other_parent_leased", "deferred", "created"),
    [
        pytest.param(True, False, (S(2),), id="both-parent-leases-exist-creates-the-child"),
        pytest.param(False, True, (), id="only-this-parent-leased-defers"),
    ],
)
def test_merge_creates_the_child_only_when_both_parent_leases_exist(other_parent_leased, deferred, created):
    parent = held(0)
    store = store_with(parent, *([lease(1, SHARD_END)] if other_parent_leased else []))

    outcome = create_child_leases(store, parent, [merged_child()], SINGLE)

    assert (outcome.deferred, outcome.created) == (deferred, created)
    assert (store.get_lease(S(2)) is None) is deferred


def test_a_deferred_merge_says_which_parent_it_waits_for_and_writes_nothing():
    parent = held(0)
    store = store_with(parent)

    outcome = create_child_leases(store, parent, [merged_child()], SINGLE)

    assert outcome.deferred and not outcome.child_ids_recorded
    assert S(1) in outcome.reason
    assert stored(store, S(0)).child_shard_ids == frozenset()


@pytest.mark.parametrize(
    "parents",
    [
        pytest.param(frozenset({S(0)}), id="one-parent"),
        pytest.param(frozenset(), id="no-parent"),
        pytest.param(frozenset({S(0), S(1), S(5)}), id="three-parents"),
    ],
)
def test_a_single_child_without_exactly_two_parents_is_invalid_lineage(parents):
    parent = lease(0, SHARD_END)
    store = store_with(parent)
    with pytest.raises(InvalidShardLineageError) as caught:
        create_child_leases(store, parent, [merged_child(parents)], SINGLE)
    assert caught.value.lease_key == S(0)
    assert S(0) in str(caught.value) and "exactly two" in str(caught.value)
    assert store.get_lease(S(2)) is None


def test_invalid_lineage_pickles_and_is_not_retryable():
    error = InvalidShardLineageError("shardId-1", "the merged child names 1 parent")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.args, vars(copy)) == (type(error), str(error), error.args, vars(error))
    assert not copy.retryable


class ReadRecordingStore(InMemoryLeaseStore):
    """Remembers the consistency of every single-lease read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[bool | None] = []

    def get_lease(self, lease_key: str, consistent: bool | None = None) -> Lease | None:
        self.reads.append(consistent)
        return super().get_lease(lease_key, consistent)


def test_parent_leases_are_read_strongly_consistently():
    # An eventually consistent read could miss a parent lease created moments ago.
    store = ReadRecordingStore()
    for parent in (held(0), lease(1, SHARD_END)):
        store.create_lease_if_not_exists(parent)
    parents_have_finished(store, lease(2, parents=[0, 1]), SINGLE)
    create_child_leases(store, held(0), [merged_child()], SINGLE)
    assert store.reads == [True] * 5  # two parents, then the two parents and the child


def test_no_children_writes_nothing():
    parent = lease(0, SHARD_END)
    store = store_with(parent)
    assert create_child_leases(store, parent, [], SINGLE) == ChildLeaseOutcome()
    assert stored(store, S(0)) == parent


def test_a_holder_whose_parent_lease_was_deleted_meanwhile_creates_no_child_and_has_lost_the_lease():
    _, children = split_children()
    store = InMemoryLeaseStore()
    with pytest.raises(LeaseLostError, match="the lease was deleted"):
        create_child_leases(store, held(0), children, SINGLE)
    assert store.list_leases() == []


@pytest.mark.parametrize(
    "fence",
    [
        pytest.param(lambda store, lease: store.assign_lease(lease, "app-worker-1"), id="assigned-elsewhere"),
        pytest.param(lambda store, lease: store.claim_lease(lease, "another-attempt"), id="claimed-by-a-twin-attempt"),
        pytest.param(lambda store, lease: store.reset_checkpoint(lease, TRIM_HORIZON), id="reset-by-an-operator"),
    ],
)
def test_a_stale_holder_creates_no_child_even_after_the_children_were_read_and_cleaned_up(fence):
    """Hole 2 of issue 13: a paused holder of a parent must not re-create a child at TRIM_HORIZON."""
    _, children = split_children()
    stale = held(0).replace(claim_token="paused-attempt")
    store = store_with(stale)
    fence(store, stale)  # the parent moves on without the paused holder...
    assert store.get_lease(S(1)) is None  # ...its children were read and cleaned up: none is left
    with pytest.raises(LeaseLostError, match="not as this holder last wrote it"):
        create_child_leases(store, stale, children, SINGLE)
    assert [item.lease_key for item in store.list_leases()] == [S(0)]
    assert stored(store, S(0)).child_shard_ids == frozenset()


def test_multi_stream_children_get_stream_keys_and_bare_ids_on_the_parent():
    stream = StreamIdentifier("123456789012", "orders", 1700000000)
    scheme = LeaseKeyScheme(stream)
    _, children = split_children()
    parent = scheme.new_lease(S(0), READING, (), HALF).replace(lease_owner=OWNER)
    store = store_with(parent)

    outcome = create_child_leases(store, parent, children, scheme)

    assert outcome.created == (stream.lease_key(S(1)), stream.lease_key(S(2)))
    child = stored(store, stream.lease_key(S(1)))
    assert (child.stream_name, child.shard_id, child.parent_shard_ids) == (stream.serialize(), S(1), {S(0)})
    assert stored(store, parent.lease_key).child_shard_ids == {S(1), S(2)}


# --- §3.10: cleanup -------------------------------------------------------------------------------


def split_lineage() -> list[Shard]:
    """Shard 0 split into 1 and 2, and shard 1 split again into 3 and 4."""
    lineage = LineageBuilder(1)
    lineage.split(S(0))
    lineage.split(S(1))
    return lineage.shards()


def listing_without(*removed: int) -> list[Shard]:
    return [shard for shard in split_lineage() if shard.shard_id not in {S(n) for n in removed}]


FINISHED_PARENT = lease(0, SHARD_END, children=[1, 2])
UNRECORDED_PARENT = lease(0, SHARD_END)
COMPLETED = CleanupReason.COMPLETED
GONE = CleanupReason.SHARD_GONE


def deleted(n: int, reason: CleanupReason, unread: bool = False) -> tuple[str, CleanupReason, bool]:
    return S(n), reason, unread


@dataclass(frozen=True)
class Expected:
    """A cleanup plan by lease key: deletions as (key, reason, unread records possible)."""

    deletions: frozenset[tuple[str, CleanupReason, bool]] = frozenset()
    records: dict[str, frozenset[str]] = field(default_factory=dict)
    unlisted_existing: tuple[str, ...] = ()
    unlisted_unprobed: tuple[str, ...] = ()


def expect(*deletions: tuple[str, CleanupReason, bool], **fields) -> Expected:
    return Expected(frozenset(deletions), **fields)


CLEANUP_CASES = [
    pytest.param(
        [FINISHED_PARENT, lease(1, READING, [0]), lease(2, SHARD_END, [0])],
        split_lineage(),
        True,
        {},
        expect(deleted(0, COMPLETED)),
        id="children-all-started-parent-deleted",
    ),
    pytest.param(
        [FINISHED_PARENT, lease(1, READING, [0])],
        split_lineage(),
        True,
        {},
        expect(),
        id="a-child-lease-not-created-yet-parent-stays",
    ),
    pytest.param(
        [FINISHED_PARENT, lease(1, READING, [0]), lease(2, TRIM_HORIZON, [0])],
        split_lineage(),
        True,
        {},
        expect(),
        id="a-child-still-at-trim-horizon-parent-stays",
    ),
    pytest.param(
        [FINISHED_PARENT, lease(1, READING, [0]), lease(2, AT_TIMESTAMP, [0])],
        split_lineage(),
        True,
        {},
        expect(),
        id="a-child-still-at-at-timestamp-parent-stays",
    ),
    pytest.param(
        [
            FINISHED_PARENT,
            lease(1, SHARD_END, [0], [3, 4]),
            lease(2, READING, [0]),
            lease(3, READING, [1]),
            lease(4, LATEST, [1]),
        ],
        split_lineage(),
        True,
        {},
        expect(deleted(0, COMPLETED)),
        id="own-parent-lease-present-waits-for-a-later-round",
    ),
    pytest.param(
        [UNRECORDED_PARENT, lease(1, READING, [0]), lease(2, TRIM_HORIZON, [0])],
        split_lineage(),
        True,
        {},
        expect(records={S(0): frozenset({S(1), S(2)})}),
        id="child-ids-learned-from-the-listing-are-recorded",
    ),
    pytest.param(
        [UNRECORDED_PARENT, lease(1, READING, [0]), lease(2, READING, [0])],
        split_lineage(),
        True,
        {},
        expect(deleted(0, COMPLETED)),
        id="child-ids-learned-from-the-listing-complete-the-parent",
    ),
    pytest.param(
        [lease(0, READING), lease(1, TRIM_HORIZON, [0])],
        split_lineage(),
        True,
        {},
        expect(),
        id="a-lease-still-reading-stays",
    ),
    pytest.param(
        [FINISHED_PARENT, lease(1, READING, [0]), lease(2, READING, [0])],
        split_lineage(),
        False,
        {},
        expect(),
        id="completed-cleanup-disabled",
    ),
    pytest.param(
        [lease(0, READING), lease(1, TRIM_HORIZON, [0])],
        listing_without(0),
        True,
        {},
        expect(unlisted_unprobed=(S(0),)),
        id="unlisted-and-not-asked-about-stays",
    ),
    pytest.param(
        [lease(0, READING), lease(1, TRIM_HORIZON, [0])],
        listing_without(0),
        True,
        {S(0): True},
        expect(unlisted_existing=(S(0),)),
        id="unlisted-but-kinesis-knows-the-shard-stays",
    ),
    pytest.param(
        [lease(0, READING), lease(1, TRIM_HORIZON, [0])],
        listing_without(0),
        True,
        {S(0): False},
        expect(deleted(0, GONE, unread=True)),
        id="shard-gone-before-shard-end-deleted-as-possibly-unread",
    ),
    pytest.param(
        [lease(0, SHARD_END), lease(1, TRIM_HORIZON, [0])],
        listing_without(0),
        True,
        {S(0): False},
        expect(deleted(0, GONE)),
        id="shard-gone-at-shard-end-deleted-without-loss",
    ),
    pytest.param(
        [lease(0, READING), lease(1, TRIM_HORIZON, [0])],
        listing_without(0),
        False,
        {S(0): False},
        expect(deleted(0, GONE, unread=True)),
        id="shard-gone-deleted-even-with-completed-cleanup-disabled",
    ),
    pytest.param(
        [UNRECORDED_PARENT],
        listing_without(1, 2, 3, 4),
        True,
        {S(1): False},
        expect(),
        id="shard-end-without-known-children-stays",
    ),
    pytest.param(
        [lease(0, SHARD_END, children=[1, 2]), lease(1, READING, [0]), lease(2, READING, [0])],
        listing_without(0),
        True,
        {},
        expect(deleted(0, COMPLETED)),
        id="unlisted-but-completed-is-deleted-as-completed",
    ),
    pytest.param(
        [FINISHED_PARENT, lease(1, READING, [0]), lease(2, READING, [0]), lease(9, READING), lease(5, SHARD_END)],
        None,
        True,
        {},
        expect(deleted(0, COMPLETED)),
        id="no-full-listing-only-recorded-children-decide",
    ),
    pytest.param(
        [lease(9, READING)],
        [],
        True,
        {},
        expect(),
        id="an-empty-listing-names-no-unlisted-lease",
    ),
    pytest.param(
        [
            FINISHED_PARENT.replace(unreported_losses={AgedOutRange("5")}),
            lease(1, READING, [0]),
            lease(2, READING, [0]),
        ],
        split_lineage(),
        True,
        {},
        expect(),
        id="a-finished-lease-carrying-unreported-losses-stays",
    ),
    pytest.param(
        [lease(0, SHARD_END).replace(unreported_losses={AgedOutRange("5")}), lease(1, TRIM_HORIZON, [0])],
        listing_without(0),
        True,
        {S(0): False},
        expect(),
        id="a-gone-lease-carrying-unreported-losses-stays",
    ),
]


@pytest.mark.parametrize(("leases", "shards", "on_completion", "answers", "expected"), CLEANUP_CASES)
def test_cleanup_plan(leases, shards, on_completion, answers, expected):
    plan = plan_lease_cleanup(leases, shards, SINGLE, cleanup_on_completion=on_completion, shard_exists=answers)
    assert {(d.lease_key, d.reason, d.unread_records_possible) for d in plan.deletions} == expected.deletions
    assert {record.lease.lease_key: record.child_ids for record in plan.record_child_ids} == expected.records
    assert (plan.unlisted_existing, plan.unlisted_unprobed) == (expected.unlisted_existing, expected.unlisted_unprobed)


def test_a_planned_deletion_carries_the_lease_as_the_snapshot_saw_it():
    snapshot = lease(0, READING).replace(lease_counter=7)
    (deletion,) = plan_lease_cleanup([snapshot], listing_without(0), SINGLE, shard_exists={S(0): False}).deletions
    assert deletion.lease == snapshot


@pytest.mark.parametrize(
    ("leases", "shards", "expected"),
    [
        pytest.param([lease(0), lease(9)], split_lineage(), (S(9),), id="a-lease-whose-shard-is-not-listed"),
        pytest.param([lease(0), lease(1)], split_lineage(), (), id="every-shard-listed"),
        pytest.param([lease(9)], None, (), id="no-full-listing"),
        pytest.param([lease(9)], [], (), id="an-empty-listing-is-a-failed-one"),
    ],
)
def test_unlisted_leases_are_the_candidates_for_the_garbage_check(leases, shards, expected):
    assert tuple(item.lease_key for item in unlisted_leases(leases, shards, SINGLE)) == expected


def test_cleanup_ignores_the_leases_of_other_streams():
    orders = StreamIdentifier("123456789012", "orders", 1)
    clicks = StreamIdentifier("123456789012", "clicks", 1)
    scheme = LeaseKeyScheme(orders)
    foreign = Lease.for_stream(clicks, S(7))
    gone = Lease.for_stream(orders, S(8))
    plan = plan_lease_cleanup([foreign, gone], split_lineage(), scheme, shard_exists={S(7): False, S(8): False})
    assert plan.deletions == (LeaseDeletion(gone, CleanupReason.SHARD_GONE, True),)
    assert unlisted_leases([foreign, gone], split_lineage(), scheme) == (gone,)


def test_apply_cleanup_records_child_ids_deletes_leases_and_counts_them(caplog):
    parent = UNRECORDED_PARENT
    store = store_with(parent, lease(1), lease(2, TRIM_HORIZON), lease(5, SHARD_END), lease(6, READING))
    plan = CleanupPlan(
        deletions=(
            LeaseDeletion(stored(store, S(5)), CleanupReason.COMPLETED),
            LeaseDeletion(stored(store, S(6)), CleanupReason.SHARD_GONE, unread_records_possible=True),
        ),
        record_child_ids=(ChildIdsRecord(parent, frozenset({S(1), S(2)})),),
        unlisted_unprobed=(S(9),),
    )

    with caplog.at_level(logging.WARNING, logger="lease_core.lifecycle.lease_lifecycle"):
        outcome = apply_cleanup(store, plan)

    assert outcome == CleanupOutcome(
        child_ids_recorded=1,
        completed_deleted=1,
        garbage_deleted=1,
        possibly_unread=(S(6),),
        deleted=(S(5), S(6)),
        unlisted_unprobed=(S(9),),
    )
    assert stored(store, S(0)).child_shard_ids == {S(1), S(2)}
    assert store.get_lease(S(5)) is None and store.get_lease(S(6)) is None
    assert S(6) in caplog.text and "data loss" in caplog.text


def test_apply_cleanup_counts_a_lease_already_gone_as_deleted():
    # It may be this very delete whose answer was lost: a loss it stands for is reported, not missed.
    plan = CleanupPlan(
        (LeaseDeletion(lease(5, SHARD_END), CleanupReason.COMPLETED), LeaseDeletion(lease(6), GONE, True)),
        (ChildIdsRecord(lease(0), frozenset({S(1)})),),
    )
    assert apply_cleanup(InMemoryLeaseStore(), plan) == CleanupOutcome(
        completed_deleted=1, garbage_deleted=1, possibly_unread=(S(6),), deleted=(S(5), S(6))
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param(lambda store, key: store.renew_lease(stored(store, key)), GONE, id="renewed-after-the-snapshot"),
        pytest.param(
            lambda store, key: store.assign_lease(stored(store, key), "worker-1"),
            GONE,
            id="assigned-after-the-snapshot",
        ),
        pytest.param(
            lambda store, key: store.checkpoint(stored(store, key), READING), GONE, id="checkpointed-after-the-snapshot"
        ),
        pytest.param(
            lambda store, key: store.reset_checkpoint(stored(store, key), TRIM_HORIZON),
            COMPLETED,
            id="reset-from-shard-end-after-the-snapshot",
        ),
    ],
)
def test_a_lease_changed_after_the_snapshot_is_kept_and_reported_changed(change, reason):
    store = store_with(lease(6, SHARD_END if reason is COMPLETED else READING))
    plan = CleanupPlan((LeaseDeletion(stored(store, S(6)), reason, reason is GONE),))
    change(store, S(6))

    outcome = apply_cleanup(store, plan)

    assert outcome == CleanupOutcome(changed=(S(6),))
    assert store.get_lease(S(6)) is not None


def test_a_split_parent_is_cleaned_up_only_after_both_children_started():
    parent_shard, children = split_children()
    store = store_with(held(0).replace(hash_key_range=parent_shard.hash_key_range))
    shards = [parent_shard] + [Shard(c.shard_id, c.hash_key_range, "2000", S(0)) for c in children]

    def clean() -> CleanupOutcome:
        return apply_cleanup(store, plan_lease_cleanup(store.list_leases(), shards, SINGLE))

    create_child_leases(store, stored(store, S(0)), children, SINGLE)
    store.checkpoint(stored(store, S(0)), SHARD_END)
    assert parents_have_finished(store, stored(store, S(1)), SINGLE)
    assert clean().completed_deleted == 0, "children still at TRIM_HORIZON"
    for child in children:
        store.checkpoint(stored(store, child.shard_id), READING)
    assert clean().completed_deleted == 1
    assert sorted(item.lease_key for item in store.list_leases()) == [S(1), S(2)]


# --- retention losses carried until reported ---------------------------------------------------------


def test_forgetting_a_reports_losses_removes_them_lease_by_lease_and_skips_leases_gone_since():
    early, late, kept = AgedOutRange("5", "9"), AgedOutRange("30", None), AgedOutRange("50", "60")
    store = store_with(
        lease(0, READING).replace(unreported_losses={early, late}), lease(1, READING).replace(unreported_losses={kept})
    )
    written = forget_reported_losses(store, [(S(0), early), (S(0), late), (S(9), early)])
    assert written == (S(0),)
    assert (stored(store, S(0)).unreported_losses, stored(store, S(1)).unreported_losses) == (frozenset(), {kept})
