"""The real DAG with its consume step on a real Spark standalone cluster (a master and two workers
on loopback, from the pip-installed Spark), submitted by the Apache Spark provider to `spark://`.

The cluster's daemons have no AWS credentials of their own (tests/support/spark_cluster.py), so
the executors reach the emulators only with what the round hands them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from devtools.kinesis_streams import create_stream, kinesis_client
from tests.support.airflow_dag import consumed_cleanly, run_round
from tests.support.pipeline import ConsumerPipeline, duplicates
from tests.support.spark_cluster import SparkStandaloneCluster

CONSUME_APPLICATION = "kinesis-consume"


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandaloneCluster]:
    cluster = SparkStandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores_per_worker=1)
    with cluster:
        yield cluster
    # Stopping really ended the daemons and their executors: no process on the machine still runs
    # from the cluster's directory (it is on every one of their class paths).
    leftovers = [pid for pid in cluster.stopped_pids if psutil.pid_exists(pid)] + _processes_using(cluster.directory)
    assert cluster.stopped_pids and leftovers == [], leftovers


@pytest.fixture(scope="module")
def spark_connection(spark_cluster: SparkStandaloneCluster) -> dict[str, Any]:
    """`spark_default` on the cluster: the provider builds the master `spark://127.0.0.1:<port>` from host and port."""
    return {"conn_type": "spark", "host": "spark://127.0.0.1", "port": spark_cluster.master_port}


@pytest.fixture(scope="module")
def spark_submit_environment(spark_cluster: SparkStandaloneCluster) -> dict[str, str]:
    """The cluster's spark-defaults.conf: the round's job waits for both executors before it starts."""
    return spark_cluster.submit_environment()


def test_the_cluster_runs_a_master_and_two_alive_workers_on_loopback(spark_cluster):
    status = spark_cluster.status()
    assert status["url"] == spark_cluster.master_url
    assert [worker["host"] for worker in spark_cluster.alive_workers()] == ["127.0.0.1", "127.0.0.1"]
    assert set(spark_cluster.pids()) == {"master-1", "worker-1", "worker-2"}


def test_rounds_on_the_cluster_land_every_record_once_with_executors_on_both_workers(
    dag, airflow_run_environment, spark_cluster, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 2)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 2,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
    }
    ledger.produce(240, hot_keys=2)
    first = run_round(dag, conf)
    assert consumed_cleanly(first), first
    ledger.produce(120)  # the second round resumes both shards from the checkpoints the first committed
    second = run_round(dag, conf)
    assert consumed_cleanly(second), second

    landed = ledger.landed()
    assert duplicates(landed) == []
    assert sorted(landed, key=lambda r: r.data) == sorted(ledger.produced, key=lambda r: r.data)
    assert {record.shard_id for record in landed} == set(ledger.leases())  # both shards had records

    applications = _completed_consume_applications(spark_cluster, expected=2)
    assert [app["state"] for app in applications] == ["FINISHED", "FINISHED"], applications
    for app in applications:
        for worker in range(len(spark_cluster.workers)):
            assert _executor_dirs(spark_cluster, worker, app["id"]), (
                f"no executor of {app['id']} on worker {worker + 1}"
            )
    slot_workers = {worker for app in applications for worker in _workers_that_ran_tasks(spark_cluster, app["id"])}
    assert slot_workers == {0, 1}, f"slot tasks ran on workers {slot_workers} only"


def _completed_consume_applications(cluster: SparkStandaloneCluster, expected: int) -> list[dict[str, Any]]:
    """The consume applications the master lists as completed (it learns of an application's end from the driver)."""
    deadline = time.monotonic() + 10
    while True:
        applications = [app for app in cluster.completed_applications() if app["name"].startswith(CONSUME_APPLICATION)]
        if len(applications) >= expected or time.monotonic() > deadline:
            return sorted(applications, key=lambda app: app["starttime"])
        time.sleep(0.2)


def _executor_dirs(cluster: SparkStandaloneCluster, worker: int, app_id: str) -> list[Path]:
    return [path for path in cluster.executor_dirs(worker) if path.parent.name == app_id]


def _workers_that_ran_tasks(cluster: SparkStandaloneCluster, app_id: str) -> set[int]:
    """Workers whose executor of `app_id` logged a task (the executor's stderr, Spark's default INFO log)."""
    return {
        worker
        for worker in range(len(cluster.workers))
        for path in _executor_dirs(cluster, worker, app_id)
        if "Running task" in (path / "stderr").read_text(errors="replace")
    }


def _processes_using(directory: Path) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if str(directory) in " ".join(process.info["cmdline"] or ()):
            found.append(process.pid)
    return found
