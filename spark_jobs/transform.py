"""The user transform: an optional function the consume job applies to each batch before staging it.

A transform is named by a spec `package.module:function` and called once per batch with a table of
the record columns (`sinks.record_columns`: sequence_number, sub_sequence_number,
partition_key, approximate_arrival_timestamp, data, explicit_hash_key) plus the batch's `stream_name`
and `shard_id` (constant columns, so one transform can tell streams apart), one row per user record
in shard order. The consume job drops `stream_name` and `shard_id` from the result again: the sink
takes them from the batch. The transform may filter rows and add, drop or convert columns; it must
return a `pyarrow.Table`, and it should be deterministic, because a retried batch must stage the
same rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sinks.record_columns import BATCH_COLUMNS, RECORD_SCHEMA
from spark_jobs.errors import FunctionLoadError, TransformError

Transform = Callable[[pa.Table], pa.Table]


def load_transform(spec: str | None) -> Transform | None:
    """The transform named by `spec` ("package.module:function"), or None when there is no spec."""
    return load_function(spec, "transform")


def load_function(spec: str | None, role: str) -> Any:
    """The function named by `spec` ("package.module:function"), or None when there is no spec;
    `FunctionLoadError` naming it as the `role` it plays (decoder, transform) and why otherwise."""
    if spec is None:
        return None
    module_name, _, function_name = spec.partition(":")
    if not (all(part.isidentifier() for part in module_name.split(".")) and function_name.isidentifier()):
        raise FunctionLoadError(spec, "is not of the form 'package.module:function'", role)
    module = _import(spec, module_name, role)
    try:
        function = getattr(module, function_name)
    except AttributeError:
        raise FunctionLoadError(spec, f"module {module_name!r} has no attribute {function_name!r}", role) from None
    if not callable(function):
        raise FunctionLoadError(
            spec, f"{function_name!r} is not callable (it is of type {type(function).__name__!r})", role
        )
    return function


def _import(spec: str, module_name: str, role: str) -> object:
    try:
        return importlib.import_module(module_name)
    except Exception as error:
        # Only the module itself (or a package above it) missing means the spec names nothing; any
        # other failure is the module's own, and its message says what the module lacked.
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        if missing is not None and (module_name + ".").startswith(missing + "."):
            raise FunctionLoadError(spec, str(error), role) from error
        raise FunctionLoadError(
            spec, f"importing {module_name!r} raised {type(error).__name__}: {error}", role
        ) from error


def apply_transform(spec: str, transform: Transform, table: pa.Table) -> pa.Table:
    """`transform(table)`, with every failure of the transform turned into a TransformError naming `spec`."""
    try:
        result = transform(table)
    except Exception as error:
        raise TransformError(spec, f"raised {type(error).__name__}: {error}") from error
    if not isinstance(result, pa.Table):
        raise TransformError(spec, f"returned an object of type {type(result).__name__!r}, not a pyarrow.Table")
    return result


def transformed(table: pa.Table, stream_name: str, shard_id: str, spec: str, transform: Transform) -> pa.Table:
    """A batch's record table through `transform`, which also sees the batch columns (stream_name,
    shard_id) so that it can tell streams apart; they are dropped again because the sink takes them
    from the batch."""
    for name, value in (("stream_name", stream_name), ("shard_id", shard_id)):
        table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
    table = apply_transform(spec, transform, table)
    return table.drop_columns([name for name in BATCH_COLUMNS if name in table.column_names])


def batch_columns(
    spec: str | None, transform: Transform | None, decoded: pa.Schema | None = RECORD_SCHEMA
) -> pa.Schema | None:
    """The columns a batch will have, told before any data is read: the record columns (or `decoded`,
    a decoder's, None when it declares none), or what the transform makes of a batch without rows.
    None when that cannot be told (the columns are then checked when the first batch is staged)."""
    if decoded is None:
        return None
    if spec is None or transform is None:
        return decoded
    try:
        return transformed(decoded.empty_table(), "", "", spec, transform).schema
    except TransformError:
        return None
