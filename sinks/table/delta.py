"""A Delta Lake table as a sink, through delta-rs (the `deltalake` package, no JVM): `delta:<path>`.

The protocol is the Iceberg sink's (`sinks.table.iceberg`), in Delta's terms:

- `stage` writes the batch's data files into the table's folder under names of the attempt's own
  (`part-<receipt>-<n>.parquet`, partitioned by the day of arrival) and a receipt
  (`_kinesis/staged/<application>/<receipt>.json`: the batch's range and its files). Readers do not see
  them: a Delta table holds only the files its log adds. Paths under `_` are not the table's data.
- The lease's record names its committed batches the table may not hold yet (`lease_records`).
- `publish_round`, on the driver, adds every waiting batch's files in one Delta commit that carries
  the application's transaction (`txn`: app id `kinesis-lease-batch:<application>`, a version that
  only grows) and, in its commit info, the round, the streams and the Kinesis ranges it adds.
- The application's position map (through which position the table holds each lease's records, of
  which stream incarnation) is the file `_kinesis/positions/<application>/<version>.json` of the
  transaction's version. Its publisher creates it exclusively before committing that version, so
  each version's map is written by the one publisher that may commit it; two publishers that read the
  same version conflict on the transaction (delta-rs refuses a concurrent commit of the same app id),
  and the loser plans again on the new head. Another writer's commit in between (another
  application's, a compaction's, a streaming job's) is no conflict: delta-rs rebases the append over
  it. A commit whose answer was lost is found by the application's transaction: delta-rs puts its
  log entry again, S3 answers that it exists, and the transaction is at the version this publisher
  claimed, which no other publisher commits. A publisher that died between its map and its commit
  leaves a version nobody commits: the next one takes the next free version (versions need only
  grow). The transaction survives Delta's log cleanup and checkpoints, so the map is found however
  old the application's last commit is.

A table this sink creates is partitioned by the day of arrival (`arrival_day`, UTC), its columns in the
Delta types of the first batch's (`delta_columns`: an Arrow encoding of the same values, such as
Polars' `large_string`, is one Delta type); a transform that adds a column adds it to the table by
name (nullable), and a column of a conflicting type is refused before anything is written, naming it.
A table whose protocol asks its writers for what this sink does not do (column mapping, CHECK
constraints, generated columns, ...) is refused before any lease moves.

The table is a local folder or an S3 prefix (`delta:s3://bucket/prefix`). On S3, delta-rs commits
each log entry with a conditional put (`If-None-Match: *`), so two writers of the same table version
cannot both win; the position maps are created the same way (`table_storage`). It takes the same
credentials, endpoint and region as the Parquet sink (`aws_endpoint_url_s3`, `aws_region`, an Airflow
connection's session, else boto3's default chain), and passes them to delta-rs as its storage options.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError, ClientError
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from lease_core.model.lease import Lease
from sinks.batch_sink import BatchRange, StagedBatch, StreamIncarnations, location_dataset
from sinks.errors import SinkError
from sinks.record_columns import with_stream_and_shard
from sinks.registry import SinkFormat, SinkOpening
from sinks.table.committer import (
    COMMIT_ATTEMPTS,
    SUMMARY_APPLICATION,
    SUMMARY_COMMIT_ID,
    SUMMARY_POSITIONS,
    CommitConflict,
    CommitPlan,
    OwnCommit,
    TableCommitter,
    TableHistory,
    range_text,
)
from sinks.table.delta_columns import NoDeltaType, delta_type, unhonoured_requirement, widens_to
from sinks.table.lease_records import TableLeaseRecord, position_text, receipt_document, receipt_json
from sinks.table.storage import LocalStorage, S3Access, S3Storage, TableStorage, is_transient

log = logging.getLogger(__name__)

SCHEME = "delta"
URI_FORM = "delta:<absolute or relative local path> or delta:s3://bucket/prefix"
RECORD_FORMAT = "delta/1"
RECEIPT_FORMAT = "kinesis-lease-batch/delta-receipt/1"
POSITIONS_FORMAT = "kinesis-lease-batch/delta-positions/1"
KINESIS_FOLDER = "_kinesis"
ARRIVAL_COLUMN = "approximate_arrival_timestamp"
DAY_COLUMN = "arrival_day"  # the partition column of a table this sink creates: the day of arrival (UTC)
# Log entries read back from the head when looking for a commit whose answer was lost.
FIND_COMMIT_DEPTH = 100
# The job's commits leave the log's expired entries to the upkeep (`leasectl maintain`): delta-rs would
# otherwise delete them after any commit once a checkpoint is past the log's retention, and the job would
# need to delete files in the table's log.
JOB_COMMIT_HOOKS = PostCommitHookProperties(cleanup_expired_logs=False)


class DeltaLeaseRecord(TableLeaseRecord):
    FORMAT = RECORD_FORMAT


@dataclass(frozen=True)
class DeltaLocation:
    """Where a `delta:` URI's table is: a local folder (`bucket` None, `path` absolute) or an S3 prefix."""

    path: str
    bucket: str | None = None


def parse_delta_uri(uri: str) -> DeltaLocation:
    """Pure: the table's place a `delta:` URI names; `SinkError` naming what is wrong."""
    scheme, _, rest = uri.partition(":")
    if scheme != SCHEME or not rest:
        raise SinkError(uri, f"is not of the form {URI_FORM}")
    parts = urlsplit(rest)
    if parts.scheme == "s3":
        prefix = parts.path.strip("/")
        if not parts.netloc or not prefix:
            raise SinkError(uri, "a Delta table on S3 needs a bucket and a prefix in it (delta:s3://bucket/prefix)")
        return DeltaLocation(prefix, parts.netloc)
    if parts.scheme == "file" and not parts.netloc and parts.path:
        return DeltaLocation(os.path.abspath(unquote(parts.path)))
    if "://" in rest or not rest.strip():
        raise SinkError(uri, f"is not of the form {URI_FORM}")
    return DeltaLocation(os.path.abspath(rest))


@dataclass(frozen=True)
class DeltaReceipt:
    """A staged batch: its range, its rows and the files that add it."""

    receipt_id: str
    batch: BatchRange
    rows: int
    files: tuple[Mapping[str, Any], ...]  # path (relative to the table), size, partition_values, stats

    def to_json(self) -> bytes:
        return receipt_json(RECEIPT_FORMAT, self.receipt_id, self.batch, self.rows, files=list(self.files))

    @classmethod
    def from_json(cls, payload: bytes) -> DeltaReceipt:
        document, batch = receipt_document(RECEIPT_FORMAT, payload)
        return cls(document["receipt"], batch, int(document["rows"]), tuple(document["files"]))

    def range_text(self) -> str:
        return range_text(self.batch)

    def add_actions(self) -> list[AddAction]:
        now = int(time.time() * 1000)
        return [
            AddAction(file["path"], int(file["size"]), dict(file["partition_values"]), now, True, file["stats"])
            for file in self.files
        ]


class DeltaSink(TableCommitter):
    """The Delta table at `uri`, for the application `application` (its position map is its own)."""

    RECORD = DeltaLeaseRecord
    POSITIONS_FORMAT = POSITIONS_FORMAT

    def __init__(
        self,
        uri: str,
        application: str,
        streams: StreamIncarnations | None = None,
        *,
        s3_endpoint_url: str | None = None,
        region: str | None = None,
        session: boto3.Session | None = None,
    ) -> None:
        """S3 (module doc) takes its credentials from `session`, else boto3's default chain, its
        endpoint from `s3_endpoint_url`, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, its region
        from `region`, else the session's."""
        place = parse_delta_uri(uri)
        self.storage: TableStorage
        if place.bucket is None:
            self.storage = LocalStorage(place.path)
            self.storage_options: dict[str, str] = {}
        else:
            access = S3Access.resolve(uri, s3_endpoint_url, region, session)
            self.storage = S3Storage(place.bucket, place.path, access.client())
            self.storage_options = access.delta_storage_options()
        self._uri = uri
        self.application = application
        self.streams: StreamIncarnations = streams or {}

    @property
    def location(self) -> str:
        """The table's folder: an absolute path, or s3://bucket/prefix."""
        return self.storage.location

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def app_id(self) -> str:
        return f"kinesis-lease-batch:{self.application}"

    # --- the table -----------------------------------------------------------------------------

    def table(self) -> DeltaTable | None:
        """The table as it is now; None when there is none at the folder yet."""
        with self.failures("load the table"):
            try:
                return DeltaTable(self.location, storage_options=self.storage_options)
            except TableNotFoundError:
                return None

    def check_writable(self, columns: pa.Schema | None) -> None:
        """The folder can hold the table, and an existing table can hold batches of `columns`."""
        with self.failures("check where the table goes"):
            try:
                self.storage.check_root(parent_is_ours=_in_backfill_folder(self.location))
            except OSError as error:  # a missing bucket or folder, a file: no retry helps
                raise SinkError(self._uri, str(error)) from None
            table = self.table()
            if table is None and any(not file.path.startswith(f"{KINESIS_FOLDER}/") for file in self.storage.listing()):
                # (a round that found nothing to land may have left its report under _kinesis/)
                raise SinkError(self._uri, "is a folder with files, but not a Delta table (it has no _delta_log)")
        if table is not None:
            self._check_protocol(table)
        if columns is not None:  # refusals
            batch = with_day(with_stream_and_shard(columns.empty_table(), "", "")).schema
            if table is None:
                self._delta_schema(batch)
            else:
                self._table_columns(table, batch)

    def lineage_dataset(self) -> tuple[str, str]:
        return location_dataset(self.location)

    def reports_root(self) -> str:
        return f"{self.location}/{KINESIS_FOLDER}/rounds"

    def visible_rows(self, columns: Sequence[str] | None = None) -> pa.Table | None:
        """The rows readers of the table see now (of `columns`, else every data column; partition
        values are in the files' paths, not their rows), read file by file with pyarrow (delta-rs' own
        reader may abort the interpreter at its exit: delta-io/delta-rs#2184); None: no table."""
        table = self.table()
        if table is None:
            return None
        # Other writers' files hold the same values in other Arrow encodings (delta-rs' DELETE rewrites a
        # file with `string_view` columns): each file is read in the table's types, so that they concatenate.
        types = {field.name: field.type for field in pa.schema(table.schema().to_arrow())}
        parts = []
        with self.failures("read the table's files"):
            for uri in table.file_uris():
                relative = self.relative_path(uri)
                chosen = None if columns is None else list(columns)
                part = pq.read_table(pa.BufferReader(self.storage.read(relative)), columns=chosen)
                parts.append(
                    part.cast(pa.schema([field.with_type(types.get(field.name, field.type)) for field in part.schema]))
                )
        return pa.concat_tables(parts, promote_options="default") if parts else None

    def relative_path(self, uri: str) -> str:
        """A table file's path in the table's folder, from the URI delta-rs names it by."""
        return unquote(uri.removeprefix("file://")).removeprefix(f"{self.location}/")

    def _table_for(self, schema: pa.Schema) -> DeltaTable:
        """The table, created with the Delta types of `schema`'s columns (partitioned by the day of arrival
        when it has the arrival column) when missing."""
        table = self.table()
        if table is None:
            partition_by = [DAY_COLUMN] if DAY_COLUMN in schema.names else None
            delta_schema = self._delta_schema(schema)
            with self.failures("create the table"):
                try:
                    create_table_with_add_actions(
                        self.location,
                        DeltaSchema.from_arrow(delta_schema),
                        [],
                        mode="error",
                        partition_by=partition_by,
                        storage_options=self.storage_options,
                        post_commithook_properties=JOB_COMMIT_HOOKS,
                    )
                    log.info("created the Delta table %s, partitioned by %s", self.location, partition_by)
                except DeltaError as error:
                    if self.table() is None:  # not another slot's table created meanwhile
                        raise SinkError(self._uri, f"the table cannot be created: {error}") from error
            table = self.table()
            assert table is not None
        return table

    def _table_columns(self, table: DeltaTable, schema: pa.Schema) -> tuple[pa.Schema, list[pa.Field]]:
        """The table's Arrow schema and the batch's columns it lacks (added by name, in their Delta types,
        when the batch is staged), after checking that it holds every other column of `schema`: of the
        same Delta type, or one that widens to the table's. A conflicting type, a name that differs from a
        table column's only in case (Delta's names are case-insensitive), and a NOT NULL table column the
        batch lacks are refused, naming the column."""
        table_schema = pa.schema(table.schema().to_arrow())
        by_lower_name = {name.lower(): name for name in table_schema.names}
        missing = []
        for field in schema:
            if field.name not in table_schema.names:
                if field.name.lower() in by_lower_name:
                    raise SinkError(
                        self._uri,
                        f"column {field.name!r} of the batch and {by_lower_name[field.name.lower()]!r} of the table "
                        "differ only in case, and Delta's column names are case-insensitive",
                    )
                missing.append(self._delta_field(field))
                continue
            wanted = table_schema.field(field.name).type
            if not widens_to(self._delta_field(field).type, wanted):
                raise SinkError(
                    self._uri,
                    f"column {field.name!r} is {field.type} in the batch but {wanted} in the table; the table "
                    "cannot hold it",
                )
        lacking = [field.name for field in table_schema if not field.nullable and field.name not in schema.names]
        if lacking:
            raise SinkError(
                self._uri, f"column {lacking[0]!r} of the table is NOT NULL, and the batches have no such column"
            )
        return table_schema, missing

    def _delta_schema(self, schema: pa.Schema) -> pa.Schema:
        """`schema` in the Delta types of its columns (`delta_columns`); a column none holds is refused."""
        return pa.schema([self._delta_field(field) for field in schema])

    def _delta_field(self, field: pa.Field) -> pa.Field:
        """The batch's column in its Delta type; refused, naming it, when there is none."""
        try:
            return field.with_type(delta_type(field.type))
        except NoDeltaType as error:
            raise SinkError(
                self._uri, f"column {field.name!r} is {field.type}: {error}; convert it in the transform"
            ) from None

    def _check_protocol(self, table: DeltaTable) -> None:
        """Refuse a table that asks its writers for what this sink does not do (`delta_columns`)."""
        problem = unhonoured_requirement(
            table.metadata().configuration, table.protocol().writer_features or (), table.schema().fields
        )
        if problem is not None:
            raise SinkError(self._uri, problem)

    def _with_columns(self, table: DeltaTable, missing: Sequence[pa.Field]) -> DeltaTable:
        """The table with the batch's new columns added (nullable, by name: a transform that adds a
        column evolves the table). Another slot adding the same ones meanwhile is fine."""
        with self.failures(f"add the columns {[field.name for field in missing]} to the table"):
            try:
                table.alter.add_columns(
                    [DeltaField.from_arrow(field.with_nullable(True)) for field in missing],
                    post_commithook_properties=JOB_COMMIT_HOOKS,
                )
            except DeltaError:
                table = self.table() or table
                still = [field for field in missing if field.name not in table.schema().to_arrow().names]
                if still:
                    raise
            log.info("%s: added the columns %s", self._uri, [field.name for field in missing])
        return self.table() or table

    # --- staging -------------------------------------------------------------------------------

    def batch_name(self, batch: BatchRange) -> str:
        return f"{batch.stream_name}/{batch.shard_id}/{position_text(batch.start)}_{position_text(batch.end)}"

    def staged_token(self, batch: BatchRange, attempt: str) -> str:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"{self._uri}|{self.batch_name(batch)}|{attempt}").hex

    def stage(self, batch: BatchRange, table: pa.Table, attempt: str) -> StagedBatch:
        """Write the batch's data files (one per day of arrival) and its receipt, under the attempt's names."""
        receipt_id = self.staged_token(batch, attempt)
        rows = with_day(with_stream_and_shard(table, batch.stream_name, batch.shard_id))
        delta_table = self._table_for(rows.schema)
        self._check_protocol(delta_table)
        table_schema, missing = self._table_columns(delta_table, rows.schema)
        if missing:
            delta_table = self._with_columns(delta_table, missing)
            table_schema, _ = self._table_columns(delta_table, rows.schema)
        partitions = list(delta_table.metadata().partition_columns)
        for name in partitions:  # a transform that dropped the arrival column: the rows have no day
            if name not in rows.column_names:
                rows = rows.append_column(pa.field(name, pa.string()), pa.nulls(rows.num_rows, pa.string()))
        rows = self._in_table_types(rows, table_schema)
        files = []
        with self.failures(f"stage the batch {self.batch_name(batch)}"):
            for index, (values, part) in enumerate(_partitioned(rows, partitions)):
                files.append(self._write_data_file(receipt_id, index, values, part.drop_columns(partitions)))
            receipt = DeltaReceipt(receipt_id, batch, rows.num_rows, tuple(files))
            path = self.receipt_path(receipt_id)
            already_present = self.storage.exists(path)
            self.storage.put(path, receipt.to_json())
        self._remember_staged(receipt_id, batch)
        return StagedBatch(receipt_id, rows.num_rows, sum(int(file["size"]) for file in files), already_present)

    def _in_table_types(self, rows: pa.Table, table_schema: pa.Schema) -> pa.Table:
        """The rows in the table's columns, order and types (null where the batch lacks a column; a
        timestamp's nanoseconds cut to the table's microseconds); a NOT NULL column's nulls refused."""
        columns = []
        for field in table_schema:
            if field.name not in rows.column_names:
                columns.append(pa.nulls(rows.num_rows, field.type))
                continue
            column = rows.column(field.name)
            if not field.nullable and column.null_count:
                raise SinkError(
                    self._uri, f"column {field.name!r} of the table is NOT NULL, and the batch has nulls in it"
                )
            columns.append(pc.cast(column, options=pc.CastOptions(field.type, allow_time_truncate=True)))
        return pa.Table.from_arrays(columns, schema=table_schema)

    def _write_data_file(
        self, receipt_id: str, index: int, values: Mapping[str, str | None], data: pa.Table
    ) -> dict[str, Any]:
        """One data file of the batch: its rows of one partition (`values`), without the partition columns."""
        folder = "/".join(f"{name}={_partition_folder(value)}" for name, value in values.items())
        relative = f"{folder}/part-{receipt_id}-{index}.parquet" if folder else f"part-{receipt_id}-{index}.parquet"
        buffer = pa.BufferOutputStream()
        pq.write_table(data, buffer, compression="zstd")
        payload = buffer.getvalue()
        self.storage.put(relative, payload.to_pybytes())
        stats = json.dumps({"numRecords": data.num_rows})
        return {"path": relative, "size": payload.size, "partition_values": dict(values), "stats": stats}

    def adopt(self, staged: str | None, batch: BatchRange, attempt: str) -> StagedBatch | None:
        """None: a redo reads its range again and stages it as its own, as the Iceberg sink does."""
        return None

    # --- the record of what the table holds ----------------------------------------------------

    def _head(self) -> DeltaTable | None:
        return self.table()

    def _staged_receipt(self, receipt_id: str) -> DeltaReceipt | None:
        """The staged batch, None when its receipt or any data file it names is gone: a full vacuum
        (Spark's VACUUM) past the table's retention deletes staged files the log never added, and a
        commit adding them would leave the table naming files that are gone."""
        if not self._has_receipt(receipt_id):
            return None
        receipt = self.read_receipt(receipt_id)
        with self.failures(f"look for the staged files of {receipt.range_text()}"):
            gone = [file["path"] for file in receipt.files if not self.storage.exists(file["path"])]
        if gone:
            log.error(
                "%s: the staged files %s of %s are gone; the batch is lost", self._uri, gone, receipt.range_text()
            )
            return None
        return receipt

    def _read_map(self, path: str) -> dict[str, Any]:
        return self._position_map(path.removeprefix(f"{self.location}/"))  # (absolute paths in early commits)

    def _committed_before(self, head: DeltaTable) -> bool:
        return self.transaction_version(head) > 0

    def transaction_version(self, table: DeltaTable) -> int:
        """The application's transaction version in `table` (0: none yet): the newest version any of its
        publishers claimed, including one a `RESTORE` rolled back since."""
        with self.failures("read the application's transaction"):
            return table.transaction_version(self.app_id) or 0

    def _history(self, head: DeltaTable, *, complete: bool) -> TableHistory:
        """The application's commits the table's state descends from, newest first: the log read back
        from the head, a `RESTORE` followed to the version it restored (the commits between are rolled
        back, whatever the transaction says). Where log cleanup removed the older entries, the map of the
        transaction as of the oldest entry left stands for what came before."""
        commits: list[OwnCommit] = []
        version, restored = head.version(), False
        oldest_left = version  # the oldest entry read
        while version >= 0:
            info = self._commit_info(version)
            if info is None:  # cleaned up: what came before is in the checkpoint the log starts from
                break
            if info.get("operation") == "RESTORE":
                version, restored = self._restored_version(info, version), True
                continue
            oldest_left = version
            path = info.get(SUMMARY_POSITIONS)
            if info.get(SUMMARY_APPLICATION) == self.application and path:
                commits.append(OwnCommit(version, str(path)))
                if not complete:  # one log entry read per version back to it, not the whole log
                    break
            version -= 1
        if commits or version < 0:
            return TableHistory(tuple(commits))
        # After a RESTORE the transaction still names the rolled-back commits: the table as of the oldest
        # entry read since the RESTORE (the restored version itself when its entry is gone) names the newest
        # commit of the application at or before it.
        before = head if not restored else self._table_at(version + 1 if oldest_left == version + 1 else version)
        claimed = self.transaction_version(before)
        return TableHistory((), self.positions_path(claimed) if claimed else None)

    def _commit_info(self, version: int) -> dict[str, Any] | None:
        """The commit info of the log entry `version`; None when the entry is gone (or has none)."""
        path = f"_delta_log/{version:020d}.json"
        with self.failures(f"read the log entry {path}"):
            try:
                entry = self.storage.read(path)
            except FileNotFoundError:
                return None
        for line in entry.splitlines():
            if b'"commitInfo"' in line:
                info: dict[str, Any] = json.loads(line)["commitInfo"]
                return info
        return {}

    def _restored_version(self, info: Mapping[str, Any], version: int) -> int:
        """The version a `RESTORE` at `version` restored: named (`version`), or the newest one committed
        at or before its time (`timestamp` as Spark names it, `datetime` as delta-rs does)."""
        parameters = info.get("operationParameters") or {}
        if parameters.get("version") not in (None, ""):
            return int(parameters["version"])
        moment = str(parameters.get("timestamp") or parameters.get("datetime") or "")
        if not moment:
            raise SinkError(self._uri, f"the RESTORE at version {version} names no version or time it restored")
        if moment.isdigit():
            millis = int(moment)
        else:
            millis = int(datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp() * 1000)
        for earlier in range(version - 1, -1, -1):
            earlier_info = self._commit_info(earlier)
            if earlier_info is None:
                break
            if int(earlier_info.get("timestamp", 0)) <= millis:
                return earlier
        raise SinkError(self._uri, f"the RESTORE at version {version} restored a version whose log entry is gone")

    def _table_at(self, version: int) -> DeltaTable:
        """The table as of `version`, a RESTORE's or the oldest the log keeps after one; `SinkError` when
        log cleanup took it (what the table holds of the application cannot be told: never guessed)."""
        with self.failures(f"load the table as of version {version}, which a RESTORE restored"):
            try:
                return DeltaTable(self.location, version=version, storage_options=self.storage_options)
            except TableNotFoundError as error:
                raise SinkError(
                    self._uri, f"a RESTORE restored version {version}, which log cleanup removed since: {error}"
                ) from error

    def read_receipt(self, receipt_id: str) -> DeltaReceipt:
        path = self.receipt_path(receipt_id)
        with self.failures(f"read the receipt {path}"):
            return DeltaReceipt.from_json(self.storage.read(path))

    # --- the round's commit, by the driver -----------------------------------------------------

    def _commit(self, head: DeltaTable, plan: CommitPlan, document: bytes, summary: dict[str, str]) -> int | None:
        """Claim the next free transaction version by creating its position map exclusively (module
        doc), then commit the batches with the transaction at that version."""
        self._check_protocol(head)
        version = self.transaction_version(head) + 1
        with self.failures("write the position map"):
            while not self.storage.create(self.positions_path(version), document):
                version += 1  # another publisher's (alive or dead) version: the next one
        try:
            self._append(head, plan, {**summary, SUMMARY_POSITIONS: self.positions_path(version)}, version)
        except CommitFailedError as error:
            if not self._transaction_at(version):
                raise CommitConflict(str(error)) from error
            log.info("%s: the round's commit landed, though its answer was lost (%s)", self._uri, error)
        return self._find_commit(summary[SUMMARY_COMMIT_ID], after=head.version())

    def _append(self, head: DeltaTable, plan: CommitPlan, info: dict[str, str], version: int) -> None:
        """The one call that writes the round's log entry: the batches' files added, with the
        application's transaction at `version`. delta-rs rebases the append over other writers' commits
        that landed meanwhile (another application's, a compaction's) and refuses it, `CommitFailedError`,
        when one of them carries this application's transaction: another publisher of ours committed."""
        actions: list[AddAction | RemoveAction] = [
            action for receipt in plan.receipts for action in receipt.add_actions()
        ]
        properties = CommitProperties(
            custom_metadata=info,
            app_transactions=[Transaction(self.app_id, version)],
            max_commit_retries=COMMIT_ATTEMPTS,
        )
        with self.failures("commit the round"):
            head.create_write_transaction(
                actions,
                mode="append",
                schema=head.schema(),
                partition_by=list(head.metadata().partition_columns) or None,
                commit_properties=properties,
                post_commithook_properties=JOB_COMMIT_HOOKS,
            )

    def _transaction_at(self, version: int) -> bool:
        """Whether the application's transaction in the table is at `version`: only the publisher that
        created its position map commits it, so after this publisher's failed commit of it, the commit
        landed and its answer was lost."""
        table = self.table()
        with self.failures("read the application's transaction"):
            return table is not None and (table.transaction_version(self.app_id) or 0) == version

    def _find_commit(self, commit_id: str, after: int = -1) -> int | None:
        """The table version of the commit `commit_id` (made on the table at version `after`, when known:
        delta-rs may have rebased it over others' commits), from the log entries read as files: delta-rs'
        `history` holds Python's GIL while it reads, which stops the driver's other threads (the
        leader lock's heartbeat) as long as the storage makes it wait. None: not found."""
        table = self.table()
        newest = table.version() if table is not None else after
        for version in range(newest, max(after, newest - FIND_COMMIT_DEPTH, -1), -1):
            info = self._commit_info(version)
            if info is not None and info.get(SUMMARY_COMMIT_ID) == commit_id:
                return version
        return None

    # --- places and failures -------------------------------------------------------------------

    def receipt_path(self, receipt_id: str) -> str:
        """The receipt's path in the table's folder."""
        return f"{KINESIS_FOLDER}/staged/{self.application}/{receipt_id}.json"

    def positions_path(self, version: int) -> str:
        """The position map's path in the table's folder."""
        return f"{KINESIS_FOLDER}/positions/{self.application}/{version:020d}.json"

    def _has_receipt(self, receipt_id: str) -> bool:
        with self.failures("look for a receipt"):
            return self.storage.exists(self.receipt_path(receipt_id))

    def _position_map(self, path: str) -> dict[str, Any]:
        with self.failures(f"read the position map {path}"):
            document: dict[str, Any] = json.loads(self.storage.read(path))
        return document

    @contextmanager
    def failures(self, action: str) -> Iterator[None]:
        """delta-rs' and the file system's errors as a `SinkError` naming the action (a commit that lost a
        race stays a `CommitFailedError`, for the publisher to plan again)."""
        try:
            yield
        except (SinkError, CommitFailedError, TableNotFoundError):
            raise
        except (ClientError, BotoCoreError) as error:
            retryable = is_transient(error)
            raise SinkError(
                self._uri, f"cannot {action}: {type(error).__name__}: {error}", retryable=retryable
            ) from error
        except (DeltaError, OSError) as error:
            raise SinkError(self._uri, f"cannot {action}: {type(error).__name__}: {error}", retryable=True) from error


def with_day(rows: pa.Table) -> pa.Table:
    """The rows with their day of arrival (UTC) as a text column, when they have the arrival column."""
    if ARRIVAL_COLUMN not in rows.column_names or DAY_COLUMN in rows.column_names:
        return rows
    arrivals = rows.column(ARRIVAL_COLUMN)
    if pa.types.is_timestamp(arrivals.type):  # the date in the column's zone (UTC), as strftime's, at 1/16 of its CPU
        days = arrivals.cast(pa.date32()).cast(pa.string())
    else:
        days = pc.strftime(arrivals, format="%Y-%m-%d")
    return rows.append_column(pa.field(DAY_COLUMN, pa.string()), days)


def _partitioned(rows: pa.Table, partitions: Sequence[str]) -> Iterator[tuple[dict[str, str | None], pa.Table]]:
    """The rows by the values of the table's partition columns (one group when it has none)."""
    if not partitions:
        yield {}, rows
        return
    keys = rows.select(list(partitions)).group_by(list(partitions)).aggregate([]).to_pylist()
    for key in keys:
        values = {name: None if key[name] is None else str(key[name]) for name in partitions}
        if len(keys) == 1:  # the usual batch, of one day: every row is the group's (a filter would copy them all)
            yield values, rows
            return
        mask = None
        for name in partitions:
            value = key[name]
            match = pc.is_null(rows.column(name)) if value is None else pc.equal(rows.column(name), value)
            mask = match if mask is None else pc.and_(mask, match)
        yield values, rows.filter(mask)


def _partition_folder(value: str | None) -> str:
    """A partition value as its folder's name (Hive's, which Delta writers use, for a null)."""
    return "__HIVE_DEFAULT_PARTITION__" if value is None else value


def _open(uri: str, opening: SinkOpening) -> DeltaSink:
    config = opening.config
    return DeltaSink(
        uri,
        config.require_application_name(),
        streams=opening.streams,
        s3_endpoint_url=config.aws_endpoint_url_s3,
        region=config.aws_region,
        session=opening.session,
    )


# A backfill window's table goes in a folder beside the live table's, of the project's naming (so the
# project creates it: the live table's folder only says where the user's own folders are).
BACKFILL_FOLDER_SUFFIX = "-backfill"


def _backfill_uri(uri: str, window: str) -> str:
    return f"{uri.rstrip('/')}{BACKFILL_FOLDER_SUFFIX}/{window}"


def _in_backfill_folder(location: str) -> bool:
    return os.path.basename(os.path.dirname(location.rstrip("/"))).endswith(BACKFILL_FOLDER_SUFFIX)


def _upkeep(sink: object, leases: Sequence[Lease], orphan_age: timedelta, target_file_bytes: int) -> list[str]:
    from sinks.table.delta_maintenance import upkeep

    assert isinstance(sink, DeltaSink), sink
    return upkeep(sink, leases, orphan_age, target_file_bytes)


SINK_FORMAT = SinkFormat(
    name="delta",
    uri_forms="delta:PATH or delta:s3://bucket/prefix (a Delta table)",
    check_uri=parse_delta_uri,
    open=_open,
    backfill_uri=_backfill_uri,
    upkeep=_upkeep,
)
