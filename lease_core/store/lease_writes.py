"""The conditional writes of the KCL lease protocol, as data (docs/protocol.md §2.1-2.3).

Each function turns the caller's local copy of a lease into a `LeaseUpdate` (the conditions that
must hold on the stored item and the SET / REMOVE / ADD actions to apply) or a `LeaseDelete` (the
conditions alone). These functions are the one place where the protocol's semantics live; the
DynamoDB store renders them as UpdateItem / DeleteItem calls and the in-memory store applies them
to a dict, so both behave identically.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from lease_core.model.lease import AgedOutRange, Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.store import codec
from lease_core.store.codec import AttributeValue


@dataclass(frozen=True)
class AttributeEquals:
    name: str
    value: AttributeValue


@dataclass(frozen=True)
class AttributeExists:
    name: str


@dataclass(frozen=True)
class AttributeAbsent:
    name: str


@dataclass(frozen=True)
class AttributeAbsentOrEquals:
    name: str
    value: AttributeValue


Condition = AttributeEquals | AttributeExists | AttributeAbsent | AttributeAbsentOrEquals
# Every lease update and delete holds only on a lease: in KCL 3.5's single-table layout the lease table
# also holds worker metrics and coordinator state (docs/protocol.md §1.6), which a write under the same
# `leaseKey` must never change. KCL tags leases `LEASE` or not at all.
IS_LEASE = AttributeAbsentOrEquals(codec.ENTITY_TYPE, codec.string_value(codec.LEASE_ENTITY_TYPE))


def guarded(conditions: tuple[Condition, ...]) -> tuple[Condition, ...]:
    """`conditions` and `IS_LEASE`: what a store checks for a lease update or delete."""
    return (*conditions, IS_LEASE)


@dataclass(frozen=True)
class LeaseUpdate:
    """A conditional UpdateItem on one lease item."""

    lease_key: str
    conditions: tuple[Condition, ...]
    set_attributes: tuple[tuple[str, AttributeValue], ...] = ()
    remove_attributes: tuple[str, ...] = ()
    add_numbers: tuple[tuple[str, int], ...] = ()
    add_to_sets: tuple[tuple[str, AttributeValue], ...] = ()  # set union; the set is created if absent
    delete_from_sets: tuple[tuple[str, AttributeValue], ...] = ()  # set difference; an emptied set is removed


@dataclass(frozen=True)
class LeaseCreate:
    """A whole new lease item, put only where no item has its key (`createLeaseIfNotExists`)."""

    lease: Lease


@dataclass(frozen=True)
class LeaseTransaction:
    """Writes applied all together or not at all (one TransactWriteItems)."""

    updates: tuple[LeaseUpdate, ...] = ()
    creates: tuple[LeaseCreate, ...] = ()

    @property
    def lease_keys(self) -> tuple[str, ...]:
        return tuple(u.lease_key for u in self.updates) + tuple(c.lease.lease_key for c in self.creates)


@dataclass(frozen=True)
class LeaseDelete:
    """A conditional DeleteItem of one lease item."""

    lease_key: str
    conditions: tuple[Condition, ...]


class MetaField(enum.Enum):
    """What `updateLeaseWithMetaInfo` may write without a counter check."""

    CHILD_SHARDS = "childShardIds"
    HASH_KEY_RANGE = "hashKeyRange"


def _counter_is(lease: Lease) -> AttributeEquals:
    return AttributeEquals(codec.LEASE_COUNTER, codec.number_value(lease.lease_counter))


def _holder_conditions(lease: Lease) -> tuple[Condition, ...]:
    """What a holder's write requires: the counter it last saw and, once claimed, its own claim token.

    The counter alone fences every other writer (each of their writes moves it); the token also tells
    two attempts of one slot apart, which share an owner name (`HeldLease`).
    """
    if lease.claim_token is None:
        return (_counter_is(lease),)
    return _counter_is(lease), AttributeEquals(codec.CLAIM_TOKEN, codec.string_value(lease.claim_token))


def _next_counter(lease: Lease) -> tuple[str, AttributeValue]:
    return codec.LEASE_COUNTER, codec.number_value(lease.lease_counter + 1)


def _field_is(name: str, value: str | None) -> Condition:
    return AttributeAbsent(name) if value is None else AttributeEquals(name, codec.string_value(value))


def _owner_switch_increment(lease: Lease, new_owner: str) -> tuple[tuple[str, int], ...]:
    """§2.3: +1 when the owner really changes, or when a lease goes back to its checkpoint owner."""
    switches = (lease.lease_owner is not None and lease.lease_owner != new_owner) or (
        lease.checkpoint_owner is not None and lease.checkpoint_owner == new_owner
    )
    return ((codec.OWNER_SWITCHES, 1),) if switches else ()


def renew(lease: Lease) -> LeaseUpdate:
    """Heartbeat: counter-conditional +1, carrying throughput (and, ours, the data time the
    throughput was measured through) when the holder has a value.

    Unless the holder already knows of a graceful handoff, the renew also requires that none is in
    progress, which is how the old owner learns about one (§2.4).
    """
    conditions = _holder_conditions(lease)
    if lease.checkpoint_owner is None:
        conditions += (AttributeAbsent(codec.CHECKPOINT_OWNER),)
    sets = [_next_counter(lease)]
    removes: tuple[str, ...] = ()
    if lease.throughput_kbps is not None:
        sets.append((codec.THROUGHPUT_KBPS, codec.throughput_value(lease.throughput_kbps)))
    if lease.read_through_millis is not None:
        sets.append((codec.READ_THROUGH_MILLIS, codec.number_value(lease.read_through_millis)))
    # The measurement a claim stood in for goes with the value it stands behind: written with a
    # stand-in, removed by a renewal carrying a measurement of its own.
    if lease.measured_before_claim is not None:
        sets.append((codec.MEASURED_BEFORE_CLAIM, codec.string_value(lease.measured_before_claim.encode())))
    elif lease.throughput_kbps is not None:
        removes = (codec.MEASURED_BEFORE_CLAIM,)
    return LeaseUpdate(lease.lease_key, conditions, tuple(sets), remove_attributes=removes)


def claim(lease: Lease, token: str) -> LeaseUpdate:
    """A slot attempt's first renewal (§2.4), which also stores the attempt's `token`.

    Conditional on the counter (and on no handoff) as read, not on any earlier token: the claim
    fences whatever attempt held the lease before, and every later write of this attempt requires
    `token` (`_holder_conditions`).
    """
    renewal = renew(lease.replace(claim_token=None))
    sets = (*renewal.set_attributes, (codec.CLAIM_TOKEN, codec.string_value(token)))
    # The pin as `Lease.pinned_at_latest` leaves it: written at LATEST, removed otherwise. At the
    # counter read, the stored pin is the one the caller read: every pin write moves the counter.
    removes = renewal.remove_attributes
    if lease.latest_since is not None and lease.latest_start_millis is not None:
        sets += ((codec.LATEST_START_MILLIS, codec.number_value(lease.latest_start_millis)),)
    elif lease.latest_start_millis is None:
        removes += (codec.LATEST_START_MILLIS,)
    return dataclasses.replace(renewal, set_attributes=sets, remove_attributes=removes)


def take(lease: Lease, new_owner: str) -> LeaseUpdate:
    """The 2.x taker: counter-conditional change of owner that also cancels any handoff."""
    return LeaseUpdate(
        lease.lease_key,
        (_counter_is(lease),),
        (_next_counter(lease), (codec.LEASE_OWNER, codec.string_value(new_owner))),
        remove_attributes=(codec.CHECKPOINT_OWNER,),
        add_numbers=_owner_switch_increment(lease, new_owner),
    )


def evict(lease: Lease) -> LeaseUpdate:
    """Drop the owner (or, during a handoff, only the checkpoint owner); fences the holder by ADD 1."""
    removes: tuple[str, ...] = (codec.CHECKPOINT_OWNER,)
    if lease.checkpoint_owner is None:
        removes = (codec.LEASE_OWNER, codec.CHECKPOINT_OWNER)
    return LeaseUpdate(
        lease.lease_key,
        (
            _field_is(codec.LEASE_OWNER, lease.lease_owner),
            _field_is(codec.CHECKPOINT_OWNER, lease.checkpoint_owner),
            AttributeExists(codec.LEASE_KEY),
        ),
        remove_attributes=removes,
        add_numbers=((codec.LEASE_COUNTER, 1),),
    )


def update(lease: Lease, losses: frozenset[AgedOutRange] = frozenset()) -> LeaseUpdate:
    """Checkpoint or prepare: counter-conditional rewrite of the checkpoint fields of `lease` (§2.1).

    `losses`: retention losses met by the read this write moves past, added to the lease's unreported
    ones (set ADD: whatever a report step removed meanwhile is not written back).
    """
    sets = dict(codec.checkpoint_attributes(lease))
    sets[codec.OWNER_SWITCHES] = codec.number_value(lease.owner_switches_since_checkpoint)
    sets.update(codec.pending_checkpoint_attributes(lease))
    removes = [
        name
        for name in (
            codec.PENDING_CHECKPOINT,
            codec.PENDING_CHECKPOINT_SUB_SEQUENCE,
            codec.PENDING_CHECKPOINT_STATE,
        )
        if name not in sets
    ]
    if lease.child_shard_ids:
        sets[codec.CHILD_SHARD_IDS] = codec.string_set_value(lease.child_shard_ids)
    if lease.committed_batch is not None:
        sets[codec.COMMITTED_BATCH] = codec.string_value(lease.committed_batch)
    else:
        removes.append(codec.COMMITTED_BATCH)
    if lease.latest_since is not None and lease.latest_start_millis is not None:
        sets[codec.LATEST_START_MILLIS] = codec.number_value(lease.latest_start_millis)
    else:  # a checkpoint off LATEST, or a reset to a LATEST the next claim pins
        removes.append(codec.LATEST_START_MILLIS)
    sets.update(codec.hash_key_range_attributes(lease))
    sets.update(codec.multi_stream_attributes(lease))
    name, value = _next_counter(lease)
    sets[name] = value
    added = ((codec.UNREPORTED_LOSSES, codec.aged_out_ranges_value(losses)),) if losses else ()
    return LeaseUpdate(
        lease.lease_key, _holder_conditions(lease), tuple(sets.items()), tuple(removes), add_to_sets=added
    )


def forget_reported_losses(lease_key: str, losses: frozenset[AgedOutRange]) -> LeaseUpdate:
    """Remove `losses` from a lease's unreported ones once a kept round report names them.

    Exactly these (set DELETE), whoever holds the lease, without moving the counter: a loss a holder
    adds meanwhile stays for the next report, and no holder's write depends on this attribute.
    """
    if not losses:
        raise ValueError(f"lease {lease_key!r}: no reported losses to forget")
    return LeaseUpdate(
        lease_key,
        (AttributeExists(codec.LEASE_KEY),),
        delete_from_sets=((codec.UNREPORTED_LOSSES, codec.aged_out_ranges_value(losses)),),
    )


def reset_checkpoint(lease: Lease, value: ExtendedSequenceNumber) -> LeaseUpdate:
    """An operator's reset (`leasectl reset`): `update` of `lease` to checkpoint `value`, counter + 2.

    As a checkpoint: the pending fields and any LATEST pin are removed (a reset to LATEST means the
    newest record when the next round claims the lease) and owner switches zeroed; owner and handoff are
    untouched; conditional on the counter read, in any direction. The counter moves by 2, not 1,
    because a holder whose write fails takes a stored counter of exactly its own + 1 with its owner for
    its own renewal whose response was lost (docs/protocol.md §2.4), and would keep the lease; + 2 fences it.
    """
    checkpointed = lease.replace(
        checkpoint=value,
        pending_checkpoint=None,
        pending_checkpoint_state=None,
        owner_switches_since_checkpoint=0,
        latest_start_millis=None,
    )
    written = update(checkpointed)
    fenced = codec.LEASE_COUNTER, codec.number_value(lease.lease_counter + 2)
    sets = tuple(fenced if action[0] == codec.LEASE_COUNTER else action for action in written.set_attributes)
    return dataclasses.replace(written, set_attributes=sets)


def repair(item: codec.Item, repaired: Lease) -> LeaseUpdate:
    """An operator's repair (`leasectl repair`) of an unreadable item: `repaired` written over it.

    Conditional on the item existing and on every attribute of it as it was read (it cannot be read
    as a lease, so its counter cannot fence on its own); sets every attribute of `repaired` and
    removes the item's other lease attributes. Attributes the codec does not know (another tool's)
    are left as they are.
    """
    written = codec.lease_to_item(repaired)
    unchanged = tuple(AttributeEquals(name, value) for name, value in item.items() if name != codec.LEASE_KEY)
    return LeaseUpdate(
        lease_key=repaired.lease_key,
        conditions=(AttributeExists(codec.LEASE_KEY), *unchanged),
        set_attributes=tuple((name, value) for name, value in written.items() if name != codec.LEASE_KEY),
        remove_attributes=tuple(name for name in item if name not in written and name in codec.LEASE_ATTRIBUTES),
    )


def assign(lease: Lease, new_owner: str) -> LeaseUpdate:
    """The 3.x leader's assignment: owner-conditional (no counter check), fences by ADD 1."""
    return LeaseUpdate(
        lease.lease_key,
        (
            _field_is(codec.LEASE_OWNER, lease.lease_owner),
            _field_is(codec.CHECKPOINT_OWNER, lease.checkpoint_owner),
            AttributeExists(codec.LEASE_KEY),
        ),
        ((codec.LEASE_OWNER, codec.string_value(new_owner)),),
        remove_attributes=(codec.CHECKPOINT_OWNER,),
        add_numbers=((codec.LEASE_COUNTER, 1), *_owner_switch_increment(lease, new_owner)),
    )


def initiate_graceful_handoff(lease: Lease, new_owner: str) -> LeaseUpdate:
    """Record `new_owner` as owner while the current owner stays checkpoint owner; counter unchanged."""
    if lease.lease_owner is None:
        raise ValueError(f"lease {lease.lease_key!r} has no owner to hand off from")
    if lease.checkpoint_owner is not None:
        raise ValueError(f"lease {lease.lease_key!r} is already in a handoff to {lease.lease_owner!r}")
    return LeaseUpdate(
        lease.lease_key,
        (
            AttributeEquals(codec.LEASE_OWNER, codec.string_value(lease.lease_owner)),
            AttributeAbsent(codec.CHECKPOINT_OWNER),
            AttributeExists(codec.LEASE_KEY),
        ),
        (
            (codec.LEASE_OWNER, codec.string_value(new_owner)),
            (codec.CHECKPOINT_OWNER, codec.string_value(lease.lease_owner)),
        ),
    )


def update_meta(lease: Lease, field: MetaField) -> LeaseUpdate:
    """Child shard ids or the hash range, on any existing item, without touching the counter."""
    if field is MetaField.CHILD_SHARDS:
        if not lease.child_shard_ids:
            raise ValueError(f"lease {lease.lease_key!r} has no child shard ids to write")
        sets: tuple[tuple[str, dict[str, Any]], ...] = (
            (codec.CHILD_SHARD_IDS, codec.string_set_value(lease.child_shard_ids)),
        )
    else:
        attributes = codec.hash_key_range_attributes(lease)
        if not attributes:
            raise ValueError(f"lease {lease.lease_key!r} has no hash key range to write")
        sets = tuple(attributes.items())
    return LeaseUpdate(lease.lease_key, (AttributeExists(codec.LEASE_KEY),), sets)


def create_children(parent: Lease, child_shard_ids: frozenset[str], creates: tuple[Lease, ...]) -> LeaseTransaction:
    """Child leases created at `parent`'s SHARD_END (§3.8), fenced by the parent's holder.

    One transaction: `child_shard_ids` are recorded on the parent, conditional on the parent's owner,
    counter and claim token as its holder last wrote them, and each lease of `creates` is created
    where no lease has its key. A holder fenced since then (the lease was taken, reset or ended by
    someone else, and maybe cleaned up with some of its children) creates nothing, so it can never
    re-create a child that was read and deleted. The parent's counter is unchanged, as with KCL's
    child-id write (`update_meta`).
    """
    if parent.lease_owner is None:
        raise ValueError(f"lease {parent.lease_key!r} has no owner: only its holder creates its children")
    if not child_shard_ids:
        raise ValueError(f"lease {parent.lease_key!r}: a shard end without children creates no child leases")
    recorded = parent.with_child_shard_ids(child_shard_ids).child_shard_ids
    conditions = (
        *_holder_conditions(parent),
        AttributeEquals(codec.LEASE_OWNER, codec.string_value(parent.lease_owner)),
    )
    return LeaseTransaction(
        updates=(
            LeaseUpdate(parent.lease_key, conditions, ((codec.CHILD_SHARD_IDS, codec.string_set_value(recorded)),)),
        ),
        creates=tuple(LeaseCreate(child) for child in creates),
    )


def delete_if_unchanged(lease: Lease) -> LeaseDelete:
    """Cleanup's delete (§3.10): only while the stored lease is the one the cleanup judged.

    KCL deletes by key alone; here the judgement is made on a snapshot, so the delete is conditional
    on the snapshot's counter, which every renew, take, assign, evict, checkpoint and reset moves:
    a lease worked on since the snapshot is judged again next round instead of deleted. A lease judged
    finished must also still be at SHARD_END, which holds even against a writer that changed the
    checkpoint without moving the counter. A lease still carrying retention losses that no kept round
    report named is kept until one has (`forget_reported_losses`).
    """
    conditions: tuple[Condition, ...] = (_counter_is(lease), AttributeAbsent(codec.UNREPORTED_LOSSES))
    if lease.is_at_shard_end:
        conditions += (AttributeEquals(codec.CHECKPOINT, codec.string_value(lease.checkpoint.sequence_number)),)
    return LeaseDelete(lease.lease_key, conditions)
