"""Upkeep of an Iceberg table the sink writes: expire old snapshots, remove files nothing will commit.

Snapshots. Every round adds one; each keeps its metadata and the data files it replaced alive.
`expire_snapshots` drops those older than the table's `history.expire.max-snapshot-age-ms` (Iceberg's
default: 5 days), always keeping branch and tag heads, the newest `history.expire.min-snapshots-to-keep`,
and the newest snapshot of every application that commits to the table with every snapshot above it
in `main`'s history (its position map is how a later round knows what the table holds, found by
walking back from the head: an application idle for long keeps the history since its last commit).

Orphans. A slot stages a batch's data files, a manifest and a receipt before the lease commits; an
attempt fenced before its commit, or a redo that read the batch again, leaves its staged files to
nobody. `remove_orphan_files` deletes, among the files under the table's location, those that:
- are this application's (its staged batches under `metadata/kinesis-staged/<application>/` with the
  data files they name, its position maps under `metadata/kinesis-positions/<application>/`), or
  manifests and manifest lists of commits that never landed: another application writing the same
  table, and any other writer's data files, are left alone;
- no snapshot of the table references (data files, manifests, manifest lists, position maps), and
- no lease names: neither in its record of committed batches awaiting the table, nor in its
  pending checkpoint (the staged batch of a commit that may still be in flight), and
- were last written before `older_than` (Iceberg's own default: 3 days): a writer between staging
  and its commit, ours or another tool's, is never that slow.
Table metadata files (`*.metadata.json`) are the catalog's and are never touched.

Small files. Each round's commit adds a data file per batch and partition, so a table written every
few minutes by many leases gathers small files, which slow every reader. `compact_small_files`
rewrites each partition's files smaller than the target into files of about the target size, in one
commit that replaces exactly the files it read (an overwrite snapshot; readers see the same rows
before and after). It is planned and committed on one snapshot: if anyone commits in between (a
round's publication), the commit fails and the compaction is planned again on the new head (never
rebased, which could drop the files the other commit added). Partitions with row-level deletes are
left alone (their delete files would outlive the files they apply to). The applications' snapshots,
and so their position maps, stay in `main`'s history: a compaction's snapshot only sits above them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow.fs as pafs
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, PyArrowFileIO, _dataframe_to_data_files
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from lease_core.model.lease import Lease
from sinks.errors import SinkError
from sinks.table.committer import SUMMARY_COMMIT_ID
from sinks.table.iceberg import (
    POSITIONS_FOLDER,
    POSITIONS_PROPERTY_PREFIX,
    STAGING_FOLDER,
    SUMMARY_APPLICATION,
    SUMMARY_POSITIONS,
    IcebergSink,
    StagedBatchGone,
)
from sinks.table.lease_records import named_receipts

log = logging.getLogger(__name__)

DEFAULT_ORPHAN_AGE = timedelta(days=3)
MAX_SNAPSHOT_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_PROPERTY = "history.expire.min-snapshots-to-keep"
DEFAULT_MAX_SNAPSHOT_AGE = timedelta(days=5)
DEFAULT_MIN_SNAPSHOTS = 1


@dataclass(frozen=True)
class OrphanRemoval:
    removed: tuple[str, ...]
    kept_too_young: int  # unreferenced, but written within the grace period


@dataclass(frozen=True)
class Compaction:
    files_rewritten: int
    files_written: int
    bytes_rewritten: int
    partitions: int
    snapshot_id: int | None  # None: nothing was small enough in numbers to be worth a commit


DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
COMPACTION_ATTEMPTS = 4
SUMMARY_COMPACTION = "kinesis.compaction"


def compact_small_files(
    sink: IcebergSink, target_bytes: int = DEFAULT_TARGET_FILE_BYTES, min_files: int = 2
) -> Compaction:
    """Rewrite the table's small data files (see the module's docstring); what was rewritten."""
    for _ in range(COMPACTION_ATTEMPTS):
        table = _table(sink)
        with sink.failures("plan the compaction"):
            groups = _small_file_groups(table, target_bytes, min_files)
        if not groups:
            return Compaction(0, 0, 0, 0, None)
        tasks = [task for group in groups for task in group]
        with sink.failures("read the small files"):
            rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)
        with sink.failures("write the compacted files"):
            written = list(_dataframe_to_data_files(table.metadata, rows, table.io))
        transaction = table.transaction()
        summary = {SUMMARY_COMPACTION: f"{len(tasks)} file(s) in {len(groups)} partition(s)"}
        with transaction.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
            for task in tasks:
                overwrite.delete_data_file(task.file)
            for data_file in written:
                overwrite.append_data_file(data_file)
        transaction._snapshot_producers.clear()  # never rebased onto another commit: planned again instead
        try:
            with sink.failures("commit the compaction"):
                committed = transaction.commit_transaction()
        except CommitFailedException:
            log.info("%s: the table changed during the compaction; planning it again", sink.uri)
            filesystem, _ = _filesystem(table)
            for data_file in written:  # this commit certainly did not land: nothing references them
                _delete(sink, filesystem, data_file.file_path)
            continue
        except CommitStateUnknownException as error:
            raise SinkError(
                sink.uri,
                f"the compaction's commit was answered {error!r}: whether it landed is not known (either way "
                "the table holds each row once); run it again",
                retryable=True,
            ) from error
        snapshot = committed.current_snapshot()
        log.info("%s: compacted %d file(s) into %d", sink.uri, len(tasks), len(written))
        return Compaction(
            len(tasks),
            len(written),
            sum(task.file.file_size_in_bytes for task in tasks),
            len(groups),
            snapshot.snapshot_id if snapshot is not None else None,
        )
    raise SinkError(sink.uri, f"the table changed during {COMPACTION_ATTEMPTS} compactions in a row", retryable=True)


def _small_file_groups(table: Table, target_bytes: int, min_files: int) -> list[list[FileScanTask]]:
    """Per partition (and spec), its data files smaller than `target_bytes` without delete files,
    where there are at least `min_files` of them."""
    groups: dict[tuple[int, str], list[FileScanTask]] = {}
    with_deletes: set[tuple[int, str]] = set()
    for task in table.scan().plan_files():
        key = (task.file.spec_id, repr(task.file.partition))
        if task.delete_files:
            with_deletes.add(key)
        if task.file.file_size_in_bytes < target_bytes:
            groups.setdefault(key, []).append(task)
    return [tasks for key, tasks in sorted(groups.items()) if key not in with_deletes and len(tasks) >= min_files]


@dataclass(frozen=True)
class Expiry:
    snapshot_ids: tuple[int, ...]
    files_removed: tuple[str, ...]  # what only the expired snapshots referenced


def expire_snapshots(sink: IcebergSink, now: datetime | None = None) -> Expiry:
    """Expire the table's snapshots past its maximum age (see the module's docstring), and delete the
    files only they referenced (manifest lists, manifests, data files), as Iceberg's own expiry does:
    pyiceberg's expires the snapshots alone, which would leave every file a compaction or a user's
    delete replaced for good."""
    table = _table(sink)
    properties = table.properties
    max_age = timedelta(milliseconds=int(properties.get(MAX_SNAPSHOT_AGE_PROPERTY, 0))) or DEFAULT_MAX_SNAPSHOT_AGE
    keep_newest = int(properties.get(MIN_SNAPSHOTS_PROPERTY, DEFAULT_MIN_SNAPSHOTS))
    cutoff_millis = int(((now or datetime.now(UTC)) - max_age).timestamp() * 1000)
    kept = _kept_snapshots(table, keep_newest)
    expired = [
        snapshot
        for snapshot in table.snapshots()
        if snapshot.timestamp_ms < cutoff_millis and snapshot.snapshot_id not in kept
    ]
    if not expired:
        return Expiry((), ())
    with sink.failures("list the expiring snapshots' files"):
        expiring = _snapshot_files(table, expired)
    with sink.failures("expire snapshots"):
        table.maintenance.expire_snapshots().by_ids([snapshot.snapshot_id for snapshot in expired]).commit()
    log.info("%s: expired %d snapshot(s) older than %s", sink.uri, len(expired), max_age)
    table = _table(sink)
    with sink.failures("list the remaining snapshots' files"):
        remaining = _snapshot_files(table, table.snapshots())
        filesystem, _ = _filesystem(table)
    removed = tuple(_delete(sink, filesystem, path) for path in sorted(expiring - remaining))
    return Expiry(tuple(snapshot.snapshot_id for snapshot in expired), removed)


def _snapshot_files(table: Table, snapshots: Iterable[Snapshot]) -> set[str]:
    """The manifest lists, manifests and data and delete files `snapshots` reference."""
    io = table.io
    files: set[str] = set()
    for snapshot in snapshots:
        files.add(_normal(snapshot.manifest_list))
        for manifest in snapshot.manifests(io):
            files.add(_normal(manifest.manifest_path))
            files.update(
                _normal(entry.data_file.file_path) for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)
            )
    return files


def _kept_snapshots(table: Table, keep_newest: int) -> set[int]:
    """Branch and tag heads, the snapshots the applications' table properties name, the newest
    `keep_newest` of `main`'s history, each application's newest snapshot, and every snapshot between
    `main`'s head and the oldest of those: expiring one in between would cut `main`'s history above an
    application's snapshot, and the application would no longer find its position map by walking back
    from the head."""
    history = list(ancestors_of(table.current_snapshot(), table.metadata))
    kept = {ref.snapshot_id for ref in table.metadata.refs.values()}
    # The snapshot each application's table property names: off `main`'s history it is the evidence that
    # a rollback took that commit out (`IcebergSink._expired_positions`).
    named = {
        commit_id
        for key, value in table.properties.items()
        if key.startswith(POSITIONS_PROPERTY_PREFIX) and (commit_id := value.split(" ")[0])
    }
    kept |= {
        snapshot.snapshot_id
        for snapshot in table.snapshots()
        if snapshot.summary is not None and snapshot.summary.get(SUMMARY_COMMIT_ID) in named
    }
    deepest = min(keep_newest, len(history))
    applications_seen: set[str] = set()
    for depth, snapshot in enumerate(history):
        application = snapshot.summary.get(SUMMARY_APPLICATION) if snapshot.summary is not None else None
        if application is not None and application not in applications_seen:
            applications_seen.add(application)
            deepest = depth + 1
    return kept | {snapshot.snapshot_id for snapshot in history[:deepest]}


def remove_orphan_files(
    sink: IcebergSink, live: set[str], older_than: timedelta = DEFAULT_ORPHAN_AGE, now: datetime | None = None
) -> OrphanRemoval:
    """Delete the application's files that nothing references (see the module's docstring): its
    staged batches no lease names (with their data files), its position maps no snapshot names, and
    manifests and manifest lists of commits that never landed (anyone's, past the grace period). Data
    files are removed only as a batch of this application's: another writer's are its own business."""
    table = _table(sink)
    cutoff = (now or datetime.now(UTC)) - older_than
    with sink.failures("list the table's files"):
        referenced = _referenced_files(sink, table, live)
        filesystem, root = _filesystem(table)
        own = (_normal(sink.staging_location(table)) + "/", _normal(sink.positions_location(table)) + "/")
        metadata = f"{_normal(table.metadata.location)}/metadata/"
        candidates = [
            info
            for info in filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
            if info.type == pafs.FileType.File and _removable(info.path, own, metadata)
        ]
        orphaned_data = _orphaned_batch_data_files(sink, table, candidates, referenced, cutoff)
    removed, too_young = [], 0
    for path in orphaned_data:  # before their receipts, which name them
        removed.append(_delete(sink, filesystem, path))
    for info in candidates:
        if _normal(info.path) in referenced:
            continue
        if info.mtime is None or info.mtime.replace(tzinfo=UTC) >= cutoff:
            too_young += 1
            continue
        removed.append(_delete(sink, filesystem, info.path))
    log.info(
        "%s: removed %d orphan file(s); %d unreferenced are younger than %s",
        sink.uri,
        len(removed),
        too_young,
        older_than,
    )
    return OrphanRemoval(tuple(removed), too_young)


def _removable(path: str, own: tuple[str, ...], metadata: str) -> bool:
    """This application's staged batches and position maps, and manifests and manifest lists; never a
    table metadata file, another application's files, or a data file (`_orphaned_batch_data_files`)."""
    if f"/{STAGING_FOLDER}/" in path or f"/{POSITIONS_FOLDER}/" in path:
        return path.startswith(own)
    return path.startswith(metadata) and path.endswith(".avro")


def _orphaned_batch_data_files(
    sink: IcebergSink, table: Table, candidates: list[pafs.FileInfo], referenced: set[str], cutoff: datetime
) -> list[str]:
    """The data files of this application's orphaned staged batches (receipts past the grace period
    that no lease names), unless a snapshot references them."""
    data_files: list[str] = []
    for info in candidates:
        name = info.path.rsplit("/", 1)[-1]
        receipt_like = name.endswith(".json") and f"/{STAGING_FOLDER}/" in info.path
        old = info.mtime is not None and info.mtime.replace(tzinfo=UTC) < cutoff
        if not (receipt_like and old) or _normal(info.path) in referenced:
            continue
        try:
            files = sink.staged_data_files(table, sink.read_receipt(name.removesuffix(".json"), table))
        except StagedBatchGone:
            continue
        data_files.extend(f.file_path for f in files if _normal(f.file_path) not in referenced)
    return data_files


def _delete(sink: IcebergSink, filesystem: pafs.FileSystem, path: str) -> str:
    """Delete `path` (a listing's path or a table's location); the path as the file system names it."""
    located = _normal(path)
    with sink.failures(f"delete the file {path}"):
        # Gone already: deleted by an earlier upkeep, or with the expired snapshot that held it.
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(located)
    return located


def _referenced_files(sink: IcebergSink, table: Table, live: set[str]) -> set[str]:
    io = table.io
    referenced: set[str] = set()
    for snapshot in table.snapshots():
        referenced.add(snapshot.manifest_list)
        positions = snapshot.summary.get(SUMMARY_POSITIONS) if snapshot.summary is not None else None
        if positions is not None:
            referenced.add(positions)
        for manifest in snapshot.manifests(io):
            referenced.add(manifest.manifest_path)
            referenced.update(
                entry.data_file.file_path for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)
            )
    for key, value in table.properties.items():
        if key.startswith(POSITIONS_PROPERTY_PREFIX):
            referenced.add(value.partition(" ")[2])
    for receipt_id in live:
        referenced.add(sink.receipt_path(table, receipt_id))
        try:
            receipt = sink.read_receipt(receipt_id, table)
        except StagedBatchGone:
            continue
        if receipt.manifest_path is not None:
            referenced.add(receipt.manifest_path)
            referenced.update(data_file.file_path for data_file in sink.staged_data_files(table, receipt))
    return {_normal(path) for path in referenced}


def _filesystem(table: Table) -> tuple[pafs.FileSystem, str]:
    io = table.io
    if not isinstance(io, PyArrowFileIO):
        raise SinkError(
            str(table.name()), f"orphan files can be listed through pyarrow's FileIO only, not {type(io).__name__}"
        )
    scheme, netloc, path = io.parse_location(table.metadata.location)
    return io.fs_by_scheme(scheme, netloc), path


def _normal(path: str) -> str:
    """A location without its scheme, as pyarrow's listing names it (`bucket/key`, `/abs/path`)."""
    scheme, _, rest = path.partition("://")
    return rest if rest and scheme.isalnum() else path


def _table(sink: IcebergSink) -> Table:
    table = sink.table(refresh=True)
    if table is None:
        raise SinkError(sink.uri, "the table does not exist")
    return table


def upkeep(sink: IcebergSink, leases: Sequence[Lease], orphan_age: timedelta, target_file_bytes: int) -> list[str]:
    """`leasectl maintain` on an Iceberg table: small files compacted, snapshots past the table's
    maximum age expired, orphan files removed; a line per thing done."""
    try:
        compaction = compact_small_files(sink, target_file_bytes)
        compacted = (
            f"compacted {compaction.files_rewritten} small file(s) ({compaction.bytes_rewritten} bytes) of "
            f"{compaction.partitions} partition(s) into {compaction.files_written}"
        )
    except SinkError as error:  # the rest of the upkeep does not depend on it
        compacted = f"compaction not done: {error}"
    expired = expire_snapshots(sink)
    removal = remove_orphan_files(sink, named_receipts(sink.RECORD, leases), orphan_age)
    return [
        compacted,
        f"expired {len(expired.snapshot_ids)} snapshot(s) past the table's maximum age, and removed the "
        f"{len(expired.files_removed)} file(s) only they referenced",
        f"removed {len(removal.removed)} orphan file(s); {removal.kept_too_young} unreferenced file(s) are "
        f"younger than {orphan_age} and stay",
        *(f"  removed {path}" for path in removal.removed),
    ]
