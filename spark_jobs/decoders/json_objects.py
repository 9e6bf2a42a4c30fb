"""The built-in `json` decoder: each record's payload is one JSON object, one row.

Chosen with `decode = "json"`. Its one option, `schema` (in `decode_options`), is a JSON Schema document
of an object (its `properties`, `required`) or a `pyarrow.Schema`; given one, every batch has exactly
those columns (other fields are ignored, a field absent is null) and a record whose value does not fit
its field is rejected, naming the field. Without one, each batch's columns are inferred from its
records, so a field first seen in a later batch becomes a new column (null in earlier rows, as the
sink evolves the table), and a field's type is settled so as not to depend on the values a batch
happens to hold (`settled_type`): every number is float64, a string stays a string, a field with no
value yet is left out. Within a batch, a record whose field's type conflicts with the type the records
before it gave that field is rejected, naming the field; so is a record with a field named like a
column the batch has already. Nested objects are structs, arrays lists.

The batch's payloads are parsed at once by pyarrow's JSON reader (Arrow in, Arrow out): a payload's
line breaks are blanks (JSON allows none inside strings), and the payloads are joined one per line.
A batch the reader refuses is read again in windows that start after each bad payload, which is set
aside with the reader's error (`read_json_lines`): good batches cost one parse, bad records a few
short reads each, never a parse of the whole batch each.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping, Sequence
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
class PayloadRows:
    """A batch's payloads read by one of the built-in readers (JSON, Avro, Protobuf): the table of the
    rows of those it read, `rows` (the index of each row's payload), and why each other payload was
    refused (by index)."""

    table: pa.Table
    rows: list[int]
    rejected: dict[int, str]


# How payloads are read: `read_payloads` (one parse, one payload a line), or a stand-in that counts the parses.
PayloadReader = Callable[[list[bytes], pa_json.ParseOptions], pa.Table]


def read_json_lines(
    payloads: Sequence[bytes], parse: pa_json.ParseOptions, decoder: str, read: PayloadReader | None = None
) -> PayloadRows:
    """The payloads through pyarrow's JSON reader, one payload a line: one parse when it takes them all.

    Otherwise they are read again in windows, in order, each twice as long as the last one the reader
    took. A window it refuses at a row its error names: the payloads before that row are read, the one
    at it is read alone (and refused with the reader's error when it fails alone), and the next window
    starts after it, short again. A window refused with no row named (a value the schema's type cannot
    take) is halved until each bad payload is alone. So k bad payloads among n cost at most 3n + 33k
    payloads read, not k reads of the whole batch.

    Parts read apart are joined with their types promoted as one parse would (an integer column and a
    float one make a float one). When their inferred types conflict (a field a number in one part and
    a string in another, or a payload that fits alone but not after the payloads of its window), they
    are read again together, and the first payload whose field conflicts with those before it is
    refused, naming the field: a parse per conflicting payload. `TransformError` (naming `decoder`)
    only when payloads that each read alone fail together without a row named."""
    # An empty payload would be a blank line, which the reader skips: the rows after it would shift.
    rows = [index for index, payload in enumerate(payloads) if payload.strip()]
    rejected = dict.fromkeys(set(range(len(payloads))) - set(rows), "is empty, not a JSON object")
    reader = _PartReader(payloads, parse, decoder, read or read_payloads, rejected)
    try:
        return PayloadRows(reader.read_rows(rows), rows, rejected)
    except pa.ArrowInvalid:  # some payloads are bad: find them
        rows, table = reader.in_windows(rows)
    return PayloadRows(reader.in_one_parse(rows) if table is None else table, rows, rejected)


# The first window after a refused one. A read costs about as much as 50 payloads' parsing besides
# (40 us): a short window keeps a run of bad payloads cheap, doubling keeps good ones at few reads.
_FIRST_WINDOW = 32

# Payloads (by index) and their table; None when their inferred types conflict, so that only reading
# them together says which to refuse (`_PartReader.in_one_parse`).
_Part = tuple[list[int], pa.Table | None]


@dataclass(frozen=True)
class _PartReader:
    payloads: Sequence[bytes]
    parse: pa_json.ParseOptions
    decoder: str
    read: PayloadReader
    rejected: dict[int, str]  # filled in as payloads are refused

    def in_windows(self, rows: list[int]) -> _Part:
        """The rows the reader takes, in windows (`read_json_lines`); the others refused."""
        parts: list[_Part] = []
        start, width = 0, _FIRST_WINDOW
        while start < len(rows):
            window = rows[start : start + width]
            try:
                parts.append((window, self.read_rows(window)))
                start, width = start + len(window), width * 2
                continue
            except pa.ArrowInvalid as error:
                failed = _named_row(error, len(window))
            if failed is None:
                parts.append(self.halved(window))
                start += len(window)
            else:  # the rows before the one named are good; that one is bad alone, or conflicts
                parts += [self.halved(window[:failed]), self.halved(window[failed : failed + 1])]
                start += failed + 1
            width = _FIRST_WINDOW
        return self._joined(parts)

    def halved(self, rows: list[int]) -> _Part:
        """The rows the reader takes, halving the parts it refuses; a payload it refuses alone refused."""
        try:
            return rows, self.read_rows(rows)
        except pa.ArrowInvalid as error:
            if len(rows) == 1:
                self.rejected[rows[0]] = _reason(error)
                return [], self.read_rows([])
        middle = len(rows) // 2
        return self._joined([self.halved(rows[:middle]), self.halved(rows[middle:])])

    def in_one_parse(self, rows: list[int]) -> pa.Table:
        """The rows read together, each row the reader's error names (a field whose type conflicts with
        the rows before it) refused and the rest read again: a parse per conflicting payload."""
        while True:
            try:
                return self.read_rows(rows)
            except pa.ArrowInvalid as error:
                failed = _named_row(error, len(rows))
                if failed is None:
                    raise TransformError(self.decoder, f"could not parse the batch ({error})", DECODER) from error
                self.rejected[rows.pop(failed)] = _reason(error)

    def read_rows(self, rows: list[int]) -> pa.Table:
        if not rows:
            return (self.parse.explicit_schema or pa.schema([])).empty_table()
        return self.read([self.payloads[index] for index in rows], self.parse)

    def _joined(self, parts: list[_Part]) -> _Part:
        rows = [row for part_rows, _ in parts for row in part_rows]
        tables = [table for part_rows, table in parts if part_rows]
        known = [table for table in tables if table is not None]
        if len(known) < len(tables):
            return rows, None
        if not known:
            return rows, self.read_rows([])
        try:
            return rows, pa.concat_tables(known, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return rows, None


def _named_row(error: pa.ArrowInvalid, rows: int) -> int | None:
    """The row (of a part of `rows` rows) the reader's error names; None when it names none."""
    found = _ROW.search(str(error))
    return int(found.group(1)) if found is not None and int(found.group(1)) < rows else None


def _reason(error: pa.ArrowInvalid) -> str:
    # The row is the part's, not the record's: the reason names the record instead.
    return _ROW.sub("", str(error).removeprefix("JSON parse error: "))


def read_payloads(payloads: list[bytes], parse: pa_json.ParseOptions) -> pa.Table:
    """The payloads in one parse of pyarrow's JSON reader, one payload a line."""
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
        payloads = payloads_of(records)
        read = read_json_lines(payloads, parse, self.spec)
        decoded, rows, rejected = read.table, read.rows, read.rejected
        if self.schema is None:
            decoded = _strings_as_written(decoded, [payloads[index] for index in rows], self.spec)
        misfits = self._missing_required(decoded) if self.schema is not None else _unsettled_rows(decoded)
        for position, why in misfits.items():
            rejected[rows[position]] = why
        if misfits:
            decoded = decoded.filter(pa.array([position not in misfits for position in range(decoded.num_rows)]))
            rows = [index for position, index in enumerate(rows) if position not in misfits]
        settled = self.schema or settled_schema(decoded.schema)
        decoded = decoded.select(settled.names).cast(settled)
        table = positions_of(records, rows)
        for field in decoded.schema:
            table = table.append_column(field, decoded.column(field.name))
        return DecodedBatch(table, rejected_records(records, rejected, stream_name, shard_id))

    def _missing_required(self, decoded: pa.Table) -> dict[int, str]:
        """Rows (by position) null in a field the schema requires, with why: the reader reads
        every field as nullable, since it names no row for a required field that is absent."""
        missing: dict[int, str] = {}
        for field in self.schema or ():
            if not field.nullable:
                nulls = pc.indices_nonzero(pc.is_null(decoded.column(field.name))).to_pylist()
                why = f"misses the required field {field.name!r}"
                missing.update((position, why) for position in nulls if position not in missing)
        return missing


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([field.with_nullable(True) for field in schema])


# Inferred types, settled so that every batch gives a field the same column type whatever values it
# happens to hold (docs/decoders.md, "Without a schema"): the sinks add a batch's new columns to the
# table, but refuse a column whose type changed (Iceberg cannot promote a long to a double).


def settled_type(inferred: pa.DataType) -> pa.DataType | None:
    """The type a field the reader inferred as `inferred` lands as; None: left out (no value yet).
    JSON has one number type: a float64 column, whether this batch's values had fractions or not.
    A string the reader took for a timestamp stays the string (`_strings_as_written`)."""
    if pa.types.is_null(inferred):
        return None
    if pa.types.is_integer(inferred):
        return pa.float64()
    if pa.types.is_timestamp(inferred):
        return pa.string()
    if pa.types.is_struct(inferred):
        fields = [field.with_type(kept) for field in inferred if (kept := settled_type(field.type)) is not None]
        return pa.struct(fields) if fields else None
    if pa.types.is_list(inferred):
        element = settled_type(inferred.value_type)
        return None if element is None else pa.list_(inferred.value_field.with_type(element))
    return inferred


def settled_schema(inferred: pa.Schema) -> pa.Schema:
    """The batch's columns as they land: each field's `settled_type`, a field without one, or named like
    a column the batch has already (its records are rejected, `_unsettled_rows`), left out."""
    taken = {*POSITION_COLUMNS, *BATCH_COLUMNS}
    return pa.schema(
        [
            field.with_type(kept)
            for field in inferred
            if field.name not in taken and (kept := settled_type(field.type)) is not None
        ]
    )


def _strings_as_written(decoded: pa.Table, payloads: list[bytes], decoder: str) -> pa.Table:
    """The payloads read again, with the fields the reader took for timestamps read as strings: only
    some strings look like timestamps to it, and a field's type must not depend on which a batch has."""
    wanted = pa.schema([field.with_type(_timestamps_as_strings(field.type)) for field in decoded.schema])
    if wanted == decoded.schema:
        return decoded
    read = read_json_lines(payloads, pa_json.ParseOptions(explicit_schema=wanted), decoder)
    if read.rejected:  # the payloads were read with the types asked for, which only widen
        raise TransformError(decoder, f"could not read the batch again ({next(iter(read.rejected.values()))})", DECODER)
    return read.table


def _timestamps_as_strings(inferred: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(inferred):
        return pa.string()
    if pa.types.is_struct(inferred):
        return pa.struct([field.with_type(_timestamps_as_strings(field.type)) for field in inferred])
    if pa.types.is_list(inferred):
        return pa.list_(inferred.value_field.with_type(_timestamps_as_strings(inferred.value_type)))
    return inferred


def _unsettled_rows(decoded: pa.Table) -> dict[int, str]:
    """Rows (by position) whose values cannot land in their settled columns, with why: a value for a
    field named like a column the batch has already, or an integer beyond 2**53 (a float64 holds it
    only rounded)."""
    unsettled: dict[int, str] = {}
    for field in decoded.schema:
        if field.name in {*POSITION_COLUMNS, *BATCH_COLUMNS}:
            why = f"has a field named {field.name!r}, which the batch has as a column already"
            for position in pc.indices_nonzero(pc.is_valid(decoded.column(field.name))).to_pylist():
                unsettled.setdefault(position, why)
            continue
        kept = settled_type(field.type)
        if kept is None or _casts(decoded.column(field.name), kept):
            continue
        why = f"has an integer in field {field.name!r} beyond 2**53, which its float64 column holds only rounded"
        for position in range(decoded.num_rows):  # only when the column fails: find its rows
            if not _casts(decoded.column(field.name).slice(position, 1), kept):
                unsettled.setdefault(position, why)
    return unsettled


def _casts(column: pa.ChunkedArray, wanted: pa.DataType) -> bool:
    try:
        column.cast(wanted)
    except pa.ArrowInvalid:
        return False
    return True
