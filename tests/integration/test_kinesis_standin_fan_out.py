"""Enhanced fan-out on the Kinesis stand-in (devtools/kinesis_standin.py), read by an unmodified boto3
client (`subscribe_to_shard` and botocore's own event-stream parser): the consumers' lifecycle and
limits, subscriptions from every starting position to the tip or a closed shard's end, the
subscription rules (lifetime, 1 call a second, ResourceInUse and takeover), exception events, and the
dedicated 2 MiB/s per consumer and shard beside a polling reader at its own cap. Every duration but
the rate is configured short: a test takes under two seconds, the consumer limits three and the rate
test, at Kinesis' own 2 MiB/s, four."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import botocore.exceptions
import pytest

from devtools.kinesis_standin import (
    ACCOUNT,
    MIB,
    REGION,
    FanOutLimits,
    KinesisStandIn,
    Limits,
    StreamSpec,
    shard_id_of,
    user_record_data,
)
from lease_core.model.sequence import TRIM_HORIZON
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead

RECORDS = 120
OPEN = StreamSpec("open", shards=1, records_per_shard=RECORDS, record_bytes=100)
SPLIT = StreamSpec("split", shards=1, records_per_shard=40, record_bytes=100, split=True)
SPLIT_ENDING_EARLY = StreamSpec(
    "split-early", shards=1, records_per_shard=40, record_bytes=100, split=True, shard_end="with_last_records"
)
SHARD = shard_id_of(0)
# Protocol tests: no call limit, small events (so a shard takes several), quick heartbeats.
PROTOCOL = FanOutLimits(
    subscribe_calls_per_second=None, max_event_records=50, heartbeat_seconds=0.2, activation_seconds=0
)


@pytest.fixture(scope="module")
def standin() -> Iterator[KinesisStandIn]:
    with KinesisStandIn([OPEN, SPLIT, SPLIT_ENDING_EARLY], Limits.off(), PROTOCOL) as running:
        yield running


@pytest.fixture(scope="module")
def client(standin: KinesisStandIn) -> Any:
    return standin.client()


def stream_arn(stream: str) -> str:
    return f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{stream}"


def active_consumer(client: Any, stream: str, name: str) -> str:
    """Register a consumer and wait until it is ACTIVE; its ARN."""
    arn = str(
        client.register_stream_consumer(StreamARN=stream_arn(stream), ConsumerName=name)["Consumer"]["ConsumerARN"]
    )
    while client.describe_stream_consumer(ConsumerARN=arn)["ConsumerDescription"]["ConsumerStatus"] != "ACTIVE":
        time.sleep(0.05)  # polling pace, not synchronisation: the condition is the answer itself
    return arn


def subscribe(client: Any, consumer: str, shard: str = SHARD, kind: str = "TRIM_HORIZON", **position: Any) -> Any:
    starting = {"Type": kind, **position}
    return client.subscribe_to_shard(ConsumerARN=consumer, ShardId=shard, StartingPosition=starting)["EventStream"]


def until_tip(events: Any) -> list[dict[str, Any]]:
    """The SubscribeToShardEvents up to the first one at the tip without records (then closed)."""
    seen = []
    for event in events:
        seen.append(event["SubscribeToShardEvent"])
        if not seen[-1]["Records"] and seen[-1]["MillisBehindLatest"] == 0:
            break
    events.close()
    return seen


def close(standin: KinesisStandIn, events: Any) -> None:
    """Close a subscription and wait until the server has noticed (it allows no second one before)."""
    events.close()
    while fan_out_stats(standin)["open_subscriptions"]:
        time.sleep(0.05)  # polling pace, not synchronisation: the condition is the answer itself


def error_code(call: Any) -> str | None:
    try:
        call()
    except botocore.exceptions.ClientError as error:
        return str(error.response["Error"]["Code"])
    return None


def fan_out_stats(standin: KinesisStandIn) -> dict[str, Any]:
    stats: dict[str, Any] = standin.stats()["fan_out"]
    return stats


# --- subscriptions -------------------------------------------------------------------------------


def test_a_subscription_reads_a_shard_from_the_trim_horizon_to_the_tip_with_continuation_numbers(client):
    events = until_tip(subscribe(client, active_consumer(client, OPEN.name, "to-the-tip")))
    records = [record for event in events for record in event["Records"]]
    assert [record["Data"] for record in records] == [
        user_record_data(OPEN.name, SHARD, index, OPEN.record_bytes) for index in range(RECORDS)
    ]
    assert [len(event["Records"]) for event in events] == [50, 50, 20, 0]
    # Each event's continuation is its last record; the heartbeat at the tip repeats it.
    last_numbers = [event["Records"][-1]["SequenceNumber"] for event in events[:3]]
    assert [event["ContinuationSequenceNumber"] for event in events] == [*last_numbers, last_numbers[-1]]
    assert [event["MillisBehindLatest"] > 0 for event in events] == [True, True, False, False]
    assert all(record["PartitionKey"] == f"pk-{index}" for index, record in enumerate(records))
    assert all(record["ApproximateArrivalTimestamp"].year > 2000 for record in records)


@pytest.mark.parametrize(
    ("kind", "at", "first"),
    [
        pytest.param("TRIM_HORIZON", None, 0, id="trim-horizon"),
        pytest.param("AT_SEQUENCE_NUMBER", 70, 70, id="at-sequence-number"),
        pytest.param("AFTER_SEQUENCE_NUMBER", 70, 71, id="after-sequence-number"),
        pytest.param("AT_TIMESTAMP", 70, 70, id="at-timestamp"),
        pytest.param("LATEST", None, RECORDS, id="latest"),
    ],
)
def test_every_starting_position_starts_where_a_shard_iterator_of_that_type_would(client, kind, at, first):
    everything = client.get_records(
        ShardIterator=client.get_shard_iterator(StreamName=OPEN.name, ShardId=SHARD, ShardIteratorType="TRIM_HORIZON")[
            "ShardIterator"
        ]
    )["Records"]
    position: dict[str, Any] = {}
    if kind.endswith("SEQUENCE_NUMBER"):
        position["SequenceNumber"] = everything[at]["SequenceNumber"]
    if kind == "AT_TIMESTAMP":
        position["Timestamp"] = everything[at]["ApproximateArrivalTimestamp"]
    events = until_tip(subscribe(client, active_consumer(client, OPEN.name, f"from-{kind}"), kind=kind, **position))
    assert [record for event in events for record in event["Records"]] == everything[first:]


def test_resuming_after_a_continuation_number_neither_repeats_nor_skips_a_record(standin, client):
    consumer = active_consumer(client, OPEN.name, "resumes")
    events = subscribe(client, consumer)
    first = next(iter(events))["SubscribeToShardEvent"]
    close(standin, events)
    rest = until_tip(
        subscribe(client, consumer, kind="AFTER_SEQUENCE_NUMBER", SequenceNumber=first["ContinuationSequenceNumber"])
    )
    numbers = [int(record["SequenceNumber"]) for event in [first, *rest] for record in event["Records"]]
    assert len(numbers) == RECORDS and numbers == sorted(set(numbers))


@pytest.mark.parametrize(
    ("stream", "answers"),
    [
        # (records, continuation is null, MillisBehindLatest, ChildShards) of each event
        pytest.param(SPLIT, [(40, False, 0, 0), (0, True, 0, 2)], id="after-the-last-records"),
        pytest.param(SPLIT_ENDING_EARLY, [(40, True, 0, 2)], id="with-the-last-records"),
    ],
)
def test_a_closed_shard_ends_with_its_children_and_a_null_continuation_and_the_stream_ends(client, stream, answers):
    events = [
        event["SubscribeToShardEvent"]
        for event in subscribe(client, active_consumer(client, stream.name, "to-the-end"))  # ends by itself
    ]
    assert [
        (
            len(event["Records"]),
            "ContinuationSequenceNumber" not in event,
            event["MillisBehindLatest"],
            len(event.get("ChildShards", [])),
        )
        for event in events
    ] == answers
    children = events[-1]["ChildShards"]
    assert [child["ShardId"] for child in children] == [shard_id_of(1), shard_id_of(2)]
    assert all(child["ParentShards"] == [SHARD] for child in children)
    # A subscription at or after a closed shard's end gets that last event straight away.
    (again,) = list(subscribe(client, active_consumer(client, stream.name, "at-the-end"), kind="LATEST"))
    assert (again["SubscribeToShardEvent"]["Records"], again["SubscribeToShardEvent"]["ChildShards"]) == ([], children)


def test_an_idle_shard_at_the_tip_gets_heartbeats_and_an_empty_event_behind_the_tip_is_not_one():
    # 100 kB/s and events of up to 200 kB: after the first event the bucket is 1 s in debt, and the
    # heartbeats of that second are empty events with MillisBehindLatest > 0.
    spec = StreamSpec("slow", records_per_shard=30, record_bytes=10_000)
    limits = FanOutLimits(read_bytes_per_second=100_000, max_event_bytes=201_000, heartbeat_seconds=0.2)
    with KinesisStandIn([spec], Limits.off(), limits) as running:
        client = running.client()
        events = until_tip(subscribe(client, active_consumer(client, spec.name, "slow")))
        stats = fan_out_stats(running)
    shape = [(len(event["Records"]), event["MillisBehindLatest"] > 0) for event in events]
    assert shape[0] == (20, True) and shape[-2:] == [(10, False), (0, False)]
    assert set(shape[1:-2]) == {(0, True)} and 3 <= len(shape[1:-2]) <= 5
    assert stats["heartbeats"] == len(shape) - 2 and stats["records"] == 30


# --- the subscription rules ----------------------------------------------------------------------


def test_a_subscription_ends_after_its_lifetime_and_a_new_one_may_follow_at_once():
    limits = FanOutLimits(
        subscription_seconds=0.6, heartbeat_seconds=0.1, subscribe_calls_per_second=None, activation_seconds=0
    )
    with KinesisStandIn([OPEN], Limits.off(), limits) as running:
        client = running.client()
        consumer = active_consumer(client, OPEN.name, "short-lived")
        started = time.monotonic()
        events = list(subscribe(client, consumer))  # ends by itself, without an exception
        lasted = time.monotonic() - started
        follower = next(iter(subscribe(client, consumer, kind="LATEST")))
        stats = fan_out_stats(running)
    assert 0.6 <= lasted < 1.0
    assert sum(len(event["SubscribeToShardEvent"]["Records"]) for event in events) == RECORDS
    assert events[-1]["SubscribeToShardEvent"]["Records"] == [] and len(events) >= 5  # heartbeats until it ended
    assert follower["SubscribeToShardEvent"]["MillisBehindLatest"] == 0
    assert stats["violations"]["subscription_in_use"] == 0 and stats["subscriptions"] == 2


def test_a_second_subscribe_call_within_a_second_is_refused_and_counted():
    with KinesisStandIn([OPEN], Limits.off(), FanOutLimits(activation_seconds=0)) as running:
        client = running.client()
        consumer = active_consumer(client, OPEN.name, "hasty")
        close(running, subscribe(client, consumer))
        refused = error_code(lambda: subscribe(client, consumer))
        other_consumer = error_code(lambda: close(running, subscribe(client, active_consumer(client, OPEN.name, "o"))))
        time.sleep(1.0)
        later = error_code(lambda: subscribe(client, consumer).close())
        stats = fan_out_stats(running)
    assert (refused, other_consumer, later) == ("LimitExceededException", None, None)
    assert stats["violations"]["subscribe_calls_per_second"] == 1
    assert stats["consumer_shards"][f"{OPEN.name}/hasty/{SHARD}"]["violations"] == {"subscribe_calls_per_second": 1}
    assert stats["consumer_shards"][f"{OPEN.name}/o/{SHARD}"]["violations"] == {}


def test_a_new_subscription_within_the_in_use_time_is_refused_and_a_later_one_takes_over():
    limits = FanOutLimits(
        subscribe_calls_per_second=None, in_use_seconds=0.5, heartbeat_seconds=0.1, activation_seconds=0
    )
    with KinesisStandIn([OPEN], Limits.off(), limits) as running:
        client = running.client()
        consumer = active_consumer(client, OPEN.name, "contended")
        first = subscribe(client, consumer, kind="LATEST")
        refused = error_code(lambda: subscribe(client, consumer, kind="LATEST"))
        time.sleep(0.5)
        second = subscribe(client, consumer, kind="LATEST")
        with pytest.raises(botocore.exceptions.EventStreamError) as ended:
            list(first)
        still_reading = next(iter(second))["SubscribeToShardEvent"]
        second.close()
        stats = fan_out_stats(running)
    assert refused == "ResourceInUseException"
    assert ended.value.response["Error"]["Code"] == "ResourceInUseException"
    assert still_reading["MillisBehindLatest"] == 0
    assert stats["violations"]["subscription_in_use"] == 1 and stats["subscriptions"] == 2


@pytest.mark.parametrize(
    ("end", "code"),
    [
        pytest.param("deregister", "ResourceNotFoundException", id="consumer-deregistered"),
        pytest.param("inject", "InternalFailureException", id="injected-fault"),
    ],
)
def test_errors_inside_a_stream_arrive_as_exception_events(standin, client, end, code):
    consumer = active_consumer(client, OPEN.name, f"ended-by-{end}")
    events = subscribe(client, consumer, kind="LATEST")
    first = next(iter(events))
    if end == "deregister":
        client.deregister_stream_consumer(ConsumerARN=consumer)
    else:
        assert standin.fail_subscriptions("InternalFailureException", "injected", stream=OPEN.name) >= 1
    with pytest.raises(botocore.exceptions.EventStreamError) as ended:
        list(events)
    assert first["SubscribeToShardEvent"]["Records"] == []
    assert ended.value.response["Error"]["Code"] == code


def test_stopping_the_server_ends_open_subscriptions_cleanly():
    running = KinesisStandIn([OPEN], Limits.off(), PROTOCOL).start()
    try:
        client = running.client()
        events = subscribe(client, active_consumer(client, OPEN.name, "at-shutdown"), kind="LATEST")
        next(iter(events))
        stopper = threading.Timer(0.3, running.stop)
        started = time.monotonic()
        stopper.start()
        rest = list(events)  # the stream ends, no exception and no broken connection
        ended_after = time.monotonic() - started
        stopper.join()
    finally:
        running.stop()
    assert ended_after < 3.0 and all(event["SubscribeToShardEvent"]["Records"] == [] for event in rest)


# --- consumers -----------------------------------------------------------------------------------


def test_a_consumer_is_creating_then_active_then_deleting_then_gone():
    limits = FanOutLimits(activation_seconds=0.3, deletion_seconds=0.3)
    with KinesisStandIn([OPEN], Limits.off(), limits) as running:
        client = running.client()
        registered = client.register_stream_consumer(StreamARN=stream_arn(OPEN.name), ConsumerName="app")["Consumer"]
        arn = registered["ConsumerARN"]
        early = error_code(lambda: subscribe(client, arn))
        duplicate = error_code(
            lambda: client.register_stream_consumer(StreamARN=stream_arn(OPEN.name), ConsumerName="app")
        )
        time.sleep(0.3)
        by_name = client.describe_stream_consumer(StreamARN=stream_arn(OPEN.name), ConsumerName="app")
        count = client.describe_stream_summary(StreamName=OPEN.name)["StreamDescriptionSummary"]["ConsumerCount"]
        client.deregister_stream_consumer(StreamARN=stream_arn(OPEN.name), ConsumerName="app")
        deleting = client.describe_stream_consumer(ConsumerARN=arn)["ConsumerDescription"]["ConsumerStatus"]
        late = error_code(lambda: subscribe(client, arn))
        time.sleep(0.3)
        gone = error_code(lambda: client.describe_stream_consumer(ConsumerARN=arn))
        again = client.register_stream_consumer(StreamARN=stream_arn(OPEN.name), ConsumerName="app")["Consumer"]
        stale = error_code(lambda: client.describe_stream_consumer(ConsumerARN=arn))
        stats = fan_out_stats(running)
    assert re.fullmatch(rf"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{OPEN.name}/consumer/app:\d{{10}}", arn)
    assert int(arn.rpartition(":")[2]) == int(registered["ConsumerCreationTimestamp"].timestamp())
    assert registered["ConsumerStatus"] == "CREATING" and early == "ResourceInUseException"
    assert duplicate == "ResourceInUseException"
    assert by_name["ConsumerDescription"]["ConsumerStatus"] == "ACTIVE" and count == 1
    assert by_name["ConsumerDescription"]["StreamARN"] == stream_arn(OPEN.name)
    assert (deleting, late, gone) == ("DELETING", "ResourceInUseException", "ResourceNotFoundException")
    # Re-created under the same name, the consumer has a new ARN; the old one names nothing.
    assert again["ConsumerARN"] != arn and stale == "ResourceNotFoundException"
    assert stats["violations"]["consumer_not_active"] == 2


def test_a_stream_holds_at_most_twenty_consumers_and_five_creating_at_once():
    with KinesisStandIn([OPEN], Limits.off(), FanOutLimits(activation_seconds=0.5)) as running:
        client = running.client()

        def register(name: str) -> str | None:
            return error_code(
                lambda: client.register_stream_consumer(StreamARN=stream_arn(OPEN.name), ConsumerName=name)
            )

        def listed() -> list[dict[str, Any]]:
            pages, token = [], None
            while True:
                paging = {"NextToken": token} if token else {}
                page = client.list_stream_consumers(StreamARN=stream_arn(OPEN.name), MaxResults=7, **paging)
                pages.append(page["Consumers"])
                token = page.get("NextToken")
                if token is None:
                    return pages

        outcomes = []
        for batch in range(4):
            outcomes.append([register(f"c{batch * 5 + index}") for index in range(6)])  # the sixth one is refused
            while any(consumer["ConsumerStatus"] == "CREATING" for page in listed() for consumer in page):
                time.sleep(0.05)  # polling pace, not synchronisation: the condition is the answer itself
        last = [register("c20"), register("c21")]
        pages = listed()
        unknown = error_code(lambda: subscribe(client, f"{stream_arn(OPEN.name)}/consumer/nobody:1700000000"))
        stats = fan_out_stats(running)
    assert outcomes == [[None] * 5 + ["LimitExceededException"]] * 4
    assert last == ["LimitExceededException"] * 2
    assert [len(page) for page in pages] == [7, 7, 6]
    assert [consumer["ConsumerName"] for page in pages for consumer in page] == [f"c{index}" for index in range(20)]
    assert {consumer["ConsumerStatus"] for page in pages for consumer in page} == {"ACTIVE"}
    assert unknown == "ResourceNotFoundException"
    # The last batch's sixth would be both the 21st consumer and the sixth creating: counted as the 21st.
    assert (stats["violations"]["consumers_creating"], stats["violations"]["consumers_per_stream"]) == (3, 3)


# --- the dedicated rate --------------------------------------------------------------------------


def test_fan_out_pushes_its_own_2_mib_per_second_beside_a_polling_reader_at_the_cap():
    # 8 MB on one shard, read at once by a fan-out consumer and by a polling reader paced at the
    # shard's 2 MiB/s in pages of 1 MB: each gets its own 2 MiB/s, and neither is refused anything.
    spec = StreamSpec("both", records_per_shard=160, record_bytes=50_000)
    with KinesisStandIn([spec], Limits(), FanOutLimits(activation_seconds=0, heartbeat_seconds=0.2)) as running:
        client = running.client()
        consumer = active_consumer(client, spec.name, "dedicated")
        polled: dict[str, Any] = {}

        def poll() -> None:
            reader = GetRecordsReader(
                client,
                ShardToRead(spec.name, SHARD),
                ReadStart(TRIM_HORIZON),
                read_bytes_per_second=2 * MIB,
                get_records_limit=20,
            )
            started = time.monotonic()
            polled["batch"] = reader.read(ReadLimits())
            polled["seconds"] = time.monotonic() - started

        poller = threading.Thread(target=poll)
        poller.start()
        arrivals = []  # (seconds since subscribing, Kinesis bytes of the event)
        started = time.monotonic()
        events = subscribe(client, consumer)
        for event in events:
            pushed = event["SubscribeToShardEvent"]
            if pushed["Records"]:
                size = sum(len(record["Data"]) + len(record["PartitionKey"]) for record in pushed["Records"])
                arrivals.append((time.monotonic() - started, size))
            elif pushed["MillisBehindLatest"] == 0:  # the tip (empty events while in debt are heartbeats)
                break
        events.close()
        poller.join()
        stats = running.stats()
    # After the full bucket's burst, each event goes out once its predecessor's bytes are paid for.
    steady = [(at, size) for at, size in arrivals if at >= arrivals[0][0] + 0.25]
    rate = sum(size for _, size in steady[:-1]) / (steady[-1][0] - steady[0][0])
    print(f"fan-out: {rate / MIB:.3f} MiB/s sustained; polling: {polled['batch'].refused_calls} throttled calls")
    assert 0.95 * 2 * MIB <= rate <= 1.05 * 2 * MIB
    assert sum(size for _, size in arrivals) == stats["fan_out"]["bytes"] == stats["bytes"]
    assert (len(polled["batch"].records), polled["batch"].refused_calls) == (160, 0)
    assert stats["violations"] == {"calls_per_second": 0, "bytes_per_second": 0}
    assert set(stats["fan_out"]["violations"].values()) == {0}
    # The polling reader took as long as its own bytes at the cap, as if it were alone.
    assert stats["bytes"] / (2 * MIB) - 0.05 <= polled["seconds"] <= stats["bytes"] / (2 * MIB) + 0.5
