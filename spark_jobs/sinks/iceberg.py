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
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

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
from pyiceberg.io.pyarrow import _dataframe_to_data_files, _pyarrow_to_schema_without_ids
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

from lease_core.model.sequence import TRIM_HORIZON
from lease_core.ops.landed_audit import LandedBatch
from spark_jobs.errors import SinkError
from spark_jobs.sinks.batch_sink import (
    BatchRange,
    RoundIdentity,
    RoundPublication,
    StagedBatch,
    StreamIncarnations,
    location_dataset,
)
from spark_jobs.sinks.iceberg_data_files import write_data_files
from spark_jobs.sinks.lease_records import (
    LeasePosition,
    TableLeaseRecord,
    TableRecordKeeping,
    decode_position,
    encode_position,
    held_position,
    position_text,
    positions_json,
)
from spark_jobs.sinks.record_columns import RECORD_SCHEMA, with_stream_and_shard

log = logging.getLogger(__name__)

URI_FORM = "iceberg://CATALOG/NAMESPACE.TABLE"
ARRIVAL_COLUMN = "approximate_arrival_timestamp"
# pyiceberg's catalogs that cannot commit a table change (0.12: DynamoDB raises NotImplementedError).
CATALOGS_THAT_CANNOT_COMMIT = frozenset({"dynamodb"})
# A round's commit is tried again after a conflict with another writer, with every check run again.
COMMIT_ATTEMPTS = 8
STAGED_READERS = 16  # receipts and manifests a round's commit reads at once (object store round trips)
# Batches the summary's `kinesis.ranges` names at most: every snapshot's summary stays in the table's
# metadata file, which every reader and writer loads.
SUMMARY_RANGES_SHOWN = 100
RECEIPT_FORMAT = "kinesis-lease-batch/iceberg-receipt/1"
POSITIONS_FORMAT = "kinesis-lease-batch/iceberg-positions/1"
RECORD_FORMAT = "iceberg/1"
STAGING_FOLDER = "kinesis-staged"  # under the table's metadata location: receipts and their manifests
POSITIONS_FOLDER = "kinesis-positions"
REPORTS_FOLDER = "kinesis-rounds"
# Snapshot summary keys (plain text in every Iceberg client's $snapshots table).
SUMMARY_APPLICATION = "kinesis.application"
SUMMARY_ROUND = "kinesis.round"
SUMMARY_COMMIT_ID = "kinesis.commit-id"
SUMMARY_STREAMS = "kinesis.streams"
SUMMARY_RANGES = "kinesis.ranges"
SUMMARY_POSITIONS = "kinesis.positions-file"
# Table property: `<commit id> <position map>` of the application's newest commit.
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
        batch = self.batch
        document = {
            "format": RECEIPT_FORMAT,
            "receipt": self.receipt_id,
            "lease": batch.lease_key,
            "stream": batch.stream_name,
            "shard": batch.shard_id,
            "start": encode_position(batch.start),
            "first": None if batch.first is None else encode_position(batch.first),
            "end": encode_position(batch.end),
            "rows": self.rows,
            "bytes": self.data_bytes,
            "manifest": self.manifest_path,
            "manifest_length": self.manifest_length,
            "spec_id": self.spec_id,
        }
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, payload: bytes) -> Receipt:
        document = json.loads(payload)
        if document.get("format") != RECEIPT_FORMAT:
            raise ValueError(f"not a receipt of ours (format {document.get('format')!r})")
        first = document["first"]
        batch = BatchRange(
            lease_key=document["lease"],
            stream_name=document["stream"],
            shard_id=document["shard"],
            start=decode_position(document["start"]),
            first=None if first is None else decode_position(first),
            end=decode_position(document["end"]),
        )
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
        """`<shard> <first>..<end>` (positions as `sequence-subsequence`), for the snapshot summary."""
        batch = self.batch
        first = batch.first if batch.first is not None else batch.start
        return f"{batch.shard_id} {position_text(first)}..{position_text(batch.end)}"


class IcebergSink(TableRecordKeeping):
    """The table at `uri`, for the application `application` (its position map is the application's own)."""

    RECORD = LeaseRecord

    def __init__(
        self,
        uri: str,
        application: str,
        catalog: Catalog | None = None,
        catalog_configuration: Mapping[str, str] | None = None,
        streams: StreamIncarnations | None = None,
    ) -> None:
        """`catalog_configuration`: the catalog's properties as the driver resolved them (see
        `spark_jobs.sinks.sink_configuration`), else this process's pyiceberg configuration.
        `streams`: the streams as they are now, so that a position the table holds for a stream of the
        same name that was deleted since is not taken for the lease's (None: not known)."""
        self.address = parse_table_uri(uri)
        self._uri = uri
        self.application = application
        self._catalog = catalog
        self._catalog_configuration = catalog_configuration
        self.streams: StreamIncarnations = streams or {}
        self._table: Table | None = None
        self._staged: dict[str, Receipt] = {}  # this process's staged batches, for their commit records
        self._staging_table = threading.Lock()  # a slot's leases stage at once: one of them loads the table

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
        """`<table location>/metadata/kinesis-rounds`, the table created now (with the record columns)
        if it does not exist yet: a round's report needs a place before its first batch."""
        table = self.table() or self._create(record_schema_with_batch_columns())
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

    def _table_for(self, arrow_schema: pa.Schema) -> Table:
        """The table, created with `arrow_schema` when missing (partitioned by day of arrival when it has
        the arrival column), and evolved by name when the batch brings new columns. A column whose type
        the table cannot hold is refused before anything is written.

        One batch at a time: a slot's leases stage their first batches at once, and each would load
        (or create) the table itself while none is loaded yet."""
        with self._staging_table:
            table = self.table()
            if table is None:
                table = self._create(arrow_schema)
            missing = check_columns(self._uri, table.schema(), arrow_schema)
            if missing:
                table = self._add_columns(arrow_schema, missing)
            return table

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
        the loser's union finds it there."""
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
        iceberg_table = self._table_for(table.schema)
        metadata = iceberg_table.metadata
        io = iceberg_table.io
        manifest_path, manifest_length, written = None, 0, 0
        with self.failures(f"stage the batch {self.batch_name(batch)}"):
            if table.num_rows:
                table = as_table_types(table, iceberg_table.schema())
                data_files = write_data_files(metadata, table, io, uuid.UUID(receipt_id))
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
        self._staged[receipt_id] = receipt
        return StagedBatch(receipt_id, table.num_rows, written, already_present)

    def adopt(self, staged: str | None, batch: BatchRange, attempt: str) -> StagedBatch | None:
        """None: a redo reads its range again and stages it as its own (a redo is rare; the other
        attempt's files may still be being rewritten by it)."""
        return None

    # --- records, commits and visibility ------------------------------------------------------

    def _load_positions(self) -> dict[str, LeasePosition] | None:
        table = self.table(refresh=True)
        return None if table is None else self.positions(table)

    def _has_receipt(self, receipt_id: str) -> bool:
        table = self.table()
        if table is None:
            return False
        with self.failures("look for a receipt"):
            return bool(table.io.new_input(self.receipt_path(table, receipt_id)).exists())

    def _receipt_batch(self, receipt_id: str) -> BatchRange | None:
        if receipt_id in self._staged:
            return self._staged[receipt_id].batch
        try:
            return self.read_receipt(receipt_id).batch
        except StagedBatchGone:
            return None

    def positions(self, table: Table) -> dict[str, LeasePosition]:
        """The application's position map: the one its newest snapshot in `main`'s history points to.

        The table property `kinesis.positions.<application>` points to it as well (set by the same
        commit), for when that snapshot has been expired by a tool that does not keep it (this
        sink's own expiry does): the property is used only when the snapshot it names is gone from
        the table, never when it exists off `main`'s history (a rollback took it out)."""
        snapshot = self._newest_own_snapshot(table)
        path = None if snapshot is None or snapshot.summary is None else snapshot.summary.get(SUMMARY_POSITIONS)
        if path is None:
            path = self._expired_snapshots_positions(table)
        if path is None:
            return {}
        with self.failures(f"read the position map {path}"):
            with table.io.new_input(path).open() as stream:
                document = json.loads(stream.read())
        return {
            key: LeasePosition(value["stream"], value.get("arn"), value.get("created"), decode_position(value["end"]))
            for key, value in document["leases"].items()
        }

    def landed_batches(self) -> list[LandedBatch]:
        """Every batch this application's commits added to the table, oldest commit first, as `main`'s
        history holds them (a rollback takes commits out; an expired snapshot's batches are gone)."""
        table = self.table(refresh=True)
        if table is None:
            return []
        own = [
            snapshot
            for snapshot in ancestors_of(table.current_snapshot(), table.metadata)
            if snapshot.summary is not None and snapshot.summary.get(SUMMARY_APPLICATION) == self.application
        ]
        landed: list[LandedBatch] = []
        for snapshot in reversed(own):
            path = snapshot.summary.get(SUMMARY_POSITIONS) if snapshot.summary is not None else None
            if path is None:
                continue
            with self.failures(f"read the position map {path}"):
                with table.io.new_input(path).open() as stream:
                    document = json.loads(stream.read())
            landed.extend(
                LandedBatch(
                    batch["lease"],
                    decode_position(batch["start"]),
                    decode_position(batch["end"]),
                    int(document.get("round", 0)),
                    snapshot.snapshot_id,
                )
                for batch in document.get("batches", ())
            )
        return landed

    @property
    def positions_property(self) -> str:
        return f"{POSITIONS_PROPERTY_PREFIX}{self.application}"

    def _expired_snapshots_positions(self, table: Table) -> str | None:
        """The position map the table property names, when `main`'s history no longer reaches the
        snapshot that names it: it was expired, or another tool expired snapshots above it and cut the
        history off. Not when a rollback took it out of `main` (it is newer than `main`'s head then)."""
        commit_id, _, path = table.properties.get(self.positions_property, "").partition(" ")
        if not path:
            return None
        named = [
            snapshot
            for snapshot in table.metadata.snapshots
            if snapshot.summary is not None and snapshot.summary.get(SUMMARY_COMMIT_ID) == commit_id
        ]
        history = list(ancestors_of(table.current_snapshot(), table.metadata))
        if named and (not history or named[0].timestamp_ms >= history[-1].timestamp_ms):
            return None  # off `main`'s history and not older than it: rolled back
        log.info(
            "%s: the application's newest snapshot (commit %s) is not in main's history; positions from %s",
            self._uri,
            commit_id,
            path,
        )
        return path

    def _newest_own_snapshot(self, table: Table) -> Snapshot | None:
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            if snapshot.summary is not None and snapshot.summary.get(SUMMARY_APPLICATION) == self.application:
                return snapshot
        return None

    # --- the round's commit, by the driver ----------------------------------------------------

    def publish_round(self, records: Mapping[str, str], identity: RoundIdentity) -> RoundPublication:
        waiting = {
            key: decoded
            for key, record in records.items()
            if (decoded := LeaseRecord.decode(record)) is not None and decoded.entries
        }
        if not waiting:
            return RoundPublication(0, 0, 0)
        commit_id = uuid.uuid4().hex
        staged: dict[str, _StagedFiles | None] = {}  # receipt id -> what it names, read once for every attempt
        for _ in range(COMMIT_ATTEMPTS):
            table = self.table(refresh=True)
            if table is None:
                raise SinkError(self._uri, "the table is gone: committed batches were staged into it")
            plan = self._plan(table, waiting, staged, identity)
            if not plan.batches:
                return RoundPublication(0, 0, plan.already_visible, plan.missing)
            try:
                snapshot_id = self._commit(table, plan, identity, commit_id)
            except CommitFailedException as error:
                log.info("%s: another writer committed first (%s); checking again on the new head", self._uri, error)
                continue
            except CommitStateUnknownException as error:
                landed = self._find_commit(commit_id)
                if landed is None:
                    log.warning("%s: a commit's answer was lost (%s) and it did not land; again", self._uri, error)
                    continue
                snapshot_id = landed
            return RoundPublication(1, len(plan.batches), plan.already_visible, plan.missing, snapshot_id)
        raise SinkError(
            self._uri, f"the round's commit met a newer head {COMMIT_ATTEMPTS} times in a row", retryable=True
        )

    def _plan(
        self,
        table: Table,
        waiting: Mapping[str, LeaseRecord],
        staged: dict[str, _StagedFiles | None],
        identity: RoundIdentity,
    ) -> _CommitPlan:
        """The batches to commit now: every listed batch past its lease's position in the table, in
        order. Their receipts and data files are read once (`staged`, kept across attempts), in parallel:
        only the positions are read again after a conflict."""
        positions = self.positions(table)
        due = [
            (key, entry)
            for key, record in sorted(waiting.items())
            for entry in sorted(record.entries, key=lambda e: e.end)
            if (held := held_position(positions, key, identity.streams)) is None or entry.end > held
        ]
        unread = [entry.receipt for _, entry in due if entry.receipt not in staged]
        with ThreadPoolExecutor(max_workers=STAGED_READERS) as pool:
            staged.update(zip(unread, pool.map(lambda receipt: self._staged_files(table, receipt), unread)))
        batches = [files for _, entry in due if (files := staged[entry.receipt]) is not None]
        missing = tuple(f"{key}: the batch up to {entry.end}" for key, entry in due if staged[entry.receipt] is None)
        already = sum(len(record.entries) for record in waiting.values()) - len(due)
        return _CommitPlan(positions, batches, already, missing)

    def _staged_files(self, table: Table, receipt_id: str) -> _StagedFiles | None:
        """A staged batch's receipt and data files, rewritten into the table's current partition spec
        if needed; None when its receipt or manifest is gone."""
        try:
            receipt = self.read_receipt(receipt_id, table)
            return _StagedFiles(receipt, self._data_files(table, receipt))
        except StagedBatchGone:
            return None

    def _commit(self, table: Table, plan: _CommitPlan, identity: RoundIdentity, commit_id: str) -> int:
        positions = dict(plan.positions)
        receipts = [batch.receipt for batch in plan.batches]
        for receipt in receipts:
            batch = receipt.batch
            arn, created = identity.streams.get(batch.stream_name, (None, None))
            positions[batch.lease_key] = LeasePosition(batch.stream_name, arn, created, batch.end)
        positions_path = f"{self.positions_location(table)}/{commit_id}.json"
        with self.failures("write the position map"):
            with table.io.new_output(positions_path).create(overwrite=True) as stream:
                stream.write(
                    positions_json(
                        POSITIONS_FORMAT,
                        self.application,
                        identity.round_number,
                        positions,
                        [(receipt.batch, receipt.rows) for receipt in receipts],
                    )
                )
        data_files = [data_file for batch in plan.batches for data_file in batch.data_files]
        summary = {
            SUMMARY_APPLICATION: identity.application,
            SUMMARY_ROUND: str(identity.round_number),
            SUMMARY_COMMIT_ID: commit_id,
            SUMMARY_STREAMS: "; ".join(
                f"{name} {arn} created {created}" for name, (arn, created) in sorted(identity.streams.items())
            ),
            SUMMARY_RANGES: ranges_text(receipts),
            SUMMARY_POSITIONS: positions_path,
        }
        transaction = table.transaction()
        transaction.set_properties({self.positions_property: f"{commit_id} {positions_path}"})
        with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
        # pyiceberg retries a conflicting append by rebasing it onto the new head through its
        # registered snapshot producers; with none registered a conflict raises instead, and
        # `publish_round` runs the visibility check again on the new head.
        transaction._snapshot_producers.clear()
        committed = transaction.commit_transaction()
        snapshot = committed.current_snapshot()
        assert snapshot is not None
        self._table = committed
        self._now_holds(positions)
        return snapshot.snapshot_id

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

    def _data_files(self, table: Table, receipt: Receipt) -> list[DataFile]:
        """The receipt's data files, rewritten into the table's partition spec if it changed since
        they were staged (an append writes every file it adds into one manifest of the current spec)."""
        staged = self.staged_data_files(table, receipt)
        if receipt.spec_id == table.metadata.default_spec_id or not staged:
            return staged
        log.info(
            "%s: the partition spec changed since %s was staged; rewriting its files", self._uri, receipt.range_text()
        )
        rows = pa.concat_tables([_read_data_file(table, data_file.file_path) for data_file in staged])
        rewrite_id = uuid.uuid5(uuid.UUID(receipt.receipt_id), f"spec-{table.metadata.default_spec_id}")
        return list(
            _dataframe_to_data_files(table.metadata, as_table_types(rows, table.schema()), table.io, rewrite_id)
        )

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
    receipt: Receipt
    data_files: list[DataFile]


@dataclass(frozen=True)
class _CommitPlan:
    positions: Mapping[str, LeasePosition]
    batches: Sequence[_StagedFiles]
    already_visible: int
    missing: tuple[str, ...]


def ranges_text(receipts: Sequence[Receipt]) -> str:
    """The summary's `kinesis.ranges`: a batch per entry, at most SUMMARY_RANGES_SHOWN of them (the
    position map the summary points to names every one)."""
    shown = "; ".join(receipt.range_text() for receipt in receipts[:SUMMARY_RANGES_SHOWN])
    hidden = len(receipts) - SUMMARY_RANGES_SHOWN
    return shown if hidden <= 0 else f"{shown}; and {hidden} more (see {SUMMARY_POSITIONS})"


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


def record_schema_with_batch_columns() -> pa.Schema:
    """The columns of a batch without a transform, as the table holds them."""
    return with_batch_columns(RECORD_SCHEMA.empty_table(), PLACEHOLDER).schema


def with_batch_columns(table: pa.Table, batch: BatchRange) -> pa.Table:
    """The rows with the batch's stream and shard as their first columns (replacing any of the same names)."""
    return with_stream_and_shard(table, batch.stream_name, batch.shard_id)


def as_table_types(batch: pa.Table, table_schema: Schema) -> pa.Table:
    """The batch with each column cast to the table's Arrow type for it (millisecond arrival times to
    Iceberg's microseconds, an int to a long): partition transforms and writers take the table's types."""
    wanted = table_schema.as_arrow()
    fields = [
        field.with_type(wanted.field(field.name).type) if field.name in wanted.names else field
        for field in batch.schema
    ]
    target = pa.schema(fields, metadata=batch.schema.metadata)
    return batch if target.equals(batch.schema) else batch.cast(target)


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
