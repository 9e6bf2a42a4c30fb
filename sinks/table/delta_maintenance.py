"""Upkeep of a Delta table the sink writes (`leasectl maintain`): compact small files, vacuum what
commits removed, checkpoint the log, remove the files nothing will commit.

Small files. Each round's commit adds a data file per batch and day, so a table written every few
minutes by many leases gathers small files, which slow every reader. delta-rs' compaction
(`optimize.compact`) rewrites each partition's small files into files of about the target size, in
one commit that adds no data (`dataChange` false): readers see the same rows before and after. A
round's commit that meets it is rebased over it by delta-rs (it adds files, and reads none); the
applications' transactions are table state, which every later commit and checkpoint keeps.

Vacuum. delta-rs' vacuum in its default ("lite") mode deletes only files that commits removed (a
compaction's inputs, a user's delete), once they are older than the table's
`delta.deletedFileRetentionDuration` (Delta's default: 7 days). It never deletes a file the log never
added, so the staged files of a batch a lease committed and the table does not hold yet are safe
however long the batch waits. (A full vacuum, Spark's `VACUUM`, deletes every file the log does not
name once older than the retention: a batch waiting longer than that loses its staged files, and the
next round reports it lost instead of adding files that are gone.)

The log. A checkpoint of the log at the current version (delta-rs also writes one every
`delta.checkpointInterval` commits, 100 by default), then the log entries past the table's
`delta.logRetentionDuration` (30 days) removed; the applications' transactions live on in the
checkpoint. Only the upkeep removes log entries: the job's commits leave them (`JOB_COMMIT_HOOKS`), so
that a round deletes nothing in the table.

Orphans. A slot stages a batch's data files and its receipt before the lease commits; an attempt
fenced before its commit, or a redo that read the batch again, leaves them to nobody. Removed, among
the files under the table's folder, when last written before `older_than` (a writer between staging
and its commit is never that slow):
- this application's receipts no lease names (neither its record of committed batches awaiting the
  table nor its pending checkpoint), and the data files they name;
- data files named as this sink stages them (`part-<receipt>-<n>.parquet`) whose receipt, of any
  application, is gone (a slot that died between its data files and its receipt);
- this application's position maps that neither its transaction nor a commit in the log names (a
  publisher that died between its map and its commit, maps of commits the log no longer holds).
A file the table holds, or that a commit removed and vacuum has not deleted yet (a reader of an
older version may still read it), is never removed here. Another application's receipts and maps,
and every file of another writer, are left alone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

from deltalake import CommitProperties, DeltaTable

from lease_core.model.lease import Lease
from sinks.errors import SinkError
from sinks.table.committer import SUMMARY_APPLICATION, SUMMARY_POSITIONS
from sinks.table.delta import KINESIS_FOLDER, DeltaReceipt, DeltaSink
from sinks.table.lease_records import named_receipts
from sinks.table.storage import StoredFile

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
INFO_COMPACTION = "kinesis.compaction"
# The name `DeltaSink` gives a staged data file: part-<receipt id>-<index>.parquet.
STAGED_DATA_FILE = re.compile(r"part-(?P<receipt>[0-9a-f]{32})-\d+\.parquet")


@dataclass(frozen=True)
class Compaction:
    files_rewritten: int
    files_written: int
    partitions: int


@dataclass(frozen=True)
class OrphanRemoval:
    removed: tuple[str, ...]  # paths relative to the table's folder
    kept_too_young: int  # nobody's, but written within the grace period


def compact_small_files(sink: DeltaSink, target_bytes: int = DEFAULT_TARGET_FILE_BYTES) -> Compaction:
    """Rewrite each partition's files smaller than `target_bytes` into files of about that size."""
    table = _table(sink)
    properties = CommitProperties(custom_metadata={INFO_COMPACTION: f"target {target_bytes} bytes"})
    with sink.failures("compact the table's small files"):
        metrics = table.optimize.compact(target_size=target_bytes, commit_properties=properties)
    log.info("%s: compaction %s", sink.uri, metrics)
    return Compaction(
        int(metrics.get("numFilesRemoved", 0)),
        int(metrics.get("numFilesAdded", 0)),
        int(metrics.get("partitionsOptimized", 0)),
    )


def vacuum_removed_files(sink: DeltaSink) -> tuple[str, ...]:
    """Delete the files commits removed, past the table's retention (lite mode: module doc)."""
    table = _table(sink)
    with sink.failures("vacuum the files commits removed"):
        return tuple(table.vacuum(dry_run=False, full=False))


def checkpoint_log(sink: DeltaSink) -> int:
    """Checkpoint the log at the current version and remove its expired entries; the version."""
    table = _table(sink)
    with sink.failures("checkpoint the table's log"):
        table.create_checkpoint()
        table.cleanup_metadata()
    return table.version()


def remove_orphan_files(
    sink: DeltaSink, live: set[str], older_than: timedelta, now: datetime | None = None
) -> OrphanRemoval:
    """Delete the files nothing will commit (module doc); `live`: the receipts the lease table names."""
    table = _table(sink)
    cutoff = (now or datetime.now(UTC)) - older_than
    with sink.failures("list the table's files"):
        files = list(sink.storage.listing())
        kept = _held_files(sink, table) | {sink.receipt_path(receipt) for receipt in live}
        kept |= _named_position_maps(sink, table)
    receipts = {
        file.path.rsplit("/", 1)[-1].removesuffix(".json")
        for file in files
        if file.path.startswith(f"{KINESIS_FOLDER}/staged/")
    }
    own_receipts = f"{KINESIS_FOLDER}/staged/{sink.application}/"
    own_maps = f"{KINESIS_FOLDER}/positions/{sink.application}/"
    orphans: list[str] = []
    too_young = 0
    for file in files:
        staged = STAGED_DATA_FILE.fullmatch(file.path.rsplit("/", 1)[-1])
        candidate = file.path.startswith((own_receipts, own_maps)) or (
            staged is not None and staged["receipt"] not in receipts
        )
        if not candidate or file.path in kept:
            continue
        if file.modified >= cutoff:
            too_young += 1
            continue
        if file.path.startswith(own_receipts):
            orphans.extend(_staged_data_files(sink, file, kept))  # before the receipt that names them
        orphans.append(file.path)
    with sink.failures("delete the orphan files"):
        sink.storage.delete(orphans)
    log.info("%s: removed %d orphan file(s); %d are younger than %s", sink.uri, len(orphans), too_young, older_than)
    return OrphanRemoval(tuple(orphans), too_young)


def _staged_data_files(sink: DeltaSink, receipt_file: StoredFile, kept: set[str]) -> Iterable[str]:
    receipt_id = receipt_file.path.rsplit("/", 1)[-1].removesuffix(".json")
    try:
        receipt = DeltaReceipt.from_json(sink.storage.read(receipt_file.path))
    except (OSError, ValueError, KeyError) as error:  # not a receipt of ours: its files are not provably ours
        log.warning("%s: the receipt %s cannot be read (%s); its data files stay", sink.uri, receipt_id, error)
        return ()
    return [file["path"] for file in receipt.files if file["path"] not in kept]


def _held_files(sink: DeltaSink, table: DeltaTable) -> set[str]:
    """The data files the table holds, and those commits removed that vacuum has not deleted yet."""
    current = {sink.relative_path(uri) for uri in table.file_uris()}
    removed = table.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False, full=False)
    return current | {unquote(path) for path in removed}


def _named_position_maps(sink: DeltaSink, table: DeltaTable) -> set[str]:
    """The application's position maps its transaction or a commit in the log names."""
    named = {sink.positions_path(version)} if (version := sink.transaction_version(table)) else set()
    for entry in table.history():
        path = entry.get(SUMMARY_POSITIONS)
        if entry.get(SUMMARY_APPLICATION) == sink.application and path:
            named.add(str(path).removeprefix(f"{sink.location}/"))
    return named


def _table(sink: DeltaSink) -> DeltaTable:
    table = sink.table()
    if table is None:
        raise SinkError(sink.uri, "there is no Delta table there")
    return table


def upkeep(sink: DeltaSink, leases: Sequence[Lease], orphan_age: timedelta, target_file_bytes: int) -> list[str]:
    """`leasectl maintain` on a Delta table: small files compacted, removed files vacuumed past the
    table's retention, the log checkpointed, orphan files removed; a line per thing done."""
    try:
        compaction = compact_small_files(sink, target_file_bytes)
        compacted = (
            f"compacted {compaction.files_rewritten} small file(s) of {compaction.partitions} partition(s) "
            f"into {compaction.files_written}"
        )
    except SinkError as error:  # the rest of the upkeep does not depend on it
        compacted = f"compaction not done: {error}"
    vacuumed = vacuum_removed_files(sink)
    version = checkpoint_log(sink)
    removal = remove_orphan_files(sink, named_receipts(sink.RECORD, leases), orphan_age)
    return [
        compacted,
        f"vacuumed {len(vacuumed)} file(s) that commits removed, past the table's retention",
        f"checkpointed the log at version {version} and removed its expired entries",
        f"removed {len(removal.removed)} orphan file(s); {removal.kept_too_young} unreferenced file(s) are "
        f"younger than {orphan_age} and stay",
        *(f"  removed {path}" for path in removal.removed),
    ]
