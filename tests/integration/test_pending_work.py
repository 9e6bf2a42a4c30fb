"""The leader's idle check over leases it already holds, against kinesis-mock: which lease needs the
round and why, one GetRecords per caught-up lease, a stop at the first lease with work, and leases of
streams the round does not consume left alone."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from devtools.kinesis_standin import SHARD_ENDS, KinesisStandIn, Limits, StreamSpec, shard_id_of
from devtools.kinesis_streams import create_stream, kinesis_client, put_entries, shards_of
from lease_core.config.settings import ConsumerConfig
from lease_core.model.lease import AgedOutRange, Lease, StreamIdentifier
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.retrieval.kinesis_records import KinesisRecord
from lease_core.retrieval.pending_work import PendingWork, find_pending_work
from lease_core.retrieval.polling.polling_retrieval import idle_check_retrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.retry import RetryPolicy
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.store.memory_store import InMemoryLeaseStore
from lease_core.sync.step import sync_streams
from sinks.batch_sink import BatchRange, Visibility
from sinks.parquet import ParquetSink
from sinks.record_columns import records_table
from tests.support.faults import FaultInjectingClient, client_error

CONFIG = ConsumerConfig(application_name="pending-work-test", initial_position_in_stream="TRIM_HORIZON")
ARRIVAL = datetime(2026, 11, 1, tzinfo=UTC)


def counting(client: Any) -> FaultInjectingClient:
    """kinesis-mock's client, counting its calls (`calls`) and changing none."""
    return FaultInjectingClient(client, lambda name, number: None)


@pytest.fixture()
def caught_up(kinesis_endpoint: str, unique_name: str) -> tuple[str, list[Lease]]:
    """A stream of 4 shards with one record each, and a lease per shard checkpointed at that record."""
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, unique_name, 4)
    entries = [
        {"Data": b"r", "PartitionKey": shard.shard_id, "ExplicitHashKey": str(shard.hash_key_range.starting_hash_key)}
        for shard in shards_of(client, unique_name)
    ]
    written = {result["ShardId"]: result["SequenceNumber"] for _, result in put_entries(client, unique_name, entries)}
    leases = [Lease(shard, checkpoint=ExtendedSequenceNumber(number)) for shard, number in sorted(written.items())]
    return unique_name, leases


def check(kinesis: Any, stream: str, leases: list[Lease]) -> PendingWork:
    return find_pending_work(leases, [stream], idle_check_retrieval(kinesis, RetryPolicy(attempts=2)), CONFIG)


def test_caught_up_leases_are_idle_after_one_get_records_each(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    kinesis = counting(kinesis_client(kinesis_endpoint))
    work = check(kinesis, stream, [*leases, Lease("shardId-000000000009", checkpoint=SHARD_END)])
    assert (work.idle, work.open_leases) == (True, 4)
    assert (kinesis.calls.get("get_shard_iterator"), kinesis.calls.get("get_records")) == (4, 4)


def test_a_record_after_a_checkpoint_is_work(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    behind = Lease(leases[2].lease_key, checkpoint=TRIM_HORIZON)
    work = check(kinesis_client(kinesis_endpoint), stream, [*leases[:2], behind, leases[3]])
    assert (work.idle, work.lease_key, work.reason) == (False, behind.lease_key, "records after its checkpoint")


@pytest.mark.parametrize(
    ("lease", "reason"),
    [
        pytest.param(
            Lease("shardId-000000000000", checkpoint=TRIM_HORIZON, pending_checkpoint=ExtendedSequenceNumber("1")),
            "a prepared batch waits to be committed",
            id="prepared-batch",
        ),
        pytest.param(
            Lease("shardId-000000000000", checkpoint=LATEST),
            "at LATEST with no pin: the first round that claims it pins where it reads from",
            id="latest-not-pinned-yet",
        ),
        pytest.param(
            Lease("shardId-000000000000", checkpoint=SHARD_END, unreported_losses=frozenset({AgedOutRange("5")})),
            "retention losses wait to be reported",
            id="unreported-losses",
        ),
    ],
)
def test_work_the_lease_item_shows_is_found_without_a_call(kinesis_endpoint, caught_up, lease, reason):
    stream, leases = caught_up
    kinesis = counting(kinesis_client(kinesis_endpoint))
    work = check(kinesis, stream, [*leases, lease])
    assert (work.lease_key, work.reason, sum(kinesis.calls.values())) == (lease.lease_key, reason, 0)


def test_the_check_stops_at_the_first_lease_with_work(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    first = Lease(leases[0].lease_key, checkpoint=TRIM_HORIZON)
    # Many caught-up leases behind it (the same shards again): their calls are never made.
    behind = [lease for _ in range(50) for lease in leases[1:]]
    kinesis = counting(kinesis_client(kinesis_endpoint))
    retrieval = idle_check_retrieval(kinesis, RetryPolicy(attempts=2))
    work = find_pending_work([first, *behind], [stream], retrieval, CONFIG, threads=2)
    assert work.lease_key == first.lease_key
    assert kinesis.calls.get("get_records", 0) <= 4, kinesis.calls


def test_leases_of_a_stream_the_round_does_not_consume_are_left_alone(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    here = StreamIdentifier("123456789012", stream, 1)
    former = StreamIdentifier("123456789012", f"{stream}-deleted", 1)
    multi = [
        Lease(
            f"{here.serialize()}:{lease.lease_key}",
            lease.checkpoint,
            stream_name=here.serialize(),
            shard_id=lease.lease_key,
        )
        for lease in leases
    ]
    gone = Lease(
        f"{former.serialize()}:shardId-000000000000",
        TRIM_HORIZON,
        stream_name=former.serialize(),
        shard_id="shardId-000000000000",
    )
    work = check(kinesis_client(kinesis_endpoint), stream, [*multi, gone])
    assert (work.idle, work.open_leases) == (True, 4)


@pytest.mark.parametrize(
    "value",
    [None, {}, {"open_leases": "4"}, "idle"],
    ids=["none", "empty", "count-as-text", "a-word"],
)
def test_an_answer_that_is_not_the_checks_is_refused_naming_its_source(value):
    with pytest.raises(ValueError, match="the sync's XCom"):
        PendingWork.from_dict(value, "the sync's XCom")


def test_an_answer_survives_its_round_trip():
    for work in (PendingWork(3), PendingWork(3, "shardId-000000000001", "records after its checkpoint")):
        assert PendingWork.from_dict(work.to_dict(), "XCom") == work


def test_a_lease_the_check_cannot_read_is_work_for_the_round_not_a_failed_sync(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    gone = Lease("shardId-000000000099", checkpoint=TRIM_HORIZON)  # its shard aged out since the listing
    work = check(kinesis_client(kinesis_endpoint), stream, [*leases, gone])
    assert work.lease_key == gone.lease_key and work.reason.startswith("it could not be read here")


def test_a_lease_at_timestamp_without_a_timestamp_is_work_for_the_round(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    timed = Lease(leases[0].lease_key, checkpoint=AT_TIMESTAMP)
    work = check(kinesis_client(kinesis_endpoint), stream, [timed])
    assert (work.lease_key, work.reason) == (
        timed.lease_key,
        "it starts AT_TIMESTAMP, and the round has no initial_position_timestamp to read it from",
    )


def test_a_lease_whose_stream_name_is_not_a_stream_identifier_is_not_the_rounds(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    odd = Lease(
        "odd:shardId-000000000000", TRIM_HORIZON, stream_name="not-an-identifier", shard_id="shardId-000000000000"
    )
    assert check(kinesis_client(kinesis_endpoint), stream, [*leases, odd]).idle


# --- what the check must never take for idle (issue: the ends of shards and of rounds) -----------------


@pytest.mark.parametrize("shard_end", SHARD_ENDS)
def test_a_closed_shard_whose_lease_sits_at_its_last_record_is_work_until_it_reaches_shard_end(shard_end):
    """Real Kinesis may answer a closed shard's last record with a next iterator and MillisBehindLatest
    0: read with a limit of one record, the lease would look caught up for ever, its children never
    created. The sync's listing says the shard is closed, and that is enough."""
    stream = StreamSpec("closed", shards=1, records_per_shard=5, split=True, shard_end=shard_end)
    with KinesisStandIn([stream], Limits.off()) as standin:
        client = standin.client()
        last = client.get_records(
            ShardIterator=client.get_shard_iterator(
                StreamName="closed", ShardId=shard_id_of(0), ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
        )["Records"][-1]["SequenceNumber"]
        store = InMemoryLeaseStore()
        parent = Lease(shard_id_of(0), checkpoint=ExtendedSequenceNumber(last))
        assert store.create_lease_if_not_exists(parent)
        report = sync_streams(["closed"], CONFIG, store, KinesisShardSource(client), InMemoryCoordinatorStateStore())
        work = find_pending_work(
            report.leases,
            ["closed"],
            idle_check_retrieval(client, RetryPolicy(attempts=2)),
            CONFIG,
            closed_lease_keys=report.closed_lease_keys,
        )
    assert report.closed_lease_keys == {parent.lease_key}
    assert (work.lease_key, work.reason) == (
        parent.lease_key,
        "its shard is closed and the lease has not reached SHARD_END",
    )


def test_a_lease_whose_every_get_records_is_throttled_is_work_and_the_answer_says_why(kinesis_endpoint, caught_up):
    stream, leases = caught_up
    behind = Lease(leases[1].lease_key, checkpoint=TRIM_HORIZON)  # records wait, and the other readers of its shard
    throttling = FaultInjectingClient(
        kinesis_client(kinesis_endpoint),
        lambda name, number: (
            client_error("ProvisionedThroughputExceededException", "GetRecords") if name == "get_records" else None
        ),
    )
    retrieval = idle_check_retrieval(throttling, RetryPolicy(attempts=2, base_millis=1))
    work = find_pending_work([behind], [stream], retrieval, CONFIG)
    assert (work.idle, work.lease_key) == (False, behind.lease_key)
    assert work.reason == (
        "it could not be read here: all 2 GetRecords were throttled (the shard's read limits are shared with its "
        "other consumers)"
    )


@pytest.mark.parametrize(
    ("staged", "visible", "expected"),
    [
        pytest.param(True, False, "committed batches are not visible yet: {batch}", id="left-staged"),
        pytest.param(False, True, None, id="promoted"),
        pytest.param(False, False, None, id="deleted-since-no-round-can-bring-it-back"),
    ],
)
def test_a_committed_batch_readers_cannot_see_yet_is_work_while_the_stream_is_quiet(
    kinesis_endpoint, caught_up, tmp_path, staged, visible, expected
):
    stream, leases = caught_up
    sink = ParquetSink.from_uri(str(tmp_path / "lake"))
    lease = leases[0]
    batch = BatchRange(lease.lease_key, stream, lease.lease_key, ExtendedSequenceNumber("1"), None, lease.checkpoint)
    record = sink.staged_token(batch, "worker-0/attempt-0/1")
    rows = records_table([KinesisRecord(lease.checkpoint.sequence_number, 0, "k", ARRIVAL, b"r")])
    if staged:
        sink.stage(batch, rows, "worker-0/attempt-0/1")
    if visible:
        assert sink.make_visible(sink.stage(batch, rows, "an earlier attempt").token) is Visibility.VISIBLE
    committed = dataclasses.replace(lease, committed_batch=record)
    work = find_pending_work(
        [committed, *leases[1:]],
        [stream],
        idle_check_retrieval(kinesis_client(kinesis_endpoint), RetryPolicy(attempts=2)),
        CONFIG,
        awaiting_visibility=lambda checked: sink.awaiting_visibility(checked.committed_batch),
    )
    assert work.reason == (None if expected is None else expected.format(batch=sink.batch_name(batch)))
