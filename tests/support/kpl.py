"""Writing KPL-aggregated records, built with aws_kinesis_agg's RecordAggregator, to a stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_kinesis_agg.aggregator import RecordAggregator


def aggregate(user_records: Sequence[tuple[str, bytes]]) -> tuple[str, str | None, bytes]:
    """One aggregated record holding the (partition key, data) pairs in order.

    Returns the aggregate's partition key (the first user record's), explicit hash key and data.
    """
    aggregator = RecordAggregator()
    for partition_key, data in user_records:
        # A full aggregate comes back from add_user_record; tests keep theirs far below 1 MB.
        if aggregator.add_user_record(partition_key, data) is not None:
            raise ValueError(f"{len(user_records)} user records do not fit into one aggregated record")
    record = aggregator.clear_and_get()
    if record is None:
        raise ValueError("an aggregated record needs at least one user record")
    return record.get_contents()


def put_aggregate(client: Any, stream: str, user_records: Sequence[tuple[str, bytes]]) -> str:
    """Put one aggregated record holding the (partition key, data) pairs; its sequence number."""
    key, explicit_hash_key, data = aggregate(user_records)
    arguments = {"ExplicitHashKey": explicit_hash_key} if explicit_hash_key else {}
    response = client.put_record(StreamName=stream, PartitionKey=key, Data=data, **arguments)
    return str(response["SequenceNumber"])
