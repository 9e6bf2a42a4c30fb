"""`leasectl reset` as a process against DynamoDB on moto, and its effect on the next batch of the real reader."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import SHARD_END, ExtendedSequenceNumber
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from spark_jobs.round_report import Outcome
from spark_jobs.slot_task import SlotTask
from tests.support.leasectl import run_leasectl
from tests.support.pipeline import ConsumerPipeline, pipeline_on_new_stream
from tests.support.stores import dynamodb_state_store, dynamodb_store

ESN = ExtendedSequenceNumber
KEY = "shardId-000000000000"
OWNER = "app-worker-0"
BATCH_FILE = f"stream_name=orders/shard_id={KEY}/500_800.parquet"


def leasectl(*arguments: str, moto: str | None = None):
    return run_leasectl(*arguments, dynamodb=moto)


def leader_state(moto_endpoint: str, app: str) -> CoordinatorStateStore:
    return dynamodb_state_store(moto_endpoint, app)


def seeded(
    moto_endpoint: str, app: str, checkpoint: ESN = ExtendedSequenceNumber("500"), prepared: ESN | None = None
) -> DynamoDBLeaseStore:
    """The application's tables with one lease owned by OWNER at `checkpoint`, maybe with a prepared batch."""
    store = dynamodb_store(moto_endpoint, app)
    assert store.create_lease_if_not_exists(Lease(KEY, checkpoint=checkpoint))
    lease = store.assign_lease(store.get_lease(KEY, consistent=True), OWNER).lease
    if prepared is not None:
        described = PendingBatch(checkpoint, prepared, ESN("501"), BATCH_FILE, 30)
        assert store.prepare_checkpoint(lease, prepared, described.encode()).applied
    return store


def stored(store: DynamoDBLeaseStore) -> Lease:
    lease = store.get_lease(KEY, consistent=True)
    assert lease is not None
    return lease


def test_reset_rewinds_the_checkpoint_and_reports_it_and_the_discarded_batch_as_json(moto_endpoint, unique_name):
    store = seeded(moto_endpoint, unique_name, prepared=ESN("800"))
    before = stored(store)
    result = leasectl(
        "--app", unique_name, "reset", "--shard", KEY, "--to", "100:2", "--json", "--yes", moto=moto_endpoint
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["table"], report["lease_key"], report["shard_id"], report["lease_owner"]) == (
        unique_name,
        KEY,
        KEY,
        OWNER,
    )
    assert report["before"] == {
        "checkpoint": {"sequence_number": "500", "sub_sequence_number": 0},
        "pending_checkpoint": {"sequence_number": "800", "sub_sequence_number": 0},
        "lease_counter": before.lease_counter,
    }
    assert report["after"] == {
        "checkpoint": {"sequence_number": "100", "sub_sequence_number": 2},
        "pending_checkpoint": None,
        "lease_counter": before.lease_counter + 2,
    }
    assert (report["direction"], report["attempts"]) == ("backward", 1)
    batch = report["discarded_batch"]
    assert (batch["path"], batch["records"], batch["start"]["sequence_number"], batch["end"]["sequence_number"]) == (
        BATCH_FILE,
        30,
        "500",
        "800",
    )
    assert any("is never made visible" in note for note in batch["notes"])
    (warning,) = report["warnings"]
    assert "duplicates in the sink" in warning
    after = stored(store)
    assert (after.checkpoint, after.pending_checkpoint, after.lease_owner) == (ESN("100", 2), None, OWNER)
    assert leader_state(moto_endpoint, unique_name).get(LEADER_KEY) is None, "the leader lock is released"


def test_reset_forward_prints_the_move_and_warns_of_the_records_it_skips(moto_endpoint, unique_name):
    store = seeded(moto_endpoint, unique_name, prepared=ESN("800"))
    counter = stored(store).lease_counter
    result = leasectl("--app", unique_name, "reset", "--shard", KEY, "--to", "LATEST", "--yes", moto=moto_endpoint)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"reset lease {KEY} of table {unique_name} (owner {OWNER}): checkpoint 500 -> LATEST (forward)"
    assert f"lease counter {counter} -> {counter + 2}" in lines[1]
    assert f"discarded the prepared batch (500, 800]: 30 record(s), batch {BATCH_FILE}" in result.stdout
    assert "will not be read again and are not in the sink" in result.stdout
    assert any(line.startswith("WARNING: moving forward from 500") and "loss" in line for line in lines)


def test_reset_without_yes_exits_2_saying_what_it_would_reset_and_changes_nothing(moto_endpoint, unique_name):
    store = seeded(moto_endpoint, unique_name)
    before = stored(store)
    result = leasectl("--app", unique_name, "reset", "--shard", KEY, "--to", "TRIM_HORIZON", moto=moto_endpoint)
    assert result.returncode == 2
    assert (
        f"reset would set the checkpoint of shard '{KEY}' in lease table '{unique_name}' to TRIM_HORIZON"
        in result.stderr
    )
    assert "add --yes to confirm" in result.stderr
    assert stored(store) == before


def test_reset_of_an_unknown_shard_exits_1_naming_it(moto_endpoint, unique_name):
    seeded(moto_endpoint, unique_name)
    result = leasectl(
        "--app", unique_name, "reset", "--shard", "shardId-000000000042", "--to", "100", "--yes", moto=moto_endpoint
    )
    assert result.returncode == 1
    assert f"lease table '{unique_name}' has no lease for shard 'shardId-000000000042'" in result.stderr


def test_reset_of_a_lease_at_shard_end_is_refused_with_exit_1_and_changes_nothing(moto_endpoint, unique_name):
    store = seeded(moto_endpoint, unique_name)
    assert store.checkpoint(stored(store), SHARD_END).applied
    before = stored(store)
    result = leasectl("--app", unique_name, "reset", "--shard", KEY, "--to", "100", "--yes", moto=moto_endpoint)
    assert result.returncode == 1
    assert "its checkpoint is SHARD_END: the shard is finished" in result.stderr and "backfill" in result.stderr
    assert stored(store) == before


def test_reset_while_someone_else_holds_the_leader_lock_exits_1_naming_the_holder_and_changes_nothing(
    moto_endpoint, unique_name
):
    store = seeded(moto_endpoint, unique_name)
    before = stored(store)
    round_lock = LeaderLock(leader_state(moto_endpoint, unique_name), "kinesis_lease_pipeline/scheduled__2026-07-01")
    assert round_lock.try_acquire()
    result = leasectl("--app", unique_name, "reset", "--shard", KEY, "--to", "100", "--yes", moto=moto_endpoint)
    assert result.returncode == 1
    assert "the leader lock is held by 'kinesis_lease_pipeline/scheduled__2026-07-01'" in result.stderr
    assert stored(store) == before
    assert round_lock.heartbeat(), "the round keeps its lock"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param(
            ("--shard", KEY, "--to", "AT_TIMESTAMP", "--yes"), "initial_position_timestamp", id="at-timestamp"
        ),
        pytest.param(("--shard", KEY, "--to", "SHARD_END", "--yes"), "SHARD_END is not a reset target", id="shard-end"),
        pytest.param(("--shard", KEY, "--to", "49590x", "--yes"), "'49590x' is not a sequence number", id="not-digits"),
        pytest.param(("--shard", KEY, "--to", "4959:-1", "--yes"), "sub-sequence number", id="bad-sub-sequence-number"),
        pytest.param(("--shard", KEY, "--yes"), "--to", id="no-target"),
        pytest.param(("--to", "100", "--yes"), "--shard", id="no-shard"),
    ],
)
def test_reset_usage_errors_exit_2_naming_the_problem(arguments, message):
    result = leasectl("--app", "demo-app", "reset", *arguments)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_reset_in_a_multi_stream_table_needs_the_stream(moto_endpoint, unique_name):
    store = dynamodb_store(moto_endpoint, unique_name)
    orders = StreamIdentifier("123456789012", "orders", 1)
    store.create_lease_if_not_exists(Lease.for_stream(orders, KEY, checkpoint=ESN("500")))
    without = leasectl("--app", unique_name, "reset", "--shard", KEY, "--to", "100", "--yes", moto=moto_endpoint)
    assert without.returncode == 2 and "multi-stream" in without.stderr and "--stream is required" in without.stderr
    done = leasectl(
        "--app", unique_name, "reset", "--shard", KEY, "--stream", "orders", "--to", "100", "--yes", moto=moto_endpoint
    )
    assert done.returncode == 0, done.stderr
    assert store.get_lease(orders.lease_key(KEY), consistent=True).checkpoint == ESN("100")


# --- with the real reader (kinesis-mock, the slot task in-process) -----------------------------


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    return pipeline_on_new_stream(
        unique_name, 1, kinesis_endpoint, moto_endpoint, tmp_path, initial_position_in_stream="TRIM_HORIZON"
    )


def test_after_a_rewind_the_next_batch_starts_right_after_the_new_checkpoint_and_relands_what_follows(pipeline):
    produced = pipeline.produce(30)
    pipeline.sync()
    pipeline.assign(1)
    (key,) = pipeline.leases()
    first = SlotTask(pipeline.spec(1, 1), slot_index=0).run().leases[0]
    assert (first.outcome, first.records) == (Outcome.CAUGHT_UP, 30)
    rewound_to = produced[9].sequence_number
    reset = leasectl(
        "--app",
        pipeline.application_name,
        "reset",
        "--shard",
        key,
        "--to",
        rewound_to,
        "--yes",
        moto=pipeline.dynamodb_endpoint,
    )
    assert reset.returncode == 0, reset.stderr
    second = SlotTask(pipeline.spec(1, 2), slot_index=0).run().leases[0]
    assert (second.outcome, second.start, second.records) == (Outcome.CAUGHT_UP, rewound_to, 20)
    landed = Counter(record.data for record in pipeline.landed())
    assert [landed[record.data] for record in produced] == [1] * 10 + [2] * 20
    assert pipeline.leases()[key].checkpoint == ESN(produced[-1].sequence_number)
