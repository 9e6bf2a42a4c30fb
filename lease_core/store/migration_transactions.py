"""The two transactions of KCL 3.5's table migration (docs/protocol.md §1.8), each fenced by the lock.

Both start with KCL's fence: a `ConditionCheck` that the coordinator-state table's `Leader` item has
`ownerName` = the leader, so that a leader whose lock was taken over writes nothing. A refusal of the
fence raises `LeadershipLostError`; any other refusal is an outcome (False), which the next round meets
again from what the tables hold.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.errors import LeadershipLostError
from lease_core.retry import RetryPolicy
from lease_core.store.codec import CHECKPOINT, ENTITY_TYPE, LEASE_COUNTER, LEASE_KEY, TABLE_MIGRATION_ENTITY_TYPE, Item
from lease_core.store.coordinator_state import KEY as COORDINATOR_STATE_KEY
from lease_core.store.coordinator_state import VERSION
from lease_core.store.lease_table_records import coordinator_state_entity_type
from lease_core.store.record_table import Record, to_attribute_values
from lease_core.store.table_migration import PENDING, STATUS, TABLE_MIGRATION_KEY

logger = logging.getLogger(__name__)

LEADER_KEY = "Leader"
OWNER_NAME = "ownerName"


class MigrationTransactions:
    def __init__(
        self, client: Any, lease_table: str, coordinator_state_table: str, retry_policy: RetryPolicy | None = None
    ) -> None:
        self.client = client
        self.lease_table = lease_table
        self.coordinator_state_table = coordinator_state_table
        self._caller = AwsCaller("dynamodb", retry_policy or RetryPolicy())

    def move(self, records: Sequence[tuple[str, Record]], owner: str) -> tuple[str, ...]:
        """Put each coordinator-state record into the lease table (keyed by `leaseKey`, tagged with its
        entity type) and delete it from the coordinator-state table; the keys not moved.

        The delete holds only while the record is as it was read (its `version`, which every
        read-modify-write replaces, or else every attribute): a writer's change in between stays in
        the coordinator-state table, where the next round finds it. The put goes where no item of the
        key is, or over the same record's copy: reads take the coordinator-state table's copy first, so
        a copy in the lease table (a writer that recreated the record after an earlier move read it) is
        the older one; a lease under the key refuses the move. A refused record is left out and the
        others are moved without it."""
        pending, not_moved = list(records), list[str]()
        while pending:
            items: list[dict[str, Any]] = [self._fence(owner)]
            for key, record in pending:
                items.append({"Put": self._put_over_record(key, record)})
                items.append({"Delete": self._delete_unchanged(key, record)})
            reasons = self._transact(items, owner, f"moving {', '.join(key for key, _ in pending)}")
            if not reasons:
                break
            refused = {pending[(index - 1) // 2][0] for index, code in enumerate(reasons) if index and code != "None"}
            if not refused:  # cancelled as a whole (a conflict with another transaction): the next round tries
                return (*not_moved, *(key for key, _ in pending))
            not_moved += sorted(refused)
            pending = [(key, record) for key, record in pending if key not in refused]
        return tuple(not_moved)

    def complete(self, record: Record, owner: str) -> bool:
        """The COMPLETE `TableMigration3.5` record into the lease table (only if absent) and over the
        coordinator-state table's (only if it is still PENDING), at once."""
        attributes = to_attribute_values(record)
        in_lease_table = {
            **attributes,
            LEASE_KEY: {"S": TABLE_MIGRATION_KEY},
            ENTITY_TYPE: {"S": TABLE_MIGRATION_ENTITY_TYPE},
        }
        over_pending = {
            "TableName": self.coordinator_state_table,
            "Item": {**attributes, **_state_key(TABLE_MIGRATION_KEY)},
            "ConditionExpression": "#status = :pending",
            "ExpressionAttributeNames": {"#status": STATUS},
            "ExpressionAttributeValues": {":pending": {"S": PENDING}},
        }
        items = [self._fence(owner), {"Put": self._put_if_absent(in_lease_table)}, {"Put": over_pending}]
        return not self._transact(items, owner, "writing COMPLETE")

    def _fence(self, owner: str) -> dict[str, Any]:
        return {
            "ConditionCheck": {
                "TableName": self.coordinator_state_table,
                "Key": _state_key(LEADER_KEY),
                "ConditionExpression": "#owner = :owner",
                "ExpressionAttributeNames": {"#owner": OWNER_NAME},
                "ExpressionAttributeValues": {":owner": {"S": owner}},
            }
        }

    def _put_over_record(self, key: str, record: Record) -> dict[str, Any]:
        attributes = {name: value for name, value in record.items() if name != COORDINATOR_STATE_KEY}
        entity_type = coordinator_state_entity_type(key)
        item = {**to_attribute_values(attributes), LEASE_KEY: {"S": key}, ENTITY_TYPE: {"S": entity_type}}
        return {
            "TableName": self.lease_table,
            "Item": item,
            # No item, a copy of the record, or one KCL's move left untagged (never a lease: it has
            # neither of a lease's own attributes, `codec.untagged_entity_type`).
            "ConditionExpression": "attribute_not_exists(#key) OR #entity = :entity OR (attribute_not_exists(#entity) "
            "AND attribute_not_exists(#counter) AND attribute_not_exists(#checkpoint))",
            "ExpressionAttributeNames": {
                "#key": LEASE_KEY,
                "#entity": ENTITY_TYPE,
                "#counter": LEASE_COUNTER,
                "#checkpoint": CHECKPOINT,
            },
            "ExpressionAttributeValues": {":entity": {"S": entity_type}},
        }

    def _delete_unchanged(self, key: str, record: Record) -> dict[str, Any]:
        compared = {VERSION: record[VERSION]} if VERSION in record else record
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        conditions: list[str] = []
        if VERSION not in record:  # it must still have none: a read-modify-write adds one
            names["#version"] = VERSION
            conditions.append("attribute_not_exists(#version)")
        for n, (name, value) in enumerate(sorted(compared.items())):
            names[f"#a{n}"] = name
            values[f":v{n}"] = to_attribute_values({name: value})[name]
            conditions.append(f"#a{n} = :v{n}")
        return {
            "TableName": self.coordinator_state_table,
            "Key": _state_key(key),
            "ConditionExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }

    def _put_if_absent(self, item: Item) -> dict[str, Any]:
        return {
            "TableName": self.lease_table,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(#key)",
            "ExpressionAttributeNames": {"#key": LEASE_KEY},
        }

    def _transact(self, items: list[dict[str, Any]], owner: str, what: str) -> list[str]:
        """Write `items` at once: no reasons when written, else each item's cancellation code ("None"
        for an item that met its condition). A fence that failed raises `LeadershipLostError`."""
        token = uuid.uuid4().hex  # a retry after a lost answer is the same transaction to DynamoDB

        def attempt() -> list[str]:
            try:
                self.client.transact_write_items(TransactItems=items, ClientRequestToken=token)
            except botocore.exceptions.ClientError as error:
                if error_code(error) != "TransactionCanceledException":
                    raise
                reasons = error.response.get("CancellationReasons") or [{"Code": "TransactionCanceled"}]
                return [str(reason.get("Code") or "None") for reason in reasons]
            return []

        reasons = self._caller.call("TransactWriteItems", partial(attempt))
        if reasons and reasons[0] == "ConditionalCheckFailed":
            raise LeadershipLostError(owner, f"the table migration ({what})")
        if reasons:
            logger.warning("table migration: %s was refused (%s)", what, reasons)
        return reasons


def _state_key(key: str) -> Item:
    return {COORDINATOR_STATE_KEY: {"S": key}}
