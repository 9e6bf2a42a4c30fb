"""The built-in `json` decoder: each record's payload is one JSON object, one row.

Chosen with `decode = "json"`. Its one option, `schema` (in `decode_options`), is a JSON Schema document
of an object (its `properties`, `required`) or a `pyarrow.Schema`; given one, every batch has exactly
those columns (other fields are ignored, a field absent is null) and a record whose value does not fit
its field is rejected, naming the field. Without one, each batch's columns are inferred from its
records, so a field first seen in a later batch becomes a new column (null in earlier rows, as the
sink evolves the table); within a batch, a record whose field's type conflicts with the type the
records before it gave that field is rejected, naming the field. Nested objects are structs, arrays
lists.

The batch's payloads are parsed at once by pyarrow's JSON reader (Arrow in, Arrow out): a payload's
line breaks are blanks (JSON allows none inside strings), and the payloads are joined one per line.
A record the reader refuses is found by the row its error names, set aside with that error, and the
rest parsed again: bad records cost a parse each, good batches one parse in all.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from lease_core.retrieval.kinesis_records import KinesisRecord, UserRecords
from sinks.record_columns import BATCH_COLUMNS, POSITION_COLUMNS, POSITION_SCHEMA, records_table
from spark_jobs.decode import DECODER, DecodedBatch, RejectedRecord, record_name
from spark_jobs.errors import TransformError

NAME = "json"
_ROW = re.compile(r" in row (\d+)$")
# JSON Schema's types, and the string formats with an Arrow type of their own. Not `date`: Arrow's
# JSON reader takes a date32 column from JSON numbers (days), so an ISO date string would be refused
# and a number taken for a date; a `date` string stays a string.
_SCALARS = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
_FORMATS = {"date-time": pa.timestamp("us", tz="UTC")}


def json_schema_to_arrow(document: Mapping[str, Any], where: str = "schema") -> pa.Schema:
    """The Arrow schema of a JSON Schema document of an object; `ValueError` naming the part that
    has no Arrow type (`where` is the path to it)."""
    struct = _arrow_type(document, where, top=True)
    if not pa.types.is_struct(struct):
        raise ValueError(f"{where} must describe an object (type 'object' with 'properties'), got {document!r}")
    return pa.schema(list(struct))


def _arrow_type(node: Any, where: str, top: bool = False) -> pa.DataType:
    """`node`'s Arrow type. Only the top object's `required` fields are not nullable: a nested one
    absent fails the reader without naming the record."""
    if not isinstance(node, Mapping):
        raise ValueError(f"{where} must be a JSON Schema object, got {node!r}")
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    kinds = [kind for kind in kinds if kind != "null"]
    if len(kinds) != 1:
        raise ValueError(f"{where} must have one type besides 'null', got {node.get('type')!r}")
    (kind,) = kinds
    if kind == "object":
        properties = node.get("properties")
        if not isinstance(properties, Mapping) or not properties:
            raise ValueError(f"{where} is an object without 'properties'")
        required = set(node.get("required") or ()) if top else set()
        return pa.struct(
            [
                pa.field(name, _arrow_type(child, f"{where}.{name}"), nullable=name not in required)
                for name, child in properties.items()
            ]
        )
    if kind == "array":
        return pa.list_(_arrow_type(node.get("items"), f"{where}[]"))
    if kind == "string" and node.get("format") in _FORMATS:
        return _FORMATS[node["format"]]
    if kind not in _SCALARS:
        raise ValueError(f"{where} has type {kind!r}, not one of object, array, {', '.join(_SCALARS)}")
    return _SCALARS[kind]


def arrow_schema_text(schema: pa.Schema) -> str:
    """A pyarrow schema as text that travels in the round's options (`parse_schema` reads it back)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def parse_schema(value: Any) -> pa.Schema | None:
    """The `schema` option: a JSON Schema document (a mapping), a pyarrow schema, or the text of one
    (`arrow_schema_text`); `ValueError` saying what is wrong."""
    if value is None:
        return None
    if isinstance(value, pa.Schema):
        return value
    if isinstance(value, Mapping):
        return json_schema_to_arrow(value)
    if isinstance(value, str):
        try:
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value, validate=True)))
        except (ValueError, pa.ArrowException):
            pass
    raise ValueError(f"schema must be a JSON Schema document or a pyarrow.Schema, got {value!r}")


@dataclass(frozen=True)
class JsonLines:
    """Payloads read as one JSON object each: the rows of those the reader took, `rows` (the index
    of each row's payload), and why each other payload was refused (by index)."""

    table: pa.Table
    rows: list[int]
    rejected: dict[int, str]


def read_json_lines(payloads: Sequence[bytes], parse: pa_json.ParseOptions, decoder: str) -> JsonLines:
    """The payloads through pyarrow's JSON reader in one parse, one payload a line. A payload it
    refuses is found by the row its error names, set aside with that error, and the rest read again.
    `TransformError` (naming `decoder`) when the reader fails without naming a row."""
    # An empty payload would be a blank line, which the reader skips: the rows after it would shift.
    rows = [index for index, payload in enumerate(payloads) if payload.strip()]
    rejected = dict.fromkeys(set(range(len(payloads))) - set(rows), "is empty, not a JSON object")
    while True:
        try:
            return JsonLines(_read([payloads[index] for index in rows], parse), rows, rejected)
        except pa.ArrowInvalid as error:
            found = _ROW.search(str(error))
            if found is None or int(found.group(1)) >= len(rows):
                raise TransformError(decoder, f"could not parse the batch ({error})", DECODER) from error
            # The row is the batch's, not the record's: the reason names the record instead.
            rejected[rows.pop(int(found.group(1)))] = _ROW.sub("", str(error).removeprefix("JSON parse error: "))


def _read(payloads: list[bytes], parse: pa_json.ParseOptions) -> pa.Table:
    if not payloads:
        return (parse.explicit_schema or pa.schema([])).empty_table()
    text = b"\n".join(payload.replace(b"\n", b" ").replace(b"\r", b" ") for payload in payloads)
    options = pa_json.ReadOptions(use_threads=False, block_size=len(text) + 1)  # one block: rows count from 0
    return pa_json.read_json(pa.py_buffer(text), read_options=options, parse_options=parse)


def payloads_of(records: Sequence[KinesisRecord]) -> list[bytes]:
    """The records' payloads: a read's (`UserRecords`, what the slots hand a decoder) from its data
    column at once, without a `KinesisRecord` per record; other records' one by one."""
    if isinstance(records, UserRecords):
        return records.table.column("data").to_pylist()
    return [record.data for record in records]


def positions_of(records: Sequence[KinesisRecord], rows: Sequence[int]) -> pa.Table:
    """The position columns of `records[row]` for each of `rows` (a record's repeated for each of its rows)."""
    return records_table(records).select(list(POSITION_COLUMNS)).take(pa.array(rows, pa.int64()))


def rejected_records(
    records: Sequence[KinesisRecord], reasons: Mapping[int, str], stream_name: str, shard_id: str
) -> tuple[RejectedRecord, ...]:
    """The records refused (by index), in order, each with its reason naming it."""
    return tuple(
        RejectedRecord(records[index], f"the payload of {record_name(records[index], stream_name, shard_id)} {why}")
        for index, why in sorted(reasons.items())
    )


@dataclass(frozen=True)
class JsonDecoder:
    schema: pa.Schema | None = None  # the decoded columns; None: inferred per batch
    spec: str = NAME

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> JsonDecoder:
        unknown = sorted(set(options) - {"schema"})
        if unknown:
            raise ValueError(f"the json decoder has no option {unknown[0]!r} (it takes: schema)")
        schema = parse_schema(options.get("schema"))
        clashes = sorted(set(schema.names if schema is not None else ()) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
        if clashes:
            raise ValueError(f"schema declares a column named {clashes[0]!r}, which the batch has already")
        return cls(schema)

    def options(self) -> dict[str, Any]:
        return {} if self.schema is None else {"schema": arrow_schema_text(self.schema)}

    def columns(self) -> pa.Schema | None:
        if self.schema is None:
            return None
        return pa.schema([*POSITION_SCHEMA, *self.schema])

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch:
        parse = pa_json.ParseOptions(
            explicit_schema=None if self.schema is None else _nullable(self.schema),
            unexpected_field_behavior="infer" if self.schema is None else "ignore",
        )
        read = read_json_lines(payloads_of(records), parse, self.spec)
        decoded, rows, rejected = read.table, read.rows, read.rejected
        missing = self._missing_required(decoded)
        for position in missing:
            rejected[rows[position]] = f"misses the required field {missing[position]!r}"
        if missing:
            decoded = decoded.filter(pa.array([position not in missing for position in range(decoded.num_rows)]))
            rows = [index for position, index in enumerate(rows) if position not in missing]
        if self.schema is not None:
            decoded = decoded.cast(self.schema)
        clashes = sorted(set(decoded.column_names) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
        if clashes:
            problem = f"decodes a field named {clashes[0]!r}, which the batch has as a column already"
            raise TransformError(self.spec, problem, DECODER)
        table = positions_of(records, rows)
        for field in decoded.schema:
            table = table.append_column(field, decoded.column(field.name))
        return DecodedBatch(table, rejected_records(records, rejected, stream_name, shard_id))

    def _missing_required(self, decoded: pa.Table) -> dict[int, str]:
        """Rows (by position) null in a field the schema requires, with that field: the reader reads
        every field as nullable, since it names no row for a required field that is absent."""
        missing: dict[int, str] = {}
        for field in self.schema or ():
            if not field.nullable:
                nulls = pc.indices_nonzero(pc.is_null(decoded.column(field.name))).to_pylist()
                missing.update((position, field.name) for position in nulls if position not in missing)
        return missing


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([field.with_nullable(True) for field in schema])
