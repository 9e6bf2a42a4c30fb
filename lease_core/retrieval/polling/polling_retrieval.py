"""Polling as an application's `Retrieval`: a `GetRecordsReader` per shard, all paced alike."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.polling.read_pacing import KINESIS_SHARD_READ_BYTES_PER_SECOND, MIN_CALL_INTERVAL_SECONDS
from lease_core.retrieval.record_source import ReadStart, ShardToRead
from lease_core.retry import RetryPolicy


class PollingRetrieval:
    """Reads shards through `kinesis` (a boto3 Kinesis client) with GetRecords, each reader pacing its
    calls to `min_call_interval_seconds` apart and its bytes to `read_bytes_per_second` (None: calls
    only), retrying by `retry_policy`."""

    def __init__(
        self,
        kinesis: Any,
        retry_policy: RetryPolicy = RetryPolicy(),
        *,
        read_bytes_per_second: float | None = KINESIS_SHARD_READ_BYTES_PER_SECOND,
        min_call_interval_seconds: float = MIN_CALL_INTERVAL_SECONDS,
    ) -> None:
        self._kinesis = kinesis
        self._retry_policy = retry_policy
        self._read_bytes_per_second = read_bytes_per_second
        self._min_call_interval_seconds = min_call_interval_seconds

    def open(
        self, shard: ShardToRead, start: ReadStart, busy_gate: AbstractContextManager[Any] | None = None
    ) -> GetRecordsReader:
        return GetRecordsReader(
            self._kinesis,
            shard,
            start,
            retry_policy=self._retry_policy,
            min_call_interval_seconds=self._min_call_interval_seconds,
            read_bytes_per_second=self._read_bytes_per_second,
            busy_gate=busy_gate,
        )


def idle_check_retrieval(kinesis: Any, retry_policy: RetryPolicy) -> PollingRetrieval:
    """The leader's idle check: it asks each open lease for one record, a GetRecords or two, which need
    not keep the distance of a read that goes on at the shard's cap."""
    return PollingRetrieval(kinesis, retry_policy, min_call_interval_seconds=0)
