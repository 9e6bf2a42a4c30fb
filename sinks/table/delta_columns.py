"""Pure: which Delta types hold a batch's columns, and which tables the Delta sink can write as their
protocol asks (`sinks.table.delta`).

Types. A batch's columns come from the record columns, a decoder or a transform, in whatever Arrow
encoding made them: Polars' `large_string` or `string_view`, pandas' categories (`dictionary`) and
nanosecond timestamps, unsigned integers. Delta has one type for each of those values: `string`,
`binary`, `array`, `timestamp` (microseconds, UTC) or `timestamp_ntz`, and a signed integer wide enough
for the unsigned one. `delta_type` is that type in Arrow; the sink creates a table with it, compares
a batch with an existing table by it, and casts each file's columns to the table's (a timestamp's
nanoseconds are cut to microseconds, all a Delta timestamp keeps). A nanosecond timestamp must not
become delta-rs' own `timestamp_nanos`: that needs the reader feature `timestampNanos`, which neither
delta-rs' reader nor Spark reads. A value no Delta type holds (a duration, a time of day, an unsigned
64-bit integer) is refused, naming the column, before the table is created.

Tables. The sink writes its Parquet files itself and adds them to the log, so it refuses, before any
lease moves, a table that asks its writers for what it does not do: column mapping (data files name
columns by their physical names; Spark would read the sink's files as nulls), CHECK constraints, NOT
NULL on a column the batches lack, generated and identity columns, invariants, and row tracking.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import Schema as DeltaSchema

_WIDER_SIGNED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}
_WIDENINGS = frozenset(
    {
        (pa.int8(), pa.int16()),
        (pa.int8(), pa.int32()),
        (pa.int8(), pa.int64()),
        (pa.int16(), pa.int32()),
        (pa.int16(), pa.int64()),
        (pa.int32(), pa.int64()),
        (pa.float32(), pa.float64()),
    }
)
# Field metadata by which a Delta table asks its writers to compute or check a column's values.
_COMPUTED_COLUMN_KEYS = {
    "delta.generationExpression": "a generated column",
    "delta.identity.start": "an identity column",
    "delta.invariants": "a column with an invariant",
}


class NoDeltaType(ValueError):
    """No Delta type holds the values of an Arrow type."""


def delta_type(batch: pa.DataType) -> pa.DataType:
    """The Arrow type of the Delta type that holds every value of `batch` (module doc); `NoDeltaType`."""
    if pa.types.is_dictionary(batch):
        return delta_type(batch.value_type)
    if pa.types.is_timestamp(batch):
        return pa.timestamp("us", "UTC" if batch.tz else None)
    if pa.types.is_large_string(batch) or pa.types.is_string_view(batch):
        return pa.string()
    if pa.types.is_large_binary(batch) or pa.types.is_binary_view(batch) or pa.types.is_fixed_size_binary(batch):
        return pa.binary()
    if batch in _WIDER_SIGNED:
        return _WIDER_SIGNED[batch]
    if pa.types.is_uint64(batch):
        raise NoDeltaType("no Delta type holds unsigned 64-bit integers (Delta's long is signed)")
    if pa.types.is_float16(batch):
        return pa.float32()
    if pa.types.is_date64(batch):
        return pa.date32()
    if pa.types.is_decimal256(batch) and batch.precision <= 38:
        return pa.decimal128(batch.precision, batch.scale)
    if _is_list(batch):
        return pa.list_(batch.value_field.with_type(delta_type(batch.value_type)).with_name("element"))
    if pa.types.is_map(batch):
        return pa.map_(delta_type(batch.key_type), batch.item_field.with_type(delta_type(batch.item_type)))
    if pa.types.is_struct(batch):
        return pa.struct([field.with_type(delta_type(field.type)) for field in batch])
    try:
        DeltaSchema.from_arrow(pa.schema([pa.field("column", batch)]))
    except Exception as error:  # delta-rs raises a bare Exception for a type it has no Delta type for
        raise NoDeltaType(f"no Delta type holds {batch} ({str(error).splitlines()[0]})") from None
    return batch


def widens_to(batch: pa.DataType, table: pa.DataType) -> bool:
    """Whether the table's type holds every value of the batch's without loss, compared as Delta types
    (`delta_type`, whose `NoDeltaType` it raises)."""
    held, holder = delta_type(batch), delta_type(table)
    if held == holder:
        return True
    if pa.types.is_timestamp(held) and pa.types.is_timestamp(holder):
        return (held.tz is None) == (holder.tz is None)
    return (held, holder) in _WIDENINGS


def unhonoured_requirement(
    configuration: Mapping[str, str | None], writer_features: Iterable[str], fields: Sequence[Any]
) -> str | None:
    """What the table asks of its writers that the sink does not do (module doc), or None. `fields`:
    the table's Delta fields (name, metadata)."""
    mode = configuration.get("delta.columnMapping.mode") or "none"
    if mode != "none":
        return (
            f"the table uses column mapping (delta.columnMapping.mode = {mode}): its data files name columns by "
            "physical names, and this sink writes files by the columns' names"
        )
    constraints = sorted(
        key.removeprefix("delta.constraints.") for key in configuration if key.startswith("delta.constraints.")
    )
    if constraints:
        return f"the table has CHECK constraints {constraints}, which this sink does not check"
    if configuration.get("delta.enableRowTracking") == "true" or "rowTracking" in writer_features:
        return "the table tracks row ids (row tracking), which this sink does not assign"
    for field in fields:
        for key, what in _COMPUTED_COLUMN_KEYS.items():
            if key in (field.metadata or {}):
                return f"column {field.name!r} is {what}, which this sink does not compute or check"
    return None


def _is_list(batch: pa.DataType) -> bool:
    return (
        pa.types.is_list(batch)
        or pa.types.is_large_list(batch)
        or pa.types.is_fixed_size_list(batch)
        or pa.types.is_list_view(batch)
        or pa.types.is_large_list_view(batch)
    )
