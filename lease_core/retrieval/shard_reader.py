"""Reading one Kinesis shard from a lease's checkpoint: the consume job's slots read with it, and the
leader's idle check asks it whether a lease has anything to read.

Why it reads the way it does:
- A resume opens AT_SEQUENCE_NUMBER of the checkpoint and drops every position at or before it. A
  checkpoint inside a KPL aggregate names one sub-record; AFTER_SEQUENCE_NUMBER would skip the rest
  of that aggregate, and the filter keeps the sub-records already delivered from coming back.
- A re-open after an expired iterator opens AT_SEQUENCE_NUMBER of the last record fetched (an
  aggregate as a whole) and drops the records at or before it. AFTER_SEQUENCE_NUMBER could not tell
  whether the records right after it aged out meanwhile: Kinesis starts an iterator for an aged-out
  number at the trim horizon, whose first record is after it either way.
- The end of a closed shard is the null NextShardIterator, nothing else. Real Kinesis may hand out
  a shard's last records with a next iterator and MillisBehindLatest 0, and answer the null iterator
  (and the ChildShards) only to the call after them; kinesis-mock answers it with the last records.
  So a reader told that its shard is closed (`closed`: the listing gave it an EndingSequenceNumber)
  never takes MillisBehindLatest 0 for its tip: it reads on until the null iterator. Should a closed
  shard keep answering no records and a next iterator at its tip, the batch ends after a few such
  answers as "no_shard_end", which its caller reports instead of committing a shard end it never
  saw. A real EndingSequenceNumber (`ending_sequence_number`) lets the batch that fetches that record
  make the one more call even when it is full; kinesis-mock reports 9223372036854775807 for every
  closed shard, which callers pass as unknown (`Shard.known_ending_sequence_number`).
- Records that aged out of retention before they were read are reported as a `RetentionGap`, never
  skipped silently: the first record behind every AT_SEQUENCE_NUMBER iterator (a resume's or a
  re-open's) is checked against the record asked for, and a refused sequence number against the trim
  horizon. A record asked for that aged out itself is reported too: the records between it and the
  first one available are unknown, so "none" cannot be told from "some". A batch reports one gap: a
  second one ends it before the records behind that gap, and the next batch reports it.
- A lease at LATEST reads from its pin (`Lease.latest_since`) AT_TIMESTAMP. A pin older than the
  stream's retention makes its first record follow a possible gap, reported like the others (with no
  record after it, nothing is reported: the lease stays at LATEST and would report it every round).
  A pin ahead of Kinesis' clock (the pinning host runs ahead) is refused by Kinesis: that open reads
  from LATEST, which holds every record after the pin.
- Calls are paced by Kinesis' two per-shard read limits: at most 5 GetRecords per second, and
  `read_bytes_per_second` (2 MiB/s) of records. Kinesis charges a response's bytes (data plus
  partition key) after serving it and refuses the shard's calls while it is in debt, so after a
  response of B bytes the next call waits until B / rate has passed since this one was sent. A reader
  that only kept to 5 calls/s would run into ProvisionedThroughputExceeded after every large page and
  lose a retry-policy backoff each time; paced by bytes it reads at the cap and is never refused.
- The tip of an open shard is a MillisBehindLatest of 0 on a response shorter than the Limit asked
  for: kinesis-mock answers 0 on every response, even when records remain, and a full page may have
  more behind it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import botocore.exceptions
import google.protobuf.message
from aws_kinesis_agg import DIGEST_SIZE as KPL_DIGEST_SIZE
from aws_kinesis_agg import MAGIC as KPL_MAGIC

# The package's generated schema imports its sibling as a top-level module, which only its
# deaggregator module makes importable (it puts the package's folder on sys.path).
from aws_kinesis_agg.deaggregator import messages_pb2 as kpl_messages

from lease_core.aws import THROTTLING_CODES, AwsCaller, error_code
from lease_core.errors import DependencyError, InvalidSequenceNumberError, StreamNotFoundError
from lease_core.model.sequence import SHARD_END, ExtendedSequenceNumber, Sentinel
from lease_core.model.shards import ChildShard
from lease_core.retrieval.kinesis_records import KinesisRecord
from lease_core.retry import RetryPolicy

log = logging.getLogger(__name__)

StopReason = Literal["tip", "records", "bytes", "time", "stop_at", "shard_end", "throttled", "gap", "no_shard_end"]

# GetRecords returns at most 10,000 records per call.
MAX_GET_RECORDS_LIMIT = 10000
# Kinesis' read limit per shard (shared by every reader of the shard).
KINESIS_SHARD_READ_BYTES_PER_SECOND = 2 * 1024 * 1024
# 5 GetRecords per second per shard, with 5 ms to spare: a call exactly 1 s after the fifth one
# before it is on the edge of Kinesis' second, and clock or network jitter puts it inside as often
# as not (measured on the stand-in: a throttled call, then a retry-policy backoff).
MIN_CALL_INTERVAL_SECONDS = 0.205
# Answers of no records and a next iterator at the tip of a closed shard before a batch gives up on
# its end ("no_shard_end"): Kinesis answers the end to the first call after the last records.
CLOSED_SHARD_EMPTY_ANSWERS = 5
# Kinesis' own code for a throttled KMS decrypt of an encrypted stream is not in lease_core's set.
READ_THROTTLING_CODES = THROTTLING_CODES | {"KMSThrottlingException"}
# GetShardIterator's answers to a sequence number the shard does not hold: Kinesis says
# InvalidArgumentException, kinesis-mock ResourceNotFoundException (a missing stream is told apart by
# the trim-horizon call that follows).
_SEQUENCE_NUMBER_REFUSALS = frozenset({"InvalidArgumentException", "ResourceNotFoundException"})


@dataclass(frozen=True)
class ReadLimits:
    max_records: int | None = None  # user records (after deaggregation)
    max_bytes: int | None = None  # sum of len(data) of user records
    deadline: float | None = None  # a value of the reader's monotonic clock; stop reading once reached
    stop_at: ExtendedSequenceNumber | None = None  # inclusive last position; SHARD_END = to the shard's end

    def __post_init__(self) -> None:
        # A limit of 0 would return empty batches forever: a caller bug, not a batch size.
        if self.max_records is not None and self.max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {self.max_records}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {self.max_bytes}")
        if self.stop_at is not None and self.stop_at.is_sentinel and not self.stop_at.is_shard_end:
            raise ValueError(f"stop_at must be a sequence number or SHARD_END, not {self.stop_at}")

    def stop_at_reached(self, position: ExtendedSequenceNumber | None) -> bool:
        """True when `position` (the last one delivered) is at or past a real stop_at."""
        if self.stop_at is None or self.stop_at.is_shard_end or position is None:
            return False
        return position >= self.stop_at


@dataclass(frozen=True)
class RetentionGap:
    """Records after `after` and before `first_available` aged out of the stream before they were read."""

    after: ExtendedSequenceNumber
    first_available: str | None  # the first record still in the shard, None if the shard is empty now
    first_available_arrival: datetime | None


@dataclass(frozen=True)
class ReadBatch:
    records: tuple[KinesisRecord, ...]  # by position, after the previous batch's end, none past stop_at
    end: ExtendedSequenceNumber | None  # SHARD_END when shard_ended, else the last record's position, else None
    shard_ended: bool  # every record of this closed shard has been delivered (this batch or earlier)
    child_shards: tuple[ChildShard, ...]  # GetRecords' ChildShards, reported once the shard ended
    stopped_by: StopReason
    millis_behind_latest: int | None  # from the last GetRecords response of this batch
    gap: RetentionGap | None  # the gap before this batch's records; a second one waits for the next batch ("gap")
    bytes: int  # sum of len(data) of records
    get_records_calls: int  # GetRecords requests sent, throttled ones included
    throttled_calls: int
    expired_iterators: int


@dataclass(frozen=True)
class IteratorSpec:
    """The arguments of one GetShardIterator call (besides stream and shard)."""

    iterator_type: str
    sequence_number: str | None = None
    timestamp: datetime | None = None

    def arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {"ShardIteratorType": self.iterator_type}
        if self.sequence_number is not None:
            arguments["StartingSequenceNumber"] = self.sequence_number
        if self.timestamp is not None:
            arguments["Timestamp"] = self.timestamp
        return arguments


TRIM_HORIZON_SPEC = IteratorSpec("TRIM_HORIZON")
# Kinesis keeps records at least this long (a stream's retention is 24 hours to 365 days).
MIN_RETENTION_HOURS = 24
LATEST_SPEC = IteratorSpec("LATEST")


def start_spec(
    shard_id: str, start: ExtendedSequenceNumber, at_timestamp: datetime | None, latest_since: datetime | None = None
) -> IteratorSpec:
    """Where reading from a lease's committed checkpoint `start` begins. `latest_since` is the pin of
    a lease at LATEST (`Lease.latest_start`): such a lease reads on from that moment, not from now."""
    sentinel = start.sentinel
    if sentinel is Sentinel.LATEST and latest_since is not None:
        return IteratorSpec("AT_TIMESTAMP", timestamp=latest_since)
    if sentinel is Sentinel.SHARD_END:
        raise ValueError(f"shard {shard_id} is checkpointed at SHARD_END: a finished lease is never read")
    if sentinel is Sentinel.AT_TIMESTAMP:
        if at_timestamp is None:
            raise ValueError(f"shard {shard_id} starts AT_TIMESTAMP but no at_timestamp was given")
        return IteratorSpec("AT_TIMESTAMP", timestamp=at_timestamp)
    if sentinel is not None:
        return IteratorSpec(sentinel.value)
    return IteratorSpec("AT_SEQUENCE_NUMBER", sequence_number=start.sequence_number)


def user_records(records: Iterable[Mapping[str, Any]]) -> list[KinesisRecord]:
    """GetRecords' records as user records: KPL aggregates split, plain records at sub-sequence 0."""
    found: list[KinesisRecord] = []
    for record in records:
        data = record["Data"]
        arrival = _utc(record["ApproximateArrivalTimestamp"])
        aggregated = _kpl_user_records(record, arrival) if data[: len(KPL_MAGIC)] == KPL_MAGIC else None
        if aggregated is not None:
            found.extend(aggregated)
        else:
            found.append(KinesisRecord(record["SequenceNumber"], 0, _partition_key(record), arrival, bytes(data)))
    return found


def _partition_key(record: Mapping[str, Any]) -> str:
    # A stream with the AUTO record distribution returns no PartitionKey when the producer gave none.
    return str(record.get("PartitionKey") or "")


def _kpl_user_records(record: Mapping[str, Any], arrival: datetime) -> list[KinesisRecord] | None:
    """The user records of a KPL aggregate (KCL's format: magic, protobuf message, MD5 digest of the
    message), or None when `record` is not one after all: it is then a plain record, as KCL takes it.

    aws_kinesis_agg's schema reads the message; its deaggregator is not used, because it converts
    every user record to Lambda's format, base64 included (most of a KPL reader's CPU), and an
    aggregate that breaks part-way is printed to stderr with its remaining user records dropped.
    Here a message that is not whole and valid leaves the record plain, as KCL does: nothing is ever
    dropped, and no producer's record can stop a shard.
    """
    data = record["Data"]
    message, digest = data[len(KPL_MAGIC) : -KPL_DIGEST_SIZE], data[-KPL_DIGEST_SIZE:]
    if len(data) <= len(KPL_MAGIC) + KPL_DIGEST_SIZE or hashlib.md5(message).digest() != digest:
        return None
    aggregate = kpl_messages.AggregatedRecord()
    try:
        aggregate.ParseFromString(message)
    except google.protobuf.message.DecodeError:
        return _not_an_aggregate(record, "its message does not decode")
    keys, hash_keys = aggregate.partition_key_table, aggregate.explicit_hash_key_table
    for entry in aggregate.records:
        # Indexes are uint64: one past its table (or past 2**63, which a list refuses as a type) names nothing.
        if entry.partition_key_index >= len(keys) or (
            entry.HasField("explicit_hash_key_index") and entry.explicit_hash_key_index >= len(hash_keys)
        ):
            return _not_an_aggregate(record, "a user record names a key its tables do not hold")
    if not aggregate.IsInitialized():
        return _not_an_aggregate(record, "its message lacks a required field")
    return [
        KinesisRecord(
            record["SequenceNumber"],
            index,
            keys[entry.partition_key_index],
            arrival,
            entry.data,
            hash_keys[entry.explicit_hash_key_index] if entry.HasField("explicit_hash_key_index") else None,
        )
        for index, entry in enumerate(aggregate.records)
    ]


def _not_an_aggregate(record: Mapping[str, Any], why: str) -> list[KinesisRecord] | None:
    """None (the record is a plain one), with a warning naming it and `why`."""
    log.warning(
        "record %s starts like a KPL aggregate but %s: it is landed as one record", record["SequenceNumber"], why
    )
    return None


def _refuses_the_future(error: botocore.exceptions.ClientError) -> bool:
    """Kinesis' answer to an AT_TIMESTAMP after its own clock (kinesis-mock: "Timestamp cannot be in the future")."""
    message = str(error.response.get("Error", {}).get("Message", ""))
    return error_code(error) == "InvalidArgumentException" and "future" in message.lower()


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


@dataclass(frozen=True)
class _GapCheck:
    """A check due on the first record behind an AT_SEQUENCE_NUMBER iterator.

    `sequence_number` is the record the iterator should start at; `after` is the last position read
    before it (the checkpoint, or the last user record fetched). A first record above it means
    records after `after` aged out; if Kinesis refused the sequence number and the trim horizon is
    not above it, the number was never valid for the shard.
    """

    after: ExtendedSequenceNumber
    sequence_number: str | None  # None: any first record comes after a possible gap (an aged-out pin)
    refused: bool


class _Throttled(Exception):
    """GetRecords was throttled; the reader backs off itself and may end the batch gracefully."""


class _IteratorExpired(Exception):
    """The shard iterator outlived its 5 minutes; a fresh one re-opens at the last record fetched."""


class _SequenceNumberRefused(Exception):
    """GetShardIterator refused a sequence number (kinesis-mock says ResourceNotFoundException)."""


class _PinInTheFuture(Exception):
    """GetShardIterator refused a LATEST pin as later than Kinesis' own clock."""


@dataclass
class _Batch:
    """What one read() has gathered so far."""

    limits: ReadLimits
    records: list[KinesisRecord] = field(default_factory=list)
    bytes: int = 0
    at_tip: bool = False
    empty_at_tip: int = 0  # answers in a row with no records at the tip (of a closed shard: not its end yet)
    millis_behind_latest: int | None = None
    gap: RetentionGap | None = None
    get_records_calls: int = 0
    throttled_calls: int = 0
    expired_iterators: int = 0

    def refusal(self, record: KinesisRecord) -> StopReason | None:
        """Why `record` cannot join this batch, or None if it can."""
        stop_at = self.limits.stop_at
        if stop_at is not None and not stop_at.is_shard_end and record.order_key > stop_at.order_key:
            return "stop_at"
        if self.limits.max_records is not None and len(self.records) >= self.limits.max_records:
            return "records"
        # The first record always fits: one record above max_bytes must not stall the shard forever.
        max_bytes = self.limits.max_bytes
        if max_bytes is not None and self.records and self.bytes + len(record.data) > max_bytes:
            return "bytes"
        return None

    def add(self, record: KinesisRecord) -> None:
        self.records.append(record)
        self.bytes += len(record.data)

    def full(self) -> StopReason | None:
        if self.limits.max_records is not None and len(self.records) >= self.limits.max_records:
            return "records"
        if self.limits.max_bytes is not None and self.bytes >= self.limits.max_bytes:
            return "bytes"
        return None

    def call_limit(self, get_records_limit: int) -> int:
        if self.limits.max_records is None:
            return get_records_limit
        return max(1, min(get_records_limit, self.limits.max_records - len(self.records)))


class ShardReader:
    """Reads one shard from a checkpoint in batches; each read() continues where the last one ended.

    `closed` says the shard is closed (listed with an EndingSequenceNumber): it is read to its null
    iterator whatever MillisBehindLatest says (module doc); a real `ending_sequence_number` implies it.
    `start_inclusive` delivers the record at `start` too (a replay of a prepared batch from its first
    record); `read_before_start` must then name the position read before it, which a gap that took
    `start` itself is reported after. A `start` at LATEST reads from `latest_since` when given (the
    lease's pin). Throttled GetRecords calls back off by the retry policy's
    delays through `sleep` (so a fake clock sees them) and end the batch gracefully once the policy's
    attempts are spent; 5xx and transport failures are retried by `AwsCaller` and then raise `DependencyError`.
    """

    def __init__(
        self,
        kinesis: Any,
        stream_name: str,
        shard_id: str,
        start: ExtendedSequenceNumber,
        *,
        start_inclusive: bool = False,
        read_before_start: ExtendedSequenceNumber | None = None,
        at_timestamp: datetime | None = None,
        latest_since: datetime | None = None,
        closed: bool = False,
        ending_sequence_number: str | None = None,
        retry_policy: RetryPolicy = RetryPolicy(),
        min_call_interval_seconds: float = MIN_CALL_INTERVAL_SECONDS,
        read_bytes_per_second: float | None = KINESIS_SHARD_READ_BYTES_PER_SECOND,
        get_records_limit: int = MAX_GET_RECORDS_LIMIT,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        busy_gate: AbstractContextManager[Any] | None = None,
    ) -> None:
        """`busy_gate` is held around each GetRecords call and its parsing (not around the waits): a
        slot reading many shards at once shares a few such lanes, so its own threads (the lease
        heartbeat above all) keep their share of the interpreter while every shard keeps reading."""
        if not 1 <= get_records_limit <= MAX_GET_RECORDS_LIMIT:
            raise ValueError(f"get_records_limit must be in 1..{MAX_GET_RECORDS_LIMIT}, not {get_records_limit}")
        if read_bytes_per_second is not None and read_bytes_per_second <= 0:
            raise ValueError(f"read_bytes_per_second must be positive (or None: unpaced), not {read_bytes_per_second}")
        self._resume = start_spec(shard_id, start, at_timestamp, latest_since)
        self._pinned_latest = start.sentinel is Sentinel.LATEST and latest_since is not None
        self._pin_checked = False
        self._wall_clock = wall_clock
        self._kinesis = kinesis
        self._stream_name = stream_name
        self._shard_id = shard_id
        self._start = start
        self._start_inclusive = start_inclusive
        self._ending_sequence_number = ending_sequence_number
        self._closed = closed or ending_sequence_number is not None
        self._policy = retry_policy
        self._caller = AwsCaller("kinesis", retry_policy)
        self._min_call_interval = min_call_interval_seconds
        self._read_rate = read_bytes_per_second
        self._get_records_limit = get_records_limit
        self._clock = clock
        self._sleep = sleep
        self._busy_gate = busy_gate or nullcontext()
        self._iterator: str | None = None
        self._gap_check: _GapCheck | None = None
        self._buffer: deque[KinesisRecord] = deque()
        # Detected, not yet on a batch; it comes before every buffered record (fetches fill an empty buffer).
        self._unreported_gap: RetentionGap | None = None
        if start_inclusive and read_before_start is None:
            raise ValueError(
                f"shard {shard_id}: an inclusive start needs read_before_start, what a gap is reported after"
            )
        # What a gap before the first record is reported after: an inclusive start is not read yet.
        self._fetched_through = read_before_start if start_inclusive and read_before_start is not None else start
        self._last_raw_sequence_number: int | None = None  # a re-open starts at it: it is dropped
        self._last_delivered: ExtendedSequenceNumber | None = None
        self._end_known = False
        self._end_observed = False
        self._child_shards: tuple[ChildShard, ...] = ()
        self._drops_first_record = False  # the open iterator starts at a record that will not be delivered
        self._last_call_at: float | None = None
        # When the bytes read so far are paid off at the read rate: Kinesis refuses calls before.
        self._read_paid_at: float | None = None

    def read(self, limits: ReadLimits) -> ReadBatch:
        batch = _Batch(limits)
        while True:
            reason = self._deliver(batch) or self._reason_not_to_fetch(batch)
            if reason is None and not self._fetch(batch):
                reason = "throttled"
            if reason is not None:
                return self._finish(batch, reason)

    # --- delivering ------------------------------------------------------------------------------

    def _deliver(self, batch: _Batch) -> StopReason | None:
        if self._unreported_gap is not None:
            if batch.gap is not None:  # a batch reports one gap: this one goes with the records behind it
                return "gap"
            batch.gap, self._unreported_gap = self._unreported_gap, None
        reason = None
        delivered = None
        while self._buffer:
            reason = batch.refusal(self._buffer[0])
            if reason is not None:
                break
            delivered = self._buffer.popleft()
            batch.add(delivered)
        if delivered is not None:
            self._last_delivered = delivered.position
        return reason

    def _reason_not_to_fetch(self, batch: _Batch) -> StopReason | None:
        """With the buffer drained: why this batch ends here, or None to fetch more."""
        stop_at_reached = batch.limits.stop_at_reached(self._last_delivered)
        # A replay ending exactly at the shard's last record ends at that record, as it was prepared.
        if self._end_observed and not (stop_at_reached and batch.records):
            return "shard_end"
        if stop_at_reached:
            return "stop_at"
        past_deadline = batch.limits.deadline is not None and self._next_call_at() >= batch.limits.deadline
        if self._end_known and not past_deadline:
            return None  # the one more call that collects ChildShards and observes the end
        full = batch.full()
        if full is not None:
            return full
        if batch.at_tip and not self._closed:
            return "tip"
        if batch.empty_at_tip >= CLOSED_SHARD_EMPTY_ANSWERS:
            return "no_shard_end"
        return "time" if past_deadline else None

    def _finish(self, batch: _Batch, reason: StopReason) -> ReadBatch:
        shard_ended = reason == "shard_end"
        end = SHARD_END if shard_ended else (batch.records[-1].position if batch.records else None)
        return ReadBatch(
            records=tuple(batch.records),
            end=end,
            shard_ended=shard_ended,
            child_shards=self._child_shards if shard_ended else (),
            stopped_by=reason,
            millis_behind_latest=batch.millis_behind_latest,
            gap=batch.gap,
            bytes=batch.bytes,
            get_records_calls=batch.get_records_calls,
            throttled_calls=batch.throttled_calls,
            expired_iterators=batch.expired_iterators,
        )

    # --- fetching --------------------------------------------------------------------------------

    def _fetch(self, batch: _Batch) -> bool:
        """One GetRecords (with its retries) into the buffer; False if throttling outlasted the policy."""
        if self._iterator is None:
            self._open(self._resume)
        limit = batch.call_limit(self._get_records_limit)
        if self._drops_first_record:
            # The iterator starts at a record already delivered: ask for it and for what was asked.
            limit = min(limit + 1, MAX_GET_RECORDS_LIMIT)
        response = self._get_records(batch, limit)
        if response is None:
            return False
        self._take(batch, response, limit)
        return True

    def _get_records(self, batch: _Batch, limit: int) -> dict[str, Any] | None:
        throttled = 0
        expired = 0
        while True:
            try:
                return self._caller.call("GetRecords", lambda: self._paced_get_records(batch, limit))
            except _Throttled:
                batch.throttled_calls += 1
                throttled += 1
                if throttled >= self._policy.attempts:
                    return None
                self._sleep(self._policy.delay_seconds(throttled))
            except _IteratorExpired:
                batch.expired_iterators += 1
                expired += 1
                if expired > self._policy.attempts:
                    raise DependencyError(
                        "kinesis", "GetRecords", "ExpiredIteratorException: fresh iterators keep expiring", expired
                    ) from None
                self._open(self._resume)

    def _paced_get_records(self, batch: _Batch, limit: int) -> dict[str, Any]:
        self._sleep_until(self._next_call_at())
        batch.get_records_calls += 1
        try:
            with self._busy_gate:
                # Kinesis counts a call when it arrives: pace from here, after any wait for a lane.
                called_at = self._last_call_at = self._clock()
                response: dict[str, Any] = self._kinesis.get_records(ShardIterator=self._iterator, Limit=limit)
            self._charge(called_at, response.get("Records", ()))
            return response
        except botocore.exceptions.ClientError as error:
            code = error_code(error)
            if code in READ_THROTTLING_CODES:
                raise _Throttled() from error
            if code == "ExpiredIteratorException":
                raise _IteratorExpired() from error
            if code == "ResourceNotFoundException":
                raise StreamNotFoundError(self._stream_name) from error
            raise  # 5xx are the retry policy's business, the rest AwsCaller's refusals

    def _charge(self, called_at: float, records: Iterable[Mapping[str, Any]]) -> None:
        """Account a response's bytes as Kinesis does (data plus partition key), from the call's start."""
        if self._read_rate is None:
            return
        size = sum(len(record["Data"]) + len(_partition_key(record).encode()) for record in records)
        paid_at = called_at if self._read_paid_at is None else max(called_at, self._read_paid_at)
        self._read_paid_at = paid_at + size / self._read_rate

    def _next_call_at(self) -> float:
        """When the next GetRecords may go out: 5 calls per second per shard, and the bytes read so
        far paid off at the read rate, are Kinesis' limits."""
        now = self._clock()
        if self._last_call_at is None:
            return now
        return max(now, self._last_call_at + self._min_call_interval, self._read_paid_at or now)

    def _sleep_until(self, moment: float) -> None:
        wait = moment - self._clock()
        if wait > 0:
            self._sleep(wait)

    def _take(self, batch: _Batch, response: Mapping[str, Any], limit: int) -> None:
        raw = response.get("Records", [])
        batch.millis_behind_latest = response.get("MillisBehindLatest")
        if response.get("ChildShards"):
            self._child_shards = tuple(ChildShard.from_api(child) for child in response["ChildShards"])
        self._iterator = response.get("NextShardIterator")
        self._drops_first_record = False
        self._end_observed = self._iterator is None
        batch.at_tip = not self._end_observed and batch.millis_behind_latest == 0 and len(raw) < limit
        batch.empty_at_tip = batch.empty_at_tip + 1 if batch.at_tip and not raw else 0
        # Only the response holding the ending record asks for one more call: never loop on it.
        self._end_known = any(entry["SequenceNumber"] == self._ending_sequence_number for entry in raw)
        if raw:
            self._check_gap(raw[0])
            self._buffer_records(raw)
        elif self._end_observed or batch.at_tip:
            self._check_gap_on_empty_shard()

    def _buffer_records(self, raw: list[Mapping[str, Any]]) -> None:
        records = user_records(entry for entry in raw if self._not_fetched_yet(entry))
        if records:  # an aggregate holding no user records yields none
            self._fetched_through = records[-1].position
        # A whole aggregate is fetched at once, so a re-open may drop the last one as a whole.
        self._last_raw_sequence_number = int(raw[-1]["SequenceNumber"])
        self._resume = IteratorSpec("AT_SEQUENCE_NUMBER", sequence_number=raw[-1]["SequenceNumber"])
        self._buffer.extend(record for record in records if self._after_start(record))

    def _not_fetched_yet(self, entry: Mapping[str, Any]) -> bool:
        last = self._last_raw_sequence_number
        return last is None or int(entry["SequenceNumber"]) > last

    def _after_start(self, record: KinesisRecord) -> bool:
        key, start = record.order_key, self._start.order_key
        return key > start or (self._start_inclusive and key == start)

    # --- iterators and retention -----------------------------------------------------------------

    def _open(self, spec: IteratorSpec) -> None:
        """A fresh iterator for `spec`, falling back to the trim horizon if its sequence number is refused."""
        try:
            self._iterator = self._get_shard_iterator(spec)
        except _PinInTheFuture:
            # The host that pinned runs ahead of Kinesis: its now is before the pin, so LATEST holds
            # every record after the pin (and nothing after LATEST was landed). The pin stays for the
            # next open: by then it is likely in Kinesis' past.
            log.warning(
                "shard %s of %r: its LATEST pin %s is ahead of Kinesis' clock; reading from LATEST",
                self._shard_id,
                self._stream_name,
                spec.timestamp,
            )
            self._iterator = self._get_shard_iterator(LATEST_SPEC)
            return
        except _SequenceNumberRefused:
            self._iterator = self._get_shard_iterator(TRIM_HORIZON_SPEC)
            self._resume = TRIM_HORIZON_SPEC
            self._gap_check = _GapCheck(self._fetched_through, str(spec.sequence_number), refused=True)
            return
        if self._pinned_latest and spec.iterator_type == "AT_TIMESTAMP" and self._pin_aged_out(spec):
            self._gap_check = _GapCheck(self._fetched_through, None, refused=False)
        if spec.iterator_type == "AT_SEQUENCE_NUMBER":
            self._gap_check = _GapCheck(self._fetched_through, str(spec.sequence_number), refused=False)
            # Its first record is one already fetched, or the checkpoint's own, unless the start is inclusive.
            self._drops_first_record = self._last_raw_sequence_number is not None or not self._start_inclusive

    def _pin_aged_out(self, spec: IteratorSpec) -> bool:
        """Whether records after a LATEST pin may have aged out unread: the pin is older than the
        stream's retention (asked only past Kinesis' minimum retention, and once per reader). Kinesis
        then starts the iterator at the trim horizon, and the first record read follows a possible gap."""
        pin = spec.timestamp
        if pin is None or self._pin_checked:
            return False
        self._pin_checked = True
        age_hours = (self._wall_clock() - pin.timestamp()) / 3600
        if age_hours <= MIN_RETENTION_HOURS:
            return False

        def retention_hours() -> int:
            summary = self._kinesis.describe_stream_summary(StreamName=self._stream_name)["StreamDescriptionSummary"]
            return int(summary["RetentionPeriodHours"])

        return age_hours > self._caller.call("DescribeStreamSummary", retention_hours)

    def _get_shard_iterator(self, spec: IteratorSpec) -> str:
        def call() -> str:
            try:
                response = self._kinesis.get_shard_iterator(
                    StreamName=self._stream_name, ShardId=self._shard_id, **spec.arguments()
                )
            except botocore.exceptions.ClientError as error:
                code = error_code(error)
                if spec.sequence_number is not None and code in _SEQUENCE_NUMBER_REFUSALS:
                    raise _SequenceNumberRefused() from error
                if self._pinned_latest and spec.iterator_type == "AT_TIMESTAMP" and _refuses_the_future(error):
                    raise _PinInTheFuture() from error
                if code == "ResourceNotFoundException":
                    raise StreamNotFoundError(self._stream_name) from error
                raise
            return str(response["ShardIterator"])

        return self._caller.call("GetShardIterator", call)

    def _check_gap(self, first: Mapping[str, Any]) -> None:
        check, self._gap_check = self._gap_check, None
        if check is None:
            return
        if check.sequence_number is None or int(first["SequenceNumber"]) > int(check.sequence_number):
            arrival = _utc(first["ApproximateArrivalTimestamp"])
            self._unreported_gap = RetentionGap(check.after, first["SequenceNumber"], arrival)
        elif check.refused:
            raise InvalidSequenceNumberError(
                check.sequence_number,
                f"Kinesis refused it for shard {self._shard_id} of stream {self._stream_name!r}, and the shard's "
                f"trim horizon {first['SequenceNumber']} is not above it: it is not a position of this shard",
            )

    def _check_gap_on_empty_shard(self) -> None:
        # Nothing at or after the asked-for record is left at all: everything after it aged out.
        # An aged-out pin waits for its first record instead: with none, nothing may have been lost,
        # and the lease, still at LATEST, would report the same gap every round.
        if self._gap_check is not None and self._gap_check.sequence_number is not None:
            self._unreported_gap = RetentionGap(self._gap_check.after, None, None)
            self._gap_check = None
