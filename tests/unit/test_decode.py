"""The per-record decode hook: a user's function from a record's payload to a row, typed by its schema."""

from __future__ import annotations

import json
import sys
import types
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import POSITION_COLUMNS, RecordContext, load_decoder
from spark_jobs.errors import FunctionLoadError, TransformError
from spark_jobs.transform import batch_columns

ARRIVAL = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
ORDER = pa.schema([("order_id", pa.int64()), ("amount", pa.decimal128(10, 2)), ("customer", pa.string())])


def record(sequence: int, data: bytes, sub: int = 0) -> KinesisRecord:
    return KinesisRecord(str(sequence), sub, f"key-{sequence}", ARRIVAL, data)


def orders_json(data: bytes, record: RecordContext) -> dict[str, object] | None:
    document = json.loads(data)
    if document.get("test"):
        return None  # test orders are left out
    return {"order_id": document["id"], "amount": document["amount"], "customer": document["customer"]}


def untyped(data: bytes, record: RecordContext) -> dict[str, object]:
    return {"payload": data.decode(), "shard": record.shard_id, "sub": record.sub_sequence_number}


def not_a_row(data: bytes, record: RecordContext) -> list[bytes]:
    return [data]


def clashing(data: bytes, record: RecordContext) -> dict[str, object]:
    return {"partition_key": "mine"}


@pytest.fixture(autouse=True)
def users_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's decoders, as a module the spec names."""
    from decimal import Decimal

    def typed(data: bytes, record: RecordContext) -> dict[str, object] | None:
        row = orders_json(data, record)
        return row if row is None else {**row, "amount": Decimal(str(row["amount"]))}

    typed.schema = ORDER  # type: ignore[attr-defined]
    module = types.ModuleType("users_decoders")
    module.typed = typed  # type: ignore[attr-defined]
    module.untyped = untyped  # type: ignore[attr-defined]
    module.not_a_row = not_a_row  # type: ignore[attr-defined]
    module.clashing = clashing  # type: ignore[attr-defined]
    module.sparse = lambda data, record: json.loads(data)  # type: ignore[attr-defined]
    badly_declared = types.FunctionType(untyped.__code__, untyped.__globals__)
    badly_declared.schema = {"order_id": "long"}  # type: ignore[attr-defined]
    module.badly_declared = badly_declared  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "users_decoders", module)


def test_a_decoder_with_a_schema_types_the_decoded_columns_after_the_records_positions():
    decoder = load_decoder("users_decoders:typed")
    assert decoder is not None
    records = [
        record(101, b'{"id": 1, "amount": 9.5, "customer": "ada"}'),
        record(102, b'{"id": 2, "amount": 12, "customer": "bob", "test": true}'),
        record(103, b'{"id": 3, "amount": 0.25, "customer": "cy"}', sub=4),
    ]

    table = decoder.table(records, "orders", "shardId-000000000001")

    assert table.schema.names == [*POSITION_COLUMNS, "order_id", "amount", "customer"]
    assert table.schema.field("amount").type == pa.decimal128(10, 2)
    assert table.column("sequence_number").to_pylist() == ["101", "103"], "the test order is left out"
    assert table.column("sub_sequence_number").to_pylist() == [0, 4]
    assert [str(value) for value in table.column("amount").to_pylist()] == ["9.50", "0.25"]
    assert decoder.columns() == table.schema


def test_a_decoder_without_a_schema_has_its_columns_inferred_and_sees_the_records_metadata():
    decoder = load_decoder("users_decoders:untyped")
    assert decoder is not None and decoder.columns() is None
    table = decoder.table([record(7, b"hello", sub=2)], "clicks", "shardId-000000000004")
    assert table.select(["payload", "shard", "sub"]).to_pylist() == [
        {"payload": "hello", "shard": "shardId-000000000004", "sub": 2}
    ]
    assert batch_columns(None, None, decoder.columns()) is None, "its columns are checked at the first batch"


@pytest.mark.parametrize(
    ("spec", "payload", "complaint"),
    [
        (
            "users_decoders:typed",
            b"not json",
            r"decoder 'users_decoders:typed': raised JSONDecodeError: .* on record 9/0 of orders/shardId-0+1",
        ),
        (
            "users_decoders:typed",
            b'{"id": "nine", "amount": 1, "customer": "x"}',
            r"decoded a row that does not fit its schema \(.*\) from record 9/0 of orders/shardId-000000000001",
        ),
        ("users_decoders:not_a_row", b"x", r"returned an object of type 'list', not a mapping or None, for record 8/0"),
        (
            "users_decoders:clashing",
            b"x",
            r"decodes a column named 'partition_key', which the batch has already, for record 8/0",
        ),
    ],
    ids=["it raises", "its row does not fit its schema", "it returns no row", "its column clashes"],
)
def test_a_record_the_decoder_cannot_handle_fails_the_batch_naming_the_record(spec, payload, complaint):
    decoder = load_decoder(spec)
    assert decoder is not None
    with pytest.raises(TransformError, match=complaint) as raised:
        decoder.table(
            [record(8, b'{"id": 8, "amount": 1, "customer": "z"}'), record(9, payload)],
            "orders",
            "shardId-000000000001",
        )
    assert raised.value.retryable is False, "the same record fails the same way again"


def test_a_row_with_a_column_the_batch_has_rejects_its_record_and_the_rest_of_the_batch_decodes():
    decoder = load_decoder("users_decoders:sparse")
    assert decoder is not None
    payloads = [b'{"a": 1}', b'{"a": 2, "shard_id": "mine"}', b'{"a": 3}']
    decoded = decoder.decode_batch([record(n, payload) for n, payload in enumerate(payloads)], "orders", "shardId-0")
    assert decoded.table.select(["sequence_number", "a"]).to_pylist() == [
        {"sequence_number": "0", "a": 1},
        {"sequence_number": "2", "a": 3},
    ]
    [rejected] = decoded.rejected
    assert rejected.error == (
        "decodes a column named 'shard_id', which the batch has already, for record 1/0 of orders/shardId-0"
    )


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("users_decoders:badly_declared", r"has a 'schema' attribute of type 'dict', not a pyarrow.Schema"),
        ("users_decoders:missing", r"module 'users_decoders' has no attribute 'missing'"),
        ("users_decoders", r"is not of the form 'package.module:function'"),
    ],
    ids=["a schema that is not one", "no such function", "no function named"],
)
def test_a_decoder_that_cannot_be_used_is_refused_when_loaded_naming_it_as_the_decoder(spec, complaint):
    with pytest.raises(FunctionLoadError, match=complaint) as raised:
        load_decoder(spec)
    assert str(raised.value).startswith(f"decoder {spec!r} cannot be loaded: ")


def test_a_transform_runs_on_what_the_decoder_made_and_the_columns_are_told_before_any_data():
    decoder = load_decoder("users_decoders:typed")
    assert decoder is not None

    def with_total(table: pa.Table) -> pa.Table:
        return table.append_column("large", pa.compute.greater(table.column("order_id"), 100))

    columns = batch_columns("users:with_total", with_total, decoder.columns())
    assert columns is not None and columns.names == [*POSITION_COLUMNS, "order_id", "amount", "customer", "large"]


def test_a_decoder_without_a_schema_keeps_every_rows_columns_not_the_first_rows_alone():
    decoder = load_decoder("users_decoders:sparse")
    assert decoder is not None
    table = decoder.table([record(1, b'{"a": 1}'), record(2, b'{"b": "x"}')], "s", "shardId-000000000001")
    assert table.select(["a", "b"]).to_pylist() == [{"a": 1, "b": None}, {"a": None, "b": "x"}]


def test_a_batch_decoded_for_dead_letters_keeps_the_good_rows_and_names_every_rejected_record_in_order():
    decoder = load_decoder("users_decoders:typed")
    assert decoder is not None
    records = [
        record(1, b'{"id": 1, "amount": 1, "customer": "a"}'),
        record(2, b'{"id": "two", "amount": 1, "customer": "b"}'),  # does not fit the schema
        record(3, b"not json"),  # raises
        record(4, b'{"id": 4, "amount": 2, "customer": "d"}'),
    ]

    decoded = decoder.decode_batch(records, "orders", "shardId-000000000001")

    assert decoded.table.column("order_id").to_pylist() == [1, 4]
    assert [rejection.record.sequence_number for rejection in decoded.rejected] == ["2", "3"]
    assert "does not fit its schema" in decoded.rejected[0].error and "record 2/0" in decoded.rejected[0].error
    assert "raised JSONDecodeError" in decoded.rejected[1].error and "record 3/0" in decoded.rejected[1].error


def test_rows_whose_inferred_types_conflict_although_each_fits_alone_fail_the_batch_as_a_whole():
    decoder = load_decoder("users_decoders:sparse")
    assert decoder is not None
    with pytest.raises(TransformError, match="decoded rows that do not fit one table"):
        decoder.decode_batch([record(1, b'{"a": 1}'), record(2, b'{"a": "x"}')], "s", "shardId-000000000001")
