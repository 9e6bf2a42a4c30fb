"""The consume job on a real local SparkSession against kinesis-mock and moto: every record produced
lands exactly once, in shard order, parents before children, through rounds, reshards, crashes,
zombies, injected faults, KPL aggregation and retention loss."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.fault_proxy import FaultProxy, FaultRule
from devtools.kinesis_streams import create_stream, merge_shards, shards_of, split_shard
from devtools.stream_records import StreamRecord
from lease_core.errors import LeadershipUnavailableError
from lease_core.leader.assignment_round import slot_ids
from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON
from spark_jobs.consume_job import HandedOverLock, concurrent_task_slots, run_round, with_round_start
from spark_jobs.lease_consumer import LeaseBudget
from spark_jobs.round_report import Outcome, RoundReport
from spark_jobs.slot_task import SlotTask
from tests.support.consume_job_process import submit_consume_job
from tests.support.kpl import put_aggregate
from tests.support.pipeline import ConsumerPipeline, duplicates, file_order, pipeline_on_new_stream
from tests.support.shard_ends import KinesisShardEnds
from tests.support.stores import table_names

STEER = "tests.support.spark_transforms:steer"


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    return pipeline_on_new_stream(
        unique_name,
        4,
        kinesis_endpoint,
        moto_endpoint,
        tmp_path,
        initial_position_in_stream="TRIM_HORIZON",
        failover_time_millis=6000,
    )


@pytest.fixture
def resharding_pipeline(pipeline: ConsumerPipeline, shard_ends: KinesisShardEnds) -> Iterator[ConsumerPipeline]:
    """The pipeline with its slots reading closed shards ended both ways (`shard_ends`)."""
    pipeline.data_plane_kinesis = shard_ends.endpoint
    yield pipeline
    if shard_ends.proxy is not None:
        assert shard_ends.late_ends_answered() > 0, "no closed shard was read to its end"


def kinesis_client_for(endpoint: str):
    from devtools.kinesis_streams import kinesis_client

    return kinesis_client(endpoint)


class BackgroundRound:
    """A consume round run on a thread, so that the test can act while its slots work."""

    def __init__(self, run: Callable[[], RoundReport]) -> None:
        self._reports: list[RoundReport] = []
        self._thread = threading.Thread(target=lambda: self._reports.append(run()))
        self._thread.start()

    def join(self, timeout: float) -> RoundReport:
        """The round's report, once it ended within `timeout` seconds (the test fails otherwise)."""
        self._thread.join(timeout)
        assert self._reports, f"the round did not end within {timeout:.0f} s"
        return self._reports[0]


def assert_exactly_once(pipeline: ConsumerPipeline) -> None:
    """Every record produced landed once, as the sink's own library reads it, and an Iceberg or Delta
    table holds each once as an analyst reads it too, with DuckDB."""
    landed = pipeline.landed()
    assert duplicates(landed) == []
    assert sorted(landed, key=_order) == sorted(pipeline.produced, key=_order)
    table = pipeline.analyst_table()
    if table is not None:
        read = table.identities()
        assert {stream for stream, *_ in read} <= set(pipeline.streams)
        as_read = sorted(_key(shard, sequence, sub) for _, shard, sequence, sub in read)
        assert as_read == sorted(map(_order, pipeline.produced))
        assert table.count() == len(pipeline.produced)


def _order(record: StreamRecord) -> tuple[str, int, int]:
    return _key(record.shard_id, record.sequence_number, record.sub_sequence_number)


def _key(shard_id: str, sequence_number: str, sub_sequence_number: int) -> tuple[str, int, int]:
    return (shard_id, int(sequence_number), sub_sequence_number)


def control(control_dir: Path, instruction: str, pipeline: ConsumerPipeline, shard_id: str) -> Path:
    return control_dir / f"{instruction}-{pipeline.streams[0]}-{shard_id}"


def test_several_rounds_land_every_record_exactly_once(spark, pipeline):
    for produced in (400, 250, 0, 300):
        pipeline.produce(produced, hot_keys=3)
        report = pipeline.round(spark, workers=2)
        assert report.succeeded, report.summary()
    assert_exactly_once(pipeline)
    assert sum(report.totals.records for report in pipeline.reports) == len(pipeline.produced)
    leases = pipeline.leases()
    assert {lease.lease_owner for lease in leases.values()} <= set(slot_ids(pipeline.application_name, 2))
    assert all(lease.pending_checkpoint is None for lease in leases.values())


def test_in_kcl_3_5_s_single_table_layout_rounds_land_every_record_exactly_once_with_one_table(
    spark, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    pipeline = pipeline_on_new_stream(
        unique_name,
        3,
        kinesis_endpoint,
        moto_endpoint,
        tmp_path,
        initial_position_in_stream="TRIM_HORIZON",
        lease_table_layout="single",
    )
    for produced in (300, 200):
        pipeline.produce(produced, hot_keys=2)
        report = pipeline.round(spark, workers=2)
        assert report.succeeded, report.summary()
    assert_exactly_once(pipeline)
    tables = table_names(pipeline.dynamodb)
    assert [name for name in tables if name.startswith(unique_name)] == [unique_name]
    items = pipeline.dynamodb.scan(TableName=unique_name, ConsistentRead=True)["Items"]
    kinds = {item["leaseKey"]["S"]: item.get("entityType", {}).get("S") for item in items}
    assert {kinds[slot] for slot in slot_ids(unique_name, 2)} == {"WORKER_METRIC_STATS"}
    assert kinds["AssignmentRound"] == "LEADER"
    assert len(pipeline.leases()) == 3


def test_the_round_report_and_the_tables_carry_what_the_next_assignment_needs(spark, pipeline):
    pipeline.produce(300, hot_keys=2)
    report = pipeline.round(spark, workers=2)
    assert report.totals.records == 300
    assert {slot.worker_id for slot in report.slots} == set(slot_ids(pipeline.application_name, 2))
    assert all(lease.outcome == Outcome.CAUGHT_UP for slot in report.slots for lease in slot.leases)
    assert all(lease.throughput_kbps is not None and lease.throughput_kbps > 0 for lease in pipeline.leases().values())
    metrics = {stats.worker_id: stats for stats in pipeline.metrics.list_all()}
    assert set(metrics) == set(slot_ids(pipeline.application_name, 2))
    assert all(stats.round == report.round_number for stats in metrics.values())
    assert "records" in report.summary() and pipeline.application_name in report.summary()


def test_per_lease_limits_leave_the_rest_for_the_next_round(spark, pipeline):
    pipeline.produce(600)
    first = pipeline.round(spark, workers=1, budget=LeaseBudget(max_records=50, file_max_records=20))
    assert {lease.outcome for slot in first.slots for lease in slot.leases} == {Outcome.LIMIT}
    assert all(lease.records == 50 and lease.files == 3 for slot in first.slots for lease in slot.leases)
    for _ in range(20):
        report = pipeline.round(spark, workers=1, budget=LeaseBudget(max_records=100))
        if all(lease.outcome == Outcome.CAUGHT_UP for slot in report.slots for lease in slot.leases):
            break
    assert_exactly_once(pipeline)


def test_a_split_and_a_merge_between_rounds_keep_parents_before_children(spark, resharding_pipeline, tmp_path):
    pipeline = resharding_pipeline
    kinesis = pipeline.kinesis
    pipeline.produce(200)
    pipeline.round(spark, workers=2)
    shards = sorted({record.shard_id for record in pipeline.produced})
    split_shard(kinesis, pipeline.streams[0], shards[0])
    merge_shards(kinesis, pipeline.streams[0], shards[2], shards[3])
    pipeline.produce(300)
    for _ in range(4):
        pipeline.round(spark, workers=2)
    pipeline.produce(100)
    pipeline.round(spark, workers=2)
    assert_exactly_once(pipeline)
    leases = pipeline.leases()
    for parent in (shards[0], shards[2], shards[3]):
        assert parent not in leases or leases[parent].checkpoint == SHARD_END
    published = file_order(tmp_path / "lake" / f"stream_name={pipeline.streams[0]}")
    children = {shard: lease for shard, lease in leases.items() if lease.parent_shard_ids}
    assert len(children) == 3
    for child, lease in children.items():
        for parent in lease.parent_shard_ids:
            if child in published and parent in published:
                assert published[parent][1] <= published[child][0], f"{child} landed before its parent {parent}"


@pytest.mark.parametrize("reshard", ["split", "merge"])
def test_a_reshard_during_a_round_ends_the_parent_and_its_children_follow(spark, pipeline, spark_control_dir, reshard):
    pipeline.produce(200)
    pipeline.sync()
    assignment = pipeline.assign(2)
    shards = sorted({record.shard_id for record in pipeline.produced})
    parent = shards[1]
    control(spark_control_dir, "block", pipeline, parent).touch()
    # Small files: the parent's first batch blocks in the transform, and reading goes on after the reshard.
    small_files = LeaseBudget(file_max_records=10)
    job = BackgroundRound(
        lambda: pipeline.consume(spark, 2, assignment.round_number, transform=STEER, budget=small_files)
    )
    wait_for(control(spark_control_dir, "blocked", pipeline, parent))
    if reshard == "split":
        children = set(split_shard(pipeline.kinesis, pipeline.streams[0], parent))
    else:
        children = {merge_shards(pipeline.kinesis, pipeline.streams[0], parent, shards[2])}
    pipeline.produce(300)
    control(spark_control_dir, "release", pipeline, parent).touch()
    report = job.join(timeout=120)
    reported = [lease for slot in report.slots for lease in slot.leases]  # type: ignore[attr-defined]
    outcomes = {lease.shard_id: lease for lease in reported}
    assert outcomes[parent].outcome == Outcome.SHARD_END
    # A merge's other parent may reach its end in the same round and create the child first.
    created = {child for lease in outcomes.values() for child in lease.children_created}
    assert created == children
    # A child is read in the round its parents end, once; a merge's child waits for its other parent's end.
    every_parent_ended = reshard == "split" or outcomes[shards[2]].outcome == Outcome.SHARD_END
    assert {lease.shard_id for lease in reported} & children == (children if every_parent_ended else set())
    assert all([lease.shard_id for lease in reported].count(child) <= 1 for child in children)
    landed = pipeline.landed()
    for child in children & set(outcomes):
        assert outcomes[child].records == sum(1 for record in landed if record.shard_id == child) > 0
    for _ in range(3):
        pipeline.round(spark, workers=2)
    assert_exactly_once(pipeline)
    published = file_order(Path(pipeline.output_uri) / f"stream_name={pipeline.streams[0]}")
    for child in children & set(published):
        assert published[parent][1] <= published[child][0]


def child_held_by(pipeline: ConsumerPipeline, child: str, slot: str) -> None:
    """A child's lease as an earlier round left it: created at its parent's end, unread, then assigned."""
    (shard,) = [shard for shard in shards_of(pipeline.kinesis, pipeline.streams[0]) if shard.shard_id == child]
    assert pipeline.store.create_lease_if_not_exists(
        LeaseKeyScheme().new_lease(child, TRIM_HORIZON, shard.parent_shard_ids, shard.hash_key_range)
    )
    assert pipeline.store.assign_lease(pipeline.leases()[child], slot).applied


def _round_with_a_closing_parent(spark, pipeline, spark_control_dir, child_left_to_the_other_slot: bool):
    """A round in which worker-0 reads a split parent slowly while worker-1 runs out of work.

    With `child_left_to_the_other_slot`, the lower child's lease exists before the round and is
    worker-1's (a child an earlier round created but could not read, then assigned): worker-1
    waits for the parent another slot reads.
    """
    pipeline.produce(200)
    pipeline.sync()
    pipeline.assign(2)
    worker_0, worker_1 = slot_ids(pipeline.application_name, 2)
    parent = min(key for key, lease in pipeline.leases().items() if lease.lease_owner == worker_0)
    lower, upper = split_shard(pipeline.kinesis, pipeline.streams[0], parent)
    pipeline.produce(300)
    if child_left_to_the_other_slot:
        child_held_by(pipeline, lower, worker_1)
    assignment = pipeline.assign(2)
    for shard in (parent, lower, upper):  # a child's reader stays busy with it until the test lets go
        control(spark_control_dir, "block", pipeline, shard).touch()
    job = BackgroundRound(lambda: pipeline.consume(spark, 2, assignment.round_number, transform=STEER))
    wait_for(control(spark_control_dir, "blocked", pipeline, parent))
    time.sleep(3)  # worker-1 has read its own leases by now and waits on the parent
    control(spark_control_dir, "release", pipeline, parent).touch()
    for child in (lower, upper):  # both children are being read before either may finish
        wait_for(control(spark_control_dir, "blocked", pipeline, child))
    for child in (lower, upper):
        control(spark_control_dir, "release", pipeline, child).touch()
    report = job.join(timeout=120)
    readers = {lease.shard_id: (lease.worker_id, lease.outcome) for slot in report.slots for lease in slot.leases}
    assert readers[parent] == (worker_0, Outcome.SHARD_END)
    for _ in range(2):
        pipeline.round(spark, workers=2)
    assert_exactly_once(pipeline)
    return readers, lower, upper


def test_a_slot_out_of_work_takes_up_a_child_of_a_parent_another_slot_ends_in_the_same_round(
    spark, resharding_pipeline, spark_control_dir
):
    pipeline = resharding_pipeline
    readers, lower, upper = _round_with_a_closing_parent(spark, pipeline, spark_control_dir, False)
    # Whichever of the two gets to a child first takes it; each takes one.
    assert sorted([readers[lower], readers[upper]]) == [
        (slot, Outcome.CAUGHT_UP) for slot in slot_ids(pipeline.application_name, 2)
    ]


def test_a_slot_whose_child_waits_on_a_parent_another_slot_reads_waits_and_reads_it_in_the_same_round(
    spark, resharding_pipeline, spark_control_dir
):
    pipeline = resharding_pipeline
    readers, lower, upper = _round_with_a_closing_parent(spark, pipeline, spark_control_dir, True)
    worker_0, worker_1 = slot_ids(pipeline.application_name, 2)
    assert readers[lower] == (worker_1, Outcome.CAUGHT_UP) and readers[upper] == (worker_0, Outcome.CAUGHT_UP)


@pytest.mark.parametrize("child_holder", [0, 1], ids=["child-in-the-parents-slot", "child-in-the-other-slot"])
def test_a_child_whose_parent_stops_at_a_limit_waits_for_the_next_round_and_the_round_ends(
    spark, pipeline, child_holder
):
    pipeline.produce(200)
    pipeline.sync()
    pipeline.assign(2)
    slots = slot_ids(pipeline.application_name, 2)
    parent = min(key for key, lease in pipeline.leases().items() if lease.lease_owner == slots[0])
    lower, _ = split_shard(pipeline.kinesis, pipeline.streams[0], parent)
    child_held_by(pipeline, lower, slots[child_holder])
    round_number = pipeline.assign(2).round_number
    job = BackgroundRound(lambda: pipeline.consume(spark, 2, round_number, budget=LeaseBudget(max_records=10)))
    # A slot lets go of a parent nobody reads any more (its own, or one whose counter stood still for a
    # failover time, 6 s here): the round ends.
    report = job.join(timeout=120)  # fails if the round never ends
    readers = {lease.shard_id: (lease.worker_id, lease.outcome) for slot in report.slots for lease in slot.leases}
    assert readers[parent] == (slots[0], Outcome.LIMIT)
    assert readers[lower] == (slots[child_holder], Outcome.WAITING_FOR_PARENTS)
    for _ in range(8):
        pipeline.round(spark, workers=2, budget=LeaseBudget(max_records=100))
    assert_exactly_once(pipeline)


def test_a_corrupt_parent_item_blocks_only_its_child_and_the_slots_other_leases_land(spark, pipeline):
    pipeline.produce(200)
    pipeline.round(spark, workers=1)
    worker = slot_ids(pipeline.application_name, 1)[0]
    parent = min(pipeline.leases())
    lower, upper = split_shard(pipeline.kinesis, pipeline.streams[0], parent)
    child_held_by(pipeline, lower, worker)
    pipeline.produce(200)
    pipeline.dynamodb.update_item(  # another tool's write breaks the parent's item: a counter that is text
        TableName=pipeline.config.lease_table,
        Key={"leaseKey": {"S": parent}},
        UpdateExpression="SET leaseCounter = :broken",
        ExpressionAttributeValues={":broken": {"S": "many"}},
    )
    report = pipeline.round(spark, workers=1)
    outcomes = {lease.shard_id: lease for slot in report.slots for lease in slot.leases}
    assert not report.succeeded and report.totals.failed_leases == (lower,)
    assert parent in outcomes[lower].detail and "leaseCounter" in outcomes[lower].detail
    landed = pipeline.landed()
    assert duplicates(landed) == []
    healthy = {record.shard_id for record in pipeline.produced} - {parent, lower, upper}
    assert len(healthy) == 3
    for shard in healthy:  # every record of the slot's healthy leases landed in the round
        assert {r.sequence_number for r in landed if r.shard_id == shard} == {
            r.sequence_number for r in pipeline.produced if r.shard_id == shard
        }


def test_slots_wait_for_other_slots_parents_only_when_every_slot_runs_at_once(spark, pipeline):
    pipeline.produce(40)
    pipeline.sync()
    pipeline.assign(2)
    worker_0 = slot_ids(pipeline.application_name, 2)[0]
    parent = min(key for key, lease in pipeline.leases().items() if lease.lease_owner == worker_0)
    split_shard(pipeline.kinesis, pipeline.streams[0], parent)
    assert concurrent_task_slots(spark) == 2  # the session's master is local[2,4]
    together = with_round_start(spark, pipeline.spec(2, 1))
    assert together.slots_run_together and together.closing_parents == (parent,)
    # One slot more than Spark runs at once: the slots run in waves, and a waiting slot would hold up the next.
    in_waves = with_round_start(spark, pipeline.spec(3, 1))
    assert not in_waves.slots_run_together and in_waves.closing_parents == ()
    # Either way every slot knows the closed shard, to read it to its end (kinesis-mock's ending number is no record's).
    assert together.closed_shards == in_waves.closed_shards == {parent: None}


def test_a_slot_task_killed_in_the_middle_of_a_batch_is_retried_by_spark(spark, pipeline, spark_control_dir):
    pipeline.produce(400)
    victim = sorted({record.shard_id for record in pipeline.produced})[0]
    control(spark_control_dir, "crash-once", pipeline, victim).touch()
    report = pipeline.round(spark, workers=2, transform=STEER)
    assert control(spark_control_dir, "crashed", pipeline, victim).exists()
    assert report.succeeded, report.summary()
    retried = [slot for slot in report.slots if any(lease.shard_id == victim for lease in slot.leases)]
    assert [slot.attempt for slot in retried] == [1]
    victim_report = next(lease for lease in retried[0].leases if lease.shard_id == victim)
    assert victim_report.replayed_batches == 1
    assert_exactly_once(pipeline)


def test_a_zombie_that_lost_its_lease_never_commits_and_lands_nothing_twice(spark, pipeline, spark_control_dir):
    pipeline.produce(300)
    pipeline.sync()
    assignment = pipeline.assign(1)
    victim = sorted({record.shard_id for record in pipeline.produced})[0]
    control(spark_control_dir, "block", pipeline, victim).touch()
    job = BackgroundRound(lambda: pipeline.consume(spark, 1, assignment.round_number, transform=STEER))
    wait_for(control(spark_control_dir, "blocked", pipeline, victim))
    # The zombie holds a prepared batch of the victim; the leader moves the lease to another slot,
    # which finishes the batch and reads on while the zombie is still inside its transform.
    lease = pipeline.leases()[victim]
    assert lease.pending_checkpoint is not None
    assert pipeline.store.assign_lease(lease, slot_ids(pipeline.application_name, 2)[1]).applied
    rescuer = SlotTask(pipeline.spec(2, assignment.round_number), slot_index=1).run()
    assert [lease.outcome for lease in rescuer.leases] == [Outcome.CAUGHT_UP]
    assert rescuer.leases[0].replayed_batches == 1
    control(spark_control_dir, "release", pipeline, victim).touch()
    zombie = {lease.shard_id: lease for slot in job.join(timeout=120).slots for lease in slot.leases}
    assert zombie[victim].outcome == Outcome.LOST
    assert pipeline.leases()[victim].lease_owner == slot_ids(pipeline.application_name, 2)[1]
    assert_exactly_once(pipeline)


def test_a_round_whose_leader_lock_is_taken_over_cancels_its_slots_and_commits_nothing_more(
    spark, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, spark_control_dir
):
    create_stream(kinesis_client_for(kinesis_endpoint), unique_name, 2)
    pipeline = ConsumerPipeline(
        unique_name,
        (unique_name,),
        kinesis_endpoint,
        moto_endpoint,
        str(tmp_path / "lake"),
        settings={
            "initial_position_in_stream": "TRIM_HORIZON",
            "leader_lease_duration_millis": 3000,
            "leader_heartbeat_period_millis": 200,
        },
    )
    pipeline.produce(200)
    pipeline.sync()
    assignment = pipeline.assign(1)
    round_lock = LeaderLock(pipeline.state, "dag/run-A", 3000, 200)
    assert round_lock.try_acquire()
    victim = sorted({record.shard_id for record in pipeline.produced})[0]
    control(spark_control_dir, "block", pipeline, victim).touch()
    spec = pipeline.spec(1, assignment.round_number, transform=STEER)
    job = BackgroundRound(lambda: run_round(spark, spec, HandedOverLock("dag/run-A")))
    wait_for(control(spark_control_dir, "blocked", pipeline, victim))
    before = pipeline.leases()[victim]
    pipeline.state.delete(LEADER_KEY)  # the round is taken over (here: its lock deleted and acquired)
    next_round = LeaderLock(pipeline.state, "dag/run-B", 3000, 200)
    assert next_round.try_acquire()
    # Ended within 30 s: the slots stopped when the lock was lost (the blocked transform would hold one 60 s).
    report = job.join(timeout=30)
    assert report.leadership_lost and not report.succeeded
    assert pipeline.leases()[victim].checkpoint == before.checkpoint
    control(spark_control_dir, "release", pipeline, victim).touch()
    assert next_round.release()
    assert pipeline.round(spark, workers=1).succeeded
    assert_exactly_once(pipeline)


def test_a_consume_job_started_by_hand_never_runs_beside_a_round_and_names_its_holder(spark, pipeline):
    pipeline.produce(100)
    pipeline.sync()
    assignment = pipeline.assign(1)
    before = pipeline.leases()
    round_lock = LeaderLock(pipeline.state, "kinesis_lease_pipeline/scheduled__2026-11-23T20:00:00+00:00/abc")
    assert round_lock.try_acquire()
    with pytest.raises(LeadershipUnavailableError, match="scheduled__2026-11-23T20:00:00"):
        run_round(spark, pipeline.spec(1, assignment.round_number))  # no lock handed over
    assert pipeline.leases() == before and pipeline.landed() == []
    assert round_lock.heartbeat(), "the round's lock is untouched"
    assert round_lock.release()
    report = run_round(spark, pipeline.spec(1, assignment.round_number))
    assert report.succeeded and report.totals.records == 100
    assert pipeline.state.get(LEADER_KEY) is None, "the job released the lock it took for itself"


def test_a_transform_that_raises_commits_nothing_of_its_batch(spark, pipeline, spark_control_dir):
    pipeline.produce(200)
    victim = sorted({record.shard_id for record in pipeline.produced})[0]
    failing = control(spark_control_dir, "fail", pipeline, victim)
    failing.touch()
    report = pipeline.round(spark, workers=1, transform=STEER)
    failed = [lease for slot in report.slots for lease in slot.leases if lease.outcome == Outcome.FAILED]
    assert [lease.shard_id for lease in failed] == [victim]
    assert "instructed to fail" in (failed[0].detail or "")
    assert not report.succeeded
    assert victim not in {record.shard_id for record in pipeline.landed()}
    stuck = pipeline.leases()[victim]
    assert (str(stuck.checkpoint), stuck.pending_checkpoint is not None) == ("TRIM_HORIZON", True)
    failing.unlink()
    report = pipeline.round(spark, workers=1, transform=STEER)
    assert report.succeeded
    assert_exactly_once(pipeline)


def test_kpl_aggregated_records_land_as_their_user_records(spark, pipeline):
    produced = []
    for aggregate in range(20):
        users = [(f"user-{aggregate}-{index}", f"agg-{aggregate}-{index}".encode()) for index in range(7)]
        sequence = put_aggregate(pipeline.kinesis, pipeline.streams[0], users)
        shard = next(
            shard["ShardId"]
            for shard in pipeline.kinesis.list_shards(StreamName=pipeline.streams[0])["Shards"]
            if int(shard["HashKeyRange"]["StartingHashKey"])
            <= _hash_of(users[0][0])
            <= int(shard["HashKeyRange"]["EndingHashKey"])
        )
        produced.extend(StreamRecord(shard, sequence, index, data) for index, (_, data) in enumerate(users))
    pipeline.produced.extend(produced)
    report = pipeline.round(spark, workers=2, budget=LeaseBudget(file_max_records=10))
    assert report.totals.records == 140
    assert_exactly_once(pipeline)


def _hash_of(partition_key: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


def test_records_aged_out_of_retention_are_reported_as_loss(spark, pipeline, kinesis_endpoint):
    with FaultProxy(kinesis_endpoint) as proxy:
        pipeline.data_plane_kinesis = proxy.endpoint
        earlier = pipeline.produce(100)
        pipeline.round(spark, workers=1)
        later = pipeline.produce(200)
        shard = sorted({record.shard_id for record in earlier} & {record.shard_id for record in later})[0]
        in_shard = [record for record in later if record.shard_id == shard]
        first_kept = in_shard[len(in_shard) // 2]
        proxy.trim(pipeline.streams[0], shard, first_kept.sequence_number)
        report = pipeline.round(spark, workers=1)
    losses = report.totals.retention_losses
    assert [loss.lease_key for loss in losses] == [shard]
    assert losses[0].first_available == first_kept.sequence_number
    assert "LOSS" in report.summary()
    aged_out = {record for record in in_shard if int(record.sequence_number) < int(first_kept.sequence_number)}
    landed = pipeline.landed()
    assert duplicates(landed) == []
    assert set(landed) == set(pipeline.produced) - aged_out


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} did not appear within {timeout:.0f} s")
        time.sleep(0.02)


# About a third of all calls fail; with 6 attempts per call, some leases still fail a round now
# and then (a third to the sixth power), which the next round must repair.
FAULTS = [
    FaultRule("throttle", 0.18),
    FaultRule("server_error", 0.07),
    FaultRule("drop_response", 0.06),
    FaultRule("drop_request", 0.04),
]


def test_throttled_and_failing_kinesis_and_dynamodb_calls_lose_and_duplicate_nothing(
    spark, pipeline, kinesis_endpoint, moto_endpoint
):
    with FaultProxy(kinesis_endpoint, seed=7) as kinesis_proxy, FaultProxy(moto_endpoint, seed=8) as dynamodb_proxy:
        pipeline.data_plane_kinesis = kinesis_proxy.endpoint
        pipeline.data_plane_dynamodb = dynamodb_proxy.endpoint
        kinesis_proxy.set_faults(FAULTS)
        dynamodb_proxy.set_faults(FAULTS)
        for produced in (500, 300, 200, 0, 0, 0, 0):
            pipeline.produce(produced, hot_keys=2)
            pipeline.round(spark, workers=2, budget=LeaseBudget(file_max_records=20))
            assert duplicates(pipeline.landed()) == []
            if not produced and len(pipeline.landed()) == len(pipeline.produced):
                break
        injected = {
            service: sum(count for name, count in proxy.stats().items() if ":" in name)
            for service, proxy in (("kinesis", kinesis_proxy), ("dynamodb", dynamodb_proxy))
        }
    landed = pipeline.landed()
    print(
        f"\nfault test: faults injected {injected}, records produced {len(pipeline.produced)}, landed {len(landed)}, "
        f"duplicated {len(duplicates(landed))}, lost {len(set(pipeline.produced) - set(landed))}"
    )
    assert injected["kinesis"] > 25 and injected["dynamodb"] > 40
    assert_exactly_once(pipeline)


def test_an_s3_sink_receives_every_record_exactly_once(spark, unique_name, kinesis_endpoint, moto_endpoint):
    import boto3

    bucket = unique_name.lower().replace("_", "-")[:40]
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    create_stream(kinesis_client_for(kinesis_endpoint), unique_name, 2)
    pipeline = ConsumerPipeline(
        unique_name,
        (unique_name,),
        kinesis_endpoint,
        moto_endpoint,
        f"s3://{bucket}/landing/orders",
        settings={"initial_position_in_stream": "TRIM_HORIZON"},
    )
    for produced in (150, 100):
        pipeline.produce(produced)
        assert pipeline.round(spark, workers=2).succeeded
    assert_exactly_once(pipeline)


def test_the_job_runs_under_spark_submit_and_writes_its_report(pipeline, tmp_path):
    import json

    pipeline.produce(120)
    pipeline.sync()
    pipeline.assign(2)
    report_path = tmp_path / "reports" / "round.json"
    completed = submit_consume_job(
        pipeline.application_name,
        pipeline.streams[0],
        pipeline.output_uri,
        str(report_path),
        pipeline.dynamodb_endpoint,
        pipeline.kinesis_endpoint,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert (report["succeeded"], report["totals"]["records"], report["round_number"]) == (True, 120, 1)
    assert f"round 1 of '{pipeline.application_name}'" in completed.stdout
    assert_exactly_once(pipeline)
