"""`leasectl` commands hold the leader lock as real processes do: one try each, a new process every time.

A process that dies holding the lock (a killed `leasectl assign`, a round marked failed in the UI)
leaves it behind; the next command after the lock's lease duration takes it over. A command never
writes beside a round that holds the lock.
"""

from __future__ import annotations

import subprocess
import sys
import time

import boto3
import pytest

from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock
from lease_core.model.lease import Lease
from lease_core.store.coordinator_state import CoordinatorStateStore
from tests.support.leasectl import run_leasectl
from tests.support.stores import dynamodb_state_store, dynamodb_store

LEASE_MILLIS = 3000
SHORT_LOCK = ("--set", f"leader_lease_duration_millis={LEASE_MILLIS}", "--set", "leader_heartbeat_period_millis=500")


def state_store(moto_endpoint: str, app: str) -> CoordinatorStateStore:
    return dynamodb_state_store(moto_endpoint, app)


def die_holding_the_lock(moto_endpoint: str, app: str, owner: str) -> None:
    """A separate process acquires the lock and exits without releasing it (as a killed one would)."""
    program = (
        "import os, sys\n"
        "from tests.support.stores import dynamodb_state_store\n"
        "from lease_core.leader.leader_lock import LeaderLock\n"
        f"lock = LeaderLock(dynamodb_state_store(sys.argv[1], sys.argv[2]), sys.argv[3], {LEASE_MILLIS}, 500)\n"
        "os._exit(0 if lock.try_acquire() else 3)\n"
    )
    done = subprocess.run([sys.executable, "-c", program, moto_endpoint, app, owner], timeout=60, check=False)
    assert done.returncode == 0


def seeded(moto_endpoint: str, app: str, count: int = 2):
    store = dynamodb_store(moto_endpoint, app)
    for n in range(count):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}", throughput_kbps=1.0))
    return store


def test_the_first_command_a_lease_after_a_dead_holder_was_first_seen_takes_the_lock_over(moto_endpoint, unique_name):
    store = seeded(moto_endpoint, unique_name)
    die_holding_the_lock(moto_endpoint, unique_name, "kinesis_lease_pipeline/manual__killed")
    refused = run_leasectl("--app", unique_name, *SHORT_LOCK, "assign", "--workers", "2", dynamodb=moto_endpoint)
    assert refused.returncode == 1
    assert "'kinesis_lease_pipeline/manual__killed'" in refused.stderr and "takes it over" in refused.stderr
    assert {lease.lease_owner for lease in store.list_leases()} == {None}
    time.sleep(LEASE_MILLIS / 1000 + 0.5)
    taken = run_leasectl("--app", unique_name, *SHORT_LOCK, "assign", "--workers", "2", dynamodb=moto_endpoint)
    assert taken.returncode == 0, taken.stderr
    assert {lease.lease_owner for lease in store.list_leases()} == {
        f"{unique_name}-worker-0",
        f"{unique_name}-worker-1",
    }
    assert state_store(moto_endpoint, unique_name).get(LEADER_KEY) is None, "the command releases what it took"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("assign", "--workers", "2"), id="assign"),
        pytest.param(("sync", "--stream", "orders"), id="sync"),
        pytest.param(("reset", "--shard", "shardId-0", "--to", "LATEST", "--yes"), id="reset"),
        pytest.param(("teardown", "--yes"), id="teardown"),
    ],
)
def test_a_command_never_writes_while_a_live_round_holds_the_lock(moto_endpoint, unique_name, command):
    store = seeded(moto_endpoint, unique_name)
    before = {lease.lease_key: lease for lease in store.list_leases()}
    state = state_store(moto_endpoint, unique_name)
    round_lock = LeaderLock(state, "kinesis_lease_pipeline/scheduled__live")
    assert round_lock.try_acquire()
    result = run_leasectl(
        "--app",
        unique_name,
        "--set",
        "aws_region=us-east-1",
        *command,
        dynamodb=moto_endpoint,
        kinesis="http://127.0.0.1:9",
    )  # sync must refuse before it lists anything
    assert result.returncode == 1, result.stdout
    assert "'kinesis_lease_pipeline/scheduled__live'" in result.stderr
    assert {lease.lease_key: lease for lease in store.list_leases()} == before
    assert round_lock.heartbeat(), "the round's lock is untouched"


def test_a_refused_teardown_leaves_no_lock_behind(moto_endpoint, unique_name):
    seeded(moto_endpoint, unique_name)
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.update_table(TableName=unique_name, DeletionProtectionEnabled=True)
    refused = run_leasectl("--app", unique_name, "teardown", "--yes", dynamodb=moto_endpoint)
    assert refused.returncode == 1 and "deletion protection" in refused.stderr
    assert state_store(moto_endpoint, unique_name).get(LEADER_KEY) is None
    assert run_leasectl("--app", unique_name, "assign", "--workers", "1", dynamodb=moto_endpoint).returncode == 0
