"""Streams on kinesis-mock for tests: create, reshard for real, write records, build the seed lineage.

Every reshard helper waits until the stream is ACTIVE again, because kinesis-mock (like Kinesis)
refuses the next reshard with ResourceInUseException while the stream is UPDATING.
"""

from __future__ import annotations

import time
from typing import Any

import boto3

from lease_core.model.shards import Shard
from lease_core.retrieval.shard_source import child_shards_of

ACTIVE_TIMEOUT_SECONDS = 10.0
PUT_RECORDS_LIMIT = 500

# The lineage of the seed issue, by seed name: child -> its parents (merges list ShardToMerge first).
SEED_LINEAGE_PARENTS: dict[int, tuple[int, ...]] = {6: (0, 1), 7: (2, 3), 8: (6, 7), 9: (5,), 10: (5,)}
SEED_OPEN_SHARDS = (4, 8, 9, 10)


def kinesis_client(endpoint: str, account_id: str | None = None) -> Any:
    """A Kinesis client for kinesis-mock; a 12-digit `account_id` signs requests into that account.

    kinesis-mock takes the account from the access key id when it is 12 digits, else 000000000000.
    """
    return boto3.client(
        "kinesis",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=account_id or "testing",
        aws_secret_access_key="testing",
    )


def wait_until_active(client: Any, stream: str, timeout_seconds: float = ACTIVE_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream!r} not ACTIVE within {timeout_seconds:.0f} s")
        time.sleep(0.01)


def wait_until_gone(client: Any, stream: str, timeout_seconds: float = ACTIVE_TIMEOUT_SECONDS) -> None:
    """Until DescribeStreamSummary answers ResourceNotFoundException (a deleted stream is DELETING first)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            client.describe_stream_summary(StreamName=stream)
        except client.exceptions.ResourceNotFoundException:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream!r} still exists after {timeout_seconds:.0f} s")
        time.sleep(0.01)


def create_stream(client: Any, name: str, shard_count: int) -> None:
    client.create_stream(StreamName=name, ShardCount=shard_count)
    wait_until_active(client, name)


def shards_of(client: Any, stream: str) -> list[Shard]:
    """Every shard of the stream, all pages, read directly (not through the code under test)."""
    page = client.list_shards(StreamName=stream)
    shards = [Shard.from_api(entry) for entry in page["Shards"]]
    while page.get("NextToken"):
        page = client.list_shards(NextToken=page["NextToken"])
        shards.extend(Shard.from_api(entry) for entry in page["Shards"])
    return shards


def split_shard(client: Any, stream: str, shard_id: str) -> tuple[str, str]:
    """Split `shard_id` at the midpoint of its hash range; the children, lower hash range first."""
    (shard,) = [s for s in shards_of(client, stream) if s.shard_id == shard_id]
    low, high = shard.hash_key_range.starting_hash_key, shard.hash_key_range.ending_hash_key
    client.split_shard(StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str((low + high) // 2 + 1))
    wait_until_active(client, stream)
    lower, upper = sorted(
        child_shards_of(shards_of(client, stream), shard_id), key=lambda s: s.hash_key_range.starting_hash_key
    )
    return lower.shard_id, upper.shard_id


def merge_shards(client: Any, stream: str, shard_to_merge: str, adjacent_shard: str) -> str:
    """Merge two adjacent open shards; the child's id."""
    client.merge_shards(StreamName=stream, ShardToMerge=shard_to_merge, AdjacentShardToMerge=adjacent_shard)
    wait_until_active(client, stream)
    (child,) = child_shards_of(shards_of(client, stream), shard_to_merge)
    return child.shard_id


def put_records(client: Any, stream: str, count: int, partition_key: str | None = None) -> dict[str, list[str]]:
    """Write `count` records (keys `key-<i>` unless one `partition_key` is given); sequence numbers by shard.

    Records kinesis-mock refuses (per-shard throughput) are written again until all are in.
    """
    pending = [
        {"Data": f"record-{index}".encode(), "PartitionKey": partition_key or f"key-{index}"} for index in range(count)
    ]
    written: dict[str, list[str]] = {}
    while pending:
        batch, pending = pending[:PUT_RECORDS_LIMIT], pending[PUT_RECORDS_LIMIT:]
        results = client.put_records(StreamName=stream, Records=batch)["Records"]
        refused = [entry for entry, result in zip(batch, results) if "ErrorCode" in result]
        for result in results:
            if "ErrorCode" not in result:
                written.setdefault(result["ShardId"], []).append(result["SequenceNumber"])
        if refused:
            time.sleep(0.05)
            pending = refused + pending
    return written


def build_seed_lineage(client: Any, stream: str) -> dict[int, str]:
    """Create `stream` and reshard it into the seed lineage; the real shard id of each seed name 0..10.

    Six uniform shards 0..5; merge 0+1 -> 6, 2+3 -> 7, 6+7 -> 8; split 5 -> 9 (lower half), 10.
    The ids are taken from what kinesis-mock answers, so the mapping holds however it numbers shards.
    """
    create_stream(client, stream, 6)
    by_hash = sorted(shards_of(client, stream), key=lambda s: s.hash_key_range.starting_hash_key)
    ids = {seed: shard.shard_id for seed, shard in enumerate(by_hash)}
    ids[6] = merge_shards(client, stream, ids[0], ids[1])
    ids[7] = merge_shards(client, stream, ids[2], ids[3])
    ids[8] = merge_shards(client, stream, ids[6], ids[7])
    ids[9], ids[10] = split_shard(client, stream, ids[5])
    return ids
