"""Kinesis records as user records: KPL aggregates split into theirs, plain records as one each.

Kinesis hands out the same record whatever reads it (GetRecords' Records, SubscribeToShard's events'
Records): a sequence number, an arrival time, data and a partition key. A KPL aggregate is one such
record holding many user records, each at its index as sub-sequence number; a checkpoint names one of
them by (sequence number, sub-sequence number), so every reading mode splits aggregates the same way.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from operator import attrgetter, methodcaller
from typing import Any

import google.protobuf.message
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aws_kinesis_agg import DIGEST_SIZE as KPL_DIGEST_SIZE
from aws_kinesis_agg import MAGIC as KPL_MAGIC

# The package's generated schema imports its sibling as a top-level module, which only its
# deaggregator module makes importable (it puts the package's folder on sys.path).
from aws_kinesis_agg.deaggregator import messages_pb2 as kpl_messages

from lease_core.model.kinesis_record_columns import KinesisRecordColumns
from lease_core.retrieval.kinesis_records import USER_SCHEMA, KinesisRecord, UserRecords

log = logging.getLogger(__name__)

_KEY_INDEX = attrgetter("partition_key_index")
_DATA = attrgetter("data")
_HAS_HASH_KEY = methodcaller("HasField", "explicit_hash_key_index")


def user_records(records: Iterable[Mapping[str, Any]]) -> list[KinesisRecord]:
    """Kinesis' records (botocore's dicts) as user records: KPL aggregates split, plain records at
    sub-sequence 0."""
    return list(user_record_columns(KinesisRecordColumns.of(list(records))))


def user_record_columns(records: KinesisRecordColumns) -> UserRecords:
    """Kinesis' records as user records, column by column: the aggregates are found by one Arrow
    comparison over the data column; each is checked and split in C (MD5, protobuf), and the batch's
    columns are gathered from the records' and the aggregates' values by one `take` each."""
    table = records.table
    if table.column("ApproximateArrivalTimestamp").null_count:
        raise ValueError("a Kinesis record came without its ApproximateArrivalTimestamp")
    data = table.column("Data").combine_chunks()
    # A stream with the AUTO record distribution returns no PartitionKey when the producer gave none.
    keys = table.column("PartitionKey").combine_chunks().fill_null("")
    magic = pc.equal(pc.binary_slice(data, 0, len(KPL_MAGIC)), pa.scalar(KPL_MAGIC, pa.binary()))
    candidates = np.flatnonzero(magic.fill_null(False).to_numpy(zero_copy_only=False))
    splits = {}
    for index, value in zip(candidates.tolist(), data.take(candidates).to_pylist(), strict=True):
        split = _split(value, records.sequence_number(index))
        if split is not None:
            splits[index] = split
    columns = {
        "sequence_number": table.column("SequenceNumber"),
        "approximate_arrival_timestamp": table.column("ApproximateArrivalTimestamp"),
    }
    if not splits:
        plain = {
            **columns,
            "sub_sequence_number": pa.array(np.zeros(len(records), np.int64)),
            "partition_key": keys,
            "data": data,
            "explicit_hash_key": pa.nulls(len(records), pa.string()),
        }
        return UserRecords(pa.table({name: plain[name] for name in USER_SCHEMA.names}, schema=USER_SCHEMA))
    return UserRecords(_with_aggregates_split(columns, keys, data, splits, len(records)))


@dataclass(frozen=True)
class _Split:
    """A KPL aggregate's user records, column by column."""

    partition_keys: list[str]
    explicit_hash_keys: list[str | None]
    data: list[bytes]


def _with_aggregates_split(
    columns: dict[str, pa.ChunkedArray], keys: pa.Array, data: pa.Array, splits: dict[int, _Split], count: int
) -> pa.Table:
    """One row per user record: a plain record's own, an aggregate's user records at their indexes."""
    rows_of = np.ones(count, np.int64)
    rows_of[list(splits)] = [len(split.data) for split in splits.values()]
    parent = np.repeat(np.arange(count), rows_of)
    first_row = np.cumsum(rows_of) - rows_of
    sub_sequence = np.arange(len(parent)) - np.repeat(first_row, rows_of)
    split_parent = np.zeros(count, bool)
    split_parent[list(splits)] = True
    from_split = np.repeat(split_parent, rows_of)
    # Row i takes its values from its record (index < count) or from the splits' values, in order (count + k).
    source = np.where(from_split, count + np.cumsum(from_split) - 1, parent)

    def gathered(own: pa.Array, per_split: Callable[[_Split], list[Any]], kind: pa.DataType) -> pa.Array:
        split_values = pa.array(list(chain.from_iterable(map(per_split, splits.values()))), kind)
        if len(splits) == count:  # aggregates only (a KPL stream): their values are the column
            return split_values
        return pc.take(pa.concat_arrays([own, split_values]), source)

    return pa.table(
        {
            "sequence_number": pc.take(columns["sequence_number"], parent),
            "sub_sequence_number": pa.array(sub_sequence, pa.int64()),
            "partition_key": gathered(keys, attrgetter("partition_keys"), pa.string()),
            "approximate_arrival_timestamp": pc.take(columns["approximate_arrival_timestamp"], parent),
            "data": gathered(data, attrgetter("data"), pa.binary()),
            "explicit_hash_key": gathered(pa.nulls(count, pa.string()), attrgetter("explicit_hash_keys"), pa.string()),
        },
        schema=USER_SCHEMA,
    )


def arrival_of(record: Mapping[str, Any]) -> datetime:
    """The record's ApproximateArrivalTimestamp, in UTC."""
    arrival: datetime = record["ApproximateArrivalTimestamp"]
    return arrival.astimezone(UTC)


def _split(data: bytes, sequence_number: str) -> _Split | None:
    """The user records of a KPL aggregate (KCL's format: magic, protobuf message, MD5 digest of the
    message), or None when the record is not one after all: it is then a plain record, as KCL takes it.

    aws_kinesis_agg's schema reads the message; its deaggregator is not used, because it converts
    every user record to Lambda's format, base64 included (most of a KPL reader's CPU), and an
    aggregate that breaks part-way is printed to stderr with its remaining user records dropped.
    Here a message that is not whole and valid leaves the record plain, as KCL does: nothing is ever
    dropped, and no producer's record can stop a shard.
    """
    message, digest = data[len(KPL_MAGIC) : -KPL_DIGEST_SIZE], data[-KPL_DIGEST_SIZE:]
    if len(data) <= len(KPL_MAGIC) + KPL_DIGEST_SIZE or hashlib.md5(message).digest() != digest:
        return None
    aggregate = kpl_messages.AggregatedRecord()
    try:
        aggregate.ParseFromString(message)
    except google.protobuf.message.DecodeError:
        return _not_an_aggregate(sequence_number, "its message does not decode")
    keys, hash_keys, entries = list(aggregate.partition_key_table), aggregate.explicit_hash_key_table, aggregate.records
    # Per user record only `map`s over attribute getters, which run in C.
    key_indexes = list(map(_KEY_INDEX, entries))
    # Indexes are uint64: one past its table (or past 2**63, which a list refuses as a type) names nothing.
    if max(key_indexes, default=-1) >= len(keys):
        return _not_an_aggregate(sequence_number, "a user record names a key its tables do not hold")
    explicit_hash_keys: list[str | None] = [None] * len(entries)
    if any(map(_HAS_HASH_KEY, entries)):
        indexes = [
            entry.explicit_hash_key_index if entry.HasField("explicit_hash_key_index") else -1 for entry in entries
        ]
        if max(indexes) >= len(hash_keys):
            return _not_an_aggregate(sequence_number, "a user record names a key its tables do not hold")
        explicit_hash_keys = [None if index < 0 else hash_keys[index] for index in indexes]
    if not aggregate.IsInitialized():
        return _not_an_aggregate(sequence_number, "its message lacks a required field")
    return _Split(list(map(keys.__getitem__, key_indexes)), explicit_hash_keys, list(map(_DATA, entries)))


def _not_an_aggregate(sequence_number: str, why: str) -> _Split | None:
    """None (the record is a plain one), with a warning naming it and `why`."""
    log.warning("record %s starts like a KPL aggregate but %s: it is landed as one record", sequence_number, why)
    return None
