"""Bad records set aside, over every sink (`tests/support/sinks_under_test.py`): the records a decoder
rejects land exactly once in the dead-letter destination beside the output, with their batch, under
the faults the output's batches are tested under; the rest of the batch lands once; a pipeline that
fails on bad records, or whose processing fails wholesale, moves nothing. Kinesis is a shard in
memory (`devtools/memory_shard.py`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyarrow as pa
import pytest

from devtools.memory_shard import InMemoryShard
from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.retrieval.kinesis_records import KinesisRecord
from lease_core.retrieval.kpl_deaggregation import user_records
from lease_core.retrieval.polling.polling_retrieval import PollingRetrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.memory_store import InMemoryLeaseStore
from sinks.batch_sink import BatchRange, BatchSink
from sinks.dead_lettering import DeadLetteringSink, split_record
from spark_jobs.dead_letters import BadRecordPolicy, dead_letter_table
from spark_jobs.decode import Decoder, RecordContext, RejectedRecord
from spark_jobs.lease_consumer import LeaseBudget, LeaseConsumer, LeaseContext
from spark_jobs.round_report import LeaseReport, Outcome, RoundTotals, SlotReport
from tests.support.sinks_under_test import (
    APPLICATION,
    STREAM,
    SinkUnderTest,
    dead_letters,
    end_round,
    round_sink,
)
from tests.support.stores import FAST_RETRIES

SHARD = "shardId-000000000000"
SLOT = "app-worker-0"
DURATION = 10_000
START = ExtendedSequenceNumber("100")
DEAD_LETTER = "dead_letter"


def decoder_rejecting(*bad: int, leaving_out: tuple[int, ...] = ()) -> Decoder:
    """A JSON-ish decoder of the shard's "payload N" records that raises on the records numbered `bad`
    and leaves out (returns None for) those numbered `leaving_out`."""

    def decode(data: bytes, record: RecordContext) -> Mapping[str, object] | None:
        number = int(data.split()[-1])
        if number in bad:
            raise ValueError(f"malformed order {number}")
        return None if number in leaving_out else {"order": number}

    return Decoder("users.orders:decode", decode, pa.schema([pa.field("order", pa.int64())]))


def a_round(
    store: InMemoryLeaseStore,
    number: int,
    sinks: Callable[[], BatchSink],
    shard: InMemoryShard,
    decoder: Decoder,
    policy: BadRecordPolicy,
) -> LeaseReport:
    """Round `number`: attempt `number` of the slot reads the lease, then the driver publishes."""
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None
    held = HeldLease(store, lease, DURATION, claim_token=f"{SLOT}/attempt-{number}")
    assert held.claim()
    context = LeaseContext(
        store=store,
        retrieval=PollingRetrieval(shard, FAST_RETRIES, read_bytes_per_second=None),
        shards=KinesisShardSource(shard, retry_policy=FAST_RETRIES),
        sink=sinks(),
        transform_spec=None,
        transform=None,
        at_timestamp=None,
        budget=LeaseBudget(),
        decoder=decoder,
        bad_records=policy,
    )
    report = LeaseConsumer(held, STREAM, SHARD, LeaseKeyScheme(), SLOT, context).run()
    end_round(sinks(), store, number)
    return report


def owned_store(checkpoint: ExtendedSequenceNumber = START) -> InMemoryLeaseStore:
    store = InMemoryLeaseStore()
    assert store.create_lease_if_not_exists(Lease(SHARD, checkpoint=checkpoint))
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None and store.assign_lease(lease, SLOT).applied
    return store


def checkpoint(store: InMemoryLeaseStore) -> ExtendedSequenceNumber:
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None
    return lease.checkpoint


ERROR_OF_102 = (
    "decoder 'users.orders:decode': raised ValueError: malformed order 102 on record 102/0 of stream/" + SHARD
)


def test_a_rejected_record_is_set_aside_with_its_error_and_the_rest_of_its_batch_lands_once(
    sink_under_test: SinkUnderTest,
):
    under, store = sink_under_test, owned_store()
    shard = InMemoryShard(range(100, 105))

    report = a_round(store, 1, lambda: round_sink(under), shard, decoder_rejecting(102), BadRecordPolicy(DEAD_LETTER))

    assert (report.outcome, report.dead_lettered, report.records) == (Outcome.CAUGHT_UP, 1, 4)
    assert checkpoint(store) == ExtendedSequenceNumber("104")
    assert under.visible_sequence_numbers() == ["101", "103", "104"]
    (dead,) = dead_letters(under)
    assert dead[0] == "102" and "malformed order 102 on record 102/0" in dead[1]

    again = a_round(store, 2, lambda: round_sink(under), shard, decoder_rejecting(102), BadRecordPolicy(DEAD_LETTER))
    assert (again.records, again.dead_lettered) == (0, 0)
    assert under.visible_sequence_numbers() == ["101", "103", "104"] and len(dead_letters(under)) == 1


def test_records_the_decoder_leaves_out_on_purpose_are_counted_in_the_leases_report_not_dead_lettered(
    sink_under_test: SinkUnderTest,
):
    under, store = sink_under_test, owned_store()
    decoder = decoder_rejecting(102, leaving_out=(101, 103))

    report = a_round(
        store, 1, lambda: round_sink(under), InMemoryShard(range(100, 105)), decoder, BadRecordPolicy(DEAD_LETTER)
    )

    assert (report.outcome, report.records, report.dead_lettered, report.left_out) == (Outcome.CAUGHT_UP, 4, 1, 2)
    assert under.visible_sequence_numbers() == ["104"] and len(dead_letters(under)) == 1
    assert RoundTotals.of([SlotReport(SLOT, 1, 0.0, -1, (report,))]).left_out == 2


def test_a_dead_letter_keeps_the_record_as_it_arrived_and_the_batch_it_came_from(sink_under_test: SinkUnderTest):
    under, store = sink_under_test, owned_store()
    a_round(
        store,
        1,
        lambda: round_sink(under),
        InMemoryShard(range(100, 104)),
        decoder_rejecting(103),
        BadRecordPolicy(DEAD_LETTER),
    )

    (row,) = under.dead_letter_rows()
    assert {
        key: row[key]
        for key in (
            "stream_name",
            "shard_id",
            "sequence_number",
            "sub_sequence_number",
            "partition_key",
            "data",
            "processing",
            "lease_key",
            "batch_start",
            "batch_end",
        )
    } == {
        "stream_name": STREAM,
        "shard_id": SHARD,
        "sequence_number": "103",
        "sub_sequence_number": 0,
        "partition_key": "key-103",
        "data": b"payload 103",
        "processing": "users.orders:decode",
        "lease_key": SHARD,
        "batch_start": "100",
        "batch_end": "103",
    }
    assert row["approximate_arrival_timestamp"] is not None


def test_a_pipeline_that_fails_on_bad_records_moves_nothing_and_names_the_record(sink_under_test: SinkUnderTest):
    under, store = sink_under_test, owned_store()

    report = a_round(
        store,
        1,
        lambda: round_sink(under, dead_letters=False),
        InMemoryShard(range(100, 104)),
        decoder_rejecting(102),
        BadRecordPolicy(),
    )

    assert report.outcome == Outcome.FAILED and report.retryable is False
    assert report.detail == ERROR_OF_102
    assert checkpoint(store) == START, "the batch stays prepared for the next attempt, at its checkpoint"
    assert under.visible_sequence_numbers() == [] and dead_letters(under) == []


@pytest.mark.parametrize(
    ("bad", "share", "fails"),
    [
        (range(101, 111), 0.1, True),  # 10 of 20 rejected: the processing fails
        (range(101, 110), 0.1, False),  # 9 of 20: fewer than 10 are never taken for a wholesale failure
        (range(101, 111), 0.5, False),  # 10 of 20 is not more than half
    ],
    ids=["over the share", "too few to be wholesale", "within a larger share"],
)
def test_a_batch_whose_processing_fails_wholesale_still_fails_its_lease(sink_under_test, bad, share, fails):
    under, store = sink_under_test, owned_store()
    shard = InMemoryShard(range(100, 121))

    report = a_round(
        store, 1, lambda: round_sink(under), shard, decoder_rejecting(*bad), BadRecordPolicy(DEAD_LETTER, share)
    )

    if fails:
        assert report.outcome == Outcome.FAILED and "rejected 10 of a batch's 20 records" in (report.detail or "")
        assert checkpoint(store) == START and under.visible_sequence_numbers() == [] and dead_letters(under) == []
    else:
        assert report.outcome == Outcome.CAUGHT_UP and report.dead_lettered == len(bad)
        assert len(under.visible_sequence_numbers()) + len(dead_letters(under)) == 20


def test_dead_letters_are_visible_before_the_output_and_a_round_cut_between_them_lands_each_once(
    sink_under_test: SinkUnderTest,
):
    """The output cannot be made visible all round (an S3 503 on every promotion, a catalog that cannot
    commit), while the dead-letter destination can: the dead letters are visible, the output waits,
    and the next round makes the output visible without setting any record aside twice."""
    under, store = sink_under_test, owned_store()
    shard = InMemoryShard(range(100, 104))
    decoder, policy = decoder_rejecting(102), BadRecordPolicy(DEAD_LETTER)

    cut = a_round(store, 1, lambda: round_sink(under, output=under.visibility_failing()), shard, decoder, policy)

    assert cut.dead_lettered == 1 and checkpoint(store) == ExtendedSequenceNumber("103")
    assert under.visible_sequence_numbers() == [] and [row[0] for row in dead_letters(under)] == ["102"]
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None and round_sink(under).awaiting_visibility(lease.committed_batch) != ()

    a_round(store, 2, lambda: round_sink(under), shard, decoder, policy)

    assert under.visible_sequence_numbers() == ["101", "103"]
    assert [row[0] for row in dead_letters(under)] == ["102"]


def test_a_pipeline_that_stops_dead_lettering_still_makes_earlier_dead_letters_visible(sink_under_test):
    under, store = sink_under_test, owned_store()
    shard = InMemoryShard(range(100, 104))
    a_round(
        store,
        1,
        lambda: DeadLetteringSink(under.visibility_failing(), "", _failing_dead_letters(under), enabled=True),
        shard,
        decoder_rejecting(102),
        BadRecordPolicy(DEAD_LETTER),
    )
    assert under.visible_sequence_numbers() == [] and dead_letters(under) == []

    a_round(store, 2, lambda: round_sink(under, dead_letters=False), shard, decoder_rejecting(), BadRecordPolicy())

    assert under.visible_sequence_numbers() == ["101", "103"]
    assert [row[0] for row in dead_letters(under)] == ["102"]


def _failing_dead_letters(under: SinkUnderTest) -> Callable[[], BatchSink]:
    """The dead-letter destination while making its batches visible fails (as `visibility_failing`)."""
    return under.dead_letters_visibility_failing


def test_a_redo_of_a_batch_staged_with_its_dead_letters_sets_each_aside_once(sink_under_test: SinkUnderTest):
    """(100, 103] was prepared, and staged with its dead letter, by an attempt that died before its
    commit: the redo takes both over (a dataset) or reads the range again (a table), and commits both."""
    under, store = sink_under_test, owned_store()
    shard = InMemoryShard(range(100, 104))
    sink = round_sink(under)
    assert isinstance(sink, DeadLetteringSink)
    batch = BatchRange(SHARD, STREAM, SHARD, START, ExtendedSequenceNumber("101"), ExtendedSequenceNumber("103"))
    decoded = decoder_rejecting(102).decode_batch(shard_records(shard), STREAM, SHARD)
    rejected: tuple[RejectedRecord, ...] = decoded.rejected
    token = sink.staged_token(batch, "earlier")
    sink.stage_with_dead_letters(
        batch, decoded.table, dead_letter_table(rejected, batch, "users.orders:decode", APPLICATION), "earlier"
    )
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None and split_record(token)[1], "the prepare names the dead letters' staged part"
    described = PendingBatch(START, batch.end, batch.first, sink.batch_name(batch), 3, staged=token)
    assert store.prepare_checkpoint(lease, batch.end, described.encode()).applied

    report = a_round(store, 1, lambda: round_sink(under), shard, decoder_rejecting(102), BadRecordPolicy(DEAD_LETTER))

    assert report.dead_lettered == 1 and checkpoint(store) == ExtendedSequenceNumber("103")
    assert under.visible_sequence_numbers() == ["101", "103"]
    assert [row[0] for row in dead_letters(under)] == ["102"]


def shard_records(shard: InMemoryShard) -> list[KinesisRecord]:
    return user_records([record for record in shard.records if int(record["SequenceNumber"]) > 100])
