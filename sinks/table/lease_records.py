"""What a table sink keeps on a lease and in its table about the lease's batches, whatever the table
format (`sinks.table.iceberg`, `sinks.table.delta`): the lease's record of its committed
batches the table may not hold yet (receipts and last positions), and the table's position map,
through which position it holds each lease's records, of which incarnation of its stream."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from lease_core.model.lease import Lease
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import ExtendedSequenceNumber
from sinks.batch_sink import BatchRange, StreamIncarnations
from sinks.dead_lettering import split_record
from sinks.errors import SinkError

log = logging.getLogger(__name__)

# Batches a lease's record names at most (about 100 bytes each, against DynamoDB's 400 KB per item).
MAX_WAITING_BATCHES = 1000


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
        """Whether the position may be that of a stream that was deleted since and created again under its
        name: its sequence numbers say nothing about the new stream's (a lease key without the
        stream's creation time, single-stream mode's, names a shard of either). False when the stream's
        current incarnation is not known."""
        known = streams.get(self.stream_name)
        # A position without its incarnation (written by a version that published without describing the
        # stream) cannot be shown to be the stream's as it is now: taking it for the current one would
        # drop a re-created stream's records as already landed.
        return known is not None and known != (self.stream_arn, self.stream_created)


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


def record_after_commit(
    record_type: type[TableLeaseRecord],
    previous: str | None,
    added: tuple[str, RecordEntry] | None,
    not_visible: Callable[[str, list[RecordEntry]], list[RecordEntry]],
    uri: str,
) -> str | None:
    """A lease's record after a commit: the `previous` record's batches the table does not hold yet
    (`not_visible`), then the batch committed now (`added`: its lease key and entry), if any. The
    record only ever names committed ranges."""
    record = record_type.decode(previous)
    entries = list(record.entries) if record is not None else []
    key = record.lease_key if record is not None else None
    if entries and key is not None:
        entries = not_visible(key, entries)
    if added is not None:
        key, entry = added
        if len(entries) >= MAX_WAITING_BATCHES:
            # The lease item would outgrow DynamoDB's 400 KB: the batch stays prepared, and the lease goes
            # on once a round's commit has taken what waits.
            raise SinkError(
                uri,
                f"lease {key} has {len(entries)} committed batches waiting for the table's commit, the most "
                "a lease keeps; the rounds' commits are failing (see the round reports)",
                retryable=True,
            )
        entries.append(entry)
    if key is None or not entries:
        return None
    return record_type(key, tuple(entries)).encode()


def positions_json(
    format_name: str,
    application: str,
    round_number: int,
    positions: Mapping[str, LeasePosition],
    added: Sequence[tuple[BatchRange, int]],
    **extra: Any,
) -> bytes:
    """A commit's position map: through which position the table holds each lease (`leases`), and the
    batches the commit adds with their rows (`batches`, each with the checkpoint it starts after, so
    that a chain of commits can be checked for gaps); `extra`: the sink's own fields."""
    leases = {
        key: {"stream": p.stream_name, "arn": p.stream_arn, "created": p.stream_created, "end": encode_position(p.end)}
        for key, p in sorted(positions.items())
    }
    batches = [
        {
            "lease": batch.lease_key,
            "start": encode_position(batch.start),
            "first": None if batch.first is None else encode_position(batch.first),
            "end": encode_position(batch.end),
            "rows": rows,
        }
        for batch, rows in added
    ]
    document = {"format": format_name, "application": application, "round": round_number, **extra, "leases": leases}
    return json.dumps({**document, "batches": batches}, indent=0).encode()


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


def live_receipts(
    kind: type[TableLeaseRecord], records: Iterable[str | None], pending_tokens: Iterable[str | None]
) -> set[str]:
    """The receipts of the sink whose records are `kind` that the lease table still names: in records
    of committed batches awaiting the table, and as the staged batches of pending checkpoints; the
    output's and its dead letters' alike (the upkeep of either table keeps both)."""
    named = {part for token in pending_tokens for part in split_record(token) if part}
    for record in records:
        for part in split_record(record):
            decoded = kind.decode(part)
            if decoded is not None:
                named.update(entry.receipt for entry in decoded.entries)
    return named


def named_receipts(kind: type[TableLeaseRecord], leases: Sequence[Lease]) -> set[str]:
    """The receipts of the sink whose records are `kind` that `leases` still name (`live_receipts`),
    which its upkeep must keep."""
    pending = [batch.staged for lease in leases if (batch := PendingBatch.decode(lease)) is not None]
    return live_receipts(kind, [lease.committed_batch for lease in leases], pending)


def receipt_json(format_name: str, receipt_id: str, batch: BatchRange, rows: int, **own: Any) -> bytes:
    """A staged batch's receipt: the format's name, its id, the batch's range and rows, and the format's
    own fields (`own`: what names its files)."""
    document = {
        "format": format_name,
        "receipt": receipt_id,
        "lease": batch.lease_key,
        "stream": batch.stream_name,
        "shard": batch.shard_id,
        "start": encode_position(batch.start),
        "first": None if batch.first is None else encode_position(batch.first),
        "end": encode_position(batch.end),
        "rows": rows,
        **own,
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def receipt_document(format_name: str, payload: bytes) -> tuple[dict[str, Any], BatchRange]:
    """A receipt's document and its batch's range; `ValueError` when it is not a receipt of `format_name`."""
    document: dict[str, Any] = json.loads(payload)
    if document.get("format") != format_name:
        raise ValueError(f"not a receipt of ours (format {document.get('format')!r})")
    first = document["first"]
    batch = BatchRange(
        document["lease"],
        document["stream"],
        document["shard"],
        decode_position(document["start"]),
        None if first is None else decode_position(first),
        decode_position(document["end"]),
    )
    return document, batch
