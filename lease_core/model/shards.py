"""Kinesis streams and shards as values, and the initial position of a new application (docs/protocol.md §3)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lease_core.model.lease import HashKeyRange
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber


class InitialPosition(str, enum.Enum):
    """Where a lease created by shard sync starts reading."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"

    @property
    def checkpoint(self) -> ExtendedSequenceNumber:
        """The sentinel stored in a new lease; the AT_TIMESTAMP time itself is configuration (§1.2)."""
        return {"TRIM_HORIZON": TRIM_HORIZON, "LATEST": LATEST, "AT_TIMESTAMP": AT_TIMESTAMP}[self.value]


@dataclass(frozen=True)
class InitialPositionInStream:
    """An initial position, with the timestamp AT_TIMESTAMP needs."""

    position: InitialPosition
    timestamp: datetime | None = None

    def __post_init__(self) -> None:
        if (self.position is InitialPosition.AT_TIMESTAMP) != (self.timestamp is not None):
            raise ValueError("a timestamp is required with AT_TIMESTAMP and only with it")
        if self.timestamp is not None and self.timestamp.tzinfo is None:
            raise ValueError("the AT_TIMESTAMP timestamp must carry a time zone")


# What kinesis-mock lists as every closed shard's EndingSequenceNumber (Long.MaxValue).
UNKNOWN_ENDING_SEQUENCE_NUMBER = str(2**63 - 1)


@dataclass(frozen=True)
class Shard:
    """One shard of a stream as ListShards describes it."""

    shard_id: str
    hash_key_range: HashKeyRange
    starting_sequence_number: str
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None
    ending_sequence_number: str | None = None

    @property
    def is_open(self) -> bool:
        return self.ending_sequence_number is None

    @property
    def known_ending_sequence_number(self) -> str | None:
        """The closed shard's last sequence number when the listing gives a real one: kinesis-mock
        lists 9223372036854775807 (2^63-1) for every closed shard, which no record of it carries."""
        if self.ending_sequence_number == UNKNOWN_ENDING_SEQUENCE_NUMBER:
            return None
        return self.ending_sequence_number

    @property
    def parent_shard_ids(self) -> frozenset[str]:
        """The parent and adjacent parent, whichever are set (even if trimmed from the stream)."""
        return frozenset(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)

    @classmethod
    def from_api(cls, shard: Mapping[str, Any]) -> Shard:
        """From a ListShards / DescribeStream / ChildShards entry."""
        hash_range = shard["HashKeyRange"]
        sequence_range = shard.get("SequenceNumberRange", {})
        return cls(
            shard_id=shard["ShardId"],
            hash_key_range=HashKeyRange.from_strings(hash_range["StartingHashKey"], hash_range["EndingHashKey"]),
            starting_sequence_number=sequence_range.get("StartingSequenceNumber", "0"),
            parent_shard_id=shard.get("ParentShardId"),
            adjacent_parent_shard_id=shard.get("AdjacentParentShardId"),
            ending_sequence_number=sequence_range.get("EndingSequenceNumber"),
        )


@dataclass(frozen=True)
class ChildShard:
    """A child named by GetRecords' ChildShards at the end of a closed shard."""

    shard_id: str
    parent_shard_ids: frozenset[str]
    hash_key_range: HashKeyRange

    @classmethod
    def from_api(cls, child: Mapping[str, Any]) -> ChildShard:
        hash_range = child["HashKeyRange"]
        return cls(
            shard_id=child["ShardId"],
            parent_shard_ids=frozenset(child.get("ParentShards", ())),
            hash_key_range=HashKeyRange.from_strings(hash_range["StartingHashKey"], hash_range["EndingHashKey"]),
        )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class StreamDescription:
    """Which stream a name stands for right now: a stream deleted and created again under the same
    name keeps its name and ARN but not its creation time."""

    stream_name: str
    stream_arn: str
    creation_epoch_millis: int

    @classmethod
    def from_api(cls, summary: Mapping[str, Any]) -> StreamDescription:
        """From DescribeStreamSummary's StreamDescriptionSummary (boto3 gives an aware datetime)."""
        created: datetime = summary["StreamCreationTimestamp"]
        return cls(summary["StreamName"], summary["StreamARN"], (created - _EPOCH) // timedelta(milliseconds=1))

    @property
    def created_at(self) -> datetime:
        return _EPOCH + timedelta(milliseconds=self.creation_epoch_millis)

    def __str__(self) -> str:
        return f"{self.stream_name!r} ({self.stream_arn}, created {self.created_at.isoformat(timespec='milliseconds')})"
