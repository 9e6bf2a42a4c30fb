"""The one seam between the exactly-once protocol and where the records land (docs/architecture.md, "Sinks").

A lease's batch is the records after its committed checkpoint C up to and including its last record
E. The consumer (`spark_jobs.lease_consumer`) drives every sink through the same few steps:

1. `stage` the batch's rows under the attempt's own name, invisible to readers, after the batch is
   prepared (pending checkpoint E, whose description keeps `staged_token`: what the stage will be
   called). A redo by another attempt first tries to `adopt` what the preparing attempt staged.
2. Commit E on the lease, recording `commit_record(previous, staged)`: an opaque string the lease
   keeps for the sink (the item attribute `committedBatchFile`). The lease protocol never looks
   inside it; the sink alone knows which committed batches it names.
3. `make_visible(record)`: the committed batches the record names become visible to readers, at
   once (a Parquet file is renamed) or at the round's end (`publish_round`, one table commit for every
   lease of the round). Either way it can be repeated by anyone, any number of times, and a batch
   becomes visible once: a record names committed ranges only, and the sink tells which of them
   readers already see.
4. `awaiting_visibility(record)`: the committed batches readers cannot see yet. The idle check counts
   them as work, and the round report names them.

Implementations: `sinks.parquet` (a hive-partitioned dataset) and
`sinks.table.iceberg` (an Apache Iceberg table). `sinks.open_sink` chooses by URI.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import pyarrow as pa

from lease_core.model.sequence import ExtendedSequenceNumber


@dataclass(frozen=True)
class BatchRange:
    """One batch of one lease: the records after `start` (the committed checkpoint) up to and
    including `end` (its last record, the checkpoint the batch commits); `first` is its first record."""

    lease_key: str
    stream_name: str
    shard_id: str
    start: ExtendedSequenceNumber
    first: ExtendedSequenceNumber | None
    end: ExtendedSequenceNumber


@dataclass(frozen=True)
class StagedBatch:
    """A batch staged by one attempt: `token` names it for the commit (None: nothing needs making
    visible, e.g. a batch an earlier version made visible before its commit)."""

    token: str | None
    rows: int
    bytes: int
    already_present: bool = False  # this attempt staged the batch before (a retried write)
    dead_letters: int = 0  # the batch's records set aside as dead letters (`sinks.dead_lettering`)


class Visibility(str, enum.Enum):
    """What `make_visible` found for the batches a record names."""

    VISIBLE = "visible"  # readers see every batch it names (made visible now or before)
    AT_ROUND_END = "at round end"  # the round's `publish_round` makes them visible
    MISSING = "missing"  # a committed batch's staged data was deleted before it became visible


# Stream name -> its ARN and creation time (epoch seconds): a stream deleted and created again under
# its name is another incarnation, whose shards and sequence numbers start over.
StreamIncarnations = Mapping[str, tuple[str, int]]


@dataclass(frozen=True)
class RoundIdentity:
    """What a round's publication records about the round (an Iceberg snapshot's summary)."""

    application: str
    round_number: int
    streams: StreamIncarnations
    # Whether each lease's batches continue where the table holds it: a round's do, a dead-letter
    # replay's pseudo leases do not (each group starts at its own first record).
    checks_continuity: bool = True
    # Each lease's committed checkpoint as the round ended (the lease table scan the publication is
    # made from): a table that holds a lease short of it, with no batch waiting to fill the difference,
    # lacks those records for good (a rollback took them out), and its publication names them.
    checkpoints: Mapping[str, ExtendedSequenceNumber] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundPublication:
    """What `publish_round` did: the commits it made (0 when nothing was waiting), the batches they
    made visible, the ones already visible before, the ones whose staged data was gone, and the
    table's new snapshot (None for a sink without snapshots, or when nothing was committed)."""

    commits: int
    batches_published: int
    batches_already_visible: int
    missing_batches: tuple[str, ...] = ()
    snapshot_id: int | None = None


class BatchSink(Protocol):
    @property
    def uri(self) -> str: ...

    def check_writable(self, columns: pa.Schema | None) -> None:
        """Fail, before any lease moves, when the sink cannot take batches (missing bucket, catalog or
        namespace) or cannot hold their `columns` (None: not known before the data)."""

    def lineage_dataset(self) -> tuple[str, str]:
        """What lineage calls the output (OpenLineage's naming: a namespace and a name): the
        dataset's or the table's location, as s3://bucket and its path, or file and a local path."""

    def reports_root(self) -> str:
        """Where round reports go by default (a local path, file:// or s3:// URI), beside the output
        and out of its readers' way."""

    def batch_name(self, batch: BatchRange) -> str:
        """A name for the batch that is a pure function of (stream, shard, start, end): kept in the
        pending checkpoint's description and shown in reports."""

    def holds_through(self, batch: BatchRange) -> ExtendedSequenceNumber | None:
        """The position through which readers see the batch's lease's records already (None: none, or a
        sink that records no positions): a batch is staged only for the records after it."""

    def staged_token(self, batch: BatchRange, attempt: str) -> str | None:
        """The token `stage` will give `attempt`'s batch, known before it is written (the prepare, which
        comes first, keeps it for a redo to `adopt`), or None when the sink cannot say."""

    def stage(self, batch: BatchRange, table: pa.Table, attempt: str) -> StagedBatch:
        """Write `table` (the batch's rows) for `attempt` (its claim token) so that readers do not see it."""

    def adopt(self, staged: str | None, batch: BatchRange, attempt: str) -> StagedBatch | None:
        """The batch staged by the attempt that prepared it (`staged`, its token), taken over by
        `attempt`; None when it cannot be (then the batch is read again and staged anew). With `staged`
        None there is nothing to take over: only a batch readers already see is answered (token None)."""

    def commit_record(self, previous: str | None, staged: StagedBatch | None) -> str | None:
        """The record the lease's commit of `staged` keeps, given the lease's `previous` record."""

    def make_visible(self, record: str | None) -> Visibility:
        """Make the committed batches `record` names visible (or leave them to the round's end)."""

    def awaiting_visibility(self, record: str | None) -> tuple[str, ...]:
        """The names of the committed batches `record` names that readers cannot see yet (and can be made visible)."""

    def publish_round(self, records: Mapping[str, str], identity: RoundIdentity) -> RoundPublication:
        """At the round's end, by the driver: make visible every committed batch that `records` (lease
        key -> the lease's record) name and readers cannot see yet."""


def location_dataset(location: str) -> tuple[str, str]:
    """OpenLineage's (namespace, name) of a storage location: ("s3://bucket", "path") for an object
    store, ("file", "/absolute/path") for a local path or file:// URI."""
    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        return "file", os.path.abspath(parts.path if parts.scheme else location)
    return f"{parts.scheme}://{parts.netloc}", parts.path.strip("/")
