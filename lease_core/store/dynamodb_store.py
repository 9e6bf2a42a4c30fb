"""The lease store on a DynamoDB table, through the low-level boto3 client."""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import botocore.exceptions

from lease_core.aws import TRANSPORT_ERRORS, AwsCaller, error_code, may_have_been_applied
from lease_core.errors import DependencyError, IndexNotFoundError, LeaseCoreError, TableNotFoundError
from lease_core.retry import RetryPolicy
from lease_core.store import codec
from lease_core.store.codec import Item
from lease_core.store.lease_store import ConditionalLeaseStore, ItemWrite
from lease_core.store.lease_writes import (
    AttributeAbsentOrEquals,
    AttributeEquals,
    AttributeExists,
    Condition,
    LeaseDelete,
    LeaseTransaction,
    LeaseUpdate,
    guarded,
)
from lease_core.store.scan_segments import SEGMENT_COUNT_CACHE_SECONDS, scan_segment_count

T = TypeVar("T")

OWNER_INDEX_NAME = "LeaseOwnerToLeaseKeyIndex"
BATCH_GET_LIMIT = 100
_CONDITION_FAILED = "ConditionalCheckFailedException"
_TRANSACTION_CANCELED = "TransactionCanceledException"


class _Placeholders:
    """Expression attribute names and values of one request: `#n<i>` and `:v<i>` in order of use."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}

    def name(self, attribute: str) -> str:
        placeholder = f"#n{len(self.names)}"
        self.names[placeholder] = attribute
        return placeholder

    def value(self, attribute_value: Any) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = attribute_value
        return placeholder

    def condition(self, conditions: tuple[Condition, ...]) -> str:
        clauses = []
        for condition in conditions:
            if isinstance(condition, AttributeEquals):
                clauses.append(f"{self.name(condition.name)} = {self.value(condition.value)}")
            elif isinstance(condition, AttributeExists):
                clauses.append(f"attribute_exists({self.name(condition.name)})")
            elif isinstance(condition, AttributeAbsentOrEquals):
                name = self.name(condition.name)
                clauses.append(f"(attribute_not_exists({name}) OR {name} = {self.value(condition.value)})")
            else:
                clauses.append(f"attribute_not_exists({self.name(condition.name)})")
        return " AND ".join(clauses)

    def arguments(self, lease_key: str, condition_expression: str) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "Key": {codec.LEASE_KEY: codec.string_value(lease_key)},
            "ConditionExpression": condition_expression,
            "ExpressionAttributeNames": self.names,
        }
        if self.values:
            arguments["ExpressionAttributeValues"] = self.values
        return arguments


def render_update(update: LeaseUpdate) -> dict[str, Any]:
    """UpdateItem arguments for `update`; every name and value goes through a placeholder."""
    placeholders = _Placeholders()
    condition = placeholders.condition(guarded(update.conditions))
    name, value = placeholders.name, placeholders.value
    clauses = []
    if update.set_attributes:
        clauses.append("SET " + ", ".join(f"{name(a)} = {value(v)}" for a, v in update.set_attributes))
    if update.remove_attributes:
        clauses.append("REMOVE " + ", ".join(name(a) for a in update.remove_attributes))
    additions = [f"{name(a)} {value({'N': str(n)})}" for a, n in update.add_numbers]
    additions += [f"{name(a)} {value(v)}" for a, v in update.add_to_sets]
    if additions:
        clauses.append("ADD " + ", ".join(additions))
    if update.delete_from_sets:
        clauses.append("DELETE " + ", ".join(f"{name(a)} {value(v)}" for a, v in update.delete_from_sets))
    return {"UpdateExpression": " ".join(clauses), **placeholders.arguments(update.lease_key, condition)}


def render_delete(delete: LeaseDelete) -> dict[str, Any]:
    """DeleteItem arguments for `delete`; every name and value goes through a placeholder."""
    placeholders = _Placeholders()
    return placeholders.arguments(delete.lease_key, placeholders.condition(guarded(delete.conditions)))


class DynamoDBLeaseStore(ConditionalLeaseStore):
    """KCL's lease refresher over DynamoDB: conditional writes, paginated and parallel scans, GSI queries."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        retry_policy: RetryPolicy | None = None,
        consistent_reads: bool = False,
        scan_total_segments: int = 0,
        page_size: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.table_name = table_name
        self.default_consistent_reads = consistent_reads
        self._caller = AwsCaller("dynamodb", retry_policy or RetryPolicy())
        self._configured_segments = scan_total_segments
        self._page_limit = {"Limit": page_size} if page_size else {}
        self._monotonic = monotonic
        self._segments: tuple[int, float] | None = None  # (count, computed at)

    def _call(self, operation: str, function: Callable[[], T]) -> T:
        return self._caller.call(operation, function, table_name=self.table_name)

    def _key(self, lease_key: str) -> Item:
        return {codec.LEASE_KEY: codec.string_value(lease_key)}

    def _put_item_if_absent(self, item: Item) -> bool:
        def put() -> bool:
            try:
                self.client.put_item(
                    TableName=self.table_name,
                    Item=item,
                    ConditionExpression="attribute_not_exists(#k)",
                    ExpressionAttributeNames={"#k": codec.LEASE_KEY},
                )
            except botocore.exceptions.ClientError as error:
                if error_code(error) == _CONDITION_FAILED:
                    return False
                raise
            return True

        return self._call("PutItem", put)

    def _get_item(self, lease_key: str, consistent: bool) -> Item | None:
        response = self._call(
            "GetItem",
            lambda: self.client.get_item(
                TableName=self.table_name, Key=self._key(lease_key), ConsistentRead=consistent
            ),
        )
        item: Item | None = response.get("Item")
        return item

    def _update_item(self, update: LeaseUpdate) -> ItemWrite:
        arguments = render_update(update)

        def update_item() -> Item:
            written: Item = self.client.update_item(
                TableName=self.table_name,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **arguments,
            )["Attributes"]
            return written

        return self._conditionally("UpdateItem", update_item)

    def _delete_item_if(self, delete: LeaseDelete) -> ItemWrite:
        arguments = render_delete(delete)

        def delete_item() -> None:
            self.client.delete_item(
                TableName=self.table_name, ReturnValuesOnConditionCheckFailure="ALL_OLD", **arguments
            )

        return self._conditionally("DeleteItem", delete_item)

    def _conditionally(self, operation: str, request: Callable[[], Item | None]) -> ItemWrite:
        """Applied with what `request` returned, or not with the item that failed the condition.

        `retried` says whether the request went out again after an attempt whose outcome is unknown
        (the holder of a lease accepts "my write's answer was lost" only then).
        """
        ambiguous = False

        def attempt() -> ItemWrite:
            nonlocal ambiguous
            try:
                return ItemWrite(True, request(), ambiguous)
            except botocore.exceptions.ClientError as error:
                if error_code(error) == _CONDITION_FAILED:
                    return ItemWrite(False, error.response.get("Item"), ambiguous)
                ambiguous = ambiguous or may_have_been_applied(error)
                raise
            except TRANSPORT_ERRORS as error:
                ambiguous = ambiguous or may_have_been_applied(error)
                raise

        return self._call(operation, attempt)

    def _transact_items(self, transaction: LeaseTransaction) -> tuple[bool, dict[str, Item | None]]:
        items = [
            {
                "Update": {
                    "TableName": self.table_name,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    **render_update(update),
                }
            }
            for update in transaction.updates
        ]
        items += [
            {
                "Put": {
                    "TableName": self.table_name,
                    "Item": codec.lease_to_item(create.lease),
                    "ConditionExpression": "attribute_not_exists(#k)",
                    "ExpressionAttributeNames": {"#k": codec.LEASE_KEY},
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
            for create in transaction.creates
        ]
        # One token for every retry of this call: DynamoDB applies a repeated request once (10 minutes).
        token = uuid.uuid4().hex

        def attempt() -> tuple[bool, dict[str, Item | None]]:
            try:
                self.client.transact_write_items(TransactItems=items, ClientRequestToken=token)
            except botocore.exceptions.ClientError as error:
                if error_code(error) != _TRANSACTION_CANCELED:
                    raise
                reasons = error.response.get("CancellationReasons") or []
                return False, {
                    key: reason.get("Item")
                    for key, reason in zip(transaction.lease_keys, reasons)
                    if reason.get("Code") == "ConditionalCheckFailed"
                }
            return True, {}

        return self._call("TransactWriteItems", attempt)

    # --- multi-item reads -------------------------------------------------------------------

    def scan_segment_count(self) -> int:
        """§1.5: sized from the table's size, recomputed at most every two hours."""
        now = self._monotonic()
        if self._segments is not None and now - self._segments[1] < SEGMENT_COUNT_CACHE_SECONDS:
            return self._segments[0]
        if self._configured_segments > 0:
            count = self._configured_segments
        else:
            last = self._segments[0] if self._segments else None
            count = scan_segment_count(self._table_size_bytes(), last_known=last)
        self._segments = (count, now)
        return count

    def _table_size_bytes(self) -> int | None:
        try:
            description = self._call("DescribeTable", lambda: self.client.describe_table(TableName=self.table_name))
        except TableNotFoundError:
            raise
        except LeaseCoreError:
            return None  # sized from the last known count, or the default
        return int(description["Table"].get("TableSizeBytes", 0))

    def _scan_items(self) -> Iterator[Item]:
        segments = self.scan_segment_count()
        if segments == 1:
            return iter(self._scan_segment(None))
        with ThreadPoolExecutor(max_workers=min(segments, 16), thread_name_prefix="lease-scan") as pool:
            pages = list(pool.map(self._scan_segment, [(i, segments) for i in range(segments)]))
        return (item for page in pages for item in page)

    def _scan_segment(self, segment: tuple[int, int] | None) -> list[Item]:
        arguments: dict[str, Any] = {"TableName": self.table_name, **self._page_limit}
        if segment is not None:
            arguments.update(Segment=segment[0], TotalSegments=segment[1])
        items: list[Item] = []
        while True:
            response = self._call("Scan", lambda: self.client.scan(**arguments))
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return items
            arguments["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _query_owner_keys(self, owner: str) -> Iterator[str]:
        arguments: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": OWNER_INDEX_NAME,
            "KeyConditionExpression": "#o = :o",
            "ExpressionAttributeNames": {"#o": codec.LEASE_OWNER},
            "ExpressionAttributeValues": {":o": codec.string_value(owner)},
            **self._page_limit,
        }
        while True:
            response = self._call("Query", lambda: self._query_index(arguments))
            for item in response.get("Items", []):
                yield item[codec.LEASE_KEY]["S"]
            if "LastEvaluatedKey" not in response:
                return
            arguments["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _query_index(self, arguments: dict[str, Any]) -> Any:
        try:
            return self.client.query(**arguments)
        except botocore.exceptions.ClientError as error:
            message = error.response.get("Error", {}).get("Message", "")
            # DynamoDB answers ValidationException; moto answers ResourceNotFoundException.
            if (
                error_code(error) in {"ValidationException", "ResourceNotFoundException"}
                and OWNER_INDEX_NAME in message
            ):
                raise IndexNotFoundError(self.table_name, OWNER_INDEX_NAME) from error
            raise

    def _get_items(self, lease_keys: list[str]) -> Iterator[Item]:
        for start in range(0, len(lease_keys), BATCH_GET_LIMIT):
            pending: dict[str, Any] = {
                self.table_name: {
                    "Keys": [self._key(key) for key in lease_keys[start : start + BATCH_GET_LIMIT]],
                    "ConsistentRead": self.default_consistent_reads,
                }
            }
            yield from self._batch_get(pending)

    def _batch_get(self, pending: dict[str, Any]) -> Iterator[Item]:
        retry = 0
        while pending:
            request = pending
            response = self._call("BatchGetItem", functools.partial(self.client.batch_get_item, RequestItems=request))
            yield from response.get("Responses", {}).get(self.table_name, [])
            pending = response.get("UnprocessedKeys") or {}
            if pending:
                # Unprocessed keys are DynamoDB's way of throttling a batch: back off before asking again.
                retry += 1
                if retry >= self._caller.policy.attempts:
                    raise DependencyError("dynamodb", "BatchGetItem", "keys stayed unprocessed", retry)
                self._caller.policy.sleep(self._caller.policy.delay_seconds(retry))
