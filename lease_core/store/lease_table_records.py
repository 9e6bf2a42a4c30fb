"""Worker metrics and coordinator state kept in the lease table itself: KCL 3.5's single-table layout
(docs/protocol.md §1.7).

A `LeaseTableRecords` is a `RecordTable` over the lease table that holds the records of one kind
(worker metrics, or coordinator state). Its owners see the same records as in the separate tables:
keyed by `wid` or `key`, without `entityType`. In the lease table each record is keyed by
`leaseKey` and tagged with its KCL 3.5 entity type on every write, so that a lease scan (ours and
KCL's) skips it; reads see only the records of this view's entity types, never a lease.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lease_core.store.codec import (
    CHECKPOINT,
    ENTITY_TYPE,
    LEADER_ENTITY_TYPE,
    LEASE_COUNTER,
    LEASE_KEY,
    LEGACY_COORDINATOR_STATE_KEYS,
    STREAM_ENTITY_TYPE,
    WORKER_METRIC_STATS_ENTITY_TYPE,
    untagged_entity_type,
)
from lease_core.store.record_table import Expectations, Record, RecordTable

# What a lease item always has and no other item of the lease table has: KCL writes a lease's counter
# and checkpoint with the lease (docs/protocol.md §1.1), and no other entity type carries them.
NOT_A_LEASE: Expectations = {LEASE_COUNTER: None, CHECKPOINT: None}
COORDINATOR_STATE_ENTITY_TYPES = frozenset({*LEGACY_COORDINATOR_STATE_KEYS.values(), STREAM_ENTITY_TYPE})
WORKER_METRICS_ENTITY_TYPES = frozenset({WORKER_METRIC_STATS_ENTITY_TYPE})


def coordinator_state_entity_type(key: str) -> str:
    """The tag of a coordinator-state record: KCL's own records keep theirs; this project's records
    (`AssignmentRound`, `RoundHistory`, ...) are tagged LEADER, the coordinator-state type that KCL 3.5
    reads as a plain record. An untagged or unknown type would make KCL 3.5 read them as leases."""
    return LEGACY_COORDINATOR_STATE_KEYS.get(key, LEADER_ENTITY_TYPE)


def worker_metrics_entity_type(key: str) -> str:
    return WORKER_METRIC_STATS_ENTITY_TYPE


def record_entity_type(record: Mapping[str, Any]) -> str:
    """A lease-table record's entity type, as `codec.entity_type` reads an item's."""
    tagged = record.get(ENTITY_TYPE)
    if tagged is not None:
        return str(tagged)
    return untagged_entity_type(str(record.get(LEASE_KEY, "")), LEASE_COUNTER in record or CHECKPOINT in record)


class LeaseTableRecords:
    """The records of `entity_types` in the lease table (`table`, keyed by `leaseKey`), shown keyed by
    `hash_key`; `tag(key)` is the entity type a record under `key` is written with."""

    def __init__(
        self, table: RecordTable, hash_key: str, entity_types: frozenset[str], tag: Callable[[str], str]
    ) -> None:
        if table.hash_key != LEASE_KEY:
            raise ValueError(
                f"table {table.table_name!r} is keyed by {table.hash_key!r}, not by the lease table's {LEASE_KEY!r}"
            )
        self._table = table
        self.table_name = table.table_name
        self.hash_key = hash_key
        self._entity_types = entity_types
        self._tag = tag

    def get(self, key: str) -> Record | None:
        return self._shown(self._table.get(key))

    def scan(self) -> list[Record]:
        return [record for record in map(self._shown, self._table.scan()) if record is not None]

    def put(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        return self._table.put(key, self._stored(key, attributes), self._expectations(expected))

    def update(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        if self._table.update(key, self._stored(key, attributes), self._expectations(expected)):
            return True
        if expected is None:  # only the guard can have failed
            raise ValueError(
                f"{self._table.table_name!r} holds a lease under {key!r}: the record {key!r} was not written over it"
            )
        return False

    def delete(self, key: str, expected: Expectations | None = None) -> bool:
        return self._table.delete(key, self._expectations(expected))

    def _shown(self, record: Record | None) -> Record | None:
        """The record as its owner reads it, or None when it is a lease or another kind's record."""
        if record is None or record_entity_type(record) not in self._entity_types:
            return None
        shown = {name: value for name, value in record.items() if name not in (LEASE_KEY, ENTITY_TYPE)}
        return {**shown, self.hash_key: record[LEASE_KEY]}

    def _stored(self, key: str, attributes: Mapping[str, Any]) -> Record:
        stored = {name: value for name, value in attributes.items() if name != self.hash_key}
        return {**stored, ENTITY_TYPE: self._tag(key)}

    def _expectations(self, expected: Expectations | None) -> Expectations:
        """The owner's expectations on its hash key are the lease table's on `leaseKey`; and whatever is
        stored under the key is no lease (`NOT_A_LEASE`), so that no record is ever written over one."""
        renamed = {LEASE_KEY if name == self.hash_key else name: value for name, value in (expected or {}).items()}
        return {**renamed, **NOT_A_LEASE}


def coordinator_state_records(table: RecordTable) -> LeaseTableRecords:
    """The coordinator-state records of the lease table `table`, keyed by `key` as in `<app>-CoordinatorState`."""
    return LeaseTableRecords(table, "key", COORDINATOR_STATE_ENTITY_TYPES, coordinator_state_entity_type)


def worker_metrics_records(table: RecordTable) -> LeaseTableRecords:
    """The worker-metrics records of the lease table `table`, keyed by `wid` as in `<app>-WorkerMetricStats`."""
    return LeaseTableRecords(table, "wid", WORKER_METRICS_ENTITY_TYPES, worker_metrics_entity_type)
