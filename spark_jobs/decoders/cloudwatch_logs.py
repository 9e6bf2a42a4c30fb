"""The built-in `cloudwatch_logs` decoder: CloudWatch Logs subscription records, one row per log event.

A subscription filter writes each Kinesis record as a gzip'd JSON envelope: `messageType`, `owner`,
`logGroup`, `logStream`, `subscriptionFilters` and the `logEvents` (`id`, `timestamp` in epoch
milliseconds, `message`). A `DATA_MESSAGE` record becomes one row per log event, with the columns
`owner`, `log_group`, `log_stream`, `subscription_filters`, `id`, `timestamp` (UTC, milliseconds) and
`message`, after its record's position columns: the rows of one record share its sequence and
sub-sequence number, so the batch, its checkpoint and its dead letters stay keyed by record, and a
redo of the batch decodes the same rows. A `CONTROL_MESSAGE` record (CloudWatch Logs checking that it
can write to the stream), and a `DATA_MESSAGE` without log events, have no rows: they are left out and
counted (`DecodedBatch.left_out`, the round report's `left_out`), never dead-lettered. A
record that is not gzip, not an envelope, or of another message type is rejected with that reason.

The records are gunzipped one by one (zlib, in C), then parsed at once by pyarrow's JSON reader, and
the events are flattened with Arrow's list kernels: no Python loop per event or field.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import DecodedBatch
from spark_jobs.decoders.fixed_envelope import FixedEnvelopeDecoder
from spark_jobs.decoders.json_objects import payloads_of, positions_of, read_json_lines, rejected_records

NAME = "cloudwatch_logs"
DATA_MESSAGE, CONTROL_MESSAGE = "DATA_MESSAGE", "CONTROL_MESSAGE"
ENVELOPE = pa.schema(
    [
        ("messageType", pa.string()),
        ("owner", pa.string()),
        ("logGroup", pa.string()),
        ("logStream", pa.string()),
        ("subscriptionFilters", pa.list_(pa.string())),
        ("logEvents", pa.list_(pa.struct([("id", pa.string()), ("timestamp", pa.int64()), ("message", pa.string())]))),
    ]
)
LOG_EVENT_SCHEMA = pa.schema(
    [
        ("owner", pa.string()),
        ("log_group", pa.string()),
        ("log_stream", pa.string()),
        ("subscription_filters", pa.list_(pa.string())),
        ("id", pa.string()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("message", pa.string()),
    ]
)
_ENVELOPE_COLUMNS = {"owner": "owner", "log_group": "logGroup", "log_stream": "logStream"}


@dataclass(frozen=True)
class CloudWatchLogsDecoder(FixedEnvelopeDecoder):
    spec: str = NAME
    ENVELOPE_SCHEMA: ClassVar[pa.Schema] = LOG_EVENT_SCHEMA

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch:
        rejected: dict[int, str] = {}
        documents: list[bytes] = []
        for index, payload in enumerate(payloads_of(records)):
            try:
                documents.append(gzip.decompress(payload))
            except (OSError, EOFError, zlib.error) as error:
                rejected[index] = f"is not gzip data ({error})"
                documents.append(b"")  # rejected as empty by the reader too: the reason above stays
        parse = pa_json.ParseOptions(explicit_schema=ENVELOPE, unexpected_field_behavior="ignore")
        read = read_json_lines(documents, parse, self.spec)
        envelopes, rows = read.table, read.rows
        rejected = {**read.rejected, **rejected}
        kinds = envelopes.column("messageType")
        control = pc.fill_null(pc.equal(kinds, CONTROL_MESSAGE), False)
        data = pc.fill_null(pc.equal(kinds, DATA_MESSAGE), False)
        for position in pc.indices_nonzero(pc.invert(pc.or_(control, data))).to_pylist():
            rejected[rows[position]] = (
                f"has messageType {kinds[position].as_py()!r}, not {DATA_MESSAGE} or {CONTROL_MESSAGE}"
            )
        envelopes = envelopes.filter(data)
        data_rows = pa.array(rows, pa.int64()).filter(data)
        events = envelopes.column("logEvents")
        parents = pc.list_parent_indices(events)  # each event's envelope, among the data envelopes
        flat = pc.list_flatten(events)
        columns = {name: envelopes.column(field).take(parents) for name, field in _ENVELOPE_COLUMNS.items()}
        columns["subscription_filters"] = envelopes.column("subscriptionFilters").take(parents)
        columns["id"] = pc.struct_field(flat, "id")
        columns["timestamp"] = pc.struct_field(flat, "timestamp").cast(pa.timestamp("ms", tz="UTC"))
        columns["message"] = pc.struct_field(flat, "message")
        table = positions_of(records, data_rows.take(parents).to_pylist())
        for field in LOG_EVENT_SCHEMA:
            table = table.append_column(field, pa.chunked_array(_chunks(columns[field.name]), field.type))
        # A data message without events has no row either: left out, as a control message is.
        eventless = pc.fill_null(pc.equal(pc.list_value_length(events), 0), True)
        left_out = int(pc.sum(control).as_py() or 0) + int(pc.sum(eventless).as_py() or 0)
        return DecodedBatch(table, rejected_records(records, rejected, stream_name, shard_id), left_out)


def _chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]
