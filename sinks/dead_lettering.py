"""The output and, beside it, its dead-letter destination: one `BatchSink` to the lease protocol.

A batch's dead letters (`spark_jobs.dead_letters`) are a second table staged under the same batch
range into a sink of the output's kind at `dead_letter_uri(output)`: `<path>-dead-letters` beside a
Parquet dataset, a table `<table>_dead_letters` beside an Iceberg table. Both are driven through the
protocol of `batch_sink` as one sink, so they share its guarantees:

- one commit of the lease keeps both sinks' records (`committedBatchFile` holds a pair when the
  batch had dead letters, the output's own record otherwise, so a lease without dead letters looks
  as it always did);
- a redo adopts both staged parts or reads the range again; the dead letters are staged first, so a
  staged output means its dead letters (if any) were staged too;
- the dead letters are made visible before the output (per batch, or at the round's end in the
  dead-letter table's own commit, before the output table's), so that a reader of the output never
  sees a batch whose rejected records are not in the dead letters yet. Both parts are committed
  together first, so either order lands each once: a crash in between leaves the other part for
  whoever makes the lease's committed batches visible next, and a dead-letter destination that
  cannot take them (its table dropped) holds up only its own part, never the output's.

The dead-letter sink is opened only when a record names it or a batch has dead letters, so a
pipeline that turns dead-lettering off still finishes what an earlier round set aside.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from urllib.parse import urlsplit

import pyarrow as pa

from lease_core.model.sequence import ExtendedSequenceNumber
from sinks.batch_sink import (
    BatchRange,
    BatchSink,
    RoundIdentity,
    RoundPublication,
    StagedBatch,
    Visibility,
)
from sinks.errors import SinkError
from sinks.record_columns import RECORD_SCHEMA

# A dead letter (`spark_jobs.dead_letters`): the record as it arrived (the record columns), why it was
# rejected and by what, by whom and from which stream, and the batch it came from (the lease and its
# range), so that a replay lands it once.
DEAD_LETTER_SCHEMA = pa.schema(
    [
        *RECORD_SCHEMA,
        pa.field("error", pa.string(), nullable=False),
        pa.field("processing", pa.string(), nullable=False),
        # Who set it aside, and from which incarnation of its stream (a stream deleted and created again
        # under its name starts its sequence numbers over): several applications may share a table.
        pa.field("application", pa.string(), nullable=False),
        pa.field("stream_arn", pa.string()),
        pa.field("stream_created", pa.int64()),
        pa.field("lease_key", pa.string(), nullable=False),
        pa.field("batch_start", pa.string(), nullable=False),
        pa.field("batch_end", pa.string(), nullable=False),
    ]
)

# A token or record that names a part of both sinks: this prefix, then [output's, dead letters'] as JSON.
PAIR_PREFIX = "dead-letters/1 "
_WORST_FIRST = (Visibility.MISSING, Visibility.AT_ROUND_END, Visibility.VISIBLE)


def dead_letter_uri(output_uri: str) -> str:
    """Pure: where the dead letters of the sink at `output_uri` go, beside it."""
    uri = output_uri.rstrip("/")
    if urlsplit(uri).scheme == "iceberg":
        return f"{uri}_dead_letters"
    parts = urlsplit(uri)
    if parts.scheme == "s3" and not parts.path.strip("/"):
        raise SinkError(uri, "dead letters need a prefix in the bucket (s3://bucket/prefix) to go beside the output")
    return f"{uri}-dead-letters"


def split_record(record: str | None) -> tuple[str | None, str | None]:
    """Pure: the output's and the dead letters' parts of a token or record (the output's own when it
    names no dead letters)."""
    if record is None or not record.startswith(PAIR_PREFIX):
        return record, None
    try:
        output, dead = json.loads(record[len(PAIR_PREFIX) :])
    except (ValueError, TypeError) as error:
        raise SinkError("dead letters", f"the lease record {record[:200]!r} cannot be read ({error})") from None
    return output, dead


def join_record(output: str | None, dead: str | None) -> str | None:
    """Pure: the token or record naming both parts (the output's own when there is no dead-letter part)."""
    if dead is None:
        return output
    return PAIR_PREFIX + json.dumps([output, dead], separators=(",", ":"))


class DeadLetteringSink:
    """`output`, with its dead letters in the sink `open_dead_letters` opens (at `dead_letters_uri`);
    `enabled`: whether this pipeline sets bad records aside (else it only finishes earlier ones)."""

    def __init__(
        self, output: BatchSink, dead_letters_uri: str, open_dead_letters: Callable[[], BatchSink], *, enabled: bool
    ) -> None:
        self.output = output
        self.dead_letters_uri = dead_letters_uri
        self.enabled = enabled
        self._open_dead_letters = functools.cache(open_dead_letters)

    @property
    def dead_letters(self) -> BatchSink:
        return self._open_dead_letters()

    @property
    def uri(self) -> str:
        return self.output.uri

    def check_writable(self, columns: pa.Schema | None) -> None:
        self.output.check_writable(columns)
        if self.enabled:
            self.dead_letters.check_writable(DEAD_LETTER_SCHEMA)

    def lineage_dataset(self) -> tuple[str, str]:
        return self.output.lineage_dataset()

    def reports_root(self) -> str:
        return self.output.reports_root()

    def batch_name(self, batch: BatchRange) -> str:
        return self.output.batch_name(batch)

    def holds_through(self, batch: BatchRange) -> ExtendedSequenceNumber | None:
        return self.output.holds_through(batch)

    def staged_token(self, batch: BatchRange, attempt: str) -> str | None:
        """The output's token, paired with the dead letters' when this pipeline may set records aside."""
        output = self.output.staged_token(batch, attempt)
        if not self.enabled:
            return output
        return join_record(output, self.dead_letters.staged_token(batch, attempt) or "")

    def stage(self, batch: BatchRange, table: pa.Table, attempt: str) -> StagedBatch:
        return self.output.stage(batch, table, attempt)

    def stage_with_dead_letters(
        self, batch: BatchRange, table: pa.Table, dead_letters: pa.Table, attempt: str
    ) -> StagedBatch:
        """Stage the batch's dead letters (first), then its rows."""
        if dead_letters.num_rows == 0:
            return self.stage(batch, table, attempt)
        dead = self.dead_letters.stage(batch, dead_letters, attempt)
        return _joined(self.output.stage(batch, table, attempt), dead)

    def adopt(self, staged: str | None, batch: BatchRange, attempt: str) -> StagedBatch | None:
        """Both parts the preparing attempt staged, or None. Its output staged means its dead letters
        were staged before, if it had any: a dead-letter part not there to adopt had none."""
        output_token, dead_token = split_record(staged)
        output = self.output.adopt(output_token, batch, attempt)
        if output is None or not dead_token:
            return output
        return _joined(output, self.dead_letters.adopt(dead_token, batch, attempt))

    def commit_record(self, previous: str | None, staged: StagedBatch | None) -> str | None:
        previous_output, previous_dead = split_record(previous)
        output_token, dead_token = split_record(None if staged is None else staged.token)
        output = self.output.commit_record(previous_output, _part(output_token))
        if previous_dead is not None and not self.dead_letters.awaiting_visibility(previous_dead):
            # Visible, or never to be (its staged data or its table deleted since): nothing left to wait for.
            previous_dead = None
        dead = None
        if previous_dead is not None or dead_token:
            dead = self.dead_letters.commit_record(previous_dead, _part(dead_token))
        return join_record(output, dead)

    def make_visible(self, record: str | None) -> Visibility:
        output, dead = split_record(record)
        found = [] if dead is None else [self.dead_letters.make_visible(dead)]
        found.append(self.output.make_visible(output))
        return next(visibility for visibility in _WORST_FIRST if visibility in found)

    def awaiting_visibility(self, record: str | None) -> tuple[str, ...]:
        output, dead = split_record(record)
        awaiting = (
            ()
            if dead is None
            else tuple(f"dead letters {name}" for name in self.dead_letters.awaiting_visibility(dead))
        )
        return awaiting + self.output.awaiting_visibility(output)

    def publish_round(self, records: Mapping[str, str], identity: RoundIdentity) -> RoundPublication:
        """The dead-letter sink's publication first, then the output's (a failure of the first leaves
        both for the next round)."""
        parts = {key: split_record(record) for key, record in records.items()}
        dead_records = {key: dead for key, (_, dead) in parts.items() if dead is not None}
        dead, failure = RoundPublication(0, 0, 0), None
        if dead_records:
            try:
                # The dead letters hold only the batches that had some: a lease's batches there do not follow
                # one another, and no checkpoint says what they lack.
                lone = replace(identity, checkpoints={}, checks_continuity=False)
                dead = self.dead_letters.publish_round(dead_records, lone)
            except SinkError as error:  # the output's committed batches do not wait for them
                failure = error
        output = self.output.publish_round(
            {key: output for key, (output, _) in parts.items() if output is not None}, identity
        )
        if failure is not None:
            raise SinkError(
                self.dead_letters_uri or failure.uri,
                f"the dead letters were not made visible ({failure.problem}); the output's {output.batches_published} "
                "committed batch(es) were",
                retryable=failure.retryable,
            )
        return RoundPublication(
            commits=dead.commits + output.commits,
            batches_published=output.batches_published,
            batches_already_visible=output.batches_already_visible,
            missing_batches=tuple(f"dead letters of {name}" for name in dead.missing_batches) + output.missing_batches,
            snapshot_id=output.snapshot_id,
        )


def _part(token: str | None) -> StagedBatch | None:
    """A part of a joined staged batch, as its own sink's `commit_record` takes it (by its token)."""
    return StagedBatch(token, 0, 0) if token else None


def _joined(output: StagedBatch, dead: StagedBatch | None) -> StagedBatch:
    if dead is None:
        return output
    return StagedBatch(
        join_record(output.token, dead.token),
        output.rows,
        output.bytes + dead.bytes,
        output.already_present,
        dead_letters=dead.rows,
    )
