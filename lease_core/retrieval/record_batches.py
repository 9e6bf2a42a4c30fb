"""From the records a source fetches to the batches it hands out: the bookkeeping every mode shares.

A source puts what Kinesis answers into a `FetchedRecords`: the records are split into user records
(`kpl_deaggregation`), the ones already fetched are skipped (a re-open starts at the last record
fetched), and so are the ones at or before the start (a checkpoint inside a KPL aggregate names one
user record: the aggregate's earlier ones were delivered before). The first record behind every
start at a sequence number is checked for a retention gap (`retention_gaps`). A `BatchInProgress`
takes records from it until a limit of `ReadLimits` refuses the next one, and becomes the
`ReadBatch` the source hands out. Records stay columns throughout (`KinesisRecordColumns` as fetched,
`UserRecords` once split): limits and positions are found by bisection and running sums, since a
shard's records come in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lease_core.model.kinesis_record_columns import KinesisRecordColumns
from lease_core.model.sequence import SHARD_END, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard
from lease_core.retrieval.kinesis_records import UserRecords
from lease_core.retrieval.kpl_deaggregation import user_record_columns
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, ShardToRead, StopReason
from lease_core.retrieval.retention_gaps import GapCheck, RetentionGap


@dataclass
class BatchInProgress:
    """What one read() has gathered so far: user records as columns, taken in runs (`take`)."""

    limits: ReadLimits
    parts: list[UserRecords] = field(default_factory=list)
    count: int = 0  # user records gathered
    bytes: int = 0
    at_tip: bool = False  # Kinesis' last answer says the read is at the open shard's tip
    millis_behind_latest: int | None = None
    gap: RetentionGap | None = None
    calls: int = 0
    refused_calls: int = 0
    reopens: int = 0

    @property
    def records(self) -> UserRecords:
        """The user records gathered so far, in order."""
        return UserRecords.concat(self.parts)

    def take(self, records: UserRecords) -> tuple[int, StopReason | None]:
        """Add the longest run of `records` (from their first) that the limits let in: how many were
        added, and why the next one was refused (None when all were added)."""
        fits: int = len(records)
        reason: StopReason | None = None
        stop_at = self.limits.stop_at
        if stop_at is not None and not stop_at.is_shard_end:
            fits = records.first_after(stop_at.order_key)
            reason = "stop_at" if fits < len(records) else None
        if self.limits.max_records is not None and self.count + fits > self.limits.max_records:
            fits, reason = max(0, self.limits.max_records - self.count), "records"
        max_bytes = self.limits.max_bytes
        if max_bytes is not None and fits:
            # The first record always fits: one record above max_bytes must not stall the shard forever.
            within = int(np.searchsorted(np.cumsum(records.data_lengths[:fits]), max_bytes - self.bytes, "right"))
            if not self.count:
                within = max(within, 1)
            if within < fits:
                fits, reason = within, "bytes"
        if fits:
            added = records[:fits]
            self.parts.append(added)
            self.count += fits
            self.bytes += added.bytes
        return fits, reason

    def full(self) -> StopReason | None:
        if self.limits.max_records is not None and self.count >= self.limits.max_records:
            return "records"
        if self.limits.max_bytes is not None and self.bytes >= self.limits.max_bytes:
            return "bytes"
        return None

    def finished(self, reason: StopReason, child_shards: tuple[ChildShard, ...]) -> ReadBatch:
        """The batch as handed out, ended by `reason`; `child_shards` are reported only with the shard's end."""
        shard_ended = reason == "shard_end"
        records = self.records
        end = SHARD_END if shard_ended else (records.position(-1) if records else None)
        return ReadBatch(
            records=records,
            end=end,
            shard_ended=shard_ended,
            child_shards=child_shards if shard_ended else (),
            stopped_by=reason,
            millis_behind_latest=self.millis_behind_latest,
            gap=self.gap,
            bytes=self.bytes,
            calls=self.calls,
            refused_calls=self.refused_calls,
            reopens=self.reopens,
        )


class FetchedRecords:
    """The user records fetched from one shard and not delivered yet, and what a gap before the next
    one is reported after."""

    def __init__(self, shard: ShardToRead, start: ReadStart) -> None:
        self._shard = shard
        self._start_key = start.position.order_key
        self._start_inclusive = start.inclusive
        self._buffer: deque[UserRecords] = deque()
        # What a gap before the next record is reported after: an inclusive start is not read yet.
        self._fetched_through: ExtendedSequenceNumber = start.checkpoint
        self._last_raw_sequence_number: int | None = None  # a re-open starts at it: it is dropped
        self.last_delivered: ExtendedSequenceNumber | None = None
        self._gap_check: GapCheck | None = None
        # Detected, not yet on a batch; it comes before every buffered record (fetches fill an empty buffer).
        self._unreported_gap: RetentionGap | None = None

    def check_first_record(self, sequence_number: str | None, refused: bool = False) -> None:
        """Check the next record fetched for a gap: the shard was just opened at `sequence_number`
        (None: after a LATEST pin that may have aged out); `refused`: Kinesis refused that number and
        the shard was opened at its trim horizon instead."""
        self._gap_check = GapCheck(self._fetched_through, sequence_number, refused)

    @property
    def opens_on_a_dropped_record(self) -> bool:
        """Whether a start at a sequence number now begins with a record that is not delivered: the
        last one fetched (a re-open), or the checkpoint's own (unless the start is inclusive)."""
        return self._last_raw_sequence_number is not None or not self._start_inclusive

    def take(self, raw: Sequence[Mapping[str, Any]]) -> int:
        """Kinesis' next records (at least one), in order: botocore's record dicts, or the columns
        lease_core's clients decode GetRecords into (`KinesisRecordColumns`). The bytes of their user
        records (those already fetched included): what they weigh in a batch."""
        columns = KinesisRecordColumns.of(raw)
        self._check_gap(columns[0])
        last = self._last_raw_sequence_number
        new = columns if last is None else columns[columns.first_after(last) :]
        records = user_record_columns(new)
        if records:  # an aggregate holding no user records yields none
            self._fetched_through = records.position(-1)
        # A whole aggregate is fetched at once, so a re-open may drop the last one as a whole.
        self._last_raw_sequence_number = int(columns.sequence_number(-1))
        after_start = records.first_after(self._start_key)
        if after_start and self._start_inclusive and records.order_key(after_start - 1) == self._start_key:
            after_start -= 1
        if after_start < len(records):
            self._buffer.append(records[after_start:])
        return records.bytes

    def take_none_left(self) -> None:
        """Kinesis answered no records with nothing after them (the tip, or the shard's end)."""
        if self._gap_check is not None:
            gap = self._gap_check.gap_with_nothing_left()
            if gap is not None:
                self._unreported_gap, self._gap_check = gap, None

    def deliver(self, batch: BatchInProgress) -> StopReason | None:
        """Move buffered records into `batch` until it refuses one; why it did, or None when the buffer ran dry."""
        if self._unreported_gap is not None:
            if batch.gap is not None:  # a batch reports one gap: this one goes with the records behind it
                return "gap"
            batch.gap, self._unreported_gap = self._unreported_gap, None
        while self._buffer:
            head = self._buffer[0]
            taken, reason = batch.take(head)
            if taken:
                self.last_delivered = head.position(taken - 1)
            if reason is not None:
                self._buffer[0] = head[taken:]
                return reason
            self._buffer.popleft()
        return None

    def _check_gap(self, first: Mapping[str, Any]) -> None:
        check, self._gap_check = self._gap_check, None
        if check is not None:
            gap = check.gap_before(first, self._shard.shard_id, self._shard.stream_name)
            if gap is not None:
                self._unreported_gap = gap
