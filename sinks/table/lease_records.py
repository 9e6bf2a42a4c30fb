"""What a table sink keeps on a lease and in its table about the lease's batches, whatever the table
format (`sinks.table.iceberg`, `sinks.table.delta`): the lease's record of its committed
batches the table may not hold yet (receipts and last positions), and the table's position map,
through which position it holds each lease's records, of which incarnation of its stream."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from sinks.batch_sink import BatchRange, StagedBatch, StreamIncarnations, Visibility
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


class TableRecordKeeping(ABC):
    """What a table sink's lease records mean against its table, whatever the format: a lease's record
    keeps the committed batches past the lease's position in the application's position map; a batch
    is visible once the map holds it, and can still be published while its receipt is there.

    The map is read once per sink (a slot's commits, an idle check over every lease) and may be older
    than the table, which only ever makes a sink keep or report a batch the table already holds,
    never the reverse. A sink provides the map and its receipts (the abstract methods)."""

    RECORD: ClassVar[type[TableLeaseRecord]]
    streams: StreamIncarnations
    _known: tuple[dict[str, LeasePosition]] | tuple[()] | None = None  # (map,); (): no table; None: unread

    @property
    @abstractmethod
    def uri(self) -> str: ...

    @abstractmethod
    def _load_positions(self) -> dict[str, LeasePosition] | None:
        """The application's position map in the table as it is now (None: there is no table)."""

    @abstractmethod
    def _has_receipt(self, receipt_id: str) -> bool: ...

    @abstractmethod
    def _receipt_batch(self, receipt_id: str) -> BatchRange | None:
        """The range of the staged batch `receipt_id` (None: its receipt is gone)."""

    def _known_positions(self) -> dict[str, LeasePosition] | None:
        if self._known is None:
            positions = self._load_positions()
            self._known = () if positions is None else (positions,)
        return self._known[0] if self._known else None

    def _now_holds(self, positions: dict[str, LeasePosition] | None) -> None:
        """The map after this sink's own commit (None: read it again when next needed)."""
        self._known = None if positions is None else (positions,)

    def commit_record(self, previous: str | None, staged: StagedBatch | None) -> str | None:
        """The lease's record after committing `staged`: the previous record's batches the table does
        not hold yet, then `staged`'s (the record only ever names committed ranges)."""
        added = None
        if staged is not None and staged.token is not None:
            batch = self._receipt_batch(staged.token)
            if batch is None:
                raise SinkError(self.uri, f"the staged batch {staged.token} is gone before its commit", retryable=True)
            added = (batch.lease_key, RecordEntry(staged.token, batch.end))
        return record_after_commit(self.RECORD, previous, added, self._not_visible, self.uri)

    def make_visible(self, record: str | None) -> Visibility:
        decoded = self.RECORD.decode(record)
        if decoded is None or not self._not_visible(decoded.lease_key, list(decoded.entries)):
            return Visibility.VISIBLE
        return Visibility.AT_ROUND_END

    def awaiting_visibility(self, record: str | None) -> tuple[str, ...]:
        """The committed batches of `record` the table does not hold yet and can still take: a batch
        whose receipt is gone (or whose table is) can never be committed, so it is not named."""
        decoded = self.RECORD.decode(record)
        if decoded is None:
            return ()
        waiting = self._not_visible(decoded.lease_key, list(decoded.entries))
        if not waiting or self._known_positions() is None:
            return ()
        return tuple(
            f"{decoded.lease_key} up to {entry.end} (receipt {entry.receipt})"
            for entry in waiting
            if self._has_receipt(entry.receipt)
        )

    def awaiting_from(self, lease: Lease) -> ExtendedSequenceNumber | None:
        """Where the batches the lease's record waits to publish begin (`leasectl verify`): the first
        waiting batch's start, from its receipt; None when none waits, or the first one's receipt is
        gone (then it can never be published, and verify says the checkpoint is ahead)."""
        decoded = self.RECORD.decode(split_record(lease.committed_batch)[0])
        if decoded is None:
            return None
        waiting = sorted(self._not_visible(decoded.lease_key, list(decoded.entries)), key=lambda entry: entry.end)
        batch = self._receipt_batch(waiting[0].receipt) if waiting else None
        return None if batch is None else batch.start

    def _not_visible(self, lease_key: str, entries: list[RecordEntry]) -> list[RecordEntry]:
        """The entries past the lease's position in this sink's view of the table (class doc)."""
        held = held_position(self._known_positions() or {}, lease_key, self.streams)
        return [entry for entry in entries if held is None or entry.end > held]


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
