"""The Kinesis stand-in (devtools/kinesis_standin.py) against a real boto3 client and the real
KinesisShardSource and polling's GetRecordsReader: the protocol they rely on, and Kinesis' per-shard read limits
(small caps here, so the debt after a large read lasts seconds without megabytes of data)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import pytest

from devtools.kinesis_standin import KinesisStandIn, Limits, StreamSpec, shard_id_of, user_record_data
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON
from lease_core.model.shards import InitialPosition, InitialPositionInStream
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead
from lease_core.retrieval.shard_source import KinesisShardSource

PARENTS = 2
RECORDS = 40
SPLIT = StreamSpec("split", shards=PARENTS, records_per_shard=RECORDS, record_bytes=100, split=True)
KPL = StreamSpec("kpl", shards=1, records_per_shard=6, record_bytes=50, aggregate_size=4)
# The same lineage, ending its closed shards as kinesis-mock does: the null iterator with the last records.
SPLIT_ENDING_EARLY = StreamSpec(
    "split-early", shards=1, records_per_shard=RECORDS, record_bytes=100, split=True, shard_end="with_last_records"
)
PARENT = shard_id_of(0)


@pytest.fixture(scope="module")
def standin() -> Iterator[KinesisStandIn]:
    with KinesisStandIn([SPLIT, KPL, SPLIT_ENDING_EARLY], Limits.off()) as running:
        yield running


@pytest.fixture(scope="module")
def client(standin: KinesisStandIn) -> Any:
    return standin.client()


def iterator(client: Any, stream: str, shard_id: str, kind: str, **arguments: Any) -> str:
    response = client.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType=kind, **arguments)
    return str(response["ShardIterator"])


def throttled(call: Any) -> bool:
    try:
        call()
    except botocore.exceptions.ClientError as error:
        assert error.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
        return True
    return False


# --- the protocol --------------------------------------------------------------------------------


def test_listing_pages_and_filters_a_split_lineage(client):
    source = KinesisShardSource(client, page_size=2)
    shards = source.list_shards(SPLIT.name)
    assert [shard.shard_id for shard in shards] == [shard_id_of(index) for index in range(3 * PARENTS)]
    assert shards[0].ending_sequence_number is not None and shards[-1].ending_sequence_number is None
    assert {shard.parent_shard_id for shard in shards[PARENTS:]} == {shard_id_of(0), shard_id_of(1)}
    oldest = source.list_shards_for_new_application(SPLIT.name, InitialPositionInStream(InitialPosition.TRIM_HORIZON))
    latest = source.list_shards_for_new_application(SPLIT.name, InitialPositionInStream(InitialPosition.LATEST))
    assert [shard.shard_id for shard in oldest] == [shard_id_of(0), shard_id_of(1)]
    assert [shard.shard_id for shard in latest] == [shard_id_of(index) for index in range(PARENTS, 3 * PARENTS)]
    assert source.describe_stream(SPLIT.name).stream_arn.endswith(f":stream/{SPLIT.name}")
    with pytest.raises(botocore.exceptions.ClientError, match="ResourceNotFoundException"):
        client.list_shards(StreamName="missing")


def test_every_iterator_type_starts_where_kinesis_starts_it(client):
    def first(kind: str, **arguments: Any) -> dict[str, Any] | None:
        records = client.get_records(ShardIterator=iterator(client, SPLIT.name, PARENT, kind, **arguments), Limit=1)
        return records["Records"][0] if records["Records"] else None

    everything = client.get_records(ShardIterator=iterator(client, SPLIT.name, PARENT, "TRIM_HORIZON"))["Records"]
    assert len(everything) == RECORDS and all(len(record["SequenceNumber"]) == 56 for record in everything)
    numbers = [int(record["SequenceNumber"]) for record in everything]
    assert numbers == sorted(set(numbers))
    fifth = everything[5]
    assert first("TRIM_HORIZON") == everything[0]
    assert first("AT_SEQUENCE_NUMBER", StartingSequenceNumber=fifth["SequenceNumber"]) == fifth
    assert first("AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=fifth["SequenceNumber"]) == everything[6]
    assert first("AT_TIMESTAMP", Timestamp=fifth["ApproximateArrivalTimestamp"]) == fifth
    child = client.get_records(ShardIterator=iterator(client, SPLIT.name, shard_id_of(PARENTS), "LATEST"))
    assert (child["Records"], child["MillisBehindLatest"]) == ([], 0)
    assert child["NextShardIterator"]


def test_a_shard_reader_reads_every_record_once_to_the_end_of_a_closed_shard(client):
    reader = GetRecordsReader(
        client,
        ShardToRead(SPLIT.name, PARENT),
        ReadStart(TRIM_HORIZON),
        min_call_interval_seconds=0,
        read_bytes_per_second=None,
    )
    reader_options = ReadLimits(max_records=7)
    records, batch = [], reader.read(reader_options)
    while not batch.shard_ended:
        records.extend(batch.records)
        batch = reader.read(reader_options)
    records.extend(batch.records)
    assert [record.data for record in records] == [
        user_record_data(SPLIT.name, PARENT, index, SPLIT.record_bytes) for index in range(RECORDS)
    ]
    assert batch.end == SHARD_END
    assert sorted(child.shard_id for child in batch.child_shards) == [shard_id_of(PARENTS), shard_id_of(PARENTS + 1)]
    assert all(child.parent_shard_ids == {PARENT} for child in batch.child_shards)


@pytest.mark.parametrize(
    ("stream", "answers"),
    [
        # (records, a next iterator, MillisBehindLatest, ChildShards) of each call from the trim horizon
        pytest.param(
            SPLIT, [(RECORDS, True, 0, 0), (0, False, 0, 2)], id="after-the-last-records-as-kinesis-documents"
        ),
        pytest.param(SPLIT_ENDING_EARLY, [(RECORDS, False, 0, 2)], id="with-the-last-records-as-kinesis-mock-does"),
    ],
)
def test_a_closed_shard_answers_its_end_as_configured_and_a_reader_told_it_is_closed_reaches_it(
    client, stream, answers
):
    shard_iterator: str | None = iterator(client, stream.name, PARENT, "TRIM_HORIZON")
    seen = []
    while shard_iterator is not None:
        answer = client.get_records(ShardIterator=shard_iterator)
        shard_iterator = answer.get("NextShardIterator")
        seen.append(
            (
                len(answer["Records"]),
                shard_iterator is not None,
                answer["MillisBehindLatest"],
                len(answer.get("ChildShards", [])),
            )
        )
    assert seen == answers
    closed = next(shard for shard in KinesisShardSource(client).list_shards(stream.name) if shard.shard_id == PARENT)
    reader = GetRecordsReader(
        client,
        ShardToRead(stream.name, PARENT, closed=not closed.is_open),
        ReadStart(TRIM_HORIZON),
        min_call_interval_seconds=0,
        read_bytes_per_second=None,
    )
    batch = reader.read(ReadLimits())
    assert (len(batch.records), batch.stopped_by, len(batch.child_shards)) == (RECORDS, "shard_end", 2)


def test_kpl_aggregates_are_deaggregated_by_the_shard_reader(client):
    reader = GetRecordsReader(
        client, ShardToRead(KPL.name, PARENT), ReadStart(TRIM_HORIZON), min_call_interval_seconds=0
    )
    batch = reader.read(ReadLimits())
    users = KPL.records_per_shard * KPL.aggregate_size
    assert [record.data for record in batch.records] == [
        user_record_data(KPL.name, PARENT, index, KPL.record_bytes) for index in range(users)
    ]
    assert [record.sub_sequence_number for record in batch.records[:5]] == [0, 1, 2, 3, 0]
    assert batch.records[5].partition_key == "pk-5"


# --- the limits ----------------------------------------------------------------------------------


def test_a_sixth_call_inside_a_second_is_throttled_and_counted():
    limits = Limits(get_records_per_second=5, read_bytes_per_second=None)
    with KinesisStandIn([StreamSpec("calls", records_per_shard=10)], limits) as running:
        client = running.client()
        shard_iterator = iterator(client, "calls", PARENT, "TRIM_HORIZON")
        started = time.monotonic()
        outcomes = [throttled(lambda: client.get_records(ShardIterator=shard_iterator, Limit=1)) for _ in range(6)]
        assert time.monotonic() - started < 1.0, "the six calls must fall inside one second"
        stats = running.stats()
    assert outcomes == [False] * 5 + [True]
    assert stats["violations"] == {"calls_per_second": 1, "bytes_per_second": 0}
    assert stats["shards"][f"calls/{PARENT}"]["violations"] == {"calls_per_second": 1}
    assert stats["get_records"] == 6 and stats["records"] == 5


def test_a_large_read_leaves_the_shard_in_debt_until_the_rate_has_paid_it_off():
    rate = 100_000.0
    spec = StreamSpec("bytes", records_per_shard=300, record_bytes=1000)
    limits = Limits(get_records_per_second=None, read_bytes_per_second=rate)
    with KinesisStandIn([spec], limits) as running:
        client = running.client()
        shard_iterator = iterator(client, "bytes", PARENT, "TRIM_HORIZON")
        big = client.get_records(ShardIterator=shard_iterator)
        read_at = time.monotonic()
        refused = 0
        while throttled(lambda: client.get_records(ShardIterator=big["NextShardIterator"], Limit=1)):
            refused += 1
            time.sleep(0.05)  # polling pace, not synchronisation: the condition is the answer itself
        debt_seconds = time.monotonic() - read_at
        stats = running.stats()
    served = sum(len(record["Data"]) + len(record["PartitionKey"]) for record in big["Records"])
    assert len(big["Records"]) == 300 and stats["shards"][f"bytes/{PARENT}"]["bytes"] == served
    # A full bucket (1 s of the rate) minus what was served: the debt, paid off at the rate.
    expected = (served - rate) / rate
    assert expected - 0.1 <= debt_seconds <= expected + 0.5
    assert stats["violations"] == {"calls_per_second": 0, "bytes_per_second": refused} and refused > 10


def test_a_reader_paced_at_the_cap_is_never_throttled():
    rate = 400_000.0
    spec = StreamSpec("paced", records_per_shard=400, record_bytes=2000)
    with KinesisStandIn([spec], Limits(read_bytes_per_second=rate)) as running:
        client = running.client()
        reader = GetRecordsReader(
            client,
            ShardToRead("paced", PARENT),
            ReadStart(TRIM_HORIZON),
            read_bytes_per_second=rate,
            get_records_limit=50,
        )
        started = time.monotonic()
        batch = reader.read(ReadLimits())
        elapsed = time.monotonic() - started
        stats = running.stats()
    assert (len(batch.records), batch.refused_calls) == (400, 0)
    assert stats["violations"] == {"calls_per_second": 0, "bytes_per_second": 0}
    # 8 pages of 100 KB, then the call that finds the tip once they are paid off: paced, not lucky.
    assert stats["bytes"] / rate - 0.05 <= elapsed <= stats["bytes"] / rate + 0.5


def test_with_limits_off_nothing_is_throttled():
    with KinesisStandIn([StreamSpec("free", records_per_shard=2000, record_bytes=1000)], Limits.off()) as running:
        client = running.client()
        shard_iterator = iterator(client, "free", PARENT, "TRIM_HORIZON")
        for _ in range(20):
            assert len(client.get_records(ShardIterator=shard_iterator)["Records"]) == 2000
        stats = running.stats()
    assert stats["violations"] == {"calls_per_second": 0, "bytes_per_second": 0}
    assert stats["bytes"] == 20 * sum(1000 + len(f"pk-{index}") for index in range(2000))


def test_arrival_times_lie_in_the_backlog_before_start_up(client):
    records = client.get_records(ShardIterator=iterator(client, SPLIT.name, PARENT, "TRIM_HORIZON"))["Records"]
    now = datetime.now(UTC)
    assert all(
        0 < (now - record["ApproximateArrivalTimestamp"]).total_seconds() <= SPLIT.backlog_seconds + 60
        for record in records
    )
