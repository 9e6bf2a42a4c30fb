"""SubscribeToShard for kinesis-mock, served by the fault proxy (devtools/fault_proxy.py) from kinesis-mock's
own GetShardIterator and GetRecords, so the fault campaign can read by enhanced fan-out while it writes,
splits, merges and trims the stream on kinesis-mock.

Why: kinesis-mock implements SubscribeToShard, but never sends the `initial-response` event botocore
requires, so boto3 cannot read its answer; and the Kinesis stand-in (devtools/kinesis_standin.py),
which can, serves pre-built records and takes no writes or reshards. kinesis-mock does implement the
consumers (Register/Describe/List/DeregisterStreamConsumer, ARNs with the creation time), so the
bridge asks it whether a consumer exists and is ACTIVE, and keeps the subscriptions itself, with the
service's rules as the stand-in keeps them:

- one subscription per consumer and shard: a new one within `in_use_seconds` (5 s) of the open one's
  start is refused with ResourceInUseException; a later one takes over, and the open one ends with a
  ResourceInUseException exception event;
- a consumer kinesis-mock does not find (deregistered, or re-created under a new ARN) is refused with
  ResourceNotFoundException; one not ACTIVE (CREATING, DELETING) with ResourceInUseException; the open
  subscriptions of a consumer no longer ACTIVE end with a ResourceNotFoundException exception event
  within `CONSUMER_CHECK_SECONDS`;
- the events: `initial-response`, then SubscribeToShardEvents of the records GetRecords returns
  (ContinuationSequenceNumber: the last record pushed), an empty event every `heartbeat_seconds`
  without records, and the shard's end as an event with ChildShards and a null continuation: with
  the last records, or one event after them when the proxy ends shards after their last records
  (the bridge reads through the proxy's GetRecords, which does that rewrite); a subscription ends
  after `subscription_seconds`;
- the starting position goes through the proxy's GetShardIterator, so a retention trim applies to
  subscriptions as to polling (a trimmed sequence number is refused with InvalidArgumentException).

Faults (`cut`): the open subscriptions of a shard end with an exception event of a type botocore
models in the stream, or their connection is reset mid-stream (`RESET`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from devtools import event_stream

RESET = "reset"
CONSUMER_CHECK_SECONDS = 1.0

# (status, JSON answer) of one Kinesis call made through the proxy: operation, request, the subscriber's
# signing headers (kinesis-mock reads the region from them, and refuses a call without them).
Signing = tuple[tuple[str, str], ...]
KinesisCall = Callable[[str, dict[str, Any], Signing], tuple[int, dict[str, Any]]]


class SubscriptionRefused(Exception):
    """SubscribeToShard answered with an error before any event."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


class SubscriptionReset(Exception):
    """The subscription's connection is to be reset (a fault): the proxy closes it without an end."""


@dataclass
class _Open:
    consumer_arn: str
    stream: str
    shard_id: str
    started: float
    resume_after: str  # what an event before any record names as its continuation
    authorization: Signing
    ended_by: str | None = None  # an exception type, or RESET
    message: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.consumer_arn, self.shard_id)


def stream_of_consumer(consumer_arn: str) -> str:
    """The stream name inside a consumer ARN (`arn:...:stream/<name>/consumer/<consumer>:<epoch>`)."""
    _, found, rest = consumer_arn.partition(":stream/")
    name, found_consumer, _ = rest.partition("/consumer/")
    if not found or not found_consumer or not name:
        raise SubscriptionRefused("InvalidArgumentException", f"{consumer_arn!r} is not a stream consumer's ARN")
    return name


def iterator_request(stream: str, shard_id: str, starting: dict[str, Any]) -> dict[str, Any]:
    """The GetShardIterator request that starts where SubscribeToShard's StartingPosition says."""
    kind = starting.get("Type")
    if kind not in ("TRIM_HORIZON", "LATEST", "AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER", "AT_TIMESTAMP"):
        raise SubscriptionRefused("InvalidArgumentException", f"StartingPosition.Type {kind!r} is not a position")
    request: dict[str, Any] = {"StreamName": stream, "ShardId": shard_id, "ShardIteratorType": kind}
    if "SequenceNumber" in starting:
        request["StartingSequenceNumber"] = starting["SequenceNumber"]
    if "Timestamp" in starting:
        request["Timestamp"] = starting["Timestamp"]
    return request


class SubscriptionBridge:
    def __init__(
        self,
        call: KinesisCall,
        *,
        in_use_seconds: float = 5.0,
        subscription_seconds: float = 300.0,
        heartbeat_seconds: float = 1.0,
        poll_seconds: float = 0.2,
    ) -> None:
        self._call = call
        self.in_use_seconds = in_use_seconds
        self.subscription_seconds = subscription_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.poll_seconds = poll_seconds
        self._open: list[_Open] = []
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self._opened: dict[tuple[str, str], int] = {}  # subscriptions opened by (stream, shard)

    def subscribe(
        self, request: dict[str, Any], authorization: Signing
    ) -> Callable[[Callable[[], bool]], Iterator[bytes]]:
        """Open a subscription (or raise `SubscriptionRefused`); the answer's events, given a test of
        whether the subscriber went away."""
        consumer_arn, shard_id = str(request.get("ConsumerARN")), str(request.get("ShardId"))
        stream = stream_of_consumer(consumer_arn)
        self._require_active(consumer_arn, authorization)
        starting = request.get("StartingPosition") or {}
        status, answer = self._call("GetShardIterator", iterator_request(stream, shard_id, starting), authorization)
        if status != 200:
            raise SubscriptionRefused(str(answer.get("__type", "InternalFailure")), str(answer.get("message", "")))
        resume_after = str(
            starting.get("SequenceNumber") or self._first_sequence_number(stream, shard_id, authorization)
        )
        now = time.monotonic()
        with self._lock:
            current = next((o for o in self._open if o.key == (consumer_arn, shard_id) and o.ended_by is None), None)
            if current is not None and now - current.started < self.in_use_seconds:
                self._count("refused_in_use")
                raise SubscriptionRefused(
                    "ResourceInUseException",
                    f"Another active subscription exists for this consumer: {consumer_arn} on shard {shard_id}.",
                )
            if current is not None:
                self._count("taken_over")
                current.ended_by = "ResourceInUseException"
                current.message = f"A newer subscription of {consumer_arn} took shard {shard_id} over."
            opened = _Open(consumer_arn, stream, shard_id, now, str(resume_after), authorization)
            self._open.append(opened)
            self._opened[(stream, shard_id)] = self._opened.get((stream, shard_id), 0) + 1
            self._count("subscriptions")
        iterator = str(answer["ShardIterator"])
        return lambda client_gone: self._events(opened, iterator, client_gone)

    def cut(self, stream: str, shard_id: str | None = None, how: str = RESET) -> int:
        """End the open subscriptions of the stream (or of one shard) mid-stream; how many."""
        if how != RESET and how not in event_stream.SUBSCRIPTION_ERRORS:
            raise ValueError(
                f"a subscription is cut by {RESET!r} or an exception event of "
                f"{sorted(event_stream.SUBSCRIPTION_ERRORS)}"
            )
        with self._lock:
            ended = [
                o for o in self._open if o.ended_by is None and o.stream == stream and shard_id in (None, o.shard_id)
            ]
            for opened in ended:
                opened.ended_by, opened.message = how, f"{how} (injected)"
        return len(ended)

    def opened(self, stream: str, shard_id: str) -> int:
        """How many subscriptions of the shard were opened so far, by any subscriber."""
        with self._lock:
            return self._opened.get((stream, shard_id), 0)

    def open_subscriptions(self, stream: str) -> list[tuple[str, str]]:
        """(consumer ARN, shard id) of the stream's open subscriptions."""
        with self._lock:
            return [o.key for o in self._open if o.ended_by is None and o.stream == stream]

    def _require_active(self, consumer_arn: str, authorization: Signing) -> None:
        status, answer = self._call("DescribeStreamConsumer", {"ConsumerARN": consumer_arn}, authorization)
        if status != 200:
            raise SubscriptionRefused("ResourceNotFoundException", f"Consumer {consumer_arn} not found.")
        state = answer.get("ConsumerDescription", {}).get("ConsumerStatus")
        if state != "ACTIVE":
            raise SubscriptionRefused(
                "ResourceInUseException", f"Consumer {consumer_arn} is not in ACTIVE status (it is {state})."
            )

    def _first_sequence_number(self, stream: str, shard_id: str, authorization: Signing) -> str:
        """The shard's starting sequence number (below its first record), as Kinesis names it before any record."""
        status, answer = self._call("ListShards", {"StreamName": stream, "MaxResults": 10000}, authorization)
        shards = answer.get("Shards", []) if status == 200 else []
        found = next((shard for shard in shards if shard.get("ShardId") == shard_id), None)
        if found is None:
            raise SubscriptionRefused("ResourceNotFoundException", f"Shard {shard_id} in stream {stream} not found.")
        return str(found["SequenceNumberRange"]["StartingSequenceNumber"])

    def _events(self, opened: _Open, iterator: str, client_gone: Callable[[], bool]) -> Iterator[bytes]:
        try:
            yield event_stream.event("initial-response", b"{}")
            yield from self._pushes(opened, iterator, client_gone)
        finally:
            with self._lock:
                if opened in self._open:
                    self._open.remove(opened)

    def _pushes(self, opened: _Open, iterator: str, client_gone: Callable[[], bool]) -> Iterator[bytes]:
        continuation = opened.resume_after
        quiet_since = consumer_checked = time.monotonic()
        ends_at = opened.started + self.subscription_seconds
        while True:
            now = time.monotonic()
            if opened.ended_by == RESET:
                self._count("reset")
                raise SubscriptionReset(opened.message)
            if opened.ended_by is not None:
                self._count(f"exception:{opened.ended_by}")
                yield event_stream.exception(opened.ended_by, json.dumps({"message": opened.message}).encode())
                return
            if now >= ends_at or client_gone():
                return
            if now - consumer_checked >= CONSUMER_CHECK_SECONDS:
                consumer_checked = now
                try:
                    self._require_active(opened.consumer_arn, opened.authorization)
                except SubscriptionRefused as refused:  # deregistered: DELETING, then gone
                    opened.ended_by, opened.message = "ResourceNotFoundException", refused.message
                    continue
            status, answer = self._call("GetRecords", {"ShardIterator": iterator}, opened.authorization)
            if status != 200:
                opened.ended_by = "InternalFailureException"
                opened.message = f"reading the shard failed: {answer.get('__type')}: {answer.get('message')}"
                continue
            records = answer.get("Records") or []
            following = answer.get("NextShardIterator")
            if records:
                continuation = str(records[-1]["SequenceNumber"])
            if records or following is None or now - quiet_since >= self.heartbeat_seconds:
                body: dict[str, Any] = {
                    "Records": records,
                    "ContinuationSequenceNumber": None if following is None else continuation,
                    "MillisBehindLatest": answer.get("MillisBehindLatest", 0),
                }
                if following is None:
                    body["ChildShards"] = answer.get("ChildShards") or []
                yield event_stream.event("SubscribeToShardEvent", json.dumps(body).encode())
                quiet_since = time.monotonic()
                if following is None:
                    return
            iterator = str(following)
            if not records:
                time.sleep(self.poll_seconds)

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
