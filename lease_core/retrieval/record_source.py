"""The seam between reading a shard and what is done with its records (KCL's RecordsPublisher).

A `Retrieval` is how an application reads its shards: polling (`retrieval.polling`: GetRecords,
paced to the limits a shard shares with its other readers) or enhanced fan-out (`retrieval.fanout`:
SubscribeToShard, the application's own 2 MB/s per shard), as `retrieval` says. It opens a
`RecordSource` per shard, at a `ReadStart`; each `read` hands back the next `ReadBatch`: the user
records after the previous batch's end (KPL aggregates split), the position after them, whether the
shard has ended and with which children, a retention gap met before them, and counters that mean
the same whatever the mode: the calls for records sent, those Kinesis refused for a limit, and how
often the read had to be opened again where it stood. The composition root
(`lease_core.application`) builds the retrieval; the consume job's lease consumer and the leader's
idle check (`retrieval.pending_work`) read through these types alone.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.model.shards import ChildShard
from lease_core.retrieval.kinesis_records import UserRecords
from lease_core.retrieval.retention_gaps import RetentionGap

# Why a batch ended: a limit of `ReadLimits` ("records", "bytes", "time", "stop_at"), the tip of an
# open shard, the end of a closed one, Kinesis refusing the reads or subscriptions past the retry
# policy ("throttled"), a second retention gap (it goes with the next batch), or a closed shard that
# kept answering no end after its last record ("no_shard_end": what was read is committed, SHARD_END
# is not), or the caller's `ReadLimits.cancelled` answering True ("cancelled": its lease was lost).
StopReason = Literal[
    "tip", "records", "bytes", "time", "stop_at", "shard_end", "throttled", "gap", "no_shard_end", "cancelled"
]


@dataclass(frozen=True)
class ShardToRead:
    """A shard, with what the round's listing knows of its end.

    `closed`: the listing gave it an EndingSequenceNumber, so it is read to its end whatever
    MillisBehindLatest says (Kinesis may answer the end only after the last records). A real
    `ending_sequence_number` implies it, and lets the batch that fetches that record look for the end
    even when it is full; kinesis-mock lists 9223372036854775807 for every closed shard, which callers
    pass as unknown (`Shard.known_ending_sequence_number`).
    """

    stream_name: str
    shard_id: str
    closed: bool = False
    ending_sequence_number: str | None = None

    @property
    def known_closed(self) -> bool:
        return self.closed or self.ending_sequence_number is not None


@dataclass(frozen=True)
class ReadStart:
    """Where a read begins: right after `checkpoint`, a lease's committed checkpoint (a position inside
    a KPL aggregate included: the aggregate's later user records follow).

    `first`, when given, is the first record after the checkpoint and is delivered too: a replay of a
    prepared batch starts at its first record. A gap that took it is reported after `checkpoint`.
    `at_timestamp` is what an AT_TIMESTAMP checkpoint means (the application's initial-position
    timestamp); `latest_since` what a LATEST one means for this lease (its pin, `Lease.latest_since`).
    """

    checkpoint: ExtendedSequenceNumber
    first: ExtendedSequenceNumber | None = None
    at_timestamp: datetime | None = None
    latest_since: datetime | None = None

    @property
    def position(self) -> ExtendedSequenceNumber:
        """Where the shard is opened: the first record when given, else the checkpoint."""
        return self.checkpoint if self.first is None else self.first

    @property
    def inclusive(self) -> bool:
        """Whether the record at `position` is delivered (a replay's first record) or dropped (the checkpoint's)."""
        return self.first is not None


@dataclass(frozen=True)
class ReadLimits:
    max_records: int | None = None  # user records (after deaggregation)
    max_bytes: int | None = None  # sum of len(data) of user records
    deadline: float | None = None  # a value of the source's monotonic clock; stop reading once reached
    stop_at: ExtendedSequenceNumber | None = None  # inclusive last position; SHARD_END = to the shard's end
    # Asked before each call for records (or event): True ends the batch with what it holds. A slot
    # whose lease was taken reads no further (by fan-out, its subscription would take the shard from
    # the new holder's again and again).
    cancelled: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        # A limit of 0 would return empty batches forever: a caller bug, not a batch size.
        if self.max_records is not None and self.max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {self.max_records}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {self.max_bytes}")
        if self.stop_at is not None and self.stop_at.is_sentinel and not self.stop_at.is_shard_end:
            raise ValueError(f"stop_at must be a sequence number or SHARD_END, not {self.stop_at}")

    def cancelled_now(self) -> bool:
        return self.cancelled is not None and self.cancelled()

    def stop_at_reached(self, position: ExtendedSequenceNumber | None) -> bool:
        """True when `position` (the last one delivered) is at or past a real stop_at."""
        if self.stop_at is None or self.stop_at.is_shard_end or position is None:
            return False
        return position >= self.stop_at


@dataclass(frozen=True)
class ReadBatch:
    records: UserRecords  # by position, after the previous batch's end, none past stop_at (a Sequence[KinesisRecord])
    end: ExtendedSequenceNumber | None  # SHARD_END when shard_ended, else the last record's position, else None
    shard_ended: bool  # every record of this closed shard has been delivered (this batch or earlier)
    child_shards: tuple[ChildShard, ...]  # the children Kinesis named, reported once the shard ended
    stopped_by: StopReason
    millis_behind_latest: int | None  # from Kinesis' last answer of this batch
    gap: RetentionGap | None  # the gap before this batch's records; a second one waits for the next batch ("gap")
    bytes: int  # sum of len(data) of records
    calls: int  # requests for records sent to Kinesis, refused ones included
    refused_calls: int  # of those, the ones Kinesis refused for a limit (throttled), retried after a backoff
    reopens: int  # times the read was opened again where it stood (an expired iterator)


class RecordSource(Protocol):
    """One shard's records from a `ReadStart`, batch after batch: each read() continues where the last one ended."""

    @property
    def operation(self) -> str:
        """The Kinesis operation it reads with (GetRecords), as errors and messages name it."""
        ...

    def read(self, limits: ReadLimits) -> ReadBatch: ...

    def close(self) -> None:
        """Let go of what the source holds open (a subscription); reading after it opens anew."""
        ...


class Retrieval(Protocol):
    """How an application reads its shards: a `RecordSource` per shard read."""

    def open(
        self, shard: ShardToRead, start: ReadStart, busy_gate: AbstractContextManager[Any] | None = None
    ) -> RecordSource:
        """A source of `shard`'s records from `start`. `busy_gate` is held around each call for records
        and its parsing (not around the waits): a slot reading many shards at once shares a few such
        lanes, so its own threads (the lease heartbeat above all) keep their share of the interpreter.
        Nothing is sent before the first read; a start that cannot be read (a checkpoint at SHARD_END,
        AT_TIMESTAMP without its timestamp) raises ValueError here."""
        ...
