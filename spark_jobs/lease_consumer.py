"""One lease's work in one round: redo a prepared batch, then read, land and commit new batches.

The exactly-once protocol (docs/protocol.md §2.6), per batch, for a lease at committed checkpoint C, through
the round's sink (`sinks.batch_sink`):
1. A pending checkpoint P means a batch (C, P] was prepared and maybe staged: redo exactly it. When
   the sink can adopt what the preparing attempt staged (for Parquet: its staged file exists, staged
   atomically, so complete), this attempt takes it over instead of reading the range again; then
   commit and make visible.
2. Otherwise read after C to a bound, ending at the last record read E; prepare E (counter- and
   claim-conditional, with the batch's description as pendingCheckpointState: the sink's name for
   it, a pure function of (stream, shard, C, E), and the token this attempt stages it under); stage
   the batch, invisible to readers; commit E with the sink's record of it (`committedBatchFile`);
   make it visible.
3. At a closed shard's end, once every record is committed: create the child leases (in one
   transaction fenced by this holder) and commit SHARD_END.
Every write goes through the `HeldLease`, so an attempt that lost the lease never commits, and a
batch is visible only once its range is committed: whatever a fenced attempt still stages stays
invisible. A committed batch whose making visible was cut short is made visible by the lease's next
holder (`make_committed_visible`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, closing, nullcontext
from dataclasses import dataclass, field, replace
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
from lease_core.retrieval.kinesis_records import UserRecords
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, RecordSource, Retrieval, ShardToRead
from lease_core.retrieval.shard_source import ShardSource, child_shards_of
from lease_core.store.lease_store import LeaseStore
from sinks.batch_sink import BatchRange, BatchSink, StagedBatch, Visibility
from sinks.dead_lettering import DeadLetteringSink
from sinks.errors import SinkError
from sinks.record_columns import records_table
from spark_jobs.dead_letters import BadRecordPolicy, dead_letter_table
from spark_jobs.decode import RecordDecoder
from spark_jobs.round_report import LeaseReport, Outcome, RetentionLoss
from spark_jobs.transform import Transform, transformed

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
    retrieval: Retrieval  # how the lease's shard is read (`LeaseApplication.retrieval`)
    shards: ShardSource  # the listing, for the children of a shard whose end named none
    sink: BatchSink
    transform_spec: str | None
    transform: Transform | None
    at_timestamp: datetime | None  # what an AT_TIMESTAMP checkpoint means: the initial position's timestamp
    budget: LeaseBudget
    # Closed shards by lease key, with their known EndingSequenceNumber (`ConsumeSpec.closed_shards`).
    closed_shards: Mapping[str, str | None] = field(default_factory=dict)
    # Held around the CPU-heavy steps (a call for records and its parsing, building and staging a file): the
    # slot's lanes, shared by every lease it reads at once (`spark_jobs.slot_task`).
    busy_gate: AbstractContextManager[Any] = field(default_factory=nullcontext)
    decoder: RecordDecoder | None = None  # the per-record decode hook, before the transform
    bad_records: BadRecordPolicy = field(default_factory=BadRecordPolicy)  # what a record the decoder rejects does
    application: str = ""  # whose dead letters these are
    # The streams' ARNs and creation times (`ConsumeSpec.stream_incarnations`), which dead letters keep.
    stream_incarnations: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    wall_clock_millis: Callable[[], int] = lambda: time.time_ns() // 1_000_000


@dataclass
class _Tally:
    records: int = 0
    bytes: int = 0
    files: int = 0
    replayed: int = 0
    read_calls: int = 0
    refused_read_calls: int = 0
    read_reopens: int = 0
    millis_behind_latest: int | None = None
    children: list[str] = field(default_factory=list)
    losses: list[RetentionLoss] = field(default_factory=list)
    unrecorded: set[AgedOutRange] = field(default_factory=set)  # met by a read, not yet written on the lease
    first_arrival_millis: int | None = None  # of the records landed, for the throughput window
    last_arrival_millis: int | None = None
    # The arrival of the first record of a batch read and being landed; left set when landing it failed.
    landing_from_millis: int | None = None
    # The lease's committed batches not visible as its round ends: awaiting visibility (making them
    # visible failed; a later round does it) or missing (their staged data was deleted before).
    unpromoted_batch: str | None = None
    missing_batches: list[str] = field(default_factory=list)
    dead_lettered: int = 0
    left_out: int = 0  # records the decoder left out on purpose, of the batches staged

    def count_landed(self, records: UserRecords) -> None:
        self.records += len(records)
        self.bytes += records.bytes
        if records:
            if self.first_arrival_millis is None:
                self.first_arrival_millis = _epoch_millis(records[0].approximate_arrival_timestamp)
            self.last_arrival_millis = _epoch_millis(records[-1].approximate_arrival_timestamp)

    def count_read(self, batch: ReadBatch, lease_key: str) -> None:
        self.read_calls += batch.calls
        self.refused_read_calls += batch.refused_calls
        self.read_reopens += batch.reopens
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
        read_end_millis = self.context.wall_clock_millis()
        throughput, covered = (
            self._report_throughput(outcome, read_end_millis) if outcome != Outcome.LOST else (None, None)
        )
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
            read_calls=tally.read_calls,
            refused_read_calls=tally.refused_read_calls,
            read_reopens=tally.read_reopens,
            detail=detail,
            retryable=retryable,
            unpromoted_batch=tally.unpromoted_batch,
            missing_batches=tuple(tally.missing_batches),
            dead_lettered=tally.dead_lettered,
            left_out=tally.left_out,
            landed_through_millis=self._landed_through(outcome, read_end_millis),
            newest_arrival_millis=tally.last_arrival_millis,
        )

    def _landed_through(self, outcome: str, read_end_millis: int) -> int | None:
        """The moment before which every record of the shard that arrived is landed (`LeaseReport`): the
        round's freshness starts from it. A read that caught up, or found the shard's end, leaves nothing
        behind at its end; a batch that failed to land starts what is left; otherwise the last record
        landed ends what is landed, or, with nothing landed, the lease's measurement from before the
        round does (the throughput's boundary, `readThroughMillis`)."""
        tally = self._tally
        if outcome == Outcome.CAUGHT_UP or outcome in _NOTHING_LEFT_TO_READ:
            return read_end_millis
        if tally.landing_from_millis is not None:
            return tally.landing_from_millis
        if tally.last_arrival_millis is not None:
            return tally.last_arrival_millis
        return measurement_before_claim(self.held.lease)[1]

    # --- the round's work ----------------------------------------------------------------------

    def _work(self, started: float) -> str:
        lease = self.held.require_held()
        # A batch gone by now may be a dataset retention's doing: `make_committed_visible` logs it.
        self._making_visible(lease.committed_batch, lambda: make_committed_visible(self.context.sink, lease))
        if lease.is_at_shard_end:
            return Outcome.FINISHED
        if lease.checkpoint == AT_TIMESTAMP and self.context.at_timestamp is None:
            raise ConfigurationError(
                "initial_position_timestamp",
                f"lease {lease.lease_key!r} starts AT_TIMESTAMP, so the timestamp it was created with is needed",
            )
        deadline = None if self.context.budget.max_seconds is None else started + self.context.budget.max_seconds
        if lease.pending_checkpoint is None:
            return self._fresh_batches(deadline, None)
        with ExitStack() as opened:
            finished, replayed = self._redo(lease, opened)
            if finished is not None:
                return finished
            return self._fresh_batches(deadline, replayed)

    def _redo(self, lease: Lease, opened: ExitStack) -> tuple[str | None, RecordSource | None]:
        """Redo the prepared batch (C, P]: an outcome when the lease's round ends with it, and the
        source it was read again with, if it was (entered into `opened`, which closes it)."""
        end = lease.pending_checkpoint
        assert end is not None
        described = PendingBatch.decode(lease)
        self._tally.replayed += 1
        batch = self._batch(lease.checkpoint, None if described is None else described.first, end)
        if end.is_shard_end:
            return self._redo_shard_end(lease, described, batch), None
        # A batch described by someone else (a KCL application's state) was staged by nobody we know.
        staged = None if described is None else self._adopt(described.staged, batch)
        source = None
        if staged is None:
            source = opened.enter_context(closing(self._replay_source(lease, described)))
            records, _ = self._read_until(source, end)
            self._tally.landing_from_millis = _first_arrival(records)
            staged = self._stage(batch, records)
        self._commit(batch, staged)
        self._tally.landing_from_millis = None
        return None, source

    def _redo_shard_end(self, lease: Lease, described: PendingBatch | None, batch: BatchRange) -> str:
        """Redo a prepared (C, SHARD_END]: the form an earlier version gave a shard's last batch, which
        it made visible before committing. A visible batch is kept; otherwise the records are read again
        and landed as a batch that ends at its last record, so that no committed batch is ever left to
        make visible on a lease at SHARD_END (cleanup may delete such a lease)."""
        children: Sequence[ChildShard] = described.child_shards if described else ()
        if self._adopt(None, batch) is None:
            with closing(self._replay_source(lease, described)) as source:
                records, last = self._read_until(source, SHARD_END)
            children = children or last.child_shards
            if records:
                self._land(records)
        return Outcome.SHARD_END if self._finish_shard(children) else Outcome.MERGE_DEFERRED

    def _adopt(self, staged: str | None, batch: BatchRange) -> StagedBatch | None:
        """What the preparing attempt staged (`staged`), taken over by this attempt, or the batch when
        readers already see it; None when the range must be read again."""
        self.held.require_held()
        adopted = self.context.sink.adopt(staged, batch, self.held.claim_token)
        if adopted is not None:
            self._tally.records += adopted.rows + adopted.dead_letters
            self._tally.dead_lettered += adopted.dead_letters
            if adopted.token is not None:  # staged now (a batch readers already see was not)
                self._tally.files += 1
        return adopted

    def _replay_source(self, lease: Lease, described: PendingBatch | None) -> RecordSource:
        """A source of the prepared range: from its first record when described, else after C."""
        first = described.first if described is not None else None
        if first is None and lease.checkpoint == LATEST:
            # LATEST has moved on since the batch was read: (LATEST, P] cannot be found again.
            raise CorruptLeaseError(
                lease.lease_key,
                f"pending checkpoint {lease.pending_checkpoint} after LATEST carries no batch description of "
                "ours, so the prepared batch cannot be replayed; reset the lease's pendingCheckpoint to continue",
            )
        # The batch's first record, when described, is the first after C: if it aged out, the loss starts after C.
        return self._source(lease.checkpoint, first=first)

    def _read_until(self, source: RecordSource, end: ExtendedSequenceNumber) -> tuple[UserRecords, ReadBatch]:
        """Every record of a prepared range, up to and including `end`: read in parts of the lease's
        share of the slot's buffer, so that GetRecords is asked for answers of about that size, as
        for fresh batches (a retried slot replays all its prepared batches at once)."""
        parts: list[UserRecords] = []
        while True:
            limits = ReadLimits(stop_at=end, max_bytes=self.context.budget.file_max_bytes, cancelled=self._lost)
            batch = source.read(limits)
            self._tally.count_read(batch, self.held.lease_key)
            parts.append(batch.records)
            if batch.stopped_by in ("stop_at", "shard_end") or batch.shard_ended:
                return UserRecords.concat(parts), batch
            if batch.stopped_by == "no_shard_end":
                raise self._end_not_answered(batch, source.operation)
            if batch.stopped_by == "cancelled":
                self.held.require_held()  # raises: the lease was lost
            if batch.stopped_by in ("throttled", "tip"):
                # The prepared range exists in the stream (it was read once), so stopping short of
                # it is a transient failure: the pending checkpoint stays for the next attempt.
                raise DependencyError(
                    "kinesis",
                    source.operation,
                    f"the replay of {self.held.lease_key} up to {end} stopped at {batch.end} ({batch.stopped_by})",
                    batch.calls,
                )

    def _fresh_batches(self, deadline: float | None, replayed: RecordSource | None) -> str:
        """Read and land batches after the committed checkpoint until the round's end for this lease.
        A replay's source reads on from there: a second subscription to the shard within 5 s of the
        first would be refused, and a second GetShardIterator is a call for nothing."""
        if replayed is not None:
            return self._read_fresh(replayed, deadline)
        lease = self.held.lease
        with closing(self._source(lease.checkpoint, latest_since=lease.latest_since)) as source:
            return self._read_fresh(source, deadline)

    def _read_fresh(self, source: RecordSource, deadline: float | None) -> str:
        budget = self.context.budget
        while True:
            self.held.require_held()
            records_left = _left(budget.max_records, self._tally.records)
            bytes_left = _left(budget.max_bytes, self._tally.bytes)
            if records_left == 0 or bytes_left == 0:
                return Outcome.LIMIT
            batch = source.read(
                ReadLimits(
                    max_records=_smallest(budget.file_max_records, records_left),
                    max_bytes=_smallest(budget.file_max_bytes, bytes_left),
                    deadline=deadline,
                    cancelled=self._lost,
                )
            )
            self._tally.count_read(batch, self.held.lease_key)
            if batch.stopped_by == "cancelled":
                self.held.require_held()  # raises: the lease was lost, and what this batch read is not landed
            records, window_closed = _before_arrival(batch.records, budget.stop_at_arrival)
            if records:
                self._tally.landing_from_millis = _first_arrival(records)
                self._land(records)
                self._tally.landing_from_millis = None
            if window_closed:
                return Outcome.WINDOW_END
            if batch.shard_ended:
                return Outcome.SHARD_END if self._finish_shard(batch.child_shards) else Outcome.MERGE_DEFERRED
            if batch.stopped_by == "no_shard_end":
                raise self._end_not_answered(batch, source.operation)
            if batch.stopped_by in _STOP_OUTCOMES:
                return _STOP_OUTCOMES[batch.stopped_by]

    def _lost(self) -> bool:
        """Whether the lease was lost (a renewal refused, or none for a lease duration): its reads stop."""
        return self.held.is_lost

    def _end_not_answered(self, batch: ReadBatch, operation: str) -> DependencyError:
        """The failure of a closed shard whose reads answered no end after its last record (`operation`:
        the call they read with): what was read is committed; the end is looked for again by the next round."""
        return DependencyError(
            "kinesis",
            operation,
            f"shard {self.shard_id} of {self.stream_name!r} is closed (listed with an EndingSequenceNumber), but "
            f"after its last record {batch.end or self.held.lease.checkpoint} {operation} kept answering no records "
            "instead of the shard's end; SHARD_END is not committed",
            batch.calls,
        )

    def _land(self, records: UserRecords) -> None:
        """Prepare, stage, commit and make visible one batch: the records after the committed checkpoint.

        The transform runs after the prepare, like the stage: whatever stops the batch from then on
        (a transform that raises, a crash) leaves the prepared range for the next attempt to redo.
        """
        start, end = self.held.lease.checkpoint, records.position(-1)
        batch = self._batch(start, records.position(0), end)
        sink = self.context.sink
        described = PendingBatch(
            start=start,
            end=end,
            first=batch.first,
            name=sink.batch_name(batch),
            records=len(records),
            staged=sink.staged_token(batch, self.held.claim_token),
        )
        self._recording(lambda losses: self.held.prepare(end, described.encode(), losses))
        self._commit(batch, self._stage(batch, records))

    def _recording(self, write: Callable[[frozenset[AgedOutRange]], Lease]) -> None:
        """Run a prepare or commit that also writes the retention losses read so far onto the lease.

        They go with the first write that moves past them: once the checkpoint is beyond a gap, no
        later read can meet it again, and the slot's report may die with its driver.
        """
        losses = frozenset(self._tally.unrecorded)
        write(losses)
        self._tally.unrecorded -= losses

    def _commit(self, batch: BatchRange, staged: StagedBatch | None) -> None:
        """Commit the batch's end with the sink's record of it, then make it visible."""
        sink = self.context.sink
        record = sink.commit_record(self.held.lease.committed_batch, staged)
        self._recording(lambda losses: self.held.commit(batch.end, record=record, losses=losses))
        if self._making_visible(record, lambda: sink.make_visible(record)) is Visibility.MISSING:
            name = sink.batch_name(batch)
            self._tally.missing_batches.append(name)
            log.warning(
                "lease %s: the committed batch %s was deleted before it was made visible; its records are not in %s",
                self.held.lease_key,
                name,
                sink.uri,
            )

    def _making_visible(self, record: str | None, make_visible: Callable[[], Visibility | None]) -> Visibility | None:
        """Run `make_visible` for the committed batches `record` names; when it fails (and raises), the
        report names those readers cannot see yet."""
        try:
            return make_visible()
        except Exception:
            self._tally.unpromoted_batch = not_yet_visible(self.context.sink, record)
            raise

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
        # The sink's record goes on: a table sink's committed batches may wait for the round's end.
        record = self.context.sink.commit_record(self.held.lease.committed_batch, None)
        self._recording(lambda losses: self.held.commit(SHARD_END, record=record, losses=losses))
        return True

    def _listed_children(self) -> list[ChildShard]:
        """Kinesis named no children at the shard end: take them from the shard listing instead."""
        return [
            ChildShard(shard.shard_id, shard.parent_shard_ids, shard.hash_key_range)
            for shard in child_shards_of(self.context.shards.list_shards(self.stream_name), self.shard_id)
        ]

    # --- reading and writing -------------------------------------------------------------------

    def _source(
        self,
        checkpoint: ExtendedSequenceNumber,
        first: ExtendedSequenceNumber | None = None,
        latest_since: datetime | None = None,
    ) -> RecordSource:
        """The lease's shard read from after `checkpoint` (from `first` on, when given: a replay)."""
        closed, key = self.context.closed_shards, self.held.lease_key
        shard = ShardToRead(
            self.stream_name, self.shard_id, closed=key in closed, ending_sequence_number=closed.get(key)
        )
        start = ReadStart(checkpoint, first=first, at_timestamp=self.context.at_timestamp, latest_since=latest_since)
        return self.context.retrieval.open(shard, start, self.context.busy_gate)

    def _batch(
        self, start: ExtendedSequenceNumber, first: ExtendedSequenceNumber | None, end: ExtendedSequenceNumber
    ) -> BatchRange:
        return BatchRange(self.held.lease_key, self.stream_name, self.shard_id, start, first, end)

    def _stage(self, batch: BatchRange, records: UserRecords) -> StagedBatch | None:
        """Stage the batch's rows for this attempt, none too (a transform dropped them all, or they aged
        out before a redo read them): a sink that records the ranges it holds records this one as well,
        so that its record of a lease stays unbroken; a dataset of files writes nothing for it. The
        records the decoder rejected go with them, as dead letters, when the pipeline sets them aside.

        Only the records the sink lacks are staged: a table that holds the lease past the checkpoint
        (a lease table rebuilt without `leasectl restore`, a checkpoint reset backwards) takes the batch
        from its position on, and nothing when it holds the whole batch."""
        held = self.context.sink.holds_through(batch)
        if held is not None and held > batch.start:
            if held >= batch.end:
                log.info(
                    "lease %s: the sink holds %s..%s already; nothing to stage",
                    self.held.lease_key,
                    batch.start,
                    batch.end,
                )
                return None
            records = records[records.first_after(held.order_key) :]
            log.info(
                "lease %s: the sink holds through %s already; staging the batch from there", self.held.lease_key, held
            )
            batch = replace(batch, start=held, first=records.position(0))
        with self.context.busy_gate:
            table, dead_letters, left_out = self._tables(batch, records)
            # The lease may have been lost while the batch was read: a zombie need not even stage.
            self.held.require_held()
            sink, attempt = self.context.sink, self.held.claim_token
            if dead_letters is None:
                staged = sink.stage(batch, table, attempt)
            elif isinstance(sink, DeadLetteringSink):
                staged = sink.stage_with_dead_letters(batch, table, dead_letters, attempt)
            else:
                raise SinkError(sink.uri, "this sink has no dead-letter destination beside it")
            if staged.rows:
                self._tally.files += 1
        self._tally.count_landed(records)
        self._tally.dead_lettered += staged.dead_letters
        self._tally.left_out += left_out
        return staged if staged.token is not None else None

    def _tables(self, batch: BatchRange, records: UserRecords) -> tuple[pa.Table, pa.Table | None, int]:
        """The batch as staged: the records (or what the decoder makes of them), through the user
        transform if there is one; the records the decoder rejected, as dead letters (None: none); and
        how many it left out on purpose."""
        decoder, dead_letters, left_out = self.context.decoder, None, 0
        if decoder is None:
            table = records_table(records)
        else:
            decoded = decoder.decode_batch(records, self.stream_name, self.shard_id)
            rejected = self.context.bad_records.set_aside(decoded.rejected, len(records), decoder.spec)
            table, left_out = decoded.table, decoded.left_out
            if rejected:
                incarnation = self.context.stream_incarnations.get(self.stream_name)
                dead_letters = dead_letter_table(rejected, batch, decoder.spec, self.context.application, incarnation)
        if self.context.transform is not None and self.context.transform_spec is not None:
            table = transformed(
                table, self.stream_name, self.shard_id, self.context.transform_spec, self.context.transform
            )
        return table, dead_letters, left_out

    def _report_throughput(self, outcome: str, read_end_millis: int) -> tuple[float | None, float | None]:
        """Store the lease's new throughput with a last renewal (§6): the rate at which data arrived
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
        end = read_end_millis if outcome == Outcome.CAUGHT_UP else tally.last_arrival_millis
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


def make_committed_visible(sink: BatchSink, lease: Lease) -> Visibility | None:
    """Make the committed batches the lease's record names visible, where the committing attempt was
    cut short (None when it names none). Anyone may do it at any time: the ranges are committed. A
    batch whose staged data is gone while readers cannot see it was deleted by someone: logged (a
    dataset's retention may delete old batches, but so may a mistake)."""
    if lease.committed_batch is None:
        return None
    visibility = sink.make_visible(lease.committed_batch)
    if visibility is Visibility.MISSING:
        log.warning(
            "lease %s: the committed batches its record %r names are neither staged nor visible in %s (deleted?)",
            lease.lease_key,
            lease.committed_batch,
            sink.uri,
        )
    return visibility


def not_yet_visible(sink: BatchSink, record: str | None) -> str | None:
    """For a report, once making the committed batches `record` names visible failed: the names of
    those readers cannot see yet (None when none), or the record itself when the sink cannot tell."""
    try:
        return ", ".join(sink.awaiting_visibility(record)) or None
    except LeaseCoreError:
        return record


def _epoch_millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _first_arrival(records: UserRecords) -> int | None:
    return _epoch_millis(records[0].approximate_arrival_timestamp) if records else None


def _left(limit: int | None, used: int) -> int | None:
    return None if limit is None else max(0, limit - used)


def _smallest(value: int, limit: int | None) -> int:
    return value if limit is None else min(value, limit)


def _before_arrival(records: UserRecords, stop_at_arrival: datetime | None) -> tuple[UserRecords, bool]:
    """The records that arrived before the window's end, and whether the end was reached."""
    if stop_at_arrival is None:
        return records, False
    reached = records.first_arriving_at(stop_at_arrival)
    return (records, False) if reached is None else (records[:reached], True)
