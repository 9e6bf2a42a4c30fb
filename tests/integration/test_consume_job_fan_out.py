"""The consume job reading by enhanced fan-out (`retrieval = fan_out`), on the Kinesis stand-in (the one
Kinesis here that boto3 can subscribe to) and moto: a closed parent reaches SHARD_END and its children
land in the same round; rounds that alternate between polling and fan-out, each cut by a per-lease
budget (inside KPL aggregates too), land every user record exactly once; a consumer deregistered
before the round is a clear error of the leases that needed it, and the round moves nothing. The
consumer is registered as the DAG's table step registers it (`StreamConsumers.ensure`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.kinesis_standin import ACCOUNT, REGION, FanOutLimits, KinesisStandIn, Limits, StreamSpec, shard_id_of
from devtools.stream_records import StreamRecord
from lease_core.application import LeaseApplication
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader
from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead
from spark_jobs.lease_consumer import LeaseBudget
from spark_jobs.round_report import Outcome, RoundReport
from tests.support.pipeline import ConsumerPipeline, duplicates

# Quick heartbeats (the tip of an open shard is an event, not a timeout), Kinesis' 5 s in-use rule,
# consumers ACTIVE at once.
FAN_OUT = FanOutLimits(heartbeat_seconds=0.2, activation_seconds=0, deletion_seconds=0)


def stream_arn(stream: str) -> str:
    return f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{stream}"


def stream_content(client: Any, spec: StreamSpec) -> list[StreamRecord]:
    """Every user record of the stream's shards (children included), as polling reads them."""
    shards = [entry["ShardId"] for entry in client.list_shards(StreamName=spec.name)["Shards"]]
    content = []
    for shard in shards:
        reader = GetRecordsReader(
            client,
            ShardToRead(spec.name, shard),
            ReadStart(TRIM_HORIZON),
            min_call_interval_seconds=0,
            read_bytes_per_second=None,
        )
        while True:
            batch = reader.read(ReadLimits())
            content.extend(
                StreamRecord(shard, record.sequence_number, record.sub_sequence_number, record.data)
                for record in batch.records
            )
            if batch.stopped_by in ("tip", "shard_end", "no_shard_end"):
                break
    return content


@pytest.fixture
def application(
    unique_name: str, moto_endpoint: str, tmp_path: Path
) -> Iterator[tuple[ConsumerPipeline, KinesisStandIn, StreamSpec]]:
    # The stream has the application's name, as pipelines of the other tests do; the lineage: a
    # closed parent of KPL aggregates with two open children.
    spec = StreamSpec(unique_name, shards=1, records_per_shard=20, record_bytes=120, aggregate_size=4, split=True)
    with KinesisStandIn([spec], Limits.off(), FAN_OUT) as standin:
        pipeline = ConsumerPipeline(
            unique_name,
            (unique_name,),
            standin.endpoint,
            moto_endpoint,
            str(tmp_path / "lake"),
            settings={"initial_position_in_stream": "TRIM_HORIZON", "retrieval": "fan_out"},
        )
        LeaseApplication(pipeline.config).stream_consumers.ensure(unique_name)  # as the DAG's table step does
        yield pipeline, standin, spec


def outcomes(report: RoundReport) -> dict[str, str]:
    return {lease.shard_id: lease.outcome for slot in report.slots for lease in slot.leases}


def test_a_fan_out_round_ends_a_closed_parent_and_lands_its_children_in_the_same_round(spark, application):
    pipeline, standin, spec = application
    report = pipeline.round(spark, workers=2)
    served = standin.stats()
    assert report.succeeded, report.summary()
    parent, children = shard_id_of(0), (shard_id_of(1), shard_id_of(2))
    assert outcomes(report) == {
        parent: Outcome.SHARD_END,
        children[0]: Outcome.CAUGHT_UP,
        children[1]: Outcome.CAUGHT_UP,
    }
    landed = pipeline.landed()
    assert not duplicates(landed)
    assert Counter(landed) == Counter(stream_content(pipeline.kinesis, spec))
    leases = [lease for slot in report.slots for lease in slot.leases]
    assert sum(lease.refused_read_calls for lease in leases) == 0
    assert all(lease.read_calls == 1 for lease in leases)  # one subscription per lease, no GetRecords
    assert not any(served["fan_out"]["violations"].values()), served["fan_out"]["violations"]
    assert served["get_records"] == 0  # the round's sync and assignment list shards; only subscriptions read


def test_rounds_alternating_polling_and_fan_out_land_every_record_exactly_once(spark, application):
    pipeline, _, spec = application
    expected = stream_content(pipeline.kinesis, spec)
    modes = []
    # 45 user records per lease and round: every cut falls inside a KPL aggregate of 4.
    while len(pipeline.landed()) < len(expected):
        assert len(modes) < 10, f"{len(pipeline.landed())} of {len(expected)} landed after {modes}"
        mode = ("polling", "fan_out")[len(modes) % 2]
        pipeline.config = pipeline.config.with_overrides(retrieval=mode)
        report = pipeline.round(spark, workers=2, budget=LeaseBudget(max_records=45, file_max_records=10))
        assert report.succeeded, report.summary()
        modes.append(mode)
    # A fan-out round resumes the parent's cut of a polling round; the next polling round, the children's cuts.
    assert modes == ["polling", "fan_out", "polling"]
    landed = pipeline.landed()
    assert not duplicates(landed)
    assert Counter(landed) == Counter(expected)
    assert all(lease.pending_checkpoint is None for lease in pipeline.leases().values())


def test_a_prepared_batch_is_redone_by_subscription_and_the_round_reads_on_with_the_same_one(spark, application):
    pipeline, standin, spec = application
    expected = stream_content(pipeline.kinesis, spec)
    pipeline.config = pipeline.config.with_overrides(retrieval="polling")
    assert pipeline.round(spark, workers=1, budget=LeaseBudget(max_records=10)).succeeded
    (lease,) = pipeline.leases().values()
    parent = sorted((record for record in expected if record.shard_id == lease.lease_key), key=_position)
    # A batch prepared by an attempt that died before its commit (no description: KCL's form).
    prepared = parent[30]
    end = ExtendedSequenceNumber(prepared.sequence_number, prepared.sub_sequence_number)
    assert pipeline.store.update_lease(lease.with_pending_checkpoint(end, None)).applied
    pipeline.config = pipeline.config.with_overrides(retrieval="fan_out")
    report = pipeline.round(spark, workers=1)
    assert report.succeeded, report.summary()
    (redone,) = [lease for slot in report.slots for lease in slot.leases if lease.shard_id == shard_id_of(0)]
    assert redone.replayed_batches == 1 and redone.outcome == Outcome.SHARD_END
    assert (redone.read_calls, redone.refused_read_calls) == (1, 0)
    assert not any(standin.stats()["fan_out"]["violations"].values())
    landed = pipeline.landed()
    assert not duplicates(landed) and Counter(landed) == Counter(expected)


def _position(record: StreamRecord) -> tuple[int, int]:
    return int(record.sequence_number), record.sub_sequence_number


def test_a_consumer_gone_before_the_round_fails_it_at_the_driver_and_no_lease_moves(spark, application):
    pipeline, _, spec = application
    consumer = pipeline.config.stream_consumer_name
    described = pipeline.kinesis.describe_stream_consumer(StreamARN=stream_arn(spec.name), ConsumerName=consumer)
    pipeline.kinesis.deregister_stream_consumer(ConsumerARN=described["ConsumerDescription"]["ConsumerARN"])
    pipeline.sync()
    assignment = pipeline.assign(1)
    before = pipeline.leases()
    report = pipeline.consume(spark, 1, assignment.round_number)
    assert not report.succeeded and not report.slots
    (failure,) = report.slot_failures
    assert consumer in failure and "no longer exists" in failure
    assert pipeline.leases() == before  # not claimed, not read, not checkpointed
    assert pipeline.landed() == []


def test_the_slots_subscribe_with_the_consumer_the_driver_looked_up(spark, application):
    pipeline, standin, _ = application
    described = standin.stats()["operations"].get("DescribeStreamConsumer", 0)
    report = pipeline.round(spark, workers=2)
    assert report.succeeded, report.summary()
    # One DescribeStreamConsumer, the driver's; none by the slots' three leases.
    assert standin.stats()["operations"].get("DescribeStreamConsumer", 0) == described + 1
