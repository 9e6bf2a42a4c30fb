"""The coordinator-state table (`<app>-CoordinatorState`, hash key `key`): small records the leader keeps.

KCL keeps its leader lock and migration state here (docs/protocol.md §5.3); we also keep what a batch
leader must remember between rounds (auditor hole counts, former streams, round snapshots).
Records are plain Python values (`record_table`); each record's owner gives it a type with
`to_item`/`from_item`. Reads are strongly consistent, and writes can be made conditional on
expected attribute values so that concurrent leaders cannot overwrite each other.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from lease_core.errors import CoordinatorStateConflictError
from lease_core.retry import RetryPolicy
from lease_core.store.record_table import (
    DynamoDBRecordTable,
    Expectations,
    InMemoryRecordTable,
    Record,
    RecordTable,
)

KEY = "key"
# The attribute `update_record` versions a record by: a fresh random token on every write.
VERSION = "version"
# The versions the last few writes replaced, newest first: a writer whose answer was lost still
# finds its own version there after others have written over it.
RECENT_VERSIONS = "recentVersions"
RECENT_VERSIONS_KEPT = 8
UPDATE_ATTEMPTS = 5
T = TypeVar("T")

# The coordinator-state table is a record table keyed by `key`.
CoordinatorStateStore = RecordTable

__all__ = ["CoordinatorStateStore", "Expectations", "Record"]


class InMemoryCoordinatorStateStore(InMemoryRecordTable):
    def __init__(self, table_name: str = "in-memory-CoordinatorState") -> None:
        super().__init__(table_name, KEY)


class DynamoDBCoordinatorStateStore(DynamoDBRecordTable):
    def __init__(self, client: Any, table_name: str, retry_policy: RetryPolicy | None = None) -> None:
        super().__init__(client, table_name, KEY, retry_policy)


def update_record(
    state: CoordinatorStateStore,
    key: str,
    change: Callable[[Record | None], Record | None],
    attempts: int = UPDATE_ATTEMPTS,
    new_version: Callable[[], str] = lambda: uuid.uuid4().hex,
) -> Record | None:
    """Read-modify-write one record, conditional on the version read: concurrent writers never lose
    each other's update.

    `change` gets the stored record (None when absent) and returns the attributes to store, or None
    to leave the record as it is; it may run several times, so it must be a pure function of the
    record. A record written without a version (by an older release) must still lack one. A put
    whose answer was lost and whose retry then failed the condition against itself is recognised by
    its version, as the record's or one of its `recentVersions` (when others wrote over it since),
    and counts as written: the change is never applied twice. Returns the record as stored
    afterwards; raises `CoordinatorStateConflictError` when the record changed under every attempt.
    """
    for _ in range(attempts):
        record = state.get(key)
        attributes = change(record)
        if attributes is None:
            return record
        version = new_version()
        expected = {VERSION: None if record is None or VERSION not in record else record[VERSION]}
        written = {**attributes, VERSION: version, **_recent_versions(record)}
        if state.put(key, written, expected=expected):
            return {**written, KEY: key}
        stored = state.get(key)
        if stored is not None and version in _versions_of(stored):
            return stored
    raise CoordinatorStateConflictError(state.table_name, key, attempts)


def _versions_of(record: Record) -> list[str]:
    """The record's version and the ones it replaced, newest first."""
    current = [record[VERSION]] if VERSION in record else []
    return current + list(record.get(RECENT_VERSIONS, []))


def _recent_versions(record: Record | None) -> Record:
    versions = [] if record is None else _versions_of(record)[:RECENT_VERSIONS_KEPT]
    return {RECENT_VERSIONS: versions} if versions else {}


def decide_and_record(
    state: CoordinatorStateStore, key: str, decide: Callable[[Record | None], tuple[T, Record | None]]
) -> T:
    """`update_record` for a decision taken from the record: `decide` returns the decision and the
    attributes to store (None: leave the record as it is). Returns the decision of the attempt whose
    write landed (or that left the record alone), never one taken from a record that changed under it.
    """
    decisions: list[T] = []

    def change(record: Record | None) -> Record | None:
        decision, attributes = decide(record)
        decisions.append(decision)
        return attributes

    update_record(state, key, change)
    return decisions[-1]
