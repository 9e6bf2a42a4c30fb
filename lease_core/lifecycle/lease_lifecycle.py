"""A lease's life after shard sync created it: waiting for parents, creating children, cleanup.

docs/protocol.md §3.7 (a child is read only once its parents are finished), §3.8 (child leases are
created at a parent's SHARD_END) and §3.10 (finished leases, and leases whose shard Kinesis says is
gone, are deleted). The deciders (`blocking_parents`, `unlisted_leases`, `plan_lease_cleanup`) are
pure functions over a snapshot; the coordinators (`parents_have_finished`, `create_child_leases`,
`apply_cleanup`) read and write the lease store. Asking Kinesis about single shards is
`garbage_probe`'s part.

Parent and child ids stored on a lease are bare shard ids; every lookup turns them into lease keys
through the `LeaseKeyScheme`, which is what makes the same code right in multi-stream mode (§7).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from lease_core.errors import DependencyError, InvalidShardLineageError, LeaseLostError
from lease_core.model.lease import AgedOutRange, Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import TRIM_HORIZON, Sentinel
from lease_core.model.shards import ChildShard, Shard
from lease_core.store import lease_writes
from lease_core.store.lease_store import LeaseStore
from lease_core.store.lease_writes import MetaField

log = logging.getLogger(__name__)

# Look-and-create rounds before giving up on child leases that keep changing under the transaction.
CHILD_CREATION_ATTEMPTS = 3

# A child whose checkpoint is still one of these has not started reading (§3.10).
_NOT_STARTED = frozenset({Sentinel.TRIM_HORIZON, Sentinel.AT_TIMESTAMP})


# --- §3.7: reading a child before its parents finish ---------------------------------------------


def blocking_parents(lease: Lease, leases_by_key: Mapping[str, Lease], scheme: LeaseKeyScheme) -> frozenset[str]:
    """The lease keys of `lease`'s parents that still exist in the snapshot and are not at SHARD_END.

    A parent lease that no longer exists does not block: cleanup deletes a parent only after it
    finished, and a parent that was never leased (trimmed) has nothing left to read.
    """
    parent_keys = (scheme.lease_key(parent_id) for parent_id in lease.parent_shard_ids)
    return frozenset(key for key in parent_keys if key in leases_by_key and not leases_by_key[key].is_at_shard_end)


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
    """Create the leases of the children GetRecords named at `parent`'s SHARD_END, and record them.

    `parent` is the lease as its holder last wrote it. Merge (one child): the child must name
    exactly two parents (else `InvalidShardLineageError`), and either both parent leases exist or
    neither does. When exactly one exists, the other parent will get its lease from a shard sync;
    creating the child now would let it be read before that parent's records, so creation is
    deferred. KCL then drops the lease with probability 1/30 and otherwise backs off; in rounds the
    caller simply keeps the parent lease and retries next round.

    Each missing child lease starts at TRIM_HORIZON with the child's parents and hash range. They are
    created, and the child ids recorded on the parent, in one transaction fenced by the parent's
    holder (`lease_writes.create_children`): a holder that lost the parent meanwhile creates nothing
    and gets `LeaseLostError`. A child created by someone else between the look and the transaction
    makes it fail; it is then looked at again. Re-running creates nothing.
    """
    if not children:
        return ChildLeaseOutcome()
    if len(children) == 1:
        reason = _merge_deferral_reason(store, parent, children[0], scheme)
        if reason is not None:
            return ChildLeaseOutcome(deferred=True, reason=reason)
    leases = tuple(
        scheme.new_lease(child.shard_id, TRIM_HORIZON, child.parent_shard_ids, child.hash_key_range)
        for child in children
    )
    child_ids = frozenset(child.shard_id for child in children)
    for _ in range(CHILD_CREATION_ATTEMPTS):
        missing = tuple(lease for lease in leases if store.get_lease(lease.lease_key, consistent=True) is None)
        result = store.transact(lease_writes.create_children(parent, child_ids, missing))
        if result.applied:
            created = {lease.lease_key for lease in missing}
            return ChildLeaseOutcome(
                tuple(sorted(created)),
                tuple(sorted(lease.lease_key for lease in leases if lease.lease_key not in created)),
                child_ids_recorded=True,
            )
        for key, stored in result.conflicts:
            if key == parent.lease_key:
                raise LeaseLostError(parent.lease_key, _why_children_refused(parent, stored))
        log.info(
            "child leases of %s changed while they were created (%s); looking again",
            parent.lease_key,
            ", ".join(key for key, _ in result.conflicts) or "a concurrent transaction",
        )
    raise DependencyError(
        "dynamodb",
        "TransactWriteItems",
        f"the child leases of {parent.lease_key} kept changing during {CHILD_CREATION_ATTEMPTS} attempts "
        "to create them",
        CHILD_CREATION_ATTEMPTS,
    )


def _why_children_refused(parent: Lease, stored: Lease | None) -> str:
    if stored is None:
        return "its child leases were not created: the lease was deleted"
    return (
        f"its child leases were not created: the lease is now owned by {stored.lease_owner or '(none)'} at counter "
        f"{stored.lease_counter} (claim {stored.claim_token or 'none'}), not as this holder last wrote it "
        f"(counter {parent.lease_counter}, claim {parent.claim_token or 'none'})"
    )


def _merge_deferral_reason(store: LeaseStore, parent: Lease, child: ChildShard, scheme: LeaseKeyScheme) -> str | None:
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


# --- §3.10: lease cleanup -------------------------------------------------------------------------


class CleanupReason(str, enum.Enum):
    COMPLETED = "completed"
    SHARD_GONE = "shard no longer exists"


@dataclass(frozen=True)
class LeaseDeletion:
    """One lease to delete, as the snapshot that judged it saw it (the delete is conditional on it).

    unread_records_possible: Kinesis says the shard no longer exists and the lease never reached
    SHARD_END, so records may have aged out unread; the caller must report it as potential loss.
    """

    lease: Lease
    reason: CleanupReason
    unread_records_possible: bool = False

    @property
    def lease_key(self) -> str:
        return self.lease.lease_key


@dataclass(frozen=True)
class ChildIdsRecord:
    """Child ids learned from the shard listing, to be written on a lease that stays."""

    lease: Lease
    child_ids: frozenset[str]


@dataclass(frozen=True)
class CleanupPlan:
    """What to write, and the unlisted leases that stay (lease keys): their shard is missing from
    the listing, but Kinesis said it exists (`unlisted_existing`) or was not asked this pass
    (`unlisted_unprobed`)."""

    deletions: tuple[LeaseDeletion, ...] = ()
    record_child_ids: tuple[ChildIdsRecord, ...] = ()
    unlisted_existing: tuple[str, ...] = ()
    unlisted_unprobed: tuple[str, ...] = ()


def unlisted_leases(
    leases: Sequence[Lease], shards: Sequence[Shard] | None, scheme: LeaseKeyScheme
) -> tuple[Lease, ...]:
    """The stream's leases whose shard is missing from the full listing `shards`.

    Candidates for KCL's garbage check, never garbage by themselves: a listing can be partial or
    stale, and a lease deleted on its word is recreated by the next sync at the initial position,
    skipping whatever was left unread. None (no full listing) and an empty listing (a stream always
    has shards, so it is a failed listing) name no candidate.
    """
    if not shards:
        return ()
    listed = frozenset(shard.shard_id for shard in shards)
    return tuple(lease for lease in leases if scheme.owns(lease) and scheme.shard_id_of(lease) not in listed)


# Whether the committed batches a lease's record names may not be visible in the sink yet. The sink
# answers (`BatchSink.awaiting_visibility`); where no sink can be asked, every record may.
AwaitingVisibility = Callable[[Lease], bool]


def may_await_visibility(lease: Lease, awaiting_visibility: AwaitingVisibility | None) -> bool:
    """Whether deleting `lease` could lose the only record of committed batches readers cannot see yet."""
    if lease.committed_batch is None:
        return False
    return awaiting_visibility is None or awaiting_visibility(lease)


def plan_lease_cleanup(
    leases: Sequence[Lease],
    shards: Sequence[Shard] | None,
    scheme: LeaseKeyScheme,
    cleanup_on_completion: bool = True,
    shard_exists: Mapping[str, bool] | None = None,
    awaiting_visibility: AwaitingVisibility | None = None,
) -> CleanupPlan:
    """Which of the stream's leases to delete, from a snapshot of the leases, the shard listing and
    what Kinesis answered about single shards.

    A lease goes when it is provably finished or provably orphaned, never on a listing's word, never
    while it carries retention losses no kept round report has named yet, and never while its record
    names committed batches that may not be visible yet (`may_await_visibility`: a table sink makes a
    round's batches visible at the round's end, from the records on the leases):
    - completed (when `cleanup_on_completion`): at SHARD_END, every child lease exists and has
      started, and no parent lease is left. Child ids come from the lease, else from the listing;
    - shard gone: `shard_exists` (shard id -> Kinesis' answer, KCL's garbage check) says False,
      whatever the completion setting.
    `shards` is the stream's full current listing, or None when there is none (a new
    application's filtered listing); then completion is judged only from recorded child ids.
    Leases of other streams (multi-stream tables) are ignored: their shards are never in this
    listing.

    One level per pass, as in KCL: a finished lease whose parent is deleted in this pass is judged
    against the snapshot (parent still present) and goes in a later round.
    """
    answers = shard_exists or {}
    own = [lease for lease in leases if scheme.owns(lease)]
    by_key = {lease.lease_key: lease for lease in own}
    deletions: list[LeaseDeletion] = []
    records: list[ChildIdsRecord] = []
    for lease in own:
        shard_id = scheme.shard_id_of(lease)
        if lease.unreported_losses:  # kept until a kept round report names them (`forget_reported_losses`)
            continue
        if may_await_visibility(lease, awaiting_visibility):
            continue
        if answers.get(shard_id) is False:
            deletions.append(LeaseDeletion(lease, CleanupReason.SHARD_GONE, not lease.is_at_shard_end))
            continue
        if not (cleanup_on_completion and lease.is_at_shard_end):
            continue
        child_ids = lease.child_shard_ids or _listed_children(shard_id, shards or ())
        if child_ids and _has_completed(lease, child_ids, by_key, scheme):
            deletions.append(LeaseDeletion(lease, CleanupReason.COMPLETED))
        elif child_ids and not lease.child_shard_ids:
            # Recorded only on leases that stay: a lease deleted now has no use for them.
            records.append(ChildIdsRecord(lease, child_ids))
    deleted = {deletion.lease_key for deletion in deletions}
    staying = [lease for lease in unlisted_leases(own, shards, scheme) if lease.lease_key not in deleted]
    return CleanupPlan(
        tuple(deletions),
        tuple(records),
        unlisted_existing=tuple(lease.lease_key for lease in staying if answers.get(scheme.shard_id_of(lease)) is True),
        unlisted_unprobed=tuple(lease.lease_key for lease in staying if scheme.shard_id_of(lease) not in answers),
    )


def _listed_children(shard_id: str, shards: Iterable[Shard]) -> frozenset[str]:
    return frozenset(shard.shard_id for shard in shards if shard_id in shard.parent_shard_ids)


def _has_completed(
    lease: Lease, child_ids: frozenset[str], by_key: Mapping[str, Lease], scheme: LeaseKeyScheme
) -> bool:
    """§3.10: every child lease exists and has started reading, and no parent lease of `lease` is left."""
    children = [by_key.get(scheme.lease_key(child_id)) for child_id in child_ids]
    children_started = all(child is not None and child.checkpoint.sentinel not in _NOT_STARTED for child in children)
    parents_gone = not any(scheme.lease_key(parent_id) in by_key for parent_id in lease.parent_shard_ids)
    return children_started and parents_gone


@dataclass(frozen=True)
class CleanupOutcome:
    """What `apply_cleanup` wrote, by lease key.

    possibly_unread: deleted leases whose records may be lost. changed: planned deletions not made
    because the lease changed after the snapshot (judged again next round). unlisted_existing /
    unlisted_unprobed: as in `CleanupPlan`.
    """

    child_ids_recorded: int = 0
    completed_deleted: int = 0
    garbage_deleted: int = 0
    possibly_unread: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unlisted_existing: tuple[str, ...] = ()
    unlisted_unprobed: tuple[str, ...] = ()


def apply_cleanup(store: LeaseStore, plan: CleanupPlan) -> CleanupOutcome:
    """Write the learned child ids, then delete the planned leases, each only if it is unchanged
    since the snapshot (`LeaseStore.delete_lease_if_unchanged`).

    A lease already gone counts as deleted: it may be this very delete whose answer was lost, and a
    loss it stands for must be reported rather than missed.
    """
    recorded = sum(
        store.update_lease_meta(record.lease.with_child_shard_ids(record.child_ids), MetaField.CHILD_SHARDS)
        for record in plan.record_child_ids
    )
    deleted: list[LeaseDeletion] = []
    changed: list[str] = []
    for deletion in plan.deletions:
        result = store.delete_lease_if_unchanged(deletion.lease)
        if result.lost_to_a_change:
            log.info(
                "lease %s changed since cleanup judged it (%s); it is judged again next round",
                deletion.lease_key,
                deletion.reason.value,
            )
            changed.append(deletion.lease_key)
            continue
        deleted.append(deletion)
        if deletion.unread_records_possible:
            log.warning(
                "deleted lease %s: Kinesis says its shard no longer exists and the lease never reached "
                "SHARD_END, so records may have expired unread (potential data loss)",
                deletion.lease_key,
            )
    reasons = [deletion.reason for deletion in deleted]
    return CleanupOutcome(
        child_ids_recorded=recorded,
        completed_deleted=reasons.count(CleanupReason.COMPLETED),
        garbage_deleted=reasons.count(CleanupReason.SHARD_GONE),
        possibly_unread=tuple(deletion.lease_key for deletion in deleted if deletion.unread_records_possible),
        deleted=tuple(deletion.lease_key for deletion in deleted),
        changed=tuple(changed),
        unlisted_existing=plan.unlisted_existing,
        unlisted_unprobed=plan.unlisted_unprobed,
    )


def forget_reported_losses(store: LeaseStore, reported: Iterable[tuple[str, AgedOutRange]]) -> tuple[str, ...]:
    """Once a round report naming `reported` (lease key, range) is kept, remove those ranges from
    their leases; the keys of the leases written. A lease gone meanwhile has nothing left to forget.

    Until then a range stays on its lease, so a report lost with its driver is made again by the
    next round's (the report is then repeated, never missing); a range added since the report was
    made stays for the next one.
    """
    by_lease: dict[str, set[AgedOutRange]] = {}
    for lease_key, aged_out in reported:
        by_lease.setdefault(lease_key, set()).add(aged_out)
    return tuple(
        key for key, ranges in sorted(by_lease.items()) if store.forget_reported_losses(key, frozenset(ranges))
    )
