"""Kinesis records as user records: KPL aggregates split into theirs, plain records as one each.

Kinesis hands out the same record whatever reads it (GetRecords' Records, SubscribeToShard's events'
Records): a sequence number, an arrival time, data and a partition key. A KPL aggregate is one such
record holding many user records, each at its index as sub-sequence number; a checkpoint names one of
them by (sequence number, sub-sequence number), so every reading mode splits aggregates the same way.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import google.protobuf.message
from aws_kinesis_agg import DIGEST_SIZE as KPL_DIGEST_SIZE
from aws_kinesis_agg import MAGIC as KPL_MAGIC

# The package's generated schema imports its sibling as a top-level module, which only its
# deaggregator module makes importable (it puts the package's folder on sys.path).
from aws_kinesis_agg.deaggregator import messages_pb2 as kpl_messages

from lease_core.retrieval.kinesis_records import KinesisRecord

log = logging.getLogger(__name__)


def user_records(records: Iterable[Mapping[str, Any]]) -> list[KinesisRecord]:
    """Kinesis' records as user records: KPL aggregates split, plain records at sub-sequence 0."""
    found: list[KinesisRecord] = []
    for record in records:
        data = record["Data"]
        arrival = arrival_of(record)
        aggregated = _kpl_user_records(record, arrival) if data[: len(KPL_MAGIC)] == KPL_MAGIC else None
        if aggregated is not None:
            found.extend(aggregated)
        else:
            found.append(KinesisRecord(record["SequenceNumber"], 0, partition_key(record), arrival, bytes(data)))
    return found


def partition_key(record: Mapping[str, Any]) -> str:
    # A stream with the AUTO record distribution returns no PartitionKey when the producer gave none.
    return str(record.get("PartitionKey") or "")


def arrival_of(record: Mapping[str, Any]) -> datetime:
    """The record's ApproximateArrivalTimestamp, in UTC."""
    arrival: datetime = record["ApproximateArrivalTimestamp"]
    return arrival.astimezone(UTC)


def _kpl_user_records(record: Mapping[str, Any], arrival: datetime) -> list[KinesisRecord] | None:
    """The user records of a KPL aggregate (KCL's format: magic, protobuf message, MD5 digest of the
    message), or None when `record` is not one after all: it is then a plain record, as KCL takes it.

    aws_kinesis_agg's schema reads the message; its deaggregator is not used, because it converts
    every user record to Lambda's format, base64 included (most of a KPL reader's CPU), and an
    aggregate that breaks part-way is printed to stderr with its remaining user records dropped.
    Here a message that is not whole and valid leaves the record plain, as KCL does: nothing is ever
    dropped, and no producer's record can stop a shard.
    """
    data = record["Data"]
    message, digest = data[len(KPL_MAGIC) : -KPL_DIGEST_SIZE], data[-KPL_DIGEST_SIZE:]
    if len(data) <= len(KPL_MAGIC) + KPL_DIGEST_SIZE or hashlib.md5(message).digest() != digest:
        return None
    aggregate = kpl_messages.AggregatedRecord()
    try:
        aggregate.ParseFromString(message)
    except google.protobuf.message.DecodeError:
        return _not_an_aggregate(record, "its message does not decode")
    keys, hash_keys = aggregate.partition_key_table, aggregate.explicit_hash_key_table
    for entry in aggregate.records:
        # Indexes are uint64: one past its table (or past 2**63, which a list refuses as a type) names nothing.
        if entry.partition_key_index >= len(keys) or (
            entry.HasField("explicit_hash_key_index") and entry.explicit_hash_key_index >= len(hash_keys)
        ):
            return _not_an_aggregate(record, "a user record names a key its tables do not hold")
    if not aggregate.IsInitialized():
        return _not_an_aggregate(record, "its message lacks a required field")
    return [
        KinesisRecord(
            record["SequenceNumber"],
            index,
            keys[entry.partition_key_index],
            arrival,
            entry.data,
            hash_keys[entry.explicit_hash_key_index] if entry.HasField("explicit_hash_key_index") else None,
        )
        for index, entry in enumerate(aggregate.records)
    ]


def _not_an_aggregate(record: Mapping[str, Any], why: str) -> list[KinesisRecord] | None:
    """None (the record is a plain one), with a warning naming it and `why`."""
    log.warning(
        "record %s starts like a KPL aggregate but %s: it is landed as one record", record["SequenceNumber"], why
    )
    return None
