"""The coordinator-state table (`<app>-CoordinatorState`, hash key `key`): small records the leader keeps.

KCL keeps its leader lock and migration state here (kcl-spec.md §6.4); we also keep what a batch
leader must remember between rounds (auditor hole counts, former streams, round snapshots).
Records are low-level DynamoDB items; reads are strongly consistent, and writes can be made
conditional on expected attribute values so that concurrent leaders cannot overwrite each other.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.errors import CoordinatorStateConflictError
from lease_core.retry import RetryPolicy
from lease_core.store.codec import AttributeValue, Item
from lease_core.store.memory_store import values_equal

KEY = "key"
# The attribute `update_record` versions a record by: a fresh random token on every write.
VERSION = "version"
# The versions the last few writes replaced, newest first: a writer whose answer was lost still
# finds its own version there after others have written over it.
RECENT_VERSIONS = "recentVersions"
RECENT_VERSIONS_KEPT = 8
UPDATE_ATTEMPTS = 5
# An expectation maps an attribute to the value it must hold, or to None: "must not exist".
Expectations = Mapping[str, AttributeValue | None]
T = TypeVar("T")


class CoordinatorStateStore(Protocol):
    table_name: str

    def get(self, key: str) -> Item | None: ...
    def put(self, key: str, attributes: Item, expected: Expectations | None = None) -> bool:
        """Write the whole record; with `expected`, only if the stored record matches (absent = must not exist)."""
        ...

    def delete(self, key: str, expected: Expectations | None = None) -> bool: ...


class InMemoryCoordinatorStateStore:
    def __init__(self, table_name: str = "in-memory-CoordinatorState") -> None:
        self.table_name = table_name
        self._records: dict[str, Item] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Item | None:
        with self._lock:
            record = self._records.get(key)
            return copy.deepcopy(record) if record is not None else None

    def put(self, key: str, attributes: Item, expected: Expectations | None = None) -> bool:
        with self._lock:
            if not _matches(self._records.get(key), expected):
                return False
            self._records[key] = {**copy.deepcopy(attributes), KEY: {"S": key}}
            return True

    def delete(self, key: str, expected: Expectations | None = None) -> bool:
        with self._lock:
            if not _matches(self._records.get(key), expected):
                return False
            self._records.pop(key, None)
            return True


def _matches(record: Item | None, expected: Expectations | None) -> bool:
    if not expected:
        return True
    return all(
        (value is None and (record is None or name not in record))
        or (value is not None and record is not None and values_equal(record.get(name), value))
        for name, value in expected.items()
    )


class DynamoDBCoordinatorStateStore:
    def __init__(self, client: Any, table_name: str, retry_policy: RetryPolicy | None = None) -> None:
        self.client = client
        self.table_name = table_name
        self._caller = AwsCaller("dynamodb", retry_policy or RetryPolicy())

    def _call(self, operation: str, function: Callable[[], T]) -> T:
        return self._caller.call(operation, function, table_name=self.table_name)

    def get(self, key: str) -> Item | None:
        response = self._call(
            "GetItem",
            lambda: self.client.get_item(TableName=self.table_name, Key={KEY: {"S": key}}, ConsistentRead=True),
        )
        item: Item | None = response.get("Item")
        return item

    def put(self, key: str, attributes: Item, expected: Expectations | None = None) -> bool:
        item = {**attributes, KEY: {"S": key}}
        return self._conditional(
            "PutItem", lambda extra: self.client.put_item(TableName=self.table_name, Item=item, **extra), expected
        )

    def delete(self, key: str, expected: Expectations | None = None) -> bool:
        return self._conditional(
            "DeleteItem",
            lambda extra: self.client.delete_item(TableName=self.table_name, Key={KEY: {"S": key}}, **extra),
            expected,
        )

    def _conditional(
        self, operation: str, call: Callable[[dict[str, Any]], Any], expected: Expectations | None
    ) -> bool:
        extra = _condition_arguments(expected)

        def attempt() -> bool:
            try:
                call(extra)
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ConditionalCheckFailedException":
                    return False
                raise
            return True

        return self._call(operation, attempt)


def _condition_arguments(expected: Expectations | None) -> dict[str, Any]:
    if not expected:
        return {}
    names: dict[str, str] = {}
    values: dict[str, AttributeValue] = {}
    clauses = []
    for index, (name, value) in enumerate(expected.items()):
        names[f"#n{index}"] = name
        if value is None:
            clauses.append(f"attribute_not_exists(#n{index})")
        else:
            values[f":v{index}"] = value
            clauses.append(f"#n{index} = :v{index}")
    arguments: dict[str, Any] = {"ConditionExpression": " AND ".join(clauses), "ExpressionAttributeNames": names}
    if values:
        arguments["ExpressionAttributeValues"] = values
    return arguments


def update_record(
    state: CoordinatorStateStore,
    key: str,
    change: Callable[[Item | None], Item | None],
    attempts: int = UPDATE_ATTEMPTS,
    new_version: Callable[[], str] = lambda: uuid.uuid4().hex,
) -> Item | None:
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
        written = {**attributes, VERSION: {"S": version}, **_recent_versions(record)}
        if state.put(key, written, expected=expected):
            return {**written, KEY: {"S": key}}
        stored = state.get(key)
        if stored is not None and version in _versions_of(stored):
            return stored
    raise CoordinatorStateConflictError(state.table_name, key, attempts)


def _versions_of(record: Item) -> list[str]:
    """The record's version and the ones it replaced, newest first."""
    current = [record[VERSION]["S"]] if VERSION in record else []
    return current + [value["S"] for value in record.get(RECENT_VERSIONS, {}).get("L", [])]


def _recent_versions(record: Item | None) -> Item:
    versions = [] if record is None else _versions_of(record)[:RECENT_VERSIONS_KEPT]
    return {RECENT_VERSIONS: {"L": [{"S": version} for version in versions]}} if versions else {}


def decide_and_record(
    state: CoordinatorStateStore, key: str, decide: Callable[[Item | None], tuple[T, Item | None]]
) -> T:
    """`update_record` for a decision taken from the record: `decide` returns the decision and the
    attributes to store (None: leave the record as it is). Returns the decision of the attempt whose
    write landed (or that left the record alone), never one taken from a record that changed under it.
    """
    decisions: list[T] = []

    def change(record: Item | None) -> Item | None:
        decision, attributes = decide(record)
        decisions.append(decision)
        return attributes

    update_record(state, key, change)
    return decisions[-1]
