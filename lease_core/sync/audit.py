"""The lease-recovery auditor: whether the leases still being read leave a hash-range hole.

KCL's PeriodicShardSyncManager (docs/protocol.md §3.9) checks every two minutes whether the leases
still being read cover the whole hash key space, and asks for a shard sync only after it has seen
the same hole a number of times in a row. In rounds, every round runs a full shard sync, and the
leader audits the table that sync left, once per round: a hole it confirms is one the sync cannot
close, reported in the sync step's result. The hole and its count live in the coordinator-state
table so that they survive from one round to the next.

`find_hash_range_hole`, `fill_missing_hash_ranges` and `decide_audit` are pure; `AuditorState` and
`ShardSyncAuditor` do the I/O.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lease_core.model.lease import MAX_HASH_KEY, HashKeyRange, Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.shards import Shard
from lease_core.store.coordinator_state import CoordinatorStateStore, decide_and_record
from lease_core.store.lease_store import LeaseStore
from lease_core.store.lease_writes import MetaField
from lease_core.store.record_table import Record, text, whole_number

log = logging.getLogger(__name__)

RECORD_KEY_PREFIX = "ShardSyncAuditor:"
HOLE = "hole"
CONSECUTIVE_HOLES = "consecutiveHoles"
UPDATED_AT = "updatedAt"


@dataclass(frozen=True)
class HashRangeHole:
    """Where the leases fail to cover the hash key space, as the two ranges around the gap.

    Both None: no lease with a hash range is being read. For a missing start or end, `before` is
    the first and `after` the last range in sort order (as KCL reports it); for a gap in the
    middle, `before` is the merged run of ranges that ends just below the gap and `after` the range
    that starts just above it. `str()` is stable and is what rounds compare.
    """

    before: HashKeyRange | None = None
    after: HashKeyRange | None = None

    def __str__(self) -> str:
        if self.before is None or self.after is None:
            return "no hash ranges"
        return f"{_describe(self.before)} .. {_describe(self.after)}"


def _describe(hash_range: HashKeyRange) -> str:
    return f"[{hash_range.starting_hash_key}, {hash_range.ending_hash_key}]"


def _sort_key(hash_range: HashKeyRange) -> tuple[int, int]:
    return hash_range.starting_hash_key, hash_range.ending_hash_key


def find_hash_range_hole(leases: Sequence[Lease]) -> HashRangeHole | None:
    """The first hole in the hash ranges of the leases still being read, or None when they cover all.

    Leases at SHARD_END and leases without a range are ignored (fill ranges first with
    `fill_missing_hash_ranges`). Overlapping ranges are merged.
    """
    ranges = sorted(
        (lease.hash_key_range for lease in leases if lease.hash_key_range and not lease.is_at_shard_end),
        key=_sort_key,
    )
    if not ranges:
        return HashRangeHole()
    # [quirk] KCL checks the end of the LAST range in sort order, not the largest end, so a
    # full-width lease sorted before a shorter one still reports a hole. Kept for compatibility:
    # the only effect is a harmless extra shard sync.
    if ranges[0].starting_hash_key != 0 or ranges[-1].ending_hash_key != MAX_HASH_KEY:
        return HashRangeHole(ranges[0], ranges[-1])
    running = ranges[0]
    for next_range in ranges[1:]:
        if next_range.starting_hash_key > running.ending_hash_key + 1:
            return HashRangeHole(running, next_range)
        if next_range.ending_hash_key > running.ending_hash_key:
            running = HashKeyRange(running.starting_hash_key, next_range.ending_hash_key)
    return None


def fill_missing_hash_ranges(
    leases: Sequence[Lease], shards: Sequence[Shard], scheme: LeaseKeyScheme
) -> tuple[tuple[Lease, ...], tuple[Lease, ...]]:
    """(leases for the audit, leases whose range was just filled and should be persisted).

    Leases written by very old KCL versions lack a hash range; they take it from their shard. A
    lease whose shard is not listed has no range to take and is left out of the audit.
    """
    by_id = {shard.shard_id: shard for shard in shards}
    audited: list[Lease] = []
    filled: list[Lease] = []
    for lease in leases:
        if lease.hash_key_range is None:
            shard = by_id.get(scheme.shard_id_of(lease))
            if shard is None:
                continue
            lease = lease.replace(hash_key_range=shard.hash_key_range)
            filled.append(lease)
        audited.append(lease)
    return tuple(audited), tuple(filled)


# --- decisions across rounds ---------------------------------------------------------------------


@dataclass(frozen=True)
class AuditorRecord:
    """What the auditor remembers about one stream between rounds."""

    hole: str | None
    consecutive_holes: int
    updated_at_millis: int

    def to_item(self) -> Record:
        item: Record = {CONSECUTIVE_HOLES: self.consecutive_holes, UPDATED_AT: self.updated_at_millis}
        if self.hole is not None:
            item[HOLE] = self.hole
        return item

    @classmethod
    def from_item(cls, item: Record) -> AuditorRecord:
        return cls(
            hole=text(item, HOLE) or None,
            consecutive_holes=whole_number(item, CONSECUTIVE_HOLES),
            updated_at_millis=whole_number(item, UPDATED_AT),
        )


class AuditReason(str, enum.Enum):
    NO_LEASES = "no leases"
    NO_HOLE = "no hole"
    HOLE_UNCONFIRMED = "hole seen fewer times than the threshold"
    HOLE_CONFIRMED = "hole seen as many times as the threshold"


@dataclass(frozen=True)
class AuditDecision:
    """The outcome of one audit.

    consecutive_holes counts the audits in a row, this one included, that saw `hole`. After a
    triggered sync the persisted count starts again from 0 (`next_record`), so a hole the sync did
    not close needs another `threshold` rounds before the next sync.
    """

    shard_sync: bool
    reason: AuditReason
    hole: str | None = None
    consecutive_holes: int = 0

    def next_record(self, updated_at_millis: int) -> AuditorRecord:
        count = 0 if self.shard_sync else self.consecutive_holes
        return AuditorRecord(self.hole, count, updated_at_millis)


def decide_audit(
    previous: AuditorRecord | None, hole: HashRangeHole | None, threshold: int, lease_count: int
) -> AuditDecision:
    """§3.9 across rounds: a sync when the stream has no leases, or when the same hole has been seen
    `threshold` audits in a row (KCL's leases_recovery_auditor_inconsistency_confidence_threshold)."""
    if threshold < 1:
        raise ValueError(f"the auditor threshold must be >= 1, got {threshold}")
    if lease_count == 0:
        return AuditDecision(True, AuditReason.NO_LEASES)
    if hole is None:
        return AuditDecision(False, AuditReason.NO_HOLE)
    described = str(hole)
    count = previous.consecutive_holes + 1 if previous is not None and previous.hole == described else 1
    if count >= threshold:
        return AuditDecision(True, AuditReason.HOLE_CONFIRMED, described, count)
    return AuditDecision(False, AuditReason.HOLE_UNCONFIRMED, described, count)


# --- I/O -----------------------------------------------------------------------------------------


class AuditorState:
    """The auditor's per-stream records in the coordinator-state table (`ShardSyncAuditor:<stream>`)."""

    def __init__(self, state_store: CoordinatorStateStore) -> None:
        self.state_store = state_store

    @staticmethod
    def record_key(stream_key: str) -> str:
        return RECORD_KEY_PREFIX + stream_key

    def decide(
        self, stream_key: str, hole: HashRangeHole | None, threshold: int, lease_count: int, now_millis: int
    ) -> AuditDecision:
        """`decide_audit` against the stored record, storing the next record conditional on the one
        read (`decide_and_record`): a concurrent audit's count is never overwritten, only added to."""

        def decide(item: Record | None) -> tuple[AuditDecision, Record]:
            previous = None if item is None else AuditorRecord.from_item(item)
            decision = decide_audit(previous, hole, threshold, lease_count)
            return decision, decision.next_record(now_millis).to_item()

        return decide_and_record(self.state_store, self.record_key(stream_key), decide)


class ShardSyncAuditor:
    """Audits one stream's leases per round and says whether a full shard sync is needed."""

    def __init__(
        self, lease_store: LeaseStore, state_store: CoordinatorStateStore, clock_millis: Callable[[], int]
    ) -> None:
        self.lease_store = lease_store
        self.state = AuditorState(state_store)
        self.clock_millis = clock_millis

    def audit(
        self,
        stream_key: str,
        scheme: LeaseKeyScheme,
        shards_provider: Callable[[], list[Shard]],
        threshold: int,
        snapshot: Sequence[Lease] | None = None,
    ) -> AuditDecision:
        """`stream_key` is the stream name (single-stream) or the serialized stream identifier.

        The shard listing is fetched only if some lease being read lacks a hash range. `snapshot`:
        the lease table as the round's sync step just left it (None: scan it here).
        """
        every = self.lease_store.list_leases() if snapshot is None else snapshot
        leases = [lease for lease in every if scheme.owns(lease)]
        hole = self._find_hole(leases, scheme, shards_provider) if leases else None
        decision = self.state.decide(stream_key, hole, threshold, len(leases), self.clock_millis())
        if decision.hole is not None:
            log.info(
                "stream %s: hash-range hole %s seen %d time(s) in a row (threshold %d)",
                stream_key,
                decision.hole,
                decision.consecutive_holes,
                threshold,
            )
        return decision

    def _find_hole(
        self, leases: list[Lease], scheme: LeaseKeyScheme, shards_provider: Callable[[], list[Shard]]
    ) -> HashRangeHole | None:
        active = [lease for lease in leases if not lease.is_at_shard_end]
        if any(lease.hash_key_range is None for lease in active):
            active_with_ranges, filled = fill_missing_hash_ranges(active, shards_provider(), scheme)
            for lease in filled:
                self.lease_store.update_lease_meta(lease, MetaField.HASH_KEY_RANGE)
            active = list(active_with_ranges)
        return find_hash_range_hole(active)
