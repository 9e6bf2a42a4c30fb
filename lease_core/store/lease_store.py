"""The lease store: the KCL lease refresher's operations over a table of lease items.

`LeaseStore` is the seam the rest of the project programs against. `ConditionalLeaseStore`
implements every operation once, in terms of a few item-level primitives, from the write
definitions of `lease_writes`; the in-memory and DynamoDB stores only provide the primitives.

A lost condition is an ordinary outcome (`WriteResult.applied` is False), never an exception.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from lease_core.errors import CorruptLeaseError
from lease_core.model.lease import AgedOutRange, Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.store import codec, lease_writes
from lease_core.store.codec import Item
from lease_core.store.lease_writes import LeaseDelete, LeaseTransaction, LeaseUpdate, MetaField

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteResult:
    """The outcome of a conditional write.

    applied: the stored lease after the write (None after a delete). Not applied: the stored lease
    that failed the condition, or None when no such item exists (so a caller can tell "taken" from
    "deleted").
    """

    applied: bool
    lease: Lease | None
    # The request was sent again after an attempt whose outcome is unknown (a dropped connection, a
    # timeout, a 5xx): a lost condition may then be lost against this very write.
    retried: bool = False

    @property
    def lost_to_a_change(self) -> bool:
        """Not applied because the stored lease is not the caller's copy (rather than gone)."""
        return not self.applied and self.lease is not None


@dataclass(frozen=True)
class ItemWrite:
    """What a conditional item primitive did: applied or not, the item after (or the one that failed
    the condition, or None when there is none), and whether the request was sent again after an
    attempt whose outcome is unknown."""

    applied: bool
    item: Item | None
    retried: bool = False


@dataclass(frozen=True)
class RepairResult:
    """What a repair of an unreadable lease item did (`LeaseStore.repair_lease`).

    `problem`: why the item could not be read (None when it could: nothing was written, a readable
    lease is reset, not repaired). `write`: the conditional write (None when nothing was written).
    `dropped`: the item's attributes that did not read and are gone.
    """

    problem: CorruptLeaseError | None
    write: WriteResult | None = None
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class TransactionResult:
    """A transaction's outcome. Not applied: `conflicts` names each lease key whose condition failed,
    with the stored lease (None when absent); empty when it was cancelled for another reason (a
    concurrent transaction on one of its items), which is worth trying again."""

    applied: bool
    conflicts: tuple[tuple[str, Lease | None], ...] = ()


@dataclass(frozen=True)
class LeaseScan:
    """Every lease in the table, plus the items that could not be read as leases."""

    leases: tuple[Lease, ...]
    corrupt: tuple[CorruptLeaseError, ...] = ()


class LeaseStore(Protocol):
    """The lease table operations of docs/protocol.md §2.1, §1.5 and §2.5-2.6."""

    table_name: str

    def create_lease_if_not_exists(self, lease: Lease) -> bool: ...
    def get_lease(self, lease_key: str, consistent: bool | None = None) -> Lease | None: ...
    def scan_leases(self) -> LeaseScan: ...
    def list_leases(self) -> list[Lease]: ...
    def list_lease_keys_for_owner(self, owner: str) -> list[str]: ...
    def list_leases_for_owner(self, owner: str) -> list[Lease]: ...
    def get_leases(self, lease_keys: Iterable[str]) -> list[Lease]: ...
    def is_lease_table_empty(self) -> bool: ...
    def renew_lease(self, lease: Lease) -> WriteResult: ...
    def claim_lease(self, lease: Lease, token: str) -> WriteResult: ...
    def take_lease(self, lease: Lease, new_owner: str) -> WriteResult: ...
    def evict_lease(self, lease: Lease) -> WriteResult: ...
    def update_lease(self, lease: Lease, losses: frozenset[AgedOutRange] = frozenset()) -> WriteResult: ...
    def checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult: ...
    def prepare_checkpoint(
        self, lease: Lease, value: ExtendedSequenceNumber, state: bytes | None = None
    ) -> WriteResult: ...
    def assign_lease(self, lease: Lease, new_owner: str) -> WriteResult: ...
    def initiate_graceful_handoff(self, lease: Lease, new_owner: str) -> WriteResult: ...
    def reset_checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult: ...
    def update_lease_meta(self, lease: Lease, field: MetaField) -> bool: ...
    def forget_reported_losses(self, lease_key: str, losses: frozenset[AgedOutRange]) -> bool: ...
    def repair_lease(self, lease_key: str, checkpoint: ExtendedSequenceNumber | None) -> RepairResult | None: ...
    def delete_lease(self, lease_key: str) -> None: ...
    def delete_lease_if_unchanged(self, lease: Lease) -> WriteResult: ...
    def transact(self, transaction: LeaseTransaction) -> TransactionResult: ...


class ConditionalLeaseStore(abc.ABC):
    """Every `LeaseStore` operation, built on conditional item primitives."""

    table_name: str

    # --- primitives -------------------------------------------------------------------------

    @abc.abstractmethod
    def _put_item_if_absent(self, item: Item) -> bool:
        """Put `item` unless an item with its leaseKey exists; False when one does."""

    @abc.abstractmethod
    def _get_item(self, lease_key: str, consistent: bool) -> Item | None: ...

    @abc.abstractmethod
    def _scan_items(self) -> Iterator[Item]: ...

    @abc.abstractmethod
    def _query_owner_keys(self, owner: str) -> Iterator[str]: ...

    @abc.abstractmethod
    def _get_items(self, lease_keys: list[str]) -> Iterator[Item]:
        """The items of the given keys that exist, in any order."""

    @abc.abstractmethod
    def _update_item(self, update: LeaseUpdate) -> ItemWrite:
        """Apply `update`: applied with the item after, or not with the item that failed the condition."""

    @abc.abstractmethod
    def _delete_item_if(self, delete: LeaseDelete) -> ItemWrite:
        """Apply `delete`: applied (no item), or not with the item that failed the condition."""

    @abc.abstractmethod
    def _transact_items(self, transaction: LeaseTransaction) -> tuple[bool, dict[str, Item | None]]:
        """Apply every write of `transaction` or none: (True, {}) or (False, {key: stored item} for each
        write whose condition failed; empty when cancelled for another reason)."""

    default_consistent_reads: bool = False

    # --- reads ------------------------------------------------------------------------------

    def create_lease_if_not_exists(self, lease: Lease) -> bool:
        return self._put_item_if_absent(codec.lease_to_item(lease))

    def get_lease(self, lease_key: str, consistent: bool | None = None) -> Lease | None:
        consistent = self.default_consistent_reads if consistent is None else consistent
        item = self._get_item(lease_key, consistent)
        if item is None or not codec.is_lease_item(item):
            return None
        return codec.lease_from_item(item)

    def scan_leases(self) -> LeaseScan:
        leases, corrupt = _decode_all(self._scan_items())
        return LeaseScan(tuple(leases), tuple(corrupt))

    def list_leases(self) -> list[Lease]:
        scan = self.scan_leases()
        for error in scan.corrupt:
            log.warning("skipping an unreadable lease-table item: %s", error)
        return list(scan.leases)

    def list_lease_keys_for_owner(self, owner: str) -> list[str]:
        return sorted(self._query_owner_keys(owner))

    def list_leases_for_owner(self, owner: str) -> list[Lease]:
        """The leases the owner index lists for `owner`, re-read and re-checked (the index lags)."""
        leases, corrupt = _decode_all(self._get_items(self.list_lease_keys_for_owner(owner)))
        for error in corrupt:
            log.warning("skipping an unreadable lease-table item: %s", error)
        return sorted((lease for lease in leases if lease.lease_owner == owner), key=lambda lease: lease.lease_key)

    def get_leases(self, lease_keys: Iterable[str]) -> list[Lease]:
        """The leases among `lease_keys` that exist, by key, read in batches (not a scan)."""
        leases, corrupt = _decode_all(self._get_items(sorted(set(lease_keys))))
        for error in corrupt:
            log.warning("skipping an unreadable lease-table item: %s", error)
        return sorted(leases, key=lambda lease: lease.lease_key)

    def is_lease_table_empty(self) -> bool:
        return not any(codec.is_lease_item(item) for item in self._scan_items())

    # --- conditional writes -----------------------------------------------------------------

    def _write(self, update: LeaseUpdate) -> WriteResult:
        return _result(self._update_item(update))

    def renew_lease(self, lease: Lease) -> WriteResult:
        return self._write(lease_writes.renew(lease))

    def claim_lease(self, lease: Lease, token: str) -> WriteResult:
        """A holder's first renewal, storing its claim token (`lease_writes.claim`)."""
        return self._write(lease_writes.claim(lease, token))

    def take_lease(self, lease: Lease, new_owner: str) -> WriteResult:
        return self._write(lease_writes.take(lease, new_owner))

    def evict_lease(self, lease: Lease) -> WriteResult:
        return self._write(lease_writes.evict(lease))

    def update_lease(self, lease: Lease, losses: frozenset[AgedOutRange] = frozenset()) -> WriteResult:
        """A holder's checkpoint or prepare of `lease`, adding the retention `losses` its read met."""
        return self._write(lease_writes.update(lease, losses))

    def checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult:
        """Commit `value`: clears any prepared checkpoint and zeroes owner switches (§2.5)."""
        return self.update_lease(lease.with_checkpoint(value))

    def prepare_checkpoint(
        self, lease: Lease, value: ExtendedSequenceNumber, state: bytes | None = None
    ) -> WriteResult:
        """Record `value` (and opaque `state`) as pending; the real checkpoint is unchanged (§2.6)."""
        return self.update_lease(lease.with_pending_checkpoint(value, state))

    def assign_lease(self, lease: Lease, new_owner: str) -> WriteResult:
        return self._write(lease_writes.assign(lease, new_owner))

    def initiate_graceful_handoff(self, lease: Lease, new_owner: str) -> WriteResult:
        return self._write(lease_writes.initiate_graceful_handoff(lease, new_owner))

    def reset_checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult:
        """An operator's move of the checkpoint to `value` (`leasectl reset`), fencing any holder."""
        return self._write(lease_writes.reset_checkpoint(lease, value))

    def update_lease_meta(self, lease: Lease, field: MetaField) -> bool:
        """Write child ids or the hash range; False (logged, not raised) when the item is gone."""
        applied = self._update_item(lease_writes.update_meta(lease, field)).applied
        if not applied:
            log.info("lease %s no longer exists; %s not written", lease.lease_key, field.value)
        return applied

    def forget_reported_losses(self, lease_key: str, losses: frozenset[AgedOutRange]) -> bool:
        """Remove `losses` from the lease's unreported ones (a kept round report names them); False when
        the lease is gone."""
        return self._update_item(lease_writes.forget_reported_losses(lease_key, losses)).applied

    def repair_lease(self, lease_key: str, checkpoint: ExtendedSequenceNumber | None) -> RepairResult | None:
        """Write a lease over the item of `lease_key` if it cannot be read as a lease, at `checkpoint`
        or its own (`codec.repaired_lease`, `lease_writes.repair`); None when there is no lease item
        of that key. `codec.RepairRefused` when the repair would need a guess."""
        item = self._get_item(lease_key, consistent=True)
        if item is None or not codec.is_lease_item(item):
            return None
        try:
            codec.lease_from_item(item)
            return RepairResult(None)
        except CorruptLeaseError as problem:
            repaired, dropped = codec.repaired_lease(item, checkpoint)
            write = self._update_item(lease_writes.repair(item, repaired))
            # A retried write that lost its condition to its own first attempt finds the repaired lease
            # (compared decoded: DynamoDB may write numbers and sets back in another form).
            applied = write.applied or (write.retried and _decodes_to(write.item, repaired))
            return RepairResult(problem, WriteResult(applied, repaired if applied else None, write.retried), dropped)

    def delete_lease(self, lease_key: str) -> None:
        """KCL's deleteLease: by key, with no condition but that the item is a lease (`IS_LEASE`: in the
        single layout a worker's metrics or a coordinator-state record may have any key); deleting a
        missing lease succeeds."""
        self._delete_item_if(LeaseDelete(lease_key, ()))

    def delete_lease_if_unchanged(self, lease: Lease) -> WriteResult:
        """Delete `lease` only while it is stored as in `lease` (`lease_writes.delete_if_unchanged`).

        Not applied with a lease: it changed since it was read. Not applied without one: it was
        already gone (deleted by someone else, or by this very call when its answer was lost and
        the retry found nothing).
        """
        return _result(self._delete_item_if(lease_writes.delete_if_unchanged(lease)))

    def transact(self, transaction: LeaseTransaction) -> TransactionResult:
        """Apply every write of `transaction`, or none of them."""
        applied, conflicts = self._transact_items(transaction)
        return TransactionResult(
            applied,
            tuple((key, _stored_lease(item)) for key, item in sorted(conflicts.items())),
        )


def _result(write: ItemWrite) -> WriteResult:
    return WriteResult(write.applied, _stored_lease(write.item), write.retried)


def _stored_lease(item: Item | None) -> Lease | None:
    """The lease a lost condition found, or None: no item, or one that is not a lease (another entity
    type's, which the write's `IS_LEASE` condition kept it from changing, docs/protocol.md §1.6)."""
    return None if item is None or not codec.is_lease_item(item) else codec.lease_from_item(item)


def _decodes_to(item: Item | None, lease: Lease) -> bool:
    try:
        return item is not None and codec.lease_from_item(item) == lease
    except CorruptLeaseError:
        return False


def _decode_all(items: Iterable[Item]) -> tuple[list[Lease], list[CorruptLeaseError]]:
    leases: list[Lease] = []
    corrupt: list[CorruptLeaseError] = []
    for item in items:
        if not codec.is_lease_item(item):
            continue
        try:
            leases.append(codec.lease_from_item(item))
        except CorruptLeaseError as error:
            corrupt.append(error)
    return leases, corrupt
