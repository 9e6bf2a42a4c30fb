"""A Kinesis user record as the consume job carries it from the shard reader to the sink.

One value per user record: a plain Kinesis record, or one user record of a KPL aggregate (then
`sub_sequence_number` is its index in the aggregate, and `position` orders it inside the aggregate).
A batch of them travels as columns (`UserRecords`), which are a sequence of such values.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lease_core.model.kinesis_record_columns import ARRIVAL_TYPE
from lease_core.model.sequence import ExtendedSequenceNumber


@dataclass(frozen=True)
class KinesisRecord:
    sequence_number: str
    sub_sequence_number: int
    partition_key: str
    approximate_arrival_timestamp: datetime  # time-zone aware (UTC), as boto3 returns it
    data: bytes
    explicit_hash_key: str | None = None

    @property
    def position(self) -> ExtendedSequenceNumber:
        return ExtendedSequenceNumber(self.sequence_number, self.sub_sequence_number)

    @property
    def order_key(self) -> tuple[int, int, int]:
        """`position.order_key`, without building (and validating) the position."""
        return (0, int(self.sequence_number), self.sub_sequence_number)


# A batch of user records as columns, in shard order. The arrival keeps botocore's microseconds; the
# sinks store milliseconds (`sinks.record_columns`).
USER_SCHEMA = pa.schema(
    [
        pa.field("sequence_number", pa.string(), nullable=False),
        pa.field("sub_sequence_number", pa.int64(), nullable=False),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("approximate_arrival_timestamp", ARRIVAL_TYPE, nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("explicit_hash_key", pa.string()),
    ]
)


class UserRecords(Sequence[KinesisRecord]):
    """User records in shard order as a table of USER_SCHEMA: what a `ReadBatch` hands out and a sink
    stages, without a Python object per record. Indexing or iterating builds `KinesisRecord`s (for
    decoders, tests and tools); the consume job's hot path reads `table` and the few positions it needs."""

    __slots__ = ("_lengths", "table")

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._lengths: np.ndarray | None = None

    @classmethod
    def empty(cls) -> UserRecords:
        return cls(USER_SCHEMA.empty_table())

    @classmethod
    def of(cls, records: Sequence[KinesisRecord]) -> UserRecords:
        """`records` as columns: themselves when they are, else each KinesisRecord's values."""
        if isinstance(records, UserRecords):
            return records
        return cls(
            pa.table(
                {name: [getattr(record, name) for record in records] for name in USER_SCHEMA.names}, schema=USER_SCHEMA
            )
        )

    @classmethod
    def concat(cls, parts: Sequence[UserRecords]) -> UserRecords:
        if len(parts) == 1:
            return parts[0]
        return cls(pa.concat_tables([part.table for part in parts])) if parts else cls.empty()

    @property
    def data_lengths(self) -> np.ndarray:
        """Each record's len(data), as int64."""
        if self._lengths is None:
            lengths = pc.binary_length(self.table.column("data"))
            self._lengths = lengths.to_numpy().astype(np.int64) if len(self) else np.zeros(0, np.int64)
        return self._lengths

    @property
    def bytes(self) -> int:
        """The sum of len(data)."""
        return int(self.data_lengths.sum())

    def order_key(self, index: int) -> tuple[int, int, int]:
        sequence_number, sub_sequence_number = self._numbers(index)
        return (0, int(sequence_number), sub_sequence_number)

    def position(self, index: int) -> ExtendedSequenceNumber:
        return ExtendedSequenceNumber(*self._numbers(index))

    def _numbers(self, index: int) -> tuple[str, int]:
        row = self.table.slice(index % len(self), 1)
        return row.column(0)[0].as_py(), row.column(1)[0].as_py()

    def first_after(self, order_key: tuple[int, int, int]) -> int:
        """The index of the first record whose position is after `order_key` (records are in order)."""
        return bisect.bisect_right(range(len(self)), order_key, key=self.order_key)

    def first_arriving_at(self, moment: datetime) -> int | None:
        """The index of the first record that arrived at or after `moment`, None when none did."""
        reached = pc.greater_equal(self.table.column("approximate_arrival_timestamp"), pa.scalar(moment, ARRIVAL_TYPE))
        index = pc.index(reached, True).as_py()
        return None if index < 0 else int(index)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    @overload
    def __getitem__(self, index: int) -> KinesisRecord: ...

    @overload
    def __getitem__(self, index: slice) -> UserRecords: ...

    def __getitem__(self, index: int | slice) -> KinesisRecord | UserRecords:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("records are sliced in order only")
            return UserRecords(self.table.slice(start, max(0, stop - start)))
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return _record(self.table.slice(index % len(self), 1).to_pylist()[0])

    def __iter__(self) -> Iterator[KinesisRecord]:
        return (_record(row) for row in self.table.to_pylist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UserRecords):
            return bool(self.table.equals(other.table))
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"UserRecords({len(self)} records)"


def _record(row: dict[str, Any]) -> KinesisRecord:
    row["approximate_arrival_timestamp"] = row["approximate_arrival_timestamp"].astimezone(UTC)
    return KinesisRecord(**row)
