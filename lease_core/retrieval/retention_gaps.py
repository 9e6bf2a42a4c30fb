"""Records that aged out of a stream's retention before they were read: found, and reported, never
skipped silently.

- The first record behind every AT_SEQUENCE_NUMBER start (a resume's or a re-open's) is checked
  against the record asked for, and a refused sequence number against the trim horizon. A record
  asked for that aged out itself is reported too: the records between it and the first one
  available are unknown, so "none" cannot be told from "some".
- A re-open (an expired iterator) starts AT_SEQUENCE_NUMBER of the last record fetched (an aggregate
  as a whole) and drops the records at or before it. AFTER_SEQUENCE_NUMBER could not tell whether the
  records right after it aged out meanwhile: Kinesis starts a read at an aged-out number at the trim
  horizon, whose first record is after it either way.
- A lease at LATEST reads from its pin. A pin older than the stream's retention makes its first
  record follow a possible gap, reported like the others (with no record after it, nothing is
  reported: the lease stays at LATEST and would report it every round).
- A batch reports one gap: a second one ends it before the records behind that gap, and the next
  batch reports it (`record_batches.FetchedRecords`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lease_core.errors import InvalidSequenceNumberError
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.retrieval.kpl_deaggregation import arrival_of

# Kinesis keeps records at least this long (a stream's retention is 24 hours to 365 days).
MIN_RETENTION_HOURS = 24


@dataclass(frozen=True)
class RetentionGap:
    """Records after `after` and before `first_available` aged out of the stream before they were read."""

    after: ExtendedSequenceNumber
    first_available: str | None  # the first record still in the shard, None if the shard is empty now
    first_available_arrival: datetime | None


@dataclass(frozen=True)
class GapCheck:
    """A check due on the first record behind a start at a sequence number.

    `sequence_number` is the record the read should start at; `after` is the last position read
    before it (the checkpoint, or the last user record fetched). A first record above it means
    records after `after` aged out; if Kinesis refused the sequence number and the trim horizon is
    not above it, the number was never valid for the shard.
    """

    after: ExtendedSequenceNumber
    sequence_number: str | None  # None: any first record comes after a possible gap (an aged-out pin)
    refused: bool

    def gap_before(self, first: Mapping[str, Any], shard_id: str, stream_name: str) -> RetentionGap | None:
        """The gap before `first`, the first record read behind the start; None when there is none.
        A refused sequence number the shard's trim horizon is not above was never one of the shard's:
        `InvalidSequenceNumberError`."""
        if self.sequence_number is None or int(first["SequenceNumber"]) > int(self.sequence_number):
            return RetentionGap(self.after, first["SequenceNumber"], arrival_of(first))
        if self.refused:
            raise InvalidSequenceNumberError(
                self.sequence_number,
                f"Kinesis refused it for shard {shard_id} of stream {stream_name!r}, and the shard's "
                f"trim horizon {first['SequenceNumber']} is not above it: it is not a position of this shard",
            )
        return None

    def gap_with_nothing_left(self) -> RetentionGap | None:
        """The gap when nothing at or after the record asked for is left at all: everything after it
        aged out. An aged-out pin waits for its first record instead (None): with none, nothing may
        have been lost, and the lease, still at LATEST, would report the same gap every round."""
        return None if self.sequence_number is None else RetentionGap(self.after, None, None)


def pin_may_have_aged_out(pin: datetime, now: float, retention_hours: Callable[[], int]) -> bool:
    """Whether records after a LATEST pin may have aged out unread at `now` (epoch seconds): the pin
    is older than the stream's retention, which is asked (`retention_hours`) only past Kinesis'
    minimum retention. Kinesis then starts a read at the pin at the trim horizon, and the first record
    read follows a possible gap."""
    age_hours = (now - pin.timestamp()) / 3600
    if age_hours <= MIN_RETENTION_HOURS:
        return False
    return age_hours > retention_hours()
