"""Behaviour of the parallel-scan segment count (docs/protocol.md §1.5) and its two-hour cache in the DynamoDB store."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from lease_core.retry import RetryPolicy
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.scan_segments import scan_segment_count

KIB, MIB, GIB = 1024, 1024**2, 1024**3
TWO_HOURS = 2 * 60 * 60

SIZES = [
    pytest.param(0, 1, id="0B"),
    pytest.param(KIB, 1, id="1KiB"),
    pytest.param(100 * MIB, 1, id="100MiB"),
    pytest.param(214748364, 1, id="214748364B"),
    pytest.param(214748365, 2, id="just-above-0.2GiB"),
    pytest.param(322122547, 2, id="322122547B"),
    pytest.param(GIB, 5, id="1GiB"),
    pytest.param(2 * GIB, 10, id="2GiB"),
    pytest.param(5 * GIB, 25, id="5GiB"),
    pytest.param(6 * GIB, 30, id="6GiB"),
    pytest.param(int(6.4 * GIB), 32, id="6.4GiB-reaches-the-cap"),
    pytest.param(100 * GIB, 32, id="100GiB-capped-at-32"),
]


@pytest.mark.parametrize(("size", "segments"), SIZES)
def test_one_segment_per_fifth_of_a_gib_clamped_to_1_to_32(size: int, segments: int) -> None:
    assert scan_segment_count(size) == segments


@pytest.mark.parametrize(("size", "configured"), [(0, 7), (100 * GIB, 7), (None, 50)], ids=["small", "huge", "unknown"])
def test_a_configured_segment_count_wins(size: int | None, configured: int) -> None:
    assert scan_segment_count(size, configured=configured, last_known=3) == configured


UNKNOWN = [
    pytest.param(None, 10, id="no-last-known-gives-10"),
    pytest.param(4, 4, id="last-known-reused"),
]


@pytest.mark.parametrize(("last_known", "segments"), UNKNOWN)
def test_an_unknown_size_reuses_the_last_count_or_10(last_known: int | None, segments: int) -> None:
    assert scan_segment_count(None, last_known=last_known) == segments


# --- the store's two-hour cache ---------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class DescribeTableClient:
    """Answers DescribeTable with a settable size, or fails while `failing` is set; counts calls."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.failing = False
        self.describe_calls = 0

    def describe_table(self, TableName: str) -> dict[str, Any]:
        self.describe_calls += 1
        if self.failing:
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "InternalServerError", "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": 500}},
                "DescribeTable",
            )
        return {"Table": {"TableName": TableName, "TableSizeBytes": self.size}}


def store_for(client: DescribeTableClient, clock: FakeClock, configured: int = 0) -> DynamoDBLeaseStore:
    no_retries = RetryPolicy(attempts=1, sleep=lambda _: None)
    return DynamoDBLeaseStore(
        client, "leases", retry_policy=no_retries, scan_total_segments=configured, monotonic=clock
    )


def test_the_count_is_computed_from_the_table_size() -> None:
    assert store_for(DescribeTableClient(2 * GIB), FakeClock()).scan_segment_count() == 10


def test_within_two_hours_the_table_is_described_once() -> None:
    client, clock = DescribeTableClient(GIB), FakeClock()
    store = store_for(client, clock)
    counts = [store.scan_segment_count()]
    client.size = 5 * GIB
    for elapsed in (1, 60, TWO_HOURS - 1):
        clock.now = 1000.0 + elapsed
        counts.append(store.scan_segment_count())
    assert (counts, client.describe_calls) == ([5, 5, 5, 5], 1)


def test_after_two_hours_the_table_is_described_again() -> None:
    client, clock = DescribeTableClient(GIB), FakeClock()
    store = store_for(client, clock)
    store.scan_segment_count()
    client.size = 5 * GIB
    clock.now += TWO_HOURS
    assert (store.scan_segment_count(), client.describe_calls) == (25, 2)


def test_the_cache_restarts_from_the_last_recomputation() -> None:
    client, clock = DescribeTableClient(GIB), FakeClock()
    store = store_for(client, clock)
    store.scan_segment_count()
    clock.now += TWO_HOURS
    store.scan_segment_count()
    clock.now += TWO_HOURS - 1
    store.scan_segment_count()
    assert client.describe_calls == 2


def test_a_failing_describe_table_gives_10_segments() -> None:
    client = DescribeTableClient(GIB)
    client.failing = True
    assert store_for(client, FakeClock()).scan_segment_count() == 10


def test_a_failing_describe_table_reuses_the_last_known_count() -> None:
    client, clock = DescribeTableClient(GIB), FakeClock()
    store = store_for(client, clock)
    store.scan_segment_count()
    client.failing = True
    clock.now += TWO_HOURS
    assert (store.scan_segment_count(), client.describe_calls) == (5, 2)


def test_the_table_is_described_again_two_hours_after_a_failure() -> None:
    client, clock = DescribeTableClient(GIB), FakeClock()
    client.failing = True
    store = store_for(client, clock)
    store.scan_segment_count()
    client.failing = False
    clock.now += TWO_HOURS
    assert (store.scan_segment_count(), client.describe_calls) == (5, 2)


def test_a_configured_count_is_used_without_describing_the_table() -> None:
    client = DescribeTableClient(100 * GIB)
    assert (store_for(client, FakeClock(), configured=3).scan_segment_count(), client.describe_calls) == (3, 0)
