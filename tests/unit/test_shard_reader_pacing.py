"""Polling's pacing (GetRecordsReader) against Kinesis' per-shard read limits, on a fake clock and a fake shard that
throttles as Kinesis does (a byte bucket charged after each call, refused while in debt; 5 calls in any
second): paced by bytes, the reader reads at the cap and is never refused."""

from __future__ import annotations

from collections import deque
from typing import Any

import botocore.exceptions
import pytest

from lease_core.model.sequence import TRIM_HORIZON
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.polling.read_pacing import MIN_CALL_INTERVAL_SECONDS
from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead
from lease_core.retry import RetryPolicy
from tests.unit.test_shard_reader_positions import kinesis_record

KEY = "k"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, f"negative sleep {seconds}"
        self.now += seconds


class ThrottlingShard:
    """An open shard of `count` records of `size` data bytes under Kinesis' read limits, on `clock`."""

    def __init__(self, clock: FakeClock, count: int, size: int, rate: float, page_cap: int = 10000) -> None:
        self.clock = clock
        self.records = [kinesis_record(f"4965{index:052d}", b"x" * size, KEY) for index in range(count)]
        self.rate = rate
        self.page_cap = page_cap
        self.level = rate  # a full bucket: one second of the rate
        self.refilled_at = 0.0
        self.calls: deque[float] = deque()
        self.refused = {"calls_per_second": 0, "bytes_per_second": 0}

    def get_shard_iterator(self, **arguments: Any) -> dict[str, Any]:
        return {"ShardIterator": "0"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        now = self.clock.now
        refusal = self._refusal(now)
        if refusal is not None:
            self.refused[refusal] += 1
            error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": refusal}}
            raise botocore.exceptions.ClientError(error, "GetRecords")
        index = int(ShardIterator)
        page = self.records[index : index + min(Limit, self.page_cap)]
        self.level -= sum(len(record["Data"]) + len(KEY) for record in page)
        end = index + len(page)
        behind = 0 if end == len(self.records) else 60000
        return {"Records": page, "NextShardIterator": str(end), "MillisBehindLatest": behind}

    def _refusal(self, now: float) -> str | None:
        while self.calls and self.calls[0] <= now - 1.0:
            self.calls.popleft()
        if len(self.calls) >= 5:
            return "calls_per_second"
        self.level = min(self.rate, self.level + (now - self.refilled_at) * self.rate)
        self.refilled_at = now
        if self.level < 0:
            return "bytes_per_second"
        self.calls.append(now)
        return None

    @property
    def total_bytes(self) -> int:
        return sum(len(record["Data"]) + len(KEY) for record in self.records)


def read_all(shard: ThrottlingShard, clock: FakeClock, **options: Any) -> tuple[int, int]:
    """Read the whole backlog; (records read, throttled calls)."""
    reader = GetRecordsReader(
        shard,
        ShardToRead("stream", "shardId-000000000000"),
        ReadStart(TRIM_HORIZON),
        retry_policy=RetryPolicy(attempts=6, sleep=clock.sleep),
        **{"clock": clock, "sleep": clock.sleep, **options},
    )
    read = throttled = 0
    while True:
        batch = reader.read(ReadLimits(max_records=50_000))
        read, throttled = read + len(batch.records), throttled + batch.refused_calls
        if batch.stopped_by == "tip":
            return read, throttled


@pytest.mark.parametrize(
    ("size", "page_cap"),
    [
        pytest.param(1000, 10000, id="10-MB-pages"),
        pytest.param(100, 10000, id="1-MB-pages"),
        pytest.param(10, 10000, id="small-pages-bound-by-5-calls-per-second"),
    ],
)
def test_paced_by_bytes_the_reader_is_never_throttled_and_reads_at_the_cap(size, page_cap):
    clock, rate = FakeClock(), 2.0 * 1024 * 1024
    shard = ThrottlingShard(clock, 60_000, size, rate, page_cap)
    read, throttled = read_all(shard, clock, read_bytes_per_second=rate)
    assert (read, throttled, shard.refused) == (60_000, 0, {"calls_per_second": 0, "bytes_per_second": 0})
    # The call after the last (full) page finds the tip, once that page is paid off: the read takes
    # what the backlog costs at the cap, or a call interval per page when small pages make the call rate the bound.
    pages = -(-60_000 // page_cap)
    assert clock.now == pytest.approx(max(shard.total_bytes / rate, pages * MIN_CALL_INTERVAL_SECONDS))


def test_paced_by_calls_only_the_reader_runs_into_the_byte_limit_after_every_large_page():
    clock, rate = FakeClock(), 2.0 * 1024 * 1024
    shard = ThrottlingShard(clock, 60_000, 1000, rate)
    read, throttled = read_all(shard, clock, read_bytes_per_second=None)
    assert read == 60_000
    assert throttled > 0 and shard.refused["bytes_per_second"] == throttled


def test_a_read_rate_must_be_positive():
    with pytest.raises(ValueError, match="read_bytes_per_second must be positive"):
        GetRecordsReader(
            None, ShardToRead("stream", "shardId-000000000000"), ReadStart(TRIM_HORIZON), read_bytes_per_second=0
        )


def test_a_deadline_ends_the_batch_when_the_byte_debt_would_outlast_it():
    clock, rate = FakeClock(), 1024.0 * 1024
    shard = ThrottlingShard(clock, 20_000, 1000, rate)
    reader = GetRecordsReader(
        shard,
        ShardToRead("stream", "shardId-000000000000"),
        ReadStart(TRIM_HORIZON),
        read_bytes_per_second=rate,
        clock=clock,
        sleep=clock.sleep,
    )
    batch = reader.read(ReadLimits(deadline=3.0))
    # The first 10 MB page leaves ~10 s of debt: waiting for it would overrun the deadline.
    assert (len(batch.records), batch.stopped_by, clock.now) == (10_000, "time", 0.0)


class RecordingGate:
    """A busy gate that notes whether it is held; the shard asserts every call is made under it."""

    def __init__(self) -> None:
        self.held = False
        self.entries = 0

    def __enter__(self) -> None:
        assert not self.held, "the gate is not re-entrant"
        self.held, self.entries = True, self.entries + 1

    def __exit__(self, *exc_info: object) -> None:
        self.held = False


def test_the_busy_gate_is_held_around_every_get_records_and_never_while_the_reader_waits():
    clock, rate = FakeClock(), 2.0 * 1024 * 1024
    shard = ThrottlingShard(clock, 30_000, 1000, rate)
    gate = RecordingGate()
    calls_under_gate: list[bool] = []
    sleeps_under_gate: list[bool] = []
    get_records = shard.get_records

    def noting_get_records(**arguments: Any) -> dict[str, Any]:
        calls_under_gate.append(gate.held)
        return get_records(**arguments)

    def noting_sleep(seconds: float) -> None:
        sleeps_under_gate.append(gate.held)
        clock.sleep(seconds)

    shard.get_records = noting_get_records  # type: ignore[method-assign]
    read, throttled = read_all(shard, clock, read_bytes_per_second=rate, sleep=noting_sleep, busy_gate=gate)
    assert (read, throttled) == (30_000, 0)
    assert calls_under_gate and all(calls_under_gate) and gate.entries == len(calls_under_gate)
    assert sleeps_under_gate and not any(sleeps_under_gate)


class SlowGate:
    """A busy gate whose lanes are sometimes all taken: entering it costs the next of `waits` on the clock."""

    def __init__(self, clock: FakeClock, waits: list[float]) -> None:
        self.clock = clock
        self.waits = waits
        self.entries = 0

    def __enter__(self) -> None:
        self.clock.now += self.waits[self.entries % len(self.waits)]
        self.entries += 1

    def __exit__(self, *exc_info: object) -> None:
        pass


@pytest.mark.parametrize(
    ("size", "waits"),
    [
        pytest.param(10, [0.3, 0.0, 0.0, 0.0, 0.0, 0.0], id="small-pages-a-late-call-then-prompt-ones"),
        pytest.param(1000, [0.0, 1.5], id="large-pages-every-other-call-later-than-the-burst-covers"),
    ],
)
def test_a_call_that_waited_for_a_lane_is_paced_from_when_it_was_sent(size, waits):
    # Kinesis counts a call when it arrives: pacing from before the wait for a lane would send the
    # calls after a late one too soon after it (5 in a second, or before its bytes are paid off).
    clock, rate = FakeClock(), 2.0 * 1024 * 1024
    shard = ThrottlingShard(clock, 60_000, size, rate)
    read, throttled = read_all(shard, clock, read_bytes_per_second=rate, busy_gate=SlowGate(clock, waits))
    assert (read, throttled, shard.refused) == (60_000, 0, {"calls_per_second": 0, "bytes_per_second": 0})
