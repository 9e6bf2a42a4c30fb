"""Reading shards of kinesis-mock by polling (GetRecordsReader): order, resumes, limits, KPL aggregates, shard ends,
the tip, injected expiry and throttling, the rate limit, and records lost to retention (at a resume, or
at a re-open after an expired iterator, with FaultProxy.trim simulating retention).

kinesis-mock 0.6.2 habits these tests rely on (measured here):
- MillisBehindLatest is 0 on every GetRecords response, even with records left behind a full page;
- the response that reaches the end of a closed shard carries the last records, a null
  NextShardIterator and the ChildShards together (the shard-end tests also run behind a proxy that
  answers the end one call later, as real Kinesis may);
- GetShardIterator AT/AFTER_SEQUENCE_NUMBER of a number the shard does not hold is refused with
  ResourceNotFoundException (Kinesis says InvalidArgumentException), and sequence numbers are decimal.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devtools.fault_proxy import FaultProxy
from devtools.kinesis_streams import create_stream, kinesis_client, merge_shards, put_records, shards_of, split_shard
from lease_core.errors import AccessError, DependencyError, InvalidSequenceNumberError, StreamNotFoundError
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard, Shard
from lease_core.retrieval.kinesis_records import KinesisRecord
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, ShardToRead
from lease_core.retrieval.retention_gaps import RetentionGap
from lease_core.retry import RetryPolicy
from tests.support.faults import FaultInjectingClient, client_error
from tests.support.kpl import put_aggregate

NO_LIMITS = ReadLimits()


class Sleeps(list[float]):
    """A fake sleep that records what it was asked to wait."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


class FakeClock:
    """A monotonic clock that moves only when the reader sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def kinesis(kinesis_endpoint: str) -> Any:
    return kinesis_client(kinesis_endpoint)


def reader(
    client: Any,
    stream: str,
    shard_id: str,
    start: ExtendedSequenceNumber = TRIM_HORIZON,
    *,
    start_inclusive: bool = False,
    read_before_start: ExtendedSequenceNumber = TRIM_HORIZON,  # what a gap is reported after; none is expected
    at_timestamp: datetime | None = None,
    closed: bool = False,
    **options: Any,
) -> GetRecordsReader:
    """A reader that does not pace its calls and whose retries only record their backoff. An inclusive
    start delivers the record at `start`, as a replay does from its first record after `read_before_start`."""
    options.setdefault("min_call_interval_seconds", 0.0)
    options.setdefault("retry_policy", RetryPolicy(attempts=3, base_millis=1, max_millis=4, sleep=Sleeps()))
    options.setdefault("sleep", Sleeps())
    if start_inclusive:
        read_start = ReadStart(read_before_start, first=start, at_timestamp=at_timestamp)
    else:
        read_start = ReadStart(start, at_timestamp=at_timestamp)
    return GetRecordsReader(client, ShardToRead(stream, shard_id, closed=closed), read_start, **options)


def one_shard_stream(kinesis: Any, name: str, count: int) -> tuple[str, list[str]]:
    """A one-shard stream holding `count` plain records; its shard id and their sequence numbers in order."""
    create_stream(kinesis, name, 1)
    (shard,) = shards_of(kinesis, name)
    written = put_records(kinesis, name, count).get(shard.shard_id, [])
    return shard.shard_id, sorted(written, key=int)


def read_until_caught_up(
    shard_reader: GetRecordsReader, limits: Callable[[], ReadLimits] = lambda: NO_LIMITS
) -> list[ReadBatch]:
    """Batches until one stops at the tip or the shard's end (bounded, so a bug cannot loop forever)."""
    batches: list[ReadBatch] = []
    for _ in range(200):
        batches.append(shard_reader.read(limits()))
        if batches[-1].stopped_by in ("tip", "shard_end"):
            return batches
    raise AssertionError(f"not caught up after {len(batches)} batches")


def records_of(batches: list[ReadBatch]) -> list[KinesisRecord]:
    return [record for batch in batches for record in batch.records]


def positions(records: list[KinesisRecord] | tuple[KinesisRecord, ...]) -> list[ExtendedSequenceNumber]:
    return [record.position for record in records]


def plain(sequence_numbers: list[str]) -> list[ExtendedSequenceNumber]:
    return [ExtendedSequenceNumber(number) for number in sequence_numbers]


def first_record(kinesis: Any, stream: str, shard_id: str) -> dict[str, Any]:
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
    return kinesis.get_records(ShardIterator=iterator["ShardIterator"], Limit=1)["Records"][0]


def child_shards(kinesis: Any, stream: str, parents: set[str]) -> set[ChildShard]:
    """The children of `parents` as ListShards describes them, in ChildShards' terms."""
    return {
        ChildShard(shard.shard_id, shard.parent_shard_ids, shard.hash_key_range)
        for shard in shards_of(kinesis, stream)
        if shard.parent_shard_ids & parents
    }


# --- order and resumes ---------------------------------------------------------------------------------


def test_every_record_is_read_once_in_order_from_the_trim_horizon(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 40)
    batches = read_until_caught_up(reader(kinesis, unique_name, shard_id, get_records_limit=7))
    records = records_of(batches)
    assert positions(records) == plain(sequence_numbers)
    assert sorted(record.data for record in records) == sorted(f"record-{index}".encode() for index in range(40))
    assert all(record.approximate_arrival_timestamp.tzinfo is UTC for record in records)


@pytest.mark.parametrize(
    ("start_inclusive", "first_delivered"),
    [pytest.param(False, 11, id="after-the-checkpoint"), pytest.param(True, 10, id="at-the-checkpoint-inclusive")],
)
def test_a_resume_from_a_checkpoint_neither_repeats_nor_skips(kinesis, unique_name, start_inclusive, first_delivered):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 20)
    checkpoint = ExtendedSequenceNumber(sequence_numbers[10])
    resumed = reader(kinesis, unique_name, shard_id, checkpoint, start_inclusive=start_inclusive)
    assert positions(records_of(read_until_caught_up(resumed))) == plain(sequence_numbers[first_delivered:])


def test_a_latest_start_reads_only_records_put_after_the_first_read(kinesis, unique_name):
    shard_id, _ = one_shard_stream(kinesis, unique_name, 5)
    latest = reader(kinesis, unique_name, shard_id, LATEST)
    assert latest.read(NO_LIMITS).records == ()
    later = put_records(kinesis, unique_name, 3)[shard_id]
    assert positions(latest.read(NO_LIMITS).records) == plain(sorted(later, key=int))


def test_an_at_timestamp_start_before_the_first_record_reads_every_record(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 5)
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    at_timestamp = reader(kinesis, unique_name, shard_id, AT_TIMESTAMP, at_timestamp=an_hour_ago)
    assert positions(at_timestamp.read(NO_LIMITS).records) == plain(sequence_numbers)


# --- limits ------------------------------------------------------------------------------------------------


LIMIT_CASES = [
    pytest.param(lambda clock: ReadLimits(max_records=7), "records", id="records"),
    pytest.param(lambda clock: ReadLimits(max_bytes=50), "bytes", id="bytes"),
    # Calls at +0, +0.2 and +0.4 s of the fake clock; the fourth would start past the deadline.
    pytest.param(lambda clock: ReadLimits(deadline=clock.now + 0.5), "time", id="time"),
]


@pytest.mark.parametrize(("limits", "stopped_by"), LIMIT_CASES)
def test_batches_cut_by_a_limit_continue_into_exactly_the_full_sequence(kinesis, unique_name, limits, stopped_by):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 30)
    clock = FakeClock()
    limited = reader(
        kinesis,
        unique_name,
        shard_id,
        clock=clock,
        sleep=clock.sleep,
        min_call_interval_seconds=0.2,
        get_records_limit=4,
    )
    batches = read_until_caught_up(limited, lambda: limits(clock))
    assert positions(records_of(batches)) == plain(sequence_numbers)
    cut = [batch for batch in batches if batch.records]
    assert len(cut) > 2 and {batch.stopped_by for batch in cut[:-1]} == {stopped_by}
    for batch in cut:
        assert batch.end == batch.records[-1].position
        assert batch.bytes == sum(len(record.data) for record in batch.records)
        assert len(batch.records) <= (limits(clock).max_records or 30)
        assert batch.bytes <= (limits(clock).max_bytes or batch.bytes)


@pytest.mark.parametrize(
    ("stop_at", "expected_count"),
    [
        pytest.param(lambda numbers: ExtendedSequenceNumber(numbers[6]), 7, id="at-a-record-inclusive"),
        # A plain record has only sub-sequence 0: (n6, 3) lies between records 6 and 7.
        pytest.param(lambda numbers: ExtendedSequenceNumber(numbers[6], 3), 7, id="between-two-records"),
        pytest.param(lambda numbers: ExtendedSequenceNumber(numbers[0]), 1, id="at-the-first-record"),
    ],
)
def test_a_replay_stops_at_the_prepared_position_inclusive(kinesis, unique_name, stop_at, expected_count):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 12)
    limits = ReadLimits(stop_at=stop_at(sequence_numbers))
    replay = reader(kinesis, unique_name, shard_id, get_records_limit=4).read(limits)
    assert positions(replay.records) == plain(sequence_numbers[:expected_count])
    assert replay.stopped_by == "stop_at"
    assert replay.end == ExtendedSequenceNumber(sequence_numbers[expected_count - 1])


def test_a_replay_of_a_cut_batch_returns_the_same_records(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 12)
    checkpoint = ExtendedSequenceNumber(sequence_numbers[2])
    first = reader(kinesis, unique_name, shard_id, checkpoint).read(ReadLimits(max_records=5))
    replay = reader(kinesis, unique_name, shard_id, checkpoint).read(ReadLimits(max_records=100, stop_at=first.end))
    assert replay.records == first.records
    assert replay.end == first.end


# --- KPL aggregates -------------------------------------------------------------------------------------


def put_kpl_mix(kinesis: Any, stream: str) -> tuple[list[ExtendedSequenceNumber], list[bytes], list[str]]:
    """An aggregate of 5, a plain record, an aggregate of 4: every user position, payload and key, in order."""
    groups = [[(f"agg-a-{index}", f"a{index}".encode()) for index in range(5)]]
    first = put_aggregate(kinesis, stream, groups[0])
    lone = kinesis.put_record(StreamName=stream, PartitionKey="lone", Data=b"plain")["SequenceNumber"]
    groups.append([(f"agg-b-{index}", f"b{index}".encode()) for index in range(4)])
    last = put_aggregate(kinesis, stream, groups[1])
    expected = [ExtendedSequenceNumber(first, sub) for sub in range(5)]
    expected += [ExtendedSequenceNumber(lone)] + [ExtendedSequenceNumber(last, sub) for sub in range(4)]
    payloads = [data for _, data in groups[0]] + [b"plain"] + [data for _, data in groups[1]]
    keys = [key for key, _ in groups[0]] + ["lone"] + [key for key, _ in groups[1]]
    return expected, payloads, keys


def test_kpl_aggregates_are_delivered_as_user_records_with_sub_sequence_numbers(kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    expected, payloads, keys = put_kpl_mix(kinesis, unique_name)
    (shard,) = shards_of(kinesis, unique_name)
    batch = reader(kinesis, unique_name, shard.shard_id).read(NO_LIMITS)
    assert positions(batch.records) == expected
    assert [record.data for record in batch.records] == payloads
    assert [record.partition_key for record in batch.records] == keys
    assert batch.bytes == sum(len(data) for data in payloads)


@pytest.mark.parametrize(
    ("start_inclusive", "skipped"),
    [pytest.param(False, 3, id="after-sub-record-2"), pytest.param(True, 2, id="at-sub-record-2-inclusive")],
)
def test_a_resume_inside_an_aggregate_continues_with_its_next_sub_record(
    kinesis, unique_name, start_inclusive, skipped
):
    create_stream(kinesis, unique_name, 1)
    expected, _, _ = put_kpl_mix(kinesis, unique_name)
    (shard,) = shards_of(kinesis, unique_name)
    resumed = reader(kinesis, unique_name, shard.shard_id, expected[2], start_inclusive=start_inclusive)
    assert positions(resumed.read(NO_LIMITS).records) == expected[skipped:]


def test_a_record_limit_cuts_inside_an_aggregate_and_the_next_batch_and_a_resume_continue_there(kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    expected, _, _ = put_kpl_mix(kinesis, unique_name)
    (shard,) = shards_of(kinesis, unique_name)
    limited = reader(kinesis, unique_name, shard.shard_id)
    batches = read_until_caught_up(limited, lambda: ReadLimits(max_records=3))
    assert [positions(batch.records) for batch in batches] == [
        expected[0:3],
        expected[3:6],
        expected[6:9],
        expected[9:],
    ]
    resumed = reader(kinesis, unique_name, shard.shard_id, batches[0].end)
    assert positions(resumed.read(NO_LIMITS).records) == expected[3:]


# --- shard ends ------------------------------------------------------------------------------------------


# Each runs against both ways a Kinesis may end a closed shard (`shard_ends`, tests/conftest.py), with
# the reader told the shard is closed, as the consume job tells it from the round's listing.


def test_a_split_parent_ends_with_both_children_and_stays_ended(shard_ends, unique_name):
    kinesis = kinesis_client(shard_ends.endpoint)
    parent, sequence_numbers = one_shard_stream(kinesis, unique_name, 6)
    split_shard(kinesis, unique_name, parent)
    put_records(kinesis, unique_name, 10)  # into the children, never the parent
    parent_reader = reader(kinesis, unique_name, parent, closed=True)
    batch = parent_reader.read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers)
    assert (batch.shard_ended, batch.stopped_by, batch.end) == (True, "shard_end", SHARD_END)
    assert set(batch.child_shards) == child_shards(kinesis, unique_name, {parent})
    assert len(batch.child_shards) == 2
    again = parent_reader.read(NO_LIMITS)
    assert (again.records, again.shard_ended, again.child_shards, again.calls) == (
        (),
        True,
        batch.child_shards,
        0,
    )


def test_both_merged_parents_end_with_the_child_naming_both(shard_ends, unique_name):
    kinesis = kinesis_client(shard_ends.endpoint)
    create_stream(kinesis, unique_name, 2)
    written = put_records(kinesis, unique_name, 20)
    low, high = sorted(written)
    child = merge_shards(kinesis, unique_name, low, high)
    (expected_child,) = child_shards(kinesis, unique_name, {low, high})
    assert expected_child.shard_id == child and expected_child.parent_shard_ids == {low, high}
    for parent in (low, high):
        batch = reader(kinesis, unique_name, parent, closed=True).read(NO_LIMITS)
        assert positions(batch.records) == plain(sorted(written[parent], key=int))
        assert batch.shard_ended and batch.child_shards == (expected_child,)


def closed_parent(kinesis: Any, name: str, count: int) -> tuple[Shard, list[str]]:
    parent, sequence_numbers = one_shard_stream(kinesis, name, count)
    split_shard(kinesis, name, parent)
    (closed,) = [shard for shard in shards_of(kinesis, name) if shard.shard_id == parent]
    return closed, sequence_numbers


@pytest.mark.parametrize(
    ("max_records", "ended_late"),
    [
        pytest.param(4, [(True, False), (True, False), (True, True)], id="last-batch-shorter"),
        # A full batch stops before the call that answers the end: the next batch makes it.
        pytest.param(3, [(True, False), (True, False), (True, False), (False, True)], id="limit-exactly-at-the-end"),
    ],
)
def test_a_closed_parent_read_in_batches_ends_after_its_last_record(shard_ends, unique_name, max_records, ended_late):
    kinesis = kinesis_client(shard_ends.endpoint)
    parent, sequence_numbers = closed_parent(kinesis, unique_name, 9)
    # kinesis-mock lists 9223372036854775807 as every closed shard's end: no record's, so it is unknown.
    assert parent.ending_sequence_number == "9223372036854775807" and parent.known_ending_sequence_number is None
    batched = reader(kinesis, unique_name, parent.shard_id, closed=not parent.is_open)
    batches = read_until_caught_up(batched, lambda: ReadLimits(max_records=max_records))
    assert positions(records_of(batches)) == plain(sequence_numbers)
    # With the last records, the end is observed in the batch that reads them.
    ended_with_the_last_records = [(True, False), (True, False), (True, True)]
    expected = ended_late if shard_ends.proxy is not None else ended_with_the_last_records
    assert [(bool(batch.records), batch.shard_ended) for batch in batches] == expected


def test_a_replay_to_shard_end_reads_the_closed_parent_to_its_end(shard_ends, unique_name):
    kinesis = kinesis_client(shard_ends.endpoint)
    parent, sequence_numbers = closed_parent(kinesis, unique_name, 9)
    checkpoint = ExtendedSequenceNumber(sequence_numbers[3])
    batch = reader(kinesis, unique_name, parent.shard_id, checkpoint, get_records_limit=2, closed=True).read(
        ReadLimits(stop_at=SHARD_END)
    )
    assert positions(batch.records) == plain(sequence_numbers[4:])
    assert (batch.end, batch.stopped_by) == (SHARD_END, "shard_end")


# --- the tip ----------------------------------------------------------------------------------------------


def test_an_open_shard_is_read_to_its_tip_in_one_call_and_later_records_follow(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 5)
    tip_reader = reader(kinesis, unique_name, shard_id)
    batch = tip_reader.read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers)
    assert (batch.stopped_by, batch.millis_behind_latest, batch.calls, batch.shard_ended) == (
        "tip",
        0,
        1,
        False,
    )
    assert tip_reader.read(NO_LIMITS).records == ()
    later = put_records(kinesis, unique_name, 3)[shard_id]
    assert positions(tip_reader.read(NO_LIMITS).records) == plain(sorted(later, key=int))


def test_a_full_page_at_millis_behind_zero_is_not_taken_for_the_tip(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 10)
    batch = reader(kinesis, unique_name, shard_id, get_records_limit=5).read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers)
    assert (batch.stopped_by, batch.calls) == ("tip", 3)


# --- injected faults -------------------------------------------------------------------------------------


def failing_on(method: str, calls: set[int], error: Exception) -> Callable[[str, int], Any]:
    return lambda name, call: error if name == method and call in calls else None


@pytest.mark.parametrize(
    "expired_calls",
    [pytest.param({1}, id="before-anything-was-fetched"), pytest.param({2, 4}, id="twice-mid-shard")],
)
def test_an_expired_iterator_is_renewed_without_duplicates_or_gaps(kinesis, unique_name, expired_calls):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 15)
    expiring = FaultInjectingClient(
        kinesis, failing_on("get_records", expired_calls, client_error("ExpiredIteratorException", "GetRecords"))
    )
    start = ExtendedSequenceNumber(sequence_numbers[1])
    batches = read_until_caught_up(reader(expiring, unique_name, shard_id, start, get_records_limit=4))
    assert positions(records_of(batches)) == plain(sequence_numbers[2:])
    assert sum(batch.reopens for batch in batches) == len(expired_calls)


def test_an_expired_iterator_inside_kpl_aggregates_loses_no_sub_record(kinesis, unique_name):
    create_stream(kinesis, unique_name, 1)
    expected, _, _ = put_kpl_mix(kinesis, unique_name)
    (shard,) = shards_of(kinesis, unique_name)
    expiring = FaultInjectingClient(
        kinesis, failing_on("get_records", {2}, client_error("ExpiredIteratorException", "GetRecords"))
    )
    batches = read_until_caught_up(reader(expiring, unique_name, shard.shard_id, get_records_limit=1))
    assert positions(records_of(batches)) == expected


@pytest.mark.parametrize(
    "code", ["ProvisionedThroughputExceededException", "KMSThrottlingException", "LimitExceededException"]
)
def test_throttled_calls_are_retried_with_backoff_and_every_record_arrives(kinesis, unique_name, code):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 12)
    throttling = FaultInjectingClient(kinesis, failing_on("get_records", {2, 3}, client_error(code, "GetRecords")))
    backoffs = Sleeps()
    batch = reader(throttling, unique_name, shard_id, get_records_limit=4, sleep=backoffs).read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers)
    assert (batch.refused_calls, batch.stopped_by) == (2, "tip")
    assert len(backoffs) == 2 and all(0 <= delay <= 0.004 for delay in backoffs)


def test_persistent_throttling_ends_the_batch_with_what_was_read_and_reading_resumes_later(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 12)
    throttled = {"on": False}
    error = client_error("ProvisionedThroughputExceededException", "GetRecords")
    client = FaultInjectingClient(
        kinesis, lambda name, call: error if name == "get_records" and throttled["on"] else None
    )
    shard_reader = reader(client, unique_name, shard_id, get_records_limit=4)
    assert positions(shard_reader.read(ReadLimits(max_records=4)).records) == plain(sequence_numbers[:4])
    throttled["on"] = True
    batch = shard_reader.read(NO_LIMITS)
    assert (batch.records, batch.stopped_by, batch.refused_calls, batch.end) == ((), "throttled", 3, None)
    throttled["on"] = False
    assert positions(records_of(read_until_caught_up(shard_reader))) == plain(sequence_numbers[4:])


def test_persistent_throttling_mid_batch_keeps_the_records_already_read(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 12)
    error = client_error("ProvisionedThroughputExceededException", "GetRecords")
    client = FaultInjectingClient(kinesis, lambda name, call: error if name == "get_records" and call > 1 else None)
    batch = reader(client, unique_name, shard_id, get_records_limit=4).read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers[:4])
    assert (batch.stopped_by, batch.refused_calls, batch.calls) == ("throttled", 3, 4)


def test_get_records_calls_of_one_reader_are_at_least_the_minimum_interval_apart(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 10)
    clock = FakeClock()
    call_times: list[float] = []

    def observe(name: str, call: int) -> None:
        if name == "get_records":
            call_times.append(clock.now)

    observed = FaultInjectingClient(kinesis, observe)
    paced = GetRecordsReader(
        observed,
        ShardToRead(unique_name, shard_id),
        ReadStart(TRIM_HORIZON),
        get_records_limit=2,
        clock=clock,
        sleep=clock.sleep,
    )
    batches = read_until_caught_up(paced, lambda: ReadLimits(max_records=3))
    assert positions(records_of(batches)) == plain(sequence_numbers)
    gaps = [later - earlier for earlier, later in itertools.pairwise(call_times)]
    assert len(gaps) >= 5 and min(gaps) >= 0.2 - 1e-9


def test_a_server_error_is_retried_by_the_policy_and_loses_nothing(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 8)
    flaky = FaultInjectingClient(
        kinesis, failing_on("get_records", {2, 3}, client_error("InternalFailure", "GetRecords", status=500))
    )
    batch = reader(flaky, unique_name, shard_id, get_records_limit=4).read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers)
    assert (batch.calls, batch.refused_calls) == (5, 0)


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        pytest.param(client_error("InternalFailure", "GetRecords", status=500), DependencyError, id="lasting-5xx"),
        pytest.param(client_error("AccessDeniedException", "GetRecords"), AccessError, id="access-denied"),
    ],
)
def test_a_lasting_server_error_or_a_refusal_is_raised_as_a_lease_core_error(kinesis, unique_name, error, raised):
    shard_id, _ = one_shard_stream(kinesis, unique_name, 3)
    failing = FaultInjectingClient(kinesis, lambda name, call: error if name == "get_records" else None)
    with pytest.raises(raised) as caught:
        reader(failing, unique_name, shard_id).read(NO_LIMITS)
    assert caught.value.operation == "GetRecords"


@pytest.mark.parametrize(
    "start",
    [
        pytest.param(TRIM_HORIZON, id="trim-horizon"),
        pytest.param(ExtendedSequenceNumber("49" + "0" * 54), id="sequence-number"),
    ],
)
def test_a_missing_stream_is_reported_as_stream_not_found(kinesis, unique_name, start):
    with pytest.raises(StreamNotFoundError) as raised:
        reader(kinesis, unique_name, "shardId-000000000000", start).read(NO_LIMITS)
    assert raised.value.stream_name == unique_name


# --- retention ---------------------------------------------------------------------------------------------


def below(sequence_number: str) -> ExtendedSequenceNumber:
    """A checkpoint just below a record: the records after it (none here) count as aged out."""
    return ExtendedSequenceNumber(str(int(sequence_number) - 1))


REFUSALS = [
    pytest.param(client_error("InvalidArgumentException", "GetShardIterator"), id="invalid-argument"),
    # No injection: kinesis-mock itself refuses a number it does not hold (ResourceNotFoundException).
    pytest.param(None, id="kinesis-mock-refusal"),
]


def refusing(kinesis: Any, refusal: Exception | None) -> Any:
    """The client that refuses the reader's first GetShardIterator with `refusal`, if one is given."""
    return kinesis if refusal is None else FaultInjectingClient(kinesis, failing_on("get_shard_iterator", {1}, refusal))


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_checkpoint_below_the_trim_horizon_is_reported_as_a_gap_and_reading_continues(
    kinesis, unique_name, refusal
):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 6)
    client = refusing(kinesis, refusal)
    start = below(sequence_numbers[0])
    shard_reader = reader(client, unique_name, shard_id, start)
    batch = shard_reader.read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers)
    assert batch.gap == RetentionGap(start, sequence_numbers[0], batch.records[0].approximate_arrival_timestamp)
    put_records(kinesis, unique_name, 2)
    assert shard_reader.read(NO_LIMITS).gap is None


def test_an_accepted_checkpoint_whose_record_aged_out_is_reported_as_a_gap(kinesis, unique_name):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 6)
    # Kinesis answers a trimmed AT_SEQUENCE_NUMBER with an iterator at the trim horizon: hand that out.
    trim_horizon = kinesis.get_shard_iterator(
        StreamName=unique_name, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )
    accepting = FaultInjectingClient(kinesis, lambda name, call: trim_horizon if name == "get_shard_iterator" else None)
    start = below(sequence_numbers[0])
    batch = reader(accepting, unique_name, shard_id, start).read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers)
    arrival = first_record(kinesis, unique_name, shard_id)["ApproximateArrivalTimestamp"]
    assert batch.gap == RetentionGap(start, sequence_numbers[0], arrival.astimezone(UTC))


def test_a_checkpoint_refused_on_a_shard_that_is_empty_now_is_a_gap_with_nothing_available(kinesis, unique_name):
    shard_id, _ = one_shard_stream(kinesis, unique_name, 0)
    start = ExtendedSequenceNumber("49" + "0" * 54)
    batch = reader(kinesis, unique_name, shard_id, start).read(NO_LIMITS)
    assert (batch.records, batch.stopped_by, batch.gap) == ((), "tip", RetentionGap(start, None, None))


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_checkpoint_above_the_trim_horizon_is_an_invalid_sequence_number(kinesis, unique_name, refusal):
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 6)
    client = refusing(kinesis, refusal)
    start = ExtendedSequenceNumber(str(int(sequence_numbers[2]) + 1))
    with pytest.raises(InvalidSequenceNumberError, match=shard_id) as raised:
        reader(client, unique_name, shard_id, start).read(NO_LIMITS)
    assert raised.value.value == start.sequence_number


# --- retention at a re-open after an expired iterator ----------------------------------------------------


@pytest.fixture
def kinesis_proxy(kinesis_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(kinesis_endpoint) as proxy:
        yield proxy


Trim = tuple[str, str]  # the first sequence number kept, and FaultProxy.trim's mode


def expiring(proxy: FaultProxy, stream: str, shard_id: str, expired: dict[int, Trim | None]) -> FaultInjectingClient:
    """A client through `proxy` whose GetRecords calls numbered in `expired` find their iterator expired,
    the shard trimmed as given (if at all) meanwhile."""

    def fault(name: str, call: int) -> Exception | None:
        if name != "get_records" or call not in expired:
            return None
        trim = expired[call]
        if trim is not None:
            proxy.trim(stream, shard_id, *trim)
        return client_error("ExpiredIteratorException", "GetRecords")

    return FaultInjectingClient(kinesis_client(proxy.endpoint), fault)


TRIMMED_AT_REOPEN = [
    # Kinesis answers an aged-out AT_SEQUENCE_NUMBER with an iterator at the trim horizon.
    pytest.param("skip", {"trim_rewrite:GetShardIterator": 1}, id="aged-out-number-accepted"),
    pytest.param(
        "reject",
        {"trim_reject:GetShardIterator": 1, "trim_rewrite:GetShardIterator": 1},
        id="aged-out-number-refused-falls-back-to-the-trim-horizon",
    ),
]


@pytest.mark.parametrize(("mode", "trim_stats"), TRIMMED_AT_REOPEN)
def test_an_expired_iterator_reopened_after_the_records_behind_it_aged_out_reports_the_gap(
    kinesis, kinesis_proxy, unique_name, mode, trim_stats
):
    """A re-open that finds the records after the last one read aged out reports a gap from that record
    to the first one available, and delivers the rest."""
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 12)
    client = expiring(kinesis_proxy, unique_name, shard_id, {2: (sequence_numbers[6], mode)})
    batch = reader(client, unique_name, shard_id, get_records_limit=4).read(NO_LIMITS)
    assert positions(batch.records) == plain(sequence_numbers[:4] + sequence_numbers[6:])
    first_available = batch.records[4].approximate_arrival_timestamp
    assert batch.gap == RetentionGap(ExtendedSequenceNumber(sequence_numbers[3]), sequence_numbers[6], first_available)
    assert (batch.reopens, batch.stopped_by) == (1, "tip")
    assert {key: count for key, count in kinesis_proxy.stats().items() if key != "forwarded"} == trim_stats


def put_kpl_case(kinesis: Any, stream: str) -> tuple[list[ExtendedSequenceNumber], str]:
    """The KPL mix; every user position, and the sequence number of the aggregate fetched first."""
    create_stream(kinesis, stream, 1)
    expected, _, _ = put_kpl_mix(kinesis, stream)
    return expected, expected[0].sequence_number


def put_plain_case(kinesis: Any, stream: str) -> tuple[list[ExtendedSequenceNumber], str]:
    """Eight plain records; every position, and the sequence number of the record fetched first."""
    _, sequence_numbers = one_shard_stream(kinesis, stream, 8)
    return plain(sequence_numbers), sequence_numbers[0]


UNTRIMMED_REOPENS = [
    pytest.param(put_plain_case, None, id="plain-nothing-trimmed"),
    pytest.param(put_plain_case, "reject", id="plain-trimmed-up-to-the-last-record-read"),
    pytest.param(put_kpl_case, None, id="kpl-nothing-trimmed"),
    pytest.param(put_kpl_case, "reject", id="kpl-trimmed-up-to-the-partly-delivered-aggregate"),
]


@pytest.mark.parametrize(("put", "trim_mode"), UNTRIMMED_REOPENS)
def test_an_expired_iterator_reopened_with_nothing_unread_aged_out_reports_no_gap_and_repeats_nothing(
    kinesis, kinesis_proxy, unique_name, put, trim_mode
):
    """A re-open that still finds the last record fetched (a partly delivered aggregate included) delivers
    every later record exactly once and reports no gap."""
    expected, fetched_first = put(kinesis, unique_name)
    (shard,) = shards_of(kinesis, unique_name)
    # The second GetRecords expires, after one plain record or a whole aggregate (3 of its 5 delivered).
    trim = None if trim_mode is None else (fetched_first, trim_mode)
    client = expiring(kinesis_proxy, unique_name, shard.shard_id, {2: trim})
    shard_reader = reader(client, unique_name, shard.shard_id, get_records_limit=1)
    batches = read_until_caught_up(shard_reader, lambda: ReadLimits(max_records=3))
    assert positions(records_of(batches)) == expected
    assert [batch.gap for batch in batches] == [None] * len(batches)
    assert sum(batch.reopens for batch in batches) == 1


@pytest.mark.parametrize("mode", ["skip", "reject"])
def test_an_inclusive_start_that_aged_out_is_reported_as_a_gap_after_the_position_read_before_it(
    kinesis, kinesis_proxy, unique_name, mode
):
    """A replay from a prepared batch's first record: when that record itself aged out, the gap starts
    after the committed checkpoint before it, so the loss names the first record too."""
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 10)
    kinesis_proxy.trim(unique_name, shard_id, sequence_numbers[5], mode)
    checkpoint, first = ExtendedSequenceNumber(sequence_numbers[2]), ExtendedSequenceNumber(sequence_numbers[3])
    client = kinesis_client(kinesis_proxy.endpoint)
    batch = reader(client, unique_name, shard_id, first, start_inclusive=True, read_before_start=checkpoint).read(
        NO_LIMITS
    )
    assert positions(batch.records) == plain(sequence_numbers[5:])
    assert batch.gap == RetentionGap(checkpoint, sequence_numbers[5], batch.records[0].approximate_arrival_timestamp)


def test_two_gaps_met_in_one_read_are_reported_by_two_batches(kinesis, kinesis_proxy, unique_name):
    """A gap found at a re-open of a batch that already reports one ends that batch, and the next batch
    reports it."""
    shard_id, sequence_numbers = one_shard_stream(kinesis, unique_name, 12)
    kinesis_proxy.trim(unique_name, shard_id, sequence_numbers[3])
    client = expiring(kinesis_proxy, unique_name, shard_id, {2: (sequence_numbers[9], "reject")})
    start = ExtendedSequenceNumber(sequence_numbers[1])
    shard_reader = reader(client, unique_name, shard_id, start, get_records_limit=4)
    first, second = shard_reader.read(NO_LIMITS), shard_reader.read(NO_LIMITS)
    assert positions(first.records) == plain(sequence_numbers[3:7])
    assert first.gap == RetentionGap(start, sequence_numbers[3], first.records[0].approximate_arrival_timestamp)
    assert positions(second.records) == plain(sequence_numbers[9:])
    arrival = second.records[0].approximate_arrival_timestamp
    assert second.gap == RetentionGap(ExtendedSequenceNumber(sequence_numbers[6]), sequence_numbers[9], arrival)
    assert (first.stopped_by, second.stopped_by) == ("gap", "tip")
