"""A Kinesis stand-in for benchmarks and tests: a loopback HTTP server that speaks the JSON 1.1 protocol
boto3 uses, serves pre-built records at memory speed and enforces Kinesis' per-shard read limits.

Why it exists: the emulators serve GetRecords at 8,600 (kinesis-mock) to 25,000 (moto)
records/s and never throttle, so a reader's efficiency against Kinesis' own limit (2 MiB/s and 5
GetRecords calls/s per shard) cannot be measured on them. This server serves the records it built at
start-up by joining pre-serialised JSON fragments, and throttles like Kinesis does:

- calls: at most `get_records_per_second` accepted GetRecords calls per shard in any sliding second;
- bytes: a per-shard byte bucket refilled at `read_bytes_per_second` and holding at most
  `burst_seconds` of it. A call is refused while the bucket is in debt; the bytes a call returns are
  charged after it, so one 10 MB answer at 2 MiB/s refuses the shard's calls for the next ~4-5 s,
  as Kinesis does. Bytes count as Kinesis counts a record: its data plus its partition key;
- size: at most `max_records_per_call` records and `max_bytes_per_call` bytes per answer.
Every refusal is answered with HTTP 400 ProvisionedThroughputExceededException (botocore's error
shape) and counted by kind and shard; `stats()` (GET /stats) returns the counters, the bytes and
records served, and the server process' CPU seconds, so a benchmark can tell when it measures this
server instead of its client.

The server runs in its own process (`python -m devtools.kinesis_standin`), so its CPU is not charged
to the reader under test, nor does it share the reader's GIL. Records are generated there,
deterministically, from a spec: each record's data starts with `<stream>/<shard id>/<index>/`,
padded to `record_bytes`; an aggregated stream's records are KPL aggregates (aws_kinesis_agg) of
`aggregate_size` such user records. A `split` stream's shards are closed parents, each with two open
children (with their own records), for lineage: the end of a parent answers a null
NextShardIterator and ChildShards, either to the call after the one that returned its last records
(`shard_end="after_last_records"`, as the GetRecords documentation describes real Kinesis: the last
records come with a next iterator and MillisBehindLatest 0) or with those records
(`"with_last_records"`, as kinesis-mock does). Arrival times spread over `backlog_seconds` before start-up.
Sequence numbers are 56-digit decimal strings, increasing per shard and across the lineage.

Enhanced fan-out, which the emulators cannot serve to boto3 (moto does not implement SubscribeToShard;
kinesis-mock's stream has no initial-response, which botocore requires), with its own limits
(`FanOutLimits`, per consumer and shard: polling and fan-out readers of a shard never throttle each other):

- consumers: RegisterStreamConsumer answers a consumer in CREATING that is ACTIVE
  `activation_seconds` later (short by default; Kinesis takes seconds), at most `max_consumers` (20)
  per stream and `max_creating_consumers` (5) in CREATING at once (LimitExceededException);
  DeregisterStreamConsumer makes it DELETING for `deletion_seconds`, then it is gone. ARNs are
  Kinesis' `<stream ARN>/consumer/<name>:<creation epoch seconds>`, so an ARN of a consumer since
  re-created under the same name is not found.
- SubscribeToShard answers HTTP/1.1 with a chunked `application/vnd.amazon.eventstream` body
  (devtools/event_stream.py; each open subscription holds one server thread), which boto3's
  `subscribe_to_shard` reads as an EventStream: first an `initial-response` event (botocore requires
  it), then SubscribeToShardEvents of Records, ContinuationSequenceNumber (the last record pushed:
  resume AFTER it) and MillisBehindLatest, pushed as the consumer's byte bucket allows
  (`read_bytes_per_second`, 2 MiB/s, like the polling bucket, at most `max_event_bytes` per event).
  Without records to push for `heartbeat_seconds` (5 s) an empty event goes out: MillisBehindLatest
  0 at the tip, more while the bucket is in debt (an empty event is not the tip). A closed shard ends
  with an event of ChildShards and a null continuation, after its last records or with them as
  `shard_end` says, and the stream ends.
- a subscription lasts `subscription_seconds` (5 minutes), then its stream ends; at most
  `subscribe_calls_per_second` (1) per consumer and shard (LimitExceededException); a consumer not
  ACTIVE gets ResourceInUseException, an unknown one ResourceNotFoundException. One subscription per
  consumer and shard: a new one within `in_use_seconds` (5 s) of the open one's start is refused
  with ResourceInUseException; a later one takes over, and the open one ends with a
  ResourceInUseException exception event. (Kinesis documents the 5 s from "a successful call"; here
  they count while that subscription is open, the "Another active subscription" its message names.)
- errors inside a stream are exception events: the takeover above, ResourceNotFoundException to the
  subscriptions of a consumer being deregistered, and any modelled one injected with
  `fail_subscriptions()` (POST /_standin/fail_subscriptions). Stopping the server ends the open
  subscriptions' streams as their lifetime would.
Every refusal is counted by kind (`FAN_OUT_VIOLATION_KINDS`) under `stats()["fan_out"]`, with the
events, heartbeats, records and bytes pushed per consumer and shard; `reset()` starts those over too.

Operations: ListShards (NextToken paging, MaxResults, ShardFilter, ExclusiveStartShardId),
DescribeStreamSummary, GetShardIterator (TRIM_HORIZON, LATEST, AT/AFTER_SEQUENCE_NUMBER, AT_TIMESTAMP),
GetRecords (Limit, MillisBehindLatest, iterators expiring after `iterator_ttl_seconds`),
Register/Describe/Deregister StreamConsumer, ListStreamConsumers (NextToken paging, MaxResults) and
SubscribeToShard (the same starting positions). Nothing is ever written: PutRecord(s) is not served.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from devtools import event_stream

LOOPBACK = "127.0.0.1"
REPOSITORY = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
MAX_HASH_KEY = 2**128 - 1
ACCOUNT = "123456789012"
REGION = "us-east-1"
# 56 digits, like Kinesis' "49590338271490256608559692538361571095921575989136588898".
SEQUENCE_BASE = 49_590_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000
SHARD_SEQUENCE_STRIDE = 10**30  # a later shard (a child) numbers above every earlier one
RECORD_SEQUENCE_STRIDE = 10**8
JSON_CONTENT_TYPE = "application/x-amz-json-1.1"
TARGET_PREFIX = "Kinesis_20131202."
STARTUP_TIMEOUT_SECONDS = 120.0
THROTTLED = "ProvisionedThroughputExceededException"
VIOLATION_KINDS = ("calls_per_second", "bytes_per_second")
# When a closed shard answers its end: to the call after its last records (real Kinesis), or with them.
SHARD_ENDS = ("after_last_records", "with_last_records")
EVENT_STREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
FAN_OUT_VIOLATION_KINDS = (
    "subscribe_calls_per_second",  # LimitExceededException: more than 1 SubscribeToShard a second
    "subscription_in_use",  # ResourceInUseException: a new subscription within 5 s of the open one's start
    "consumer_not_active",  # ResourceInUseException: a subscription of a CREATING or DELETING consumer
    "consumers_per_stream",  # LimitExceededException: a 21st consumer
    "consumers_creating",  # LimitExceededException: a 6th consumer in CREATING at once
)
CONSUMER_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")
CLIENT_CHECK_SECONDS = 0.25  # how often an idle subscription looks whether its client has gone
STALLED_WRITE_SECONDS = 30.0  # a subscriber that reads nothing for this long is dropped


@dataclass(frozen=True)
class StreamSpec:
    """One stream the stand-in serves; `records_per_shard` counts Kinesis records (aggregates)."""

    name: str
    shards: int = 1
    records_per_shard: int = 100
    record_bytes: int = 200  # of a user record's data
    aggregate_size: int = 0  # user records per KPL aggregate; 0 = plain records
    split: bool = False  # the shards are closed parents, each split into two open children
    backlog_seconds: float = 300.0  # arrival times spread over this many seconds before start-up
    shard_end: str = "after_last_records"  # when a closed shard answers its null iterator (module doc)
    # The first records of each shard that aged out of retention: a read starting at or before them
    # starts at the first one kept, as Kinesis starts a read at an aged-out sequence number at the trim horizon.
    aged_out: int = 0

    def __post_init__(self) -> None:
        if min(self.shards - 1, self.records_per_shard, self.record_bytes - 1, self.aggregate_size, self.aged_out) < 0:
            raise ValueError(
                f"stream {self.name!r}: shards >= 1, records >= 0, record_bytes >= 1, aged_out >= 0 needed: {self}"
            )
        if self.shard_end not in SHARD_ENDS:
            raise ValueError(f"stream {self.name!r}: shard_end must be one of {SHARD_ENDS}, not {self.shard_end!r}")


@dataclass(frozen=True)
class Limits:
    """Per-shard limits; None turns one off. Defaults are Kinesis'."""

    get_records_per_second: int | None = 5
    read_bytes_per_second: float | None = 2 * MIB
    burst_seconds: float = 1.0  # the byte bucket holds this many seconds of the rate
    max_records_per_call: int = 10_000
    max_bytes_per_call: int = 10 * MIB
    iterator_ttl_seconds: float = 300.0

    @classmethod
    def off(cls) -> Limits:
        return cls(get_records_per_second=None, read_bytes_per_second=None)


@dataclass(frozen=True)
class FanOutLimits:
    """Enhanced fan-out's limits and timings, per consumer and shard and apart from the polling limits;
    None turns a limit off. Defaults are Kinesis', except where a comment says otherwise."""

    read_bytes_per_second: float | None = 2 * MIB  # pushed to each consumer of a shard
    burst_seconds: float = 1.0  # the byte bucket holds this many seconds of the rate (as for polling)
    subscribe_calls_per_second: int | None = 1
    subscription_seconds: float = 300.0  # a subscription's lifetime
    in_use_seconds: float = 5.0  # a new subscription this soon after the open one's start is refused
    heartbeat_seconds: float = 5.0  # an event without records after this long without one
    max_event_bytes: int = MIB  # the stand-in's own choice: Kinesis does not document an event's size
    max_event_records: int = 10_000
    max_consumers: int = 20  # per stream
    max_creating_consumers: int = 5  # per stream, at once
    activation_seconds: float = 0.5  # CREATING before ACTIVE (Kinesis takes seconds; short for tests)
    deletion_seconds: float = 0.5  # DELETING before gone (the same)


# --- the data ------------------------------------------------------------------------------------


@dataclass
class _Shard:
    shard_id: str
    index: int
    hash_range: tuple[int, int]
    parents: tuple[str, ...]
    children: tuple[str, ...]
    sequence_numbers: list[int]
    arrivals: list[float]
    fragments: list[bytes]  # each record's JSON object, serialised once
    sizes: list[int]  # Kinesis' bytes per record: data plus partition key
    starting_sequence_number: int
    kept_from: int = 0  # the trim horizon: the first record not aged out (`StreamSpec.aged_out`)

    @property
    def closed(self) -> bool:
        return bool(self.children)

    def api_entry(self) -> dict[str, Any]:
        sequence_range = {"StartingSequenceNumber": str(self.starting_sequence_number)}
        if self.closed:
            last = self.sequence_numbers[-1] if self.sequence_numbers else self.starting_sequence_number
            sequence_range["EndingSequenceNumber"] = str(last)
        entry: dict[str, Any] = {
            "ShardId": self.shard_id,
            "HashKeyRange": {"StartingHashKey": str(self.hash_range[0]), "EndingHashKey": str(self.hash_range[1])},
            "SequenceNumberRange": sequence_range,
        }
        if self.parents:
            entry["ParentShardId"] = self.parents[0]
        return entry


@dataclass
class _Stream:
    spec: StreamSpec
    created: float
    split_at: float  # when the parents closed (== start-up for an unsplit stream)
    shards: list[_Shard]
    by_id: dict[str, _Shard]

    @property
    def arn(self) -> str:
        return f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{self.spec.name}"


def shard_id_of(index: int) -> str:
    return f"shardId-{index:012d}"


def sequence_number(shard_index: int, record_index: int) -> int:
    return SEQUENCE_BASE + shard_index * SHARD_SEQUENCE_STRIDE + (record_index + 1) * RECORD_SEQUENCE_STRIDE


def user_record_data(stream: str, shard_id: str, index: int, size: int) -> bytes:
    """The deterministic data of a user record: its name, padded to `size` bytes."""
    head = f"{stream}/{shard_id}/{index:012d}/".encode()
    return head + _FILLER[: size - len(head)] if size > len(head) else head


_FILLER = bytes(range(33, 127)) * (2 * MIB // 94 + 1)


def _hash_ranges(count: int) -> list[tuple[int, int]]:
    width = (MAX_HASH_KEY + 1) // count
    starts = [index * width for index in range(count)]
    return [(start, (starts[i + 1] - 1) if i + 1 < count else MAX_HASH_KEY) for i, start in enumerate(starts)]


def build_stream(spec: StreamSpec, now: float) -> _Stream:
    created = now - spec.backlog_seconds
    split_at = created + spec.backlog_seconds / 2 if spec.split else now
    shards: list[_Shard] = []
    for index, hash_range in enumerate(_hash_ranges(spec.shards)):
        children = (
            (shard_id_of(spec.shards + 2 * index), shard_id_of(spec.shards + 2 * index + 1)) if spec.split else ()
        )
        shards.append(_build_shard(spec, index, hash_range, (), children, (created, split_at)))
    if spec.split:
        for parent in list(shards):
            low, high = parent.hash_range
            middle = low + (high - low) // 2
            for offset, child_range in enumerate(((low, middle), (middle + 1, high))):
                index = spec.shards + 2 * parent.index + offset
                shards.append(_build_shard(spec, index, child_range, (parent.shard_id,), (), (split_at, now)))
    return _Stream(spec, created, split_at, shards, {shard.shard_id: shard for shard in shards})


def _build_shard(
    spec: StreamSpec,
    index: int,
    hash_range: tuple[int, int],
    parents: tuple[str, ...],
    children: tuple[str, ...],
    window: tuple[float, float],
) -> _Shard:
    shard_id = shard_id_of(index)
    count = spec.records_per_shard
    step = (window[1] - window[0]) / max(1, count)
    shard = _Shard(shard_id, index, hash_range, parents, children, [], [], [], [], sequence_number(index, -1))
    for record in range(count):
        data, key = _record_payload(spec, shard_id, record)
        number = sequence_number(index, record)
        arrival = round(window[0] + (record + 1) * step, 3)
        shard.sequence_numbers.append(number)
        shard.arrivals.append(arrival)
        shard.sizes.append(len(data) + len(key.encode()))
        shard.fragments.append(_fragment(number, arrival, data, key))
    shard.kept_from = min(spec.aged_out, count)
    return shard


def _record_payload(spec: StreamSpec, shard_id: str, record: int) -> tuple[bytes, str]:
    if spec.aggregate_size == 0:
        return user_record_data(spec.name, shard_id, record, spec.record_bytes), f"pk-{record}"
    from aws_kinesis_agg.aggregator import RecordAggregator  # only aggregated streams need protobuf

    aggregator = RecordAggregator()
    for user in range(spec.aggregate_size):
        index = record * spec.aggregate_size + user
        if aggregator.add_user_record(f"pk-{index}", user_record_data(spec.name, shard_id, index, spec.record_bytes)):
            raise ValueError(f"stream {spec.name!r}: {spec.aggregate_size} user records overflow one aggregate")
    aggregate = aggregator.clear_and_get()
    if aggregate is None:
        raise ValueError(f"stream {spec.name!r}: an aggregate needs at least one user record")
    key, _explicit_hash_key, data = aggregate.get_contents()
    return data, key


def _fragment(number: int, arrival: float, data: bytes, key: str) -> bytes:
    encoded = base64.b64encode(data).decode()
    return (
        f'{{"SequenceNumber":"{number}","ApproximateArrivalTimestamp":{arrival},'
        f'"Data":"{encoded}","PartitionKey":{json.dumps(key)}}}'
    ).encode()


# --- limits and counters -------------------------------------------------------------------------


class _CallWindow:
    """The calls accepted in the last second, against a limit per second (None: no limit)."""

    def __init__(self, per_second: int | None) -> None:
        self.per_second = per_second
        self.calls: deque[float] = deque()

    def full(self, now: float) -> bool:
        while self.calls and self.calls[0] <= now - 1.0:
            self.calls.popleft()
        return self.per_second is not None and len(self.calls) >= self.per_second

    def count(self, now: float) -> None:
        self.calls.append(now)


class _ByteBucket:
    """Bytes a reader may take: refilled at `rate` per second up to `burst_seconds` of it; what a read
    returns is charged after it, so a large read leaves the bucket in debt. A None rate never limits."""

    def __init__(self, rate: float | None, burst_seconds: float, now: float) -> None:
        self.rate = rate
        self.capacity = 0.0 if rate is None else rate * burst_seconds
        self.level = self.capacity
        self.refilled_at = now

    def in_debt(self, now: float) -> bool:
        if self.rate is None:
            return False
        self.level = min(self.capacity, self.level + (now - self.refilled_at) * self.rate)
        self.refilled_at = now
        return self.level < 0

    def charge(self, taken: int) -> None:
        if self.rate is not None:
            self.level -= taken

    def seconds_to_pay_off(self) -> float:
        """From the last refill until the debt is paid (0 when there is none)."""
        return max(0.0, -self.level) / self.rate if self.rate else 0.0


class _ShardMeter:
    """One shard's GetRecords calls in the last second and its byte bucket."""

    def __init__(self, limits: Limits, now: float) -> None:
        self.calls = _CallWindow(limits.get_records_per_second)
        self.bucket = _ByteBucket(limits.read_bytes_per_second, limits.burst_seconds, now)

    def refusal(self, now: float) -> str | None:
        """Why a GetRecords call at `now` is refused, or None (the call is then counted)."""
        if self.calls.full(now):
            return "calls_per_second"
        if self.bucket.in_debt(now):
            return "bytes_per_second"
        self.calls.count(now)
        return None


@dataclass
class _ReadCounters:
    """What one reader of a shard was served, and the limits it ran into, by kind."""

    records: int = 0
    bytes: int = 0
    violations: Counter[str] = field(default_factory=Counter)
    first_served_at: float | None = None  # time.monotonic() of the first read served
    drained_at: float | None = None  # when the bytes served so far are paid off at the read rate

    def served(self, records: int, returned: int, bucket: _ByteBucket, now: float) -> None:
        self.first_served_at = now if self.first_served_at is None else self.first_served_at
        self.drained_at = now + bucket.seconds_to_pay_off()
        self.records += records
        self.bytes += returned

    def busy_seconds(self) -> float:
        """How long the shard was busy serving: from its first read until its reads were paid off."""
        if self.first_served_at is None or self.drained_at is None:
            return 0.0
        return self.drained_at - self.first_served_at


@dataclass
class _ShardCounters(_ReadCounters):
    """A shard's polling readers together (they share its limits)."""

    get_records: int = 0


class _ApiError(Exception):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


# --- the service ---------------------------------------------------------------------------------


class KinesisService:
    """The protocol and the limits, without HTTP: `handle(operation, request)` -> response body, and
    `subscribe_to_shard(request)` -> a subscription whose events `fan_out.events` yields."""

    def __init__(
        self,
        streams: Sequence[StreamSpec],
        limits: Limits,
        clock: Callable[[], float] = time.time,
        fan_out: FanOutLimits = FanOutLimits(),
    ) -> None:
        self._clock = clock
        now = clock()
        self.streams = {spec.name: build_stream(spec, now) for spec in streams}
        self.limits = limits
        self.fan_out = _FanOut(self.streams, fan_out, clock)
        self._lock = threading.Lock()
        self._meters: dict[tuple[str, str], _ShardMeter] = {}
        self._counters: dict[tuple[str, str], _ShardCounters] = {}
        self._operations: Counter[str] = Counter()
        self._reset_at = time.monotonic()
        self._cpu_at_reset = time.process_time()

    def handle(self, operation: str, request: dict[str, Any]) -> bytes:
        handler, consumers_handler = _OPERATIONS.get(operation), _CONSUMER_OPERATIONS.get(operation)
        self._count(operation)
        if consumers_handler is not None:
            return consumers_handler(self.fan_out, request)
        if handler is None:
            raise _ApiError("UnknownOperationException", f"the stand-in does not serve {operation}")
        return handler(self, request)

    def subscribe_to_shard(self, request: dict[str, Any]) -> _Subscription:
        """SubscribeToShard streams its answer, so it is not one of `handle`'s operations."""
        self._count("SubscribeToShard")
        return self.fan_out.subscribe(request)

    def _count(self, operation: str) -> None:
        with self._lock:
            self._operations[operation] += 1

    # --- control ---------------------------------------------------------------------------------

    def set_limits(self, limits: Limits) -> None:
        with self._lock:
            self.limits = limits
            self._meters.clear()

    def reset(self) -> None:
        """Counters and meters start over (a full bucket, no calls in the last second)."""
        with self._lock:
            self._meters.clear()
            self._counters.clear()
            self._operations.clear()
            self._reset_at = time.monotonic()
            self._cpu_at_reset = time.process_time()
        self.fan_out.reset()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            shards = {
                f"{stream}/{shard}": {
                    "get_records": counters.get_records,
                    "records": counters.records,
                    "bytes": counters.bytes,
                    "violations": dict(counters.violations),
                    "busy_seconds": counters.busy_seconds(),
                }
                for (stream, shard), counters in sorted(self._counters.items())
            }
            violations: Counter[str] = Counter()
            for counters in self._counters.values():
                violations.update(counters.violations)
            return {
                "operations": dict(self._operations),
                "get_records": sum(entry["get_records"] for entry in shards.values()),
                "records": sum(entry["records"] for entry in shards.values()),
                "bytes": sum(entry["bytes"] for entry in shards.values()),
                "violations": {kind: violations[kind] for kind in VIOLATION_KINDS},
                "shards": shards,
                "seconds": time.monotonic() - self._reset_at,
                "cpu_seconds": time.process_time() - self._cpu_at_reset,
                "limits": asdict(self.limits),
                "fan_out": self.fan_out.stats(),
            }

    # --- operations ------------------------------------------------------------------------------

    def _stream(self, request: dict[str, Any]) -> _Stream:
        return _find_stream(self.streams, request)

    def _shard(self, stream: _Stream, shard_id: str) -> _Shard:
        return _find_shard(stream, shard_id)

    def describe_stream_summary(self, request: dict[str, Any]) -> bytes:
        stream = self._stream(request)
        summary = {
            "StreamName": stream.spec.name,
            "StreamARN": stream.arn,
            "StreamStatus": "ACTIVE",
            "StreamModeDetails": {"StreamMode": "PROVISIONED"},
            "RetentionPeriodHours": 24,
            "StreamCreationTimestamp": round(stream.created, 3),
            "EnhancedMonitoring": [{"ShardLevelMetrics": []}],
            "EncryptionType": "NONE",
            "OpenShardCount": sum(not shard.closed for shard in stream.shards),
            "ConsumerCount": self.fan_out.consumer_count(stream.spec.name),
        }
        return json.dumps({"StreamDescriptionSummary": summary}).encode()

    def list_shards(self, request: dict[str, Any]) -> bytes:
        token = request.get("NextToken")
        if token is not None:
            if "StreamName" in request or "ShardFilter" in request:
                raise _ApiError("InvalidArgumentException", "NextToken and StreamName/ShardFilter cannot be combined")
            state = _decode(token)
            name, offset, filter_ = state["stream"], state["offset"], state["filter"]
            stream = self._stream({"StreamName": name})
        else:
            stream = self._stream(request)
            offset, filter_ = 0, request.get("ShardFilter")
        shards = self._filtered(stream, filter_, request.get("ExclusiveStartShardId"))
        page_size = int(request.get("MaxResults", 1000))
        if not 1 <= page_size <= 10000:
            raise _ApiError("InvalidArgumentException", f"MaxResults must be in 1..10000, not {page_size}")
        page = shards[offset : offset + page_size]
        response: dict[str, Any] = {"Shards": [shard.api_entry() for shard in page]}
        if offset + page_size < len(shards):
            state = {"stream": stream.spec.name, "offset": offset + page_size, "filter": filter_}
            response["NextToken"] = _encode(state)
        return json.dumps(response).encode()

    def _filtered(self, stream: _Stream, filter_: dict[str, Any] | None, exclusive_start: str | None) -> list[_Shard]:
        shards = stream.shards
        if exclusive_start is not None:
            shards = [shard for shard in shards if shard.shard_id > exclusive_start]
        if not filter_:
            return shards
        kind = filter_.get("Type")
        oldest = [shard for shard in shards if not shard.parents]
        open_ = [shard for shard in shards if not shard.closed]
        if kind == "AT_LATEST":
            return open_
        if kind == "AT_TRIM_HORIZON":
            return oldest
        if kind == "FROM_TRIM_HORIZON":
            return shards
        if kind == "AFTER_SHARD_ID":
            return [shard for shard in shards if shard.shard_id > str(filter_.get("ShardId"))]
        if kind in ("AT_TIMESTAMP", "FROM_TIMESTAMP"):
            before_split = float(filter_["Timestamp"]) < stream.split_at
            if kind == "FROM_TIMESTAMP":
                return shards if before_split else open_
            return oldest if before_split else open_
        raise _ApiError("InvalidArgumentException", f"unknown ShardFilter type {kind!r}")

    def get_shard_iterator(self, request: dict[str, Any]) -> bytes:
        stream = self._stream(request)
        shard = self._shard(stream, str(request.get("ShardId")))
        position = _start_position(
            shard, request.get("ShardIteratorType"), request.get("StartingSequenceNumber"), request.get("Timestamp")
        )
        state = {"stream": stream.spec.name, "shard": shard.shard_id, "at": position, "issued": self._clock()}
        return json.dumps({"ShardIterator": _encode(state)}).encode()

    def get_records(self, request: dict[str, Any]) -> bytes:
        state = _decode(str(request.get("ShardIterator")))
        limits = self.limits
        if self._clock() - float(state["issued"]) > limits.iterator_ttl_seconds:
            raise _ApiError("ExpiredIteratorException", "Iterator expired.")
        stream = self._stream({"StreamName": state["stream"]})
        shard = self._shard(stream, state["shard"])
        asked = int(request.get("Limit", limits.max_records_per_call))
        if not 1 <= asked <= 10000:
            raise _ApiError("InvalidArgumentException", f"Limit must be in 1..10000, not {asked}")
        start = int(state["at"])
        end = self._admit(stream, shard, start, min(asked, limits.max_records_per_call))
        return self._records_body(stream, shard, start, end)

    def _admit(self, stream: _Stream, shard: _Shard, start: int, limit: int) -> int:
        """Check the limits, pick the records [start, end) and charge their bytes (under the lock, so
        concurrent readers of one shard share its limits); returns `end`."""
        key = (stream.spec.name, shard.shard_id)
        with self._lock:
            limits = self.limits
            counters = self._counters.setdefault(key, _ShardCounters())
            counters.get_records += 1
            meter = self._meters.get(key)
            if meter is None:
                meter = self._meters[key] = _ShardMeter(limits, time.monotonic())
            refusal = meter.refusal(time.monotonic())
            if refusal is not None:
                counters.violations[refusal] += 1
                raise _ApiError(
                    THROTTLED, f"Rate exceeded for shard {shard.shard_id} in stream {stream.spec.name} ({refusal})."
                )
            end, returned = _slice(shard, start, limit, limits.max_bytes_per_call)
            meter.bucket.charge(returned)
            counters.served(end - start, returned, meter.bucket, time.monotonic())
        return end

    def _records_body(self, stream: _Stream, shard: _Shard, start: int, end: int) -> bytes:
        total = len(shard.sequence_numbers)
        head = b'{"Records":[' + b",".join(shard.fragments[start:end]) + b"]"
        ends_here = start >= total or (stream.spec.shard_end == "with_last_records" and end >= total)
        if shard.closed and ends_here:
            tail = {"MillisBehindLatest": 0, "ChildShards": _child_shards(stream, shard)}
        else:
            state = {"stream": stream.spec.name, "shard": shard.shard_id, "at": end, "issued": self._clock()}
            behind = _millis_behind(shard, end, self._clock())
            tail = {"NextShardIterator": _encode(state), "MillisBehindLatest": behind}
        return head + b"," + json.dumps(tail).encode()[1:]


def _find_stream(streams: dict[str, _Stream], request: dict[str, Any]) -> _Stream:
    name = request.get("StreamName") or str(request.get("StreamARN", "")).rpartition("/")[2]
    stream = streams.get(name)
    if stream is None:
        raise _ApiError("ResourceNotFoundException", f"Stream {name} under account {ACCOUNT} not found.")
    return stream


def _find_shard(stream: _Stream, shard_id: str) -> _Shard:
    shard = stream.by_id.get(shard_id)
    if shard is None:
        raise _ApiError("ResourceNotFoundException", f"Shard {shard_id} in stream {stream.spec.name} not found.")
    return shard


def _start_position(
    shard: _Shard, kind: object, number: object, timestamp: object, operation: str = "GetShardIterator"
) -> int:
    """The index of the first record a reader starting at this position gets (GetShardIterator's
    ShardIteratorType and SubscribeToShard's StartingPosition name the same positions); never one
    that aged out."""
    return max(shard.kept_from, _position_in_shard(shard, kind, number, timestamp, operation))


def _position_in_shard(shard: _Shard, kind: object, number: object, timestamp: object, operation: str) -> int:
    if kind == "TRIM_HORIZON":
        return 0
    if kind == "LATEST":
        return len(shard.sequence_numbers)
    if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
        starting = int(str(number)) if number is not None else -1
        if not shard.starting_sequence_number <= starting < shard.starting_sequence_number + SHARD_SEQUENCE_STRIDE:
            raise _ApiError(
                "InvalidArgumentException",
                f"StartingSequenceNumber {starting} used in {operation} on shard {shard.shard_id} is invalid "
                "because it did not come from this stream.",
            )
        find = bisect.bisect_left if kind == "AT_SEQUENCE_NUMBER" else bisect.bisect_right
        return find(shard.sequence_numbers, starting)
    if kind == "AT_TIMESTAMP":
        if timestamp is None:
            raise _ApiError("InvalidArgumentException", f"{operation}: AT_TIMESTAMP needs a Timestamp")
        return bisect.bisect_left(shard.arrivals, float(str(timestamp)))
    raise _ApiError("InvalidArgumentException", f"unknown ShardIteratorType {kind!r}")


def _millis_behind(shard: _Shard, position: int, now: float) -> int:
    """How far the record at `position` lies behind the tip: 0 at the tip, at least 1 before it."""
    if position >= len(shard.sequence_numbers):
        return 0
    return max(1, int((now - shard.arrivals[position]) * 1000))


def _child_shards(stream: _Stream, shard: _Shard) -> list[dict[str, Any]]:
    """The ChildShards a closed shard's end answers."""
    return [
        {
            "ShardId": child,
            "ParentShards": [shard.shard_id],
            "HashKeyRange": stream.by_id[child].api_entry()["HashKeyRange"],
        }
        for child in shard.children
    ]


def _slice(shard: _Shard, start: int, limit: int, max_bytes: int) -> tuple[int, int]:
    """The end of the records served from `start` and their Kinesis bytes; at least one record if any."""
    end, returned, total = start, 0, len(shard.sizes)
    while end < total and end - start < limit:
        size = shard.sizes[end]
        if end > start and returned + size > max_bytes:
            break
        returned += size
        end += 1
    return end, returned


def _encode(state: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(state, separators=(",", ":")).encode()).decode()


def _decode(token: str) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, UnicodeDecodeError):
        raise _ApiError("InvalidArgumentException", f"invalid iterator or token {token[:40]!r}") from None
    return state


_OPERATIONS: dict[str, Callable[[KinesisService, dict[str, Any]], bytes]] = {
    "ListShards": KinesisService.list_shards,
    "DescribeStreamSummary": KinesisService.describe_stream_summary,
    "GetShardIterator": KinesisService.get_shard_iterator,
    "GetRecords": KinesisService.get_records,
}


# --- enhanced fan-out ----------------------------------------------------------------------------


@dataclass(eq=False)
class _Consumer:
    stream: str
    name: str
    arn: str
    created: int  # epoch seconds, as the ARN ends
    registered_at: float  # time.monotonic()
    deregistered_at: float | None = None

    def status(self, limits: FanOutLimits, now: float) -> str | None:
        """CREATING, ACTIVE or DELETING at `now`; None once deregistration has finished."""
        if self.deregistered_at is not None:
            return "DELETING" if now < self.deregistered_at + limits.deletion_seconds else None
        return "CREATING" if now < self.registered_at + limits.activation_seconds else "ACTIVE"

    def entry(self, status: str) -> dict[str, Any]:
        return {
            "ConsumerName": self.name,
            "ConsumerARN": self.arn,
            "ConsumerStatus": status,
            "ConsumerCreationTimestamp": self.created,
        }


@dataclass(eq=False)
class _Subscription:
    consumer: _Consumer
    stream: _Stream
    shard: _Shard
    position: int  # the next record to push
    started: float  # time.monotonic()
    ends_at: float
    ended_by: _ApiError | None = None  # set when it is taken over, its consumer goes, or a fault is injected

    @property
    def key(self) -> tuple[str, str]:
        return (self.consumer.arn, self.shard.shard_id)

    def continuation(self) -> str:
        """The sequence number to subscribe AFTER to resume here: the last record pushed (or, before
        any, the shard's starting sequence number, below its first record)."""
        numbers = self.shard.sequence_numbers
        return str(numbers[self.position - 1] if self.position else self.shard.starting_sequence_number)


class _FanOutMeter:
    """One consumer's SubscribeToShard calls on one shard in the last second and its own byte bucket."""

    def __init__(self, limits: FanOutLimits, now: float) -> None:
        self.calls = _CallWindow(limits.subscribe_calls_per_second)
        self.bucket = _ByteBucket(limits.read_bytes_per_second, limits.burst_seconds, now)


@dataclass
class _SubscriptionCounters(_ReadCounters):
    """One consumer's subscriptions to one shard together (they share its fan-out limits)."""

    subscriptions: int = 0
    events: int = 0
    heartbeats: int = 0  # events without records that are not a shard's end


@dataclass(frozen=True)
class _Push:
    """The next event of a subscription: records [start, end), and whether it ends the shard."""

    start: int
    end: int
    shard_end: bool


class _FanOut:
    """Registered consumers and their subscriptions: enhanced fan-out's half of the service. Its
    limits are per consumer and shard, apart from the polling limits (its own lock, meters, counters)."""

    def __init__(self, streams: dict[str, _Stream], limits: FanOutLimits, clock: Callable[[], float]) -> None:
        self.streams = streams
        self.limits = limits
        self._clock = clock
        self._changed = threading.Condition()
        self._consumers: dict[str, _Consumer] = {}  # by ARN, in registration order
        self._last_epoch: dict[tuple[str, str], int] = {}
        self._open: list[_Subscription] = []  # until their end is decided: what the in-use rule sees
        self._streaming = 0  # subscriptions whose connection is still writing
        self._meters: dict[tuple[str, str], _FanOutMeter] = {}
        self._counters: dict[tuple[str, str, str], _SubscriptionCounters] = {}
        self._violations: Counter[str] = Counter()
        self._closing = False

    # --- consumers -------------------------------------------------------------------------------

    def register_stream_consumer(self, request: dict[str, Any]) -> bytes:
        stream = _find_stream(self.streams, {"StreamARN": request["StreamARN"]})
        name = str(request["ConsumerName"])
        if not CONSUMER_NAME.fullmatch(name):
            raise _ApiError("InvalidArgumentException", f"ConsumerName {name!r} does not match {CONSUMER_NAME.pattern}")
        with self._changed:
            now = time.monotonic()
            present = self._present(stream.spec.name, now)
            if any(consumer.name == name for consumer, _ in present):
                raise _ApiError(
                    "ResourceInUseException", f"Consumer {name} under stream {stream.spec.name} already exists."
                )
            if len(present) >= self.limits.max_consumers:
                self._violations["consumers_per_stream"] += 1
                raise _ApiError(
                    "LimitExceededException",
                    f"Stream {stream.spec.name} has {len(present)} consumers, the most it can have.",
                )
            creating = sum(status == "CREATING" for _, status in present)
            if creating >= self.limits.max_creating_consumers:
                self._violations["consumers_creating"] += 1
                raise _ApiError(
                    "LimitExceededException",
                    f"Stream {stream.spec.name} has {creating} consumers in CREATING status, the most at once.",
                )
            # The ARN ends with the creation second: one name registered twice in a second would get
            # its earlier ARN back, so a later registration takes the next second.
            epoch = max(int(self._clock()), self._last_epoch.get((stream.spec.name, name), 0) + 1)
            self._last_epoch[(stream.spec.name, name)] = epoch
            consumer = _Consumer(stream.spec.name, name, f"{stream.arn}/consumer/{name}:{epoch}", epoch, now)
            self._consumers[consumer.arn] = consumer
            entry = consumer.entry("CREATING" if self.limits.activation_seconds > 0 else "ACTIVE")
        return json.dumps({"Consumer": entry}).encode()

    def describe_stream_consumer(self, request: dict[str, Any]) -> bytes:
        with self._changed:
            consumer, status = self._consumer(request, time.monotonic())
            description = {**consumer.entry(status), "StreamARN": self.streams[consumer.stream].arn}
        return json.dumps({"ConsumerDescription": description}).encode()

    def list_stream_consumers(self, request: dict[str, Any]) -> bytes:
        stream = _find_stream(self.streams, {"StreamARN": request["StreamARN"]})
        page_size = int(request.get("MaxResults", 100))
        if not 1 <= page_size <= 10000:
            raise _ApiError("InvalidArgumentException", f"MaxResults must be in 1..10000, not {page_size}")
        offset = int(_decode(request["NextToken"])["offset"]) if request.get("NextToken") else 0
        with self._changed:
            present = self._present(stream.spec.name, time.monotonic())
        response: dict[str, Any] = {
            "Consumers": [consumer.entry(status) for consumer, status in present[offset : offset + page_size]]
        }
        if offset + page_size < len(present):
            response["NextToken"] = _encode({"stream": stream.spec.name, "offset": offset + page_size})
        return json.dumps(response).encode()

    def deregister_stream_consumer(self, request: dict[str, Any]) -> bytes:
        with self._changed:
            now = time.monotonic()
            consumer, status = self._consumer(request, now)
            if status != "DELETING":
                consumer.deregistered_at = now
                self._end(
                    lambda subscription: subscription.consumer is consumer,
                    _ApiError("ResourceNotFoundException", f"Consumer {consumer.arn} is being deregistered."),
                )
        return b"{}"

    def consumer_count(self, stream: str) -> int:
        with self._changed:
            return len(self._present(stream, time.monotonic()))

    def _present(self, stream: str, now: float) -> list[tuple[_Consumer, str]]:
        """A stream's consumers and their status; a consumer whose deregistration has finished is
        forgotten here."""
        present = []
        for arn, consumer in list(self._consumers.items()):
            status = consumer.status(self.limits, now)
            if status is None:
                del self._consumers[arn]
            elif consumer.stream == stream:
                present.append((consumer, status))
        return present

    def _consumer(self, request: dict[str, Any], now: float) -> tuple[_Consumer, str]:
        """The consumer a request names, by ConsumerARN or by StreamARN and ConsumerName."""
        arn = request.get("ConsumerARN")
        if arn:
            name = str(arn)
            consumer = self._consumers.get(name)
        elif request.get("StreamARN") and request.get("ConsumerName"):
            stream = _find_stream(self.streams, {"StreamARN": request["StreamARN"]})
            name = f"{request['ConsumerName']} under stream {stream.spec.name}"
            consumer = next(
                (
                    found
                    for found in self._consumers.values()
                    if found.stream == stream.spec.name and found.name == request["ConsumerName"]
                ),
                None,
            )
        else:
            raise _ApiError("InvalidArgumentException", "give ConsumerARN, or StreamARN and ConsumerName")
        status = None if consumer is None else consumer.status(self.limits, now)
        if consumer is None or status is None:
            raise _ApiError("ResourceNotFoundException", f"Consumer {name} not found.")
        return consumer, status

    # --- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, request: dict[str, Any]) -> _Subscription:
        """Start a subscription, or refuse it as Kinesis would (the error before any event)."""
        arn = str(request["ConsumerARN"])
        with self._changed:
            now = time.monotonic()
            consumer = self._consumers.get(arn)
            status = None if consumer is None else consumer.status(self.limits, now)
            if consumer is None or status is None:
                raise _ApiError("ResourceNotFoundException", f"Consumer {arn} not found.")
            stream = self.streams[consumer.stream]
            shard = _find_shard(stream, str(request["ShardId"]))
            counters = self._counters_of(consumer, shard)
            if status != "ACTIVE":
                raise self._refuse(
                    counters,
                    "consumer_not_active",
                    "ResourceInUseException",
                    f"Consumer {consumer.name} with creation timestamp {consumer.created} under stream: "
                    f"{stream.spec.name} , account {ACCOUNT} is not in ACTIVE status.",
                )
            meter = self._meter((arn, shard.shard_id), now)
            if meter.calls.full(now):
                raise self._refuse(
                    counters,
                    "subscribe_calls_per_second",
                    "LimitExceededException",
                    f"Rate exceeded for consumer {arn} and shard {shard.shard_id}.",
                )
            meter.calls.count(now)
            starting = request["StartingPosition"]
            position = _start_position(
                shard,
                starting.get("Type"),
                starting.get("SequenceNumber"),
                starting.get("Timestamp"),
                "SubscribeToShard",
            )
            current = next(
                (open_ for open_ in self._open if open_.key == (arn, shard.shard_id) and not open_.ended_by), None
            )
            if current is not None:
                if now - current.started < self.limits.in_use_seconds:
                    raise self._refuse(
                        counters,
                        "subscription_in_use",
                        "ResourceInUseException",
                        f"Another active subscription exists for this consumer: {arn} on shard {shard.shard_id}.",
                    )
                self._end(
                    lambda subscription: subscription is current,
                    _ApiError(
                        "ResourceInUseException", f"A newer subscription of {arn} took shard {shard.shard_id} over."
                    ),
                )
            subscription = _Subscription(consumer, stream, shard, position, now, now + self.limits.subscription_seconds)
            self._open.append(subscription)
            self._streaming += 1
            counters.subscriptions += 1
        return subscription

    def _refuse(self, counters: _SubscriptionCounters, kind: str, error_type: str, message: str) -> _ApiError:
        counters.violations[kind] += 1
        self._violations[kind] += 1
        return _ApiError(error_type, message)

    def _meter(self, key: tuple[str, str], now: float) -> _FanOutMeter:
        meter = self._meters.get(key)
        if meter is None:
            meter = self._meters[key] = _FanOutMeter(self.limits, now)
        return meter

    def events(self, subscription: _Subscription, client_gone: Callable[[], bool]) -> Iterator[bytes]:
        """The subscription's event-stream messages, as they become due: the initial response, then
        SubscribeToShardEvents (records at the byte rate, heartbeats while there are none to push,
        the shard's end), or an exception event. It ends when the subscription does."""
        yield event_stream.event("initial-response", b"{}")
        quiet_since = time.monotonic()
        while True:
            push = self._next_push(subscription, quiet_since, client_gone)
            if isinstance(push, _ApiError):
                yield event_stream.exception(push.error_type, json.dumps({"message": push.message}).encode())
                return
            if push is None:
                return
            yield event_stream.event("SubscribeToShardEvent", self._event_body(subscription, push))
            quiet_since = time.monotonic()
            if push.shard_end:
                return

    def _next_push(
        self, subscription: _Subscription, quiet_since: float, client_gone: Callable[[], bool]
    ) -> _Push | _ApiError | None:
        """Wait for the next event (None: the subscription is over without one)."""
        shard, limits = subscription.shard, self.limits
        total = len(shard.sequence_numbers)
        with self._changed:
            while True:
                now = time.monotonic()
                if subscription.ended_by is not None:
                    self._forget(subscription)
                    return subscription.ended_by
                if self._closing or now >= subscription.ends_at or client_gone():
                    self._forget(subscription)
                    return None
                start = subscription.position
                heartbeat_at = quiet_since + limits.heartbeat_seconds
                wake = min(heartbeat_at, subscription.ends_at, now + CLIENT_CHECK_SECONDS)
                push = None
                if start >= total and shard.closed:
                    push = _Push(start, start, shard_end=True)
                elif start < total:
                    meter = self._meter(subscription.key, now)
                    if meter.bucket.in_debt(now):
                        wake = min(wake, now + meter.bucket.seconds_to_pay_off())
                    else:
                        end, returned = _slice(shard, start, limits.max_event_records, limits.max_event_bytes)
                        meter.bucket.charge(returned)
                        self._counters_of(subscription.consumer, shard).served(end - start, returned, meter.bucket, now)
                        subscription.position = end
                        last = shard.closed and end >= total
                        with_last = subscription.stream.spec.shard_end == "with_last_records"
                        push = _Push(start, end, shard_end=last and with_last)
                if push is None and now >= heartbeat_at:
                    push = _Push(start, start, shard_end=False)
                if push is not None:
                    if push.shard_end:
                        self._forget(subscription)
                    counters = self._counters_of(subscription.consumer, shard)
                    counters.events += 1
                    counters.heartbeats += push.start == push.end and not push.shard_end
                    return push
                self._changed.wait(max(0.0, wake - now))

    def _counters_of(self, consumer: _Consumer, shard: _Shard) -> _SubscriptionCounters:
        return self._counters.setdefault((consumer.stream, consumer.name, shard.shard_id), _SubscriptionCounters())

    def _event_body(self, subscription: _Subscription, push: _Push) -> bytes:
        stream, shard = subscription.stream, subscription.shard
        head = b'{"Records":[' + b",".join(shard.fragments[push.start : push.end]) + b"]"
        tail: dict[str, Any]
        if push.shard_end:
            tail = {
                "ContinuationSequenceNumber": None,
                "MillisBehindLatest": 0,
                "ChildShards": _child_shards(stream, shard),
            }
        else:
            behind = _millis_behind(shard, push.end, self._clock())
            tail = {"ContinuationSequenceNumber": subscription.continuation(), "MillisBehindLatest": behind}
        return head + b"," + json.dumps(tail).encode()[1:]

    def _forget(self, subscription: _Subscription) -> None:
        """Its end is decided: before its last bytes go out, so a subscriber that resubscribes as soon
        as it has read them finds no open subscription in the way."""
        if subscription in self._open:
            self._open.remove(subscription)

    def release(self, subscription: _Subscription) -> None:
        """The subscription's connection is done with it (ended, failed or gone)."""
        with self._changed:
            self._forget(subscription)
            self._streaming -= 1
            self._changed.notify_all()

    def fail(self, error_type: str, message: str, stream: str | None, shard_id: str | None) -> int:
        """End the open subscriptions (of one stream or shard) with an exception event; how many."""
        if error_type not in event_stream.SUBSCRIPTION_ERRORS:
            raise ValueError(
                f"botocore models only {event_stream.SUBSCRIPTION_ERRORS} inside SubscribeToShard's stream"
            )
        with self._changed:
            return self._end(
                lambda subscription: (
                    stream in (None, subscription.stream.spec.name) and shard_id in (None, subscription.shard.shard_id)
                ),
                _ApiError(error_type, message),
            )

    def _end(self, which: Callable[[_Subscription], bool], error: _ApiError) -> int:
        ended = [subscription for subscription in self._open if not subscription.ended_by and which(subscription)]
        for subscription in ended:
            subscription.ended_by = error
        self._changed.notify_all()
        return len(ended)

    def close(self, timeout: float) -> None:
        """End every open subscription (its stream ends as at the end of its lifetime) and wait until
        their connections have written their last chunk."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            self._changed.wait_for(lambda: not self._streaming, timeout)

    # --- counters --------------------------------------------------------------------------------

    def reset(self) -> None:
        with self._changed:
            self._meters.clear()
            self._counters.clear()
            self._violations.clear()

    def stats(self) -> dict[str, Any]:
        with self._changed:
            now = time.monotonic()
            consumer_shards = {
                f"{stream}/{consumer}/{shard}": {
                    "subscriptions": counters.subscriptions,
                    "events": counters.events,
                    "heartbeats": counters.heartbeats,
                    "records": counters.records,
                    "bytes": counters.bytes,
                    "violations": dict(counters.violations),
                    "busy_seconds": counters.busy_seconds(),
                }
                for (stream, consumer, shard), counters in sorted(self._counters.items())
            }
            return {
                "consumers": sum(
                    consumer.status(self.limits, now) is not None for consumer in self._consumers.values()
                ),
                "open_subscriptions": len(self._open),
                **{
                    total: sum(entry[total] for entry in consumer_shards.values())
                    for total in ("subscriptions", "events", "heartbeats", "records", "bytes")
                },
                "violations": {kind: self._violations[kind] for kind in FAN_OUT_VIOLATION_KINDS},
                "consumer_shards": consumer_shards,
                "limits": asdict(self.limits),
            }


_CONSUMER_OPERATIONS: dict[str, Callable[[_FanOut, dict[str, Any]], bytes]] = {
    "RegisterStreamConsumer": _FanOut.register_stream_consumer,
    "DescribeStreamConsumer": _FanOut.describe_stream_consumer,
    "ListStreamConsumers": _FanOut.list_stream_consumers,
    "DeregisterStreamConsumer": _FanOut.deregister_stream_consumer,
}


# --- HTTP ----------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog of 5 drops the connections of a slot opening 64 at once
    # (the kernel's ListenOverflows count rose): their first request waited 1-2 s for a retry.
    request_queue_size = 1024

    def __init__(self, port: int, service: KinesisService) -> None:
        super().__init__((LOOPBACK, port), _Handler)
        self.service = service


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path != "/stats":
            self._send(404, "application/json", b'{"message":"only GET /stats"}')
            return
        self._send(200, "application/json", json.dumps(self.server.service.stats()).encode())

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/_standin/reset":
            self.server.service.reset()
            self._send(200, "application/json", b"{}")
        elif self.path == "/_standin/limits":
            self.server.service.set_limits(Limits(**json.loads(body)))
            self._send(200, "application/json", b"{}")
        elif self.path == "/_standin/fail_subscriptions":
            fault = json.loads(body)
            try:
                failed = self.server.service.fan_out.fail(
                    fault["error"], fault["message"], fault.get("stream"), fault.get("shard")
                )
            except ValueError as error:
                self._send(400, "application/json", json.dumps({"message": str(error)}).encode())
                return
            self._send(200, "application/json", json.dumps({"failed": failed}).encode())
        else:
            self._kinesis(body)

    def _kinesis(self, body: bytes) -> None:
        target = self.headers.get("X-Amz-Target", "")
        if not target.startswith(TARGET_PREFIX):
            self._error(_ApiError("UnknownOperationException", f"X-Amz-Target {target!r} is not Kinesis'"))
            return
        operation = target[len(TARGET_PREFIX) :]
        try:
            request = json.loads(body or b"{}")
            if operation == "SubscribeToShard":
                subscription = self.server.service.subscribe_to_shard(request)
            else:
                self._send(200, JSON_CONTENT_TYPE, self.server.service.handle(operation, request))
                return
        except _ApiError as error:
            self._error(error)
            return
        except (KeyError, ValueError, TypeError, AttributeError) as error:
            self._error(_ApiError("InvalidArgumentException", f"{type(error).__name__}: {error}"))
            return
        self._stream_events(subscription)

    def _stream_events(self, subscription: _Subscription) -> None:
        """SubscribeToShard's answer: HTTP/1.1 chunks, one event-stream message each, as they are due."""
        fan_out = self.server.service.fan_out
        try:
            self.send_response(200)
            self.send_header("Content-Type", EVENT_STREAM_CONTENT_TYPE)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("x-amzn-RequestId", "standin")
            self.end_headers()
            self.connection.settimeout(STALLED_WRITE_SECONDS)
            for message in fan_out.events(subscription, lambda: event_stream.client_gone(self.connection)):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(message), message))
            self.wfile.write(b"0\r\n\r\n")
            self.connection.settimeout(None)
        except OSError:  # the subscriber went away or stopped reading
            self.close_connection = True
        finally:
            fan_out.release(subscription)

    def _error(self, error: _ApiError) -> None:
        self._send(400, JSON_CONTENT_TYPE, json.dumps({"__type": error.error_type, "message": error.message}).encode())

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amzn-RequestId", "standin")
        self.end_headers()
        self.wfile.write(body)


def serve(streams: Sequence[StreamSpec], limits: Limits, port: int = 0, fan_out: FanOutLimits = FanOutLimits()) -> None:
    """Build the records, print `READY <port>` and serve until SIGTERM or SIGINT, then end the open
    subscriptions (their streams end as at the end of their lifetime) before the process exits."""
    service = KinesisService(streams, limits, fan_out=fan_out)
    server = _Server(port, service)
    signal.signal(signal.SIGTERM, _stop_serving)
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # SIGINT, or SIGTERM through _stop_serving
        pass
    finally:
        service.fan_out.close(timeout=5.0)
        server.server_close()


def _stop_serving(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


# --- the client side: a process ------------------------------------------------------------------


class KinesisStandIn:
    """Runs the stand-in in a child process on a free loopback port; stop() ends that process."""

    def __init__(
        self, streams: Sequence[StreamSpec], limits: Limits = Limits(), fan_out: FanOutLimits = FanOutLimits()
    ) -> None:
        self.streams = tuple(streams)
        self.limits = limits
        self.fan_out = fan_out
        self._process: subprocess.Popen[str] | None = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("the Kinesis stand-in is not started")
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> KinesisStandIn:
        spec = json.dumps(
            {
                "streams": [asdict(stream) for stream in self.streams],
                "limits": asdict(self.limits),
                "fan_out": asdict(self.fan_out),
            }
        )
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        }
        self._process = subprocess.Popen(
            [sys.executable, "-m", "devtools.kinesis_standin", "--spec", spec],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPOSITORY,
            env=environment,
        )
        self.port = self._await_ready(self._process)
        return self

    @staticmethod
    def _await_ready(process: subprocess.Popen[str]) -> int:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], STARTUP_TIMEOUT_SECONDS)
        line = process.stdout.readline() if ready else ""
        if not line.startswith("READY "):
            process.kill()
            process.wait()
            raise RuntimeError(
                f"the Kinesis stand-in did not start within {STARTUP_TIMEOUT_SECONDS:.0f} s "
                f"(exit code {process.returncode}, first line {line!r})"
            )
        return int(line.split()[1])

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> KinesisStandIn:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.endpoint}/stats", timeout=10) as response:
            stats: dict[str, Any] = json.loads(response.read())
        return stats

    def reset(self) -> None:
        """Counters and limit meters start over."""
        self._post("/_standin/reset", {})

    def set_limits(self, limits: Limits) -> None:
        self.limits = limits
        self._post("/_standin/limits", asdict(limits))

    def fail_subscriptions(
        self,
        error: str = "InternalFailureException",
        message: str = "injected by the stand-in",
        stream: str | None = None,
        shard_id: str | None = None,
    ) -> int:
        """End the open subscriptions (of a stream, of a shard) with an exception event; how many."""
        fault = {"error": error, "message": message, "stream": stream, "shard": shard_id}
        return int(self._post("/_standin/fail_subscriptions", fault).get("failed", 0))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.endpoint}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read() or b"{}")
        return answer

    def client(self) -> Any:
        """A boto3 Kinesis client for this stand-in (dummy credentials, no retries of its own)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "kinesis",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="standin",
            aws_secret_access_key="standin",
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=64),
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--spec",
        required=True,
        help='JSON: {"streams": [StreamSpec fields], "limits": {Limits fields}, "fan_out": {FanOutLimits fields}}',
    )
    parser.add_argument("--port", type=int, default=0)
    arguments = parser.parse_args(argv)
    spec = json.loads(arguments.spec)
    streams = [StreamSpec(**stream) for stream in spec["streams"]]
    fan_out = replace(FanOutLimits(), **spec.get("fan_out", {}))
    serve(streams, replace(Limits(), **spec.get("limits", {})), arguments.port, fan_out)


if __name__ == "__main__":
    main()
