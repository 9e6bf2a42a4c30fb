"""The built-in `dynamodb` decoder: the change records Kinesis Data Streams for DynamoDB writes.

Each Kinesis record is one JSON change record: `eventName` (`INSERT`, `MODIFY`, `REMOVE`), `eventID`,
`tableName`, `awsRegion`, `eventSource` (`aws:dynamodb`), `userIdentity` (set for a TTL deletion), and
`dynamodb` with `ApproximateCreationDateTime` (epoch milliseconds, or microseconds when the table's
`ApproximateCreationDateTimePrecision` is `MICROSECOND`, which the record then names), `Keys`,
`NewImage`, `OldImage` (each item in DynamoDB JSON) and `SizeBytes`. One record becomes one row with
the columns `event_id`, `event_name`, `table_name`, `aws_region`, `user_identity_type`,
`approximate_creation_time` (UTC, microseconds), `size_bytes`, and `keys`, `new_image`, `old_image`:
each the item's DynamoDB JSON as the record has it, text (null when the record has none). Text, not
structs of the attributes: items of one table differ in their attributes and in an attribute's type,
and a table's struct column cannot follow that from batch to batch.

A record that is not JSON, not an object, whose `eventSource` is not `aws:dynamodb` or whose
`eventName` is none of the three is rejected with that reason. The batch is parsed at once by pyarrow's
JSON reader (the json decoder's `read_json_lines`); the images are cut out of each record undecoded
by msgspec (`msgspec.Raw`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import DecodedBatch
from spark_jobs.decoders.fixed_envelope import FixedEnvelopeDecoder
from spark_jobs.decoders.json_objects import payloads_of, positions_of, read_json_lines, rejected_records

NAME = "dynamodb"
EVENT_NAMES = ("INSERT", "MODIFY", "REMOVE")
# The record's fields with a column of their own, typed; the images are taken as text (`_Images`).
_FIXED = pa.schema(
    [
        ("eventID", pa.string()),
        ("eventName", pa.string()),
        ("tableName", pa.string()),
        ("awsRegion", pa.string()),
        ("eventSource", pa.string()),
        ("userIdentity", pa.struct([("type", pa.string()), ("principalId", pa.string())])),
        (
            "dynamodb",
            pa.struct(
                [
                    ("ApproximateCreationDateTime", pa.int64()),
                    ("ApproximateCreationDateTimePrecision", pa.string()),
                    ("SizeBytes", pa.int64()),
                ]
            ),
        ),
    ]
)


class _Images(msgspec.Struct):  # an empty Raw: the record has no such field
    Keys: msgspec.Raw = msgspec.Raw()
    NewImage: msgspec.Raw = msgspec.Raw()
    OldImage: msgspec.Raw = msgspec.Raw()


class _Change(msgspec.Struct):
    dynamodb: _Images | None = None


_IMAGES_OF = msgspec.json.Decoder(_Change)
_ABSENT = (msgspec.Raw(), msgspec.Raw(b"null"))
_SCALARS = {
    "event_id": "eventID",
    "event_name": "eventName",
    "table_name": "tableName",
    "aws_region": "awsRegion",
}
CHANGE_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("event_name", pa.string()),
        ("table_name", pa.string()),
        ("aws_region", pa.string()),
        ("user_identity_type", pa.string()),
        ("approximate_creation_time", pa.timestamp("us", tz="UTC")),
        ("size_bytes", pa.int64()),
        ("keys", pa.string()),
        ("new_image", pa.string()),
        ("old_image", pa.string()),
    ]
)
_IMAGES = {"keys": "Keys", "new_image": "NewImage", "old_image": "OldImage"}


@dataclass(frozen=True)
class DynamoDbDecoder(FixedEnvelopeDecoder):
    spec: str = NAME
    ENVELOPE_SCHEMA: ClassVar[pa.Schema] = CHANGE_SCHEMA

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch:
        parse = pa_json.ParseOptions(explicit_schema=_FIXED, unexpected_field_behavior="ignore")
        payloads = payloads_of(records)
        read = read_json_lines(payloads, parse, self.spec)
        changes, rows, rejected = read.table, read.rows, read.rejected
        source = pc.fill_null(pc.equal(changes.column("eventSource"), "aws:dynamodb"), False)
        known = pc.fill_null(pc.is_in(changes.column("eventName"), pa.array(EVENT_NAMES)), False)
        change = changes.column("dynamodb")
        for position in pc.indices_nonzero(pc.invert(pc.and_(source, known))).to_pylist():
            why = (
                f"has eventSource {changes.column('eventSource')[position].as_py()!r}, not 'aws:dynamodb'"
                if not source[position].as_py()
                else f"has eventName {changes.column('eventName')[position].as_py()!r}, not one of "
                + ", ".join(EVENT_NAMES)
            )
            rejected[rows[position]] = why
        kept = pc.and_(source, known)
        changes, change = changes.filter(kept), change.filter(kept)
        kept_rows = pa.array(rows, pa.int64()).filter(kept).to_pylist()
        columns = {name: changes.column(field) for name, field in _SCALARS.items()}
        columns["user_identity_type"] = pc.struct_field(changes.column("userIdentity"), "type")
        columns["approximate_creation_time"] = _creation_time(change)
        columns["size_bytes"] = pc.struct_field(change, "SizeBytes")
        columns.update(_image_texts([payloads[index] for index in kept_rows]))
        table = positions_of(records, kept_rows)
        for field in CHANGE_SCHEMA:
            table = table.append_column(field, columns[field.name])
        return DecodedBatch(table, rejected_records(records, rejected, stream_name, shard_id))


def _image_texts(payloads: list[bytes]) -> dict[str, pa.Array]:
    """Each record's keys and images, their DynamoDB JSON cut out undecoded (the records are JSON
    the reader took already)."""
    changes = [_IMAGES_OF.decode(payload).dynamodb or _Images() for payload in payloads]
    return {
        name: pa.array(
            [bytes(raw).decode() if (raw := getattr(images, field)) not in _ABSENT else None for images in changes],
            pa.string(),
        )
        for name, field in _IMAGES.items()
    }


def _creation_time(change: pa.ChunkedArray) -> pa.ChunkedArray:
    """`ApproximateCreationDateTime` as UTC microseconds: milliseconds unless the record says MICROSECOND."""
    epoch = pc.struct_field(change, "ApproximateCreationDateTime")
    precision = pc.struct_field(change, "ApproximateCreationDateTimePrecision")
    micros = pc.if_else(pc.fill_null(pc.equal(precision, "MICROSECOND"), False), epoch, pc.multiply(epoch, 1000))
    return micros.cast(pa.timestamp("us", tz="UTC"))
