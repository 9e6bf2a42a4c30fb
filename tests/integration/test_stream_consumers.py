"""The application's enhanced fan-out consumer over its lifetime (lease_core.retrieval.fanout.stream_consumers):
registered once and reused, overlapping registrations, a retried registration, consumers that are
not the application's, Kinesis' limits, a consumer stuck in CREATING, teardown, a re-created
consumer's new ARN, and the wiring into the DAG's table step and `leasectl`.

Kinesis is the project's stand-in (devtools/kinesis_standin.py: CREATING before ACTIVE, ARNs with
their creation second, 20 consumers per stream and 5 CREATING at once) or a moto server (ACTIVE at
once, ARNs without a timestamp); the coordinator-state table is on moto."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import botocore.exceptions
import pytest
from airflow.sdk.exceptions import AirflowFailException
from kinesis_lease.aws_connection import AwsAccess
from kinesis_lease.errors import airflow_error
from kinesis_lease.monitoring import application_document, read_application
from kinesis_lease.operators import EnsureLeaseTablesOperator

from devtools.kinesis_standin import ACCOUNT, REGION, FanOutLimits, KinesisStandIn, Limits, StreamSpec
from lease_core.application import LeaseApplication
from lease_core.errors import ForeignStreamConsumerError, StreamConsumerError, StreamConsumerNotReadyError
from lease_core.retrieval.fanout.stream_consumers import StreamConsumers
from tests.support.leasectl import run_leasectl
from tests.support.stores import FAST_RETRIES, fast_config

STREAMS = [StreamSpec(f"s-{name}", records_per_shard=1) for name in range(17)]
LIFECYCLE = FanOutLimits(activation_seconds=0.3, deletion_seconds=0.2, subscribe_calls_per_second=None)
STUCK = FanOutLimits(activation_seconds=600, subscribe_calls_per_second=None)


@pytest.fixture(scope="module")
def standin() -> Iterator[KinesisStandIn]:
    with KinesisStandIn(STREAMS, Limits.off(), LIFECYCLE) as running:
        yield running


@pytest.fixture(scope="module")
def stuck_standin() -> Iterator[KinesisStandIn]:
    with KinesisStandIn(STREAMS, Limits.off(), STUCK) as running:
        yield running


class CountingKinesis:
    """A boto3 Kinesis client that counts RegisterStreamConsumer calls and can run `before_register`
    (once) or fail after a registration was applied (`fail_after_register`)."""

    def __init__(
        self, client: Any, before_register: Callable[[], object] | None = None, fail_after_register: bool = False
    ):
        self._client = client
        self._before_register = before_register
        self._fail_after_register = fail_after_register
        self.registrations = 0

    def register_stream_consumer(self, **arguments: Any) -> Any:
        hook, self._before_register = self._before_register, None
        if hook is not None:
            hook()
        self.registrations += 1
        answer = self._client.register_stream_consumer(**arguments)
        if self._fail_after_register:
            raise RuntimeError("the task was killed after RegisterStreamConsumer was applied")
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def application(moto_endpoint: str, kinesis_endpoint: str, name: str, **settings: Any) -> LeaseApplication:
    config = fast_config(
        name,
        aws_endpoint_url_dynamodb=moto_endpoint,
        aws_endpoint_url_kinesis=kinesis_endpoint,
        aws_region=REGION,
        retrieval="fan_out",
        **settings,
    )
    app = LeaseApplication(config)
    app.tables.ensure_tables()
    return app


def consumers_of(app: LeaseApplication, kinesis: Any = None, timeout: float = 10.0) -> StreamConsumers:
    """The application's consumers as `app.stream_consumers`, polling quickly, through `kinesis` if given."""
    return StreamConsumers(
        kinesis or app.client("kinesis"),
        app.state_store,
        app.config.stream_consumer_name,
        lambda stream: app.shard_source.describe_stream(stream).stream_arn,
        retry_policy=FAST_RETRIES,
        activation_timeout_seconds=timeout,
        poll_seconds=0.05,
    )


def stream_arn(stream: str) -> str:
    return f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{stream}"


def consumers_on(client: Any, stream: str) -> list[tuple[str, str]]:
    return [
        (c["ConsumerName"], c["ConsumerStatus"])
        for c in client.list_stream_consumers(StreamARN=stream_arn(stream))["Consumers"]
    ]


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in 10 s"
        time.sleep(0.05)  # polling pace, not synchronisation: the condition is the answer itself


def gone(client: Any, stream: str, name: str) -> Callable[[], bool]:
    return lambda: all(found != name for found, _ in consumers_on(client, stream))


# --- registration and reuse ----------------------------------------------------------------------


def test_the_consumer_is_registered_once_waited_for_until_active_and_reused_by_every_later_round(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    first_round = CountingKinesis(app.client("kinesis"))
    registered = consumers_of(app, first_round).ensure("s-0")
    assert (registered.status, registered.ours, registered.consumer_name) == ("ACTIVE", True, unique_name)
    later_round = CountingKinesis(app.client("kinesis"))
    again = consumers_of(app, later_round).ensure("s-0")
    assert (again.consumer_arn, first_round.registrations, later_round.registrations) == (
        registered.consumer_arn,
        1,
        0,
    )
    assert consumers_of(app).arn("s-0") == registered.consumer_arn
    record = app.state_store.get("StreamConsumer:s-0")
    assert record is not None
    assert {name: record[name] for name in ("streamName", "consumerName", "streamARN", "consumerARN")} == {
        "streamName": "s-0",
        "consumerName": unique_name,
        "streamARN": stream_arn("s-0"),
        "consumerARN": registered.consumer_arn,
    }


def test_overlapping_table_steps_register_one_consumer_and_both_use_it(moto_endpoint, standin, unique_name):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    other_step = consumers_of(app)
    seen_by_other: list[str | None] = []
    # The other step runs between this one's claim and its RegisterStreamConsumer: it finds the claim,
    # registers, and this one's registration then answers ResourceInUseException.
    this_kinesis = CountingKinesis(
        app.client("kinesis"), before_register=lambda: seen_by_other.append(other_step.ensure("s-1").consumer_arn)
    )
    this = consumers_of(app, this_kinesis).ensure("s-1")
    assert this.consumer_arn == seen_by_other[0] and this.ours
    assert this_kinesis.registrations == 1
    assert consumers_on(app.client("kinesis"), "s-1") == [(unique_name, "ACTIVE")]


def test_a_retried_step_adopts_the_consumer_its_killed_try_registered(moto_endpoint, standin, unique_name):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    killed = CountingKinesis(app.client("kinesis"), fail_after_register=True)
    with pytest.raises(RuntimeError, match="killed"):
        consumers_of(app, killed).ensure("s-2")
    retry = CountingKinesis(app.client("kinesis"))
    adopted = consumers_of(app, retry).ensure("s-2")
    assert (adopted.ours, adopted.status, retry.registrations) == (True, "ACTIVE", 0)


def test_a_step_retried_long_after_its_killed_try_claimed_registers_a_consumer_it_judges_its_own(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)

    def killed_before_registering() -> None:
        raise RuntimeError("the task was killed between its claim and RegisterStreamConsumer")

    # The killed try claimed the name 11 minutes ago (its clock is the only thing that is moved back).
    eleven_minutes_ago = int(time.time() * 1000) - 11 * 60_000
    killed = StreamConsumers(
        CountingKinesis(app.client("kinesis"), before_register=killed_before_registering),
        app.state_store,
        unique_name,
        stream_arn,
        retry_policy=FAST_RETRIES,
        poll_seconds=0.05,
        wall_clock_millis=lambda: eleven_minutes_ago,
    )
    with pytest.raises(RuntimeError, match="killed"):
        killed.ensure("s-10")
    retried = consumers_of(app).ensure("s-10")
    assert (retried.ours, retried.status) == (True, "ACTIVE")
    assert consumers_of(app).arn("s-10") == retried.consumer_arn


def test_a_consumer_the_application_registered_is_its_own_with_a_clock_eleven_minutes_behind_kinesis(
    moto_endpoint, standin, unique_name
):
    # Kinesis' creation time falls past the claim's window on the host's clock; the registration's own
    # answer names the consumer, so nothing is judged by the clocks.
    app = application(moto_endpoint, standin.endpoint, unique_name)
    behind = StreamConsumers(
        app.client("kinesis"),
        app.state_store,
        unique_name,
        stream_arn,
        retry_policy=FAST_RETRIES,
        poll_seconds=0.05,
        wall_clock_millis=lambda: int(time.time() * 1000) - 11 * 60_000,
    )
    registered = behind.ensure("s-15")
    assert (registered.ours, registered.status) == (True, "ACTIVE")
    assert consumers_of(app).arn("s-15") == registered.consumer_arn


class InUseRegistrations:
    """A boto3 Kinesis client whose RegisterStreamConsumer registers, then answers ResourceInUseException
    as if an overlapping step's registration had come first, and whose DescribeStreamConsumer does not
    show that consumer for the `lag` calls after the first registration; `events` is the order of the
    calls and the pauses."""

    def __init__(self, client: Any, lag: int) -> None:
        self._client = client
        self._lag = lag
        self._hidden = 0
        self.events: list[str] = []

    def register_stream_consumer(self, **arguments: Any) -> Any:
        self.events.append("register")
        self._hidden, self._lag = self._lag, 0
        with contextlib.suppress(botocore.exceptions.ClientError):
            self._client.register_stream_consumer(**arguments)
        error = {"Error": {"Code": "ResourceInUseException", "Message": "consumer exists"}}
        raise botocore.exceptions.ClientError(error, "RegisterStreamConsumer")

    def describe_stream_consumer(self, **arguments: Any) -> Any:
        self.events.append("describe")
        if self._hidden > 0:
            self._hidden -= 1
            error = {"Error": {"Code": "ResourceNotFoundException", "Message": "no such consumer"}}
            raise botocore.exceptions.ClientError(error, "DescribeStreamConsumer")
        return self._client.describe_stream_consumer(**arguments)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_registration_answered_in_use_pauses_before_kinesis_is_asked_again(moto_endpoint, standin, unique_name):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    kinesis = InUseRegistrations(app.client("kinesis"), lag=3)
    steps = StreamConsumers(
        kinesis,
        app.state_store,
        unique_name,
        stream_arn,
        retry_policy=FAST_RETRIES,
        poll_seconds=0.05,
        sleep=lambda seconds: (kinesis.events.append("pause"), time.sleep(seconds)),
    )
    found = steps.ensure("s-16")
    assert (found.ours, found.status) == (True, "ACTIVE")
    answered_in_use = [n for n, event in enumerate(kinesis.events) if event == "register"]
    assert len(answered_in_use) >= 2, kinesis.events  # the lagging describes made it register again
    assert all(kinesis.events[n + 1] == "pause" for n in answered_in_use), kinesis.events


def test_the_composition_root_builds_the_consumers_and_registers_on_moto(moto_endpoint, unique_name):
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION)
    kinesis.create_stream(StreamName=unique_name, ShardCount=1)
    app = application(moto_endpoint, moto_endpoint, unique_name, consumer_name=f"{unique_name}-efo")
    state = app.stream_consumers.ensure(unique_name)
    assert (state.consumer_name, state.status, state.ours) == (f"{unique_name}-efo", "ACTIVE", True)
    assert app.stream_consumers.arn(unique_name) == state.consumer_arn


# --- consumers that are not the application's ----------------------------------------------------


def test_a_consumer_of_the_name_the_application_did_not_register_is_refused_and_never_deregistered(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    kinesis = app.client("kinesis")
    kinesis.register_stream_consumer(StreamARN=stream_arn("s-3"), ConsumerName=unique_name)
    with pytest.raises(ForeignStreamConsumerError) as refused:
        consumers_of(app).ensure("s-3")
    assert f"consumer {unique_name!r} of Kinesis stream 's-3'" in str(refused.value)
    assert "not this application's" in str(refused.value) and not refused.value.retryable
    with pytest.raises(StreamConsumerError, match="has not registered it"):
        consumers_of(app).arn("s-3")
    assert consumers_of(app).deregister_recorded() == []
    assert consumers_of(app).describe("s-3").ours is False
    assert [status for name, status in consumers_on(kinesis, "s-3") if name == unique_name] in (
        ["CREATING"],
        ["ACTIVE"],
    )


def test_a_consumer_recreated_by_hand_is_not_ours_and_teardown_leaves_it_while_deregistering_ours(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    kinesis = app.client("kinesis")
    consumers = consumers_of(app)
    ours = consumers.ensure("s-4")
    recreated_by_hand = consumers.ensure("s-5")
    kinesis.deregister_stream_consumer(ConsumerARN=recreated_by_hand.consumer_arn)
    until(gone(kinesis, "s-5", unique_name))
    by_hand = kinesis.register_stream_consumer(StreamARN=stream_arn("s-5"), ConsumerName=unique_name)["Consumer"]
    with pytest.raises(
        ForeignStreamConsumerError, match=f"this application registered {recreated_by_hand.consumer_arn}"
    ):
        consumers_of(app).ensure("s-5")
    outcomes = consumers_of(app).deregister_recorded()
    assert [(o.stream_name, o.consumer_arn, o.deregistered) for o in outcomes] == [
        ("s-4", ours.consumer_arn, True),
        ("s-5", by_hand["ConsumerARN"], False),
    ]
    assert "left registered" in outcomes[1].note
    assert app.state_store.get("StreamConsumer:s-4") is None and app.state_store.get("StreamConsumer:s-5") is None
    until(gone(kinesis, "s-4", unique_name))
    assert [name for name, _ in consumers_on(kinesis, "s-5")] == [unique_name]


class RegisteredBeforeTheClaim:
    """The coordinator-state table, with someone else registering the consumer name on `stream` just
    before the application's claim lands: between its look (no consumer of the name) and its claim."""

    def __init__(self, state: Any, kinesis: Any, stream: str, consumer_name: str) -> None:
        self._state = state
        self._register: Callable[[], object] | None = lambda: kinesis.register_stream_consumer(
            StreamARN=stream_arn(stream), ConsumerName=consumer_name
        )

    def put(self, key: str, attributes: Any, expected: Any = None) -> bool:
        register, self._register = self._register, None
        if register is not None and "consumerARN" not in attributes and attributes.get("nameFree") is False:
            register()
        return bool(self._state.put(key, attributes, expected))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


def test_a_consumer_registered_by_someone_else_between_the_application_s_look_and_its_claim_is_refused(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    kinesis = app.client("kinesis")
    state = RegisteredBeforeTheClaim(app.state_store, kinesis, "s-12", unique_name)
    consumers = StreamConsumers(kinesis, state, unique_name, stream_arn, retry_policy=FAST_RETRIES, poll_seconds=0.05)
    with pytest.raises(ForeignStreamConsumerError, match="had it when this application, having claimed the name"):
        consumers.ensure("s-12")
    assert consumers_of(app).describe("s-12").ours is False
    assert [name for name, _ in consumers_on(kinesis, "s-12")] == [unique_name]


class SiblingInsideDescribe:
    """A boto3 Kinesis client whose `nth` DescribeStreamConsumer first lets `sibling` run whole: a slow
    describe (throttled and retried, say) during which another table step does all its work."""

    def __init__(self, client: Any, nth: int, sibling: Callable[[], object]) -> None:
        self._client = client
        self._nth = nth
        self._sibling = sibling
        self.describes = 0

    def describe_stream_consumer(self, **arguments: Any) -> Any:
        self.describes += 1
        if self.describes == self._nth:
            self._sibling()
        return self._client.describe_stream_consumer(**arguments)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_step_whose_slow_describe_spans_a_sibling_s_whole_registration_uses_the_consumer_not_refuses_it(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    sibling: list[str] = []
    # This step's first look finds nothing and claims; its second look read the unmarked claim, and
    # while its describe is on the way the sibling marks the claim, registers and records the consumer.
    kinesis = SiblingInsideDescribe(
        app.client("kinesis"), 2, lambda: sibling.append(consumers_of(app).ensure("s-14").consumer_arn)
    )
    this = consumers_of(app, kinesis).ensure("s-14")
    assert this.ours and this.consumer_arn == sibling[0]
    assert consumers_on(app.client("kinesis"), "s-14") == [(unique_name, "ACTIVE")]


# --- Kinesis' limits and a consumer that does not become ACTIVE ------------------------------------


def register_others(client: Any, stream: str, count: int, wait_active: bool = True) -> None:
    """`count` consumers of other applications, at most 5 in CREATING at once (Kinesis' limit)."""
    for start in range(0, count, 5):
        for index in range(start, min(count, start + 5)):
            client.register_stream_consumer(StreamARN=stream_arn(stream), ConsumerName=f"other-{index}")
        if wait_active:
            until(lambda: all(status == "ACTIVE" for _, status in consumers_on(client, stream)))


def test_a_stream_at_its_20_consumers_is_refused_naming_the_stream_and_leaves_no_claim(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    register_others(app.client("kinesis"), "s-6", 20)
    with pytest.raises(StreamConsumerError) as refused:
        consumers_of(app).ensure("s-6")
    assert "stream 's-6'" in str(refused.value) and "20 consumers" in str(refused.value)
    assert not refused.value.retryable and type(refused.value) is StreamConsumerError
    assert app.state_store.get("StreamConsumer:s-6") is None


def test_a_stream_with_5_consumers_in_creating_is_a_retryable_refusal_naming_them(
    moto_endpoint, stuck_standin, unique_name
):
    app = application(moto_endpoint, stuck_standin.endpoint, unique_name)
    register_others(app.client("kinesis"), "s-7", 5, wait_active=False)
    with pytest.raises(StreamConsumerNotReadyError, match=r"stream 's-7'.*5 consumers in CREATING.*other-0") as refused:
        consumers_of(app).ensure("s-7")
    assert refused.value.retryable


def test_a_consumer_stuck_in_creating_fails_the_step_naming_it_after_the_timeout(
    moto_endpoint, stuck_standin, unique_name
):
    app = application(moto_endpoint, stuck_standin.endpoint, unique_name)
    started = time.monotonic()
    with pytest.raises(StreamConsumerNotReadyError, match=f"consumer {unique_name!r} of Kinesis stream 's-8'") as stuck:
        consumers_of(app, timeout=0.3).ensure("s-8")
    assert "is still CREATING after 0.3 s" in str(stuck.value) and time.monotonic() - started < 5
    # Recorded as ours all the same: the next step waits for it instead of registering another.
    assert consumers_of(app).describe("s-8").ours
    with pytest.raises(StreamConsumerNotReadyError, match="CREATING, not ACTIVE"):
        consumers_of(app).arn("s-8")


# --- a consumer re-registered: slots find its new ARN ------------------------------------------------


def test_a_consumer_deregistered_by_hand_is_registered_again_and_a_slot_finds_the_new_arn(
    moto_endpoint, standin, unique_name
):
    app = application(moto_endpoint, standin.endpoint, unique_name)
    kinesis = app.client("kinesis")
    first = consumers_of(app).ensure("s-9")
    slot = consumers_of(app)
    assert slot.arn("s-9") == first.consumer_arn
    kinesis.deregister_stream_consumer(ConsumerARN=first.consumer_arn)
    # The next table step waits while the old consumer is DELETING, then registers a new one.
    second = consumers_of(app).ensure("s-9")
    assert second.ours and second.consumer_arn != first.consumer_arn
    assert slot.arn("s-9") == first.consumer_arn  # what the slot looked up, until Kinesis refuses it
    assert slot.refresh("s-9", first.consumer_arn) == second.consumer_arn


def test_a_consumer_deregistered_by_hand_is_registered_again_as_the_application_s_own_with_a_clock_ahead_of_kinesis(
    moto_endpoint, standin, unique_name
):
    # The fan-out campaign's finding: Kinesis' clock (kinesis-mock's) ran seconds behind the host's, so
    # the re-registered consumer was created "before" the claim and refused as another application's.
    app = application(moto_endpoint, standin.endpoint, unique_name)
    kinesis = app.client("kinesis")
    ahead = StreamConsumers(
        kinesis,
        app.state_store,
        unique_name,
        stream_arn,
        retry_policy=FAST_RETRIES,
        poll_seconds=0.05,
        wall_clock_millis=lambda: int(time.time() * 1000) + 10_000,
    )
    first = ahead.ensure("s-13")
    kinesis.deregister_stream_consumer(ConsumerARN=first.consumer_arn)
    until(gone(kinesis, "s-13", unique_name))
    second = ahead.ensure("s-13")
    assert second.ours and second.status == "ACTIVE" and second.consumer_arn != first.consumer_arn
    assert consumers_of(app).arn("s-13") == second.consumer_arn


class OverlappingDescribes:
    """A boto3 Kinesis client whose DescribeStreamConsumer calls are counted, each waiting (at most
    `patience` s) for another one to arrive while it is in flight: lookups that could overlap do."""

    def __init__(self, client: Any, patience: float = 0.5) -> None:
        self._client = client
        self._patience = patience
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self.describes = 0

    def describe_stream_consumer(self, **arguments: Any) -> Any:
        with self._arrived:
            self.describes += 1
            self._arrived.notify_all()
            seen = self.describes
            self._arrived.wait_for(lambda: self.describes > seen, self._patience)
        return self._client.describe_stream_consumer(**arguments)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_slot_s_lease_threads_looking_the_consumer_up_at_once_share_one_lookup(moto_endpoint, standin, unique_name):
    # Kinesis allows DescribeStreamConsumer 20 times a second per stream: a slot starting 64 leases
    # must not ask 64 times (nor again once per lease when the consumer was re-created).
    app = application(moto_endpoint, standin.endpoint, unique_name)
    registered = consumers_of(app).ensure("s-11")
    kinesis = OverlappingDescribes(app.client("kinesis"))
    slot = consumers_of(app, kinesis)
    threads = 8
    start = threading.Barrier(threads)

    def lease_thread(_: int) -> str:
        start.wait()
        return slot.arn("s-11")

    with ThreadPoolExecutor(threads) as pool:
        found = list(pool.map(lease_thread, range(threads)))
    assert found == [registered.consumer_arn] * threads
    assert kinesis.describes == 1


# --- the DAG's table step and leasectl ------------------------------------------------------------


def test_the_table_step_registers_the_consumers_under_fan_out_and_fails_on_a_foreign_one(moto_endpoint, unique_name):
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION)
    for stream in (unique_name, f"{unique_name}-taken"):
        kinesis.create_stream(StreamName=stream, ShardCount=1)
    taken_arn = kinesis.describe_stream_summary(StreamName=f"{unique_name}-taken")["StreamDescriptionSummary"][
        "StreamARN"
    ]
    kinesis.register_stream_consumer(StreamARN=taken_arn, ConsumerName=unique_name)
    config = fast_config(
        unique_name,
        aws_endpoint_url_dynamodb=moto_endpoint,
        aws_endpoint_url_kinesis=moto_endpoint,
        aws_region=REGION,
        retrieval="fan_out",
    )
    access = AwsAccess(boto3.Session(aws_access_key_id="t", aws_secret_access_key="t", region_name=REGION), config)
    step = EnsureLeaseTablesOperator(task_id="ensure_tables", settings={}, streams=[unique_name])
    summary = step.run(access, None)
    assert [(c["stream_name"], c["status"], c["ours"]) for c in summary["stream_consumers"]] == [
        (unique_name, "ACTIVE", True)
    ]
    refused = EnsureLeaseTablesOperator(task_id="ensure_tables", settings={}, streams=[f"{unique_name}-taken"])
    with pytest.raises(ForeignStreamConsumerError) as error:
        refused.run(access, None)
    assert isinstance(airflow_error(error.value), AirflowFailException)  # not retried: an operator must act
    assert access.app.lease_store.scan_leases().leases == ()


def test_leasectl_init_registers_status_shows_and_teardown_deregisters_the_consumer(moto_endpoint, unique_name):
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION)
    kinesis.create_stream(StreamName=unique_name, ShardCount=1)

    def leasectl(*command: str):
        return run_leasectl(
            "--app", unique_name, "--set", "retrieval=fan_out", *command, dynamodb=moto_endpoint, kinesis=moto_endpoint
        )

    init = leasectl("init", "--stream", unique_name)
    assert init.returncode == 0, init.stderr
    assert f"consumer {unique_name}  of stream {unique_name}  (ACTIVE, arn:aws:kinesis:" in init.stdout
    synced = leasectl("sync", "--stream", unique_name)  # status finds the streams the tables name
    assert synced.returncode == 0, synced.stderr
    text = leasectl("status")
    assert text.returncode == 0, text.stderr
    assert f"  {unique_name}: {unique_name} ACTIVE ours arn=arn:aws:kinesis:" in text.stdout
    report = json.loads(leasectl("status", "--json").stdout)
    assert [(c["stream_name"], c["status"], c["ours"]) for c in report["stream_consumers"]] == [
        (unique_name, "ACTIVE", True)
    ]
    app = LeaseApplication(
        fast_config(unique_name, aws_endpoint_url_dynamodb=moto_endpoint, aws_endpoint_url_kinesis=moto_endpoint)
    )
    page = application_document(read_application(app))  # the monitoring page's overview
    assert [(c["stream_name"], c["consumer_name"], c["status"], c["ours"]) for c in page["stream_consumers"]] == [
        (unique_name, unique_name, "ACTIVE", True)
    ]
    teardown = leasectl("teardown", "--yes")
    assert teardown.returncode == 0, teardown.stderr
    assert f"deregistered  consumer {unique_name} of stream {unique_name}" in teardown.stdout
    stream = kinesis.describe_stream_summary(StreamName=unique_name)["StreamDescriptionSummary"]["StreamARN"]
    assert kinesis.list_stream_consumers(StreamARN=stream)["Consumers"] == []
