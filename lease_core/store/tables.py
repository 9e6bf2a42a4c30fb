"""The DynamoDB tables of an application, as KCL lays them out (docs/protocol.md §1.4, §1.7, §5).

- the lease table: hash key `leaseKey` (S) and the GSI `LeaseOwnerToLeaseKeyIndex`
  (`leaseOwner` HASH, `leaseKey` RANGE, KEYS_ONLY);
- in the `separate` layout (KCL 3.0-3.4) also `<app>-WorkerMetricStats`: hash key `wid` (S), and
  `<app>-CoordinatorState`: hash key `key` (S). In the `single` layout (KCL 3.5) their items live in
  the lease table, and setup creates only it.

Creation is idempotent and safe under concurrent creators: an existing table is kept, losing a
creation race counts as success, and every caller waits for ACTIVE. A new application's layout is
recorded at setup in the lease table's `TableLayout` record, written only if absent, so that
concurrent setups with different `lease_table_layout` settings all end with the first one's layout
(docs/protocol.md §1.7). Billing mode, deletion
protection, point-in-time recovery and tags apply to all three tables alike.

Setup and teardown act only on tables that are the application's own (`table_ownership`): every
existing table is checked before any is created, changed or deleted, so a refusal leaves all as
they were.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import ForeignTableError, TableNotReadyError, TableProtectedError
from lease_core.retry import RetryPolicy
from lease_core.store.codec import LEASE_KEY
from lease_core.store.dynamodb_store import OWNER_INDEX_NAME
from lease_core.store.lease_table_records import LeaseTableRecords, coordinator_state_records
from lease_core.store.record_table import DynamoDBRecordTable
from lease_core.store.table_layout import (
    LAYOUT_ATTRIBUTE,
    LAYOUT_RECORD_KEY,
    SEPARATE,
    SINGLE,
    LayoutDecision,
    TableLayoutName,
    detect_layout,
)
from lease_core.store.table_ownership import ROLE_NAMES, SAMPLE_ITEMS, item_mismatch, schema_mismatch

READY_STATUSES = frozenset({"ACTIVE", "UPDATING"})
SETUP = "table setup"
# The `TableLayout` record's token of the setup that wrote it: only that setup withdraws it.
SETUP_TOKEN_ATTRIBUTE = "setupToken"
TEARDOWN = "teardown"


@dataclass(frozen=True)
class TableLayout:
    """What one table looks like: its name, hash key and whether it carries the owner index."""

    role: str
    name: str
    hash_key: str
    owner_index: bool = False


@dataclass(frozen=True)
class TableReport:
    role: str
    name: str
    created: bool
    status: str


def application_tables(config: ConsumerConfig) -> tuple[TableLayout, ...]:
    return (
        TableLayout("lease", config.lease_table, "leaseKey", owner_index=True),
        TableLayout("worker_metrics", config.worker_metrics_table, "wid"),
        TableLayout("coordinator_state", config.coordinator_state_table, "key"),
    )


class TableAdministrator:
    """Creates, waits for and deletes an application's tables."""

    def __init__(
        self,
        client: Any,
        config: ConsumerConfig,
        retry_policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.config = config
        self._retry_policy = retry_policy or RetryPolicy()
        self._caller = AwsCaller("dynamodb", self._retry_policy)
        self._sleep = sleep
        self._monotonic = monotonic

    # --- reading state ----------------------------------------------------------------------

    def describe(self, table_name: str) -> dict[str, Any] | None:
        """DescribeTable's `Table`, or None when the table does not exist."""

        def call() -> dict[str, Any] | None:
            try:
                table: dict[str, Any] = self.client.describe_table(TableName=table_name)["Table"]
                return table
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    return None
                raise

        return self._caller.call("DescribeTable", call)

    def verify_tables(self, operation: str, items: bool = False) -> dict[str, dict[str, Any]]:
        """The descriptions of the application's existing tables, by name, once each is found to be
        the application's own: its key schema (and with `items`, a sample of its items) is its role's.
        Raises ForeignTableError naming the first table that is not, for `operation`."""
        existing = {}
        for layout in application_tables(self.config):
            description = self.describe(layout.name)
            if description is None:
                continue
            mismatch = schema_mismatch(layout.role, layout.hash_key, description)
            if mismatch is None and items:
                mismatch = self._items_mismatch(layout)
            if mismatch is not None:
                raise ForeignTableError(layout.name, ROLE_NAMES[layout.role], mismatch, operation)
            existing[layout.name] = description
        return existing

    def _items_mismatch(self, layout: TableLayout) -> str | None:
        """Why an item of the first page of a scan is not the role's, or None: a sample is enough to
        tell the role's items from anything else's (an empty table with the role's schema is the role's)."""
        response = self._caller.call(
            "Scan", lambda: self.client.scan(TableName=layout.name, Limit=SAMPLE_ITEMS, ConsistentRead=True)
        )
        mismatches = (item_mismatch(layout.role, item) for item in response.get("Items", []))
        return next((mismatch for mismatch in mismatches if mismatch is not None), None)

    # --- creating ---------------------------------------------------------------------------

    def layout(self) -> LayoutDecision:
        """The application's table layout, read from its tables (`table_layout`)."""
        separate_tables = (self.config.worker_metrics_table, self.config.coordinator_state_table)
        return detect_layout(
            self.client, self.config.lease_table, separate_tables, self.config.lease_table_layout, self._retry_policy
        )

    def ensure_tables(self) -> list[TableReport]:
        """Create whatever the application's layout lacks, add a missing owner index, and wait until all
        are ready; a layout the tables do not show yet is recorded first (`_record_layout`). An existing
        table of another schema, or tables of both layouts, are refused before anything is created or
        changed."""
        existing = self.verify_tables(SETUP)
        decision = self.layout()
        lease_table, *separate_tables = application_tables(self.config)
        reports = [self._ensure(lease_table, existing)]
        if decision.from_setting:
            decision = self._record_layout(decision.layout)
        if decision.layout == SINGLE:
            return reports
        reports += [self._ensure(layout, existing) for layout in separate_tables]
        if decision.separate_setup_under_way:
            # The separate tables are ready: from now on they mark the layout, and the lease table holds
            # nothing but leases, as KCL 3.0-3.4 expect.
            self._lease_table_records().delete(LAYOUT_RECORD_KEY, expected={LAYOUT_ATTRIBUTE: SEPARATE})
        return reports

    def _ensure(self, layout: TableLayout, existing: Collection[str]) -> TableReport:
        created = layout.name not in existing and self._create(layout)
        description = self._wait_until_ready(layout)
        if layout.owner_index and not _has_owner_index(description):
            self._add_owner_index(layout, description)
            description = self._wait_until_ready(layout)
        if self.config.lease_table_pitr_enabled:
            self._enable_pitr(layout.name)
        return TableReport(layout.role, layout.name, created, description["TableStatus"])

    def _record_layout(self, configured: TableLayoutName) -> LayoutDecision:
        """Record the layout of an application whose tables show none, unless another setup recorded one
        first, and return the layout every process now reads from the tables.

        The record is written only if absent, so of concurrent setups the first write wins and the others
        follow it. `separate` stays recorded until its tables are ready. A setup that found the
        application new before this one recorded `single` may have created the separate tables and
        removed its record already: its tables came first, so this record is withdrawn.
        """
        records = self._lease_table_records()
        token = str(uuid.uuid4())
        record = {LAYOUT_ATTRIBUTE: configured, SETUP_TOKEN_ATTRIBUTE: token}
        written = records.put(LAYOUT_RECORD_KEY, record, expected={records.hash_key: None})
        # A retried put whose first answer was lost finds its own record: it was written all the same.
        written = written or (records.get(LAYOUT_RECORD_KEY) or {}).get(SETUP_TOKEN_ATTRIBUTE) == token
        if written and configured == SINGLE and self._separate_tables_exist():
            records.delete(LAYOUT_RECORD_KEY, expected={SETUP_TOKEN_ATTRIBUTE: token})
        return self.layout()

    def _lease_table_records(self) -> LeaseTableRecords:
        table = DynamoDBRecordTable(self.client, self.config.lease_table, LEASE_KEY, self._retry_policy)
        return coordinator_state_records(table)

    def _separate_tables_exist(self) -> bool:
        names = (self.config.worker_metrics_table, self.config.coordinator_state_table)
        return any(self.describe(name) is not None for name in names)

    def _create(self, layout: TableLayout) -> bool:
        def create() -> bool:
            try:
                self.client.create_table(**self.create_table_arguments(layout))
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceInUseException":
                    return False  # another creator won the race; its table is as good as ours
                raise
            return True

        return self._caller.call("CreateTable", create)

    def create_table_arguments(self, layout: TableLayout) -> dict[str, Any]:
        attributes = [{"AttributeName": layout.hash_key, "AttributeType": "S"}]
        arguments: dict[str, Any] = {
            "TableName": layout.name,
            "KeySchema": [{"AttributeName": layout.hash_key, "KeyType": "HASH"}],
            "AttributeDefinitions": attributes,
            "DeletionProtectionEnabled": self.config.lease_table_deletion_protection_enabled,
            **self._billing(),
        }
        if layout.owner_index:
            attributes.append({"AttributeName": "leaseOwner", "AttributeType": "S"})
            arguments["GlobalSecondaryIndexes"] = [self._owner_index(self._capacity())]
        if self.config.tags:
            arguments["Tags"] = [{"Key": key, "Value": value} for key, value in sorted(dict(self.config.tags).items())]
        return arguments

    def _capacity(self) -> dict[str, int] | None:
        if self.config.billing_mode != "PROVISIONED":
            return None
        return {
            "ReadCapacityUnits": self.config.initial_lease_table_read_capacity,
            "WriteCapacityUnits": self.config.initial_lease_table_write_capacity,
        }

    def _billing(self) -> dict[str, Any]:
        capacity = self._capacity()
        if capacity is None:
            return {"BillingMode": "PAY_PER_REQUEST"}
        return {"BillingMode": "PROVISIONED", "ProvisionedThroughput": capacity}

    @staticmethod
    def _owner_index(capacity: dict[str, int] | None) -> dict[str, Any]:
        index: dict[str, Any] = {
            "IndexName": OWNER_INDEX_NAME,
            "KeySchema": [
                {"AttributeName": "leaseOwner", "KeyType": "HASH"},
                {"AttributeName": "leaseKey", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
        if capacity is not None:
            index["ProvisionedThroughput"] = capacity
        return index

    def _add_owner_index(self, layout: TableLayout, description: dict[str, Any]) -> None:
        """A KCL 2.x lease table has no owner index: add it, with the table's capacity if provisioned."""
        throughput = description.get("ProvisionedThroughput") or {}
        provisioned = description.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED") == "PROVISIONED"
        capacity = (
            {key: throughput[key] for key in ("ReadCapacityUnits", "WriteCapacityUnits")}
            if provisioned and throughput.get("ReadCapacityUnits")
            else None
        )

        def update() -> None:
            try:
                self.client.update_table(
                    TableName=layout.name,
                    AttributeDefinitions=[
                        {"AttributeName": "leaseKey", "AttributeType": "S"},
                        {"AttributeName": "leaseOwner", "AttributeType": "S"},
                    ],
                    GlobalSecondaryIndexUpdates=[{"Create": self._owner_index(capacity)}],
                )
            except botocore.exceptions.ClientError as error:
                message = error.response.get("Error", {}).get("Message", "")
                if error_code(error) != "ResourceInUseException" and "already exists" not in message:
                    raise
                # Another creator is adding the same index; waiting for it covers both cases.

        self._caller.call("UpdateTable", update)

    def _enable_pitr(self, table_name: str) -> None:
        self._caller.call(
            "UpdateContinuousBackups",
            lambda: self.client.update_continuous_backups(
                TableName=table_name,
                PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
            ),
        )

    def _wait_until_ready(self, layout: TableLayout) -> dict[str, Any]:
        """Poll until the table is ACTIVE/UPDATING and its owner index (if any) ACTIVE (§1.4)."""
        started = self._monotonic()
        while True:
            description = self.describe(layout.name)
            status = "MISSING" if description is None else _readiness(description, layout)
            if status == "READY":
                assert description is not None
                return description
            waited = self._monotonic() - started
            if waited >= self.config.table_creation_timeout_seconds:
                raise TableNotReadyError(layout.name, status, waited)
            self._sleep(self.config.table_status_poll_seconds)

    # --- deleting ---------------------------------------------------------------------------

    def delete_tables(
        self, roles: Collection[str] | None = None, before_delete: Callable[[], None] = lambda: None
    ) -> list[str]:
        """Delete the application's tables (those of `roles` only, when given); returns the names that
        existed. Every existing table of the application, of any role, must be its own (schema and
        items) and none of those to delete protected, else nothing is deleted. `before_delete` runs
        before each DeleteTable call (a caller holding the leader lock checks it is still held)."""
        descriptions = self.verify_tables(TEARDOWN, items=True)
        existing = [
            layout.name
            for layout in application_tables(self.config)
            if layout.name in descriptions and (roles is None or layout.role in roles)
        ]
        for name in existing:
            if descriptions[name].get("DeletionProtectionEnabled"):
                raise TableProtectedError(name)
        for name in existing:
            before_delete()
            self._delete(name)
        for name in existing:
            self._wait_until_deleted(name)
        return existing

    def _delete(self, table_name: str) -> None:
        def delete() -> None:
            try:
                self.client.delete_table(TableName=table_name)
            except botocore.exceptions.ClientError as error:
                if error_code(error) != "ResourceNotFoundException":
                    raise

        self._caller.call("DeleteTable", delete)

    def _wait_until_deleted(self, table_name: str) -> None:
        started = self._monotonic()
        while (description := self.describe(table_name)) is not None:
            waited = self._monotonic() - started
            if waited >= self.config.table_creation_timeout_seconds:
                raise TableNotReadyError(table_name, description.get("TableStatus", "?"), waited)
            self._sleep(self.config.table_status_poll_seconds)


def _has_owner_index(description: dict[str, Any]) -> bool:
    return any(index["IndexName"] == OWNER_INDEX_NAME for index in description.get("GlobalSecondaryIndexes", []))


def _readiness(description: dict[str, Any], layout: TableLayout) -> str:
    """READY, or the status that is still being waited for."""
    if description["TableStatus"] not in READY_STATUSES:
        return str(description["TableStatus"])
    for index in description.get("GlobalSecondaryIndexes", []):
        if layout.owner_index and index["IndexName"] == OWNER_INDEX_NAME and index.get("IndexStatus") != "ACTIVE":
            return f"index {OWNER_INDEX_NAME} {index.get('IndexStatus')}"
    return "READY"
