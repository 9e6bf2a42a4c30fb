"""An Apache Iceberg table as the sink, through pyiceberg (docs/architecture.md, "The Iceberg sink").

URI: `iceberg://CATALOG/NAMESPACE.TABLE` (a nested namespace: `iceberg://CATALOG/a.b.TABLE`). The
catalog is configured the way pyiceberg configures catalogs: `.pyiceberg.yaml` or
`PYICEBERG_CATALOG__<NAME>__*` variables.

How a batch lands, exactly once, with one table commit per round:
- A slot stages a batch: it writes the batch's data files into the table's data location (names
  derived from the batch and the attempt, so a retried write rewrites its own files only), then a
  manifest listing them, then a small receipt naming the batch's lease, stream, shard and range.
  The receipt is written last: a receipt that exists describes complete files. Nothing is committed
  to the table; readers see none of it.
- The lease's commit records the receipt (`commit_record`): the record is the lease's list of
  committed batches that the table may not hold yet, each as (receipt id, last position).
- At the round's end the driver reads the lease records and makes one table commit (a fast append)
  of every batch the table does not hold yet, with a snapshot summary that names the application,
  the round, the streams and, per lease, the range it adds. The commit also writes the application's
  position map: per lease, the position through which the table holds its records. A batch is
  visible exactly when its last position is at or before its lease's position in the map of the
  newest snapshot of this application in `main`'s history, so whoever publishes again (a retried
  driver, an overlapping job, a driver that died after its commit) finds it visible and skips it.
- The check and the append must meet the same table state: pyiceberg's own retry would rebase the
  append onto a newer head past the check, so it is switched off for this commit and a conflict
  runs the whole check again on the new head. A commit whose answer was lost is looked for by the
  id in its summary; not found, it is tried again, and the requirement that `main` has not moved
  keeps a late landing of the lost one from being doubled.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of
from pyiceberg.transforms import DayTransform
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
)
from pyiceberg.utils.config import Config

from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON
from sinks.batch_sink import BatchRange, StagedBatch, StreamIncarnations, location_dataset
from sinks.errors import SinkError
from sinks.record_columns import POSITION_SCHEMA, with_stream_and_shard
from sinks.registry import SinkFormat, SinkOpening
from sinks.table.committer import (
    COMMIT_ATTEMPTS,
    SUMMARY_APPLICATION,
    SUMMARY_COMMIT_ID,
    SUMMARY_POSITIONS,
    CommitConflict,
    CommitOutcomeUnknown,
    CommitPlan,
    OwnCommit,
    TableCommitter,
    TableHistory,
    range_text,
)
from sinks.table.iceberg_data_files import DataFileWriter, with_types
from sinks.table.lease_records import TableLeaseRecord, position_text, receipt_document, receipt_json

log = logging.getLogger(__name__)

URI_FORM = "iceberg://CATALOG/NAMESPACE.TABLE"
ARRIVAL_COLUMN = "approximate_arrival_timestamp"
# pyiceberg's catalogs that cannot commit a table change (0.12: DynamoDB raises NotImplementedError).
CATALOGS_THAT_CANNOT_COMMIT = frozenset({"dynamodb"})
RECEIPT_FORMAT = "kinesis-lease-batch/iceberg-receipt/1"
POSITIONS_FORMAT = "kinesis-lease-batch/iceberg-positions/1"
RECORD_FORMAT = "iceberg/1"
STAGING_FOLDER = "kinesis-staged"  # under the table's metadata location: receipts and their manifests
POSITIONS_FOLDER = "kinesis-positions"
REPORTS_FOLDER = "kinesis-rounds"
# Table property: `<commit id> <sequence number> <position map>` of the application's newest commit
# (`PositionsProperty`; tables written before the sequence number was recorded have two fields).
POSITIONS_PROPERTY_PREFIX = "kinesis.positions."

PLACEHOLDER = BatchRange("", "", "", TRIM_HORIZON, None, TRIM_HORIZON)  # a batch whose columns alone matter

_IDENTIFIER_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


class StagedBatchGone(Exception):
    """A committed batch's receipt or manifest is not there any more (deleted before it was published)."""


@dataclass(frozen=True)
class TableAddress:
    catalog: str
    namespace: tuple[str, ...]
    table: str

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace, self.table)

    def __str__(self) -> str:
        return f"iceberg://{self.catalog}/{'.'.join(self.identifier)}"


def parse_table_uri(uri: str) -> TableAddress:
    """Pure: the catalog, namespace and table an `iceberg://` URI names; `SinkError` naming what is wrong."""
    prefix = "iceberg://"
    if not uri.startswith(prefix):
        raise SinkError(uri, f"is not of the form {URI_FORM}")
    catalog, slash, dotted = uri[len(prefix) :].partition("/")
    parts = dotted.split(".")
    if not catalog or not slash or len(parts) < 2:
        raise SinkError(uri, f"is not of the form {URI_FORM} (a catalog name, then a namespace and a table)")
    for part in (catalog, *parts):
        if not _IDENTIFIER_PART.fullmatch(part):
            raise SinkError(uri, f"{part!r} is not a catalog, namespace or table name (letters, digits, _ and -)")
    return TableAddress(catalog, tuple(parts[:-1]), parts[-1])


class LeaseRecord(TableLeaseRecord):
    """What a lease's commit records for this sink: its committed batches the table may not hold yet."""

    FORMAT = RECORD_FORMAT


@dataclass(frozen=True)
class Receipt:
    """A staged batch: its range and the manifest listing its data files."""

    receipt_id: str
    batch: BatchRange
    rows: int
    data_bytes: int
    manifest_path: str | None  # None: the batch has no rows (a transform dropped them all)
    manifest_length: int
    spec_id: int

    def to_json(self) -> bytes:
        return receipt_json(
            RECEIPT_FORMAT,
            self.receipt_id,
            self.batch,
            self.rows,
            bytes=self.data_bytes,
            manifest=self.manifest_path,
            manifest_length=self.manifest_length,
            spec_id=self.spec_id,
        )

    @classmethod
    def from_json(cls, payload: bytes) -> Receipt:
        document, batch = receipt_document(RECEIPT_FORMAT, payload)
        return cls(
            receipt_id=document["receipt"],
            batch=batch,
            rows=int(document["rows"]),
            data_bytes=int(document["bytes"]),
            manifest_path=document["manifest"],
            manifest_length=int(document["manifest_length"]),
            spec_id=int(document["spec_id"]),
        )

    def range_text(self) -> str:
        return range_text(self.batch)


@dataclass(frozen=True)
class PositionsProperty:
    """The table property naming the application's newest commit: its id, its snapshot's sequence
    number (None in tables written before it was recorded) and its position map."""

    commit_id: str
    sequence_number: int | None
    path: str

    @classmethod
    def parse(cls, value: str | None) -> PositionsProperty | None:
        fields = (value or "").split(" ")
        if len(fields) == 3 and fields[1].isdigit():
            return cls(fields[0], int(fields[1]), fields[2])
        if len(fields) == 2 and fields[1]:
            return cls(fields[0], None, fields[1])
        return None

    def render(self) -> str:
        return f"{self.commit_id} {self.sequence_number} {self.path}"


class IcebergSink(TableCommitter):
    """The table at `uri`, for the application `application` (its position map is the application's own)."""

    RECORD = LeaseRecord
    POSITIONS_FORMAT = POSITIONS_FORMAT

    def __init__(
        self,
        uri: str,
        application: str,
        catalog: Catalog | None = None,
        catalog_configuration: Mapping[str, str] | None = None,
        streams: StreamIncarnations | None = None,
    ) -> None:
        """`catalog_configuration`: the catalog's properties as the driver resolved them (see
        `sinks.sink_configuration`), else this process's pyiceberg configuration.
        `streams`: the streams as they are now, so that a position the table holds for a stream of the
        same name that was deleted since is not taken for the lease's (None: not known)."""
        self.address = parse_table_uri(uri)
        self._uri = uri
        self.application = application
        self._catalog = catalog
        self._catalog_configuration = catalog_configuration
        self.streams: StreamIncarnations = streams or {}
        self._table: Table | None = None
        self._staging_table = threading.Lock()  # a slot's leases stage at once: one of them loads the table
        # How batches are written into the table as staged last (`_writer_for`), and the batches'
        # schemas found to fit it (by `check_columns`).
        self._writer: DataFileWriter | None = None
        self._fitting: set[pa.Schema] = set()

    @property
    def uri(self) -> str:
        return self._uri

    # --- the catalog and the table ------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_configured_catalog(self._uri, self.address.catalog, self._catalog_configuration)
        return self._catalog

    def check_writable(self, columns: pa.Schema | None) -> None:
        """The catalog loads and can commit, the namespace exists, and a table there can hold batches
        of `columns` (with the batch columns added as `stage` adds them)."""
        with self.failures("reach the catalog"):
            if not self.catalog.namespace_exists(self.address.namespace):
                raise SinkError(
                    self._uri,
                    f"namespace {'.'.join(self.address.namespace)!r} does not exist in catalog "
                    f"{self.address.catalog!r}; create it first (pyiceberg: catalog.create_namespace)",
                )
            table = self._load(required=False)
        if table is not None and columns is not None:
            check_columns(self._uri, table.schema(), with_batch_columns(columns.empty_table(), PLACEHOLDER).schema)
        if table is not None and table.metadata.format_version < 2:
            log.info("%s is an Iceberg v1 table; appends work, row-level deletes by users do not", self._uri)

    def lineage_dataset(self) -> tuple[str, str]:
        """The table's location (OpenLineage names an Iceberg table by it when its catalog has no
        naming of its own in the spec); the URI's catalog and table while the table does not exist."""
        table = self.table()
        if table is None:
            return f"iceberg://{self.address.catalog}", ".".join(self.address.identifier)
        return location_dataset(table.metadata.location)

    def reports_root(self) -> str:
        """`<table location>/metadata/kinesis-rounds`, the table created now if it does not exist yet: a
        round's report needs a place before its first batch. It is created with the columns every
        pipeline's batches have, the batch's and the records' positions; the first batch adds its own
        (a pipeline with a decoder has no `data`, which would otherwise stay null in every row)."""
        table = self.table() or self._create(with_batch_columns(POSITION_SCHEMA.empty_table(), PLACEHOLDER).schema)
        return f"{table.metadata.location}/metadata/{REPORTS_FOLDER}"

    def table(self, *, refresh: bool = False) -> Table | None:
        """The table, loaded once and again when asked to (`refresh`); None when it does not exist yet."""
        if self._table is None or refresh:
            self._table = self._load(required=False)
        return self._table

    def _load(self, *, required: bool) -> Table | None:
        with self.failures("load the table"):
            try:
                return self.catalog.load_table(self.address.identifier)
            except NoSuchTableError:
                if required:
                    raise SinkError(self._uri, "the table does not exist") from None
                return None

    def _table_for(self, arrow_schema: pa.Schema) -> tuple[Table, DataFileWriter]:
        """The table, created with `arrow_schema` when missing (partitioned by day of arrival when it has
        the arrival column), and evolved by name when the batch brings new columns, with the writer of
        its data files. A column whose type the table cannot hold is refused before anything is written.

        One batch at a time: a slot's leases stage their first batches at once, and each would load
        (or create) the table itself while none is loaded yet."""
        with self._staging_table:
            table = self.table()
            if table is None:
                table = self._create(arrow_schema)
            writer = self._writer_for(table)
            if arrow_schema not in self._fitting:
                missing = check_columns(self._uri, table.schema(), arrow_schema)
                if missing:
                    table = self._add_columns(arrow_schema, missing)
                    writer = self._writer_for(table)
                else:
                    self._fitting.add(arrow_schema)
            return table, writer

    def _writer_for(self, table: Table) -> DataFileWriter:
        """The writer of data files into `table` as loaded (one version of its metadata): the same as
        for the batch before while the table's metadata file is the same. (Called under `_staging_table`.)"""
        writer = self._writer
        if writer is None or writer.metadata_location != table.metadata_location:
            writer = self._writer = DataFileWriter(table.metadata, table.metadata_location)
            self._fitting = set()  # checked against the table's schema, which may have changed
        return writer

    def _create(self, arrow_schema: pa.Schema) -> Table:
        # Every column optional: a column a transform leaves out later must be able to hold nulls,
        # and a required one can never become optional again.
        fields = _pyarrow_to_schema_without_ids(arrow_schema).fields
        optional = (NestedField(field.field_id, field.name, field.field_type, required=False) for field in fields)
        schema = assign_fresh_schema_ids(Schema(*optional))
        spec = PartitionSpec()
        if ARRIVAL_COLUMN in arrow_schema.names:
            source_id = schema.find_field(ARRIVAL_COLUMN).field_id
            spec = PartitionSpec(
                PartitionField(source_id=source_id, field_id=1000, transform=DayTransform(), name="arrival_day")
            )
        with self.failures("create the table"):
            try:
                self._table = self.catalog.create_table(self.address.identifier, schema=schema, partition_spec=spec)
                log.info("created %s, partitioned by %s", self._uri, spec)
            except TableAlreadyExistsError:  # another slot created it meanwhile
                self._table = self._load(required=True)
            except NoSuchNamespaceError:
                raise SinkError(
                    self._uri, f"namespace {'.'.join(self.address.namespace)!r} does not exist; create it first"
                ) from None
        assert self._table is not None
        return self._table

    def _add_columns(self, arrow_schema: pa.Schema, missing: Sequence[str]) -> Table:
        """Add the batch's new columns (union by name) in a schema-only commit: a column needs its field
        id before a data file holding it can be written. Slots adding the same column race harmlessly:
        the loser's union finds it there. Every column is added optional, as `_create` makes them:
        Iceberg adds no required column to a table that has rows (and a table the round's report
        created has the position columns only: the records' `data` is not nullable in Arrow)."""
        arrow_schema = pa.schema([field.with_nullable(True) for field in arrow_schema], metadata=arrow_schema.metadata)
        for _ in range(COMMIT_ATTEMPTS):
            table = self.table(refresh=True)
            assert table is not None
            if not check_columns(self._uri, table.schema(), arrow_schema):
                return table
            try:
                with self.failures(f"add the column(s) {list(missing)}"):
                    with table.update_schema() as update:
                        update.union_by_name(arrow_schema)
                log.info("%s: added the column(s) %s", self._uri, list(missing))
            except CommitFailedException:  # another slot (or writer) changed the schema first: look again
                continue
        table = self.table(refresh=True)
        assert table is not None
        return table

    # --- staging, by the slots ----------------------------------------------------------------

    def batch_name(self, batch: BatchRange) -> str:
        return f"{batch.stream_name}/{batch.shard_id}/{position_text(batch.start)}_{position_text(batch.end)}"

    def staged_token(self, batch: BatchRange, attempt: str) -> str:
        """The receipt id `stage` gives this attempt's batch: a pure function of both."""
        return uuid.uuid5(uuid.NAMESPACE_URL, f"{self._uri}|{self.batch_name(batch)}|{attempt}").hex

    def stage(self, batch: BatchRange, table: pa.Table, attempt: str) -> StagedBatch:
        """Stage the batch's rows with its `stream_name` and `shard_id` as columns of the table."""
        receipt_id = self.staged_token(batch, attempt)
        table = with_batch_columns(table, batch)
        iceberg_table, writer = self._table_for(table.schema)
        metadata = iceberg_table.metadata
        io = iceberg_table.io
        manifest_path, manifest_length, written = None, 0, 0
        with self.failures(f"stage the batch {self.batch_name(batch)}"):
            if table.num_rows:
                data_files = writer.write(writer.with_types(table), io, uuid.UUID(receipt_id))
                written = sum(data_file.file_size_in_bytes for data_file in data_files)
                manifest_path = f"{self.staging_location(iceberg_table)}/{receipt_id}-m0.avro"
                manifest_length = _write_manifest(iceberg_table, manifest_path, data_files, receipt_id)
            receipt = Receipt(
                receipt_id,
                batch,
                table.num_rows,
                written,
                manifest_path,
                manifest_length,
                metadata.default_spec_id,
            )
            receipt_path = self.receipt_path(iceberg_table, receipt_id)
            already_present = io.new_input(receipt_path).exists()
            with io.new_output(receipt_path).create(overwrite=True) as stream:
                stream.write(receipt.to_json())
        self._remember_staged(receipt_id, batch)
        return StagedBatch(receipt_id, table.num_rows, written, already_present)

    def adopt(self, staged: str | None, batch: BatchRange, attempt: str) -> StagedBatch | None:
        """None: a redo reads its range again and stages it as its own (a redo is rare; the other
        attempt's files may still be being rewritten by it)."""
        return None

    # --- records, commits and visibility ------------------------------------------------------

    def _head(self) -> Table | None:
        return self.table(refresh=True)

    def visible_rows(self, columns: Sequence[str] | None = None) -> pa.Table | None:
        table = self.table(refresh=True)
        if table is None:
            return None
        with self.failures("read the table"):
            return table.scan(selected_fields=tuple(columns) if columns is not None else ("*",)).to_arrow()

    def _staged_receipt(self, receipt_id: str) -> _StagedFiles | None:
        """The staged batch, None when its receipt, its manifest or any data file it lists is gone: an
        orphan removal (Spark's `remove_orphan_files`) with a grace period shorter than the batch waited
        deletes the staged data files no snapshot references, even when it leaves `metadata/kinesis-*`
        alone, and a commit adding them would leave every reader of the table failing on files that are
        gone."""
        table = self.table()
        if table is None:
            return None
        try:
            receipt = self.read_receipt(receipt_id, table)
            staged = self.staged_data_files(table, receipt)
        except StagedBatchGone:
            return None
        with self.failures(f"look for the staged files of {receipt.range_text()}"):
            gone = [data.file_path for data in staged if not table.io.new_input(data.file_path).exists()]
        if gone:
            log.error(
                "%s: the staged files %s of %s are gone; the batch is lost", self._uri, gone, receipt.range_text()
            )
            return None
        return _StagedFiles(receipt, self._in_current_spec(table, receipt, staged))

    def _read_map(self, path: str) -> dict[str, Any]:
        table = self.table()
        if table is None:
            raise SinkError(self._uri, f"the table is gone: cannot read the position map {path}")
        with self.failures(f"read the position map {path}"):
            with table.io.new_input(path).open() as stream:
                document: dict[str, Any] = json.loads(stream.read())
        return document

    def _history(self, head: Table, *, complete: bool) -> TableHistory:
        """The application's snapshots in `main`'s history, newest first. When expiry left none of
        them there, the map the table property names, if its snapshot was in `main`'s history when it
        was expired (`_expired_positions`). (`main`'s history is in the table's metadata already: it is
        read whole either way.)"""
        lineage = list(ancestors_of(head.current_snapshot(), head.metadata))
        commits = tuple(
            OwnCommit(snapshot.snapshot_id, path)
            for snapshot in lineage
            if snapshot.summary is not None
            and snapshot.summary.get(SUMMARY_APPLICATION) == self.application
            and (path := snapshot.summary.get(SUMMARY_POSITIONS)) is not None
        )
        return TableHistory(commits) if commits else TableHistory((), self._expired_positions(head, lineage))

    def _committed_before(self, head: Table) -> bool:
        return self.positions_property in head.properties  # (properties are not rolled back, nor expired)

    @property
    def positions_property(self) -> str:
        return f"{POSITIONS_PROPERTY_PREFIX}{self.application}"

    def _expired_positions(self, table: Table, lineage: Sequence[Snapshot]) -> str | None:
        """The position map the table property names, when its snapshot is gone from `main`'s history
        because it was expired there (another tool expired snapshots above it). Not when a rollback took
        it out: its snapshot is then still in the table off `main`'s history, or, once expired too,
        `main`'s history holds a snapshot older than it (a lower sequence number), which it could not if
        the application's snapshot had been in that history."""
        named = PositionsProperty.parse(table.properties.get(self.positions_property))
        if named is None:
            return None
        if any(
            snapshot.summary is not None and snapshot.summary.get(SUMMARY_COMMIT_ID) == named.commit_id
            for snapshot in table.metadata.snapshots
        ):
            log.info("%s: the application's newest commit %s was rolled back", self._uri, named.commit_id)
            return None
        if named.sequence_number is not None and any(
            snapshot.sequence_number is not None and snapshot.sequence_number < named.sequence_number
            for snapshot in lineage
        ):
            log.info("%s: the application's newest commit %s was rolled back, then expired", self._uri, named.commit_id)
            return None
        log.info(
            "%s: the application's newest snapshot (commit %s) was expired from main's history; positions from %s",
            self._uri,
            named.commit_id,
            named.path,
        )
        return named.path

    def _commit(self, head: Table, plan: CommitPlan, document: bytes, summary: dict[str, str]) -> int | None:
        commit_id = summary[SUMMARY_COMMIT_ID]
        positions_path = f"{self.positions_location(head)}/{commit_id}.json"
        with self.failures("write the position map"):
            with head.io.new_output(positions_path).create(overwrite=True) as stream:
                stream.write(document)
        data_files = [data_file for staged in plan.receipts for data_file in staged.data_files]
        named = PositionsProperty(commit_id, head.metadata.next_sequence_number(), positions_path)
        transaction = head.transaction()
        transaction.set_properties({self.positions_property: named.render()})
        with transaction.update_snapshot(
            snapshot_properties={**summary, SUMMARY_POSITIONS: positions_path}
        ).fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
        # pyiceberg retries a conflicting append by rebasing it onto the new head through its
        # registered snapshot producers; with none registered a conflict raises instead, and
        # `publish_round` runs the visibility check again on the new head.
        transaction._snapshot_producers.clear()
        try:
            committed = transaction.commit_transaction()
        except CommitFailedException as conflict:
            raise CommitConflict(str(conflict)) from conflict
        except CommitStateUnknownException as unknown:
            raise CommitOutcomeUnknown(str(unknown)) from unknown
        snapshot = committed.current_snapshot()
        self._table = committed
        return None if snapshot is None else snapshot.snapshot_id

    def _find_commit(self, commit_id: str) -> int | None:
        table = self.table(refresh=True)
        if table is None:
            return None
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            if snapshot.summary is not None and snapshot.summary.get(SUMMARY_COMMIT_ID) == commit_id:
                return snapshot.snapshot_id
        return None

    # --- files --------------------------------------------------------------------------------

    def staging_location(self, table: Table) -> str:
        """`metadata/kinesis-staged/<application>`: each application's staged batches apart, so that
        one application's upkeep never removes another's (`iceberg_maintenance`)."""
        return f"{table.metadata.location}/metadata/{STAGING_FOLDER}/{self.application}"

    def positions_location(self, table: Table) -> str:
        return f"{table.metadata.location}/metadata/{POSITIONS_FOLDER}/{self.application}"

    def receipt_path(self, table: Table, receipt_id: str) -> str:
        return f"{self.staging_location(table)}/{receipt_id}.json"

    def read_receipt(self, receipt_id: str, table: Table | None = None) -> Receipt:
        table = table or self.table()
        if table is None:
            raise StagedBatchGone(receipt_id)
        path = self.receipt_path(table, receipt_id)
        with self.failures(f"read the receipt {path}"):
            input_file = table.io.new_input(path)
            if not input_file.exists():
                raise StagedBatchGone(path)
            with input_file.open() as stream:
                return Receipt.from_json(stream.read())

    def _in_current_spec(self, table: Table, receipt: Receipt, staged: list[DataFile]) -> list[DataFile]:
        """The receipt's data files (`staged`), rewritten into the table's partition spec if it changed
        since they were staged (an append writes every file it adds into one manifest of the current spec)."""
        if receipt.spec_id == table.metadata.default_spec_id or not staged:
            return staged
        log.info(
            "%s: the partition spec changed since %s was staged; rewriting its files", self._uri, receipt.range_text()
        )
        rows = pa.concat_tables([_read_data_file(table, data_file.file_path) for data_file in staged])
        rewrite_id = uuid.uuid5(uuid.UUID(receipt.receipt_id), f"spec-{table.metadata.default_spec_id}")
        writer = DataFileWriter(table.metadata, table.metadata_location)
        return writer.write(writer.with_types(rows), table.io, rewrite_id)

    def staged_data_files(self, table: Table, receipt: Receipt) -> list[DataFile]:
        """The data files a staged batch's manifest lists; `StagedBatchGone` when the manifest is gone."""
        if receipt.manifest_path is None:
            return []
        if not table.io.new_input(receipt.manifest_path).exists():
            raise StagedBatchGone(receipt.manifest_path)
        manifest = ManifestFile.from_args(
            manifest_path=receipt.manifest_path,
            manifest_length=receipt.manifest_length,
            partition_spec_id=receipt.spec_id,
            content=ManifestContent.DATA,
            sequence_number=UNASSIGNED_SEQ,
            min_sequence_number=UNASSIGNED_SEQ,
            added_snapshot_id=None,
        )
        return [entry.data_file for entry in manifest.fetch_manifest_entry(table.io)]

    @contextmanager
    def failures(self, action: str) -> Iterator[None]:
        """Storage and catalog failures as SinkError naming the table and what could not be done."""
        try:
            yield
        except (SinkError, StagedBatchGone, CommitFailedException, CommitStateUnknownException):
            raise
        except Exception as error:  # a catalog's driver (sqlalchemy, botocore, REST), pyarrow's I/O, a bad file
            # A file or document that is not what it must be stays so; anything else may be the catalog
            # or the storage being unavailable for a while.
            retryable = not isinstance(error, (FileNotFoundError, ValueError, KeyError, TypeError))
            raise SinkError(
                self._uri, f"cannot {action}: {type(error).__name__}: {error}", retryable=retryable
            ) from error


@dataclass(frozen=True)
class _StagedFiles:
    """A staged batch as its commit adds it: the receipt, and its data files in the table's partition spec."""

    receipt: Receipt
    data_files: list[DataFile]

    @property
    def batch(self) -> BatchRange:
        return self.receipt.batch

    @property
    def rows(self) -> int:
        return self.receipt.rows

    def range_text(self) -> str:
        return self.receipt.range_text()


def catalog_properties(uri: str, name: str) -> dict[str, str]:
    """The properties of the catalog `name` as pyiceberg's configuration gives them here (read now, not
    when pyiceberg was first imported); a clear SinkError when it is not configured or is of a type
    that cannot commit."""
    config = Config().get_catalog_config(name)
    if not config:
        raise SinkError(
            uri,
            f"catalog {name!r} is not configured: set PYICEBERG_CATALOG__{name.upper()}__TYPE and its "
            "properties (e.g. __URI, __WAREHOUSE), or describe it in .pyiceberg.yaml",
        )
    catalog_type = str(config.get("type", "")).lower()
    if catalog_type in CATALOGS_THAT_CANNOT_COMMIT:
        raise SinkError(
            uri,
            f"catalog {name!r} is of type {catalog_type!r}, which pyiceberg cannot commit to (use sql, glue or rest)",
        )
    return {key: value for key, value in config.items() if isinstance(value, str)}


def load_configured_catalog(uri: str, name: str, properties: Mapping[str, str] | None = None) -> Catalog:
    """The catalog `name` from `properties` (`catalog_properties`, resolved where the job was started),
    else from this process's own configuration."""
    resolved = dict(properties) if properties is not None else catalog_properties(uri, name)
    try:
        return load_catalog(name, **resolved)
    except Exception as error:  # pyiceberg raises ValueError, ImportError, driver errors...
        raise SinkError(uri, f"catalog {name!r} cannot be loaded: {type(error).__name__}: {error}") from error


def check_columns(uri: str, table_schema: Schema, arrow_schema: pa.Schema) -> list[str]:
    """The batch's columns the table lacks; SinkError naming the first column whose type the table
    cannot hold (a type that widens to the table's, such as int to long, is held), or a column the
    table requires that the batch lacks."""
    batch_schema = _pyarrow_to_schema_without_ids(arrow_schema)
    for required in table_schema.fields:
        if required.required and required.name not in arrow_schema.names:
            raise SinkError(
                uri,
                f"the table requires column {required.name!r} ({required.field_type}), which the batches do "
                f"not have (they have {arrow_schema.names})",
            )
    missing = []
    for field in batch_schema.fields:
        try:
            existing = table_schema.find_field(field.name)
        except ValueError:
            existing = None
        if existing is None:
            missing.append(field.name)
            continue
        if not widens_to(field.field_type, existing.field_type):
            raise SinkError(
                uri,
                f"column {field.name!r} is {field.field_type} in the batch but {existing.field_type} in the table; "
                "the table cannot hold it",
            )
    return missing


def widens_to(batch_type: IcebergType, table_type: IcebergType) -> bool:
    """Whether every value of `batch_type` is written as a `table_type` value without loss: the same
    type, or a widening Iceberg allows (int to long, float to double, a decimal to a wider one of the
    same scale). Reading promotions that can fail on a value (binary to string) are not widenings.

    Nested types compare by structure, not by field ids (a batch's have none): a list or map whose
    elements (keys, values) widen, a struct with the table's fields by name, each widening. A struct
    with fields the table's lacks, or without some of them, is not held (no nested schema evolution)."""
    if batch_type == table_type:
        return True
    if isinstance(batch_type, ListType) and isinstance(table_type, ListType):
        return widens_to(batch_type.element_type, table_type.element_type)
    if isinstance(batch_type, MapType) and isinstance(table_type, MapType):
        return widens_to(batch_type.key_type, table_type.key_type) and widens_to(
            batch_type.value_type, table_type.value_type
        )
    if isinstance(batch_type, StructType) and isinstance(table_type, StructType):
        table_fields = {field.name: field.field_type for field in table_type.fields}
        batch_fields = {field.name: field.field_type for field in batch_type.fields}
        return batch_fields.keys() == table_fields.keys() and all(
            widens_to(field_type, table_fields[name]) for name, field_type in batch_fields.items()
        )
    if isinstance(batch_type, IntegerType):
        return isinstance(table_type, LongType)
    if isinstance(batch_type, FloatType):
        return isinstance(table_type, DoubleType)
    if isinstance(batch_type, DecimalType) and isinstance(table_type, DecimalType):
        return batch_type.scale == table_type.scale and batch_type.precision <= table_type.precision
    return False


def with_batch_columns(table: pa.Table, batch: BatchRange) -> pa.Table:
    """The rows with the batch's stream and shard as their first columns (replacing any of the same names)."""
    return with_stream_and_shard(table, batch.stream_name, batch.shard_id)


def as_table_types(batch: pa.Table, table_schema: Schema) -> pa.Table:
    """The batch with each column cast to the table's Arrow type for it (millisecond arrival times to
    Iceberg's microseconds, an int to a long): partition transforms and writers take the table's types."""
    return with_types(batch, table_schema.as_arrow())


def _read_data_file(table: Table, path: str) -> pa.Table:
    with table.io.new_input(path).open() as stream:
        return pq.read_table(stream)


def _write_manifest(table: Table, path: str, data_files: Iterable[DataFile], receipt_id: str) -> int:
    metadata = table.metadata
    snapshot_id = uuid.UUID(receipt_id).int & ((1 << 63) - 1)
    writer = write_manifest(
        format_version=metadata.format_version,
        spec=metadata.spec(),
        schema=metadata.schema(),
        output_file=table.io.new_output(path),
        snapshot_id=snapshot_id,
        avro_compression="deflate",
    )
    with writer:
        for data_file in data_files:
            writer.add_entry(
                ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=data_file)
            )
    return writer.to_manifest_file().manifest_length


def _open(uri: str, opening: SinkOpening) -> IcebergSink:
    application = opening.config.require_application_name()
    return IcebergSink(uri, application, catalog_configuration=opening.configuration, streams=opening.streams)


def _backfill_uri(uri: str, window: str) -> str:
    """A table `<table>_backfill_<window>` beside the live one (lower case, `.` as `p` and `-` as `_`:
    the names Glue keeps, and still one per window)."""
    address = parse_table_uri(uri)
    suffix = window.lower().replace(".", "p").replace("-", "_")
    return f"iceberg://{address.catalog}/{'.'.join(address.namespace)}.{address.table}_backfill_{suffix}"


def _upkeep(sink: object, leases: Sequence[Lease], orphan_age: timedelta, target_file_bytes: int) -> list[str]:
    from sinks.table.iceberg_maintenance import upkeep

    assert isinstance(sink, IcebergSink), sink
    return upkeep(sink, leases, orphan_age, target_file_bytes)


def _configuration(uri: str) -> dict[str, str]:
    return catalog_properties(uri, parse_table_uri(uri).catalog)


SINK_FORMAT = SinkFormat(
    name="iceberg",
    uri_forms=f"{URI_FORM} (an Iceberg table)",
    check_uri=parse_table_uri,
    open=_open,
    backfill_uri=_backfill_uri,
    configuration=_configuration,
    upkeep=_upkeep,
)
