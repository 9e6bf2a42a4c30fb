"""What other tools do to a table the sink writes, on each format that has the operation: another
writer's snapshot expiry or log cleanup, orphan-file removal (one that leaves the sink's own folders
alone as docs/architecture.md asks, and one that does not), a rollback or RESTORE, a compaction or a
rewrite of the same rows, a new optional column, a user's own appends and deletes (of the user's rows,
and of the application's), a VACUUM with no retention. Each operation acts as the other tool would,
through the format's library (pyiceberg, delta-rs) or on the table's files, and says what it did, or
None when the table gives it nothing to act on (no snapshot to roll back to, no row to delete).

For the table-operations campaign (`bench/table_operations.py`) and the tests that reduce its findings
(`tests/integration/test_table_operations.py`). The tables are local: Iceberg through pyiceberg's SQL
catalog on SQLite, Delta in a folder."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake import Field as DeltaField
from deltalake.exceptions import DeltaError
from deltalake.schema import PrimitiveType
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.types import StringType

from devtools.analyst_reads import IDENTITY_COLUMNS, AnalystTable, Identity
from devtools.table_rounds import APPLICATION, TableSink
from sinks.batch_sink import StreamIncarnations
from sinks.table.committer import TableCommitter
from sinks.table.delta import DeltaSink
from sinks.table.iceberg import IcebergSink

USERS_STREAM = "users"  # the stream name of a user's own rows: never one of the application's
USERS_SHARD = "users-own"
USERS_BASE = 5 * 10**8


@dataclass(frozen=True)
class Done:
    """What an operation did, and the application's records it deleted from the table (their identities)."""

    detail: str
    deleted: tuple[Identity, ...] = ()


Operation = Callable[[random.Random], Done | None]


class TableAtHand(Protocol):
    """A table of one format, as the sink and the other tools reach it."""

    family: Literal["iceberg", "delta"]

    def open_sink(self, streams: StreamIncarnations) -> TableSink: ...

    def analyst(self) -> AnalystTable | None: ...

    def operations(self) -> dict[str, Operation]: ...


def library_identities(sink: TableCommitter) -> list[Identity]:
    """Every row's identity as the writing library reads the table, duplicates included."""
    rows = sink.visible_rows(IDENTITY_COLUMNS)
    if rows is None:
        return []
    columns = rows.to_pydict()
    return sorted(zip(*(columns[name] for name in IDENTITY_COLUMNS)), key=lambda row: (row[0], row[1], int(row[2])))


def users_rows(schema: pa.Schema, first: int, count: int) -> pa.Table:
    """A user's own rows in the table's columns (nulls in the columns a user does not fill)."""
    numbers = range(USERS_BASE + first, USERS_BASE + first + count)
    known = {
        "stream_name": pa.array([USERS_STREAM] * count),
        "shard_id": pa.array([USERS_SHARD] * count),
        "sequence_number": pa.array([str(n) for n in numbers]),
        "sub_sequence_number": pa.array([0] * count, pa.int64()),
        "partition_key": pa.array([f"user-{n}" for n in numbers]),
        "approximate_arrival_timestamp": pa.array([datetime(2026, 11, 27, 9, tzinfo=UTC)] * count),
        "data": pa.array([f"user row {n}".encode() for n in numbers], pa.binary()),
        "arrival_day": pa.array(["2026-11-27"] * count),
    }
    columns = [
        known[field.name].cast(field.type) if field.name in known else pa.nulls(count, field.type) for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def ours_to_delete(identities: Sequence[Identity], rng: random.Random) -> tuple[Identity, ...]:
    """A few of the application's rows of one shard, for a user's delete of them."""
    ours = [identity for identity in identities if identity[0] != USERS_STREAM]
    if not ours:
        return ()
    shard = rng.choice(ours)[1]
    of_shard = [identity for identity in ours if identity[1] == shard]
    return tuple(rng.sample(of_shard, min(len(of_shard), rng.randint(1, 3))))


# --- Iceberg --------------------------------------------------------------------------------------


class IcebergAtHand:
    """An Iceberg table of pyiceberg's SQL catalog on SQLite in `folder`."""

    family: Literal["iceberg", "delta"] = "iceberg"
    URI = "iceberg://lake/kinesis.orders"
    IDENTIFIER = ("kinesis", "orders")

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.catalog = SqlCatalog("lake", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}/warehouse")
        self.catalog.create_namespace_if_not_exists("kinesis")
        self.columns_added = 0
        self.users_rows = 0

    def open_sink(self, streams: StreamIncarnations) -> IcebergSink:
        return IcebergSink(self.URI, APPLICATION, self.catalog, None, streams)

    def table(self) -> Table | None:
        return self.open_sink({}).table(refresh=True)

    def analyst(self) -> AnalystTable | None:
        table = self.table()
        return None if table is None else AnalystTable.iceberg(table.metadata_location)

    def operations(self) -> dict[str, Operation]:
        return {
            "expire all but head": self.expire_all_but_head,
            "expire older than now": self.expire_older_than_now,
            "orphan removal (exclusions kept)": lambda rng: self.remove_orphans(keep_kinesis=True),
            "orphan removal (no exclusions)": lambda rng: self.remove_orphans(keep_kinesis=False),
            "rollback": lambda rng: self.rollback(rng, expire=False),
            "rollback then expiry": lambda rng: self.rollback(rng, expire=True),
            "rewrite of the same rows": self.rewrite_same_rows,
            "new optional column": self.add_column,
            "user appends own rows": self.user_append,
            "user deletes own rows": self.user_delete_own,
            "user deletes our rows": self.user_delete_ours,
        }

    def expire_all_but_head(self, rng: random.Random) -> Done | None:
        table = self.table()
        head = None if table is None else table.current_snapshot()
        if table is None or head is None:
            return None
        older = [snapshot.snapshot_id for snapshot in table.snapshots() if snapshot.snapshot_id != head.snapshot_id]
        if not older:
            return None
        table.maintenance.expire_snapshots().by_ids(older).commit()
        return Done(f"expired {len(older)} snapshot(s)")

    def expire_older_than_now(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None or len(table.snapshots()) < 2:
            return None
        table.maintenance.expire_snapshots().older_than(datetime.now(UTC)).commit()
        return Done("expired the snapshots older than now")

    def remove_orphans(self, *, keep_kinesis: bool) -> Done | None:
        """Every file under the table's location that no snapshot and no metadata file references,
        whatever its age (an engine's orphan removal with no grace period); the sink's own folders
        (`metadata/kinesis-*`) left alone when `keep_kinesis`."""
        table = self.table()
        if table is None:
            return None
        location = Path(table.metadata.location.removeprefix("file://"))
        referenced = _iceberg_referenced_files(table)
        removed = 0
        for path in location.rglob("*"):
            relative = path.relative_to(location).as_posix()
            if not path.is_file() or str(path) in referenced or relative.endswith(".metadata.json"):
                continue
            if keep_kinesis and relative.startswith("metadata/kinesis-"):
                continue
            path.unlink()
            removed += 1
        return Done(f"removed {removed} unreferenced file(s)")

    def rollback(self, rng: random.Random, *, expire: bool) -> Done | None:
        table = self.table()
        lineage = [] if table is None else list(ancestors_of(table.current_snapshot(), table.metadata))
        if table is None or len(lineage) < 2:
            return None
        target = rng.choice(lineage[1:])
        table.manage_snapshots().rollback_to_snapshot(target.snapshot_id).commit()
        if not expire:
            return Done(f"rolled back {lineage.index(target)} snapshot(s)")
        table = self.table()
        assert table is not None
        kept = {snapshot.snapshot_id for snapshot in ancestors_of(table.current_snapshot(), table.metadata)}
        rolled_back = [snapshot.snapshot_id for snapshot in table.snapshots() if snapshot.snapshot_id not in kept]
        if rolled_back:
            table.maintenance.expire_snapshots().by_ids(rolled_back).commit()
        return Done(f"rolled back {lineage.index(target)} snapshot(s), then expired {len(rolled_back)}")

    def rewrite_same_rows(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None or table.current_snapshot() is None:
            return None
        rows = table.scan().to_arrow()
        table.overwrite(rows)
        return Done(f"rewrote {rows.num_rows} row(s)")

    def add_column(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        self.columns_added += 1
        with table.update_schema() as update:
            update.add_column(f"note_{self.columns_added}", StringType())
        return Done(f"added column note_{self.columns_added}")

    def user_append(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        count = rng.randint(1, 4)
        table.append(users_rows(table.schema().as_arrow(), self.users_rows, count))
        self.users_rows += count
        return Done(f"appended {count} row(s) of the user's")

    def user_delete_own(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None or table.current_snapshot() is None:
            return None
        table.delete(f"stream_name = '{USERS_STREAM}'")
        return Done("deleted the user's rows")

    def user_delete_ours(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        chosen = ours_to_delete(library_identities(self.open_sink({})), rng)
        if not chosen:
            return None
        numbers = ", ".join(f"'{identity[2]}'" for identity in chosen)
        table.delete(f"shard_id = '{chosen[0][1]}' AND sequence_number IN ({numbers})")
        return Done(f"deleted {len(chosen)} of the application's rows", chosen)


def _iceberg_referenced_files(table: Table) -> set[str]:
    """The files of every snapshot (manifest lists, manifests, data and delete files), and the
    metadata files, as local paths."""
    io = table.io
    paths = {table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)}
    for snapshot in table.snapshots():
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            paths.add(manifest.manifest_path)
            paths.update(
                entry.data_file.file_path for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)
            )
    return {path.removeprefix("file://") for path in paths}


# --- Delta ----------------------------------------------------------------------------------------


class DeltaAtHand:
    """A Delta table in the folder `folder`/lake."""

    family: Literal["iceberg", "delta"] = "delta"

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.location = str(folder / "lake")
        self.columns_added = 0
        self.users_rows = 0

    @property
    def uri(self) -> str:
        return f"delta:{self.location}"

    def open_sink(self, streams: StreamIncarnations) -> DeltaSink:
        return DeltaSink(self.uri, APPLICATION, streams)

    def table(self) -> DeltaTable | None:
        return self.open_sink({}).table()

    def analyst(self) -> AnalystTable | None:
        return None if self.table() is None else AnalystTable.delta(self.location)

    def operations(self) -> dict[str, Operation]:
        return {
            "log cleanup after a checkpoint": self.log_cleanup,
            "orphan removal (exclusions kept)": lambda rng: self.vacuum(full=True),
            "orphan removal (no exclusions)": self.remove_orphans_and_kinesis_files,
            "restore by version": lambda rng: self.restore(rng, by_time=False),
            "restore by timestamp": lambda rng: self.restore(rng, by_time=True),
            "compaction": self.compact,
            "new optional column": self.add_column,
            "user appends own rows": self.user_append,
            "user deletes own rows": self.user_delete_own,
            "user deletes our rows": self.user_delete_ours,
            "vacuum (retention 0)": lambda rng: self.vacuum(full=False),
        }

    def log_cleanup(self, rng: random.Random) -> Done | None:
        """A checkpoint, then the log's entries before it removed (a log retention of nothing)."""
        table = self.table()
        if table is None:
            return None
        table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
        table = self.table()
        assert table is not None
        table.create_checkpoint()
        table.cleanup_metadata()
        return Done(f"checkpointed at version {table.version()} and removed the log before it")

    def vacuum(self, *, full: bool) -> Done | None:
        """VACUUM with no retention: the files commits removed (lite), or every file the log does not
        add (full, Spark's VACUUM and an orphan removal that leaves `_` folders such as `_kinesis/`)."""
        table = self.table()
        if table is None:
            return None
        removed = table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=full)
        return Done(f"vacuumed {len(removed)} file(s){' (full)' if full else ''}")

    def remove_orphans_and_kinesis_files(self, rng: random.Random) -> Done | None:
        """A full vacuum, and the files under `_kinesis/` removed too (no log names them)."""
        done = self.vacuum(full=True)
        if done is None:
            return None
        kinesis = [path for path in (Path(self.location) / "_kinesis").rglob("*") if path.is_file()]
        for path in kinesis:
            path.unlink()
        return Done(f"{done.detail}, and {len(kinesis)} file(s) under _kinesis/")

    def restore(self, rng: random.Random, *, by_time: bool) -> Done | None:
        table = self.table()
        if table is None or table.version() < 1:
            return None
        committed = {int(entry["version"]): int(entry["timestamp"]) for entry in table.history()}
        versions = sorted(version for version in committed if version < table.version())
        if not versions:
            return None
        version = rng.choice(versions)
        target: int | datetime = version
        if by_time:  # (the newest version committed by then: a later one of the same millisecond, if any)
            target = datetime.fromtimestamp(committed[version] / 1000, UTC)
        try:
            table.restore(target)
        except DeltaError as error:  # a version whose files a vacuum removed, or whose log entry is gone
            return Done(f"RESTORE to {target} refused: {str(error)[:80]}")
        return Done(f"restored version {version}{' by its timestamp' if by_time else ''}")

    def compact(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        metrics = table.optimize.compact()
        return Done(f"compacted {metrics.get('numFilesRemoved', 0)} file(s)")

    def add_column(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        self.columns_added += 1
        table.alter.add_columns([DeltaField(f"note_{self.columns_added}", PrimitiveType("string"), nullable=True)])
        return Done(f"added column note_{self.columns_added}")

    def user_append(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        count = rng.randint(1, 4)
        schema = pa.schema(table.schema().to_arrow())
        write_deltalake(self.location, users_rows(schema, self.users_rows, count), mode="append")
        self.users_rows += count
        return Done(f"appended {count} row(s) of the user's")

    def user_delete_own(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        table.delete(f"stream_name = '{USERS_STREAM}'")
        return Done("deleted the user's rows")

    def user_delete_ours(self, rng: random.Random) -> Done | None:
        table = self.table()
        if table is None:
            return None
        chosen = ours_to_delete(library_identities(self.open_sink({})), rng)
        if not chosen:
            return None
        numbers = ", ".join(f"'{identity[2]}'" for identity in chosen)
        table.delete(f"shard_id = '{chosen[0][1]}' AND sequence_number IN ({numbers})")
        return Done(f"deleted {len(chosen)} of the application's rows", chosen)


def table_at_hand(family: str, folder: Path) -> TableAtHand:
    return IcebergAtHand(folder) if family == "iceberg" else DeltaAtHand(folder)
