"""Dead letters grouped for a replay: by the batch they came from, in shard order, each group a batch of
its lease's pseudo lease whose file name is never an original batch's."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.batch_sink import BatchRange
from sinks.parquet import batch_file_name
from spark_jobs.dead_letter_replay import dead_letter_groups, is_replay_lease, replay_lease_key
from spark_jobs.dead_letters import dead_letter_table
from spark_jobs.decode import RejectedRecord

ARRIVAL = datetime(2026, 11, 26, tzinfo=UTC)
APPLICATION = "orders-app"


def position(text: str) -> ExtendedSequenceNumber:
    number, _, sub = text.partition("/")
    return ExtendedSequenceNumber(number, int(sub or 0))


def dead_letters(
    lease: str,
    start: str,
    end: str,
    *positions: str,
    stream: str = "orders",
    application: str = APPLICATION,
    incarnation: tuple[str, int] | None = None,
) -> list[dict]:
    """The rows a reader of the destination finds for the dead letters at `positions` of the batch
    (start, end] of `lease` (on shard "shard-1"), as a round sets them aside."""
    batch = BatchRange(lease, stream, "shard-1", position(start), None, position(end))
    records = [
        KinesisRecord(p.sequence_number, p.sub_sequence_number, "key", ARRIVAL, b"x") for p in map(position, positions)
    ]
    rejected = [RejectedRecord(record, "bad") for record in records]
    table = dead_letter_table(rejected, batch, "users:decode", application, incarnation)
    return [{**row, "stream_name": stream, "shard_id": "shard-1"} for row in table.to_pylist()]


def read_back(*batches: list[dict]) -> pa.Table:
    """The rows of every batch, in no particular order (as a dataset's files or a table's scan give them)."""
    rows = [row for batch in batches for row in batch]
    random.Random(7).shuffle(rows)
    return pa.Table.from_pylist(rows)


def test_dead_letters_are_grouped_by_their_batch_and_ordered_by_position_within_each_lease():
    groups = dead_letter_groups(
        read_back(
            dead_letters("shard-1", "200", "300", "250/1", "250", "210"),
            dead_letters("shard-1", "TRIM_HORIZON", "200", "150"),
            dead_letters("shard-0", "TRIM_HORIZON", "90", "90"),
        ),
        APPLICATION,
    )

    assert list(groups) == ["shard-0", "shard-1"]
    assert [(g.batch_start, g.batch_end, [str(r.position) for r in g.records]) for g in groups["shard-1"]] == [
        ("TRIM_HORIZON", "200", ["150"]),
        ("200", "300", ["210", "250", "250/1"]),
    ]


def test_only_the_stream_asked_for_is_grouped():
    orders = dead_letters("a:orders:1:shard-1", "1", "9", "5", stream="orders")
    clicks = dead_letters("a:clicks:1:shard-1", "1", "9", "5", stream="clicks")

    groups = dead_letter_groups(read_back(orders, clicks), APPLICATION, stream="clicks")

    assert list(groups) == ["a:clicks:1:shard-1"]


@pytest.mark.parametrize(
    ("start", "end", "positions"),
    [
        pytest.param("100", "105", ("105",), id="its-last-record-alone"),
        pytest.param("100", "105", ("101",), id="its-first-record-alone"),
        pytest.param("100", "105", ("101", "105"), id="its-first-through-its-last-record"),
        pytest.param("TRIM_HORIZON", "105", ("7", "105"), id="a-first-batch"),
        pytest.param("100/2", "100/5", ("100/3", "100/5"), id="inside-a-kpl-aggregate"),
    ],
)
def test_a_group_lands_as_a_batch_of_its_pseudo_lease_named_apart_from_the_original_batches(start, end, positions):
    (group,) = dead_letter_groups(read_back(dead_letters("shard-1", start, end, *positions)), APPLICATION)["shard-1"]

    batch = group.batch

    assert batch.lease_key == replay_lease_key("shard-1") and is_replay_lease(batch.lease_key)
    first, last = position(positions[0]), position(positions[-1])
    assert (batch.start, batch.first, batch.end) == (first, first, last)
    # The original batches of the shard around it: its own, the one before and the one after.
    originals = [(position(start), position(end)), (TRIM_HORIZON, position(start)), (position(end), position("999"))]
    assert batch_file_name(batch.start, batch.end) not in {batch_file_name(*range_) for range_ in originals}


def test_no_lease_of_a_lease_table_is_taken_for_a_pseudo_lease():
    assert not is_replay_lease("shardId-000000000001")
    assert not is_replay_lease("123456789012:orders:1764000000:shardId-000000000001")


def test_a_replay_takes_only_its_own_applications_dead_letters_from_a_shared_destination():
    ours = dead_letters("shard-1", "1", "9", "5")
    theirs = dead_letters("shard-1", "1", "9", "5", application="payments-app")

    groups = dead_letter_groups(read_back(ours, theirs), APPLICATION)

    assert [len(group.records) for group in groups["shard-1"]] == [1]


def test_each_incarnation_of_a_stream_replays_as_a_pseudo_lease_of_its_own():
    former = dead_letters("shard-1", "500", "505", "503", incarnation=("arn:old", 1_764_000_000))
    current = dead_letters("shard-1", "100", "105", "102", incarnation=("arn:new", 1_765_000_000))

    groups = dead_letter_groups(read_back(former, current), APPLICATION)

    assert sorted(groups) == ["shard-1 (stream created 1764000000)", "shard-1 (stream created 1765000000)"]
    keys = {group.batch.lease_key for groups_of_lease in groups.values() for group in groups_of_lease}
    assert keys == {replay_lease_key("shard-1", 1_764_000_000), replay_lease_key("shard-1", 1_765_000_000)}
    assert all(is_replay_lease(key) for key in keys)
