"""Enhanced fan-out as an application's `Retrieval`: a `SubscriptionReader` per shard, through the
application's registered consumer of the shard's stream."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from lease_core.retrieval.fanout.subscription_reader import ConsumerArns, SubscriptionReader
from lease_core.retrieval.record_source import ReadStart, ShardToRead
from lease_core.retry import RetryPolicy


class FanOutRetrieval:
    """Reads shards through `kinesis` (a boto3 Kinesis client) by SubscribeToShard with the consumer
    `consumers` names for each stream, retrying by `retry_policy`."""

    def __init__(self, kinesis: Any, consumers: ConsumerArns, retry_policy: RetryPolicy = RetryPolicy()) -> None:
        self._kinesis = kinesis
        self._consumers = consumers
        self._retry_policy = retry_policy

    def open(
        self, shard: ShardToRead, start: ReadStart, busy_gate: AbstractContextManager[Any] | None = None
    ) -> SubscriptionReader:
        return SubscriptionReader(
            self._kinesis, self._consumers, shard, start, retry_policy=self._retry_policy, busy_gate=busy_gate
        )
