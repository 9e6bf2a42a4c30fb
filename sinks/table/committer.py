"""One commit protocol for every table format (docs/architecture.md, "The Iceberg sink"): `TableCommitter`
implements it once over a few primitives that each format provides (`sinks.table.iceberg`,
`sinks.table.delta`), as the lease store implements KCL's writes once over its backends' items.

What a table holds of an application is read in one way, here, by the sink deciding what to publish,
by the idle check, by `leasectl verify` and by `leasectl restore` alike:

- The application's commits *in effect* are those the table's current state descends from, newest
  first (`TableHistory`): an Iceberg table's `main` history, a Delta log read back from its head with
  a `RESTORE` followed to the version it restored. A rolled-back commit is not in effect, whatever else
  (a table property, a transaction id) still names it.
- Every commit writes the application's position map: per lease, through which position the table
  holds its records, and of which incarnation of its stream (ARN and creation time). The newest
  commit in effect holds; when expiry or log cleanup cut the history before any commit of the
  application, the format names the map that stood before (`TableHistory.earlier`).
- A batch is visible exactly when its last position is at or before its lease's position, in the same
  stream incarnation. A batch that begins before that position and ends after it is never published
  whole (`publish_round` refuses it, naming both positions; the consumer trims a batch it reads to what
  the table lacks before staging it, `holds_through`).
- A position is never written without its stream's incarnation (a multi-stream lease key names it
  itself): a round that could not describe a stream fails its publication, retryably, and the batches
  wait for the next round.

A commit is planned on one head and made on it: a conflict (another writer committed first) plans
again on the new head, and a commit whose answer was lost is looked for by its commit id.
"""

from __future__ import annotations

import abc
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import pyarrow as pa

from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.ops.landed_audit import LandedBatch
from sinks.batch_sink import BatchRange, RoundIdentity, RoundPublication, StagedBatch, StreamIncarnations, Visibility
from sinks.dead_lettering import split_record
from sinks.errors import SinkError
from sinks.table.lease_records import (
    LeasePosition,
    RecordEntry,
    TableLeaseRecord,
    decode_position,
    encode_position,
    held_position,
    position_text,
    positions_json,
    record_after_commit,
)

log = logging.getLogger(__name__)

# A round's commit is tried again after a conflict with another writer, with every check run again.
COMMIT_ATTEMPTS = 8
STAGED_READERS = 16  # staged batches a round's commit reads at once (object store round trips)
# Batches a commit's summary names at most (it stays in the table's metadata every reader loads; the
# position map names every one).
RANGES_SHOWN = 100
# Commit summary keys, the same in every format (plain text in `$snapshots` and `DESCRIBE HISTORY`).
SUMMARY_APPLICATION = "kinesis.application"
SUMMARY_ROUND = "kinesis.round"
SUMMARY_COMMIT_ID = "kinesis.commit-id"
SUMMARY_STREAMS = "kinesis.streams"
SUMMARY_RANGES = "kinesis.ranges"
SUMMARY_POSITIONS = "kinesis.positions-file"


class CommitConflict(Exception):
    """Another writer committed first: the plan must be made again on the new head."""


class CommitOutcomeUnknown(Exception):
    """The commit's answer was lost: it may or may not have landed."""


class StagedReceipt(Protocol):
    """A staged batch as a format describes it: its range and rows, and whatever names its files."""

    @property
    def batch(self) -> BatchRange: ...

    @property
    def rows(self) -> int: ...

    def range_text(self) -> str: ...


@dataclass(frozen=True)
class OwnCommit:
    """One of the application's commits: the format's id of it (snapshot id, table version) and the
    position map it wrote."""

    ref: int
    positions_path: str


@dataclass(frozen=True)
class TableHistory:
    """The application's commits in effect in the table, newest first, and the position map that stood
    before the oldest of them when the table no longer shows what came before (its history was cut by
    expiry or log cleanup); `earlier` alone when no commit of the application is left to show."""

    commits: tuple[OwnCommit, ...]
    earlier: str | None = None


@dataclass(frozen=True)
class CommitPlan:
    """What a round's commit adds: the staged batches past their leases' positions, in order, and the
    position map after it."""

    receipts: Sequence[Any]  # the format's StagedReceipt
    positions: Mapping[str, LeasePosition]
    already_visible: int
    missing: tuple[str, ...]
    losses: tuple[Mapping[str, Any], ...] = ()  # every named loss of the application's the table records
    settled: int = 0  # leases whose position moves to their checkpoint over records named lost, without a batch


@dataclass
class _PositionCache:
    """The position map as this sink last read it (a slot's commits, an idle check over every lease):
    older than the table at worst, which only makes a sink keep or report a batch the table holds
    already, never the reverse."""

    read: bool = False
    positions: dict[str, LeasePosition] | None = None
    batches: dict[str, BatchRange] = field(default_factory=dict)  # this process's staged batches, by receipt
    # A slot's leases start at once, and each would read the table (load it, read its position map)
    # while none has yet: one reads, the others wait for what it read.
    reading: threading.Lock = field(default_factory=threading.Lock)


_NEW_CACHE = threading.Lock()  # a sink's cache is made once, whichever of its threads asks first


class TableCommitter(abc.ABC):
    """The exactly-once protocol of a table sink (module doc), over its format's primitives."""

    RECORD: ClassVar[type[TableLeaseRecord]]
    POSITIONS_FORMAT: ClassVar[str]  # the position maps' `format`
    application: str
    streams: StreamIncarnations

    # --- the format's primitives ----------------------------------------------------------------

    @property
    @abc.abstractmethod
    def uri(self) -> str: ...

    @abc.abstractmethod
    def _head(self) -> Any | None:
        """The table as it is now, read afresh; None when there is none."""

    @abc.abstractmethod
    def _history(self, head: Any, *, complete: bool) -> TableHistory:
        """The application's commits in effect in `head` (`TableHistory`): all of them when `complete`,
        else at least the newest (what the position map in effect needs)."""

    @abc.abstractmethod
    def _committed_before(self, head: Any) -> bool:
        """Whether the application ever committed to the table, its commits rolled back or expired since
        included (what survives both: an Iceberg table property, the Delta transaction)."""

    @abc.abstractmethod
    def _read_map(self, path: str) -> dict[str, Any]:
        """A position map's document; `SinkError` naming it when it cannot be read."""

    @abc.abstractmethod
    def _staged_receipt(self, receipt_id: str) -> StagedReceipt | None:
        """The staged batch `receipt_id`, None when its receipt or any of its files is gone."""

    @abc.abstractmethod
    def _commit(self, head: Any, plan: CommitPlan, document: bytes, summary: dict[str, str]) -> int | None:
        """Add the plan's batches in one commit on `head` that writes the position map `document` and
        carries `summary`, and return its id (None: not known). `CommitConflict` when another writer
        committed first, `CommitOutcomeUnknown` when its answer was lost."""

    @abc.abstractmethod
    def _find_commit(self, commit_id: str) -> int | None:
        """The id of the commit whose summary carries `commit_id`, None when it did not land."""

    @abc.abstractmethod
    def visible_rows(self, columns: Sequence[str] | None = None) -> pa.Table | None:
        """The rows readers of the table see now (of `columns`, else every column); None: no table."""

    # --- what the table holds ------------------------------------------------------------------

    def positions_in(self, head: Any) -> dict[str, LeasePosition]:
        """The application's position map in effect in `head` ({} when it has none)."""
        return lease_positions(self._map_in(head))

    def _map_in(self, head: Any) -> Mapping[str, Any]:
        """The document of the application's position map in effect in `head` (empty when it has none)."""
        history = self._history(head, complete=False)
        path = history.commits[0].positions_path if history.commits else history.earlier
        return {"leases": {}} if path is None else self._read_map(path)

    def stream_names(self) -> set[str]:
        """The streams the application's position map in effect names (it keeps every lease it ever
        committed, so it names every stream of the application's commits in effect)."""
        head = self._head()
        return set() if head is None else {position.stream_name for position in self.positions_in(head).values()}

    def holds_through(self, batch: BatchRange) -> ExtendedSequenceNumber | None:
        """The position through which readers see the batch's lease's records of its stream's current
        incarnation already (None: none), as this sink last read the table."""
        return held_position(self._known_positions() or {}, batch.lease_key, self.streams)

    def landed_batches(self) -> list[LandedBatch]:
        """Every batch the application's commits in effect added, oldest commit first, of the streams'
        current incarnations (a re-created stream's lease keys may be the old one's). Before them, each
        lease the oldest such commit found held already appears as a batch from that position to
        itself: the table holds it there, though the commits that added it are gone from its history
        (expired, or its log cleaned up)."""
        head = self._head()
        if head is None:
            return []
        history = self._history(head, complete=True)
        documents = [(commit.ref, self._read_map(commit.positions_path)) for commit in reversed(history.commits)]
        base_ref = documents[0][0] if documents else 0
        if documents:
            oldest = documents[0][1]
            added = {batch["lease"] for batch in oldest.get("batches", ())}
            before = {key: held for key, held in oldest.get("leases", {}).items() if key not in added}
            base_round = int(oldest.get("round", 0))
        elif history.earlier is not None:
            earlier = self._read_map(history.earlier)
            before, base_round = earlier.get("leases", {}), int(earlier.get("round", 0))
        else:
            before, base_round = {}, 0
        landed = [
            LandedBatch(key, end, end, base_round, base_ref)
            for key, held in sorted(before.items())
            if self._current(key, held)
            for end in [decode_position(held["end"])]
        ]
        for ref, document in documents:
            leases = document.get("leases", {})
            landed.extend(
                LandedBatch(
                    batch["lease"],
                    decode_position(batch["start"]),
                    decode_position(batch["end"]),
                    int(document.get("round", 0)),
                    ref,
                )
                for batch in document.get("batches", ())
                if self._current(batch["lease"], leases.get(batch["lease"]))
            )
        newest = documents[-1][1] if documents else self._read_map(history.earlier) if history.earlier else {}
        landed.extend(
            LandedBatch(
                loss["lease"],
                TRIM_HORIZON if loss["after"] is None else decode_position(loss["after"]),
                decode_position(loss["end"]),
                int(loss["round"]),
                0,
                lost=True,
            )
            for loss in newest.get("losses", ())
            if self._current(loss["lease"], loss)
        )
        return landed

    def _current(self, lease_key: str, held: Mapping[str, Any] | None) -> bool:
        """Whether a map's entry for the lease is of its stream's current incarnation."""
        if held is None:
            return True
        position = LeasePosition(held["stream"], held.get("arn"), held.get("created"), decode_position(held["end"]))
        return ":" in lease_key or not position.of_another_incarnation(self.streams)

    # --- the lease's record of its committed batches ------------------------------------------------

    _cache: _PositionCache | None = None

    def _known_positions(self) -> dict[str, LeasePosition] | None:
        cache = self._position_cache()
        with cache.reading:
            if not cache.read:
                head = self._head()
                cache.positions = None if head is None else self.positions_in(head)
                cache.read = True
        return cache.positions

    def _position_cache(self) -> _PositionCache:
        with _NEW_CACHE:
            if self._cache is None:
                self._cache = _PositionCache()
            return self._cache

    def _remember_staged(self, receipt_id: str, batch: BatchRange) -> None:
        """A batch this process staged, for its commit record (its receipt need not be read again)."""
        self._position_cache().batches[receipt_id] = batch

    def _receipt_batch(self, receipt_id: str) -> BatchRange | None:
        known = self._position_cache().batches.get(receipt_id)
        if known is not None:
            return known
        receipt = self._staged_receipt(receipt_id)
        return None if receipt is None else receipt.batch

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
        whose staged data is gone (or whose table is) can never be committed, so it is not named."""
        decoded = self.RECORD.decode(record)
        if decoded is None:
            return ()
        waiting = self._not_visible(decoded.lease_key, list(decoded.entries))
        if not waiting or self._known_positions() is None:
            return ()
        return tuple(
            f"{decoded.lease_key} up to {entry.end} (receipt {entry.receipt})"
            for entry in waiting
            if self._staged_receipt(entry.receipt) is not None
        )

    def awaiting_from(self, lease: Lease) -> ExtendedSequenceNumber | None:
        """Where the batches the lease's record waits to publish begin (`leasectl verify`): the first
        waiting batch's start; None when none waits, or the first one's staged data is gone (then it can
        never be published, and verify says the checkpoint is ahead)."""
        decoded = self.RECORD.decode(split_record(lease.committed_batch)[0])
        if decoded is None:
            return None
        waiting = sorted(self._not_visible(decoded.lease_key, list(decoded.entries)), key=lambda entry: entry.end)
        receipt = self._staged_receipt(waiting[0].receipt) if waiting else None
        return None if receipt is None else receipt.batch.start

    def _not_visible(self, lease_key: str, entries: list[RecordEntry]) -> list[RecordEntry]:
        """The entries past the lease's position in this sink's view of the table."""
        held = held_position(self._known_positions() or {}, lease_key, self.streams)
        return [entry for entry in entries if held is None or entry.end > held]

    # --- the round's commit, by the driver -------------------------------------------------------

    def publish_round(self, records: Mapping[str, str], identity: RoundIdentity) -> RoundPublication:
        waiting = {
            key: decoded
            for key, record in records.items()
            if (decoded := self.RECORD.decode(record)) is not None and decoded.entries
        }
        if not waiting and not identity.checkpoints:
            return RoundPublication(0, 0, 0)
        commit_id = uuid.uuid4().hex
        staged: dict[str, StagedReceipt | None] = {}  # receipt id -> the staged batch, read once for every attempt
        for _ in range(COMMIT_ATTEMPTS):
            head = self._head()
            if head is None and not waiting:
                return RoundPublication(0, 0, 0)
            if head is None:
                raise SinkError(self.uri, "the table is gone: committed batches were staged into it")
            plan = self._plan(head, waiting, identity, staged)
            if not plan.receipts and not plan.settled:
                return RoundPublication(0, 0, plan.already_visible, plan.missing)
            document = positions_json(
                self.POSITIONS_FORMAT,
                self.application,
                identity.round_number,
                plan.positions,
                [(receipt.batch, receipt.rows) for receipt in plan.receipts],
                commit=commit_id,
                losses=list(plan.losses),
            )
            try:
                landed = self._commit(head, plan, document, self._summary(plan, identity, commit_id))
            except CommitConflict as conflict:
                log.info("%s: another writer committed first (%s); planning again on the new head", self.uri, conflict)
                continue
            except CommitOutcomeUnknown as unknown:
                landed = self._find_commit(commit_id)
                if landed is None:
                    log.warning("%s: a commit's answer was lost (%s) and it did not land; again", self.uri, unknown)
                    continue
            self._cache = None
            return RoundPublication(1, len(plan.receipts), plan.already_visible, plan.missing, landed)
        raise SinkError(
            self.uri, f"the round's commit met a newer head {COMMIT_ATTEMPTS} times in a row", retryable=True
        )

    def _plan(
        self,
        head: Any,
        waiting: Mapping[str, TableLeaseRecord],
        identity: RoundIdentity,
        staged: dict[str, StagedReceipt | None],
    ) -> CommitPlan:
        """Every waiting batch past its lease's position in `head`, in order. A batch whose staged data
        is gone is named as lost; a batch that begins before the lease's position and ends after it is
        refused, named with both positions, with the lease's later batches (publishing it whole would
        land records twice). A batch that starts after the lease's position (or, in a table the
        application committed to before, a lease's first batch that starts after a record) leaves records
        out: named, and recorded in the position map with every loss named before (`losses`), which
        outlives the history that shows the gap. The receipts are read once per publication, whatever
        the attempts."""
        document = self._map_in(head)
        positions = lease_positions(document)
        losses = list(document.get("losses", ()))
        committed_before = self._committed_before(head)
        updated = dict(positions)
        receipts, already, missing = [], 0, []
        unread: list[str] = []
        for key, record in waiting.items():
            held = held_position(positions, key, identity.streams)
            unread.extend(
                entry.receipt
                for entry in record.entries
                if (held is None or entry.end > held) and entry.receipt not in staged
            )
        with ThreadPoolExecutor(max_workers=STAGED_READERS) as pool:  # object store round trips, at once
            staged.update(zip(unread, pool.map(self._staged_receipt, unread)))
        unsettled = set()  # leases with a batch refused (or lost, unrecorded): their checkpoint says nothing more
        settled = 0  # leases whose position moves over records named lost, without a batch
        for key, record in sorted(waiting.items()):
            held = held_position(positions, key, identity.streams)
            previous = held  # where the next entry's batch starts: its receipt may be gone
            for entry in sorted(record.entries, key=lambda entry: entry.end):
                if held is not None and entry.end <= held:
                    already += 1
                    continue
                receipt, after = staged[entry.receipt], previous
                previous = entry.end
                if receipt is None:
                    missing.append(f"{key}: the batch {'' if after is None else f'after {after} '}up to {entry.end}")
                    lost = self._lost_position(key, entry.end, updated, identity)
                    if lost is None:  # no stream to record it under: named only
                        unsettled.add(key)
                        continue
                    # On record, and the table's position past it: the lease's next batch continues there.
                    losses.append(loss_entry(key, lost, after, entry.end, identity.round_number))
                    updated[key], held = lost, entry.end
                    settled += 1
                    continue
                batch = receipt.batch
                if held is not None and batch.start < held:
                    missing.append(
                        f"{key}: the batch after {batch.start} up to {batch.end} was refused: the table holds the "
                        f"lease through {held} already, and publishing it whole would land records twice"
                    )
                    unsettled.add(key)
                    break
                incarnation = identity.streams.get(batch.stream_name, (None, None))
                if incarnation == (None, None) and ":" not in key:  # (a multi-stream key names its incarnation)
                    raise SinkError(
                        self.uri,
                        f"stream {batch.stream_name!r} could not be described this round: its ARN and creation time "
                        "are needed to record what the table holds of it (the batches wait for the next round)",
                        retryable=True,
                    )
                position = LeasePosition(batch.stream_name, incarnation[0], incarnation[1], batch.end)
                gap = self._gap(key, held, batch, committed_before) if identity.checks_continuity else None
                if gap is not None:
                    missing.append(gap)
                    losses.append(loss_entry(key, position, held, batch.start, identity.round_number))
                receipts.append(receipt)
                updated[key] = position
                held = batch.end
        for key, checkpoint in sorted(identity.checkpoints.items()):
            held = held_position(updated, key, identity.streams)
            if key in unsettled or held is None or checkpoint.is_sentinel or checkpoint <= held:
                continue
            # Committed, not in the table, and named by no batch waiting for it: a rollback took the batches
            # out after the lease's record had dropped them. Named once: the table's position moves to the
            # checkpoint with the loss on record, and the lease's next batch continues from there.
            current = updated[key]
            arn, created = identity.streams.get(current.stream_name, (current.stream_arn, current.stream_created))
            position = LeasePosition(current.stream_name, arn, created, checkpoint)
            missing.append(
                f"{key}: the table holds the lease through {held}, but it is committed through {checkpoint} and no "
                "batch waits to fill the difference: the records between are not in the table (rolled back)"
            )
            losses.append(loss_entry(key, position, held, checkpoint, identity.round_number))
            updated[key] = position
            settled += 1
        return CommitPlan(receipts, updated, already, tuple(missing), tuple(losses), settled)

    @staticmethod
    def _lost_position(
        key: str, end: ExtendedSequenceNumber, positions: Mapping[str, LeasePosition], identity: RoundIdentity
    ) -> LeasePosition | None:
        """The lease's position at `end`, past a batch named lost whose staged data is gone (so its stream
        is not known from it): of the stream the table holds the lease in, else the one a multi-stream
        key names, else the round's only stream. None when none of them tells."""
        known = positions.get(key)
        if known is not None:
            name = known.stream_name
        elif key.count(":") >= 3:  # account:stream:creation epoch:shard
            name = key.split(":")[1]
        elif len(identity.streams) == 1:
            (name,) = identity.streams
        else:
            return None
        arn, created = identity.streams.get(name, (None, None))
        if (arn, created) == (None, None) and known is not None:
            arn, created = known.stream_arn, known.stream_created
        if (arn, created) == (None, None) and ":" not in key:  # never a position without its incarnation
            return None
        return LeasePosition(name, arn, created, end)

    @staticmethod
    def _gap(key: str, held: ExtendedSequenceNumber | None, batch: BatchRange, committed_before: bool) -> str | None:
        """The records a batch leaves out of the table, named; None when it continues the lease's records.
        A lease the table holds nothing of (of its stream's current incarnation) whose batch starts after
        a record lost what came before when the application committed to the table before (its commits
        were rolled back past the lease's first); in a table new to the application, the lease began
        before the table did."""
        if held is not None and batch.start > held:
            return (
                f"{key}: the table holds the lease through {held}, but its next batch starts after {batch.start}: "
                "the records between are not in the table (rolled back, or skipped)"
            )
        if held is None and committed_before and not batch.start.is_sentinel:
            return (
                f"{key}: the table holds none of the lease's records, but its next batch starts after "
                f"{batch.start}: the records up to there are not in the table (rolled back, or skipped)"
            )
        return None

    def _summary(self, plan: CommitPlan, identity: RoundIdentity, commit_id: str) -> dict[str, str]:
        shown = "; ".join(receipt.range_text() for receipt in plan.receipts[:RANGES_SHOWN])
        hidden = len(plan.receipts) - RANGES_SHOWN
        return {
            SUMMARY_APPLICATION: identity.application,
            SUMMARY_ROUND: str(identity.round_number),
            SUMMARY_COMMIT_ID: commit_id,
            SUMMARY_STREAMS: "; ".join(
                f"{name} {arn} created {created}" for name, (arn, created) in sorted(identity.streams.items())
            ),
            SUMMARY_RANGES: shown if hidden <= 0 else f"{shown}; and {hidden} more (see {SUMMARY_POSITIONS})",
        }


def loss_entry(
    key: str,
    position: LeasePosition,
    after: ExtendedSequenceNumber | None,
    end: ExtendedSequenceNumber,
    round_number: int,
) -> dict[str, Any]:
    """A named loss as the position map records it: the lease's records after `after` (None: from its
    first) through `end`, of the stream incarnation of `position`, named by the round `round_number`."""
    return {
        "lease": key,
        "stream": position.stream_name,
        "arn": position.stream_arn,
        "created": position.stream_created,
        "after": None if after is None else encode_position(after),
        "end": encode_position(end),
        "round": round_number,
    }


def lease_positions(document: Mapping[str, Any]) -> dict[str, LeasePosition]:
    """A position map document's positions per lease."""
    return {
        key: LeasePosition(value["stream"], value.get("arn"), value.get("created"), decode_position(value["end"]))
        for key, value in document["leases"].items()
    }


def range_text(batch: BatchRange) -> str:
    """`<shard> <first>..<end>` (positions as `sequence-subsequence`), for commit summaries."""
    first = batch.first if batch.first is not None else batch.start
    return f"{batch.shard_id} {position_text(first)}..{position_text(batch.end)}"
