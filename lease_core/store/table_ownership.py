"""What makes an existing table the application's own lease, worker-metrics or coordinator-state table.

Administration acts only on what is the application's: table setup (`leasectl init`, the DAG's
`ensure_tables`) uses an existing table only when its key schema is the one its role needs, and
`leasectl teardown` deletes a table only when a sample of its items (one Scan page) are the role's
items too. A table name can collide with another application's table (`--app other-CoordinatorState`
names the lease table `other-CoordinatorState`) or with anything else in the account; such a table
is refused, named with what does not match, and left untouched, as are the application's others.

A KCL lease table is the application's lease table: KCL 2.x tables lack the owner index (setup adds
it), and in the single layout (docs/protocol.md §1.7) KCL 3.5 and this project keep worker metrics and
coordinator state in it, each item checked as the worker-metrics or coordinator-state item it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lease_core.errors import CorruptLeaseError
from lease_core.store.codec import (
    LEASE_ENTITY_TYPE,
    LEASE_KEY,
    LEGACY_COORDINATOR_STATE_KEYS,
    PROJECT_COORDINATOR_STATE_KEY_PREFIXES,
    PROJECT_COORDINATOR_STATE_KEYS,
    WORKER_METRIC_STATS_ENTITY_TYPE,
    AttributeValue,
    entity_type,
    lease_from_item,
)
from lease_core.store.dynamodb_store import OWNER_INDEX_NAME
from lease_core.store.lease_table_records import COORDINATOR_STATE_ENTITY_TYPES

ROLE_NAMES = {
    "lease": "lease table",
    "worker_metrics": "worker-metrics table",
    "coordinator_state": "coordinator-state table",
}
# Teardown reads this many items of each table (one Scan page) before it deletes any table.
SAMPLE_ITEMS = 25

OWNER_INDEX_KEYS = (("leaseOwner", "HASH"), ("leaseKey", "RANGE"))
# The WorkerMetricStats item's attributes and their types: KCL's `wid`, `lut`, `sts`, `opr` and our
# `round` (lease_core.metrics.worker_metrics; a unit test keeps the two in step).
WORKER_METRIC_ATTRIBUTES = {"wid": "S", "lut": "N", "sts": "M", "opr": "M", "round": "N"}
# What KCL writes besides (docs/protocol.md §5.1): `properties`, and in 3.5+ `sup`, `slu`, `entityType`.
KCL_WORKER_METRIC_ATTRIBUTES = {"properties": "M", "sup": "N", "slu": "N", "entityType": "S"}
# The coordinator-state records by key: KCL's (`Leader`, `Migration3.0`, `TableMigration3.5`) and ours.
COORDINATOR_STATE_KEYS = frozenset({*LEGACY_COORDINATOR_STATE_KEYS, *PROJECT_COORDINATOR_STATE_KEYS})
COORDINATOR_STATE_KEY_PREFIXES = PROJECT_COORDINATOR_STATE_KEY_PREFIXES


def schema_mismatch(role: str, hash_key: str, description: Mapping[str, Any]) -> str | None:
    """What in DescribeTable's `Table` is not the role's schema, or None when it is."""
    keys = _key_schema(description["KeySchema"])
    if keys != ((hash_key, "HASH"),):
        return f"its key schema is {_render(keys)}, not {_render(((hash_key, 'HASH'),))}"
    types = {entry["AttributeName"]: entry["AttributeType"] for entry in description.get("AttributeDefinitions", [])}
    if types.get(hash_key) != "S":
        return f"its hash key {hash_key!r} is of type {types.get(hash_key, '?')}, not S"
    if role != "lease":
        return None
    for index in description.get("GlobalSecondaryIndexes", []):
        if index["IndexName"] == OWNER_INDEX_NAME and _key_schema(index["KeySchema"]) != OWNER_INDEX_KEYS:
            return (
                f"its index {OWNER_INDEX_NAME} has the key schema {_render(_key_schema(index['KeySchema']))}, "
                f"not {_render(OWNER_INDEX_KEYS)}"
            )
    return None


def item_mismatch(role: str, item: Mapping[str, AttributeValue]) -> str | None:
    """Why an item is not one the role's table holds, or None when it is."""
    if role == "lease":
        return _lease_item_mismatch(item)
    if role == "worker_metrics":
        return _worker_metrics_item_mismatch(item)
    return _coordinator_state_item_mismatch(item)


def _lease_item_mismatch(item: Mapping[str, AttributeValue]) -> str | None:
    kind = entity_type(item)
    if kind == WORKER_METRIC_STATS_ENTITY_TYPE:
        return _worker_metrics_item_mismatch(_keyed_as(item, "wid"))
    if kind in COORDINATOR_STATE_ENTITY_TYPES:
        return _coordinator_state_item_mismatch(_keyed_as(item, "key"))
    if kind != LEASE_ENTITY_TYPE:
        return None  # an entity type of a KCL newer than this project: KCL's table, so the application's
    try:
        lease_from_item(item)
    except CorruptLeaseError as error:
        # A lease item with a bad attribute (the rounds' corrupt-lease alert) is still one: it has the
        # lease's own counter or checkpoint. An item with neither is someone else's.
        if not any(name in item for name in ("leaseCounter", "checkpoint")):
            return f"its item {error.lease_key!r} is not a lease: {error.problem}"
    return None


def _worker_metrics_item_mismatch(item: Mapping[str, AttributeValue]) -> str | None:
    for name, value in sorted(item.items()):
        expected = WORKER_METRIC_ATTRIBUTES.get(name) or KCL_WORKER_METRIC_ATTRIBUTES.get(name)
        found = next(iter(value), "?")
        if expected is None:
            problem = f"attribute {name!r} is not one of KCL's"
        elif found != expected:
            problem = f"attribute {name!r} is of type {found}, not {expected}"
        else:
            continue
        return f"its item {_string(item, 'wid')!r} is not a worker-metrics item: {problem}"
    return None


def _coordinator_state_item_mismatch(item: Mapping[str, AttributeValue]) -> str | None:
    key = _string(item, "key")
    if key in COORDINATOR_STATE_KEYS or key.startswith(COORDINATOR_STATE_KEY_PREFIXES):
        return None
    if _string(item, "entityType") == "STREAM" and "streamId" in item:
        return None  # KCL's stream-info record (docs/protocol.md §5.3), keyed by the stream

    return f"its item {key!r} is not a coordinator-state record (neither KCL's nor this library's)"


def _keyed_as(item: Mapping[str, AttributeValue], hash_key: str) -> dict[str, AttributeValue]:
    """A lease-table item of the single layout as its own table would hold it: keyed by `hash_key`."""
    keyed = {name: value for name, value in item.items() if name != LEASE_KEY}
    return {**keyed, hash_key: item[LEASE_KEY]} if LEASE_KEY in item else keyed


def _string(item: Mapping[str, AttributeValue], name: str) -> str:
    value = item.get(name) or {}
    return str(value.get("S", "?"))


def _key_schema(entries: Sequence[Mapping[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((entry["AttributeName"], entry["KeyType"]) for entry in entries)


def _render(keys: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name} ({kind})" for name, kind in keys)
