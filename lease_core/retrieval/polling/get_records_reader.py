"""Reading one shard by polling: a shard iterator from GetShardIterator, then GetRecords after GetRecords.

What every mode shares is beside this package: where a read starts (`start_positions`), KPL
aggregates (`kpl_deaggregation`), retention gaps (`retention_gaps`) and the batches
(`record_batches`). What is polling's own:

- Iterators expire after 5 minutes: a fresh one re-opens AT_SEQUENCE_NUMBER of the last record
  fetched (`retention_gaps` says why not AFTER).
- The end of a closed shard is the null NextShardIterator, nothing else. Real Kinesis may hand out
  a shard's last records with a next iterator and MillisBehindLatest 0, and answer the null iterator
  (and the ChildShards) only to the call after them; kinesis-mock answers it with the last records.
  So a reader told that its shard is closed never takes MillisBehindLatest 0 for its tip: it reads on
  until the null iterator. Should a closed shard keep answering no records and a next iterator at its
  tip, the batch ends after a few such answers as "no_shard_end", which its caller reports instead of
  committing a shard end it never saw. A known ending sequence number lets the batch that fetches
  that record make the one more call even when it is full.
- The tip of an open shard is a MillisBehindLatest of 0 on a response shorter than the Limit asked
  for: kinesis-mock answers 0 on every response, even when records remain, and a full page may have
  more behind it.
- A batch capped in bytes (`ReadLimits.max_bytes`: a slot's lease reads its share of the slot's buffer)
  asks GetRecords for no more records than its room holds, at the weight of the previous answer's
  records (their user records' bytes, which a batch counts), and at 1 MiB each (Kinesis' largest)
  before any answer: an answer is then about the room and a record, not up to 10 MB, and what a lease
  keeps between its batches about a record, not the rest of a whole answer. Rounded up, so that one
  answer fills a batch; a first call per read asks for a few records only.
- Calls are paced by the shard's shared read limits (`read_pacing`); throttled ones back off by the
  retry policy and end the batch gracefully once its attempts are spent.
- A LATEST pin ahead of Kinesis' clock (the pinning host runs ahead) is refused by GetShardIterator:
  that open reads from LATEST, which holds every record after the pin.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import botocore.exceptions

from lease_core.aws import THROTTLING_CODES, AwsCaller, error_code
from lease_core.errors import DependencyError, StreamNotFoundError
from lease_core.model.kinesis_record_columns import KinesisRecordColumns
from lease_core.model.shards import ChildShard
from lease_core.retrieval.polling.read_pacing import (
    KINESIS_SHARD_READ_BYTES_PER_SECOND,
    MIN_CALL_INTERVAL_SECONDS,
    ReadPacer,
)
from lease_core.retrieval.record_batches import BatchInProgress, FetchedRecords
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, ShardToRead, StopReason
from lease_core.retrieval.shard_opening import PinInTheFuture, SequenceNumberRefused, ShardOpening
from lease_core.retrieval.start_positions import (
    StartingPosition,
    at_sequence_number,
    starting_position,
)
from lease_core.retry import RetryPolicy

# GetRecords returns at most 10,000 records per call.
MAX_GET_RECORDS_LIMIT = 10000
# Kinesis' largest record (data plus partition key): the size a batch capped in bytes assumes before
# the shard's first answer tells it the records' size.
MAX_RECORD_BYTES = 1024 * 1024
# Answers of no records and a next iterator at the tip of a closed shard before a batch gives up on
# its end ("no_shard_end"): Kinesis answers the end to the first call after the last records.
CLOSED_SHARD_EMPTY_ANSWERS = 5
# Kinesis' own code for a throttled KMS decrypt of an encrypted stream is not in lease_core's set.
READ_THROTTLING_CODES = THROTTLING_CODES | {"KMSThrottlingException"}
# GetShardIterator's answers to a sequence number the shard does not hold: Kinesis says
# InvalidArgumentException, kinesis-mock ResourceNotFoundException (a missing stream is told apart by
# the trim-horizon call that follows).
_SEQUENCE_NUMBER_REFUSALS = frozenset({"InvalidArgumentException", "ResourceNotFoundException"})


def iterator_arguments(position: StartingPosition) -> dict[str, Any]:
    """GetShardIterator's arguments for `position` (besides stream and shard): only those its kind needs."""
    arguments: dict[str, Any] = {"ShardIteratorType": position.kind}
    if position.sequence_number is not None:
        arguments["StartingSequenceNumber"] = position.sequence_number
    if position.timestamp is not None:
        arguments["Timestamp"] = position.timestamp
    return arguments


class _Throttled(Exception):
    """GetRecords was throttled; the reader backs off itself and may end the batch gracefully."""


class _IteratorExpired(Exception):
    """The shard iterator outlived its 5 minutes; a fresh one re-opens at the last record fetched."""


class GetRecordsReader:
    """A `RecordSource` of one shard by GetShardIterator and GetRecords (module doc).

    Throttled GetRecords calls back off by the retry policy's delays through `sleep` (so a fake clock
    sees them) and end the batch gracefully once the policy's attempts are spent; 5xx and transport
    failures are retried by `AwsCaller` and then raise `DependencyError`. `busy_gate`: see
    `Retrieval.open`.
    """

    operation = "GetRecords"

    def __init__(
        self,
        kinesis: Any,
        shard: ShardToRead,
        start: ReadStart,
        *,
        retry_policy: RetryPolicy = RetryPolicy(),
        min_call_interval_seconds: float = MIN_CALL_INTERVAL_SECONDS,
        read_bytes_per_second: float | None = KINESIS_SHARD_READ_BYTES_PER_SECOND,
        get_records_limit: int = MAX_GET_RECORDS_LIMIT,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        busy_gate: AbstractContextManager[Any] | None = None,
    ) -> None:
        if not 1 <= get_records_limit <= MAX_GET_RECORDS_LIMIT:
            raise ValueError(f"get_records_limit must be in 1..{MAX_GET_RECORDS_LIMIT}, not {get_records_limit}")
        self._pacer = ReadPacer(min_call_interval_seconds, read_bytes_per_second, clock)
        self._resume = starting_position(shard.shard_id, start.position, start.at_timestamp, start.latest_since)
        self._kinesis = kinesis
        self._shard = shard
        self._ending_sequence_number = shard.ending_sequence_number
        self._closed = shard.known_closed
        self._policy = retry_policy
        self._caller = AwsCaller("kinesis", retry_policy)
        self._get_records_limit = get_records_limit
        self._clock = clock
        self._sleep = sleep
        self._busy_gate = busy_gate or nullcontext()
        self._records = FetchedRecords(shard, start)
        self._opening = ShardOpening(kinesis, self._caller, shard, start, self._records, wall_clock)
        self._iterator: str | None = None
        self._end_known = False
        self._end_observed = False
        self._child_shards: tuple[ChildShard, ...] = ()
        self._drops_first_record = False  # the open iterator starts at a record that will not be delivered
        self._empty_answers_at_tip = 0  # in a row, in this batch (of a closed shard: not its end yet)
        # What a record of this shard weighs in a batch: its user records' bytes, in the last answer.
        self._bytes_per_record: float = MAX_RECORD_BYTES

    def read(self, limits: ReadLimits) -> ReadBatch:
        batch = BatchInProgress(limits)
        self._empty_answers_at_tip = 0
        while True:
            reason = self._records.deliver(batch) or self._reason_not_to_fetch(batch)
            if reason is None and not self._fetch(batch):
                reason = "throttled"
            if reason is not None:
                return batch.finished(reason, self._child_shards)

    def close(self) -> None:
        """Nothing is held open between calls: an iterator is a token, not a connection."""

    def _reason_not_to_fetch(self, batch: BatchInProgress) -> StopReason | None:
        """With the buffer drained: why this batch ends here, or None to fetch more."""
        stop_at_reached = batch.limits.stop_at_reached(self._records.last_delivered)
        # A replay ending exactly at the shard's last record ends at that record, as it was prepared.
        if self._end_observed and not (stop_at_reached and batch.count):
            return "shard_end"
        if stop_at_reached:
            return "stop_at"
        if batch.limits.cancelled_now():
            return "cancelled"
        past_deadline = batch.limits.deadline is not None and self._pacer.next_call_at() >= batch.limits.deadline
        if self._end_known and not past_deadline:
            return None  # the one more call that collects ChildShards and observes the end
        full = batch.full()
        if full is not None:
            return full
        if batch.at_tip and not self._closed:
            return "tip"
        if self._empty_answers_at_tip >= CLOSED_SHARD_EMPTY_ANSWERS:
            return "no_shard_end"
        return "time" if past_deadline else None

    # --- fetching --------------------------------------------------------------------------------

    def _fetch(self, batch: BatchInProgress) -> bool:
        """One GetRecords (with its retries) into the buffer; False if throttling outlasted the policy."""
        if self._iterator is None:
            self._open(self._resume)
        limit = self._get_records_limit
        if batch.limits.max_records is not None:
            limit = max(1, min(limit, batch.limits.max_records - batch.count))
        if batch.limits.max_bytes is not None:
            # Rounded up: an answer that fills the batch, leaving at most a record for the next one.
            room = batch.limits.max_bytes - batch.bytes
            limit = max(1, min(limit, math.ceil(room / self._bytes_per_record)))
        if self._drops_first_record:
            # The iterator starts at a record already delivered: ask for it and for what was asked.
            limit = min(limit + 1, MAX_GET_RECORDS_LIMIT)
        response = self._get_records(batch, limit)
        if response is None:
            return False
        self._take(batch, response, limit)
        return True

    def _get_records(self, batch: BatchInProgress, limit: int) -> dict[str, Any] | None:
        throttled = 0
        expired = 0
        while True:
            try:
                return self._caller.call("GetRecords", lambda: self._paced_get_records(batch, limit))
            except _Throttled:
                batch.refused_calls += 1
                throttled += 1
                if throttled >= self._policy.attempts:
                    return None
                self._sleep(self._policy.delay_seconds(throttled))
            except _IteratorExpired:
                batch.reopens += 1
                expired += 1
                if expired > self._policy.attempts:
                    raise DependencyError(
                        "kinesis", "GetRecords", "ExpiredIteratorException: fresh iterators keep expiring", expired
                    ) from None
                self._open(self._resume)

    def _paced_get_records(self, batch: BatchInProgress, limit: int) -> dict[str, Any]:
        self._sleep_until(self._pacer.next_call_at())
        batch.calls += 1
        try:
            with self._busy_gate:
                # Kinesis counts a call when it arrives: pace from here, after any wait for a lane.
                called_at = self._pacer.calling()
                response: dict[str, Any] = self._kinesis.get_records(ShardIterator=self._iterator, Limit=limit)
            # Columns from here on (a client other than lease_core's, a fake, answers botocore's dicts).
            records = response["Records"] = KinesisRecordColumns.of(response.get("Records", []))
            self._pacer.charge(called_at, records.charged_bytes())
            return response
        except botocore.exceptions.ClientError as error:
            code = error_code(error)
            if code in READ_THROTTLING_CODES:
                raise _Throttled() from error
            if code == "ExpiredIteratorException":
                raise _IteratorExpired() from error
            if code == "ResourceNotFoundException":
                raise StreamNotFoundError(self._shard.stream_name) from error
            raise  # 5xx are the retry policy's business, the rest AwsCaller's refusals

    def _sleep_until(self, moment: float) -> None:
        wait = moment - self._clock()
        if wait > 0:
            self._sleep(wait)

    def _take(self, batch: BatchInProgress, response: Mapping[str, Any], limit: int) -> None:
        raw: KinesisRecordColumns = response["Records"]
        batch.millis_behind_latest = response.get("MillisBehindLatest")
        if response.get("ChildShards"):
            self._child_shards = tuple(ChildShard.from_api(child) for child in response["ChildShards"])
        self._iterator = response.get("NextShardIterator")
        self._drops_first_record = False
        self._end_observed = self._iterator is None
        batch.at_tip = not self._end_observed and batch.millis_behind_latest == 0 and len(raw) < limit
        self._empty_answers_at_tip = self._empty_answers_at_tip + 1 if batch.at_tip and not raw else 0
        # Only the response holding the ending record asks for one more call: never loop on it.
        self._end_known = raw.holds(self._ending_sequence_number)
        if raw:
            user_bytes = self._records.take(raw)
            if user_bytes:  # aggregates that held no user records say nothing of the next ones
                self._bytes_per_record = user_bytes / len(raw)
            self._resume = at_sequence_number(raw.sequence_number(-1))
        elif self._end_observed or batch.at_tip:
            self._records.take_none_left()

    # --- iterators -------------------------------------------------------------------------------

    def _open(self, position: StartingPosition) -> None:
        """A fresh iterator at `position`, with the fallbacks every mode shares (`shard_opening`)."""

        def open_at(opened: StartingPosition) -> None:
            self._iterator = self._get_shard_iterator(opened)

        self._resume = self._opening.open(position, open_at)
        if position.kind == "AT_SEQUENCE_NUMBER" and self._resume is position:
            self._drops_first_record = self._records.opens_on_a_dropped_record

    def _get_shard_iterator(self, position: StartingPosition) -> str:
        def call() -> str:
            try:
                response = self._kinesis.get_shard_iterator(
                    StreamName=self._shard.stream_name, ShardId=self._shard.shard_id, **iterator_arguments(position)
                )
            except botocore.exceptions.ClientError as error:
                code = error_code(error)
                if position.sequence_number is not None and code in _SEQUENCE_NUMBER_REFUSALS:
                    raise SequenceNumberRefused() from error
                if self._opening.pin_refused(position, error):
                    raise PinInTheFuture() from error
                if code == "ResourceNotFoundException":
                    raise StreamNotFoundError(self._shard.stream_name) from error
                raise
            return str(response["ShardIterator"])

        return self._caller.call("GetShardIterator", call)
