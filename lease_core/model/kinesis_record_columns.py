"""Kinesis records as columns: what a GetRecords answer (or a SubscribeToShard event) holds, one Arrow
column per member, before KPL aggregates are split.

A slot reads megabytes a second per shard; one Python object per record made the decoding most of its
CPU (docs/performance.md). lease_core's clients decode GetRecords into these columns directly
(`lease_core.aws`), and the retrieval keeps them as columns down to the batch the sink stages
(`lease_core.retrieval.kinesis_records.UserRecords`). They are still a sequence of the records as
botocore parses them (dicts: SequenceNumber, ApproximateArrivalTimestamp as a UTC datetime, Data as
bytes, PartitionKey, EncryptionType; absent members left out), built only when someone indexes them,
so that whatever reads a response as botocore's keeps working. `of` takes botocore's records (a
fan-out event's, a fake client's) as they are.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ARRIVAL_TYPE = pa.timestamp("us", tz="UTC")
RAW_SCHEMA = pa.schema(
    [
        pa.field("SequenceNumber", pa.string(), nullable=False),
        pa.field("ApproximateArrivalTimestamp", ARRIVAL_TYPE),
        pa.field("Data", pa.binary(), nullable=False),
        pa.field("PartitionKey", pa.string()),
        pa.field("EncryptionType", pa.string()),
    ]
)


def epoch_micros(seconds: pa.Array) -> pa.Array:
    """Epoch seconds (float64, nulls kept) as UTC microseconds, rounded exactly as
    `datetime.fromtimestamp(seconds, UTC)` rounds them (the fraction, half to even), so that a column
    and botocore's datetimes name the same instants."""
    values = seconds.fill_null(0).to_numpy(zero_copy_only=False)
    fraction, whole = np.modf(values)
    micros = np.round(fraction * 1e6)
    whole = whole + (micros >= 1e6) - (micros < 0)
    micros = micros - 1e6 * (micros >= 1e6) + 1e6 * (micros < 0)
    combined = whole.astype(np.int64) * 1_000_000 + micros.astype(np.int64)
    mask = None if seconds.null_count == 0 else seconds.is_null().to_numpy(zero_copy_only=False)
    return pa.array(combined, pa.int64(), mask=mask).cast(ARRIVAL_TYPE)


class KinesisRecordColumns(Sequence[dict[str, Any]]):
    """Kinesis records, in shard order, as a table of RAW_SCHEMA (module doc)."""

    __slots__ = ("_sequence_numbers", "table")

    def __init__(self, table: pa.Table) -> None:
        self.table = table.combine_chunks() if any(column.num_chunks > 1 for column in table.columns) else table
        self._sequence_numbers: list[str] | None = None

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]]) -> KinesisRecordColumns:
        """`records` as columns: themselves when they are, else botocore's record dicts converted."""
        if isinstance(records, KinesisRecordColumns):
            return records
        arrivals = [record.get("ApproximateArrivalTimestamp") for record in records]
        return cls(
            pa.table(
                {
                    "SequenceNumber": [record["SequenceNumber"] for record in records],
                    "ApproximateArrivalTimestamp": pa.array(arrivals, ARRIVAL_TYPE),
                    "Data": [bytes(record["Data"]) for record in records],
                    "PartitionKey": [record.get("PartitionKey") for record in records],
                    "EncryptionType": [record.get("EncryptionType") for record in records],
                },
                schema=RAW_SCHEMA,
            )
        )

    def sequence_number(self, index: int) -> str:
        return self.sequence_numbers[index]

    @property
    def sequence_numbers(self) -> list[str]:
        """Every record's sequence number (built once: a few per batch are compared, by bisection)."""
        if self._sequence_numbers is None:
            self._sequence_numbers = self.table.column("SequenceNumber").to_pylist()
        return self._sequence_numbers

    def first_after(self, sequence_number: int) -> int:
        """The index of the first record whose sequence number is above `sequence_number` (Kinesis
        hands a shard's records out in increasing order)."""
        return bisect.bisect_right(self.sequence_numbers, sequence_number, key=int)

    def holds(self, sequence_number: str | None) -> bool:
        """Whether a record has `sequence_number`."""
        return sequence_number is not None and bool(
            pc.any(pc.equal(self.table.column("SequenceNumber"), sequence_number)).as_py()
        )

    def charged_bytes(self) -> int:
        """What Kinesis charges a shard's read limit for these records: data plus partition keys (UTF-8)."""
        data = pc.sum(pc.binary_length(self.table.column("Data"))).as_py() or 0
        keys = pc.sum(pc.binary_length(self.table.column("PartitionKey"))).as_py() or 0
        return int(data + keys)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> KinesisRecordColumns: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | KinesisRecordColumns:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("records are sliced in order only")
            return KinesisRecordColumns(self.table.slice(start, max(0, stop - start)))
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return _as_botocore(self.table.slice(index % len(self), 1).to_pylist()[0])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (_as_botocore(row) for row in self.table.to_pylist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KinesisRecordColumns):
            return bool(self.table.equals(other.table))
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # equal to lists, mutable-looking: not hashable

    def __repr__(self) -> str:
        return f"KinesisRecordColumns({len(self)} records)"


def _as_botocore(row: dict[str, Any]) -> dict[str, Any]:
    record = {name: value for name, value in row.items() if value is not None}
    arrival = record.get("ApproximateArrivalTimestamp")
    if arrival is not None:  # the instant Arrow holds, with datetime's own UTC, as botocore's fast path gives it
        record["ApproximateArrivalTimestamp"] = arrival.astimezone(UTC)
    return record
