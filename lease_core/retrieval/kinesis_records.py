"""A Kinesis user record as the consume job carries it from the shard reader to the sink.

One value per user record: a plain Kinesis record, or one user record of a KPL aggregate (then
`sub_sequence_number` is its index in the aggregate, and `position` orders it inside the aggregate).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

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
