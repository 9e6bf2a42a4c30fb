"""From the records a source fetches to the batches it hands out: the bookkeeping every mode shares.

A source puts what Kinesis answers into a `FetchedRecords`: the records are split into user records
(`kpl_deaggregation`), the ones already fetched are skipped (a re-open starts at the last record
fetched), and so are the ones at or before the start (a checkpoint inside a KPL aggregate names one
user record: the aggregate's earlier ones were delivered before). The first record behind every
start at a sequence number is checked for a retention gap (`retention_gaps`). A `BatchInProgress`
takes records from it until a limit of `ReadLimits` refuses the next one, and becomes the
`ReadBatch` the source hands out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lease_core.model.sequence import SHARD_END, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard
from lease_core.retrieval.kinesis_records import KinesisRecord
from lease_core.retrieval.kpl_deaggregation import user_records
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, ShardToRead, StopReason
from lease_core.retrieval.retention_gaps import GapCheck, RetentionGap


@dataclass
class BatchInProgress:
    """What one read() has gathered so far."""

    limits: ReadLimits
    records: list[KinesisRecord] = field(default_factory=list)
    bytes: int = 0
    at_tip: bool = False  # Kinesis' last answer says the read is at the open shard's tip
    millis_behind_latest: int | None = None
    gap: RetentionGap | None = None
    calls: int = 0
    refused_calls: int = 0
    reopens: int = 0

    def refusal(self, record: KinesisRecord) -> StopReason | None:
        """Why `record` cannot join this batch, or None if it can."""
        stop_at = self.limits.stop_at
        if stop_at is not None and not stop_at.is_shard_end and record.order_key > stop_at.order_key:
            return "stop_at"
        if self.limits.max_records is not None and len(self.records) >= self.limits.max_records:
            return "records"
        # The first record always fits: one record above max_bytes must not stall the shard forever.
        max_bytes = self.limits.max_bytes
        if max_bytes is not None and self.records and self.bytes + len(record.data) > max_bytes:
            return "bytes"
        return None

    def add(self, record: KinesisRecord) -> None:
        self.records.append(record)
        self.bytes += len(record.data)

    def full(self) -> StopReason | None:
        if self.limits.max_records is not None and len(self.records) >= self.limits.max_records:
            return "records"
        if self.limits.max_bytes is not None and self.bytes >= self.limits.max_bytes:
            return "bytes"
        return None

    def finished(self, reason: StopReason, child_shards: tuple[ChildShard, ...]) -> ReadBatch:
        """The batch as handed out, ended by `reason`; `child_shards` are reported only with the shard's end."""
        shard_ended = reason == "shard_end"
        end = SHARD_END if shard_ended else (self.records[-1].position if self.records else None)
        return ReadBatch(
            records=tuple(self.records),
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
        self._buffer: deque[KinesisRecord] = deque()
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

    def take(self, raw: Sequence[Mapping[str, Any]]) -> None:
        """Kinesis' next records (at least one), in order."""
        self._check_gap(raw[0])
        records = user_records(entry for entry in raw if self._not_fetched_yet(entry))
        if records:  # an aggregate holding no user records yields none
            self._fetched_through = records[-1].position
        # A whole aggregate is fetched at once, so a re-open may drop the last one as a whole.
        self._last_raw_sequence_number = int(raw[-1]["SequenceNumber"])
        self._buffer.extend(record for record in records if self._after_start(record))

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
        reason = None
        delivered = None
        while self._buffer:
            reason = batch.refusal(self._buffer[0])
            if reason is not None:
                break
            delivered = self._buffer.popleft()
            batch.add(delivered)
        if delivered is not None:
            self.last_delivered = delivered.position
        return reason

    def _check_gap(self, first: Mapping[str, Any]) -> None:
        check, self._gap_check = self._gap_check, None
        if check is not None:
            gap = check.gap_before(first, self._shard.shard_id, self._shard.stream_name)
            if gap is not None:
                self._unreported_gap = gap

    def _not_fetched_yet(self, entry: Mapping[str, Any]) -> bool:
        last = self._last_raw_sequence_number
        return last is None or int(entry["SequenceNumber"]) > last

    def _after_start(self, record: KinesisRecord) -> bool:
        key = record.order_key
        return key > self._start_key or (self._start_inclusive and key == self._start_key)
