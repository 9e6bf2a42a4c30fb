"""The faults of enhanced fan-out (`--retrieval fan_out`): what each does to the slots' subscriptions.

The subscriptions are served by the Kinesis fault proxy's bridge (devtools/subscription_bridge.py),
which keeps the service's rules (one subscription per consumer and shard, the 5 s in-use window,
takeovers by exception event), so the faults act there or as another subscriber of the consumer:

- `subscription_cut`: a slot's open subscription ends mid-stream: its connection reset, or an
  exception event (InternalFailureException, ResourceInUseException). The slot subscribes again at
  the last record it fetched.
- `zombie_subscription`: a zombie slot (a subscriber of the application's consumer that lands
  nothing) takes a shard over and keeps taking it back for `ZOMBIE_SECONDS`: each time the slot takes
  the shard again (5 s after the zombie's start), the zombie's stream ends with ResourceInUseException
  and it subscribes again, refused within the slot's 5 s, until it gets the shard back.
- `in_use_window`: overlapping attempts on purpose: the slot's subscription is taken over (the
  exception event a newer subscription causes) by a subscriber that holds the shard `HOLD_SECONDS`,
  so the slot's next SubscribeToShard calls land inside the 5 s in-use window and are refused.
- `consumer_deregistered` (before the round): the application's consumer is deregistered by hand
  between rounds; the round's table step (`StreamConsumers.ensure`) registers it again.
- `mode_switch` (before the round): the round reads by polling; the next one by fan-out again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

import boto3
import botocore.config
import botocore.exceptions
import urllib3.exceptions

from bench.chaos.schedule import CONSUMER_DEREGISTERED, MODE_SWITCH, SUBSCRIPTION_CUT, ZOMBIE_SUBSCRIPTION, Fault
from bench.harness import REGION

if TYPE_CHECKING:
    from bench.chaos.injections import Injection
    from bench.chaos.rounds import RoundRun

ZOMBIE_SECONDS = 15.0
HOLD_SECONDS = 3.0
REFUSED_RETRY_SECONDS = 1.0
DEREGISTER_TIMEOUT_SECONDS = 30.0


def _open_shards(run: RoundRun) -> list[tuple[str, str]]:
    bridge = run.stack.subscription_bridge()
    return sorted(bridge.open_subscriptions(run.stack.stream))


def _chosen(run: RoundRun, fault: Fault) -> tuple[str, str] | None:
    subscriptions = _open_shards(run)
    if not subscriptions:
        return None
    return subscriptions[min(int(fault.pick * len(subscriptions)), len(subscriptions) - 1)]


def subscription_cut(run: RoundRun, fault: Fault) -> Injection | None:
    from bench.chaos.injections import new_injection

    chosen = _chosen(run, fault)
    if chosen is None:
        return None
    _, shard = chosen
    bridge = run.stack.subscription_bridge()
    ended = bridge.cut(run.stack.stream, shard, fault.variant)
    how = "connection reset" if fault.variant == "reset" else f"exception event {fault.variant}"
    return new_injection(
        run,
        fault,
        f"cut the subscription of {shard} mid-stream: {how}",
        shard=shard,
        ended=ended,
        opened=bridge.opened(run.stack.stream, shard),
    )


def zombie_subscription(run: RoundRun, fault: Fault) -> Injection | None:
    from bench.chaos.injections import new_injection

    chosen = _chosen(run, fault)
    if chosen is None:
        return None
    consumer_arn, shard = chosen
    zombie = Subscriber(run.stack.kinesis_proxy_endpoint(), consumer_arn, shard, ZOMBIE_SECONDS, keep_taking=True)
    opened = run.stack.subscription_bridge().opened(run.stack.stream, shard)
    run.subscribers.append(zombie.start())
    return new_injection(
        run,
        fault,
        f"zombie subscriber of {shard} for {ZOMBIE_SECONDS:.0f} s",
        shard=shard,
        subscriber=zombie,
        opened=opened,
    )


def in_use_window(run: RoundRun, fault: Fault) -> Injection | None:
    from bench.chaos.injections import new_injection

    chosen = _chosen(run, fault)
    if chosen is None:
        return None
    consumer_arn, shard = chosen
    holder = Subscriber(run.stack.kinesis_proxy_endpoint(), consumer_arn, shard, HOLD_SECONDS, keep_taking=False)
    bridge = run.stack.subscription_bridge()
    opened = bridge.opened(run.stack.stream, shard)
    bridge.cut(run.stack.stream, shard, "ResourceInUseException")
    run.subscribers.append(holder.start())
    return new_injection(
        run,
        fault,
        f"took {shard} over and held it {HOLD_SECONDS:.0f} s (the slot's calls inside the 5 s window)",
        shard=shard,
        subscriber=holder,
        opened=opened,
    )


def before_round(run: RoundRun, fault: Fault) -> Injection:
    """A fault between rounds (`schedule.BEFORE_ROUND`), done before the round's table step."""
    from bench.chaos.injections import new_injection

    if fault.kind == MODE_SWITCH:
        run.retrieval = "polling"
        return new_injection(run, fault, "the round reads by polling (the campaign reads by fan-out)")
    assert fault.kind == CONSUMER_DEREGISTERED
    kinesis, stream = run.stack.kinesis(), run.stack.stream
    consumer = run.stack.control_config().stream_consumer_name
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    try:
        described = kinesis.describe_stream_consumer(StreamARN=arn, ConsumerName=consumer)["ConsumerDescription"]
    except kinesis.exceptions.ResourceNotFoundException:  # deregistered before a round that polled
        return new_injection(run, fault, f"consumer {consumer} already deregistered", consumer=None)
    kinesis.deregister_stream_consumer(ConsumerARN=described["ConsumerARN"])
    deadline = time.monotonic() + DEREGISTER_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            kinesis.describe_stream_consumer(StreamARN=arn, ConsumerName=consumer)
        except kinesis.exceptions.ResourceNotFoundException:
            break
        time.sleep(0.2)
    return new_injection(
        run, fault, f"deregistered consumer {described['ConsumerARN']} by hand", consumer=described["ConsumerARN"]
    )


def judge(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    word = "round ok" if succeeded else "round failed"
    if injection.kind == SUBSCRIPTION_CUT:
        again = run.stack.subscription_bridge().opened(run.stack.stream, injection.evidence["shard"])
        injection.outcome = (
            f"slot subscribed again, {word}"
            if again > injection.evidence["opened"]
            else f"not subscribed again (lease budget spent or try ended), {word}"
        )
    elif "subscriber" in injection.evidence:
        subscriber: Subscriber = injection.evidence.pop("subscriber")
        subscriber.stop()
        injection.count = subscriber.refused
        injection.detail += f"; it took the shard {subscriber.takeovers} time(s), {subscriber.refused} call(s) refused"
        injection.outcome = (
            f"slot subscribed again after the zombie, {word}"
            if injection.kind == ZOMBIE_SUBSCRIPTION
            else f"slot's calls refused in the window, then subscribed again, {word}"
        )
        if run.stack.subscription_bridge().opened(run.stack.stream, injection.evidence["shard"]) <= (
            injection.evidence["opened"] + subscriber.takeovers
        ):
            injection.outcome = f"slot did not subscribe again (lease budget spent or try ended), {word}"
    elif injection.kind == CONSUMER_DEREGISTERED:
        injection.outcome = f"table step registered the consumer again, {word}"
    else:
        injection.outcome = f"polling round, {word}"


class Subscriber:
    """A subscriber of the application's consumer on one shard that reads and drops what it gets: a
    zombie slot (`keep_taking`: it subscribes again whenever it loses the shard) or one overlapping
    attempt."""

    def __init__(self, endpoint: str, consumer_arn: str, shard: str, seconds: float, keep_taking: bool) -> None:
        self.client = boto3.client(
            "kinesis",
            endpoint_url=endpoint,
            region_name=REGION,
            config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=5),
        )
        self.consumer_arn = consumer_arn
        self.shard = shard
        self.until = time.monotonic() + seconds
        self.keep_taking = keep_taking
        self.takeovers = 0
        self.refused = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"subscriber {shard}", daemon=True)

    def start(self) -> Subscriber:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)

    def _done(self) -> bool:
        return self._stopped.is_set() or time.monotonic() >= self.until

    def _run(self) -> None:
        while not self._done():
            try:
                answer = self.client.subscribe_to_shard(
                    ConsumerARN=self.consumer_arn, ShardId=self.shard, StartingPosition={"Type": "LATEST"}
                )
            except botocore.exceptions.ClientError:
                self.refused += 1
                self._stopped.wait(REFUSED_RETRY_SECONDS)
                continue
            except botocore.exceptions.BotoCoreError:
                self._stopped.wait(REFUSED_RETRY_SECONDS)
                continue
            self.takeovers += 1
            self._hold(answer["EventStream"])
            if not self.keep_taking:
                return

    def _hold(self, stream: Any) -> None:
        """Read the stream until it ends (taken back) or the subscriber's time is up."""
        with contextlib.closing(stream):
            try:
                for _ in stream:
                    if self._done():
                        return
            except (
                botocore.exceptions.BotoCoreError,
                botocore.exceptions.ClientError,
                urllib3.exceptions.HTTPError,  # its connection cut (a subscription_cut of the same shard)
                OSError,
            ):
                return
