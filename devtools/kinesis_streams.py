"""Streams on kinesis-mock for the demo, the tests and the benchmarks: create, reshard for real, write records.

Every reshard helper waits until the stream is ACTIVE again, because kinesis-mock (like Kinesis)
refuses the next reshard with ResourceInUseException while the stream is UPDATING. Creating a stream
is the installed package's (`kinesis_lease.local_trial.streams`, which `kinesis-lease local` uses).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import boto3
from kinesis_lease.local_trial.streams import ACTIVE_TIMEOUT_SECONDS
from kinesis_lease.local_trial.streams import create_stream as create_stream  # the tests' and benchmarks' name
from kinesis_lease.local_trial.streams import wait_until_active as wait_until_active

from lease_core.model.shards import Shard
from lease_core.retrieval.shard_source import child_shards_of

PUT_RECORDS_LIMIT = 500  # entries per PutRecords call, Kinesis' maximum

Entry = dict[str, Any]  # a PutRecords entry: Data, PartitionKey and maybe ExplicitHashKey


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


def shards_of(client: Any, stream: str) -> list[Shard]:
    """Every shard of the stream, all pages, read directly (not through the code under test)."""
    page = client.list_shards(StreamName=stream)
    shards = [Shard.from_api(entry) for entry in page["Shards"]]
    while page.get("NextToken"):
        page = client.list_shards(NextToken=page["NextToken"])
        shards.extend(Shard.from_api(entry) for entry in page["Shards"])
    return shards


def open_shards(client: Any, stream: str) -> list[Shard]:
    """The open shards in hash-key order, so that neighbours in the list are candidates for a merge."""
    return sorted(
        (shard for shard in shards_of(client, stream) if shard.is_open),
        key=lambda shard: shard.hash_key_range.starting_hash_key,
    )


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


def put_entries(
    client: Any, stream: str, entries: Iterable[Entry], retry_pause_seconds: float = 0.05
) -> list[tuple[Entry, dict[str, Any]]]:
    """Write every entry, each with its PutRecords result (ShardId, SequenceNumber), in the order written.

    Entries kinesis-mock refuses (a shard's write limit) are written again, after a pause, until all are in.
    """
    pending = list(entries)
    written: list[tuple[Entry, dict[str, Any]]] = []
    while pending:
        batch, pending = pending[:PUT_RECORDS_LIMIT], pending[PUT_RECORDS_LIMIT:]
        results = client.put_records(StreamName=stream, Records=batch)["Records"]
        refused = [entry for entry, result in zip(batch, results) if "ErrorCode" in result]
        written += [(entry, result) for entry, result in zip(batch, results) if "ErrorCode" not in result]
        if refused:
            time.sleep(retry_pause_seconds)
            pending = refused + pending
    return written


def put_records(client: Any, stream: str, count: int, partition_key: str | None = None) -> dict[str, list[str]]:
    """Write `count` records (keys `key-<i>` unless one `partition_key` is given); sequence numbers by shard."""
    entries = (
        {"Data": f"record-{index}".encode(), "PartitionKey": partition_key or f"key-{index}"} for index in range(count)
    )
    written: dict[str, list[str]] = {}
    for _, result in put_entries(client, stream, entries):
        written.setdefault(result["ShardId"], []).append(result["SequenceNumber"])
    return written
