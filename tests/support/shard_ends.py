"""Kinesis ending closed shards both ways a Kinesis may end them, for the reshard tests.

kinesis-mock answers a closed shard's last records with the null NextShardIterator and the
ChildShards. Real Kinesis may answer them with a next iterator and MillisBehindLatest 0, and the null
iterator only to the call after them (the GetRecords documentation); a fault proxy in front of
kinesis-mock makes it answer that way (`FaultProxy.end_shards_after_last_records`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from devtools.fault_proxy import LATE_SHARD_END_STAT, FaultProxy

WITH_LAST_RECORDS = "end-with-last-records"
ONE_CALL_LATER = "end-one-call-later"
SHARD_END_BEHAVIOURS = (WITH_LAST_RECORDS, ONE_CALL_LATER)


@dataclass(frozen=True)
class KinesisShardEnds:
    """A Kinesis endpoint ending closed shards the way `behaviour` names."""

    behaviour: str
    endpoint: str
    proxy: FaultProxy | None = None

    def late_ends_answered(self) -> int:
        """The closed shards' ends answered one call after the last records so far."""
        return 0 if self.proxy is None else self.proxy.stats().get(LATE_SHARD_END_STAT, 0)


@contextmanager
def kinesis_ending_shards(behaviour: str, kinesis_endpoint: str) -> Iterator[KinesisShardEnds]:
    if behaviour == WITH_LAST_RECORDS:
        yield KinesisShardEnds(behaviour, kinesis_endpoint)
        return
    with FaultProxy(kinesis_endpoint) as proxy:
        proxy.end_shards_after_last_records()
        yield KinesisShardEnds(behaviour, proxy.endpoint, proxy)
