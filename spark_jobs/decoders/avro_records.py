"""The built-in `avro` decoder: each record's payload is one Avro binary datum of a record schema.

Chosen with `decode = "avro"` and exactly one of the options `schema` (the writer schema, as JSON
text or a JSON object) or `schema_file` (a path to it, read where the job decodes, the first time it
does: the machine that checks the pipeline may not have it). The top record's
fields are the columns (docs/decoders.md, "`avro`", has the Avro to Arrow types).

The batch is decoded a window of payloads at a time by fastavro's reader in one pass (its loop is
Cython): a window is framed as one in-memory object-container block, each datum followed by a marker
of random bytes (the schema read gets a last field of that `fixed` type). A payload that is not a
datum of the schema either fails the reader, or reads past or short of its own end, so that the
marker read after it is not the marker: either way the payloads before it decoded exactly. From it to
the window's end the payloads are read one by one, each checked to end where its datum does: a
payload is read at most twice, however many are bad. The rows become Arrow columns by pyarrow's
conversion, in C++; a row holding a value its column cannot is found by halves and set aside.

Logical types that are numbers or strings on the wire (timestamps, dates, times, uuid) are read as
those (the schema read has their `logicalType` taken off): Arrow takes the numbers as its own
timestamps, dates and times, without a Python object per value.
"""

from __future__ import annotations

import io
import json
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import fastavro
import pyarrow as pa

from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.record_columns import BATCH_COLUMNS, POSITION_COLUMNS, POSITION_SCHEMA
from spark_jobs.decode import DECODER, DecodedBatch
from spark_jobs.decoders.json_objects import PayloadRows, payloads_of, positions_of, rejected_records
from spark_jobs.errors import TransformError

NAME = "avro"
_MARKER = "kinesis_lease_datum_end"  # the field read after each datum; a schema's own field of this name is refused
_MARKER_SIZE = 16
_PRIMITIVES = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
# The logical types read as their wire type, and the Arrow type that takes that wire value as it is.
_WIRE_LOGICAL = {
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"),
    "local-timestamp-micros": pa.timestamp("us"),
    "date": pa.date32(),
    "time-millis": pa.time32("ms"),
    "time-micros": pa.time64("us"),
    "uuid": pa.string(),
}
# fastavro's errors for a datum that does not decode (an enum or union index out of range among them).
DATUM_ERRORS = (EOFError, ValueError, IndexError, KeyError, OverflowError, TypeError, MemoryError)


@dataclass(frozen=True)
class AvroSchema:
    """A record schema: the Arrow schema of its fields, and the schema fastavro reads them with
    (logical types on the wire taken off)."""

    arrow: pa.Schema
    wire: dict[str, Any]


def avro_schema(definition: str | Mapping[str, Any], where: str = "schema") -> AvroSchema:
    """The schema of a record's Avro definition (JSON text or its document); `ValueError` naming the
    part that is wrong (`where` is the path to it)."""
    document = _document(definition, where)
    if not isinstance(document, dict) or document.get("type") != "record":
        raise ValueError(f"{where} must be an Avro record schema, got {document!r}")
    named: dict[str, pa.DataType | None] = {}  # the named types seen, None while their own fields are read
    arrow = _arrow_type(document, where, named, namespace="")
    if any(field.name == _MARKER for field in arrow):
        raise ValueError(f"{where} has a field named {_MARKER!r}, which the decoder reserves")
    try:
        fastavro.parse_schema(document)
    except (fastavro.schema.SchemaParseException, ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{where} is not a valid Avro schema ({error})") from None
    return AvroSchema(pa.schema(list(arrow)), _wire(document))


def _document(definition: str | Mapping[str, Any], where: str) -> Any:
    if isinstance(definition, Mapping):
        return dict(definition)
    try:
        return json.loads(definition)
    except (json.JSONDecodeError, TypeError) as error:
        raise ValueError(f"{where} must be an Avro schema as JSON text or a JSON object ({error})") from None


def _arrow_type(node: Any, where: str, named: dict[str, pa.DataType | None], namespace: str) -> pa.DataType:
    """`node`'s Arrow type: records structs, arrays lists, maps maps, a union with null its other
    branch (every column is nullable), enums strings, fixed and bytes binary."""
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return _PRIMITIVES[node]
        full = node if "." in node or not namespace else f"{namespace}.{node}"
        for name in (full, node):
            if name in named:
                if named[name] is None:
                    raise ValueError(f"{where} refers to {node!r} inside itself: a recursive type has no column type")
                return named[name]
        raise ValueError(f"{where} refers to the type {node!r}, which the schema does not define before")
    if isinstance(node, list):
        branches = [branch for branch in node if branch != "null"]
        if len(branches) != 1:
            raise ValueError(f"{where} is a union of {node!r}: only a union of null and one type has a column type")
        return _arrow_type(branches[0], where, named, namespace)
    if not isinstance(node, Mapping):
        raise ValueError(f"{where} must be an Avro type, got {node!r}")
    kind = node.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        return _named_type(node, where, named, namespace)
    logical = _logical_type(node, where)
    if logical is not None:
        return logical
    if kind == "array":
        return pa.list_(_arrow_type(node.get("items"), f"{where}[]", named, namespace))
    if kind == "map":
        return pa.map_(pa.string(), _arrow_type(node.get("values"), f"{where}{{}}", named, namespace))
    return _arrow_type(kind, where, named, namespace)


def _named_type(
    node: Mapping[str, Any], where: str, named: dict[str, pa.DataType | None], namespace: str
) -> pa.DataType:
    """A record's, enum's or fixed's Arrow type, registered under its full name (a logical type on it
    too: a later field may use the type by name)."""
    kind = node["type"]
    name = str(node.get("name"))
    namespace = str(node.get("namespace", namespace) if "." not in name else name.rpartition(".")[0])
    full = name if "." in name or not namespace else f"{namespace}.{name}"
    named[full] = None
    if kind in ("record", "error"):
        fields = node.get("fields")
        if not isinstance(fields, list):
            raise ValueError(f"{where} is a record without a list of 'fields'")
        arrow: pa.DataType = pa.struct(
            [
                pa.field(field["name"], _arrow_type(field["type"], f"{where}.{field['name']}", named, namespace))
                for field in fields
            ]
        )
    else:
        arrow = _logical_type(node, where) or (pa.string() if kind == "enum" else pa.binary())
    named[full] = arrow
    return arrow


def _logical_type(node: Mapping[str, Any], where: str) -> pa.DataType | None:
    """The Arrow type of `node`'s logical type, None without one. A `uuid` on a `fixed` is its 16 bytes
    (binary): they need not be text."""
    logical = node.get("logicalType")
    if logical == "uuid" and node.get("type") == "fixed":
        return None
    if logical in _WIRE_LOGICAL:
        return _WIRE_LOGICAL[logical]
    if logical != "decimal":
        return None
    if "precision" not in node:
        raise ValueError(f"{where} is a decimal without a 'precision'")
    try:
        return pa.decimal128(int(node["precision"]), int(node.get("scale", 0)))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where} is a decimal that Arrow's decimal128 cannot hold ({error})") from None


def _wire(node: Any) -> Any:
    """The schema as fastavro reads it without converting: the logical types of `_WIRE_LOGICAL` off."""
    if isinstance(node, list):
        return [_wire(branch) for branch in node]
    if not isinstance(node, Mapping):
        return node
    wire = {key: _wire(value) for key, value in node.items()}
    if wire.get("logicalType") in _WIRE_LOGICAL:
        del wire["logicalType"]
    if "fields" in wire:
        wire["fields"] = [{**field, "type": _wire(field["type"])} for field in node["fields"]]
    return wire


def read_avro(
    schema: AvroSchema,
    payloads: Sequence[bytes],
    *,
    read_block: BlockReader = fastavro.reader,
    read_datum: DatumReader = fastavro.schemaless_reader,
) -> PayloadRows:
    """The payloads decoded as datums of `schema`, a window of them at a time in one pass of
    fastavro's reader (`read_block`); from a payload that is not a datum to the window's end, one by
    one (`read_datum`). A payload that is not a datum, or holds a value its column cannot, is set aside
    with the reason."""
    decoded: dict[int, dict[str, Any]] = {}
    rejected: dict[int, str] = {}
    reading = _Reading(schema, read_block, read_datum)
    for start in range(0, len(payloads), _WINDOW):
        window_rows, window_rejected = reading.window(payloads, start, min(start + _WINDOW, len(payloads)))
        decoded.update(window_rows)
        rejected.update(window_rejected)
    table, unfit = _arrow_table(pa.struct(list(schema.arrow)), decoded)
    rejected.update(unfit)
    return PayloadRows(table, [index for index in decoded if index not in unfit], dict(sorted(rejected.items())))


BlockReader = Callable[[IO[bytes]], Iterable[Any]]
DatumReader = Callable[[IO[bytes], Any], Any]
# The payloads one block holds: a bad payload costs at most the rest of its window read one by one.
_WINDOW = 1024
_NOT_AT_END = "is not a datum of its Avro schema (it does not end where the payload does)"
_OBJECT_ADDRESS = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")
# pyarrow's errors for a value its type cannot hold (a decimal with more digits, an int out of range).
_CONVERSION_ERRORS = (pa.ArrowException, ValueError, TypeError, OverflowError)


class _Reading:
    """A schema's payloads read a window at a time: each a datum, or the reason it is not."""

    def __init__(self, schema: AvroSchema, read_block: BlockReader, read_datum: DatumReader) -> None:
        self.marker = secrets.token_bytes(_MARKER_SIZE)  # no payload holds it but by a chance of 2^-128
        self.header = _container_header({**schema.wire, "fields": [*schema.wire["fields"], _marker_field()]})
        self.parsed = fastavro.parse_schema(schema.wire)
        self.read_block = read_block
        self.read_datum = read_datum

    def window(self, payloads: Sequence[bytes], start: int, end: int) -> tuple[dict[int, Any], dict[int, str]]:
        """Payloads `start` to `end`: those before the first bad one read in one block (they decoded
        exactly: the marker after each was read as the marker), the rest one by one."""
        decoded: dict[int, Any] = {}
        block = [datum for payload in payloads[start:end] for datum in (payload, self.marker)]
        container = io.BytesIO(_container(self.header, block, end - start))
        try:
            for index, row in enumerate(self.read_block(container), start):
                if row.pop(_MARKER) != self.marker:
                    break
                decoded[index] = row
        except DATUM_ERRORS:  # the datum after the last one read: it is read again alone, for its own reason
            pass
        rejected: dict[int, str] = {}
        for index in range(start + len(decoded), end):
            row, reason = self.alone(payloads[index])
            if reason is None:
                decoded[index] = row
            else:
                rejected[index] = reason
        return decoded, rejected

    def alone(self, payload: bytes) -> tuple[Any, str | None]:
        """The payload's datum, or why it is not one: an error, or bytes left after it."""
        stream = io.BytesIO(payload)
        try:
            row = self.read_datum(stream, self.parsed)
        except DATUM_ERRORS as error:
            return None, f"is not a datum of its Avro schema ({type(error).__name__}: {_without_addresses(error)})"
        return (row, None) if stream.tell() == len(payload) else (None, _NOT_AT_END)


def _without_addresses(error: Exception) -> str:
    """The error's message with the payload's stream in place of its address (fastavro names it by
    `repr`): the same batch gives the same reasons."""
    return _OBJECT_ADDRESS.sub("the payload", str(error))


def _arrow_table(struct: pa.StructType, decoded: dict[int, dict[str, Any]]) -> tuple[pa.Table, dict[int, str]]:
    """The rows as a table, in one conversion by pyarrow (faster than `Table.from_pylist`); when a value
    does not fit its column, the rows that hold one are found by halves and set aside with the reason."""
    try:
        return pa.Table.from_struct_array(pa.array(list(decoded.values()), struct)), {}
    except _CONVERSION_ERRORS:
        pass
    unfit = {index: _unfit_reason(struct, decoded[index]) for index in _unfit_rows(struct, list(decoded.items()))}
    fitting = [row for index, row in decoded.items() if index not in unfit]
    return pa.Table.from_struct_array(pa.array(fitting, struct)), unfit


def _unfit_rows(struct: pa.StructType, rows: list[tuple[int, dict[str, Any]]]) -> list[int]:
    """The indexes of the rows pyarrow cannot convert, by halves: n log n conversions for a few bad ones."""
    try:
        pa.array([row for _, row in rows], struct)
    except _CONVERSION_ERRORS:
        if len(rows) == 1:
            return [rows[0][0]]
        half = len(rows) // 2
        return _unfit_rows(struct, rows[:half]) + _unfit_rows(struct, rows[half:])
    return []


def _unfit_reason(struct: pa.StructType, row: dict[str, Any]) -> str:
    for field in struct:
        try:
            pa.array([row.get(field.name)], field.type)
        except _CONVERSION_ERRORS as error:
            return (
                f"is a datum of its Avro schema, but its field {field.name!r} holds a value its column cannot"
                f" hold ({type(error).__name__}: {error})"
            )
    return "is a datum of its Avro schema, but holds a value its columns cannot hold"


def _marker_field() -> dict[str, Any]:
    return {"name": _MARKER, "type": {"type": "fixed", "name": _MARKER, "size": _MARKER_SIZE}}


def _container_header(schema: Mapping[str, Any]) -> bytes:
    """An object container's header, with the null codec and a sync marker of zeros."""
    metadata = {"avro.schema": json.dumps(schema).encode(), "avro.codec": b"null"}
    entries = b"".join(_long(len(key)) + key.encode() + _long(len(value)) + value for key, value in metadata.items())
    return b"Obj\x01" + _long(len(metadata)) + entries + _long(0) + bytes(16)


def _container(header: bytes, datums: list[bytes], count: int) -> bytes:
    body = b"".join(datums)
    return b"".join((header, _long(count), _long(len(body)), body, bytes(16)))


def _long(value: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    number = (value << 1) ^ (value >> 63)
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


@dataclass(frozen=True)
class AvroDecoder:
    """`schema`: the writer schema's JSON text; or `schema_file`: a path to it, read where the job
    decodes (the first time it does), not where the pipeline is checked."""

    schema_text: str | None = None
    schema_file: str | None = None
    spec: str = NAME

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> AvroDecoder:
        unknown = sorted(set(options) - {"schema", "schema_file"})
        if unknown:
            raise ValueError(f"the avro decoder has no option {unknown[0]!r} (it takes: schema, schema_file)")
        if ("schema" in options) == ("schema_file" in options):
            raise ValueError("the avro decoder takes exactly one of the options schema and schema_file")
        if "schema_file" in options:
            path = options["schema_file"]
            if not isinstance(path, str) or not path.strip():
                raise ValueError(f"schema_file must be the path of a file holding the Avro schema, got {path!r}")
            return cls(schema_file=path)
        given = options["schema"]
        decoder = cls(schema_text=given if isinstance(given, str) else json.dumps(given))
        decoder.schema  # noqa: B018  # checked now, named by the option
        return decoder

    def options(self) -> dict[str, Any]:
        return {"schema": self.schema_text} if self.schema_file is None else {"schema_file": self.schema_file}

    @cached_property
    def schema(self) -> AvroSchema:
        """The writer schema; `ValueError` naming the option when it is not a record schema whose
        fields can be columns, or its file cannot be read."""
        where = "schema" if self.schema_file is None else f"schema_file {self.schema_file!r}"
        definition = self.schema_text
        if self.schema_file is not None:
            try:
                definition = Path(self.schema_file).read_text()
            except (OSError, UnicodeDecodeError) as error:
                raise ValueError(f"{where} cannot be read ({error})") from None
        schema = avro_schema(definition or "", where)
        clashes = sorted(set(schema.arrow.names) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
        if clashes:
            raise ValueError(f"{where} has a field named {clashes[0]!r}, which the batch has as a column already")
        return schema

    def columns(self) -> pa.Schema:
        return pa.schema([*POSITION_SCHEMA, *self._checked_schema().arrow])

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch:
        read = read_avro(self._checked_schema(), payloads_of(records))
        return DecodedBatch(rows_table(records, read), rejected_records(records, read.rejected, stream_name, shard_id))

    def _checked_schema(self) -> AvroSchema:
        try:
            return self.schema
        except ValueError as error:
            raise TransformError(self.spec, str(error), DECODER) from None


def rows_table(records: Sequence[KinesisRecord], decoded: PayloadRows) -> pa.Table:
    """The batch's table: each decoded row's record's positions, then its columns."""
    table = positions_of(records, decoded.rows)
    for field in decoded.table.schema:
        table = table.append_column(field, decoded.table.column(field.name))
    return table
