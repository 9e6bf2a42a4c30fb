"""The user's per-record decode hook: a record's payload and metadata in, a row out.

For the common case of JSON, Avro or Protobuf payloads, a decoder is simpler than a batch transform:
a function named by a spec `package.module:function`, called once per user record (after KPL
deaggregation) as `decode(data, record)`, with `data` the payload bytes and `record` a
`RecordContext` (stream, shard, sequence and sub-sequence number, partition key, arrival time). It
returns the row as a mapping of column names to values, or None to leave the record out.

The batch's table holds the record's position columns (`sequence_number`, `sub_sequence_number`,
`partition_key`, `approximate_arrival_timestamp`), then the decoded columns. A decoder with a
`schema` attribute (a `pyarrow.Schema`) has its rows typed by it, the same in every batch; without
one, each batch's types are inferred from its rows. A record the decoder raises on, or whose row does
not fit the schema, is rejected: by default it fails its lease for the round with an error naming
the record (the lease stays at its checkpoint before that batch, so nothing is lost or skipped). A
batch transform, if there is one too, runs on the decoded table.

A pipeline that dead-letters bad records (`spark_jobs.dead_letters`) sets the rejected records aside
instead: `Decoder.decode_batch` tells them apart from the rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import pyarrow as pa

from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.record_columns import BATCH_COLUMNS, POSITION_COLUMNS, POSITION_SCHEMA
from spark_jobs.errors import FunctionLoadError, TransformError
from spark_jobs.transform import load_function


@dataclass(frozen=True)
class RecordContext:
    """What a decoder is told about the record whose payload it decodes."""

    stream_name: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    approximate_arrival_timestamp: datetime


DECODER = "decoder"  # the role errors name it by

DecodeFunction = Callable[[bytes, RecordContext], Mapping[str, Any] | None]


@dataclass(frozen=True)
class RejectedRecord:
    """A record the decoder could not make a row of: it raised, returned no mapping, or the row does
    not fit the decoder's schema. `error` says which, naming the record."""

    record: KinesisRecord
    error: str


@dataclass(frozen=True)
class DecodedBatch:
    """A batch through the decoder: the rows of the records it decoded, those it rejected, and how
    many it left out on purpose (it returned None for them)."""

    table: pa.Table
    rejected: tuple[RejectedRecord, ...]
    left_out: int = 0


class RecordDecoder(Protocol):
    """What the slots call a decoder: the user's function (`Decoder`) or a built-in one (`BUILT_IN_DECODERS`)."""

    @property
    def spec(self) -> str: ...  # how the round names it: `package.module:function`, or a built-in's name

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch: ...

    def columns(self) -> pa.Schema | None: ...


class BuiltInDecoder(RecordDecoder, Protocol):
    def options(self) -> dict[str, Any]: ...  # its options as JSON values, which `from_options` reads back


# The decoders chosen by name (`decode = "json"`): the module and class of each, imported when chosen.
# Each class has `from_options(options)` (its `decode_options`; `ValueError` naming what is wrong) and
# `options()` (them again as JSON values, what the round's options carry).
BUILT_IN_DECODERS = {
    "json": "spark_jobs.decoders.json_objects:JsonDecoder",
    "cloudwatch_logs": "spark_jobs.decoders.cloudwatch_logs:CloudWatchLogsDecoder",
    "dynamodb": "spark_jobs.decoders.dynamodb_changes:DynamoDbDecoder",
    "avro": "spark_jobs.decoders.avro_records:AvroDecoder",
    "protobuf": "spark_jobs.decoders.protobuf_messages:ProtobufDecoder",
    "glue_schema_registry": "spark_jobs.decoders.glue_schema_registry:GlueSchemaRegistryDecoder",
}


@dataclass(frozen=True)
class Decoder:
    spec: str
    function: DecodeFunction
    schema: pa.Schema | None  # the decoded columns' types; None: inferred per batch

    def table(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> pa.Table:
        """The batch's rows: each kept record's position columns and its decoded columns; a
        `TransformError` naming the first record the decoder rejects."""
        decoded = self.decode_batch(records, stream_name, shard_id)
        if decoded.rejected:
            raise TransformError(self.spec, decoded.rejected[0].error, DECODER)
        return decoded.table

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch:
        """The batch's rows and the records the decoder rejected, each with its error. A failure of
        the batch as a whole (rows whose inferred types conflict although each one alone is fine)
        raises `TransformError`."""
        kept: list[KinesisRecord] = []
        rows: list[Mapping[str, Any]] = []
        rejected: list[RejectedRecord] = []
        for record in records:
            try:
                row = self._decode(record, stream_name, shard_id)
            except TransformError as error:
                rejected.append(RejectedRecord(record, error.problem))
                continue
            if row is not None:
                kept.append(record)
                rows.append(row)
        left_out = len(records) - len(kept) - len(rejected)
        decoded, misfits = self._rows_table(rows, kept, stream_name, shard_id)
        if misfits:
            rejected = sorted([*rejected, *misfits], key=lambda rejection: rejection.record.position)
            kept = [record for record in kept if all(record is not misfit.record for misfit in misfits)]
        positions = pa.table(
            {name: [getattr(record, name) for record in kept] for name in POSITION_COLUMNS}, schema=POSITION_SCHEMA
        )
        for field in decoded.schema:
            positions = positions.append_column(field, decoded.column(field.name))
        return DecodedBatch(positions, tuple(rejected), left_out)

    def columns(self) -> pa.Schema | None:
        """The columns of every batch, when the decoder declares its schema; None otherwise."""
        if self.schema is None:
            return None
        return pa.schema([*POSITION_SCHEMA, *self.schema])

    def _decode(self, record: KinesisRecord, stream_name: str, shard_id: str) -> Mapping[str, Any] | None:
        context = RecordContext(
            stream_name,
            shard_id,
            record.sequence_number,
            record.sub_sequence_number,
            record.partition_key,
            record.approximate_arrival_timestamp,
        )
        try:
            row = self.function(record.data, context)
        except Exception as error:
            raise TransformError(
                self.spec,
                f"raised {type(error).__name__}: {error} on {record_name(record, stream_name, shard_id)}",
                DECODER,
            ) from error
        if row is not None and not isinstance(row, Mapping):
            raise TransformError(
                self.spec,
                f"returned an object of type {type(row).__name__!r}, not a mapping or None, "
                f"for {record_name(record, stream_name, shard_id)}",
                DECODER,
            )
        # A schema declares none of the batch's columns (`load_decoder`), and its rows keep only its own.
        clashes = sorted(set(row or ()) & {*POSITION_COLUMNS, *BATCH_COLUMNS}) if self.schema is None else []
        if clashes:
            raise TransformError(
                self.spec,
                f"decodes a column named {clashes[0]!r}, which the batch has already, "
                f"for {record_name(record, stream_name, shard_id)}",
                DECODER,
            )
        return row

    def _rows_table(
        self, rows: list[Mapping[str, Any]], records: list[KinesisRecord], stream_name: str, shard_id: str
    ) -> tuple[pa.Table, list[RejectedRecord]]:
        """The decoded rows as a table, and the records whose rows do not fit the decoder's schema
        (left out of the table)."""
        misfits: list[RejectedRecord] = []
        try:
            table = self._build(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
            # The batch's error names no row: find the rows that do not fit on their own.
            fitting = []
            for row, record in zip(rows, records, strict=True):
                try:
                    self._build([row])
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as misfit:
                    name = record_name(record, stream_name, shard_id)
                    misfits.append(
                        RejectedRecord(record, f"decoded a row that does not fit its schema ({misfit}) from {name}")
                    )
                else:
                    fitting.append(row)
            if not misfits:
                raise TransformError(self.spec, f"decoded rows that do not fit one table ({error})", DECODER) from error
            try:
                table = self._build(fitting)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as rest:  # the others conflict too
                raise TransformError(self.spec, f"decoded rows that do not fit one table ({rest})", DECODER) from rest
        return table, misfits

    def _build(self, rows: list[Mapping[str, Any]]) -> pa.Table:
        if self.schema is not None:
            return pa.Table.from_pylist(rows, schema=self.schema)
        names = list(dict.fromkeys(name for row in rows for name in row))  # every row's columns, not the first's
        return pa.table({name: [row.get(name) for row in rows] for name in names})


def built_in_decoder(name: str, options: Mapping[str, Any] | None) -> BuiltInDecoder:
    """The built-in decoder `name` with its `options`; `ValueError` naming the option that is wrong."""
    module, _, name_of_class = BUILT_IN_DECODERS[name].partition(":")
    decoder: BuiltInDecoder = getattr(importlib.import_module(module), name_of_class).from_options(options or {})
    return decoder


def load_decoder(spec: str | None, options: Mapping[str, Any] | None = None) -> RecordDecoder | None:
    """The decoder named by `spec`: a built-in's name (`BUILT_IN_DECODERS`) with its `options`, or the
    user's "package.module:function"; None when there is no spec."""
    if spec in BUILT_IN_DECODERS:
        try:
            return built_in_decoder(spec, options)
        except ValueError as error:
            raise FunctionLoadError(spec, str(error), DECODER) from None
    function = load_function(spec, DECODER)
    if spec is None or function is None:
        return None
    schema = getattr(function, "schema", None)
    if schema is not None and not isinstance(schema, pa.Schema):
        problem = f"has a 'schema' attribute of type {type(schema).__name__!r}, not a pyarrow.Schema"
        raise FunctionLoadError(spec, problem, DECODER)
    clashes = sorted(set(schema.names if schema is not None else ()) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
    if clashes:
        problem = f"declares a column named {clashes[0]!r}, which the batch has already"
        raise FunctionLoadError(spec, problem, DECODER)
    return Decoder(spec, function, schema)


def record_name(record: KinesisRecord, stream_name: str, shard_id: str) -> str:
    return f"record {record.sequence_number}/{record.sub_sequence_number} of {stream_name}/{shard_id}"
