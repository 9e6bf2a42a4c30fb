"""One lease's work in one round: redo a prepared batch, then read, land and commit new batches.

The exactly-once protocol of DESIGN.md §5, per batch, for a lease at committed checkpoint C:
1. A pending checkpoint P means a batch (C, P] was prepared and maybe staged: redo exactly it. If
   the preparing attempt's staged file exists (staged atomically, so complete), it is copied to this
   attempt's own staged name instead of reading the range again; then commit and promote.
2. Otherwise read after C to a bound, ending at the last record read E; prepare E (counter- and
   claim-conditional, with the batch's description as pendingCheckpointState); stage the batch's
   file under this attempt's own name (readers skip it) beside its visible name, a pure function of
   (stream, shard, C, E); commit E, naming the staged file in `committedBatchFile`; promote it.
3. At a closed shard's end, once every record is committed: create the child leases (in one
   transaction fenced by this holder) and commit SHARD_END.
Every write goes through the `HeldLease`, so an attempt that lost the lease never commits, and a
file is visible only once its range is committed: whatever a fenced attempt still writes stays
staged, invisible. A committed file whose promotion was cut short is promoted by the lease's next
holder (`promote_committed_batch`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

from lease_core.errors import ConfigurationError, CorruptLeaseError, DependencyError, LeaseCoreError, LeaseLostError
from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.lifecycle.lease_lifecycle import create_child_leases
from lease_core.metrics.throughput import (
    arrival_rate_kbps,
    covered_window,
    ema_throughput,
    measurement_before_claim,
)
from lease_core.model.lease import AgedOutRange, Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard
from lease_core.retrieval.kinesis_records import KinesisRecord
from lease_core.retrieval.shard_reader import KINESIS_SHARD_READ_BYTES_PER_SECOND, ReadBatch, ReadLimits, ShardReader
from lease_core.retrieval.shard_source import KinesisShardSource, child_shards_of
from lease_core.retry import RetryPolicy
from lease_core.store.lease_store import LeaseStore
from spark_jobs.round_report import LeaseReport, Outcome, RetentionLoss
from spark_jobs.sinks.parquet import PARTITION_COLUMNS, ParquetSink, Promotion, staged_path, visible_path
from spark_jobs.sinks.record_columns import records_table
from spark_jobs.transform import Transform, apply_transform

log = logging.getLogger(__name__)

# How a fresh read's stop reason ends the lease's round when the batch was not cut by a budget.
_STOP_OUTCOMES = {
    "tip": Outcome.CAUGHT_UP,
    "time": Outcome.LIMIT,
    "throttled": Outcome.THROTTLED,
}


# Outcomes after which the shard holds nothing this lease has yet to read.
_NOTHING_LEFT_TO_READ = frozenset({Outcome.SHARD_END, Outcome.MERGE_DEFERRED, Outcome.FINISHED})


@dataclass(frozen=True)
class LeaseBudget:
    """Bounds on one lease's work in one round; None means unbounded."""

    max_records: int | None = None
    max_bytes: int | None = None
    max_seconds: float | None = None
    file_max_records: int = 100_000
    file_max_bytes: int = 128 * 1024 * 1024
    stop_at_arrival: datetime | None = None  # a backfill window's end: records arriving at or after it are not read


@dataclass(frozen=True)
class LeaseContext:
    """What a lease consumer needs from its slot."""

    store: LeaseStore
    kinesis: Any
    sink: ParquetSink
    transform_spec: str | None
    transform: Transform | None
    retry_policy: RetryPolicy
    at_timestamp: datetime | None
    budget: LeaseBudget
    read_bytes_per_second: float | None = KINESIS_SHARD_READ_BYTES_PER_SECOND  # None: paced by calls only
    # Closed shards by lease key, with their known EndingSequenceNumber (`ConsumeSpec.closed_shards`).
    closed_shards: Mapping[str, str | None] = field(default_factory=dict)
    # Held around the CPU-heavy steps (a GetRecords and its parsing, building and staging a file): the
    # slot's lanes, shared by every lease it reads at once (`spark_jobs.slot_task`).
    busy_gate: AbstractContextManager[Any] = field(default_factory=nullcontext)
    clock: Callable[[], float] = time.monotonic
    wall_clock_millis: Callable[[], int] = lambda: time.time_ns() // 1_000_000


@dataclass
class _Tally:
    records: int = 0
    bytes: int = 0
    files: int = 0
    replayed: int = 0
    calls: int = 0
    throttled: int = 0
    expired: int = 0
    millis_behind_latest: int | None = None
    children: list[str] = field(default_factory=list)
    losses: list[RetentionLoss] = field(default_factory=list)
    unrecorded: set[AgedOutRange] = field(default_factory=set)  # met by a read, not yet written on the lease
    first_arrival_millis: int | None = None  # of the records landed, for the throughput window
    last_arrival_millis: int | None = None
    # The lease's last committed batch when it is not visible as the lease's round ends: left staged
    # (its promotion failed; a later round promotes it) or missing (deleted before it was visible).
    unpromoted_batch: str | None = None
    missing_batches: list[str] = field(default_factory=list)

    def count_landed(self, records: Sequence[KinesisRecord]) -> None:
        self.records += len(records)
        self.bytes += sum(len(record.data) for record in records)
        if records:
            if self.first_arrival_millis is None:
                self.first_arrival_millis = _epoch_millis(records[0].approximate_arrival_timestamp)
            self.last_arrival_millis = _epoch_millis(records[-1].approximate_arrival_timestamp)

    def count_read(self, batch: ReadBatch, lease_key: str) -> None:
        self.calls += batch.get_records_calls
        self.throttled += batch.throttled_calls
        self.expired += batch.expired_iterators
        if batch.millis_behind_latest is not None:
            self.millis_behind_latest = batch.millis_behind_latest
        if batch.gap is not None:
            gap = batch.gap
            arrival = None if gap.first_available_arrival is None else gap.first_available_arrival.isoformat()
            aged_out = AgedOutRange(str(gap.after), gap.first_available, arrival)
            self.losses.append(RetentionLoss.of(lease_key, aged_out))
            self.unrecorded.add(aged_out)


class LeaseConsumer:
    def __init__(
        self,
        held: HeldLease,
        stream_name: str,
        shard_id: str,
        scheme: LeaseKeyScheme,
        worker_id: str,
        context: LeaseContext,
    ) -> None:
        self.held = held
        self.stream_name = stream_name
        self.shard_id = shard_id
        self.scheme = scheme
        self.worker_id = worker_id
        self.context = context
        self._tally = _Tally()

    def run(self) -> LeaseReport:
        started = self.context.clock()
        start = self.held.lease
        outcome, detail, retryable = Outcome.FAILED, None, None
        try:
            outcome = self._work(started)
        except LeaseLostError as error:
            outcome, detail = Outcome.LOST, error.reason
        except LeaseCoreError as error:
            outcome, detail, retryable = Outcome.FAILED, str(error), error.retryable
        except Exception as error:  # a bug must not take the slot's other leases down with it
            log.exception("lease %s failed unexpectedly", start.lease_key)
            outcome, detail = Outcome.FAILED, f"{type(error).__name__}: {error}"
        seconds = self.context.clock() - started
        throughput, covered = self._report_throughput(outcome) if outcome != Outcome.LOST else (None, None)
        tally = self._tally
        return LeaseReport(
            lease_key=start.lease_key,
            stream_name=self.stream_name,
            shard_id=self.shard_id,
            worker_id=self.worker_id,
            outcome=outcome,
            start=str(start.checkpoint),
            end=str(self.held.lease.checkpoint),
            records=tally.records,
            bytes=tally.bytes,
            seconds=round(seconds, 3),
            files=tally.files,
            replayed_batches=tally.replayed,
            millis_behind_latest=tally.millis_behind_latest,
            throughput_kbps=throughput,
            covered_seconds=covered,
            children_created=tuple(tally.children),
            retention_losses=tuple(tally.losses),
            get_records_calls=tally.calls,
            throttled_calls=tally.throttled,
            expired_iterators=tally.expired,
            detail=detail,
            retryable=retryable,
            unpromoted_batch=tally.unpromoted_batch,
            missing_batches=tuple(tally.missing_batches),
        )

    # --- the round's work ----------------------------------------------------------------------

    def _work(self, started: float) -> str:
        lease = self.held.require_held()
        # A file gone by now may be a dataset retention's doing: `promote_committed_batch` logs it.
        self._promoting(lease.committed_batch, lambda: promote_committed_batch(self.context.sink, lease), False)
        if lease.is_at_shard_end:
            return Outcome.FINISHED
        if lease.checkpoint == AT_TIMESTAMP and self.context.at_timestamp is None:
            raise ConfigurationError(
                "initial_position_timestamp",
                f"lease {lease.lease_key!r} starts AT_TIMESTAMP, so the timestamp it was created with is needed",
            )
        deadline = None if self.context.budget.max_seconds is None else started + self.context.budget.max_seconds
        if lease.pending_checkpoint is not None:
            finished = self._redo(lease)
            if finished is not None:
                return finished
        return self._fresh_batches(deadline)

    def _redo(self, lease: Lease) -> str | None:
        """Redo the prepared batch (C, P]; an outcome when the lease's round ends with it, else None."""
        start, end = lease.checkpoint, lease.pending_checkpoint
        assert end is not None
        described = PendingBatch.decode(lease)
        self._tally.replayed += 1
        path = described.name if described else self._path(start, end)
        if end.is_shard_end:
            return self._redo_shard_end(lease, described, path)
        sink = self.context.sink
        staged: str | None = None
        if path is not None and described is not None and described.staged and sink.exists(described.staged):
            staged = self._staged(path)
            self.held.require_held()
            sink.restage(described.staged, staged)
            self._tally.files += 1
            self._tally.records += sink.row_count(staged)
        elif path is not None and described is not None and sink.exists(path):
            self._tally.records += sink.row_count(path)  # published before commit by an earlier version
        else:
            records, _ = self._read_until(self._replay_reader(lease, described), end)
            staged = self._stage(path, records)
        self._commit(end, staged)
        return None

    def _redo_shard_end(self, lease: Lease, described: PendingBatch | None, path: str | None) -> str:
        """Redo a prepared (C, SHARD_END]: the form an earlier version gave a shard's last batch, whose
        file it published before committing. A published file is kept; otherwise the records are read
        again and landed as a batch that ends at its last record, so that no committed file is ever
        left to promote on a lease at SHARD_END (cleanup may delete such a lease)."""
        children: Sequence[ChildShard] = described.child_shards if described else ()
        if path is not None and self.context.sink.exists(path):
            self._tally.records += self.context.sink.row_count(path)
        else:
            records, last = self._read_until(self._replay_reader(lease, described), SHARD_END)
            children = children or last.child_shards
            if records:
                self._land(records)
        return Outcome.SHARD_END if self._finish_shard(children) else Outcome.MERGE_DEFERRED

    def _replay_reader(self, lease: Lease, described: PendingBatch | None) -> ShardReader:
        """A reader of the prepared range: from its first record when described, else after C."""
        first = described.first if described is not None else None
        if first is None and lease.checkpoint == LATEST:
            # LATEST has moved on since the batch was read: (LATEST, P] cannot be found again.
            raise CorruptLeaseError(
                lease.lease_key,
                f"pending checkpoint {lease.pending_checkpoint} after LATEST carries no batch description of "
                "ours, so the prepared batch cannot be replayed; reset the lease's pendingCheckpoint to continue",
            )
        if first is None:
            return self._reader(lease.checkpoint)
        # The batch's first record is the first after C: if it aged out, the loss starts after C.
        return self._reader(first, start_inclusive=True, read_before_start=lease.checkpoint)

    def _read_until(self, reader: ShardReader, end: ExtendedSequenceNumber) -> tuple[list[KinesisRecord], ReadBatch]:
        """Every record of a prepared range, up to and including `end`."""
        records: list[KinesisRecord] = []
        while True:
            batch = reader.read(ReadLimits(stop_at=end))
            self._tally.count_read(batch, self.held.lease_key)
            records.extend(batch.records)
            if batch.stopped_by in ("stop_at", "shard_end") or batch.shard_ended:
                return records, batch
            if batch.stopped_by == "no_shard_end":
                raise self._end_not_answered(batch)
            if batch.stopped_by in ("throttled", "tip"):
                # The prepared range exists in the stream (it was read once), so stopping short of
                # it is a transient failure: the pending checkpoint stays for the next attempt.
                raise DependencyError(
                    "kinesis",
                    "GetRecords",
                    f"the replay of {self.held.lease_key} up to {end} stopped at {batch.end} ({batch.stopped_by})",
                    batch.get_records_calls,
                )

    def _fresh_batches(self, deadline: float | None) -> str:
        budget = self.context.budget
        lease = self.held.lease
        reader = self._reader(lease.checkpoint, latest_since=lease.latest_since)
        while True:
            self.held.require_held()
            records_left = _left(budget.max_records, self._tally.records)
            bytes_left = _left(budget.max_bytes, self._tally.bytes)
            if records_left == 0 or bytes_left == 0:
                return Outcome.LIMIT
            batch = reader.read(
                ReadLimits(
                    max_records=_smallest(budget.file_max_records, records_left),
                    max_bytes=_smallest(budget.file_max_bytes, bytes_left),
                    deadline=deadline,
                )
            )
            self._tally.count_read(batch, self.held.lease_key)
            records, window_closed = _before_arrival(batch.records, budget.stop_at_arrival)
            if records:
                self._land(records)
            if window_closed:
                return Outcome.WINDOW_END
            if batch.shard_ended:
                return Outcome.SHARD_END if self._finish_shard(batch.child_shards) else Outcome.MERGE_DEFERRED
            if batch.stopped_by == "no_shard_end":
                raise self._end_not_answered(batch)
            if batch.stopped_by in _STOP_OUTCOMES:
                return _STOP_OUTCOMES[batch.stopped_by]

    def _end_not_answered(self, batch: ReadBatch) -> DependencyError:
        """The failure of a closed shard whose GetRecords answered no end after its last record:
        what was read is committed; the end is looked for again by the next round."""
        return DependencyError(
            "kinesis",
            "GetRecords",
            f"shard {self.shard_id} of {self.stream_name!r} is closed (listed with an EndingSequenceNumber), but "
            f"after its last record {batch.end or self.held.lease.checkpoint} GetRecords kept answering no records "
            "and a next iterator instead of the shard's end (a null NextShardIterator); SHARD_END is not committed",
            batch.get_records_calls,
        )

    def _land(self, records: Sequence[KinesisRecord]) -> None:
        """Prepare, stage, commit and promote one batch: the records after the committed checkpoint.

        The transform runs after the prepare, like the write: whatever stops the batch from then on
        (a transform that raises, a crash) leaves the prepared range for the next attempt to redo.
        """
        start, end = self.held.lease.checkpoint, records[-1].position
        path = self._path(start, end)
        described = PendingBatch(
            start=start, end=end, first=records[0].position, name=path, records=len(records), staged=self._staged(path)
        )
        self._recording(lambda losses: self.held.prepare(end, described.encode(), losses))
        self._commit(end, self._stage(path, records))

    def _recording(self, write: Callable[[frozenset[AgedOutRange]], Lease]) -> None:
        """Run a prepare or commit that also writes the retention losses read so far onto the lease.

        They go with the first write that moves past them: once the checkpoint is beyond a gap, no
        later read can meet it again, and the slot's report may die with its driver.
        """
        losses = frozenset(self._tally.unrecorded)
        write(losses)
        self._tally.unrecorded -= losses

    def _commit(self, end: ExtendedSequenceNumber, staged: str | None) -> None:
        """Commit `end`, naming the batch's staged file, then make the file visible."""
        self._recording(lambda losses: self.held.commit(end, record=staged, losses=losses))
        if staged is not None:
            self._promoting(staged, lambda: self.context.sink.promote(staged), True)

    def _promoting(self, staged: str | None, promote: Callable[[], Promotion | None], just_committed: bool) -> None:
        """Run `promote` for the committed batch `staged`, keeping what the report must say of it: a
        promotion that fails leaves it staged (and raises); a file deleted between this attempt's own
        stage and promotion (`just_committed`) is a batch whose records the sink lacks."""
        try:
            promotion = promote()
        except Exception:
            self._tally.unpromoted_batch = visible_name_of(staged)
            raise
        if promotion is Promotion.MISSING and just_committed:
            self._tally.missing_batches.append(visible_name_of(staged) or str(staged))
            log.warning(
                "lease %s: the committed batch file %s was deleted before it could be made visible; its records "
                "are not in %s",
                self.held.lease_key,
                staged,
                self.context.sink.uri,
            )

    def _finish_shard(self, children: Sequence[ChildShard]) -> bool:
        """Create the child leases, then commit SHARD_END; False when the merge must wait (§3.8).

        The children are created by this holder only (`HeldLease.fenced`): an attempt that lost the
        lease creates none, so a child that was read and cleaned up meanwhile is never born again.
        """
        children = children or self._listed_children()
        store, scheme = self.context.store, self.scheme
        outcome = self.held.fenced(lambda lease: create_child_leases(store, lease, children, scheme))
        if outcome.deferred:
            return False
        self._tally.children.extend(outcome.created)
        self._recording(lambda losses: self.held.commit(SHARD_END, losses=losses))
        return True

    def _listed_children(self) -> list[ChildShard]:
        """Kinesis named no children at the shard end: take them from the shard listing instead."""
        source = KinesisShardSource(self.context.kinesis, retry_policy=self.context.retry_policy)
        return [
            ChildShard(shard.shard_id, shard.parent_shard_ids, shard.hash_key_range)
            for shard in child_shards_of(source.list_shards(self.stream_name), self.shard_id)
        ]

    # --- reading and writing -------------------------------------------------------------------

    def _reader(
        self,
        start: ExtendedSequenceNumber,
        start_inclusive: bool = False,
        read_before_start: ExtendedSequenceNumber | None = None,
        latest_since: datetime | None = None,
    ) -> ShardReader:
        closed = self.context.closed_shards
        return ShardReader(
            self.context.kinesis,
            self.stream_name,
            self.shard_id,
            start,
            start_inclusive=start_inclusive,
            read_before_start=read_before_start,
            closed=self.held.lease_key in closed,
            ending_sequence_number=closed.get(self.held.lease_key),
            at_timestamp=self.context.at_timestamp,
            latest_since=latest_since,
            retry_policy=self.context.retry_policy,
            read_bytes_per_second=self.context.read_bytes_per_second,
            busy_gate=self.context.busy_gate,
        )

    def _stage(self, path: str | None, records: Sequence[KinesisRecord]) -> str | None:
        """Stage the batch's file under this attempt's own name; that name, or None when there was
        nothing to write."""
        with self.context.busy_gate:
            table = self._table(records)
            staged = None if path is None or table.num_rows == 0 else self._staged(path)
            if staged is not None:
                # The lease may have been lost while the batch was read: a zombie need not even stage.
                self.held.require_held()
                self.context.sink.stage(staged, table)
                self._tally.files += 1
        self._tally.count_landed(records)
        return staged

    def _staged(self, path: str) -> str:
        return staged_path(path, self.held.claim_token)

    def _table(self, records: Sequence[KinesisRecord]) -> pa.Table:
        """The batch as written: the records, through the user transform if there is one.

        The transform also sees the partition columns (stream_name, shard_id), so it can tell
        streams apart; they are dropped again because the partition directories carry them.
        """
        table = records_table(records)
        if self.context.transform is None or self.context.transform_spec is None:
            return table
        for name, value in (("stream_name", self.stream_name), ("shard_id", self.shard_id)):
            table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
        table = apply_transform(self.context.transform_spec, self.context.transform, table)
        return table.drop_columns([name for name in PARTITION_COLUMNS if name in table.column_names])

    def _path(self, start: ExtendedSequenceNumber, end: ExtendedSequenceNumber) -> str:
        return self.context.sink.batch_path(self.stream_name, self.shard_id, start, end)

    def _report_throughput(self, outcome: str) -> tuple[float | None, float | None]:
        """Store the lease's new throughput with a last renewal (§7): the rate at which data arrived
        over the data time this round's read covered (`lease_core.metrics.throughput`), which ends now when
        the read reached the stream's tip and at the last record landed otherwise. It starts from the
        measurement the claim kept aside (`measured_before_claim`), not from the claim's stand-in.

        The claim stood in what a round that reads nothing measures (`claimed_measurement`): a lease
        that caught up without a record needs no renewal. One that read nothing for another reason
        (throttled, failed, a limit) may have data the stand-in said was not there: it gets its former
        measurement back. Every renewal here settles the stand-in (removes what it kept aside).

        (stored throughput, seconds of data time covered); None for what the round did not measure
        or a renewal that failed to store."""
        claimed, tally = self.held.lease, self._tally
        throughput_before, read_through_before = measurement_before_claim(claimed)
        if tally.records == 0 and claimed.measured_before_claim is not None:
            if outcome == Outcome.CAUGHT_UP:
                window = covered_window(read_through_before, None, claimed.read_through_millis)
                return claimed.throughput_kbps, None if window is None else window.seconds
            if outcome not in _NOTHING_LEFT_TO_READ:
                self._renew_quietly(throughput_before, read_through_before)
            return None, None
        end = self.context.wall_clock_millis() if outcome == Outcome.CAUGHT_UP else tally.last_arrival_millis
        window = covered_window(read_through_before, tally.first_arrival_millis, end)
        if window is None:
            if claimed.measured_before_claim is not None:  # data read, but no window: the measurement stays as it was
                self._renew_quietly(throughput_before, read_through_before)
            return None, None
        value = ema_throughput(throughput_before, arrival_rate_kbps(tally.bytes, window))
        stored = self._renew_quietly(value, window.end_millis)
        return (value if stored else None), window.seconds

    def _renew_quietly(self, throughput_kbps: float | None, read_through_millis: int | None) -> bool:
        """A last renewal storing a measurement; False when it did not store (the round's work is done either way)."""
        try:
            return self.held.renew(throughput_kbps=throughput_kbps, read_through_millis=read_through_millis)
        except LeaseCoreError:
            return False


def committed_batch_left_staged(sink: ParquetSink, lease: Lease) -> bool:
    """Whether the lease's last committed batch file is staged and not visible: its promotion was cut
    short, and a round's holder of the lease makes it visible (`promote_committed_batch`). A file that
    is neither staged nor visible was deleted: no round can bring it back, so it is not work."""
    staged = lease.committed_batch
    visible = visible_name_of(staged)
    return staged is not None and visible is not None and sink.exists(staged) and not sink.exists(visible)


def promote_committed_batch(sink: ParquetSink, lease: Lease) -> Promotion | None:
    """Make the lease's last committed batch file visible if its promotion was cut short.

    Anyone may do it at any time: the range is committed, and the staged file the lease names is the
    committing attempt's own (a zombie's copy of the same batch has another name). A staged file that
    is gone while its batch file is not visible was deleted by someone: `Promotion.MISSING`, which the
    caller reports (a dataset's retention may delete old files, but so may a mistake).
    """
    staged = lease.committed_batch
    if staged is None:
        return None
    try:
        visible = visible_path(staged)
    except ValueError:
        log.warning(
            "lease %s: committedBatchFile %r is not a staged file name of ours; ignored", lease.lease_key, staged
        )
        return None
    if sink.exists(visible):
        return None
    promotion = sink.promote(staged)
    if promotion is Promotion.MISSING:
        log.warning(
            "lease %s: its last committed batch file %s is neither staged nor visible in %s (deleted?)",
            lease.lease_key,
            visible,
            sink.uri,
        )
    else:
        log.info(
            "lease %s: promoted its last committed batch file %s, left staged by an earlier attempt",
            lease.lease_key,
            visible,
        )
    return promotion


def visible_name_of(staged: str | None) -> str | None:
    """The visible name of a staged batch file, or None for no name or one that is not ours."""
    if staged is None:
        return None
    try:
        return visible_path(staged)
    except ValueError:
        return None


def _epoch_millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _left(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)


def _smallest(value: int, limit: int | None) -> int:
    return value if limit is None else min(value, limit)


def _before_arrival(
    records: Sequence[KinesisRecord], stop_at_arrival: datetime | None
) -> tuple[Sequence[KinesisRecord], bool]:
    """The records that arrived before the window's end, and whether the end was reached."""
    if stop_at_arrival is None:
        return records, False
    for index, record in enumerate(records):
        if record.approximate_arrival_timestamp >= stop_at_arrival:
            return records[:index], True
    return records, False
