"""Where reading a shard begins, from a lease's checkpoint.

Kinesis takes a starting position in the same form whatever reads the shard (GetShardIterator's
ShardIteratorType, StartingSequenceNumber and Timestamp; SubscribeToShard's StartingPosition):

- A checkpoint at a sequence number starts AT_SEQUENCE_NUMBER of it, and the reader drops every
  position at or before the checkpoint. A checkpoint inside a KPL aggregate names one sub-record;
  AFTER_SEQUENCE_NUMBER would skip the rest of that aggregate, and the filter keeps the sub-records
  already delivered from coming back.
- TRIM_HORIZON and LATEST start there; AT_TIMESTAMP starts at the application's initial-position
  timestamp (the lease stores only the sentinel).
- A lease at LATEST reads from its pin (`Lease.latest_since`) AT_TIMESTAMP: from the moment the
  first round that claimed it pinned, not from now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lease_core.model.sequence import ExtendedSequenceNumber, Sentinel


@dataclass(frozen=True)
class StartingPosition:
    """A position in a shard as Kinesis takes it: a kind, with the sequence number or the timestamp it needs."""

    kind: str  # AT_SEQUENCE_NUMBER, TRIM_HORIZON, LATEST or AT_TIMESTAMP
    sequence_number: str | None = None
    timestamp: datetime | None = None


TRIM_HORIZON_POSITION = StartingPosition("TRIM_HORIZON")
LATEST_POSITION = StartingPosition("LATEST")


def at_sequence_number(sequence_number: str) -> StartingPosition:
    return StartingPosition("AT_SEQUENCE_NUMBER", sequence_number=sequence_number)


def starting_position(
    shard_id: str, start: ExtendedSequenceNumber, at_timestamp: datetime | None, latest_since: datetime | None = None
) -> StartingPosition:
    """Where reading from a lease's committed checkpoint `start` begins. `latest_since` is the pin of
    a lease at LATEST (`Lease.latest_start`): such a lease reads on from that moment, not from now."""
    sentinel = start.sentinel
    if sentinel is Sentinel.LATEST and latest_since is not None:
        return StartingPosition("AT_TIMESTAMP", timestamp=latest_since)
    if sentinel is Sentinel.SHARD_END:
        raise ValueError(f"shard {shard_id} is checkpointed at SHARD_END: a finished lease is never read")
    if sentinel is Sentinel.AT_TIMESTAMP:
        if at_timestamp is None:
            raise ValueError(f"shard {shard_id} starts AT_TIMESTAMP but no at_timestamp was given")
        return StartingPosition("AT_TIMESTAMP", timestamp=at_timestamp)
    if sentinel is not None:
        return StartingPosition(sentinel.value)
    return at_sequence_number(start.sequence_number)
