"""An in-memory lease store with DynamoDB's conditional-write semantics, for fast tests and tools.

Items are held in DynamoDB's low-level format and every update is evaluated atomically under one
lock, so the same contract tests pass against this store and against DynamoDB.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from decimal import Decimal

from lease_core.store import codec
from lease_core.store.codec import AttributeValue, Item
from lease_core.store.lease_store import ConditionalLeaseStore, ItemWrite
from lease_core.store.lease_writes import (
    AttributeAbsent,
    AttributeAbsentOrEquals,
    AttributeExists,
    Condition,
    LeaseDelete,
    LeaseTransaction,
    LeaseUpdate,
    guarded,
)


class InMemoryLeaseStore(ConditionalLeaseStore):
    def __init__(self, table_name: str = "in-memory") -> None:
        self.table_name = table_name
        self._items: dict[str, Item] = {}
        self._lock = threading.Lock()

    def put_raw_item(self, item: Item) -> None:
        """Store an arbitrary item unchecked, as other tooling might (used to test corrupt items)."""
        with self._lock:
            self._items[item[codec.LEASE_KEY]["S"]] = copy.deepcopy(item)

    def raw_item(self, lease_key: str) -> Item | None:
        with self._lock:
            item = self._items.get(lease_key)
            return copy.deepcopy(item) if item is not None else None

    def _put_item_if_absent(self, item: Item) -> bool:
        key = item[codec.LEASE_KEY]["S"]
        with self._lock:
            if key in self._items:
                return False
            self._items[key] = copy.deepcopy(item)
            return True

    def _get_item(self, lease_key: str, consistent: bool) -> Item | None:
        return self.raw_item(lease_key)

    def _scan_items(self) -> Iterator[Item]:
        with self._lock:
            snapshot = copy.deepcopy(list(self._items.values()))
        return iter(snapshot)

    def _query_owner_keys(self, owner: str) -> Iterator[str]:
        with self._lock:
            keys = [key for key, item in self._items.items() if item.get(codec.LEASE_OWNER) == {"S": owner}]
        return iter(keys)

    def _get_items(self, lease_keys: list[str]) -> Iterator[Item]:
        with self._lock:
            found = [copy.deepcopy(self._items[key]) for key in lease_keys if key in self._items]
        return iter(found)

    def _update_item(self, update: LeaseUpdate) -> ItemWrite:
        with self._lock:
            item = self._items.get(update.lease_key)
            if not _allows(update, item):
                return ItemWrite(False, copy.deepcopy(item))
            assert item is not None
            _apply(update, item)
            return ItemWrite(True, copy.deepcopy(item))

    def _delete_item_if(self, delete: LeaseDelete) -> ItemWrite:
        with self._lock:
            item = self._items.get(delete.lease_key)
            if item is None or not all(_holds(condition, item) for condition in guarded(delete.conditions)):
                return ItemWrite(False, copy.deepcopy(item))
            del self._items[delete.lease_key]
            return ItemWrite(True, None)

    def _transact_items(self, transaction: LeaseTransaction) -> tuple[bool, dict[str, Item | None]]:
        with self._lock:
            conflicts = {
                update.lease_key: copy.deepcopy(self._items.get(update.lease_key))
                for update in transaction.updates
                if not _allows(update, self._items.get(update.lease_key))
            }
            conflicts.update(
                (create.lease.lease_key, copy.deepcopy(self._items[create.lease.lease_key]))
                for create in transaction.creates
                if create.lease.lease_key in self._items
            )
            if conflicts:
                return False, conflicts
            for update in transaction.updates:
                _apply(update, self._items[update.lease_key])
            for create in transaction.creates:
                self._items[create.lease.lease_key] = codec.lease_to_item(create.lease)
            return True, {}


def _allows(update: LeaseUpdate, item: Item | None) -> bool:
    return item is not None and all(_holds(condition, item) for condition in guarded(update.conditions))


def _apply(update: LeaseUpdate, item: Item) -> None:
    for name, value in update.set_attributes:
        item[name] = copy.deepcopy(value)
    for name in update.remove_attributes:
        item.pop(name, None)
    for name, amount in update.add_numbers:
        current = Decimal(item[name]["N"]) if name in item else Decimal(0)
        item[name] = {"N": str(current + amount)}
    for name, value in update.add_to_sets:
        item[name] = {"SS": sorted(set(item.get(name, {}).get("SS", ())) | set(value["SS"]))}
    for name, value in update.delete_from_sets:
        remaining = set(item.get(name, {}).get("SS", ())) - set(value["SS"])
        if remaining:
            item[name] = {"SS": sorted(remaining)}
        else:
            item.pop(name, None)


def _holds(condition: Condition, item: Item) -> bool:
    if isinstance(condition, AttributeExists):
        return condition.name in item
    if isinstance(condition, AttributeAbsent):
        return condition.name not in item
    if isinstance(condition, AttributeAbsentOrEquals):
        return condition.name not in item or values_equal(item[condition.name], condition.value)
    return values_equal(item.get(condition.name), condition.value)


def values_equal(stored: AttributeValue | None, expected: AttributeValue) -> bool:
    """DynamoDB equality: same type, numbers compared numerically."""
    if stored is None or stored.keys() != expected.keys():
        return False
    if "N" in expected:
        return Decimal(stored["N"]) == Decimal(expected["N"])
    return stored == expected
