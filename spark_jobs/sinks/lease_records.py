"""What a table sink keeps on a lease and in its table about the lease's batches, whatever the table
format (`spark_jobs.sinks.iceberg`, `spark_jobs.sinks.delta`): the lease's record of its committed
batches the table may not hold yet (receipts and last positions), and the table's position map,
through which position it holds each lease's records, of which incarnation of its stream."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from lease_core.model.sequence import ExtendedSequenceNumber
from spark_jobs.sinks.batch_sink import StreamIncarnations

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordEntry:
    """One committed batch a lease record names: its receipt and its last position."""

    receipt: str
    end: ExtendedSequenceNumber


@dataclass(frozen=True)
class TableLeaseRecord:
    """What a lease's commit records for a table sink: its committed batches the table may not hold
    yet. Each sink's record names its format (`FORMAT`), so that one sink never reads another's."""

    FORMAT: ClassVar[str]

    lease_key: str
    entries: tuple[RecordEntry, ...]

    def encode(self) -> str:
        batches = [[entry.receipt, *encode_position(entry.end)] for entry in self.entries]
        document = {"f": self.FORMAT, "lease": self.lease_key, "batches": batches}
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def decode(cls, record: str | None) -> Self | None:
        """The record, or None for no record or one that is not this sink's (a Parquet file name)."""
        if not record or not record.startswith("{"):
            return None
        try:
            document = json.loads(record)
            if document.get("f") != cls.FORMAT:
                return None
            entries = tuple(
                RecordEntry(str(receipt), decode_position([sequence, sub]))
                for receipt, sequence, sub in document["batches"]
            )
            return cls(str(document["lease"]), entries)
        except (ValueError, KeyError, TypeError):
            log.warning(
                "a lease record %r looks like a %s record but cannot be read; ignored", record[:200], cls.FORMAT
            )
            return None


@dataclass(frozen=True)
class LeasePosition:
    """Through which position the table holds a lease's records, and of which stream."""

    stream_name: str
    stream_arn: str | None
    stream_created: int | None
    end: ExtendedSequenceNumber

    def of_another_incarnation(self, streams: StreamIncarnations) -> bool:
        """Whether the position is that of a stream that was deleted since and created again under its
        name: its sequence numbers say nothing about the new stream's (a lease key without the
        stream's creation time, single-stream mode's, names a shard of either)."""
        known = streams.get(self.stream_name)
        return known is not None and self.stream_created is not None and known != (self.stream_arn, self.stream_created)


def held_position(
    positions: Mapping[str, LeasePosition], lease_key: str, streams: StreamIncarnations
) -> ExtendedSequenceNumber | None:
    """Through which position the table holds the lease's records of the stream as it is now. A
    multi-stream lease key (`account:stream:creation epoch:shard`) names its stream's incarnation
    itself: the position under it is that incarnation's, whatever the stream of that name is now
    (a former stream's lease, still waiting for its batches, must not publish them again)."""
    held = positions.get(lease_key)
    if held is None:
        return None
    if ":" not in lease_key and held.of_another_incarnation(streams):
        return None
    return held.end


def position_text(position: ExtendedSequenceNumber) -> str:
    """`<sequence>-<sub>` (a sentinel's name for a sentinel), for names and summaries."""
    if position.is_sentinel:
        return position.sequence_number
    return f"{int(position.sequence_number)}-{position.sub_sequence_number}"


def encode_position(position: ExtendedSequenceNumber) -> list[Any]:
    return [position.sequence_number, position.sub_sequence_number]


def decode_position(raw: Any) -> ExtendedSequenceNumber:
    if not isinstance(raw, list) or len(raw) != 2:
        raise ValueError(f"a position is [sequence number, sub-sequence number], got {raw!r}")
    return ExtendedSequenceNumber(str(raw[0]), int(raw[1]))
