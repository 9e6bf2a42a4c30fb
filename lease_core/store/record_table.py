"""Tables of small keyed records in plain Python values: the coordinator-state and worker-metrics tables.

The lease table has its own store and codec (`lease_store`, `codec`). The other two tables hold
records that their owners (the leader lock, the assignment round, the auditors, the worker metrics)
describe as typed values with `to_item`/`from_item` over plain Python values: `str`, `int` or
`Decimal` for numbers, `bool`, `bytes`, `list`, `dict`, `set`. DynamoDB's attribute-value format stays in
here: the tables convert with boto3's own `TypeSerializer`/`TypeDeserializer`, so a number reads
back as a `Decimal` whichever table holds it, and a float is refused (DynamoDB numbers are decimal;
a record states its precision with a `Decimal`).

Writes can be conditional on expected attribute values (`None`: the attribute must not exist), so
concurrent writers cannot overwrite each other; a lost condition is an outcome (False), not an error.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Protocol, TypeVar

import botocore.exceptions
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer

from lease_core.aws import AwsCaller, error_code
from lease_core.retry import RetryPolicy
from lease_core.store.codec import AttributeValue, Item
from lease_core.store.memory_store import values_equal

T = TypeVar("T")

# A record: attribute name -> plain Python value, as `TypeDeserializer` gives it.
Record = dict[str, Any]
# An expectation maps an attribute to the value it must hold, or to None: "must not exist".
Expectations = Mapping[str, Any]

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def to_attribute_values(record: Mapping[str, Any]) -> Item:
    """A record in DynamoDB's format; raises TypeError naming the attribute whose value has no DynamoDB type."""
    item: Item = {}
    for name, value in record.items():
        try:
            item[name] = _serializer.serialize(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"attribute {name!r}: {value!r} cannot be stored in DynamoDB ({error})") from None
    return item


def from_attribute_values(item: Mapping[str, AttributeValue]) -> Record:
    return {name: _plain(_deserializer.deserialize(value)) for name, value in item.items()}


def _plain(value: Any) -> Any:
    """boto3 wraps binary values in its `Binary`; records hold plain `bytes`, as they were written."""
    if isinstance(value, Binary):
        return bytes(value.value)
    if isinstance(value, list):
        return [_plain(entry) for entry in value]
    if isinstance(value, dict):
        return {key: _plain(entry) for key, entry in value.items()}
    return value


class RecordTable(Protocol):
    table_name: str
    hash_key: str

    def get(self, key: str) -> Record | None:
        """The record with its hash key, read strongly consistent; None when absent."""
        ...

    def scan(self) -> list[Record]: ...
    def put(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        """Write the whole record; with `expected`, only if the stored record matches."""
        ...

    def update(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        """Set these attributes, creating the record if absent; its other attributes are left alone.
        With `expected`, only if the stored record (or its absence) matches."""
        ...

    def delete(self, key: str, expected: Expectations | None = None) -> bool: ...


class InMemoryRecordTable:
    """The same semantics in memory: records are kept in DynamoDB's format, so they read back alike."""

    def __init__(self, table_name: str, hash_key: str) -> None:
        self.table_name = table_name
        self.hash_key = hash_key
        self._items: dict[str, Item] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Record | None:
        with self._lock:
            item = self._items.get(key)
        return from_attribute_values(item) if item is not None else None

    def scan(self) -> list[Record]:
        with self._lock:
            items = list(self._items.values())
        return [from_attribute_values(item) for item in items]

    def put(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        item = to_attribute_values({**attributes, self.hash_key: key})
        with self._lock:
            if not _matches(self._items.get(key), expected):
                return False
            self._items[key] = item
            return True

    def update(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        item = to_attribute_values({**attributes, self.hash_key: key})
        with self._lock:
            if not _matches(self._items.get(key), expected):
                return False
            self._items[key] = {**copy.deepcopy(self._items.get(key, {})), **item}
            return True

    def delete(self, key: str, expected: Expectations | None = None) -> bool:
        with self._lock:
            if not _matches(self._items.get(key), expected):
                return False
            self._items.pop(key, None)
            return True


def _matches(item: Item | None, expected: Expectations | None) -> bool:
    if not expected:
        return True
    present = to_attribute_values({name: value for name, value in expected.items() if value is not None})
    return all(
        (item is not None and values_equal(item.get(name), present[name]))
        if name in present
        else (item is None or name not in item)
        for name in expected
    )


class DynamoDBRecordTable:
    def __init__(
        self,
        client: Any,
        table_name: str,
        hash_key: str,
        retry_policy: RetryPolicy | None = None,
        page_size: int | None = None,
    ) -> None:
        self.client = client
        self.table_name = table_name
        self.hash_key = hash_key
        self._caller = AwsCaller("dynamodb", retry_policy or RetryPolicy())
        self._page_limit = {"Limit": page_size} if page_size else {}

    def _call(self, operation: str, function: Callable[[], T]) -> T:
        return self._caller.call(operation, function, table_name=self.table_name)

    def _key(self, key: str) -> Item:
        return {self.hash_key: {"S": key}}

    def get(self, key: str) -> Record | None:
        response = self._call(
            "GetItem",
            lambda: self.client.get_item(TableName=self.table_name, Key=self._key(key), ConsistentRead=True),
        )
        item = response.get("Item")
        return from_attribute_values(item) if item is not None else None

    def scan(self) -> list[Record]:
        arguments: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True, **self._page_limit}
        records: list[Record] = []
        while True:
            response = self._call("Scan", lambda: self.client.scan(**arguments))
            records.extend(from_attribute_values(item) for item in response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return records
            arguments["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def put(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        item = to_attribute_values({**attributes, self.hash_key: key})
        return self._conditional(
            "PutItem", lambda extra: self.client.put_item(TableName=self.table_name, Item=item, **extra), expected
        )

    def update(self, key: str, attributes: Mapping[str, Any], expected: Expectations | None = None) -> bool:
        values = to_attribute_values({name: value for name, value in attributes.items() if name != self.hash_key})
        if not values:  # "SET" with nothing is invalid: create the bare record unless it exists
            self.put(key, {}, expected={**(expected or {}), self.hash_key: None})
            return True
        condition = _condition_arguments(expected)
        names = {f"#a{index}": name for index, name in enumerate(values)}
        names.update(condition.pop("ExpressionAttributeNames", {}))
        update_values = {f":a{index}": value for index, value in enumerate(values.values())}
        update_values.update(condition.pop("ExpressionAttributeValues", {}))
        return self._conditional(
            "UpdateItem",
            lambda extra: self.client.update_item(
                TableName=self.table_name,
                Key=self._key(key),
                UpdateExpression="SET " + ", ".join(f"#a{index} = :a{index}" for index in range(len(values))),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=update_values,
                **condition,
            ),
            None,
        )

    def delete(self, key: str, expected: Expectations | None = None) -> bool:
        return self._conditional(
            "DeleteItem",
            lambda extra: self.client.delete_item(TableName=self.table_name, Key=self._key(key), **extra),
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
    present = to_attribute_values({name: value for name, value in expected.items() if value is not None})
    names: dict[str, str] = {}
    values: dict[str, AttributeValue] = {}
    clauses = []
    for index, name in enumerate(expected):
        names[f"#n{index}"] = name
        if name in present:
            values[f":v{index}"] = present[name]
            clauses.append(f"#n{index} = :v{index}")
        else:
            clauses.append(f"attribute_not_exists(#n{index})")
    arguments: dict[str, Any] = {"ConditionExpression": " AND ".join(clauses), "ExpressionAttributeNames": names}
    if values:
        arguments["ExpressionAttributeValues"] = values
    return arguments


# --- Reading a record's values ---------------------------------------------------------------------
# A record may have been written by other tooling (KCL, an operator in the console): readers say
# what they expected instead of failing on a KeyError or on a number stored as a string.


def text(record: Mapping[str, Any], name: str, default: str = "") -> str:
    """The string attribute `name`, or `default` when it is absent or not a string."""
    value = record.get(name)
    return value if isinstance(value, str) else default


def whole_number(record: Mapping[str, Any], name: str, default: int = 0) -> int:
    """The integer attribute `name` (stored as a number), or `default` when absent; ValueError when not an integer."""
    if name not in record:
        return default
    value = record[name]
    if not isinstance(value, Decimal | int) or isinstance(value, bool) or value != int(value):
        raise ValueError(f"attribute {name!r} must be an integer number (N), got {value!r}")
    return int(value)
