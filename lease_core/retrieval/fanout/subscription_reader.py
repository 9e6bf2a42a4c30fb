"""Reading one shard by enhanced fan-out: SubscribeToShard after SubscribeToShard, event after event.

What every mode shares is beside this package (`start_positions`, `kpl_deaggregation`,
`retention_gaps`, `record_batches`); what is fan-out's own:

- A subscription pushes SubscribeToShardEvents at the consumer's own 2 MB/s per shard. It is pulled
  one event at a time (botocore's EventStream over the HTTP/1.1 chunked body), so a reader that stops
  reading stops Kinesis by TCP's flow control: no event is buffered beyond the one being taken.
- A subscription lasts at most 5 minutes; its stream then ends, and the reader subscribes again
  AT_SEQUENCE_NUMBER of the last record fetched, dropping it (as polling re-opens an expired
  iterator: `retention_gaps` says why not AFTER the continuation). An exception event (a newer
  subscription took the shard over, an internal failure) or a broken connection does the same, within
  the retry policy's attempts without an event in between.
- The tip of an open shard is an event with MillisBehindLatest 0. An empty event with more is not:
  Kinesis sends one while the consumer's bytes are spent or as a heartbeat behind the tip.
- The end of a closed shard is the event with a null ContinuationSequenceNumber (and ChildShards),
  nothing else: a reader told its shard is closed reads on past MillisBehindLatest 0 until it comes,
  and gives up after a few empty events at the tip as "no_shard_end", as polling does.
- Kinesis allows 1 SubscribeToShard per second per consumer and shard, and refuses a second
  subscription within 5 s of the open one's start (ResourceInUseException): a reader keeps its own
  calls a second apart, and a refused call (LimitExceeded, ResourceInUse) waits at least a second
  before the next, ending the batch as "throttled" once the policy's attempts are spent (at least
  `MIN_REFUSALS`: Kinesis refuses for 5 s after a successful call, even one whose stream has ended).
- The consumer's ARN comes from the application (`ConsumerArns`); a consumer Kinesis no longer finds
  under it (deregistered, or re-created with a new ARN) is looked up again once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import botocore.exceptions
import urllib3.exceptions

from lease_core.aws import THROTTLING_CODES, AwsCaller, error_code, is_retryable
from lease_core.errors import DependencyError, StreamNotFoundError
from lease_core.model.kinesis_record_columns import KinesisRecordColumns
from lease_core.model.shards import ChildShard
from lease_core.retrieval.record_batches import BatchInProgress, FetchedRecords
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, ShardToRead, StopReason
from lease_core.retrieval.shard_opening import PinInTheFuture, SequenceNumberRefused, ShardOpening
from lease_core.retrieval.start_positions import (
    StartingPosition,
    at_sequence_number,
    starting_position,
)
from lease_core.retry import RetryPolicy

log = logging.getLogger(__name__)

# Kinesis: at most 1 SubscribeToShard per second per consumer and shard.
MIN_SUBSCRIBE_INTERVAL_SECONDS = 1.0
# Refused subscriptions a batch waits out, at least a second apart, whatever the retry policy's
# attempts: more than Kinesis' 5 s in-use window after a subscription's start (even an ended one's).
MIN_REFUSALS = 7
# Empty events at the tip of a closed shard before a batch gives up on its end ("no_shard_end").
CLOSED_SHARD_EMPTY_EVENTS = 5
# Refusals of a subscription: the call rate, a subscription still open (or a consumer not ACTIVE).
_REFUSAL_CODES = THROTTLING_CODES | {"ResourceInUseException", "KMSThrottlingException"}
# A broken subscription: the connection dropped or timed out between events.
_TRANSPORT_ERRORS = (
    botocore.exceptions.BotoCoreError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)


class ConsumerArns(Protocol):
    """The application's registered consumer of each stream, as SubscribeToShard names it."""

    def arn(self, stream_name: str) -> str:
        """The ACTIVE consumer's ARN on `stream_name`; a clear error naming it when there is none."""
        ...

    def refresh(self, stream_name: str, stale_arn: str) -> str:
        """The consumer's ARN again, after Kinesis no longer found `stale_arn` (re-created, or gone)."""
        ...


class _Refused(Exception):
    """Kinesis refused the subscription for a limit, or because another one is open."""


class _ConsumerNotFound(Exception):
    """Kinesis does not know the consumer ARN subscribed with."""


class SubscriptionReader:
    """A `RecordSource` of one shard by SubscribeToShard (module doc). `busy_gate` (`Retrieval.open`)
    is held around taking each event's records in; the wait for an event and botocore's parsing of it
    happen outside."""

    operation = "SubscribeToShard"

    def __init__(
        self,
        kinesis: Any,
        consumers: ConsumerArns,
        shard: ShardToRead,
        start: ReadStart,
        *,
        retry_policy: RetryPolicy = RetryPolicy(),
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        busy_gate: AbstractContextManager[Any] | None = None,
    ) -> None:
        self._resume = starting_position(shard.shard_id, start.position, start.at_timestamp, start.latest_since)
        self._kinesis = kinesis
        self._consumers = consumers
        self._shard = shard
        self._closed = shard.known_closed
        self._policy = retry_policy
        self._caller = AwsCaller("kinesis", retry_policy)
        self._clock = clock
        self._sleep = sleep
        self._busy_gate = busy_gate or nullcontext()
        self._records = FetchedRecords(shard, start)
        self._opening = ShardOpening(kinesis, self._caller, shard, start, self._records, wall_clock)
        self._consumer_arn: str | None = None
        self._refreshed = False  # the consumer's ARN was looked up again after Kinesis no longer found it
        self._stream: Any = None  # botocore's EventStream of the open subscription
        self._events: Iterator[Mapping[str, Any]] | None = None
        self._subscribed_at: float | None = None
        self._failures = 0  # subscriptions broken or refused since the last event
        self._end_observed = False
        self._child_shards: tuple[ChildShard, ...] = ()
        self._empty_events_at_tip = 0
        self._at_tip = False  # the last event taken was at the tip of the (open) shard

    def read(self, limits: ReadLimits) -> ReadBatch:
        batch = BatchInProgress(limits)
        # The last event said the tip: so it stands until the next one (a batch cut by a limit at
        # that event's last record ends the next read at the tip, not a heartbeat later).
        batch.at_tip = self._at_tip
        self._empty_events_at_tip = 0
        while True:
            reason = self._records.deliver(batch) or self._reason_not_to_fetch(batch)
            if reason is None and not self._next_event(batch):
                reason = "throttled"
            if reason is not None:
                return batch.finished(reason, self._child_shards)

    def close(self) -> None:
        """End the open subscription (its connection goes back to nobody: it is closed)."""
        self._unsubscribe()

    def _reason_not_to_fetch(self, batch: BatchInProgress) -> StopReason | None:
        """With the buffer drained: why this batch ends here, or None to take the next event."""
        stop_at_reached = batch.limits.stop_at_reached(self._records.last_delivered)
        if self._end_observed and not (stop_at_reached and batch.count):
            return "shard_end"
        if stop_at_reached:
            return "stop_at"
        if batch.limits.cancelled_now():
            return "cancelled"
        full = batch.full()
        if full is not None:
            return full
        if batch.at_tip and not self._closed:
            return "tip"
        if self._empty_events_at_tip >= CLOSED_SHARD_EMPTY_EVENTS:
            return "no_shard_end"
        if batch.limits.deadline is not None and self._clock() >= batch.limits.deadline:
            return "time"
        return None

    # --- events ----------------------------------------------------------------------------------

    def _next_event(self, batch: BatchInProgress) -> bool:
        """Take the next SubscribeToShardEvent into the buffer, subscribing (again) as needed; False
        when refusals outlasted the retry policy."""
        while True:
            if self._events is None and not self._subscribe(batch):
                return False
            assert self._events is not None
            try:
                event = next(self._events)
            except StopIteration:
                # The subscription's lifetime is over: the next one starts where this one stood.
                self._unsubscribe()
                batch.reopens += 1
                continue
            except botocore.exceptions.ClientError as error:  # an exception event
                self._unsubscribe()
                self._broken(batch, error)
                continue
            except _TRANSPORT_ERRORS as error:
                self._unsubscribe()
                self._broken(batch, error)
                continue
            self._failures = 0
            if "SubscribeToShardEvent" in event:
                with self._busy_gate:
                    self._take(batch, event["SubscribeToShardEvent"])
                return True

    def _broken(self, batch: BatchInProgress, error: Exception) -> None:
        """A subscription ended by an exception event or a broken connection: subscribe again where
        it stood, unless that keeps happening without an event in between."""
        code = error_code(error) if isinstance(error, botocore.exceptions.ClientError) else None
        if code == "ResourceNotFoundException":
            self._not_found()  # StreamNotFoundError when the stream is what went
            self._consumer_not_found()
            return
        if code is not None and code not in _REFUSAL_CODES and not is_retryable(error):
            raise self._caller.translate(self.operation, error, self._failures + 1) from error
        batch.reopens += 1
        self._failures += 1
        if self._failures > self._policy.attempts:
            raise DependencyError(
                "kinesis",
                self.operation,
                f"the subscriptions to shard {self._shard.shard_id} of {self._shard.stream_name!r} kept breaking "
                f"without an event: {error}",
                self._failures,
            ) from error
        self._sleep(max(MIN_SUBSCRIBE_INTERVAL_SECONDS, self._policy.delay_seconds(self._failures)))

    def _take(self, batch: BatchInProgress, event: Mapping[str, Any]) -> None:
        # Columns when lease_core's clients decoded the event (`aws`), botocore's record dicts otherwise.
        raw = KinesisRecordColumns.of(event.get("Records") or [])
        batch.millis_behind_latest = event.get("MillisBehindLatest")
        if event.get("ChildShards"):
            self._child_shards = tuple(ChildShard.from_api(child) for child in event["ChildShards"])
        self._end_observed = event.get("ContinuationSequenceNumber") is None
        batch.at_tip = self._at_tip = not self._end_observed and batch.millis_behind_latest == 0
        self._empty_events_at_tip = self._empty_events_at_tip + 1 if batch.at_tip and not raw else 0
        if raw:
            self._records.take(raw)
            self._resume = at_sequence_number(raw.sequence_number(-1))
        elif self._end_observed or batch.at_tip:
            self._records.take_none_left()
        if self._end_observed:
            self._unsubscribe()  # the stream ends with the shard's end

    # --- subscribing -----------------------------------------------------------------------------

    def _subscribe(self, batch: BatchInProgress) -> bool:
        """Open a subscription at the resume position (with polling's fallbacks); False when refused
        past the retry policy."""
        refused = 0
        while True:
            try:
                self._open(batch, self._resume)
                return True
            except _Refused:
                batch.refused_calls += 1
                refused += 1
                if refused >= max(self._policy.attempts, MIN_REFUSALS):
                    return False
                self._sleep(max(MIN_SUBSCRIBE_INTERVAL_SECONDS, self._policy.delay_seconds(refused)))
            except _ConsumerNotFound:
                self._consumer_not_found()

    def _consumer_not_found(self) -> None:
        """Kinesis no longer finds the consumer subscribed with: look its ARN up again (a clear error
        from `ConsumerArns` when it is gone), once per reader: an ARN that keeps vanishing is an error."""
        stale = self._consumer_arn
        if stale is None or self._refreshed:
            raise DependencyError(
                "kinesis",
                self.operation,
                f"Kinesis does not find the consumer {stale} of stream {self._shard.stream_name!r}",
                1,
            )
        self._refreshed = True
        self._consumer_arn = self._consumers.refresh(self._shard.stream_name, stale)

    def _open(self, batch: BatchInProgress, position: StartingPosition) -> None:
        """A subscription at `position`, with the fallbacks every mode shares (`shard_opening`)."""
        self._resume = self._opening.open(position, lambda opened: self._start_subscription(batch, opened))

    def _start_subscription(self, batch: BatchInProgress, position: StartingPosition) -> None:
        if self._consumer_arn is None:
            self._consumer_arn = self._consumers.arn(self._shard.stream_name)
        consumer_arn = self._consumer_arn
        starting: dict[str, Any] = {"Type": position.kind}
        if position.sequence_number is not None:
            starting["SequenceNumber"] = position.sequence_number
        if position.timestamp is not None:
            starting["Timestamp"] = position.timestamp

        def call() -> Any:
            self._keep_call_rate()
            batch.calls += 1
            self._subscribed_at = self._clock()
            try:
                return self._kinesis.subscribe_to_shard(
                    ConsumerARN=consumer_arn, ShardId=self._shard.shard_id, StartingPosition=starting
                )
            except botocore.exceptions.ClientError as error:
                meaning = self._subscribe_refusal(error, position)
                if meaning is None:
                    raise
                raise meaning from error

        response = self._caller.call(self.operation, call)
        self._stream = response["EventStream"]
        self._events = iter(self._stream)

    def _subscribe_refusal(
        self, error: botocore.exceptions.ClientError, position: StartingPosition
    ) -> Exception | None:
        """What a refused SubscribeToShard means to the reader (None when it is not its business)."""
        code = error_code(error)
        if code in _REFUSAL_CODES:
            return _Refused()
        if code == "ResourceNotFoundException":
            return self._not_found()
        if code == "InvalidArgumentException":
            message = str(error.response.get("Error", {}).get("Message", "")).lower()
            if position.sequence_number is not None and "sequence" in message:
                return SequenceNumberRefused()
            if self._opening.pin_refused(position, error):
                return PinInTheFuture()
        return None

    def _not_found(self) -> Exception:
        """ResourceNotFoundException names the consumer, the stream or the shard: the stream is told
        apart by describing it, and a shard of a stream that exists is always listed before it is read."""

        def describe() -> None:
            try:
                self._kinesis.describe_stream_summary(StreamName=self._shard.stream_name)
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    raise StreamNotFoundError(self._shard.stream_name) from error
                raise

        self._caller.call("DescribeStreamSummary", describe)
        return _ConsumerNotFound()

    def _keep_call_rate(self) -> None:
        if self._subscribed_at is not None:
            wait = self._subscribed_at + MIN_SUBSCRIBE_INTERVAL_SECONDS - self._clock()
            if wait > 0:
                self._sleep(wait)

    def _unsubscribe(self) -> None:
        stream, self._stream, self._events = self._stream, None, None
        if stream is not None:
            try:
                stream.close()
            except Exception:  # closing a broken connection must not hide why it broke
                log.debug("closing the subscription to shard %s failed", self._shard.shard_id, exc_info=True)
