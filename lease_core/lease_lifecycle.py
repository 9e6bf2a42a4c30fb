"""A lease's life after shard sync created it: waiting for parents, creating children, cleanup.

kcl-spec.md §3.7 (a child is read only once its parents are finished), §3.8 (child leases are
created at a parent's SHARD_END) and §8.3 (finished and orphaned leases are deleted). The deciders
(`blocking_parents`, `plan_lease_cleanup`) are pure functions over a snapshot; the coordinators
(`parents_have_finished`, `create_child_leases`, `apply_cleanup`) read and write the lease store.

Parent and child ids stored on a lease are bare shard ids; every lookup turns them into lease keys
through the `LeaseKeyScheme`, which is what makes the same code right in multi-stream mode (§9).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lease_core.errors import InvalidShardLineageError
from lease_core.lease import Lease
from lease_core.lease_store import LeaseStore
from lease_core.lease_writes import MetaField
from lease_core.sequence import TRIM_HORIZON, Sentinel
from lease_core.shard_sync import LeaseKeyScheme
from lease_core.shards import ChildShard, Shard

log = logging.getLogger(__name__)

# A child whose checkpoint is still one of these has not started reading (§8.3).
_NOT_STARTED = frozenset({Sentinel.TRIM_HORIZON, Sentinel.AT_TIMESTAMP})


# --- §3.7: reading a child before its parents finish ---------------------------------------------


def blocking_parents(lease: Lease, leases_by_key: Mapping[str, Lease], scheme: LeaseKeyScheme) -> frozenset[str]:
    """The lease keys of `lease`'s parents that still exist in the snapshot and are not at SHARD_END.

    A parent lease that no longer exists does not block: cleanup deletes a parent only after it
    finished, and a parent that was never leased (trimmed) has nothing left to read.
    """
    parent_keys = (scheme.lease_key(parent_id) for parent_id in lease.parent_shard_ids)
    return frozenset(
        key for key in parent_keys if key in leases_by_key and not leases_by_key[key].is_at_shard_end
    )


def parents_have_finished(store: LeaseStore, lease: Lease, scheme: LeaseKeyScheme) -> bool:
    """Whether every parent lease of `lease` is at SHARD_END or gone (read from the store now)."""
    parents: dict[str, Lease] = {}
    for parent_id in lease.parent_shard_ids:
        key = scheme.lease_key(parent_id)
        # Strongly consistent: an eventually consistent read could miss a parent lease created
        # moments ago and let the child be read before its parent.
        parent = store.get_lease(key, consistent=True)
        if parent is not None:
            parents[key] = parent
    return not blocking_parents(lease, parents, scheme)


# --- §3.8: child lease creation at SHARD_END -----------------------------------------------------


@dataclass(frozen=True)
class ChildLeaseOutcome:
    """What `create_child_leases` did. Keys are lease keys.

    deferred: nothing was written because a merge's other parent has no lease yet; the caller keeps
    the parent lease un-ended and retries in a later round. child_ids_recorded: the child ids were
    written on the parent lease (False when deferred, when there were no children, or when the
    parent lease was deleted meanwhile).
    """

    created: tuple[str, ...] = ()
    existing: tuple[str, ...] = ()
    deferred: bool = False
    reason: str | None = None
    child_ids_recorded: bool = False


def create_child_leases(
    store: LeaseStore, parent: Lease, children: Sequence[ChildShard], scheme: LeaseKeyScheme
) -> ChildLeaseOutcome:
    """Create the leases of the children GetRecords named at `parent`'s SHARD_END, then record them.

    Merge (one child): the child must name exactly two parents (else `InvalidShardLineageError`),
    and either both parent leases exist or neither does. When exactly one exists, the other parent
    will get its lease from a shard sync; creating the child now would let it be read before that
    parent's records, so creation is deferred. KCL then drops the lease with probability 1/30 and
    otherwise backs off; in rounds the caller simply keeps the parent lease and retries next round.

    Each child lease starts at TRIM_HORIZON with the child's parents and hash range; losing a create
    race to another writer is fine, the lease then counts as existing. Re-running creates nothing.
    """
    if len(children) == 1:
        reason = _merge_deferral_reason(store, parent, children[0], scheme)
        if reason is not None:
            return ChildLeaseOutcome(deferred=True, reason=reason)
    created: list[str] = []
    existing: list[str] = []
    for child in children:
        lease = scheme.new_lease(child.shard_id, TRIM_HORIZON, child.parent_shard_ids, child.hash_key_range)
        (created if store.create_lease_if_not_exists(lease) else existing).append(lease.lease_key)
    recorded = bool(children) and store.update_lease_meta(
        parent.with_child_shard_ids({child.shard_id for child in children}), MetaField.CHILD_SHARDS
    )
    return ChildLeaseOutcome(tuple(created), tuple(existing), child_ids_recorded=recorded)


def _merge_deferral_reason(
    store: LeaseStore, parent: Lease, child: ChildShard, scheme: LeaseKeyScheme
) -> str | None:
    """Why a merge's child cannot be created yet, or None when it can."""
    if len(child.parent_shard_ids) != 2:
        raise InvalidShardLineageError(
            parent.lease_key,
            f"the single (merged) child {child.shard_id} names {len(child.parent_shard_ids)} parent(s) "
            f"{sorted(child.parent_shard_ids)}, a merge needs exactly two",
        )
    missing = sorted(
        parent_id
        for parent_id in child.parent_shard_ids
        if store.get_lease(scheme.lease_key(parent_id), consistent=True) is None
    )
    if len(missing) != 1:
        return None
    return f"merged child {child.shard_id} waits for a lease of its other parent {missing[0]}"


# --- §8.3: lease cleanup -------------------------------------------------------------------------


class CleanupReason(str, enum.Enum):
    COMPLETED = "completed"
    SHARD_GONE = "shard no longer exists"


@dataclass(frozen=True)
class LeaseDeletion:
    """One lease to delete. unread_records_possible: the shard vanished before its lease reached
    SHARD_END, so records may have aged out unread; the caller must report it as potential loss."""

    lease_key: str
    reason: CleanupReason
    unread_records_possible: bool = False


@dataclass(frozen=True)
class ChildIdsRecord:
    """Child ids learned from the shard listing, to be written on a lease that stays."""

    lease: Lease
    child_ids: frozenset[str]


@dataclass(frozen=True)
class CleanupPlan:
    deletions: tuple[LeaseDeletion, ...] = ()
    record_child_ids: tuple[ChildIdsRecord, ...] = ()


def plan_lease_cleanup(
    leases: Sequence[Lease],
    shards: Sequence[Shard] | None,
    scheme: LeaseKeyScheme,
    cleanup_on_completion: bool = True,
) -> CleanupPlan:
    """Which of the stream's leases to delete, from a snapshot of the leases and the shard listing.

    `shards` is the stream's full current listing, or None when it could not be listed (an empty
    listing counts as none); then no lease is judged garbage, and completion is judged only from
    the child ids recorded on the leases.
    Leases of other streams (multi-stream tables) are ignored: their shards are never in this
    listing and would otherwise look like garbage.

    One level per pass, as in KCL: a finished lease whose parent is deleted in this pass is judged
    against the snapshot (parent still present) and goes in a later round.
    """
    own = [lease for lease in leases if scheme.owns(lease)]
    by_key = {lease.lease_key: lease for lease in own}
    # A stream always has shards, so an empty listing is a failed one; trusting it would delete
    # every lease of the stream.
    listed = frozenset(shard.shard_id for shard in shards) if shards else None
    deletions: list[LeaseDeletion] = []
    records: list[ChildIdsRecord] = []
    for lease in own:
        shard_id = scheme.shard_id_of(lease)
        if listed is not None and shard_id not in listed:
            deletions.append(LeaseDeletion(lease.lease_key, CleanupReason.SHARD_GONE, not lease.is_at_shard_end))
            continue
        if not (cleanup_on_completion and lease.is_at_shard_end):
            continue
        child_ids = lease.child_shard_ids or _listed_children(shard_id, shards or ())
        if child_ids and _has_completed(lease, child_ids, by_key, scheme):
            deletions.append(LeaseDeletion(lease.lease_key, CleanupReason.COMPLETED))
        elif child_ids and not lease.child_shard_ids:
            # Recorded only on leases that stay: a lease deleted now has no use for them.
            records.append(ChildIdsRecord(lease, child_ids))
    return CleanupPlan(tuple(deletions), tuple(records))


def _listed_children(shard_id: str, shards: Iterable[Shard]) -> frozenset[str]:
    return frozenset(shard.shard_id for shard in shards if shard_id in shard.parent_shard_ids)


def _has_completed(
    lease: Lease, child_ids: frozenset[str], by_key: Mapping[str, Lease], scheme: LeaseKeyScheme
) -> bool:
    """§8.3: every child lease exists and has started reading, and no parent lease of `lease` is left."""
    children = [by_key.get(scheme.lease_key(child_id)) for child_id in child_ids]
    children_started = all(
        child is not None and child.checkpoint.sentinel not in _NOT_STARTED for child in children
    )
    parents_gone = not any(scheme.lease_key(parent_id) in by_key for parent_id in lease.parent_shard_ids)
    return children_started and parents_gone


@dataclass(frozen=True)
class CleanupOutcome:
    """What `apply_cleanup` wrote. possibly_unread: deleted leases whose records may be lost."""

    child_ids_recorded: int = 0
    completed_deleted: int = 0
    garbage_deleted: int = 0
    possibly_unread: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()


def apply_cleanup(store: LeaseStore, plan: CleanupPlan) -> CleanupOutcome:
    """Write the learned child ids, then delete the planned leases (unconditionally by key, as KCL).

    Deleting is safe against the snapshot ageing: children only move forward, parent leases only
    disappear, and a shard missing from the listing never comes back.
    """
    recorded = sum(
        store.update_lease_meta(record.lease.with_child_shard_ids(record.child_ids), MetaField.CHILD_SHARDS)
        for record in plan.record_child_ids
    )
    for deletion in plan.deletions:
        store.delete_lease(deletion.lease_key)
        if deletion.unread_records_possible:
            log.warning(
                "deleted lease %s: its shard no longer exists and it never reached SHARD_END, "
                "so records may have expired unread (potential data loss)",
                deletion.lease_key,
            )
    reasons = [deletion.reason for deletion in plan.deletions]
    return CleanupOutcome(
        child_ids_recorded=recorded,
        completed_deleted=reasons.count(CleanupReason.COMPLETED),
        garbage_deleted=reasons.count(CleanupReason.SHARD_GONE),
        possibly_unread=tuple(d.lease_key for d in plan.deletions if d.unread_records_possible),
        deleted=tuple(deletion.lease_key for deletion in plan.deletions),
    )
