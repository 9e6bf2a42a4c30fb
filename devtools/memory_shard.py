"""One Kinesis shard held in memory, answering GetShardIterator and GetRecords as Kinesis does: for a
lease consumer that must read a batch again (a redo into a sink that cannot adopt another attempt's
staged batch) without a Kinesis."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from lease_core.model.shards import ChildShard
from lease_core.retrieval.kpl_deaggregation import user_records
from sinks.record_columns import records_table

ARRIVAL = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


class InMemoryShard:
    """Records numbered `numbers` (sequence numbers as Kinesis writes them, one per second of arrival).
    A closed shard (`children` given) answers its null iterator and its ChildShards with its last
    records; an open one answers MillisBehindLatest 0 there, its tip."""

    def __init__(self, numbers: range, children: Sequence[ChildShard] = ()) -> None:
        self.records: list[dict[str, Any]] = [
            {
                "SequenceNumber": str(number),
                "ApproximateArrivalTimestamp": ARRIVAL + timedelta(seconds=index),
                "Data": f"payload {number}".encode(),
                "PartitionKey": f"key-{number}",
            }
            for index, number in enumerate(numbers)
        ]
        self.children = tuple(children)

    def get_shard_iterator(self, **arguments: Any) -> dict[str, Any]:
        numbers = [record["SequenceNumber"] for record in self.records]
        kind = arguments["ShardIteratorType"]
        if kind == "TRIM_HORIZON":
            return {"ShardIterator": "0"}
        index = numbers.index(arguments["StartingSequenceNumber"])
        return {"ShardIterator": str(index if kind == "AT_SEQUENCE_NUMBER" else index + 1)}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        index = int(ShardIterator)
        page = self.records[index : index + Limit]
        end = index + len(page)
        if end < len(self.records):
            return {"Records": page, "NextShardIterator": str(end), "MillisBehindLatest": 1000}
        if not self.children:
            return {"Records": page, "NextShardIterator": str(end), "MillisBehindLatest": 0}
        children = [
            {
                "ShardId": child.shard_id,
                "ParentShards": sorted(child.parent_shard_ids),
                "HashKeyRange": {
                    "StartingHashKey": str(child.hash_key_range.starting_hash_key),
                    "EndingHashKey": str(child.hash_key_range.ending_hash_key),
                },
            }
            for child in self.children
        ]
        return {"Records": page, "MillisBehindLatest": 0, "ChildShards": children}

    def rows(self, first: int, last: int) -> pa.Table:
        """The records numbered `first`..`last` as a slot stages them (no transform)."""
        wanted = [record for record in self.records if first <= int(record["SequenceNumber"]) <= last]
        return records_table(user_records(wanted))
