"""The built-in `glue_schema_registry` decoder: records framed by the AWS Glue Schema Registry serializer.

Each payload is the serializer's header then the data (docs/decoders.md, "`glue_schema_registry`"):
a header version byte (3), a compression byte (0: none, 5: zlib), the 16 bytes of the writer's
schema version id, then the data, zlib'd when the compression byte says so: an Avro binary datum,
the JSON text of a JSON Schema document, or a Protobuf message. The schema version is fetched from
Glue (`GetSchemaVersion`) once per version id per process, and its data format picks the reader:
Avro (`avro_records`), JSON Schema (`json_objects`) or Protobuf (`protobuf_messages`).

The batch's columns follow the registry, the same for a batch done again: they are the merge of the
versions 1 to N of the records' schema, N the newest version of the batch's records. A field of a
later version adds a nullable column (null in the rows of versions without it); a field whose type
differs between two versions refuses the batch, naming the field and both versions, before anything
is written. Records of two schemas in one batch refuse it too, naming both.

A record whose header is malformed, whose version id Glue does not know, or whose data does not
decode with its version's schema is rejected with that reason.
"""

from __future__ import annotations

import functools
import importlib
import json
import threading
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.record_columns import BATCH_COLUMNS, POSITION_COLUMNS
from spark_jobs.decode import DECODER, DecodedBatch
from spark_jobs.decoders.avro_records import AvroSchema, avro_schema, read_avro
from spark_jobs.decoders.json_objects import (
    PayloadRows,
    json_schema_to_arrow,
    payloads_of,
    positions_of,
    read_json_lines,
    rejected_records,
)
from spark_jobs.errors import TransformError

NAME = "glue_schema_registry"
# The serializer's constants (AWSSchemaRegistryConstants in awslabs/aws-glue-schema-registry).
HEADER_VERSION = 3
NO_COMPRESSION, ZLIB_COMPRESSION = 0, 5
HEADER_SIZE = 18  # version byte, compression byte, 16 bytes of schema version id


@dataclass(frozen=True)
class SchemaVersion:
    """A schema version as Glue has it."""

    version_id: str
    schema_arn: str
    version_number: int
    data_format: str  # AVRO, JSON or PROTOBUF
    definition: str


class SchemaVersions(Protocol):
    """Where schema versions are looked up: Glue's registry (`GlueSchemaRegistry`)."""

    def by_id(self, version_id: str) -> SchemaVersion | None: ...  # None: the registry has no such version

    def by_number(self, schema_arn: str, version_number: int) -> SchemaVersion | None: ...


class GlueSchemaRegistry:
    """Glue's schema versions, each fetched once (`GetSchemaVersion`) and kept: a version is immutable.

    The Glue client is made at the first lookup, where the decoder runs (an executor), from the
    standard AWS environment (region, credentials, `AWS_ENDPOINT_URL_GLUE` or `AWS_ENDPOINT_URL`)
    unless an endpoint is given."""

    def __init__(self, endpoint_url: str | None = None) -> None:
        self._endpoint_url = endpoint_url
        self._lock = threading.Lock()  # the slots of one executor share it
        self._client: Any = None
        self._versions: dict[Any, SchemaVersion | None] = {}

    def by_id(self, version_id: str) -> SchemaVersion | None:
        return self._cached(version_id, {"SchemaVersionId": version_id})

    def by_number(self, schema_arn: str, version_number: int) -> SchemaVersion | None:
        request = {"SchemaId": {"SchemaArn": schema_arn}, "SchemaVersionNumber": {"VersionNumber": version_number}}
        return self._cached((schema_arn, version_number), request)

    def _cached(self, key: Any, request: Mapping[str, Any]) -> SchemaVersion | None:
        with self._lock:
            if key not in self._versions:
                version = self._fetched(request)
                self._versions[key] = version
                if version is not None:
                    self._versions[version.version_id] = version
                    self._versions[(version.schema_arn, version.version_number)] = version
            return self._versions[key]

    def _fetched(self, request: Mapping[str, Any]) -> SchemaVersion | None:
        if self._client is None:
            config = Config(connect_timeout=10, read_timeout=30, retries={"mode": "standard", "max_attempts": 5})
            self._client = boto3.client("glue", endpoint_url=self._endpoint_url, config=config)
        try:
            answer = self._client.get_schema_version(**request)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "EntityNotFoundException":
                return None
            raise TransformError(NAME, f"could not get a schema version from Glue ({error})", DECODER) from error
        except BotoCoreError as error:
            raise TransformError(NAME, f"could not reach Glue's schema registry ({error})", DECODER) from error
        return SchemaVersion(
            answer["SchemaVersionId"],
            answer["SchemaArn"],
            int(answer["VersionNumber"]),
            answer["DataFormat"],
            answer["SchemaDefinition"],
        )


@functools.cache
def process_registry(endpoint_url: str | None) -> GlueSchemaRegistry:
    """The process's registry for an endpoint: its versions are kept across batches and rounds."""
    return GlueSchemaRegistry(endpoint_url)


def unframed(payload: bytes) -> tuple[bytes, bytes] | str:
    """The 16 bytes of the payload's version id and its data (inflated), or why its header is not the
    serializer's. The id stays bytes: a batch's records share a few, made UUIDs once each."""
    if len(payload) < HEADER_SIZE:
        return f"is too short for a Glue Schema Registry header ({len(payload)} bytes, the header is {HEADER_SIZE})"
    if payload[0] != HEADER_VERSION:
        return f"has header version byte {payload[0]}, not {HEADER_VERSION}: not the Glue Schema Registry serializer's"
    compression = payload[1]
    version_id = payload[2:HEADER_SIZE]
    if compression == NO_COMPRESSION:
        return version_id, payload[HEADER_SIZE:]
    if compression != ZLIB_COMPRESSION:
        return f"has compression byte {compression}, neither {NO_COMPRESSION} (none) nor {ZLIB_COMPRESSION} (zlib)"
    try:
        return version_id, zlib.decompress(payload[HEADER_SIZE:])
    except zlib.error as error:
        return f"has compression byte {ZLIB_COMPRESSION} (zlib) but its data is not zlib data ({error})"


def version_columns(version: SchemaVersion, messages: frozenset[str] = frozenset()) -> pa.Schema:
    """The columns of a schema version's records (for Protobuf, of the records of `messages`, the
    full names of the file's messages the batch's records hold); `ValueError` when its schema has none."""
    return _columns(version.data_format, version.definition, messages if version.data_format == "PROTOBUF" else None)


@functools.cache
def _columns(data_format: str, definition: str, messages: frozenset[str] | None) -> pa.Schema:
    if data_format == "AVRO":
        return _avro_schema(definition).arrow
    if data_format == "JSON":
        schema = json_schema_to_arrow(json.loads(definition))
        return pa.schema([column.with_nullable(True) for column in schema])
    if data_format == "PROTOBUF":
        protobuf = importlib.import_module("spark_jobs.decoders.protobuf_messages")  # protoc's: when needed
        try:
            columns: pa.Schema = protobuf.gsr_protobuf_columns(definition, messages or ())
        except protobuf.ProtoCompileError as error:
            raise ValueError(str(error)) from None
        return columns
    raise ValueError(f"has data format {data_format!r}, not AVRO, JSON or PROTOBUF")


@functools.cache
def _avro_schema(definition: str) -> AvroSchema:
    return avro_schema(definition)


def read_payloads(version: SchemaVersion, payloads: Sequence[bytes]) -> PayloadRows:
    """The payloads read as records of `version`, by the reader of its data format."""
    if version.data_format == "AVRO":
        read: PayloadRows = read_avro(_avro_schema(version.definition), payloads)
    elif version.data_format == "JSON":
        parse = pa_json.ParseOptions(explicit_schema=version_columns(version), unexpected_field_behavior="ignore")
        read = read_json_lines(payloads, parse, NAME)
    else:
        read = _read_protobuf(version.definition, payloads)
    return read


def _protobuf_messages(definition: str, payloads: Sequence[bytes]) -> frozenset[str]:
    protobuf = importlib.import_module("spark_jobs.decoders.protobuf_messages")
    try:
        names: frozenset[str] = protobuf.gsr_message_names(definition, payloads)
    except protobuf.ProtoCompileError:
        return frozenset()  # `version_columns` refuses the definition, naming why
    return names


def _read_protobuf(definition: str, payloads: Sequence[bytes]) -> Any:
    protobuf = importlib.import_module("spark_jobs.decoders.protobuf_messages")  # protoc's machinery: when needed
    return protobuf.read_gsr_protobuf(definition, payloads)


def merged_columns(versions: Sequence[tuple[int, pa.Schema]]) -> pa.Schema:
    """The columns of versions (number, columns), in version order: each version's fields, the first
    version's in its order then the fields later versions add, all nullable; a struct's fields are
    merged alike. `ValueError` naming the field and both versions when a field's type changes."""
    first_seen: dict[str, int] = {}  # a field's path -> the version whose type for it is kept
    merged: list[pa.Field] = []
    for number, columns in versions:
        merged = _merged_fields(merged, list(columns), "", number, first_seen)
    return pa.schema(merged)


def _merged_fields(
    ours: list[pa.Field], theirs: list[pa.Field], prefix: str, number: int, first_seen: dict[str, int]
) -> list[pa.Field]:
    fields = {column.name: column for column in ours}
    for column in theirs:
        path = f"{prefix}{column.name}"
        _note_first_seen(path, column.type, number, first_seen)
        kept = fields.get(column.name)
        kept_type = column.type if kept is None else _merged_type(path, kept.type, column.type, number, first_seen)
        fields[column.name] = pa.field(column.name, kept_type)
    return list(fields.values())


def _note_first_seen(path: str, column_type: pa.DataType, number: int, first_seen: dict[str, int]) -> None:
    """Version `number` as the first with `path`, and with the fields inside it, unless an earlier one was."""
    first_seen.setdefault(path, number)
    if pa.types.is_struct(column_type):
        for inner in column_type:
            _note_first_seen(f"{path}.{inner.name}", inner.type, number, first_seen)
    elif pa.types.is_list(column_type):
        _note_first_seen(f"{path}[]", column_type.value_type, number, first_seen)
    elif pa.types.is_map(column_type):
        _note_first_seen(f"{path}{{}}", column_type.item_type, number, first_seen)


def _merged_type(
    path: str, ours: pa.DataType, theirs: pa.DataType, number: int, first_seen: dict[str, int]
) -> pa.DataType:
    if ours == theirs:
        return ours
    if pa.types.is_struct(ours) and pa.types.is_struct(theirs):
        return pa.struct(_merged_fields(list(ours), list(theirs), f"{path}.", number, first_seen))
    if pa.types.is_list(ours) and pa.types.is_list(theirs):
        return pa.list_(_merged_type(f"{path}[]", ours.value_type, theirs.value_type, number, first_seen))
    if pa.types.is_map(ours) and pa.types.is_map(theirs) and ours.key_type == theirs.key_type:
        return pa.map_(ours.key_type, _merged_type(f"{path}{{}}", ours.item_type, theirs.item_type, number, first_seen))
    raise ValueError(
        f"field {path!r} is {ours} in version {first_seen.get(path, number)} and {theirs} in version {number}"
    )


def aligned(table: pa.Table, columns: pa.Schema) -> pa.Table:
    """`table` with `columns`: a column it lacks is null; one whose struct lacks fields gets them null."""
    if all(column.type == columns.field(column.name).type for column in table.schema):
        return pa.table(
            [
                table.column(column.name) if column.name in table.column_names else pa.nulls(len(table), column.type)
                for column in columns
            ],
            schema=columns,
        )
    return pa.Table.from_pylist(table.to_pylist(), schema=columns)  # an older version's nested record: rare


@dataclass(frozen=True)
class GlueSchemaRegistryDecoder:
    endpoint_url: str | None = None  # Glue's endpoint; None: the standard AWS environment's where the job runs
    spec: str = NAME
    registry: SchemaVersions | None = field(default=None, compare=False)  # None: the process's (`process_registry`)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> GlueSchemaRegistryDecoder:
        unknown = sorted(set(options) - {"endpoint_url"})
        if unknown:
            raise ValueError(f"the {NAME} decoder has no option {unknown[0]!r} (it takes: endpoint_url)")
        endpoint = options.get("endpoint_url")
        if endpoint is not None and not (isinstance(endpoint, str) and endpoint.startswith(("http://", "https://"))):
            raise ValueError(f"endpoint_url must be an http:// or https:// URL, got {endpoint!r}")
        return cls(endpoint)

    def options(self) -> dict[str, Any]:
        return {} if self.endpoint_url is None else {"endpoint_url": self.endpoint_url}

    def columns(self) -> None:
        return None  # they follow the registry, batch by batch

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch:
        registry = self.registry or process_registry(self.endpoint_url)
        rejected: dict[int, str] = {}
        by_version: dict[bytes, list[tuple[int, bytes]]] = defaultdict(list)
        for index, payload in enumerate(payloads_of(records)):
            framed = unframed(payload)
            if isinstance(framed, str):
                rejected[index] = framed
            else:
                by_version[framed[0]].append((index, framed[1]))
        versions: dict[bytes, SchemaVersion] = {}
        for id_bytes, payloads in by_version.items():
            version_id = str(UUID(bytes=id_bytes))
            version = registry.by_id(version_id)
            if version is None:
                unknown = f"has schema version {version_id}, which is not in the registry"
                rejected.update((index, unknown) for index, _ in payloads)
            else:
                versions[id_bytes] = version
        versions = self._of_one_schema(versions, by_version, rejected)
        messages = frozenset(
            name
            for id_bytes, version in versions.items()
            if version.data_format == "PROTOBUF"
            for name in _protobuf_messages(version.definition, [data for _, data in by_version[id_bytes]])
        )
        columns = self._batch_columns(registry, list(versions.values()), messages)
        tables: list[pa.Table] = []
        rows: list[int] = []
        for id_bytes, version in versions.items():
            indices = [index for index, _ in by_version[id_bytes]]
            read = read_payloads(version, [data for _, data in by_version[id_bytes]])
            rejected.update((indices[at], why) for at, why in read.rejected.items())
            rows.extend(indices[at] for at in read.rows)
            tables.append(aligned(read.table, columns))
        decoded = pa.concat_tables(tables) if tables else columns.empty_table()
        in_order = pc.sort_indices(pa.array(rows, pa.int64()))  # the records' order, whatever their versions
        table = positions_of(records, sorted(rows))
        for column in columns:
            table = table.append_column(column, decoded.column(column.name).take(in_order))
        return DecodedBatch(table, rejected_records(records, rejected, stream_name, shard_id))

    @staticmethod
    def _of_one_schema(
        versions: dict[bytes, SchemaVersion],
        by_version: Mapping[bytes, list[tuple[int, bytes]]],
        rejected: dict[int, str],
    ) -> dict[bytes, SchemaVersion]:
        """The versions of the schema of the batch's first record whose version is known: a table
        takes one schema, and that choice is the same on every redo of the batch. The records of
        other schemas are rejected, naming both."""
        first = {id_bytes: min(index for index, _ in by_version[id_bytes]) for id_bytes in versions}
        if not first:
            return versions
        chosen = versions[min(first, key=first.__getitem__)].schema_arn
        for id_bytes, version in versions.items():
            if version.schema_arn != chosen:
                why = f"is of schema {version.schema_arn}, the batch's records of {chosen}: a table takes one schema"
                rejected.update((index, why) for index, _ in by_version[id_bytes])
        return {id_bytes: version for id_bytes, version in versions.items() if version.schema_arn == chosen}

    def _batch_columns(
        self, registry: SchemaVersions, versions: list[SchemaVersion], messages: frozenset[str]
    ) -> pa.Schema:
        """The merge of versions 1 to N of the batch's schema (for Protobuf, of the messages its records
        hold); `TransformError` when a field's type changes between two versions, or when a version
        up to N is not in the registry (deleted: without it, what the batch's columns are would depend
        on what a process fetched before)."""
        if not versions:
            return pa.schema([])
        schema_arn = versions[0].schema_arn
        newest = max(version.version_number for version in versions)
        history = [registry.by_number(schema_arn, number) for number in range(1, newest + 1)]
        missing = [number for number, version in enumerate(history, start=1) if version is None]
        if missing:
            problem = (
                f"schema {schema_arn} has no version {missing[0]} in the registry, which the batch's columns "
                f"(versions 1 to {newest}) are made of: a version the stream's records may use was deleted"
            )
            raise TransformError(self.spec, problem, DECODER)
        try:
            merged = merged_columns(
                [(version.version_number, version_columns(version, messages)) for version in history if version]
            )
        except ValueError as error:
            raise TransformError(self.spec, f"schema {schema_arn}: {error}", DECODER) from None
        clashes = sorted(set(merged.names) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
        if clashes:
            problem = f"schema {schema_arn} has a field named {clashes[0]!r}, which the batch has as a column already"
            raise TransformError(self.spec, problem, DECODER)
        return merged
