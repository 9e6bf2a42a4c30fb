"""An Iceberg table's dead letters against the idle check, a missing staged batch, and an
operator who drops the dead-letter table."""

from __future__ import annotations

from pathlib import Path

from devtools.memory_shard import InMemoryShard
from lease_core.config.settings import ConsumerConfig
from lease_core.model.lease import HashKeyRange
from lease_core.model.sequence import SHARD_END
from lease_core.model.shards import ChildShard
from lease_core.retrieval.pending_work import find_pending_work
from lease_core.retrieval.polling.polling_retrieval import idle_check_retrieval
from lease_core.retry import RetryPolicy
from sinks.dead_lettering import DeadLetteringSink, dead_letter_uri, split_record
from sinks.table.iceberg import LeaseRecord, parse_table_uri
from spark_jobs.dead_letters import BadRecordPolicy
from spark_jobs.round_report import Outcome
from tests.contract.test_dead_letters import SHARD, _failing_dead_letters, a_round, decoder_rejecting, owned_store
from tests.support.iceberg_tables import URI
from tests.support.sinks_under_test import STREAM, IcebergUnderTest, dead_letters, end_round, round_sink

HALF = 2**127
CHILDREN = [
    ChildShard("shardId-000000000001", frozenset({SHARD}), HashKeyRange(0, HALF - 1)),
    ChildShard("shardId-000000000002", frozenset({SHARD}), HashKeyRange(HALF, 2**128 - 1)),
]


def test_a_finished_lease_whose_last_batch_waits_for_the_tables_commit_is_work_for_the_idle_check(tmp_path: Path):
    """A closed shard's last batch, with a dead letter, is committed with SHARD_END; the round's
    commit of the table fails (the catalog cannot be reached to commit). The batch and its dead letter
    wait for the next round's commit: the lease says so (`awaiting_visibility`), the cleanup keeps it,
    and the idle check takes it for work, however quiet its children are."""
    under, store = IcebergUnderTest(tmp_path), owned_store()
    shard = InMemoryShard(range(100, 104), children=CHILDREN)

    report = a_round(
        store,
        1,
        lambda: round_sink(under, output=under.visibility_failing()),
        shard,
        decoder_rejecting(102),
        BadRecordPolicy("dead_letter"),
    )

    assert report.outcome == Outcome.SHARD_END, report.detail
    finished = store.get_lease(SHARD, consistent=True)
    assert finished is not None and finished.checkpoint == SHARD_END
    awaiting = round_sink(under).awaiting_visibility(finished.committed_batch)
    assert awaiting, "the batch waits for the table's commit"
    assert under.visible_sequence_numbers() == []

    work = find_pending_work(
        [finished],
        [STREAM],
        idle_check_retrieval(None, RetryPolicy(attempts=1)),
        ConsumerConfig(application_name="app"),
        awaiting_visibility=lambda lease: round_sink(under).awaiting_visibility(lease.committed_batch),
    )

    assert not work.idle, f"idle while {awaiting} wait{'s' if len(awaiting) == 1 else ''} to be made visible"


def test_a_dead_letter_batch_found_missing_is_reported_once_and_then_no_longer_awaited(tmp_path: Path):
    """A committed batch's dead letters are staged, but their receipt is deleted before the
    dead-letter table's commit takes them (the round's commit of that table failed; then an orphan
    cleanup, a lifecycle rule). They can never be made visible, so they are no longer awaited: the
    lease's next commit leaves them out of its record, the rest lands, and no later round reports
    the same loss again or takes the lease for work because of it."""
    under, store = IcebergUnderTest(tmp_path), owned_store()
    decoder, policy = decoder_rejecting(102), BadRecordPolicy("dead_letter")
    failing_dead_letters = DeadLetteringSink(under.sink(), "", _failing_dead_letters(under), enabled=True)
    a_round(store, 1, lambda: failing_dead_letters, InMemoryShard(range(100, 104)), decoder, policy)
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None and split_record(lease.committed_batch)[1] is not None
    _remove_dead_letter_receipts(under, lease.committed_batch)

    more = InMemoryShard(range(100, 107))  # three more records arrived, none rejected
    a_round(store, 2, lambda: round_sink(under), more, decoder, policy)
    assert under.visible_sequence_numbers() == ["101", "103", "104", "105", "106"] and dead_letters(under) == []

    _, missing_again = end_round(round_sink(under), store, 3)
    lease = store.get_lease(SHARD, consistent=True)
    assert lease is not None
    assert missing_again == (), "the same lost dead letters are reported by every round"
    assert round_sink(under).awaiting_visibility(lease.committed_batch) == (), "a lost batch is awaited for ever"


def _remove_dead_letter_receipts(under: IcebergUnderTest, record: str | None) -> None:
    sink = under.dead_letter_sink()
    table = sink.table(refresh=True)
    decoded = LeaseRecord.decode(split_record(record)[1])
    assert table is not None and decoded is not None
    for entry in decoded.entries:
        table.io.delete(sink.receipt_path(table, entry.receipt))


def test_an_operator_dropping_the_dead_letter_table_does_not_stop_the_output(tmp_path: Path):
    """The dead letters are a log (docs/operating.md); once replayed, an operator drops the table to
    clear it. The lease's record still names its last dead-letter batch (the position that says it is
    visible went with the table): the output's batches become visible all the same, and the lease's
    next commit leaves the dead-letter batch out of its record."""
    under, store = IcebergUnderTest(tmp_path), owned_store()
    decoder, policy = decoder_rejecting(102), BadRecordPolicy("dead_letter")
    a_round(store, 1, lambda: round_sink(under), InMemoryShard(range(100, 104)), decoder, policy)
    assert under.visible_sequence_numbers() == ["101", "103"] and len(dead_letters(under)) == 1

    under.dead_letter_sink().catalog.drop_table(parse_table_uri(dead_letter_uri(URI)).identifier)

    a_round(store, 2, lambda: round_sink(under), InMemoryShard(range(100, 107)), decoder, policy)

    assert under.visible_sequence_numbers() == ["101", "103", "104", "105", "106"]
