"""Reading shards by enhanced fan-out (SubscriptionReader) against the Kinesis stand-in, through an
unmodified boto3 client: the same records and positions as polling from every start (plain records
and KPL aggregates, a checkpoint inside an aggregate), batches cut by limits and replays, the tip, a
closed parent's end with its children (both ways Kinesis may end it), subscriptions renewed at the
end of their lifetime and after exception events, refused subscriptions, a consumer re-created under
the same name, and the errors a slot reports. Durations are short (`FAN_OUT`); a test takes about a
second, the renewal ones a few."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from devtools.kinesis_standin import (
    ACCOUNT,
    REGION,
    FanOutLimits,
    KinesisStandIn,
    Limits,
    StreamSpec,
    sequence_number,
    shard_id_of,
)
from lease_core import aws
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import InvalidSequenceNumberError
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.retrieval.fanout.subscription_reader import MIN_REFUSALS, SubscriptionReader
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, RecordSource, ShardToRead
from lease_core.retry import RetryPolicy
from tests.support.consumer_arns import DescribedConsumerArns

CONSUMER = "slots"
OTHER_CONSUMER = "slots-too"  # its subscriptions never wait for those of CONSUMER
PLAIN = StreamSpec("plain", shards=1, records_per_shard=300, record_bytes=100)
KPL = StreamSpec("kpl", shards=1, records_per_shard=40, record_bytes=60, aggregate_size=7)
SPLIT = StreamSpec("split", shards=1, records_per_shard=60, record_bytes=80, split=True)
SPLIT_EARLY = StreamSpec(
    "split-early", shards=1, records_per_shard=60, record_bytes=80, split=True, shard_end="with_last_records"
)
AGED = StreamSpec("aged", shards=1, records_per_shard=60, record_bytes=80, aged_out=10)
ALL_AGED = StreamSpec("all-aged", shards=1, records_per_shard=20, record_bytes=80, aged_out=20)
STREAMS = (PLAIN, KPL, SPLIT, SPLIT_EARLY, AGED, ALL_AGED)
SHARD = shard_id_of(0)
# Events of at most 40 records (a shard takes several), quick heartbeats, Kinesis' 1 subscription a
# second per consumer and shard, its in-use rule shortened from 5 s to 1.5 s, consumers ACTIVE at once.
FAN_OUT = FanOutLimits(
    max_event_records=40, heartbeat_seconds=0.2, in_use_seconds=1.5, activation_seconds=0, deletion_seconds=0
)
NO_LIMITS = ReadLimits()
FROM_TRIM_HORIZON = ReadStart(TRIM_HORIZON)


class Sleeps(list[float]):
    """A sleep that records what it was asked to wait, and waits it (the stand-in's rules are real time)."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        time.sleep(seconds)


@pytest.fixture(scope="module")
def standin() -> Iterator[KinesisStandIn]:
    with KinesisStandIn(list(STREAMS), Limits.off(), FAN_OUT) as running:
        client = running.client()
        for spec in STREAMS:
            for consumer in (CONSUMER, OTHER_CONSUMER):
                client.register_stream_consumer(StreamARN=stream_arn(spec.name), ConsumerName=consumer)
        yield running


@pytest.fixture(scope="module")
def client(standin: KinesisStandIn) -> Any:
    return standin.client()


def stream_arn(stream: str) -> str:
    return f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{stream}"


def fan_out_reader(
    client: Any, stream: str, shard: str = SHARD, start: ReadStart = FROM_TRIM_HORIZON, **options: Any
) -> SubscriptionReader:
    options.setdefault("retry_policy", RetryPolicy(attempts=4, base_millis=1, max_millis=4))
    consumers = options.pop("consumers", None) or DescribedConsumerArns(client, CONSUMER)
    closed = options.pop("closed", False)
    return SubscriptionReader(client, consumers, ShardToRead(stream, shard, closed=closed), start, **options)


def polling_reader(
    client: Any, stream: str, shard: str = SHARD, start: ReadStart = FROM_TRIM_HORIZON
) -> GetRecordsReader:
    return GetRecordsReader(
        client, ShardToRead(stream, shard), start, min_call_interval_seconds=0, read_bytes_per_second=None
    )


def read_all(source: RecordSource, limits: ReadLimits = NO_LIMITS) -> list[ReadBatch]:
    batches: list[ReadBatch] = []
    try:
        for _ in range(500):
            batches.append(source.read(limits))
            if batches[-1].stopped_by in ("tip", "shard_end"):
                return batches
    finally:
        source.close()
    raise AssertionError(f"not caught up after {len(batches)} batches")


def positions(batches: list[ReadBatch]) -> list[ExtendedSequenceNumber]:
    return [record.position for batch in batches for record in batch.records]


def contents(batches: list[ReadBatch]) -> list[tuple[ExtendedSequenceNumber, bytes, str]]:
    return [(record.position, record.data, record.partition_key) for batch in batches for record in batch.records]


# --- the same records as polling -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lease_core_client(standin: KinesisStandIn) -> Any:
    """A client as the slots have (`lease_core.aws.client`): events' records decoded into columns."""
    config = ConsumerConfig(aws_region=REGION, aws_endpoint_url_kinesis=standin.endpoint)
    with mock.patch.dict(os.environ, {"AWS_ACCESS_KEY_ID": "standin", "AWS_SECRET_ACCESS_KEY": "standin"}):
        return aws.client("kinesis", config)


@pytest.mark.parametrize("spec", [PLAIN, KPL], ids=["plain", "kpl"])
@pytest.mark.parametrize("decoding", ["botocore", "lease_core"])
def test_a_read_from_the_trim_horizon_delivers_what_polling_delivers_and_stops_at_the_tip(
    client, lease_core_client, spec, decoding
):
    polled = read_all(polling_reader(client, spec.name))
    if decoding == "botocore":
        subscribed = read_all(fan_out_reader(client, spec.name))
    else:
        consumers = DescribedConsumerArns(lease_core_client, OTHER_CONSUMER)
        subscribed = read_all(fan_out_reader(lease_core_client, spec.name, consumers=consumers))
    assert contents(subscribed) == contents(polled)
    assert len(contents(subscribed)) == spec.records_per_shard * max(1, spec.aggregate_size)
    last = subscribed[-1]
    assert (last.stopped_by, last.millis_behind_latest, last.shard_ended) == ("tip", 0, False)
    assert sum(batch.refused_calls for batch in subscribed) == 0
    assert sum(batch.calls for batch in subscribed) == 1


@pytest.mark.parametrize(
    ("spec", "index"),
    [(PLAIN, 0), (PLAIN, 137), (KPL, 3), (KPL, 100), (KPL, 279)],
    ids=["plain-first", "plain-middle", "kpl-inside-first-aggregate", "kpl-inside-an-aggregate", "kpl-last"],
)
def test_a_resume_from_a_checkpoint_continues_as_polling_does(client, spec, index):
    every = positions(read_all(polling_reader(client, spec.name)))
    start = ReadStart(every[index])
    assert positions(read_all(fan_out_reader(client, spec.name, start=start))) == every[index + 1 :]


@pytest.mark.parametrize(
    "limits",
    [ReadLimits(max_records=33), ReadLimits(max_bytes=2500), ReadLimits(max_records=5, max_bytes=10_000)],
    ids=["records", "bytes", "both"],
)
def test_batches_cut_by_a_limit_continue_into_exactly_the_full_sequence(client, limits):
    every = positions(read_all(polling_reader(client, KPL.name)))
    batches = read_all(fan_out_reader(client, KPL.name), limits)
    assert positions(batches) == every
    assert {batch.stopped_by for batch in batches[:-1]} <= {"records", "bytes"}
    assert all(len(batch.records) <= (limits.max_records or 10**9) for batch in batches)


def test_a_replay_stops_at_the_prepared_position_inclusive_and_reads_on_from_there(client):
    every = positions(read_all(polling_reader(client, KPL.name)))
    source = fan_out_reader(client, KPL.name, start=ReadStart(every[9], first=every[10]))
    try:
        replay = source.read(ReadLimits(stop_at=every[50]))
        assert (replay.stopped_by, positions([replay])) == ("stop_at", every[10:51])
        assert positions([source.read(ReadLimits(max_records=5))]) == every[51:56]
    finally:
        source.close()


# --- a closed shard's end ----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [SPLIT, SPLIT_EARLY], ids=["end-after-last-records", "end-with-last-records"])
def test_a_closed_parent_ends_with_its_children_named_and_stays_ended(client, spec):
    source = fan_out_reader(client, spec.name, closed=True)
    try:
        batches = read_all(source)
        assert len(positions(batches)) == spec.records_per_shard
        end = batches[-1]
        assert (end.shard_ended, end.stopped_by, end.end) == (True, "shard_end", SHARD_END)
        assert {child.shard_id for child in end.child_shards} == {shard_id_of(1), shard_id_of(2)}
        assert all(child.parent_shard_ids == {SHARD} for child in end.child_shards)
        again = source.read(NO_LIMITS)
        assert (again.records, again.shard_ended, again.calls) == ((), True, 0)
    finally:
        source.close()
    for child in end.child_shards:
        assert len(positions(read_all(fan_out_reader(client, spec.name, child.shard_id)))) == spec.records_per_shard


def test_a_replay_to_shard_end_reads_the_closed_parent_to_its_end(client):
    every = positions(read_all(polling_reader(client, SPLIT.name)))
    source = fan_out_reader(client, SPLIT.name, start=ReadStart(every[19], first=every[20]), closed=True)
    try:
        batch = source.read(ReadLimits(stop_at=SHARD_END))
    finally:
        source.close()
    assert positions([batch]) == every[20:] and batch.shard_ended


# --- subscriptions renewed, refused, broken ----------------------------------------------------------


def test_subscriptions_ending_mid_read_are_renewed_where_they_stood(unique_name):
    spec = StreamSpec(unique_name, shards=1, records_per_shard=400, record_bytes=1000, aggregate_size=4)
    # 1.6 MB at 400 KiB/s with subscriptions of 1.2 s: four or five subscriptions, a second apart.
    limits = FanOutLimits(
        read_bytes_per_second=400 * 1024,
        subscription_seconds=1.2,
        max_event_records=20,
        heartbeat_seconds=0.2,
        activation_seconds=0,
    )
    with KinesisStandIn([spec], Limits.off(), limits) as standin:
        client = standin.client()
        client.register_stream_consumer(StreamARN=stream_arn(spec.name), ConsumerName=CONSUMER)
        every = positions(read_all(polling_reader(client, spec.name)))
        batches = read_all(fan_out_reader(client, spec.name), ReadLimits(max_records=150))
        violations = standin.stats()["fan_out"]["violations"]
    assert positions(batches) == every
    assert sum(batch.reopens for batch in batches) >= 2
    assert sum(batch.calls for batch in batches) == sum(batch.reopens for batch in batches) + 1
    assert sum(batch.refused_calls for batch in batches) == 0
    assert not any(violations.values()), violations


@pytest.mark.parametrize("error", ["InternalFailureException", "ResourceInUseException"])
def test_a_subscription_ended_by_an_exception_event_resumes_without_duplicates_or_gaps(unique_name, error):
    spec = StreamSpec(unique_name, shards=1, records_per_shard=200, record_bytes=1000)
    # 200 kB at 100 KiB/s: the subscription is still pushing when the fault ends it.
    limits = FanOutLimits(
        read_bytes_per_second=100 * 1024, max_event_records=20, heartbeat_seconds=0.2, activation_seconds=0
    )
    with KinesisStandIn([spec], Limits.off(), limits) as standin:
        client = standin.client()
        client.register_stream_consumer(StreamARN=stream_arn(spec.name), ConsumerName=CONSUMER)
        every = positions(read_all(polling_reader(client, spec.name)))
        sleeps = Sleeps()
        source = fan_out_reader(client, spec.name, sleep=sleeps)
        try:
            first = source.read(ReadLimits(max_records=40))
            assert standin.fail_subscriptions(error, stream=spec.name, shard_id=SHARD) == 1
            rest = read_all(source)
        finally:
            source.close()
    assert positions([first, *rest]) == every
    assert sum(batch.reopens for batch in rest) == 1
    assert sleeps and min(sleeps) >= 1.0  # a new subscription waits out Kinesis' 1 call a second


def test_a_subscription_refused_while_another_is_open_waits_and_takes_the_shard_over(client):
    every = positions(read_all(polling_reader(client, PLAIN.name)))
    holder = fan_out_reader(client, PLAIN.name)
    sleeps = Sleeps()
    taker = fan_out_reader(
        client, PLAIN.name, sleep=sleeps, retry_policy=RetryPolicy(attempts=8, base_millis=1, max_millis=4)
    )
    try:
        holder.read(ReadLimits(max_records=10))  # its subscription is open
        batches = read_all(taker)
    finally:
        holder.close()
    assert positions(batches) == every
    assert sum(batch.refused_calls for batch in batches) >= 1
    assert sum(sleeps) >= 1.0  # the in-use time since the open subscription's start


@pytest.mark.parametrize("attempts", [3, 9])
def test_refusals_past_the_retry_policy_end_the_batch_as_throttled(client, attempts):
    # At least MIN_REFUSALS, a second apart: a policy of few attempts must still outlast Kinesis'
    # 5 s in-use window, which holds after a successful call even when its subscription has ended.
    holder = fan_out_reader(client, PLAIN.name)
    blocked = fan_out_reader(
        client,
        PLAIN.name,
        sleep=lambda seconds: None,
        retry_policy=RetryPolicy(attempts=attempts, base_millis=1, max_millis=4),
    )
    try:
        holder.read(ReadLimits(max_records=10))
        batch = blocked.read(NO_LIMITS)
    finally:
        holder.close()
        blocked.close()
    refusals = max(attempts, MIN_REFUSALS)
    assert (batch.stopped_by, batch.records, batch.refused_calls, batch.calls) == ("throttled", (), refusals, refusals)


def test_a_batch_cut_at_the_tip_event_s_last_record_ends_the_next_read_at_the_tip_at_once(unique_name):
    spec = StreamSpec(unique_name, shards=1, records_per_shard=100, record_bytes=100)
    # One event holds the whole shard; a heartbeat would come only 3 s later.
    limits = FanOutLimits(heartbeat_seconds=3.0, activation_seconds=0)
    with KinesisStandIn([spec], Limits.off(), limits) as standin:
        client = standin.client()
        client.register_stream_consumer(StreamARN=stream_arn(spec.name), ConsumerName=CONSUMER)
        source = fan_out_reader(client, spec.name)
        try:
            full = source.read(ReadLimits(max_records=100))
            started = time.monotonic()
            after = source.read(NO_LIMITS)
            waited = time.monotonic() - started
        finally:
            source.close()
    assert (full.stopped_by, len(full.records), full.millis_behind_latest) == ("records", 100, 0)
    assert (after.stopped_by, after.records, after.calls) == ("tip", (), 0)
    assert waited < 1.0


@pytest.mark.parametrize("while_subscribed", [False, True], ids=["between-subscriptions", "during-a-subscription"])
def test_a_consumer_re_created_under_its_name_is_looked_up_again(unique_name, while_subscribed):
    spec = StreamSpec(unique_name, shards=1, records_per_shard=200, record_bytes=1000)
    # 200 kB at 200 KiB/s, a tenth of a second's burst: still pushing when its consumer is deregistered.
    limits = FanOutLimits(
        read_bytes_per_second=200 * 1024,
        burst_seconds=0.1,
        max_event_records=20,
        heartbeat_seconds=0.2,
        activation_seconds=0,
        deletion_seconds=0,
    )
    with KinesisStandIn([spec], Limits.off(), limits) as standin:
        client = standin.client()
        register = {"StreamARN": stream_arn(spec.name), "ConsumerName": CONSUMER}
        arn = client.register_stream_consumer(**register)["Consumer"]["ConsumerARN"]
        every = positions(read_all(polling_reader(client, spec.name)))
        consumers = DescribedConsumerArns(client, CONSUMER)
        source = fan_out_reader(client, spec.name, consumers=consumers, sleep=Sleeps())
        try:
            first = source.read(ReadLimits(max_records=30))
            if not while_subscribed:
                source.close()  # as a subscription's lifetime ends: the next read subscribes again
            client.deregister_stream_consumer(ConsumerARN=arn)
            new_arn = client.register_stream_consumer(**register)["Consumer"]["ConsumerARN"]
            rest = read_all(source)
        finally:
            source.close()
    assert new_arn != arn
    assert consumers.arn(spec.name) == new_arn
    assert positions([first, *rest]) == every


def test_a_checkpoint_that_is_not_of_the_shard_is_an_invalid_sequence_number(client):
    above = str(10**55 * 9)
    with pytest.raises(InvalidSequenceNumberError):
        fan_out_reader(client, PLAIN.name, start=ReadStart(ExtendedSequenceNumber(above))).read(NO_LIMITS)


def test_a_closed_shard_that_never_answers_its_end_is_not_ended(client):
    # An open shard told closed: the tip is not its end, and after a few empty events the batch gives up.
    source = fan_out_reader(client, PLAIN.name, closed=True)
    try:
        batch = source.read(NO_LIMITS)
    finally:
        source.close()
    assert (batch.stopped_by, batch.shard_ended, len(batch.records)) == ("no_shard_end", False, PLAIN.records_per_shard)


# --- retention gaps, met the same way in both modes ----------------------------------------------------


def aged_stream_numbers(spec: StreamSpec) -> list[ExtendedSequenceNumber]:
    """Every record's position, the aged-out ones included (the stand-in's numbering)."""
    return [ExtendedSequenceNumber(str(sequence_number(0, index))) for index in range(spec.records_per_shard)]


READERS = {"polling": polling_reader, "fan_out": fan_out_reader}


@pytest.mark.parametrize("mode", READERS)
def test_a_checkpoint_whose_records_aged_out_is_reported_as_a_gap_before_the_first_record_kept(client, mode):
    numbers = aged_stream_numbers(AGED)
    batches = read_all(READERS[mode](client, AGED.name, start=ReadStart(numbers[3])))
    assert batches[0].gap is not None
    assert (batches[0].gap.after, batches[0].gap.first_available) == (numbers[3], numbers[10].sequence_number)
    assert positions(batches) == numbers[10:]
    assert all(batch.gap is None for batch in batches[1:])


@pytest.mark.parametrize("mode", READERS)
def test_a_checkpoint_below_the_shard_s_first_number_is_refused_and_reported_as_a_gap(client, mode):
    numbers = aged_stream_numbers(AGED)
    below = ExtendedSequenceNumber(str(sequence_number(0, -1) - 1))
    batches = read_all(READERS[mode](client, AGED.name, start=ReadStart(below)))
    assert batches[0].gap is not None and batches[0].gap.after == below
    assert batches[0].gap.first_available == numbers[10].sequence_number
    assert positions(batches) == numbers[10:]


@pytest.mark.parametrize("mode", READERS)
def test_a_replay_whose_first_record_aged_out_reports_the_gap_after_the_checkpoint(client, mode):
    numbers = aged_stream_numbers(AGED)
    source = READERS[mode](client, AGED.name, start=ReadStart(numbers[4], first=numbers[5]))
    try:
        batch = source.read(ReadLimits(stop_at=numbers[20]))
    finally:
        source.close()
    assert batch.gap is not None and (batch.gap.after, batch.gap.first_available) == (
        numbers[4],
        numbers[10].sequence_number,
    )
    assert positions([batch]) == numbers[10:21]


@pytest.mark.parametrize("mode", READERS)
def test_a_checkpoint_with_everything_after_it_aged_out_is_a_gap_with_nothing_available(client, mode):
    numbers = aged_stream_numbers(ALL_AGED)
    batches = read_all(READERS[mode](client, ALL_AGED.name, start=ReadStart(numbers[5])))
    assert positions(batches) == []
    gaps = [batch.gap for batch in batches if batch.gap is not None]
    assert len(gaps) == 1 and (gaps[0].after, gaps[0].first_available) == (numbers[5], None)


# --- a lease lost while reading -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", READERS)
def test_a_read_whose_lease_was_lost_ends_cancelled_before_its_next_call(client, mode):
    answers = iter([False, True])  # held for the first call for records, lost before the second
    source = READERS[mode](client, PLAIN.name)
    try:
        first = source.read(ReadLimits(max_records=50, cancelled=lambda: next(answers)))
        calls_before = first.calls
        cut = source.read(ReadLimits(cancelled=lambda: True))
    finally:
        source.close()
    assert first.stopped_by == "cancelled" and len(first.records) <= 50
    assert (cut.stopped_by, cut.calls) == ("cancelled", 0)
    assert calls_before >= 1
