"""The DAG as production runs it: Postgres, the scheduler with LocalExecutor, the dag-processor and the
api-server as separate processes, with docker-compose.yaml's settings (tests/support/airflow_deployment.py).

One recorded story, checked by the tests below. A producer writes to a 2-shard stream the whole time.
The DAG runs on a one-minute SCHEDULE. While a scheduled run is active, a backfill of a window of the
stream is triggered through the REST API exactly as the UI's trigger form sends it (the DAG's params
with the form's values, a logical date of now), and so is a manual live run beside the scheduled one.
When a later run's `consume` task is working, its supervisor is killed (SIGKILL): the task stops
heartbeating, the scheduler finds it after `task_instance_heartbeat_timeout` and fails the try, and
the retry runs while the killed try's task process and Spark job may still be going. Then the
producer stops and the schedule runs until a round found nothing new. Afterwards every record landed
exactly once in the live output, and the backfill output holds exactly the window's records, once.

No plugins folder of ours, no checkout on a path: Airflow runs from a venv with the built wheel
installed (`tests/support/installed_package.py`) and finds the monitoring UI's plugin and the provider
through the package's entry points, as in docker-compose.yaml. Beside the shipped DAG, a user's DAG
file outside the repository defines two pipelines of its own (`tests/support/users_pipelines.py`: a
JSON decoder shipped with the job, one malformed record on each stream); each is triggered once after
the story, and the monitoring page lists all three applications.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil
import pytest

from devtools.emulators import free_port
from devtools.kinesis_streams import create_stream, kinesis_client, put_entries
from devtools.stream_records import StreamRecord, landed_records
from sinks.parquet import ParquetSink
from tests.support.airflow_deployment import AirflowDeployment, airflow_deployment, deployment_environment
from tests.support.installed_package import build_wheel, installed_venv
from tests.support.pipeline import duplicates
from tests.support.postgres_server import postgres_server
from tests.support.users_pipelines import UsersPipelines

DAG_ID = "kinesis_lease_pipeline"
HEARTBEAT_TIMEOUT_SECONDS = 30
# The story is one module fixture, timed with the first test that uses it (~5 minutes here).
STORY_SECONDS = 20 * 60
pytestmark = pytest.mark.timeout(STORY_SECONDS)


class Producer(threading.Thread):
    """Puts a few records every quarter second until stopped; keeps what Kinesis acknowledged."""

    def __init__(self, kinesis: Any, stream: str) -> None:
        super().__init__(daemon=True)
        self.kinesis, self.stream = kinesis, stream
        self.produced: list[StreamRecord] = []
        self.stopping = threading.Event()
        self.serial = itertools.count()

    def run(self) -> None:
        while not self.stopping.wait(0.25):
            entries = [
                {"Data": f"record-{serial:07d}".encode(), "PartitionKey": f"key-{serial}"}
                for serial in itertools.islice(self.serial, 5)
            ]
            self.produced += [
                StreamRecord.acknowledged(e, r) for e, r in put_entries(self.kinesis, self.stream, entries)
            ]

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


@dataclass
class Story:
    runs: list[dict[str, Any]]  # every DAG run, as the REST API lists them
    states: dict[str, dict[str, Any]]  # run id -> task id -> task instance
    backfill_run: str
    manual_run: str
    killed_run: str
    active_when_triggered: list[str]  # run ids of the scheduled runs running when the backfill was triggered
    window: tuple[datetime, datetime]
    produced: list[StreamRecord]
    live: list[StreamRecord]
    live_arrivals: dict[StreamRecord, datetime]
    backfill: list[StreamRecord]
    users: UsersPipelines
    users_runs: dict[str, str]  # the user's DAG id -> its triggered run's final state
    applications: list[dict[str, Any]]  # the monitoring page's GET /kinesis-lease/api/applications
    plugins: list[dict[str, Any]]  # GET /plugins
    plugin_import_errors: list[dict[str, Any]]  # GET /plugins/importErrors
    providers: list[dict[str, Any]]  # GET /providers


def form_conf(deployment: AirflowDeployment, **values: Any) -> dict[str, Any]:
    """What the trigger form posts as `conf`: every param of the DAG at its value, the user's changes on top."""
    params = deployment.api("GET", f"/dags/{DAG_ID}/details")["params"]
    return {**{name: param["value"] for name, param in params.items()}, **values}


def trigger(deployment: AirflowDeployment, conf: dict[str, Any], dag_id: str = DAG_ID) -> str:
    """POST /dags/{id}/dagRuns with the trigger form's body; the new run's id."""
    body = {
        "conf": conf,
        "logical_date": datetime.now(UTC).isoformat(),
        "data_interval_start": None,
        "data_interval_end": None,
        "partition_key": None,
    }
    return str(deployment.api("POST", f"/dags/{dag_id}/dagRuns", body)["dag_run_id"])


def running_scheduled(deployment: AirflowDeployment) -> list[str]:
    return [
        run["dag_run_id"]
        for run in deployment.dag_runs(DAG_ID)
        if run["run_type"] == "scheduled" and run["state"] == "running"
    ]


def kill_supervisor_of_running_consume(
    deployment: AirflowDeployment, run_id: str, orphans: list[psutil.Process]
) -> bool:
    """SIGKILL the supervisor of `run_id`'s consume task once its task process has worked a few seconds.

    The task process leads its own process group (Airflow's supervisor gives it one), so stopping the
    scheduler's group does not end it: it goes to `orphans`, for the story to end if it outlives it."""
    consume = deployment.task_instances(DAG_ID, run_id).get("consume", {})
    if consume.get("state") != "running" or not consume.get("pid") or consume.get("try_number") != 1:
        return False
    task = psutil.Process(int(consume["pid"]))
    if time.time() - task.create_time() < 5:
        return False
    supervisor = task.parent()
    assert supervisor is not None and supervisor.pid != deployment.processes["scheduler"].pid
    os.kill(supervisor.pid, signal.SIGKILL)
    orphans.append(task)
    return True


def finished(deployment: AirflowDeployment, run_id: str, dag_id: str = DAG_ID) -> str | None:
    state = next(run["state"] for run in deployment.dag_runs(dag_id) if run["dag_run_id"] == run_id)
    return state if state in ("success", "failed") else None


@pytest.fixture(scope="module")
def story(kinesis_endpoint: str, moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    token = uuid.uuid4().hex[:8]
    stream, application = f"scheduled-{token}", f"scheduled-app-{token}"
    output = str(tmp_path_factory.mktemp("lake") / "orders")
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, stream, 2)
    producer = Producer(kinesis, stream)
    orphans: list[psutil.Process] = []
    producer.start()
    window_start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    home = tmp_path_factory.mktemp("airflow")
    python = installed_venv(tmp_path_factory.mktemp("installed"), build_wheel(tmp_path_factory.mktemp("dist")))
    users = UsersPipelines.create(tmp_path_factory.mktemp("user"), token, kinesis_endpoint, moto_endpoint)
    shipped = {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {}}
    try:
        with postgres_server() as database:
            env = deployment_environment(
                home,
                database,
                free_port(),
                {"kinesis": kinesis_endpoint, "moto": moto_endpoint},
                {"STREAMS": stream, "APPLICATION": application, "OUTPUT_URI": output, "SCHEDULE": "*/1 * * * *"},
                extra={
                    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_SECONDS),
                    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([shipped, users.bundle()]),
                    "PYSPARK_PYTHON": str(python),
                },
            )
            env = {name: value for name, value in env.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
            with airflow_deployment(home, env, python) as deployment:
                told = tell_the_story(deployment, producer, window_start, output, orphans)
                yield run_the_users_pipelines(deployment, told, users)
    finally:
        producer.stop()
        for task in orphans:  # the killed try's task process group (its spark-submit included), if still alive
            if task.is_running():
                os.killpg(task.pid, signal.SIGKILL)


def run_the_users_pipelines(deployment: AirflowDeployment, story: Story, users: UsersPipelines) -> Story:
    """Trigger each of the user's pipelines once, as the UI's trigger button does, side by side."""
    wait = deployment.wait_for
    for dag_id in users.dag_ids:
        wait(f"{dag_id} parsed from the user's bundle", lambda dag_id=dag_id: _dag_known(deployment, dag_id), 180)
    runs = {dag_id: trigger(deployment, {}, dag_id) for dag_id in users.dag_ids}
    states = {
        dag_id: wait(f"{dag_id}'s run finished", lambda d=dag_id, r=run: finished(deployment, r, d), 600)
        for dag_id, run in runs.items()
    }
    applications = deployment.api("GET", "/api/applications", root="/kinesis-lease")["pipelines"]
    return dataclasses.replace(story, users=users, users_runs=states, applications=applications)


def _dag_known(deployment: AirflowDeployment, dag_id: str) -> bool:
    try:
        deployment.api("GET", f"/dags/{dag_id}")
    except RuntimeError:  # 404 until the dag-processor has parsed it
        return False
    return True


def tell_the_story(
    deployment: AirflowDeployment,
    producer: Producer,
    window_start: datetime,
    output: str,
    orphans: list[psutil.Process],
) -> Story:
    wait = deployment.wait_for
    first = wait("a scheduled run running", lambda: running_scheduled(deployment), 240)
    window_end = datetime.now(UTC).replace(microsecond=0)
    assert window_end - window_start >= timedelta(seconds=5), "the backfill window is too short to hold records"
    backfill_run = trigger(
        deployment, form_conf(deployment, mode="backfill", start=window_start.isoformat(), end=window_end.isoformat())
    )
    manual_run = trigger(deployment, form_conf(deployment))
    # The next run to consume after those two: its consume task's supervisor is killed mid-work.
    wait("the backfill and the manual run finished", lambda: finished(deployment, manual_run), 600)
    killed_run = wait(
        "a later run's consume task killed",
        lambda: next(
            (
                run
                for run in running_scheduled(deployment)
                if kill_supervisor_of_running_consume(deployment, run, orphans)
            ),
            None,
        ),
        600,
        0.5,
    )
    wait("the killed run finished", lambda: finished(deployment, killed_run), 600)
    producer.stop()
    stopped_at = datetime.now(UTC)

    def idle_round_after_stop() -> bool:
        for run in deployment.dag_runs(DAG_ID):
            if run["run_type"] != "scheduled" or run["state"] != "success":
                continue
            if datetime.fromisoformat(run["start_date"]) <= stopped_at:
                continue
            if deployment.task_instances(DAG_ID, run["dag_run_id"])["check_idle"]["state"] == "skipped":
                return True
        return False

    wait("a scheduled round with nothing new after the producer stopped", idle_round_after_stop, 600)
    # Paused between two runs, the DAG starts no new run. A paused DAG's running run gets no further
    # task scheduled, so the pause waits for a moment with none in flight (a round takes well under the
    # schedule's minute); a run the scheduler created just before the pause stays queued or stalled,
    # and the story leaves it out.
    wait(
        "a moment with no run in flight",
        lambda: all(run["state"] != "running" for run in deployment.dag_runs(DAG_ID)),
        600,
        0.5,
    )
    deployment.api("PATCH", f"/dags/{DAG_ID}", {"is_paused": True})
    runs = [run for run in deployment.dag_runs(DAG_ID) if run["state"] not in ("queued", "running")]
    table = ParquetSink.from_uri(output).read_dataset()
    columns = table.select(
        ["shard_id", "sequence_number", "sub_sequence_number", "data", "approximate_arrival_timestamp"]
    )
    live_arrivals = {
        StreamRecord(row["shard_id"], row["sequence_number"], row["sub_sequence_number"], row["data"]): row[
            "approximate_arrival_timestamp"
        ]
        for row in columns.to_pylist()
    }
    window = f"{window_start:%Y%m%dT%H%M%SZ}-{window_end:%Y%m%dT%H%M%SZ}"
    return Story(
        runs=runs,
        states={run["dag_run_id"]: deployment.task_instances(DAG_ID, run["dag_run_id"]) for run in runs},
        backfill_run=backfill_run,
        manual_run=manual_run,
        killed_run=killed_run,
        active_when_triggered=first,
        window=(window_start, window_end),
        produced=list(producer.produced),
        live=landed_records(output),
        live_arrivals=live_arrivals,
        backfill=landed_records(f"{output}-backfill/{window}"),
        users=None,  # type: ignore[arg-type]  # `run_the_users_pipelines` tells that part
        users_runs={},
        applications=[],
        plugins=deployment.api("GET", "/plugins?limit=100")["plugins"],
        plugin_import_errors=deployment.api("GET", "/plugins/importErrors")["import_errors"],
        providers=deployment.api("GET", "/providers?limit=100")["providers"],
    )


def test_every_record_landed_exactly_once_in_the_live_output(story):
    assert duplicates(story.live) == []
    assert set(story.live) == set(story.produced)
    assert len(story.produced) > 500


def test_the_backfill_landed_exactly_its_windows_records_once(story):
    start, end = story.window
    in_window = {record for record, arrival in story.live_arrivals.items() if start <= _utc(arrival) < end}
    assert in_window, "the window holds records"
    assert duplicates(story.backfill) == []
    assert set(story.backfill) == in_window


def test_the_backfill_and_the_manual_run_were_triggered_while_a_scheduled_run_was_active_and_succeeded(story):
    assert story.active_when_triggered
    by_id = {run["dag_run_id"]: run for run in story.runs}
    for run_id in (story.backfill_run, story.manual_run):
        assert (by_id[run_id]["run_type"], by_id[run_id]["state"]) == ("manual", "success"), by_id[run_id]
    assert by_id[story.backfill_run]["conf"]["mode"] == "backfill"


def test_the_killed_consume_task_was_failed_by_the_scheduler_and_its_retry_finished_the_round(story):
    consume = story.states[story.killed_run]["consume"]
    assert consume["try_number"] >= 2 and consume["state"] == "success", consume
    run = next(run for run in story.runs if run["dag_run_id"] == story.killed_run)
    assert run["state"] == "success"


def test_the_schedule_ran_several_rounds_and_every_run_succeeded(story):
    scheduled = [run for run in story.runs if run["run_type"] == "scheduled"]
    assert len(scheduled) >= 3
    assert {run["state"] for run in story.runs} == {"success"}, [(r["dag_run_id"], r["state"]) for r in story.runs]


def test_the_api_server_has_the_ui_plugin_and_the_provider_of_the_installed_package(story):
    [plugin] = [plugin for plugin in story.plugins if plugin["name"] == "kinesis_lease"]
    assert plugin["source"].startswith("kinesis-lease-batch=="), plugin["source"]
    assert "group='airflow.plugins'" in plugin["source"]
    assert [view["destination"] for view in plugin["external_views"]] == ["nav", "dag_run"]
    assert story.plugin_import_errors == []
    assert "kinesis-lease-batch" in {provider["package_name"] for provider in story.providers}


def test_a_users_two_pipelines_ran_beside_the_shipped_one_and_set_their_malformed_records_aside(story):
    assert story.users_runs == dict.fromkeys(story.users.dag_ids, "success")
    story.users.check_landed()


def test_the_monitoring_page_lists_every_pipeline_of_the_deployment_with_its_application(story):
    listed = {pipeline["dag_id"]: pipeline["application"] for pipeline in story.applications}
    expected = {f"{application}_to_lake": application for application in story.users.applications()}
    assert {dag_id: listed.get(dag_id) for dag_id in expected} == expected
    assert DAG_ID in listed, "and the shipped pipeline's"


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
