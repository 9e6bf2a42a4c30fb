"""`leasectl assign` as a process against DynamoDB on moto."""

from __future__ import annotations

import json

from lease_core.leader.leader_lock import LeaderLock
from lease_core.metrics.worker_metrics import WorkerMetricStats
from lease_core.model.lease import Lease
from tests.support.leasectl import run_leasectl
from tests.support.stores import dynamodb_state_store, dynamodb_store, dynamodb_worker_metrics


def leasectl(*arguments: str, moto: str):
    return run_leasectl(*arguments, dynamodb=moto)


def seeded(moto_endpoint: str, app: str, owners: list[str | None], kbps: list[float]):
    store = dynamodb_store(moto_endpoint, app)
    for n, (owner, rate) in enumerate(zip(owners, kbps)):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}", lease_owner=owner, throughput_kbps=rate))
    return store


def test_assign_spreads_unassigned_leases_over_the_slots_and_reports_before_and_after(moto_endpoint, unique_name):
    store = seeded(moto_endpoint, unique_name, [None] * 4, [10.0, 10.0, 10.0, 10.0])
    result = leasectl("--app", unique_name, "assign", "--workers", "2", "--json", moto=moto_endpoint)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(w["worker_id"], w["leases_before"], w["leases_after"]) for w in report["workers"]] == [
        (f"{unique_name}-worker-0", 0, 2),
        (f"{unique_name}-worker-1", 0, 2),
    ]
    assert {lease.lease_owner for lease in store.list_leases()} == {
        f"{unique_name}-worker-0",
        f"{unique_name}-worker-1",
    }
    text = leasectl("--app", unique_name, "assign", "--workers", "2", moto=moto_endpoint)
    assert "assignment round 2" in text.stdout and "0 move(s)" in text.stdout


def test_a_listed_worker_with_cpu_metrics_and_an_unlisted_owner(moto_endpoint, unique_name):
    store = seeded(moto_endpoint, unique_name, ["gone-host", "hot", "hot", "cool"], [5.0, 5.0, 5.0, 5.0])
    metrics = dynamodb_worker_metrics(moto_endpoint, unique_name)
    metrics.put(WorkerMetricStats("hot", 1, {"C": (90.0, 95.0)}, {"C": (100.0,)}, round=1))
    metrics.put(WorkerMetricStats("cool", 1, {"C": (10.0, 12.0)}, {"C": (100.0,)}, round=1))
    result = leasectl(
        "--app", unique_name, "assign", "--worker", "hot", "--worker", "cool", "--json", moto=moto_endpoint
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert store.get_lease("shardId-0").lease_owner == "cool", "the unlisted owner's lease went to the coolest worker"
    assert {w["worker_id"]: w["cpu_percent"] for w in report["workers"]} == {"hot": 92.5, "cool": 11.0}


def test_assign_refuses_while_another_leader_holds_the_lock(moto_endpoint, unique_name):
    seeded(moto_endpoint, unique_name, [None], [1.0])
    assert LeaderLock(dynamodb_state_store(moto_endpoint, unique_name), "airflow-round-7").try_acquire()
    result = leasectl("--app", unique_name, "assign", "--workers", "2", moto=moto_endpoint)
    assert result.returncode == 1 and "'airflow-round-7'" in result.stderr


def test_assign_usage_errors_exit_2(moto_endpoint, unique_name):
    assert leasectl("--app", unique_name, "assign", moto=moto_endpoint).returncode == 2
    assert leasectl("--app", unique_name, "assign", "--workers", "0", moto=moto_endpoint).returncode == 2
    bad = leasectl(
        "--app",
        unique_name,
        "--set",
        "lease_assignment_strategy=random",
        "assign",
        "--workers",
        "2",
        moto=moto_endpoint,
    )
    assert bad.returncode == 2 and "'lease_assignment_strategy'" in bad.stderr
