"""Reading's pure parts (start positions, limits, deaggregation), and the end of a closed shard as real
Kinesis answers it to polling (GetRecordsReader), on an in-memory fake shard: kinesis-mock cannot show
it (it hands out the null iterator with the last records and reports 9223372036854775807 as every
ending sequence number).
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from aws_kinesis_agg import MAGIC as KPL_MAGIC
from aws_kinesis_agg.aggregator import RecordAggregator
from aws_kinesis_agg.deaggregator import iter_deaggregate_records
from aws_kinesis_agg.deaggregator import messages_pb2 as kpl_messages
from hypothesis import given, settings
from hypothesis import strategies as st

from lease_core.model.lease import HashKeyRange
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard
from lease_core.retrieval.kpl_deaggregation import user_records
from lease_core.retrieval.polling.get_records_reader import (
    CLOSED_SHARD_EMPTY_ANSWERS,
    GetRecordsReader,
    iterator_arguments,
)
from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead
from lease_core.retrieval.retention_gaps import RetentionGap
from lease_core.retrieval.start_positions import StartingPosition, starting_position
from tests.support.kpl import aggregate

ARRIVAL = datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
SEQUENCE = "49650000000000000000000000000000000000000000000000000001"


def kinesis_record(sequence_number: str, data: bytes, partition_key: str = "key") -> dict[str, Any]:
    """A record as boto3's GetRecords returns it."""
    return {
        "SequenceNumber": sequence_number,
        "ApproximateArrivalTimestamp": ARRIVAL,
        "Data": data,
        "PartitionKey": partition_key,
        "EncryptionType": "NONE",
    }


# --- where reading starts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        pytest.param(TRIM_HORIZON, StartingPosition("TRIM_HORIZON"), id="trim-horizon"),
        pytest.param(LATEST, StartingPosition("LATEST"), id="latest"),
        pytest.param(AT_TIMESTAMP, StartingPosition("AT_TIMESTAMP", timestamp=ARRIVAL), id="at-timestamp"),
        pytest.param(
            ExtendedSequenceNumber(SEQUENCE, 3),
            StartingPosition("AT_SEQUENCE_NUMBER", sequence_number=SEQUENCE),
            id="inside-an-aggregate-reopens-the-aggregate",
        ),
    ],
)
def test_a_checkpoint_maps_to_the_start_that_neither_repeats_nor_skips(start, expected):
    assert starting_position("shardId-000000000007", start, ARRIVAL if start == AT_TIMESTAMP else None) == expected


PIN = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        pytest.param(LATEST, StartingPosition("AT_TIMESTAMP", timestamp=PIN), id="latest-reads-on-from-its-pin"),
        pytest.param(TRIM_HORIZON, StartingPosition("TRIM_HORIZON"), id="a-pin-means-nothing-off-latest"),
        pytest.param(
            AT_TIMESTAMP, StartingPosition("AT_TIMESTAMP", timestamp=ARRIVAL), id="at-timestamp-keeps-the-runs"
        ),
    ],
)
def test_a_pinned_latest_opens_at_its_pin_and_nothing_else_changes(start, expected):
    assert starting_position("shardId-000000000007", start, ARRIVAL, latest_since=PIN) == expected


def test_a_shard_iterator_is_asked_for_with_only_the_arguments_its_kind_needs():
    assert iterator_arguments(StartingPosition("AT_SEQUENCE_NUMBER", sequence_number=SEQUENCE)) == {
        "ShardIteratorType": "AT_SEQUENCE_NUMBER",
        "StartingSequenceNumber": SEQUENCE,
    }
    assert iterator_arguments(StartingPosition("AT_TIMESTAMP", timestamp=ARRIVAL)) == {
        "ShardIteratorType": "AT_TIMESTAMP",
        "Timestamp": ARRIVAL,
    }


@pytest.mark.parametrize(
    ("start", "options", "message"),
    [
        pytest.param(SHARD_END, {}, "shardId-000000000007 .*SHARD_END", id="finished-lease"),
        pytest.param(AT_TIMESTAMP, {}, "shardId-000000000007 .*at_timestamp", id="at-timestamp-without-a-timestamp"),
        pytest.param(TRIM_HORIZON, {"get_records_limit": 0}, "get_records_limit", id="limit-zero"),
        pytest.param(TRIM_HORIZON, {"get_records_limit": 10001}, "get_records_limit", id="limit-above-kinesis"),
    ],
)
def test_a_reader_that_cannot_read_is_refused_before_any_call(start, options, message):
    with pytest.raises(ValueError, match=message):
        GetRecordsReader(None, ShardToRead("stream", "shardId-000000000007"), ReadStart(start), **options)


# --- limits ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"max_records": 0}, id="no-records"),
        pytest.param({"max_bytes": 0}, id="no-bytes"),
        pytest.param({"stop_at": TRIM_HORIZON}, id="stop-at-a-start-sentinel"),
    ],
)
def test_limits_that_would_never_let_a_batch_progress_are_refused(options):
    with pytest.raises(ValueError):
        ReadLimits(**options)


@pytest.mark.parametrize(
    ("stop_at", "position", "reached"),
    [
        pytest.param(ExtendedSequenceNumber("20"), ExtendedSequenceNumber("20"), True, id="at-stop-at"),
        pytest.param(ExtendedSequenceNumber("20"), ExtendedSequenceNumber("20", 1), True, id="past-stop-at"),
        pytest.param(ExtendedSequenceNumber("20", 2), ExtendedSequenceNumber("20", 1), False, id="before-stop-at"),
        pytest.param(ExtendedSequenceNumber("20"), None, False, id="nothing-delivered"),
        pytest.param(SHARD_END, ExtendedSequenceNumber("99"), False, id="shard-end-is-never-reached-by-a-record"),
        pytest.param(None, ExtendedSequenceNumber("99"), False, id="no-stop-at"),
    ],
)
def test_stop_at_is_reached_by_the_last_delivered_position_at_or_past_it(stop_at, position, reached):
    assert ReadLimits(stop_at=stop_at).stop_at_reached(position) is reached


# --- deaggregation ---------------------------------------------------------------------------------------


def test_a_plain_record_is_one_user_record_at_sub_sequence_zero_in_utc():
    (record,) = user_records([kinesis_record(SEQUENCE, b"payload")])
    assert record.position == ExtendedSequenceNumber(SEQUENCE, 0)
    assert (record.data, record.partition_key, record.explicit_hash_key) == (b"payload", "key", None)
    assert record.approximate_arrival_timestamp == ARRIVAL
    assert record.approximate_arrival_timestamp.tzinfo is UTC


def test_an_aggregate_becomes_its_user_records_with_raw_data_in_order():
    users = [("pk-a", b"first"), ("pk-b", b"\x00\xff binary"), ("pk-a", b"")]
    key, _, data = aggregate(users)
    plain_after = "49650000000000000000000000000000000000000000000000000002"
    records = user_records([kinesis_record(SEQUENCE, data, key), kinesis_record(plain_after, b"lone")])
    assert [(record.position, record.partition_key, record.data) for record in records] == [
        (ExtendedSequenceNumber(SEQUENCE, 0), "pk-a", b"first"),
        (ExtendedSequenceNumber(SEQUENCE, 1), "pk-b", b"\x00\xff binary"),
        (ExtendedSequenceNumber(SEQUENCE, 2), "pk-a", b""),
        (ExtendedSequenceNumber(plain_after, 0), "key", b"lone"),
    ]


user_record_lists = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=8),
        st.binary(max_size=40),
        st.one_of(st.none(), st.integers(0, 2**128 - 1).map(str)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(user_record_lists)
def test_an_aggregate_yields_its_user_records_as_kcl_does(users):
    aggregator = RecordAggregator()
    for partition_key, data, explicit_hash_key in users:
        assert aggregator.add_user_record(partition_key, data, explicit_hash_key) is None
    key, _, data = aggregator.clear_and_get().get_contents()
    raw = kinesis_record(SEQUENCE, data, key)
    found = [(r.sub_sequence_number, r.partition_key, r.data, r.explicit_hash_key) for r in user_records([raw])]
    # A user record's explicit hash key is the one it was put with, if any (KCL: hasExplicitHashKeyIndex).
    assert found == [(index, *user) for index, user in enumerate(users)]
    # aws_kinesis_agg reads the same user records (it gives a user record without its own explicit
    # hash key the aggregate's first one, which KCL does not).
    library = [
        (
            entry["kinesis"]["subSequenceNumber"],
            entry["kinesis"]["partitionKey"],
            base64.b64decode(entry["kinesis"]["data"]),
        )
        for entry in iter_deaggregate_records([raw], data_format="Boto3")
    ]
    assert [record[:3] for record in found] == library


def kpl_framed(message: bytes, digest: bytes | None = None) -> bytes:
    """`message` as a KPL aggregate's data: magic, message, MD5 digest of the message (or `digest`)."""
    return KPL_MAGIC + message + (hashlib.md5(message).digest() if digest is None else digest)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(kpl_framed(b"\x0a\x01a", digest=b"0" * 16), id="digest-does-not-match"),
        pytest.param(
            kpl_framed(
                kpl_messages.AggregatedRecord(
                    partition_key_table=["a"], records=[kpl_messages.Record(partition_key_index=3, data=b"x")]
                ).SerializeToString()
            ),
            id="user-record-names-a-partition-key-the-table-lacks",
        ),
        pytest.param(kpl_framed(b"\xff\xff\xff"), id="message-does-not-decode"),
        pytest.param(
            kpl_framed(
                kpl_messages.AggregatedRecord(
                    partition_key_table=["a"], records=[kpl_messages.Record(partition_key_index=2**64 - 1, data=b"x")]
                ).SerializeToString()
            ),
            id="an-index-past-what-a-list-takes",
        ),
        pytest.param(
            kpl_framed(
                kpl_messages.AggregatedRecord(
                    partition_key_table=["a"],
                    records=[kpl_messages.Record(partition_key_index=0, explicit_hash_key_index=0, data=b"x")],
                ).SerializeToString()
            ),
            id="an-explicit-hash-key-the-table-lacks",
        ),
        pytest.param(
            kpl_framed(
                kpl_messages.AggregatedRecord(
                    partition_key_table=["a"], records=[kpl_messages.Record(partition_key_index=0)]
                ).SerializePartialToString()
            ),
            id="a-user-record-without-its-required-data",
        ),
        pytest.param(KPL_MAGIC + b"short", id="too-short-for-a-digest"),
    ],
)
def test_a_record_that_only_looks_like_an_aggregate_lands_whole_as_one_record(data):
    (record,) = user_records([kinesis_record(SEQUENCE, data)])
    assert (record.position, record.data, record.partition_key) == (ExtendedSequenceNumber(SEQUENCE, 0), data, "key")


# --- the end of a closed shard as real Kinesis answers it ----------------------------------------------------


CHILD = {
    "ShardId": "shardId-000000000009",
    "ParentShards": ["shardId-000000000007"],
    "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "340282366920938463463374607431768211455"},
}


class ClosedShardLikeKinesis:
    """A closed shard answering as Kinesis does: MillisBehindLatest is 0 only at the last record, pages
    may be short (at most `page_cap` records, like Kinesis' 10 MB cap), the last records come with a
    next iterator, and only the call after them answers no iterator and the ChildShards."""

    def __init__(self, count: int, page_cap: int = 10000, ends: bool = True) -> None:
        self.records = [kinesis_record(f"4965{index:052d}", f"r{index}".encode()) for index in range(1, count + 1)]
        self.page_cap = page_cap
        self.ends = ends  # False: a shard that never answers its end (no Kinesis does; the reader must not hang)
        self.get_records_calls = 0

    @property
    def ending_sequence_number(self) -> str:
        return str(self.records[-1]["SequenceNumber"])

    def get_shard_iterator(self, **arguments: Any) -> dict[str, Any]:
        if arguments["ShardIteratorType"] == "AT_SEQUENCE_NUMBER":
            numbers = [record["SequenceNumber"] for record in self.records]
            return {"ShardIterator": str(numbers.index(arguments["StartingSequenceNumber"]))}
        assert arguments["ShardIteratorType"] == "TRIM_HORIZON"
        return {"ShardIterator": "0"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        self.get_records_calls += 1
        index = int(ShardIterator)
        if index == len(self.records) and not self.ends:
            return {"Records": [], "NextShardIterator": str(index), "MillisBehindLatest": 0}
        if index == len(self.records):
            return {"Records": [], "MillisBehindLatest": 0, "ChildShards": [CHILD]}
        page = self.records[index : index + min(Limit, self.page_cap)]
        behind = 0 if index + len(page) == len(self.records) else 60000
        return {"Records": page, "NextShardIterator": str(index + len(page)), "MillisBehindLatest": behind}


def reader_of(
    kinesis: ClosedShardLikeKinesis,
    knows_the_end: bool,
    closed: bool = False,
    start: ExtendedSequenceNumber = TRIM_HORIZON,
) -> GetRecordsReader:
    ending = kinesis.ending_sequence_number if knows_the_end else None
    shard = ShardToRead("stream", "shardId-000000000007", closed=closed, ending_sequence_number=ending)
    return GetRecordsReader(kinesis, shard, ReadStart(start), min_call_interval_seconds=0)


EXPECTED_CHILD = ChildShard(
    "shardId-000000000009", frozenset({"shardId-000000000007"}), HashKeyRange.from_strings("0", str(2**128 - 1))
)


@pytest.mark.parametrize(
    ("limits", "cut_by"),
    [
        pytest.param(ReadLimits(), "tip", id="no-limit-reaches-the-tip"),
        pytest.param(ReadLimits(max_records=6), "records", id="record-limit-exactly-at-the-end"),
    ],
)
def test_the_ending_sequence_number_ends_the_shard_in_the_batch_that_reads_its_last_record(limits, cut_by):
    knowing = reader_of(ClosedShardLikeKinesis(6), knows_the_end=True).read(limits)
    assert (len(knowing.records), knowing.stopped_by, knowing.end) == (6, "shard_end", SHARD_END)
    assert (knowing.child_shards, knowing.calls) == ((EXPECTED_CHILD,), 2)

    unknowing_reader = reader_of(ClosedShardLikeKinesis(6), knows_the_end=False)
    unknowing = unknowing_reader.read(limits)
    assert (len(unknowing.records), unknowing.stopped_by, unknowing.shard_ended) == (6, cut_by, False)
    after = unknowing_reader.read(limits)
    assert (after.records, after.stopped_by, after.child_shards) == ((), "shard_end", (EXPECTED_CHILD,))


@pytest.mark.parametrize(
    ("limits", "expected_records"),
    [
        pytest.param(ReadLimits(), 6, id="no-limit"),
        pytest.param(ReadLimits(max_records=1), 1, id="one-record-as-the-idle-check-asks"),
    ],
)
def test_a_shard_known_to_be_closed_is_read_past_millis_behind_latest_0_to_its_null_iterator(limits, expected_records):
    reader = reader_of(ClosedShardLikeKinesis(6), knows_the_end=False, closed=True)
    batches = [reader.read(limits)]
    while not batches[-1].shard_ended:
        batches.append(reader.read(limits))
    assert sum(len(batch.records) for batch in batches) == 6
    assert len(batches[0].records) == expected_records
    assert (batches[-1].stopped_by, batches[-1].end, batches[-1].child_shards) == (
        "shard_end",
        SHARD_END,
        (EXPECTED_CHILD,),
    )


def test_a_closed_shard_resumed_at_its_last_record_ends_instead_of_stopping_at_the_tip_every_round():
    kinesis = ClosedShardLikeKinesis(6)
    last = ExtendedSequenceNumber(kinesis.ending_sequence_number, 0)
    batch = reader_of(kinesis, knows_the_end=False, closed=True, start=last).read(ReadLimits())
    assert (batch.records, batch.stopped_by, batch.child_shards) == ((), "shard_end", (EXPECTED_CHILD,))
    unknowing = reader_of(ClosedShardLikeKinesis(6), knows_the_end=False, start=last).read(ReadLimits())
    assert (unknowing.records, unknowing.stopped_by) == ((), "tip")


def test_a_closed_shard_that_never_answers_its_end_ends_the_batch_with_its_records_and_says_so():
    kinesis = ClosedShardLikeKinesis(6, ends=False)
    batch = reader_of(kinesis, knows_the_end=False, closed=True).read(ReadLimits())
    assert (len(batch.records), batch.stopped_by, batch.shard_ended, batch.end) == (
        6,
        "no_shard_end",
        False,
        ExtendedSequenceNumber(kinesis.ending_sequence_number, 0),
    )
    assert kinesis.get_records_calls == 1 + CLOSED_SHARD_EMPTY_ANSWERS


def test_a_short_page_behind_the_latest_record_is_not_taken_for_the_tip():
    kinesis = ClosedShardLikeKinesis(6, page_cap=2)
    batch = reader_of(kinesis, knows_the_end=False).read(ReadLimits())
    assert (len(batch.records), batch.stopped_by, batch.calls) == (6, "tip", 3)
    assert batch.millis_behind_latest == 0


class OpenShard:
    """An open shard of `count` records answering GetShardIterator AT_SEQUENCE_NUMBER as Kinesis does
    (the iterator starts at that record), counting GetRecords calls."""

    def __init__(self, count: int) -> None:
        self.records = [kinesis_record(f"4965{index:052d}", f"r{index}".encode()) for index in range(1, count + 1)]
        self.get_records_calls = 0

    def get_shard_iterator(self, **arguments: Any) -> dict[str, Any]:
        numbers = [record["SequenceNumber"] for record in self.records]
        start = arguments.get("StartingSequenceNumber")
        return {"ShardIterator": str(numbers.index(start) if start is not None else 0)}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        self.get_records_calls += 1
        index = int(ShardIterator)
        page = self.records[index : index + Limit]
        behind = 0 if index + len(page) == len(self.records) else 60000
        return {"Records": page, "NextShardIterator": str(index + len(page)), "MillisBehindLatest": behind}


@pytest.mark.parametrize(
    ("count", "expected_records", "expected_stop"),
    [
        pytest.param(3, 0, "tip", id="nothing-after-the-checkpoint"),
        pytest.param(4, 1, "records", id="one-record-after-the-checkpoint"),
    ],
)
def test_asking_for_one_record_after_a_checkpoint_takes_one_get_records(count, expected_records, expected_stop):
    # AT_SEQUENCE_NUMBER hands back the checkpoint's own record first: the call asks for one more,
    # so the leader's idle check (one record per lease) makes one call per lease, not two.
    shard = OpenShard(count)
    checkpoint = ExtendedSequenceNumber(shard.records[2]["SequenceNumber"])
    reader = GetRecordsReader(
        shard, ShardToRead("stream", "shardId-000000000007"), ReadStart(checkpoint), min_call_interval_seconds=0
    )
    batch = reader.read(ReadLimits(max_records=1))
    assert (len(batch.records), batch.stopped_by, shard.get_records_calls) == (expected_records, expected_stop, 1)


def test_a_record_without_a_partition_key_lands_with_an_empty_one():
    # Kinesis leaves PartitionKey out on a stream with the AUTO record distribution when the producer gave none.
    record = kinesis_record(SEQUENCE, b"payload")
    del record["PartitionKey"]
    (found,) = user_records([record])
    assert (found.partition_key, found.data) == ("", b"payload")


class ShardTrimmedSincePin:
    """An open shard with 24 h retention, read three days after a LATEST pin: the records of the
    first two days after the pin aged out. AT_TIMESTAMP before the trim horizon answers from it."""

    def __init__(self, records: int) -> None:
        first_kept = PIN + timedelta(days=2)
        self.records = [
            {
                "SequenceNumber": f"4965{index:052d}",
                "ApproximateArrivalTimestamp": first_kept + timedelta(minutes=index),
                "Data": b"r",
                "PartitionKey": "k",
            }
            for index in range(100, 100 + records)
        ]
        self.calls: list[str] = []

    def describe_stream_summary(self, StreamName: str) -> dict:
        self.calls.append("DescribeStreamSummary")
        return {"StreamDescriptionSummary": {"RetentionPeriodHours": 24}}

    def get_shard_iterator(self, **arguments) -> dict:
        self.calls.append(arguments["ShardIteratorType"])
        return {"ShardIterator": "0"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict:
        index = int(ShardIterator)
        page = self.records[index : index + Limit]
        return {"Records": page, "NextShardIterator": str(index + len(page)), "MillisBehindLatest": 0}


def pinned_reader(shard: ShardTrimmedSincePin, read_at: datetime) -> GetRecordsReader:
    return GetRecordsReader(
        shard,
        ShardToRead("s", "shardId-000000000000"),
        ReadStart(LATEST, latest_since=PIN),
        min_call_interval_seconds=0,
        wall_clock=read_at.timestamp,
    )


def test_the_first_record_after_a_pin_older_than_the_retention_follows_a_reported_gap():
    shard = ShardTrimmedSincePin(3)
    batch = pinned_reader(shard, PIN + timedelta(days=3)).read(ReadLimits())
    assert shard.calls[:2] == ["AT_TIMESTAMP", "DescribeStreamSummary"]
    assert len(batch.records) == 3
    assert batch.gap == RetentionGap(LATEST, shard.records[0]["SequenceNumber"], PIN + timedelta(days=2, minutes=100))


def test_a_pin_younger_than_any_retention_asks_nothing_more_and_reports_nothing():
    shard = ShardTrimmedSincePin(3)
    batch = pinned_reader(shard, PIN + timedelta(hours=23)).read(ReadLimits())
    assert shard.calls[0] == "AT_TIMESTAMP" and "DescribeStreamSummary" not in shard.calls
    assert batch.gap is None


def test_an_aged_out_pin_with_no_record_after_it_reports_nothing_yet():
    shard = ShardTrimmedSincePin(0)
    batch = pinned_reader(shard, PIN + timedelta(days=3)).read(ReadLimits())
    assert (batch.records, batch.gap) == ((), None)
