"""Extended sequence numbers: a Kinesis sequence number plus a KPL sub-sequence number.

A checkpoint is either a decimal sequence number or one of KCL's sentinel names. The total order
(docs/protocol.md §8): SHARD_END is above everything; AT_TIMESTAMP < TRIM_HORIZON < LATEST < every
real sequence number; real numbers compare numerically, ties broken by the sub-sequence number.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from lease_core.errors import InvalidSequenceNumberError


class Sentinel(str, enum.Enum):
    """Checkpoint sentinels, stored in the lease table as their plain names."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    SHARD_END = "SHARD_END"


# Numeric stand-ins of the sentinels below every real sequence number (SHARD_END is handled apart).
_SENTINEL_RANK = {Sentinel.AT_TIMESTAMP: -3, Sentinel.TRIM_HORIZON: -2, Sentinel.LATEST: -1}


@dataclass(frozen=True)
class ExtendedSequenceNumber:
    """A position in a shard: `sequence_number` (digits or a sentinel name) and a sub-sequence number."""

    sequence_number: str
    sub_sequence_number: int = 0
    # The place in the order, worked out once: a reader compares every record it fetches.
    order_key: tuple[int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.sequence_number, str) or not self.sequence_number:
            raise InvalidSequenceNumberError(self.sequence_number, "must be a non-empty string")
        if not (self.sequence_number.isdigit() and self.sequence_number.isascii()) and (
            self.sequence_number not in Sentinel.__members__
        ):
            raise InvalidSequenceNumberError(
                self.sequence_number, "is neither a decimal sequence number nor a sentinel name"
            )
        if isinstance(self.sub_sequence_number, bool) or not isinstance(self.sub_sequence_number, int):
            raise InvalidSequenceNumberError(self.sub_sequence_number, "sub-sequence number must be an int")
        if self.sub_sequence_number < 0:
            raise InvalidSequenceNumberError(self.sub_sequence_number, "sub-sequence number must be >= 0")
        object.__setattr__(self, "order_key", self._order_key())

    @classmethod
    def of(cls, sentinel: Sentinel) -> ExtendedSequenceNumber:
        return cls(sentinel.value, 0)

    @property
    def sentinel(self) -> Sentinel | None:
        """The sentinel this value stands for, or None for a real sequence number."""
        return Sentinel.__members__.get(self.sequence_number)

    @property
    def is_shard_end(self) -> bool:
        return self.sequence_number == Sentinel.SHARD_END.value

    @property
    def is_sentinel(self) -> bool:
        return self.sentinel is not None

    def _order_key(self) -> tuple[int, int, int]:
        sentinel = self.sentinel
        if sentinel is Sentinel.SHARD_END:
            return (1, 0, 0)
        rank = _SENTINEL_RANK[sentinel] if sentinel is not None else int(self.sequence_number)
        return (0, rank, self.sub_sequence_number)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self.order_key < other.order_key

    def __le__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self.order_key <= other.order_key

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self.order_key > other.order_key

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self.order_key >= other.order_key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        # Equality is on both parts; SHARD_END equals itself whatever its sub-sequence part.
        return self.order_key == other.order_key

    def __hash__(self) -> int:
        return hash(self.order_key)

    def __str__(self) -> str:
        if self.sub_sequence_number:
            return f"{self.sequence_number}/{self.sub_sequence_number}"
        return self.sequence_number


TRIM_HORIZON = ExtendedSequenceNumber.of(Sentinel.TRIM_HORIZON)
LATEST = ExtendedSequenceNumber.of(Sentinel.LATEST)
AT_TIMESTAMP = ExtendedSequenceNumber.of(Sentinel.AT_TIMESTAMP)
SHARD_END = ExtendedSequenceNumber.of(Sentinel.SHARD_END)
