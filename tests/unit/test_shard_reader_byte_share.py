"""Polling (GetRecordsReader) with batches capped in bytes, a slot lease's share of the slot's buffer: each
GetRecords asks for no more records than the batch has room for, so that one answer is about the share, not
10 MB, and what the reader keeps between batches is at most a record; every record is read once, in order,
and a backlog is still read at the shard's cap."""

from __future__ import annotations

from typing import Any

import pytest

from lease_core.model.sequence import TRIM_HORIZON
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.polling.read_pacing import MIN_CALL_INTERVAL_SECONDS
from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead
from lease_core.retry import RetryPolicy
from tests.unit.test_shard_reader_pacing import FakeClock, ThrottlingShard

RATE = 2.0 * 1024 * 1024


class AnsweringShard(ThrottlingShard):
    """The throttling shard, recording the Limit of each call and the data bytes of each answer."""

    def __init__(self, *arguments: Any, **options: Any) -> None:
        super().__init__(*arguments, **options)
        self.limits: list[int] = []
        self.answers: list[int] = []

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        self.limits.append(Limit)
        response = super().get_records(ShardIterator, Limit)
        self.answers.append(sum(len(record["Data"]) for record in response["Records"]))
        return response


def reader_of(shard: AnsweringShard, clock: FakeClock) -> GetRecordsReader:
    return GetRecordsReader(
        shard,
        ShardToRead("stream", "shardId-000000000000"),
        ReadStart(TRIM_HORIZON),
        retry_policy=RetryPolicy(attempts=6, sleep=clock.sleep),
        read_bytes_per_second=RATE,
        clock=clock,
        sleep=clock.sleep,
    )


def test_the_first_call_assumes_the_largest_records_and_the_next_the_size_of_the_last_answers():
    clock = FakeClock()
    shard = AnsweringShard(clock, 10_000, 1000, RATE)
    batch = reader_of(shard, clock).read(ReadLimits(max_bytes=100_000))
    assert (batch.stopped_by, len(batch.records), batch.bytes) == ("bytes", 100, 100_000)
    assert shard.limits == [1, 99]


@pytest.mark.parametrize(
    ("size", "share"),
    [
        pytest.param(1000, 4 * 1024 * 1024, id="4-MiB-share"),
        pytest.param(750, 1024 * 1024, id="1-MiB-share"),
        pytest.param(300_000, 1024 * 1024, id="records-of-a-third-of-the-share"),
    ],
)
def test_batches_of_a_share_read_a_backlog_once_at_the_cap_with_answers_of_about_the_share(size, share):
    clock = FakeClock()
    count = 20 * 1024 * 1024 // size
    shard = AnsweringShard(clock, count, size, RATE)
    reader = reader_of(shard, clock)
    read: list[str] = []
    while True:
        batch = reader.read(ReadLimits(max_bytes=share))
        assert batch.bytes <= max(share, size)
        read.extend(record.sequence_number for record in batch.records)
        if batch.stopped_by == "tip":
            break
    assert read == [record["SequenceNumber"] for record in shard.records]
    assert max(shard.answers) <= share + size
    assert shard.refused == {"calls_per_second": 0, "bytes_per_second": 0}
    # At the cap: what the backlog costs at the shard's rate, and the first call's interval besides.
    assert clock.now <= shard.total_bytes / RATE + 2 * MIN_CALL_INTERVAL_SECONDS


def test_a_batch_without_a_byte_cap_asks_for_whole_pages():
    clock = FakeClock()
    shard = AnsweringShard(clock, 20_000, 100, RATE)
    reader_of(shard, clock).read(ReadLimits(max_records=50_000))
    assert shard.limits[0] == 10_000
