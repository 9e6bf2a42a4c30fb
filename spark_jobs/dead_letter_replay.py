"""`leasectl replay-dead-letters`: the dead letters (`spark_jobs.dead_letters`) landed in the output
once the decoder that rejected them is fixed, exactly once however often it runs.

The dead letters of one original batch of a lease, (C, E], are a *group*: they are decoded again
together (then transformed, when the pipeline has a transform) and land as one batch of the pseudo
lease `<lease key>:dead-letters`, whose range runs from the group's first record through its last.
A lease's groups are replayed in shard order, and its replay stops at the first group the decoder
still rejects records of (it is reported with its first error; the groups after it wait). So the
groups of a pseudo lease that landed are always the first ones, and a later run, after another fix,
goes on from the group that stopped it.

Through the `BatchSink` protocol, as a round lands a batch (stage, commit record, make visible, the
round's publication), with "already landed" told by the sink itself, so that no group lands twice:
- a Parquet dataset: a group's file is named by its range, and a group whose file readers see is
  skipped (`adopt` with no staged token answers exactly such a batch);
- a table (Iceberg or Delta): the replay's commit (one per BATCHES_PER_COMMIT groups) records each pseudo
  lease's last position in the application's position map, and a group at or before it is skipped;
  the commit checks the map again on the table's head (`TableCommitter.publish_round`), so another
  replay's commit meanwhile cannot make it land twice either.
The command holds the application's leader lock while it writes (`ensure_held` before each write),
so it never runs beside a round.

The dead letters stay in their destination: it is the log of what was rejected, and by what.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lease_core.config.settings import ConsumerConfig
from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks import check_sink_uri, open_sink
from sinks.batch_sink import BatchRange, BatchSink, RoundIdentity, Visibility
from sinks.dead_lettering import dead_letter_uri
from sinks.errors import SinkError
from sinks.parquet import ParquetSink
from sinks.record_columns import RECORD_SCHEMA
from sinks.table.committer import TableCommitter
from spark_jobs.decode import BUILT_IN_DECODERS, DECODER, RecordDecoder, load_decoder
from spark_jobs.errors import FunctionLoadError, TransformError
from spark_jobs.transform import Transform, load_transform, transformed

REPLAY_LEASE_SUFFIX = ":dead-letters"
# The replay is not a round; its commits say so (round numbers start at 1).
REPLAY_ROUND = 0
# A replay publishes (a table commits) at least every this many batches: a lease's record names at most
# 1000 batches waiting for a table's commit (`lease_records.MAX_WAITING_BATCHES`), and a lease may have
# dead letters in more batches than that.
BATCHES_PER_COMMIT = 500


def replay_lease_key(lease_key: str, stream_created: int | None = None) -> str:
    """The pseudo lease whose batches are `lease_key`'s replayed dead letters, of the stream's
    incarnation created at `stream_created` (a stream deleted and created again under its name has
    the same single-stream lease keys, and its sequence numbers start over)."""
    incarnation = "" if stream_created is None else f":{stream_created}"
    return f"{lease_key}{incarnation}{REPLAY_LEASE_SUFFIX}"


def is_replay_lease(lease_key: str) -> bool:
    """Whether `lease_key` is a replay's pseudo lease: no lease of a lease table is (a shard id, or
    `account:stream:epoch:shard`, never ends so)."""
    return lease_key.endswith(REPLAY_LEASE_SUFFIX)


@dataclass(frozen=True)
class DeadLetterGroup:
    """The dead letters of `lease_key`'s batch (`batch_start`, `batch_end`], in shard order."""

    lease_key: str
    stream_name: str
    shard_id: str
    stream_created: int | None  # the stream's incarnation (None: not known when it was set aside)
    batch_start: str
    batch_end: str
    records: tuple[KinesisRecord, ...]

    @property
    def replay_key(self) -> str:
        return replay_lease_key(self.lease_key, self.stream_created)

    @property
    def lease_name(self) -> str:
        """The lease, and the incarnation of its stream when known: what the replay reports by."""
        created = "" if self.stream_created is None else f" (stream created {self.stream_created})"
        return f"{self.lease_key}{created}"

    @property
    def batch(self) -> BatchRange:
        """The group as a batch of the pseudo lease: after its first record's position (start and
        first alike) through its last record's.

        In a Parquet dataset its file lies beside the shard's original batch files, which are named
        by (checkpoint C, last record E) of their batch (C, E]; the group's name never is one of
        theirs. Its first record lies strictly after its own batch's C and its last at or before E:
        either it starts and ends at one record (no batch does: a batch ends strictly after its
        checkpoint), or it starts at a record inside (C, E), which is no batch's checkpoint (a
        lease's batches chain, each starting at the end of the one before)."""
        first, last = self.records[0].position, self.records[-1].position
        return BatchRange(self.replay_key, self.stream_name, self.shard_id, first, first, last)

    def describe(self) -> str:
        return (
            f"{self.stream_name}/{self.shard_id} batch ({self.batch_start}, {self.batch_end}] "
            f"({len(self.records)} dead letter(s))"
        )


def dead_letter_groups(
    dead_letters: pa.Table, application: str, stream: str | None = None
) -> dict[str, list[DeadLetterGroup]]:
    """Pure: `application`'s dead letters (of `stream` only, when given; a table may be shared by
    several applications) by lease and stream incarnation (`DeadLetterGroup.lease_name`) in name
    order, each one's groups in shard order, each group's records too."""
    found: dict[tuple[str, str, str, int | None, str, str], list[KinesisRecord]] = defaultdict(list)
    for row in dead_letters.to_pylist():
        if row["application"] != application or (stream is not None and row["stream_name"] != stream):
            continue
        batch = (
            row["lease_key"],
            row["stream_name"],
            row["shard_id"],
            row["stream_created"],
            row["batch_start"],
            row["batch_end"],
        )
        found[batch].append(KinesisRecord(**{name: row[name] for name in RECORD_SCHEMA.names}))
    by_lease: dict[str, list[DeadLetterGroup]] = defaultdict(list)
    for (lease_key, stream_name, shard_id, created, start, end), records in found.items():
        ordered = tuple(sorted(records, key=lambda record: record.position))
        group = DeadLetterGroup(lease_key, stream_name, shard_id, created, start, end, ordered)
        by_lease[group.lease_name].append(group)
    return {
        key: sorted(groups, key=lambda group: group.records[0].position) for key, groups in sorted(by_lease.items())
    }


@dataclass(frozen=True)
class Processing:
    """The fixed decoder, then the pipeline's transform when it has one: what a round would do."""

    decoder: RecordDecoder
    transform_spec: str | None = None
    transform: Transform | None = None

    @classmethod
    def load(cls, decode: str, transform: str | None = None, options: Mapping[str, Any] | None = None) -> Processing:
        """`TransformError` when either cannot be loaded; `options`: a built-in decoder's `decode_options`."""
        if options and decode not in BUILT_IN_DECODERS:
            raise FunctionLoadError(decode, "takes no decode_options: they are for a built-in decoder", DECODER)
        decoder = load_decoder(decode, options)
        assert decoder is not None  # a spec was given
        return cls(decoder, transform, load_transform(transform))

    def rows(self, group: DeadLetterGroup) -> ReplayedRows | StillFailing:
        """The group's rows as a round would stage them, or why it still fails: the records the decoder
        rejects (and the first one's error), or the batch failing as a whole (0 records rejected)."""
        try:
            decoded = self.decoder.decode_batch(group.records, group.stream_name, group.shard_id)
            if decoded.rejected:
                error = TransformError(self.decoder.spec, decoded.rejected[0].error, DECODER)
                return StillFailing(group, len(decoded.rejected), str(error))
            table = decoded.table
            if self.transform is not None and self.transform_spec is not None:
                table = transformed(table, group.stream_name, group.shard_id, self.transform_spec, self.transform)
            return ReplayedRows(table, decoded.left_out)
        except TransformError as error:  # decoded columns that clash with the batch's, a transform that fails
            return StillFailing(group, 0, str(error))


@dataclass(frozen=True)
class ReplayedRows:
    """A group's rows, and how many of its dead letters the decoder left out on purpose (it returned
    None for them: records that no fix can land, given up on by whoever wrote the replay's decoder)."""

    table: pa.Table
    left_out: int


@dataclass(frozen=True)
class StillFailing:
    """The group that stopped its lease's replay: how many of its records were rejected (0: the batch
    failed as a whole), and the first error."""

    group: DeadLetterGroup
    rejected: int
    error: str


@dataclass(frozen=True)
class LeaseReplay:
    lease_key: str
    replayed: tuple[DeadLetterGroup, ...] = ()
    rows: int = 0  # the rows they landed as (a decoder may leave a record out, a transform filter it)
    left_out: int = 0  # dead letters of the replayed batches the decoder left out on purpose (None)
    already_landed: tuple[DeadLetterGroup, ...] = ()
    failing: StillFailing | None = None
    waiting: tuple[DeadLetterGroup, ...] = ()  # after the failing group: not tried

    def render(self, dry_run: bool) -> list[str]:
        parts = []
        if self.replayed:
            verb = "would replay" if dry_run else "replayed"
            parts.append(f"{verb} {_batches(self.replayed)} as {self.rows} row(s)")
        if self.left_out:
            parts.append(f"{self.left_out} dead letter(s) left out by the decoder (it returned None)")
        if self.already_landed:
            parts.append(f"{_batches(self.already_landed)} landed before")
        lines = [f"  {self.lease_key}: {'; '.join(parts) or 'nothing replayed'}"]
        if self.failing is not None:
            rejected = f"{self.failing.rejected} record(s) still rejected" if self.failing.rejected else "it fails"
            lines.append(
                f"    STILL FAILING: {self.failing.group.describe()}: {rejected}; the first: {self.failing.error}"
            )
        if self.waiting:
            lines.append(f"    waiting behind it: {_batches(self.waiting)}")
        return lines


def _batches(groups: Sequence[DeadLetterGroup]) -> str:
    return f"{len(groups)} batch(es) of {sum(len(group.records) for group in groups)} dead letter(s)"


@dataclass(frozen=True)
class ReplayReport:
    output_uri: str
    dead_letters_uri: str
    dry_run: bool
    leases: tuple[LeaseReplay, ...]

    @property
    def complete(self) -> bool:
        """Whether every dead letter found is in the output now (or would be, for a dry run)."""
        return all(lease.failing is None for lease in self.leases)

    @property
    def left_out(self) -> int:
        """Dead letters the decoder left out on purpose: replayed, but not in the output."""
        return sum(lease.left_out for lease in self.leases)

    def render(self) -> str:
        if not self.leases:
            return f"no dead letters at {self.dead_letters_uri}: nothing to replay"
        lines = [
            f"dead letters at {self.dead_letters_uri} into {self.output_uri}"
            f"{' (dry run: nothing lands)' if self.dry_run else ''}: {len(self.leases)} lease(s)",
            *(line for lease in self.leases for line in lease.render(self.dry_run)),
        ]
        failing = [lease for lease in self.leases if lease.failing is not None]
        if failing:
            lines.append(
                f"{len(failing)} lease(s) still have records the decoder rejects: fix it and replay again "
                "(the batches that landed are not replayed again)"
            )
        elif self.left_out:
            outcome = "would be" if self.dry_run else "is"
            lines.append(
                f"every dead letter {outcome} in the output except the {self.left_out} the decoder left out on "
                "purpose (it returned None for them); the dead letters stay where they are, as a log"
            )
        else:
            outcome = "would be" if self.dry_run else "is"
            lines.append(f"every dead letter {outcome} in the output; the dead letters stay where they are, as a log")
        return "\n".join(lines)


class DeadLetterReplay:
    """The dead letters beside `output` (in `dead_letters`), replayed through `processing` into it, as
    batches of `application`'s pseudo leases."""

    def __init__(
        self,
        output: BatchSink,
        dead_letters: BatchSink,
        processing: Processing,
        application: str,
        batches_per_commit: int = BATCHES_PER_COMMIT,
    ) -> None:
        self.output = output
        self.dead_letters = dead_letters
        self.processing = processing
        self.application = application
        self.batches_per_commit = batches_per_commit

    @classmethod
    def open(
        cls,
        output_uri: str,
        config: ConsumerConfig,
        processing: Processing,
        batches_per_commit: int = BATCHES_PER_COMMIT,
    ) -> DeadLetterReplay:
        """`SinkError` when `output_uri` is not a sink's, or no dead letters can go beside it."""
        uri = check_sink_uri(output_uri)
        output, dead_letters = open_sink(uri, config=config), open_sink(dead_letter_uri(uri), config=config)
        return cls(output, dead_letters, processing, config.require_application_name(), batches_per_commit)

    def run(
        self, *, stream: str | None = None, dry_run: bool = False, ensure_held: Callable[[], None] = lambda: None
    ) -> ReplayReport:
        """Replay every lease's dead letters (of `stream` only, when given) that have not landed;
        `dry_run`: decode them and land nothing. `ensure_held` is called before every write."""
        table = read_dead_letters(self.dead_letters)
        groups = {} if table is None else dead_letter_groups(table, self.application, stream)
        landed = landed_check(self.output)
        identity = RoundIdentity(self.application, REPLAY_ROUND, {}, checks_continuity=False)
        writer = None if dry_run else _Writer(self.output, identity, self.batches_per_commit, ensure_held)
        leases = tuple(self._replay(key, lease_groups, landed, writer) for key, lease_groups in groups.items())
        if writer is not None:
            writer.publish()
        return ReplayReport(self.output.uri, self.dead_letters.uri, dry_run, leases)

    def _replay(
        self,
        lease_key: str,
        groups: Sequence[DeadLetterGroup],
        landed: Callable[[BatchRange], bool],
        writer: _Writer | None,
    ) -> LeaseReplay:
        replayed: list[DeadLetterGroup] = []
        already: list[DeadLetterGroup] = []
        rows = left_out = 0
        for index, group in enumerate(groups):
            if landed(group.batch):
                already.append(group)
                continue
            outcome = self.processing.rows(group)
            if isinstance(outcome, StillFailing):
                waiting = tuple(groups[index + 1 :])
                return LeaseReplay(lease_key, tuple(replayed), rows, left_out, tuple(already), outcome, waiting)
            if writer is not None:
                writer.land(group.batch, outcome.table)
            replayed.append(group)
            rows += outcome.table.num_rows
            left_out += outcome.left_out
        return LeaseReplay(lease_key, tuple(replayed), rows, left_out, tuple(already))


class _Writer:
    """Lands batches through the protocol's steps as a slot and then the driver take them, publishing
    every `batches_per_commit` batches."""

    def __init__(
        self, sink: BatchSink, identity: RoundIdentity, batches_per_commit: int, ensure_held: Callable[[], None]
    ) -> None:
        self.sink = sink
        # An attempt of its own per run, as each claim of a round's lease is: a run never writes over
        # what another staged (one that died before its commit), nor a table's committed data files.
        self.attempt = f"dead-letter-replay/{uuid.uuid4().hex}"
        self.identity = identity
        self.batches_per_commit = batches_per_commit
        self.ensure_held = ensure_held
        self.records: dict[str, str] = {}  # pseudo lease key -> its record, as a lease would keep it
        self.unpublished = 0

    def land(self, batch: BatchRange, table: pa.Table) -> None:
        self.ensure_held()
        staged = self.sink.stage(batch, table, self.attempt)
        # A staged batch without a token has nothing to make visible (a dataset writes no file for no rows).
        record = self.sink.commit_record(self.records.get(batch.lease_key), staged if staged.token else None)
        if record is None:
            return
        self.records[batch.lease_key] = record
        self.ensure_held()
        if self.sink.make_visible(record) is Visibility.MISSING:
            raise SinkError(
                self.sink.uri,
                f"the replayed batch {self.sink.batch_name(batch)} was deleted before it was made visible",
            )
        self.unpublished += 1
        if self.unpublished >= self.batches_per_commit:
            self.publish()

    def publish(self) -> None:
        """Make every batch landed since the last publication visible: a table's one commit (a dataset
        has made each visible already)."""
        if not self.records:
            return
        self.ensure_held()
        publication = self.sink.publish_round(self.records, self.identity)
        if publication.missing_batches:
            raise SinkError(
                self.sink.uri,
                f"replayed batches were deleted before they landed: {', '.join(publication.missing_batches)}",
            )
        self.records.clear()
        self.unpublished = 0


def read_dead_letters(sink: BatchSink) -> pa.Table | None:
    """Every dead letter readers of the destination `sink` see, with `stream_name` and `shard_id`; None
    when there is none (no batch ever had dead letters)."""
    if isinstance(sink, ParquetSink):
        table = sink.read_dataset()  # `_`-prefixed (staged) files skipped, as every reader does
        return table if table.num_rows else None
    if isinstance(sink, TableCommitter):
        rows = sink.visible_rows()
        return rows if rows is not None and rows.num_rows else None
    raise SinkError(sink.uri, "is not a destination whose dead letters can be read")


def landed_check(sink: BatchSink) -> Callable[[BatchRange], bool]:
    """Whether a pseudo lease's batch is in `sink` already: a Parquet dataset answers with the batch's
    file, visible to readers; a table with the position its map holds for the pseudo lease (its groups
    land in order, so every one at or before that position has)."""
    if isinstance(sink, ParquetSink):
        return lambda batch: sink.adopt(None, batch, "") is not None
    if isinstance(sink, TableCommitter):
        return lambda batch: (held := sink.holds_through(batch)) is not None and held >= batch.end
    raise SinkError(sink.uri, "is not a destination dead letters can be replayed into")
