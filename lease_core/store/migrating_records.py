"""The records of an application whose table migration is under way: read from both tables, written
to one (docs/protocol.md §1.8).

Until KCL 3.5's table migration is COMPLETE, a record may be in the separate table
(`<app>-WorkerMetricStats` or `<app>-CoordinatorState`) or already in the lease table, so reads look
in both, as KCL's DAOs do. Where a write goes depends on what the record is:

- worker metrics (`newest_by=("round", "lut")`): a worker's newest item is its item, wherever it is; a write goes
  to the table the migration's status writes to (`writes_to_lease_table`), carrying the history along,
  so the leader sees which table each worker writes to now;
- coordinator state: a record is written where it is, since the leader's move is the one way a record
  changes table (a conditional write must meet the record it read); a new record goes to the table
  the status writes to. `pinned` records (the leader lock and the migration record) stay in the separate
  table until COMPLETE.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from lease_core.store.record_table import Expectations, Record, RecordTable


class MigratingRecords:
    def __init__(
        self,
        separate: RecordTable,
        lease_table: RecordTable,
        *,
        writes_to_lease_table: bool,
        pinned: frozenset[str] = frozenset(),
        newest_by: tuple[str, ...] = (),
    ) -> None:
        if separate.hash_key != lease_table.hash_key:
            raise ValueError(f"{separate.table_name!r} and {lease_table.table_name!r} show records of different keys")
        self.separate = separate
        self.lease_table = lease_table
        self.table_name = separate.table_name
        self.hash_key = separate.hash_key
        self._writes_to = lease_table if writes_to_lease_table else separate
        self._pinned = pinned
        self._newest_by = newest_by

    def get(self, key: str) -> Record | None:
        return self._found(key)[1]

    def scan(self) -> list[Record]:
        chosen: dict[str, Record] = {}
        in_lease_table = [record for record in self.lease_table.scan() if record.get(self.hash_key) not in self._pinned]
        for record in (*self.separate.scan(), *in_lease_table):
            key = str(record.get(self.hash_key))
            held = chosen.get(key)
            chosen[key] = record if held is None else self._choose(held, record)
        return list(chosen.values())

    def put(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        return self._target(key).put(key, attributes, expected)

    def update(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        return self._target(key).update(key, attributes, expected)

    def delete(self, key: str, expected: Expectations | None = None) -> bool:
        table, _ = self._found(key)
        return table.delete(key, expected)

    def _found(self, key: str) -> tuple[RecordTable, Record | None]:
        """The table that holds the record of `key` (the chosen one, when both do) and the record."""
        if key in self._pinned:
            return self.separate, self.separate.get(key)
        separate = self.separate.get(key)
        if separate is not None and not self._newest_by:
            return self.separate, separate
        in_lease_table = self.lease_table.get(key)
        if separate is None or in_lease_table is None:
            return (self.separate, separate) if in_lease_table is None else (self.lease_table, in_lease_table)
        chosen = self._choose(separate, in_lease_table)
        return (self.separate, separate) if chosen is separate else (self.lease_table, in_lease_table)

    def _target(self, key: str) -> RecordTable:
        if key in self._pinned:
            return self.separate
        if self._newest_by:
            return self._writes_to
        table, record = self._found(key)
        return table if record is not None else self._writes_to

    def _choose(self, separate: Record, in_lease_table: Record) -> Record:
        """Of one key's records in both tables: the newer by `newest_by` (compared in that order), else
        the separate table's (KCL reads the separate table first)."""
        if not self._newest_by:
            return separate
        newer = record_order(in_lease_table, self._newest_by) >= record_order(separate, self._newest_by)
        return in_lease_table if newer else separate


def record_order(record: Mapping[str, Any], names: tuple[str, ...]) -> tuple[Decimal, ...]:
    """A record's place in time by the numbers `names` (an absent one counts as -1)."""
    values = (record.get(name) for name in names)
    return tuple(
        Decimal(value) if isinstance(value, int | Decimal) and not isinstance(value, bool) else Decimal(-1)
        for value in values
    )
