"""The built-in cloudwatch_logs decoder: one row per log event, control messages left out and counted."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import load_decoder
from tests.support.cloudwatch_logs import control_message, data_message, log_events

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def records(*payloads: bytes) -> list[KinesisRecord]:
    return [KinesisRecord(str(100 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]


def decoded(*payloads: bytes):
    decoder = load_decoder("cloudwatch_logs")
    assert decoder is not None
    return decoder.decode_batch(records(*payloads), "logs", "shardId-0")


def test_each_log_event_is_a_row_keyed_by_its_records_position_with_the_envelopes_fields():
    batch = decoded(
        data_message("/app/web", "i-1", log_events("/app/web", 0, 3)),
        data_message("/app/db", "i-2", log_events("/app/db", 3, 1)),
    )
    assert batch.rejected == () and batch.left_out == 0
    table = batch.table
    assert table.schema == load_decoder("cloudwatch_logs").columns()
    assert table.column("sequence_number").to_pylist() == ["100", "100", "100", "101"]
    assert table.column("log_group").to_pylist() == ["/app/web"] * 3 + ["/app/db"]
    assert table.column("message").to_pylist()[-1] == "/app/db event 3"
    assert table.column("subscription_filters")[0].as_py() == ["to-kinesis"]
    assert table.column("timestamp")[0].as_py() == datetime(2025, 11, 29, 1, 0, tzinfo=UTC)
    assert table.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")


@pytest.mark.parametrize(
    "payload",
    [control_message(), data_message("/app/web", "i-0", [])],
    ids=["a control message", "a data message without log events"],
)
def test_a_record_without_log_events_is_left_out_and_counted_never_rejected(payload):
    batch = decoded(payload, data_message("/app/web", "i-1", log_events("/app/web", 0, 2)))
    assert (batch.table.num_rows, batch.left_out, batch.rejected) == (2, 1, ())
    assert batch.table.column("sequence_number").to_pylist() == ["101", "101"]


def test_records_that_are_not_subscription_envelopes_are_rejected_with_the_reason():
    other = gzip.compress(b'{"messageType": "SOMETHING_ELSE", "logEvents": []}')
    batch = decoded(b"plain text", gzip.compress(b"{oops"), other, data_message("/g", "s", log_events("/g", 0, 1)))
    assert batch.table.column("sequence_number").to_pylist() == ["103"]
    reasons = [(rejected.record.sequence_number, rejected.error) for rejected in batch.rejected]
    assert [sequence for sequence, _ in reasons] == ["100", "101", "102"]
    assert "record 100/0 of logs/shardId-0 is not gzip data" in reasons[0][1]
    assert "Missing a name for object member" in reasons[1][1]
    assert reasons[2][1].endswith("has messageType 'SOMETHING_ELSE', not DATA_MESSAGE or CONTROL_MESSAGE")


def test_a_redo_of_a_batch_decodes_the_same_rows():
    payloads = [data_message("/g", f"s-{n}", log_events("/g", n * 10, n + 1)) for n in range(4)]
    expected = [
        {
            "sequence_number": str(100 + n),
            "sub_sequence_number": 0,
            "partition_key": f"key-{n}",
            "approximate_arrival_timestamp": ARRIVAL,
            "owner": "123456789012",
            "log_group": "/g",
            "log_stream": f"s-{n}",
            "subscription_filters": ["to-kinesis"],
            "id": event["id"],
            "timestamp": datetime.fromtimestamp(int(event["timestamp"]) / 1000, UTC),
            "message": event["message"],
        }
        for n in range(4)
        for event in log_events("/g", n * 10, n + 1)
    ]
    for attempt in (decoded(*payloads), decoded(*payloads)):
        assert attempt.table.to_pylist() == expected
