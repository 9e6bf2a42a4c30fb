"""Opening a shard at a starting position, with the fallbacks every way of reading shares.

A mode opens a shard its own way (polling: GetShardIterator; fan-out: SubscribeToShard) and tells
two of Kinesis' refusals apart by raising `SequenceNumberRefused` or `PinInTheFuture`; the rest is
the same for both:

- A sequence number Kinesis refuses is opened at the trim horizon instead, and the first record
  read there is checked against it (`retention_gaps`): a gap if the number aged out, an
  `InvalidSequenceNumberError` if it never was the shard's. Later re-opens start there too.
- A LATEST pin ahead of Kinesis' clock (the pinning host runs ahead) is opened at LATEST, which holds
  every record after the pin; the pin stays for the next open, by then likely in Kinesis' past.
- A LATEST pin older than the stream's retention makes the first record read follow a possible gap
  (asked once per source: DescribeStreamSummary's retention, only past Kinesis' minimum).
- Every open at a sequence number checks the first record behind it for a gap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.model.sequence import Sentinel
from lease_core.retrieval.record_batches import FetchedRecords
from lease_core.retrieval.record_source import ReadStart, ShardToRead
from lease_core.retrieval.retention_gaps import pin_may_have_aged_out
from lease_core.retrieval.start_positions import LATEST_POSITION, TRIM_HORIZON_POSITION, StartingPosition

log = logging.getLogger(__name__)


class SequenceNumberRefused(Exception):
    """Kinesis refused the sequence number the shard was opened at."""


class PinInTheFuture(Exception):
    """Kinesis refused an AT_TIMESTAMP pin as later than its own clock."""


def refuses_the_future(error: botocore.exceptions.ClientError) -> bool:
    """Kinesis' answer to an AT_TIMESTAMP after its own clock (kinesis-mock: "Timestamp cannot be in the future")."""
    message = str(error.response.get("Error", {}).get("Message", ""))
    return error_code(error) == "InvalidArgumentException" and "future" in message.lower()


class ShardOpening:
    """The shared half of a source's opens of one shard (module doc), over `records`, the source's
    bookkeeping of what it fetched."""

    def __init__(
        self,
        kinesis: Any,
        caller: AwsCaller,
        shard: ShardToRead,
        start: ReadStart,
        records: FetchedRecords,
        wall_clock: Callable[[], float],
    ) -> None:
        self._kinesis = kinesis
        self._caller = caller
        self._shard = shard
        self._records = records
        self._wall_clock = wall_clock
        self._pin_checked = False
        self.pinned_latest = start.position.sentinel is Sentinel.LATEST and start.latest_since is not None

    def pin_refused(self, position: StartingPosition, error: botocore.exceptions.ClientError) -> bool:
        """Whether `error` is Kinesis refusing this source's LATEST pin as in its future."""
        return self.pinned_latest and position.kind == "AT_TIMESTAMP" and refuses_the_future(error)

    def open(self, position: StartingPosition, open_at: Callable[[StartingPosition], None]) -> StartingPosition:
        """Open the shard at `position` through the mode's `open_at`, with the fallbacks; where a later
        re-open resumes while nothing has been fetched since (the trim horizon after a refusal)."""
        try:
            open_at(position)
        except PinInTheFuture:
            log.warning(
                "shard %s of %r: its LATEST pin %s is ahead of Kinesis' clock; reading from LATEST",
                self._shard.shard_id,
                self._shard.stream_name,
                position.timestamp,
            )
            open_at(LATEST_POSITION)
            return position
        except SequenceNumberRefused:
            open_at(TRIM_HORIZON_POSITION)
            self._records.check_first_record(str(position.sequence_number), refused=True)
            return TRIM_HORIZON_POSITION
        if self.pinned_latest and position.kind == "AT_TIMESTAMP" and self._pin_aged_out(position):
            self._records.check_first_record(None)
        if position.kind == "AT_SEQUENCE_NUMBER":
            self._records.check_first_record(str(position.sequence_number))
        return position

    def _pin_aged_out(self, position: StartingPosition) -> bool:
        """Whether records after the LATEST pin may have aged out unread (asked once per source)."""
        pin = position.timestamp
        if pin is None or self._pin_checked:
            return False
        self._pin_checked = True

        def retention_hours() -> int:
            def call() -> int:
                summary = self._kinesis.describe_stream_summary(StreamName=self._shard.stream_name)
                return int(summary["StreamDescriptionSummary"]["RetentionPeriodHours"])

            hours: int = self._caller.call("DescribeStreamSummary", call)
            return hours

        return pin_may_have_aged_out(pin, self._wall_clock(), retention_hours)
