"""The lease-recovery auditor: hash-range holes, and a shard sync once a hole persists (docs/protocol.md §3.9)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtools.shard_lineage import LineageBuilder, shard_id
from lease_core.model.lease import MAX_HASH_KEY, HashKeyRange, Lease, StreamIdentifier
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import SHARD_END, ExtendedSequenceNumber
from lease_core.model.shards import Shard
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore, update_record
from lease_core.store.memory_store import InMemoryLeaseStore
from lease_core.sync.audit import (
    AuditDecision,
    AuditorRecord,
    AuditReason,
    HashRangeHole,
    ShardSyncAuditor,
    decide_audit,
    fill_missing_hash_ranges,
    find_hash_range_hole,
)
from tests.support.stores import InterleavingStateStore

S = shard_id
R = HashKeyRange
MAX = MAX_HASH_KEY
QUARTER = (MAX + 1) // 4
READING = ExtendedSequenceNumber("1500")
SINGLE = LeaseKeyScheme()


def leases_over(*ranges: HashKeyRange | None, checkpoint: ExtendedSequenceNumber = READING) -> list[Lease]:
    return [Lease(S(n), checkpoint=checkpoint, hash_key_range=r) for n, r in enumerate(ranges)]


def quarters() -> list[HashKeyRange]:
    return [R(i * QUARTER, (i + 1) * QUARTER - 1) for i in range(4)]


Q0, Q1, Q2, Q3 = quarters()


# --- finding holes -------------------------------------------------------------------------------

HOLE_CASES = [
    pytest.param([], HashRangeHole(), id="no-leases-is-a-hole"),
    pytest.param(leases_over(R(0, MAX)), None, id="one-lease-covers-everything"),
    pytest.param(leases_over(Q0, Q1, Q2, Q3), None, id="four-quarters-cover-everything"),
    pytest.param(leases_over(Q3, Q1, Q0, Q2), None, id="input-order-does-not-matter"),
    pytest.param(leases_over(Q0, Q1, Q3), HashRangeHole(R(0, 2 * QUARTER - 1), Q3), id="gap-in-the-middle"),
    pytest.param(leases_over(Q1, Q2, Q3), HashRangeHole(Q1, Q3), id="missing-start"),
    pytest.param(leases_over(Q0, Q1, Q2), HashRangeHole(Q0, Q2), id="missing-end"),
    pytest.param(leases_over(R(0, 100), R(50, 200), R(150, 180), R(201, MAX)), None, id="overlapping-ranges-merged"),
    pytest.param(
        leases_over(R(0, 100), R(50, 200), R(300, MAX)),
        HashRangeHole(R(0, 200), R(300, MAX)),
        id="hole-after-merged-overlap-names-the-merged-run",
    ),
    pytest.param(
        [*leases_over(Q0, Q1, Q3), Lease(S(9), checkpoint=SHARD_END, hash_key_range=Q2)],
        HashRangeHole(R(0, 2 * QUARTER - 1), Q3),
        id="shard-end-leases-do-not-cover",
    ),
    pytest.param(leases_over(R(0, MAX), checkpoint=SHARD_END), HashRangeHole(), id="only-shard-end-leases-is-a-hole"),
    pytest.param(leases_over(Q0, None, Q2, Q3), HashRangeHole(Q0, Q2), id="leases-without-range-are-ignored"),
    # KCL checks the end of the last range in sort order, not the largest end.
    pytest.param(leases_over(R(0, MAX), R(5, 10)), HashRangeHole(R(0, MAX), R(5, 10)), id="last-in-sort-order-quirk"),
]


@pytest.mark.parametrize(("leases", "expected"), HOLE_CASES)
def test_find_hash_range_hole(leases, expected):
    assert find_hash_range_hole(leases) == expected


def partition(cuts: list[int]) -> list[HashKeyRange]:
    bounds = [0, *sorted(cuts), MAX + 1]
    return [R(start, end - 1) for start, end in itertools.pairwise(bounds)]


# Even cut points keep every range at least two keys wide, as a range needs start < end.
CUTS = st.lists(st.integers(min_value=1, max_value=(MAX - 1) // 2).map(lambda k: 2 * k), unique=True, max_size=20)


@given(CUTS, st.randoms())
def test_any_shuffled_partition_of_the_hash_space_has_no_hole(cuts, rng):
    leases = leases_over(*partition(cuts))
    rng.shuffle(leases)
    assert find_hash_range_hole(leases) is None


@given(CUTS.filter(lambda cuts: len(cuts) >= 2), st.data())
def test_dropping_an_inner_range_of_a_partition_leaves_exactly_that_hole(cuts, data):
    ranges = partition(cuts)
    dropped = data.draw(st.integers(min_value=1, max_value=len(ranges) - 2))
    hole = find_hash_range_hole(leases_over(*ranges[:dropped], *ranges[dropped + 1 :]))
    assert hole == HashRangeHole(R(0, ranges[dropped - 1].ending_hash_key), ranges[dropped + 1])


def test_hole_strings_are_stable_and_distinguish_holes():
    assert str(HashRangeHole()) == "no hash ranges"
    assert str(HashRangeHole(R(0, 9), R(20, 30))) == "[0, 9] .. [20, 30]"
    assert str(HashRangeHole(R(0, 9), R(20, 30))) == str(HashRangeHole(R(0, 9), R(20, 30)))
    assert str(HashRangeHole(R(0, 9), R(20, 30))) != str(HashRangeHole(R(0, 9), R(21, 30)))


# --- filling missing ranges ----------------------------------------------------------------------


def test_leases_without_a_range_take_it_from_their_shard_and_are_persisted():
    shards = LineageBuilder(2).shards()
    ranged = Lease(S(0), hash_key_range=shards[0].hash_key_range)
    bare = Lease(S(1))
    audited, to_persist = fill_missing_hash_ranges([ranged, bare], shards, SINGLE)
    assert audited == (ranged, bare.replace(hash_key_range=shards[1].hash_key_range))
    assert to_persist == (bare.replace(hash_key_range=shards[1].hash_key_range),)


def test_a_lease_whose_shard_is_not_listed_is_dropped_from_the_audit():
    audited, to_persist = fill_missing_hash_ranges([Lease(S(7))], LineageBuilder(2).shards(), SINGLE)
    assert (audited, to_persist) == ((), ())


def test_multi_stream_leases_find_their_shard_by_shard_id():
    stream = StreamIdentifier("123456789012", "orders", 1)
    shards = LineageBuilder(1).shards()
    audited, _ = fill_missing_hash_ranges([Lease.for_stream(stream, S(0))], shards, LeaseKeyScheme(stream))
    assert audited[0].hash_key_range == R(0, MAX)


# --- deciding across rounds ----------------------------------------------------------------------

HOLE = HashRangeHole(Q0, Q2)
OTHER_HOLE = HashRangeHole(Q1, Q3)


def seen(hole: HashRangeHole | None, times: int) -> AuditorRecord:
    return AuditorRecord(None if hole is None else str(hole), times, 0)


@pytest.mark.parametrize(
    ("previous", "hole", "threshold", "lease_count", "expected"),
    [
        pytest.param(seen(HOLE, 1), None, 3, 0, AuditDecision(True, AuditReason.NO_LEASES), id="no-leases-syncs-now"),
        pytest.param(None, None, 3, 4, AuditDecision(False, AuditReason.NO_HOLE), id="no-hole-no-sync"),
        pytest.param(seen(HOLE, 2), None, 3, 4, AuditDecision(False, AuditReason.NO_HOLE), id="closed-hole-resets"),
        pytest.param(
            None, HOLE, 3, 3, AuditDecision(False, AuditReason.HOLE_UNCONFIRMED, str(HOLE), 1), id="first-sighting"
        ),
        pytest.param(
            seen(HOLE, 1),
            HOLE,
            3,
            3,
            AuditDecision(False, AuditReason.HOLE_UNCONFIRMED, str(HOLE), 2),
            id="second-sighting",
        ),
        pytest.param(
            seen(HOLE, 2),
            HOLE,
            3,
            3,
            AuditDecision(True, AuditReason.HOLE_CONFIRMED, str(HOLE), 3),
            id="third-sighting-syncs",
        ),
        pytest.param(
            seen(OTHER_HOLE, 2),
            HOLE,
            3,
            3,
            AuditDecision(False, AuditReason.HOLE_UNCONFIRMED, str(HOLE), 1),
            id="different-hole-restarts",
        ),
        pytest.param(
            seen(HOLE, 0),
            HOLE,
            3,
            3,
            AuditDecision(False, AuditReason.HOLE_UNCONFIRMED, str(HOLE), 1),
            id="after-a-sync-counting-restarts",
        ),
        pytest.param(
            None,
            HOLE,
            1,
            3,
            AuditDecision(True, AuditReason.HOLE_CONFIRMED, str(HOLE), 1),
            id="threshold-one-syncs-at-once",
        ),
    ],
)
def test_decide_audit(previous, hole, threshold, lease_count, expected):
    assert decide_audit(previous, hole, threshold, lease_count) == expected


@pytest.mark.parametrize(
    ("decision", "expected"),
    [
        pytest.param(
            AuditDecision(False, AuditReason.HOLE_UNCONFIRMED, "h", 2), AuditorRecord("h", 2, 7), id="keeps-count"
        ),
        pytest.param(
            AuditDecision(True, AuditReason.HOLE_CONFIRMED, "h", 3), AuditorRecord("h", 0, 7), id="sync-resets-count"
        ),
        pytest.param(AuditDecision(False, AuditReason.NO_HOLE), AuditorRecord(None, 0, 7), id="no-hole-forgets"),
        pytest.param(AuditDecision(True, AuditReason.NO_LEASES), AuditorRecord(None, 0, 7), id="no-leases-forgets"),
    ],
)
def test_the_record_kept_for_the_next_round(decision, expected):
    assert decision.next_record(7) == expected


def test_a_threshold_below_one_is_refused():
    with pytest.raises(ValueError, match="threshold"):
        decide_audit(None, HOLE, 0, 3)


@pytest.mark.parametrize(
    ("record", "item"),
    [
        pytest.param(
            AuditorRecord("h", 2, 1700000000123),
            {"hole": "h", "consecutiveHoles": 2, "updatedAt": 1700000000123},
            id="with-hole",
        ),
        pytest.param(
            AuditorRecord(None, 0, 5),
            {"consecutiveHoles": 0, "updatedAt": 5},
            id="hole-absent-when-none",
        ),
    ],
)
def test_auditor_records_as_coordinator_state_items(record, item):
    assert record.to_item() == item
    assert AuditorRecord.from_item(item) == record


# --- the coordinator -----------------------------------------------------------------------------


class FakeClock:
    def __init__(self, millis: int = 1_700_000_000_000) -> None:
        self.millis = millis

    def __call__(self) -> int:
        self.millis += 120_000
        return self.millis


def no_listing() -> list[Shard]:
    raise AssertionError("the auditor listed shards although every lease has a hash range")


def auditor_over(*leases: Lease) -> tuple[ShardSyncAuditor, InMemoryLeaseStore, InMemoryCoordinatorStateStore]:
    store = InMemoryLeaseStore()
    for lease in leases:
        store.create_lease_if_not_exists(lease)
    state = InMemoryCoordinatorStateStore()
    return ShardSyncAuditor(store, state, FakeClock()), store, state


def test_three_consecutive_identical_holes_trigger_a_sync_on_the_third_audit():
    auditor, _, state = auditor_over(*leases_over(Q0, Q1, Q3))

    decisions = [auditor.audit("orders", SINGLE, no_listing, threshold=3) for _ in range(3)]

    assert [(d.shard_sync, d.consecutive_holes) for d in decisions] == [(False, 1), (False, 2), (True, 3)]
    record = state.get("ShardSyncAuditor:orders")
    assert record.pop("version"), "written with update_record, conditional on the version it read"
    record.pop("recentVersions")
    assert record == {
        "key": "ShardSyncAuditor:orders",
        "hole": str(HashRangeHole(R(0, 2 * QUARTER - 1), Q3)),
        "consecutiveHoles": 0,
        "updatedAt": 1_700_000_000_000 + 3 * 120_000,
    }


def test_a_changed_hole_restarts_the_count():
    auditor, store, _ = auditor_over(*leases_over(Q0, Q1, Q3))
    auditor.audit("orders", SINGLE, no_listing, threshold=3)
    auditor.audit("orders", SINGLE, no_listing, threshold=3)
    store.delete_lease(S(1))

    decision = auditor.audit("orders", SINGLE, no_listing, threshold=3)

    assert (decision.shard_sync, decision.consecutive_holes, decision.hole) == (False, 1, str(HashRangeHole(Q0, Q3)))


def test_a_closed_hole_resets_the_record():
    auditor, store, state = auditor_over(*leases_over(Q0, Q1, Q3))
    auditor.audit("orders", SINGLE, no_listing, threshold=3)
    store.create_lease_if_not_exists(Lease(S(8), checkpoint=READING, hash_key_range=Q2))

    decision = auditor.audit("orders", SINGLE, no_listing, threshold=3)

    assert decision == AuditDecision(False, AuditReason.NO_HOLE)
    assert "hole" not in state.get("ShardSyncAuditor:orders")


def test_a_stream_without_leases_is_synced_at_once():
    auditor, _, _ = auditor_over()
    assert auditor.audit("orders", SINGLE, no_listing, threshold=3) == AuditDecision(True, AuditReason.NO_LEASES)


def test_missing_ranges_are_filled_from_one_listing_and_persisted():
    shards = LineageBuilder(4).shards()
    calls: list[int] = []

    def listing() -> list[Shard]:
        calls.append(1)
        return shards

    auditor, store, _ = auditor_over(*(Lease(shard.shard_id, checkpoint=READING) for shard in shards))

    assert auditor.audit("orders", SINGLE, listing, threshold=3) == AuditDecision(False, AuditReason.NO_HOLE)
    assert len(calls) == 1
    assert [lease.hash_key_range for lease in sorted(store.list_leases(), key=lambda lease: lease.lease_key)] == [
        shard.hash_key_range for shard in shards
    ]


def test_ranges_of_shard_end_leases_are_never_filled():
    auditor, store, _ = auditor_over(*leases_over(R(0, MAX)), Lease(S(5), checkpoint=SHARD_END))
    assert auditor.audit("orders", SINGLE, no_listing, threshold=3).reason is AuditReason.NO_HOLE
    assert store.get_lease(S(5)).hash_key_range is None


def test_each_stream_is_audited_on_its_own_leases_and_record():
    orders = StreamIdentifier("123456789012", "orders", 1)
    clicks = StreamIdentifier("123456789012", "clicks", 1)
    auditor, _, state = auditor_over(
        Lease.for_stream(orders, S(0), checkpoint=READING, hash_key_range=R(0, MAX)),
        Lease.for_stream(clicks, S(0), checkpoint=READING, hash_key_range=Q0),
    )

    assert not auditor.audit(orders.serialize(), LeaseKeyScheme(orders), no_listing, threshold=1).shard_sync
    assert auditor.audit(clicks.serialize(), LeaseKeyScheme(clicks), no_listing, threshold=1).shard_sync
    assert state.get(f"ShardSyncAuditor:{orders.serialize()}")["consecutiveHoles"] == 0


def test_an_audit_racing_another_counts_on_from_the_record_the_other_wrote():
    leases = leases_over(Q0, Q1, Q3)
    hole = str(HashRangeHole(R(0, 2 * QUARTER - 1), Q3))

    def other_audit(state) -> None:  # lands between this audit's read and its write
        update_record(state, "ShardSyncAuditor:orders", lambda record: AuditorRecord(hole, 1, 0).to_item())

    store = InMemoryLeaseStore()
    for lease in leases:
        store.create_lease_if_not_exists(lease)
    state = InterleavingStateStore("ShardSyncAuditor:orders", other_audit)

    decision = ShardSyncAuditor(store, state, FakeClock()).audit("orders", SINGLE, no_listing, threshold=3)

    assert (decision.shard_sync, decision.consecutive_holes) == (False, 2)
    assert state.get("ShardSyncAuditor:orders")["consecutiveHoles"] == 2
