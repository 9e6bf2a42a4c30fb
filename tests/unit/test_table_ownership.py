"""Telling the application's own tables and items from anything else under the same names."""

from __future__ import annotations

import pytest

from lease_core.leader import assignment_round, leader_lock, round_history
from lease_core.metrics.worker_metrics import WorkerMetricStats
from lease_core.model.lease import Lease
from lease_core.retrieval.fanout import stream_consumers
from lease_core.store import load_probes, table_layout
from lease_core.store.codec import lease_to_item
from lease_core.store.record_table import to_attribute_values
from lease_core.store.table_ownership import (
    COORDINATOR_STATE_KEY_PREFIXES,
    COORDINATOR_STATE_KEYS,
    WORKER_METRIC_ATTRIBUTES,
    item_mismatch,
    schema_mismatch,
)
from lease_core.sync import audit, consumed_stream, garbage_probe, stream_tracking


def table(hash_key: str, key_type: str = "S", indexes=(), range_key: str | None = None) -> dict:
    keys = [{"AttributeName": hash_key, "KeyType": "HASH"}]
    if range_key is not None:
        keys.append({"AttributeName": range_key, "KeyType": "RANGE"})
    return {
        "KeySchema": keys,
        "AttributeDefinitions": [{"AttributeName": hash_key, "AttributeType": key_type}],
        "GlobalSecondaryIndexes": list(indexes),
    }


def owner_index(*keys: tuple[str, str]) -> dict:
    return {
        "IndexName": "LeaseOwnerToLeaseKeyIndex",
        "KeySchema": [{"AttributeName": name, "KeyType": kind} for name, kind in keys],
    }


@pytest.mark.parametrize(
    ("role", "hash_key", "description", "mismatch"),
    [
        pytest.param("lease", "leaseKey", table("leaseKey"), None, id="kcl-2x-lease-table-without-index"),
        pytest.param(
            "lease",
            "leaseKey",
            table("leaseKey", indexes=[owner_index(("leaseOwner", "HASH"), ("leaseKey", "RANGE"))]),
            None,
            id="kcl-3x-lease-table",
        ),
        pytest.param("worker_metrics", "wid", table("wid"), None, id="worker-metrics"),
        pytest.param("coordinator_state", "key", table("key"), None, id="coordinator-state"),
        pytest.param(
            "lease", "leaseKey", table("id"), "its key schema is id (HASH), not leaseKey (HASH)", id="other-hash-key"
        ),
        pytest.param(
            "lease",
            "leaseKey",
            table("key"),
            "its key schema is key (HASH), not leaseKey (HASH)",
            id="another-applications-coordinator-state",
        ),
        pytest.param(
            "coordinator_state",
            "key",
            table("key", range_key="version"),
            "its key schema is key (HASH), version (RANGE), not key (HASH)",
            id="range-key",
        ),
        pytest.param("worker_metrics", "wid", table("wid", "N"), "its hash key 'wid' is of type N, not S", id="type"),
        pytest.param(
            "lease",
            "leaseKey",
            table("leaseKey", indexes=[owner_index(("leaseOwner", "HASH"))]),
            "its index LeaseOwnerToLeaseKeyIndex has the key schema leaseOwner (HASH), "
            "not leaseOwner (HASH), leaseKey (RANGE)",
            id="owner-index-of-another-shape",
        ),
    ],
)
def test_a_table_is_the_roles_only_with_the_roles_key_schema(role, hash_key, description, mismatch):
    assert schema_mismatch(role, hash_key, description) == mismatch


LEASE = lease_to_item(Lease("shardId-000000000000"))
WORKER = to_attribute_values(WorkerMetricStats("app-worker-0", 1_700_000_000, {"C": (50.0,)}, round=3).to_item())


@pytest.mark.parametrize(
    ("role", "item", "mismatch"),
    [
        pytest.param("lease", LEASE, None, id="lease"),
        pytest.param(
            "lease", {"leaseKey": {"S": "x"}, "entityType": {"S": "WORKER_METRICS"}}, None, id="kcl-3.5-other-entity"
        ),
        pytest.param(
            "lease",
            {"leaseKey": {"S": "order-1"}, "total": {"N": "3"}},
            "its item 'order-1' is not a lease: attribute 'leaseCounter' is missing",
            id="not-a-lease",
        ),
        pytest.param("worker_metrics", WORKER, None, id="worker-metrics"),
        pytest.param("worker_metrics", {"wid": {"S": "w"}}, None, id="worker-metrics-bare"),
        pytest.param(
            "worker_metrics",
            {"wid": {"S": "w"}, "email": {"S": "a@b"}},
            "its item 'w' is not a worker-metrics item: attribute 'email' is not one of KCL's",
            id="unknown-attribute",
        ),
        pytest.param(
            "worker_metrics",
            {"wid": {"S": "w"}, "lut": {"S": "yesterday"}},
            "its item 'w' is not a worker-metrics item: attribute 'lut' is of type S, not N",
            id="attribute-of-another-type",
        ),
        pytest.param("coordinator_state", {"key": {"S": "Leader"}, "ownerName": {"S": "kcl"}}, None, id="kcl-lock"),
        pytest.param("coordinator_state", {"key": {"S": "Migration3.0"}}, None, id="kcl-migration"),
        pytest.param("coordinator_state", {"key": {"S": "ShardSyncAuditor:orders"}}, None, id="auditor-record"),
        pytest.param(
            "coordinator_state",
            {"key": {"S": "feature-flags"}},
            "its item 'feature-flags' is not a coordinator-state record (neither KCL's nor this library's)",
            id="foreign-record",
        ),
    ],
)
def test_an_item_is_the_roles_only_when_it_decodes_as_one(role, item, mismatch):
    assert item_mismatch(role, item) == mismatch


@pytest.mark.parametrize(
    ("role", "item"),
    [
        pytest.param(
            "lease",
            {
                "leaseKey": {"S": "shardId-1"},
                "leaseCounter": {"N": "3"},
                "checkpoint": {"S": "LATEST"},
                "throughputKBps": {"S": "x"},
            },
            id="our-own-corrupt-lease",
        ),
        pytest.param(
            "worker_metrics",
            {
                "wid": {"S": "w"},
                "lut": {"N": "1"},
                "properties": {"M": {}},
                "sup": {"N": "1"},
                "slu": {"N": "1"},
                "entityType": {"S": "WORKER_METRIC_STATS"},
            },
            id="kcl-3.5-worker-metrics",
        ),
        pytest.param(
            "coordinator_state", {"key": {"S": "TableMigration3.5"}, "tm": {"S": "DONE"}}, id="kcl-table-migration"
        ),
        pytest.param(
            "coordinator_state",
            {"key": {"S": "123:orders:1"}, "entityType": {"S": "STREAM"}, "streamId": {"S": "123:orders:1"}},
            id="kcl-stream-info",
        ),
    ],
)
def test_items_kcl_or_this_library_write_are_the_roles_own(role, item):
    assert item_mismatch(role, item) is None


def test_the_worker_metrics_shape_is_the_one_the_worker_metrics_store_writes():
    assert {name: next(iter(value)) for name, value in WORKER.items()} == WORKER_METRIC_ATTRIBUTES


@pytest.mark.parametrize(
    "key",
    [
        leader_lock.LEADER_KEY,
        table_layout.LAYOUT_RECORD_KEY,
        leader_lock.OBSERVATION_KEY,
        assignment_round.ROUND_KEY,
        round_history.HISTORY_KEY,
        round_history.LAST_ROUND_KEY,
        consumed_stream.RECORD_KEY,
        stream_tracking.FORMER_STREAMS_KEY,
        load_probes.LOAD_PROBES_KEY,
        audit.RECORD_KEY_PREFIX + "orders",
        garbage_probe.RECORD_KEY_PREFIX + "orders",
        stream_consumers.RECORD_KEY_PREFIX + "orders",
    ],
)
def test_every_record_the_library_keeps_in_coordinator_state_is_known_as_its_own(key):
    assert key in COORDINATOR_STATE_KEYS or key.startswith(COORDINATOR_STATE_KEY_PREFIXES)
