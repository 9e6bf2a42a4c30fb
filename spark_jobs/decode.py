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
not fit the schema, fails its lease for the round with an error naming the record (the lease stays
at its checkpoint before that batch, so nothing is lost or skipped). A batch transform, if there is
one too, runs on the decoded table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.errors import TransformError
from spark_jobs.sinks.record_columns import BATCH_COLUMNS, RECORD_SCHEMA
from spark_jobs.transform import load_function

# The record columns a decoded batch keeps: where each row came from (the payload is decoded instead).
POSITION_COLUMNS = ("sequence_number", "sub_sequence_number", "partition_key", "approximate_arrival_timestamp")
POSITION_SCHEMA = pa.schema([RECORD_SCHEMA.field(name) for name in POSITION_COLUMNS])


@dataclass(frozen=True)
class RecordContext:
    """What a decoder is told about the record whose payload it decodes."""

    stream_name: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    approximate_arrival_timestamp: datetime


DecodeFunction = Callable[[bytes, RecordContext], Mapping[str, Any] | None]


@dataclass(frozen=True)
class Decoder:
    spec: str
    function: DecodeFunction
    schema: pa.Schema | None  # the decoded columns' types; None: inferred per batch

    def table(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> pa.Table:
        """The batch's rows: each kept record's position columns and its decoded columns."""
        kept: list[KinesisRecord] = []
        rows: list[Mapping[str, Any]] = []
        for record in records:
            row = self._decode(record, stream_name, shard_id)
            if row is not None:
                kept.append(record)
                rows.append(row)
        positions = pa.table(
            {name: [getattr(record, name) for record in kept] for name in POSITION_COLUMNS}, schema=POSITION_SCHEMA
        )
        decoded = self._rows_table(rows, kept, stream_name, shard_id)
        for field in decoded.schema:
            positions = positions.append_column(field, decoded.column(field.name))
        return positions

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
                self.spec, f"raised {type(error).__name__}: {error} on {_record_name(record, stream_name, shard_id)}"
            ) from error
        if row is not None and not isinstance(row, Mapping):
            raise TransformError(
                self.spec,
                f"returned an object of type {type(row).__name__!r}, not a mapping or None, "
                f"for {_record_name(record, stream_name, shard_id)}",
            )
        return row

    def _rows_table(
        self, rows: list[Mapping[str, Any]], records: list[KinesisRecord], stream_name: str, shard_id: str
    ) -> pa.Table:
        try:
            if self.schema is not None:
                table = pa.Table.from_pylist(rows, schema=self.schema)
            else:  # every row's columns, not the first row's alone
                names = list(dict.fromkeys(name for row in rows for name in row))
                table = pa.table({name: [row.get(name) for row in rows] for name in names})
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
            raise TransformError(self.spec, self._first_misfit(rows, records, stream_name, shard_id, error)) from error
        clashes = sorted(set(table.column_names) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
        if clashes:
            raise TransformError(self.spec, f"decodes a column named {clashes[0]!r}, which the batch has already")
        return table

    def _first_misfit(
        self,
        rows: list[Mapping[str, Any]],
        records: list[KinesisRecord],
        stream_name: str,
        shard_id: str,
        error: Exception,
    ) -> str:
        """Which record's row does not fit (the batch's error names none)."""
        for row, record in zip(rows, records, strict=True):
            try:
                pa.Table.from_pylist([row], schema=self.schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as misfit:
                name = _record_name(record, stream_name, shard_id)
                return f"decoded a row that does not fit its schema ({misfit}) from {name}"
        return f"decoded rows that do not fit one table ({error})"


def load_decoder(spec: str | None) -> Decoder | None:
    """The decoder named by `spec` ("package.module:function"), or None when there is no spec."""
    function = load_function(spec)
    if spec is None or function is None:
        return None
    schema = getattr(function, "schema", None)
    if schema is not None and not isinstance(schema, pa.Schema):
        raise TransformError(spec, f"has a 'schema' attribute of type {type(schema).__name__!r}, not a pyarrow.Schema")
    clashes = sorted(set(schema.names if schema is not None else ()) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
    if clashes:
        raise TransformError(spec, f"declares a column named {clashes[0]!r}, which the batch has already")
    return Decoder(spec, function, schema)


def _record_name(record: KinesisRecord, stream_name: str, shard_id: str) -> str:
    return f"record {record.sequence_number}/{record.sub_sequence_number} of {stream_name}/{shard_id}"
