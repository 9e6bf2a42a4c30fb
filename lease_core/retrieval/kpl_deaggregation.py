"""Kinesis records as user records: KPL aggregates split into theirs, plain records as one each.

Kinesis hands out the same record whatever reads it (GetRecords' Records, SubscribeToShard's events'
Records): a sequence number, an arrival time, data and a partition key. A KPL aggregate is one such
record holding many user records, each at its index as sub-sequence number; a checkpoint names one of
them by (sequence number, sub-sequence number), so every reading mode splits aggregates the same way.

KCL's format: magic, protobuf message (`kpl_messages`), MD5 digest of the message. A record that
starts with the magic but whose digest does not match, or whose message is not whole and valid, is a
plain record, as KCL takes it: nothing is ever dropped, and no producer's record can stop a shard.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter, methodcaller
from typing import Any, ClassVar

import google.protobuf.message
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aws_kinesis_agg import DIGEST_SIZE as KPL_DIGEST_SIZE
from aws_kinesis_agg import MAGIC as KPL_MAGIC

from lease_core.model.kinesis_record_columns import KinesisRecordColumns
from lease_core.retrieval import kpl_messages
from lease_core.retrieval.kinesis_records import USER_SCHEMA, KinesisRecord, UserRecords

log = logging.getLogger(__name__)

_KEY_INDEX = attrgetter("partition_key_index")
_DATA = attrgetter("data")
_RECORDS = attrgetter("records")
_KEY_TABLE = attrgetter("partition_key_table")
_HASH_KEY_TABLE = attrgetter("explicit_hash_key_table")
_HAS_HASH_KEY = methodcaller("HasField", "explicit_hash_key_index")


def user_records(records: Iterable[Mapping[str, Any]]) -> list[KinesisRecord]:
    """Kinesis' records (botocore's dicts) as user records: KPL aggregates split, plain records at
    sub-sequence 0."""
    return list(user_record_columns(KinesisRecordColumns.of(list(records))))


def user_record_columns(records: KinesisRecordColumns) -> UserRecords:
    """Kinesis' records as user records, column by column: the aggregates are found by one Arrow
    comparison over the data column, checked (MD5) one by one, split a few hundred KB at a time by upb
    (`_split_in_bulk`), and the batch's columns are gathered by one `take` each."""
    table = records.table
    if table.column("ApproximateArrivalTimestamp").null_count:
        raise ValueError("a Kinesis record came without its ApproximateArrivalTimestamp")
    data = table.column("Data").combine_chunks()
    # A stream with the AUTO record distribution returns no PartitionKey when the producer gave none.
    keys = table.column("PartitionKey").combine_chunks().fill_null("")
    magic = pc.equal(pc.binary_slice(data, 0, len(KPL_MAGIC)), pa.scalar(KPL_MAGIC, pa.binary()))
    candidates = np.flatnonzero(magic.fill_null(False).to_numpy(zero_copy_only=False))
    split = _split(data, candidates, records) if len(candidates) else None
    columns = {
        "sequence_number": table.column("SequenceNumber"),
        "approximate_arrival_timestamp": table.column("ApproximateArrivalTimestamp"),
    }
    if split is None:
        plain = {
            **columns,
            "sub_sequence_number": pa.array(np.zeros(len(records), np.int64)),
            "partition_key": keys,
            "data": data,
            "explicit_hash_key": pa.nulls(len(records), pa.string()),
        }
        return UserRecords(pa.table({name: plain[name] for name in USER_SCHEMA.names}, schema=USER_SCHEMA))
    return UserRecords(_with_aggregates_split(columns, keys, data, split, len(records)))


@dataclass(frozen=True)
class _Split:
    """The user records of a batch's KPL aggregates, column by column, in order."""

    aggregates: list[int]  # the index of each Kinesis record that is an aggregate
    counts: np.ndarray  # how many user records each holds (int64)
    partition_keys: pa.Array
    explicit_hash_keys: pa.Array
    data: pa.Array

    ARRAYS: ClassVar = ("partition_keys", "explicit_hash_keys", "data")

    @classmethod
    def concat(cls, parts: list[_Split]) -> _Split:
        if len(parts) == 1:
            return parts[0]
        return cls(
            [index for part in parts for index in part.aggregates],
            np.concatenate([part.counts for part in parts]),
            *(pa.concat_arrays([getattr(part, name) for part in parts]) for name in cls.ARRAYS),
        )


# One batch's aggregates are checked and split in bulk at a time in a process. That work holds the
# interpreter's lock but lets go of it for many short steps (an MD5 per aggregate, Arrow's and numpy's
# kernels); two reading threads doing it at once hand the lock to each other at every step, a context
# switch each. Measured with 8 threads reading and splitting a shard of KPL aggregates each (`perf stat`):
# 99,000 context switches and 116 MiB/s per core, against 18,000 and 151 with this lock. What a second
# core could have run meanwhile (another thread's MD5s) was worth less than the hand-offs cost. The
# aggregates the bulk split cannot prove are split one by one after the lock is let go: that path is
# rare, and logs what it takes as plain records.
_SPLITTING = threading.Lock()

# Aggregates are split this many bytes of messages at a time: each chunk's passes (the digest, the
# joins, upb's parses and the user records' values) stay in the core's cache, where a whole 10 MB
# response's would go to memory and back several times (measured: slower than one by one).
_CHUNK_BYTES = 256 * 1024


def _split(data: pa.BinaryArray, candidates: np.ndarray, records: KinesisRecordColumns) -> _Split | None:
    """The aggregates among the records at `candidates` (those starting with KPL's magic) split; None
    when none is one after all. Each value is read in place, through a memoryview of Arrow's buffer."""
    # As unsigned bytes (Arrow exports signed ones), so that a digest compares equal to its bytes.
    values = memoryview(data.buffers()[2]).cast("B")
    offsets = np.frombuffer(data.buffers()[1], np.int32)[data.offset : data.offset + len(data) + 1]
    with _SPLITTING:
        chunks = [
            (indexes, messages, _split_in_bulk(indexes, messages))
            for indexes, messages in _checked_chunks(values, offsets, candidates)
        ]
    parts = [bulk or _split_one_by_one(indexes, messages, records) for indexes, messages, bulk in chunks]
    split = _Split.concat(parts) if parts else None
    return split if split is not None and split.aggregates else None


def _checked_chunks(
    values: memoryview, offsets: np.ndarray, candidates: np.ndarray
) -> Iterator[tuple[list[int], list[memoryview]]]:
    """The candidates whose digest matches, as (record indexes, messages), about `_CHUNK_BYTES` of
    messages at a time."""
    indexes: list[int] = []
    messages: list[memoryview] = []
    size = 0
    for index, start, end in zip(candidates.tolist(), offsets[candidates].tolist(), offsets[candidates + 1].tolist()):
        message = _checked_message(values[start:end])
        if message is None:
            continue
        indexes.append(index)
        messages.append(message)
        size += len(message)
        if size >= _CHUNK_BYTES:
            yield indexes, messages
            indexes, messages, size = [], [], 0
    if messages:
        yield indexes, messages


def _checked_message(data: memoryview) -> memoryview | None:
    """The protobuf message of a record that starts with KPL's magic, when its MD5 digest matches;
    else None: the record is a plain one, as KCL takes it."""
    if len(data) <= len(KPL_MAGIC) + KPL_DIGEST_SIZE:
        return None
    message = data[len(KPL_MAGIC) : -KPL_DIGEST_SIZE]
    return message if hashlib.md5(message).digest() == data[-KPL_DIGEST_SIZE:] else None


def _split_in_bulk(indexes: list[int], messages: list[memoryview]) -> _Split | None:
    """The messages' user records read by upb from a few parses of them all (`kpl_messages`), or None
    when they may not read as KPL's schema reads each message: a message that does not decode, lacks a
    required field or names a key its tables do not hold, a user record with a field twice, an
    aggregate with explicit hash keys whose user records do not all name one, a key that is not UTF-8.
    The slow path (`_split_one_by_one`) then decides, aggregate by aggregate."""
    try:
        flattened = kpl_messages.Flattened.FromString(b"".join(messages))
        framed_bytes = kpl_messages.framed(messages)
        framed = kpl_messages.Framed.FromString(framed_bytes)
    except google.protobuf.message.DecodeError:
        return None
    if not framed.IsInitialized():
        return None
    aggregates = framed.aggregates
    counts = _lengths(map(_RECORDS, aggregates), len(messages))
    fields, total = flattened.records, int(counts.sum())
    # Each user record has at least one of each (IsInitialized): as many as user records means one each.
    if len(fields.partition_key_index) != total or len(fields.data) != total:
        return None
    key_indexes = _table_indexes(
        fields.partition_key_index, _lengths(map(_KEY_TABLE, aggregates), len(messages)), counts
    )
    hash_key_tables = _lengths(map(_HASH_KEY_TABLE, aggregates), len(messages))
    hash_key_indexes = _hash_key_indexes(fields, messages, framed_bytes, hash_key_tables, counts)
    if key_indexes is None or hash_key_indexes is None:
        return None
    try:
        partition_keys = pa.array(list(flattened.partition_key_table), pa.string()).take(key_indexes)
        hash_keys = pa.array(list(flattened.explicit_hash_key_table), pa.string()).take(hash_key_indexes)
    except pa.ArrowInvalid:  # upb hands a string that is not UTF-8 over as bytes
        return None
    return _Split(indexes, counts, partition_keys, hash_keys, pa.array(list(fields.data), pa.binary()))


def _hash_key_indexes(
    fields: Any, messages: list[memoryview], framed_bytes: bytes, tables: np.ndarray, counts: np.ndarray
) -> pa.Array | None:
    """Each user record's index into the explicit hash key tables concatenated (null: it names none),
    when proven: the user records of an aggregate whose table is empty name none (they could name
    nothing in it), and those of an aggregate whose table is not must each name exactly one (at least
    one each, by `FramedWithHashKeys`, and no more in all). None when not proven, or one names nothing."""
    named = np.flatnonzero(tables)
    counts_named = np.zeros_like(counts)
    counts_named[named] = counts[named]
    if len(fields.explicit_hash_key_index) != counts_named.sum():
        return None
    if len(named):
        proof = framed_bytes if len(named) == len(messages) else kpl_messages.framed([messages[i] for i in named])
        if not kpl_messages.FramedWithHashKeys.FromString(proof).IsInitialized():
            return None
    indexes = _table_indexes(fields.explicit_hash_key_index, tables, counts_named)
    if indexes is None:
        return None
    naming = np.repeat(tables > 0, counts)
    every = np.zeros(len(naming), np.int64)
    every[naming] = indexes
    return pa.array(every, mask=~naming)


def _lengths(containers: Iterable[Sized], count: int) -> np.ndarray:
    return np.fromiter(map(len, containers), np.int64, count)


def _table_indexes(indexes: Iterable[int], table_sizes: np.ndarray, counts: np.ndarray) -> np.ndarray | None:
    """Each index of `counts[i]` user records into aggregate i's table as an index into the tables
    concatenated, or None when one names nothing in its table (indexes are uint64)."""
    local = np.fromiter(indexes, np.uint64, int(counts.sum()))
    if (local >= np.repeat(table_sizes, counts).astype(np.uint64)).any():
        return None
    concatenated: np.ndarray = local.astype(np.int64) + np.repeat(np.cumsum(table_sizes) - table_sizes, counts)
    return concatenated


def _split_one_by_one(indexes: list[int], messages: list[memoryview], records: KinesisRecordColumns) -> _Split:
    """The messages read one at a time with KPL's schema, user record by user record (upb's Python
    objects): the reference the bulk path must equal, and what decides when it cannot."""
    aggregates, counts = [], []
    keys: list[str] = []
    hash_keys: list[str | None] = []
    data: list[bytes] = []
    for index, message in zip(indexes, messages, strict=True):
        user = _user_records_of(message, records.sequence_number(index))
        if user is not None:
            aggregates.append(index)
            counts.append(len(user[2]))
            keys.extend(user[0])
            hash_keys.extend(user[1])
            data.extend(user[2])
    return _Split(
        aggregates,
        np.array(counts, np.int64),
        pa.array(keys, pa.string()),
        pa.array(hash_keys, pa.string()),
        pa.array(data, pa.binary()),
    )


# An aggregate's user records: their partition keys, explicit hash keys and data.
_UserRecordValues = tuple[list[str], list[str | None], list[bytes]]


def _user_records_of(message: memoryview, sequence_number: str) -> _UserRecordValues | None:
    """The (partition keys, explicit hash keys, data) of one aggregate's user records, or None when
    its message is not whole and valid: the record is then a plain one, as KCL takes it."""
    aggregate = kpl_messages.AggregatedRecord()
    try:
        aggregate.ParseFromString(message)
    except google.protobuf.message.DecodeError:
        return _not_an_aggregate(sequence_number, "its message does not decode")
    keys = list(map(_text, aggregate.partition_key_table))
    hash_keys = aggregate.explicit_hash_key_table
    entries = aggregate.records
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
        explicit_hash_keys = [None if index < 0 else _text(hash_keys[index]) for index in indexes]
    if not aggregate.IsInitialized():
        return _not_an_aggregate(sequence_number, "its message lacks a required field")
    return list(map(keys.__getitem__, key_indexes)), explicit_hash_keys, list(map(_DATA, entries))


def _text(value: str | bytes) -> str:
    """A string of KPL's tables. upb hands one that is not UTF-8 over as bytes; KCL (protobuf-java)
    reads it with U+FFFD for what does not decode, and so does this."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _not_an_aggregate(sequence_number: str, why: str) -> _UserRecordValues | None:
    """None (the record is a plain one), with a warning naming it and `why`."""
    log.warning("record %s starts like a KPL aggregate but %s: it is landed as one record", sequence_number, why)
    return None


def _with_aggregates_split(
    columns: dict[str, pa.ChunkedArray], keys: pa.Array, data: pa.Array, split: _Split, count: int
) -> pa.Table:
    """One row per user record: a plain record's own, an aggregate's user records at their indexes."""
    rows_of = np.ones(count, np.int64)
    rows_of[split.aggregates] = split.counts
    parent = np.repeat(np.arange(count), rows_of)
    first_row = np.cumsum(rows_of) - rows_of
    sub_sequence = np.arange(len(parent)) - np.repeat(first_row, rows_of)
    is_aggregate = np.zeros(count, bool)
    is_aggregate[split.aggregates] = True
    from_split = np.repeat(is_aggregate, rows_of)
    # Row i takes its values from its record (index < count) or from the split's values, in order (count + k).
    source = np.where(from_split, count + np.cumsum(from_split) - 1, parent)

    def gathered(own: pa.Array, split_values: pa.Array) -> pa.Array:
        if len(split.aggregates) == count:  # aggregates only (a KPL stream): their values are the column
            return split_values
        return pc.take(pa.concat_arrays([own, split_values]), source)

    return pa.table(
        {
            "sequence_number": pc.take(columns["sequence_number"], parent),
            "sub_sequence_number": pa.array(sub_sequence, pa.int64()),
            "partition_key": gathered(keys, split.partition_keys),
            "approximate_arrival_timestamp": pc.take(columns["approximate_arrival_timestamp"], parent),
            "data": gathered(data, split.data),
            "explicit_hash_key": gathered(pa.nulls(count, pa.string()), split.explicit_hash_keys),
        },
        schema=USER_SCHEMA,
    )


def arrival_of(record: Mapping[str, Any]) -> datetime:
    """The record's ApproximateArrivalTimestamp, in UTC."""
    arrival: datetime = record["ApproximateArrivalTimestamp"]
    return arrival.astimezone(UTC)
