"""Which table layout an application's DynamoDB tables use (docs/protocol.md §1.7).

KCL 3.0-3.4 keep worker metrics and coordinator state in two tables of their own next to the lease
table (`separate`); KCL 3.5 keeps them in the lease table itself, each item tagged by `entityType`
(`single`), and makes that the default of a new application (`lease_table_layout`). An existing
application's layout is read from its tables, whatever the setting says: an application whose lease
table holds KCL 3.5 items of another entity type is `single`, one with either of the two separate
tables is `separate`, and one with both is refused, since reading one layout would miss what was
written to the other; except that, as in KCL 3.5, a lease table whose `TableMigration3.5` record says
COMPLETE is `single` whatever else exists (KCL's migration leaves the two old tables in place), and an
application whose coordinator-state table holds a `TableMigration3.5` record short of COMPLETE is
`separate` while its records move to the lease table (§1.8: reads look in both tables). Only
an application whose tables show neither gets the configured layout, and setup records it (`TableLayout`)
so that every process, whatever its own setting, follows the first setup's choice.

`decide_layout` is pure (an item's entity type is `codec.entity_type`); `detect_layout` does the DynamoDB reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, TypeAlias

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.errors import LayoutConflictError
from lease_core.retry import RetryPolicy
from lease_core.store.codec import ENTITY_TYPE, LEASE_ENTITY_TYPE, LEASE_KEY, entity_type
from lease_core.store.coordinator_state import KEY as COORDINATOR_STATE_KEY
from lease_core.store.record_table import RecordTable, text
from lease_core.store.table_migration import COMPLETE as MIGRATION_COMPLETE
from lease_core.store.table_migration import STATUS as TABLE_MIGRATION_STATUS
from lease_core.store.table_migration import TABLE_MIGRATION_KEY, reads_both_tables

TableLayoutName: TypeAlias = Literal["separate", "single"]
SEPARATE: TableLayoutName = "separate"
SINGLE: TableLayoutName = "single"
# The layout a new application's setup chose (docs/protocol.md §1.7), a coordinator-state record in the
# lease table: `layout` = single for good, or separate while setup creates the two separate tables.
LAYOUT_RECORD_KEY = "TableLayout"
LAYOUT_ATTRIBUTE = "layout"
# The coordinator-state keys a single-layout lease table comes to hold: the layout setup recorded, this
# project's round counter (after its first assignment), the leader lock (while a leader holds it), KCL
# 3.5's table migration.
PROBED_KEYS = (LAYOUT_RECORD_KEY, "AssignmentRound", "Leader", TABLE_MIGRATION_KEY)


@dataclass(frozen=True)
class TablesFound:
    """What the layout is decided from: which tables exist and whether the lease table holds items
    of KCL 3.5's other entity types."""

    lease_table: bool
    worker_metrics_table: bool
    coordinator_state_table: bool
    non_lease_items: bool
    # The lease table's `TableMigration3.5` says COMPLETE: KCL 3.5 migrated the application to one
    # table, and keeps (never deletes) the two tables it used before.
    migration_complete: bool = False
    # The lease table's `TableLayout` record says `separate`: a setup is creating the separate tables.
    separate_setup_under_way: bool = False
    # The coordinator-state table's `TableMigration3.5` status: a migration was started there.
    separate_table_migration: str | None = None


@dataclass(frozen=True)
class LayoutDecision:
    layout: TableLayoutName
    reason: str
    # The tables showed no layout: `lease_table_layout` decided, and setup has yet to record it.
    from_setting: bool = False
    # A setup recorded `separate` and has yet to finish creating the separate tables.
    separate_setup_under_way: bool = False
    # The status of a table migration under way, short of COMPLETE (`TableMigration3.5` in the
    # coordinator-state table).
    table_migration: str | None = None


def decide_layout(
    found: TablesFound, lease_table: str, separate_tables: tuple[str, str], configured: TableLayoutName
) -> LayoutDecision:
    """The application's layout from what its tables hold, `configured` when they show none; raises
    LayoutConflictError when they hold both."""
    exists = (found.worker_metrics_table, found.coordinator_state_table)
    separate_found = [name for name, found_it in zip(separate_tables, exists, strict=True) if found_it]
    if found.migration_complete:  # KCL 3.5's own rule: one table, whatever else is left
        left = f"; {', '.join(repr(name) for name in separate_found)} left from before it" if separate_found else ""
        return LayoutDecision(SINGLE, f"KCL 3.5's table migration is complete in {lease_table!r}{left}")
    migration = found.separate_table_migration if found.coordinator_state_table else None
    tables = ", ".join(repr(name) for name in separate_found)
    if reads_both_tables(migration):  # from DEPLOYED on, the lease table holds records of the migration
        reason = f"table(s) {tables} exist; KCL 3.5's table migration: {migration}"
        return LayoutDecision(SEPARATE, reason, table_migration=migration)
    if found.separate_setup_under_way and not found.non_lease_items:
        reason = f"lease table {lease_table!r} records the separate layout its setup chose"
        return LayoutDecision(SEPARATE, reason, separate_setup_under_way=True)
    if found.non_lease_items and separate_found:
        raise LayoutConflictError(lease_table, tuple(separate_found))
    if found.non_lease_items:
        return LayoutDecision(SINGLE, f"lease table {lease_table!r} holds worker metrics or coordinator state")
    if separate_found:
        return LayoutDecision(SEPARATE, f"table(s) {tables} exist", table_migration=migration)
    if found.lease_table:
        # A lease table with nothing but leases: KCL 2.x, or KCL 3.5 before its first worker reported.
        return LayoutDecision(
            configured, f"lease table {lease_table!r} holds only leases: lease_table_layout", from_setting=True
        )
    return LayoutDecision(configured, "a new application: lease_table_layout", from_setting=True)


def detect_layout(
    client: Any,
    lease_table: str,
    separate_tables: tuple[str, str],
    configured: TableLayoutName,
    retry_policy: RetryPolicy | None = None,
) -> LayoutDecision:
    """Read which tables exist and whether the lease table holds non-lease items, then decide.

    The lease table is first probed at the coordinator-state keys every single-layout application
    comes to hold (`PROBED_KEYS`): a few reads, so that every process of a round can afford them.
    Only when none is there and no separate table exists either is the lease table scanned (up to
    the first non-lease item): then nothing else can tell a KCL 3.5 application whose lock is
    released and whose workers wrote only metrics from a lease table of nothing but leases. Next to a
    separate table a lease table is not scanned, so a conflict is found only through those keys.
    """
    caller = AwsCaller("dynamodb", retry_policy or RetryPolicy())
    worker_metrics_table, coordinator_state_table = separate_tables
    lease_table_exists = _exists(client, caller, lease_table)
    worker_metrics_exists = _exists(client, caller, worker_metrics_table)
    coordinator_state_exists = _exists(client, caller, coordinator_state_table)
    probed = _probed_items(client, caller, lease_table) if lease_table_exists else {}
    recorded = probed.get(LAYOUT_RECORD_KEY, {}).get(LAYOUT_ATTRIBUTE, {}).get("S")
    separate_setup_under_way = recorded == SEPARATE
    non_lease_items = any(key != LAYOUT_RECORD_KEY or not separate_setup_under_way for key in probed)
    if lease_table_exists and not probed and not (worker_metrics_exists or coordinator_state_exists):
        non_lease_items = _holds_non_lease_items(client, caller, lease_table)
    migration = probed.get(TABLE_MIGRATION_KEY, {}).get(TABLE_MIGRATION_STATUS, {}).get("S")
    separate_migration = (
        _separate_table_migration(client, caller, coordinator_state_table) if coordinator_state_exists else None
    )
    found = TablesFound(
        lease_table_exists,
        worker_metrics_exists,
        coordinator_state_exists,
        non_lease_items,
        MIGRATION_COMPLETE in (migration, separate_migration),
        separate_setup_under_way,
        separate_migration,
    )
    return decide_layout(found, lease_table, separate_tables, configured)


_PROBED_NAMES = {
    "#key": LEASE_KEY,
    "#entity": ENTITY_TYPE,
    "#migration": TABLE_MIGRATION_STATUS,
    "#layout": LAYOUT_ATTRIBUTE,
}


def _probed_items(client: Any, caller: AwsCaller, table_name: str) -> dict[str, dict[str, Any]]:
    """The non-lease items of the lease table at `PROBED_KEYS`, by key (strongly consistent reads)."""
    found = {}
    for key in PROBED_KEYS:
        response = caller.call(
            "GetItem",
            partial(
                client.get_item,
                TableName=table_name,
                Key={LEASE_KEY: {"S": key}},
                ProjectionExpression="#key, #entity, #migration, #layout",
                ExpressionAttributeNames=_PROBED_NAMES,
                ConsistentRead=True,
            ),
            table_name,
        )
        item = response.get("Item")
        if item is not None and entity_type(item) != LEASE_ENTITY_TYPE:
            found[key] = item
    return found


def _separate_table_migration(client: Any, caller: AwsCaller, table_name: str) -> str | None:
    """The status of KCL 3.5's table migration as the coordinator-state table records it, or None."""
    response = caller.call(
        "GetItem",
        partial(
            client.get_item,
            TableName=table_name,
            Key={COORDINATOR_STATE_KEY: {"S": TABLE_MIGRATION_KEY}},
            ProjectionExpression="#migration",
            ExpressionAttributeNames={"#migration": TABLE_MIGRATION_STATUS},
            ConsistentRead=True,
        ),
        table_name,
    )
    status = response.get("Item", {}).get(TABLE_MIGRATION_STATUS, {}).get("S")
    return None if status is None else str(status)


def _exists(client: Any, caller: AwsCaller, table_name: str) -> bool:
    def describe() -> bool:
        try:
            client.describe_table(TableName=table_name)
        except botocore.exceptions.ClientError as error:
            if error_code(error) == "ResourceNotFoundException":
                return False
            raise
        return True

    return caller.call("DescribeTable", describe)


def _holds_non_lease_items(client: Any, caller: AwsCaller, table_name: str) -> bool:
    """Whether any item is not a lease: scans keys and entity types only, and stops at the first found."""
    arguments: dict[str, Any] = {
        "TableName": table_name,
        "ProjectionExpression": "#key, #entity",
        "ExpressionAttributeNames": {"#key": LEASE_KEY, "#entity": ENTITY_TYPE},
        "ConsistentRead": True,
    }
    while True:
        page = caller.call("Scan", partial(client.scan, **arguments), table_name)
        if any(entity_type(item) != LEASE_ENTITY_TYPE for item in page.get("Items", [])):
            return True
        if "LastEvaluatedKey" not in page:
            return False
        arguments["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def table_migration_status(state: RecordTable) -> str | None:
    """KCL 3.5's table-migration status (the `tm` of its `TableMigration3.5` record, e.g.
    `TABLE_MIGRATION_STATUS_COMPLETE`), or None when no migration was started."""
    record = state.get(TABLE_MIGRATION_KEY)
    return None if record is None else text(record, TABLE_MIGRATION_STATUS, "?")


# What `leasectl status` and the monitoring page show instead of a layout when the tables hold both.
CONFLICT = "conflict"


def layout_document(decision: LayoutDecision, table_migration: str | None) -> dict[str, Any]:
    """The layout as `leasectl status --json` and the monitoring page show it."""
    return {"layout": decision.layout, "reason": decision.reason, "table_migration": table_migration}


def conflict_document(conflict: LayoutConflictError) -> dict[str, Any]:
    """Tables holding both layouts, as status and the monitoring page show them: what was found where,
    so that an operator can delete the tables of the layout the application no longer uses."""
    return {
        "layout": CONFLICT,
        "reason": str(conflict),
        "table_migration": None,
        "lease_table": conflict.lease_table,
        "separate_tables": list(conflict.separate_tables),
    }
