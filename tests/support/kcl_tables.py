"""An application's tables written item by item as KCL 3.5 writes them (docs/protocol.md §1.6-1.7, §5):
a lease created by shard sync, a worker's metrics, the leader lock held by a KCL worker and a
completed table migration, each tagged by `entityType` in the single layout's lease table."""

from __future__ import annotations

from typing import Any

from lease_core.store.codec import Item

LEASE: Item = {
    "leaseKey": {"S": "shardId-000000000008"},
    "leaseCounter": {"N": "0"},
    "ownerSwitchesSinceCheckpoint": {"N": "0"},
    "checkpoint": {"S": "LATEST"},
    "checkpointSubSequenceNumber": {"N": "0"},
    "parentShardId": {"SS": ["shardId-000000000006", "shardId-000000000007"]},
    "startingHashKey": {"S": "0"},
    "endingHashKey": {"S": "399"},
    "entityType": {"S": "LEASE"},
}
WORKER_METRIC_STATS: Item = {
    "leaseKey": {"S": "worker-1"},
    "lut": {"N": "1700000000"},
    "sts": {"M": {"C": {"L": [{"N": "12.5"}, {"N": "-1"}]}}},
    "opr": {"M": {"C": {"L": [{"N": "100"}]}}},
    "sup": {"N": "1"},
    "slu": {"N": "1700000000"},
    "entityType": {"S": "WORKER_METRIC_STATS"},
}
LEADER_LOCK: Item = {
    "leaseKey": {"S": "Leader"},
    "ownerName": {"S": "worker-1"},
    "leaseDuration": {"S": "120000"},
    "recordVersionNumber": {"S": "5b9c8e4e-0a51-4a0e-9d55-2b1f6f1b6f35"},
    "entityType": {"S": "LEADER"},
}
TABLE_MIGRATION: Item = {
    "leaseKey": {"S": "TableMigration3.5"},
    "tm": {"S": "TABLE_MIGRATION_STATUS_COMPLETE"},
    "mb": {"S": "worker-1"},
    "mts": {"N": "1700000000000"},
    "entityType": {"S": "TABLE_MIGRATION"},
}


def kcl_lease_table(client: Any, table_name: str, *items: Item) -> None:
    """The lease table as KCL creates it (hash key `leaseKey`), filled item by item."""
    client.create_table(
        TableName=table_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for item in items:
        client.put_item(TableName=table_name, Item=item)


def kcl_separate_table(client: Any, table_name: str, hash_key: str, item: Item) -> None:
    client.create_table(
        TableName=table_name,
        KeySchema=[{"AttributeName": hash_key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": hash_key, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.put_item(TableName=table_name, Item=item)
