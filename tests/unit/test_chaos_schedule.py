"""The fault campaign's schedule (bench/chaos/schedule.py) in enhanced fan-out mode: which kinds a
campaign meets, and the rounds the fan-out faults are drawn into."""

from __future__ import annotations

import random

import pytest

from bench.chaos.schedule import (
    FAN_OUT_ONLY,
    MODE_SWITCH,
    SUBSCRIPTION_FAULTS,
    build_schedule,
    kinds_for,
)
from devtools.subscription_bridge import SubscriptionRefused, iterator_request, stream_of_consumer


def test_a_polling_campaign_meets_no_fault_of_subscriptions_and_a_fan_out_one_meets_them_all():
    assert not FAN_OUT_ONLY & set(kinds_for("parquet"))
    assert set(kinds_for("parquet", "fan_out")) >= FAN_OUT_ONLY
    assert set(kinds_for("delta", "fan_out")) - set(kinds_for("delta")) == FAN_OUT_ONLY


@pytest.mark.parametrize("seed", range(20))
def test_a_round_that_switches_to_polling_carries_no_fault_of_subscriptions(seed):
    schedule = build_schedule(random.Random(seed), 250, 30, kinds_for("iceberg", "fan_out"))
    for plan in schedule.rounds:
        kinds = {fault.kind for fault in plan.faults}
        assert not (MODE_SWITCH in kinds and SUBSCRIPTION_FAULTS & kinds), plan


def test_a_consumer_arn_names_its_stream_and_anything_else_is_refused_naming_it():
    assert stream_of_consumer("arn:aws:kinesis:us-east-1:000000000000:stream/orders/consumer/app:1795901432") == (
        "orders"
    )
    with pytest.raises(SubscriptionRefused, match="'arn:aws:kinesis:us-east-1:1:stream/orders' is not"):
        stream_of_consumer("arn:aws:kinesis:us-east-1:1:stream/orders")


def test_a_starting_position_becomes_the_iterator_request_and_an_unknown_type_is_refused_naming_it():
    assert iterator_request("s", "shardId-1", {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": "42"}) == {
        "StreamName": "s",
        "ShardId": "shardId-1",
        "ShardIteratorType": "AT_SEQUENCE_NUMBER",
        "StartingSequenceNumber": "42",
    }
    with pytest.raises(SubscriptionRefused, match="'SOMEWHERE' is not a position"):
        iterator_request("s", "shardId-1", {"Type": "SOMEWHERE"})
