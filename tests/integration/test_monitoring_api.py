"""The monitoring JSON API of the plugin, served by a real `airflow api-server` over DynamoDB on moto.

The server's `aws_default` connection goes through a fault proxy in front of moto, so a test can
make DynamoDB fail for the server; the test itself writes to moto directly. The pipeline DAG
(`dags/kinesis_lease_pipeline.py`) is serialized into the server's database so that DAG runs can be
triggered and viewed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from devtools.fault_proxy import FaultProxy, FaultRule
from lease_core.leader.leader_lock import LeaderLock
from lease_core.leader.round_history import RoundHistory
from lease_core.metrics.worker_metrics import publish_worker_metrics
from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.store.coordinator_state import CoordinatorStateStore
from tests.support.airflow_server import REPO, AirflowServer, airflow_api_server, http_get, http_json
from tests.support.kcl_tables import LEADER_LOCK
from tests.support.stores import (
    dynamodb_state_store,
    dynamodb_store,
    dynamodb_worker_metrics,
    put_raw_item,
)

PREFIX = "/kinesis-lease"
DAG_ID = "kinesis_lease_pipeline"
DEFAULT_APPLICATION = "monitoring-default-app"
LEADER = f"{DAG_ID}/manual__round-2"

pytestmark = pytest.mark.moto

# A user's DAG file beside the shipped one: two more pipelines, and a DAG that is not a pipeline.
USERS_PIPELINES = """
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

clicks: DAG = kinesis_pipeline(
    "clicks_to_lake", streams=["clicks"], application_name="clicks-app", output_uri="/tmp/clicks", schedule=None
)
audit: DAG = kinesis_pipeline(
    "audit_to_lake", streams=["audit"], application_name="audit-app", output_uri="/tmp/audit", schedule=None
)
other = DAG("not_a_pipeline", schedule=None)
"""


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as fault_proxy:
        yield fault_proxy


@pytest.fixture(scope="module")
def server(proxy: FaultProxy) -> Iterator[AirflowServer]:
    with airflow_api_server(proxy.endpoint) as airflow:
        shutil.copy(REPO / "dags" / "kinesis_lease_pipeline.py", airflow.dags_folder)
        (Path(airflow.dags_folder) / "users_pipelines.py").write_text(USERS_PIPELINES)
        airflow.airflow("dags", "reserialize", env={"KINESIS_PIPELINE_APPLICATION": DEFAULT_APPLICATION})
        yield airflow


@pytest.fixture(scope="module")
def token(server: AirflowServer) -> str:
    return server.token("viewer")


@pytest.fixture(scope="module")
def application(moto_endpoint: str) -> str:
    """An application with leases on two slots and none, CPU of three slots, a leader and two rounds."""
    name = "monitored-app"
    store = dynamodb_store(moto_endpoint, name)
    leases = [
        (Lease("shardId-000", ExtendedSequenceNumber("100"), throughput_kbps=300.0), f"{name}-worker-0"),
        (Lease("shardId-001", ExtendedSequenceNumber("200"), throughput_kbps=100.0), f"{name}-worker-0"),
        (
            Lease(
                "shardId-002", ExtendedSequenceNumber("300"), parent_shard_ids={"shardId-000"}, throughput_kbps=200.0
            ),
            f"{name}-worker-1",
        ),
        (Lease("shardId-003", ExtendedSequenceNumber("TRIM_HORIZON")), None),
    ]
    for lease, owner in leases:
        assert store.create_lease_if_not_exists(lease)
        if owner is not None:
            assert store.assign_lease(lease, owner).applied
    metrics = dynamodb_worker_metrics(moto_endpoint, name)
    # worker-2 read no lease in round 2, so its latest figure is round 1's.
    for worker, cpu, round_ in (("worker-0", 55.0, 2), ("worker-1", 20.0, 2), ("worker-2", 5.0, 1)):
        publish_worker_metrics(metrics, f"{name}-{worker}", cpu, now=1_800_000_000, round=round_)
    state = dynamodb_state_store(moto_endpoint, name)
    assert LeaderLock(state, LEADER).try_acquire()
    history = RoundHistory(state)
    # Round 1 as an older release wrote it: no dag_id, no dead-letter count.
    history.append(round_summary(1, "scheduled__round-1", records=40))
    history.append({**round_summary(2, "manual__round-2", records=75), "dag_id": DAG_ID, "dead_lettered": 2})
    history.append(
        {**round_summary(3, "manual__idle-3", records=0), "consumed": False, "dag_id": DAG_ID, "dead_lettered": 0}
    )
    history.record_lease_rows(
        2,
        [
            {
                "lease_key": "shardId-000",
                "records": 50,
                "millis_behind_latest": 1200,
                "oldest_unlanded_age_millis": 2500,
                "newest_landed_age_millis": 2600,
                "outcome": "caught_up",
                "worker_id": f"{name}-worker-0",
                "dead_lettered": 2,
            },
            {  # as an older release wrote it: no dead-letter count, no freshness
                "lease_key": "shardId-002",
                "records": 25,
                "millis_behind_latest": 0,
                "outcome": "limit",
                "worker_id": f"{name}-worker-1",
            },
        ],
    )
    return name


def coordinator_state(moto_endpoint: str, name: str) -> CoordinatorStateStore:
    dynamodb_store(moto_endpoint, name)
    return dynamodb_state_store(moto_endpoint, name)


def round_summary(number: int, run_id: str, records: int) -> dict[str, Any]:
    """A summary as the finalize step writes it."""
    return {
        "round": number,
        "run_id": run_id,
        "finished_at": 1_800_000_000_000 + number,
        "consumed": True,
        "records": records,
        "bytes": records * 100,
        "files": 2,
        "seconds": 3.5,
        "max_millis_behind_latest": 1200,
        "lost_leases": 0,
        "failed_leases": 1,
        "retention_losses": 0,
        "moves": 1,
        "slots": [],
    }


def get(server: AirflowServer, path: str, token: str) -> tuple[int, Any]:
    return http_json("GET", server.base_url + PREFIX + path, token)


def trigger(server: AirflowServer, run_id: str, conf: dict[str, Any]) -> None:
    status, body = http_json(
        "POST",
        f"{server.base_url}/api/v2/dags/{DAG_ID}/dagRuns",
        server.token("admin"),
        {"dag_run_id": run_id, "logical_date": None, "conf": conf},
    )
    assert status == 200, body


PROTECTED_PATHS = [
    "/",
    "/dag-runs/some_dag/some_run",
    "/static/monitoring.js",
    "/api/default-application",
    "/api/applications",
    "/api/applications/monitored-app",
    f"/api/dag-runs/{DAG_ID}/some_run",
]


@pytest.mark.parametrize("path", PROTECTED_PATHS)
def test_a_request_without_credentials_is_refused_with_401(server, path):
    status, _headers, body = http_get(server.base_url + PREFIX + path, {"Accept": "application/json"})
    assert (status, body) == (401, b'{"detail":"Not authenticated"}')


@pytest.mark.parametrize("path", PROTECTED_PATHS)
def test_a_forged_token_is_refused_with_403(server, path):
    status, _, _ = http_get(server.base_url + PREFIX + path, {"Authorization": "Bearer not-a-jwt"})
    assert status == 403


def test_a_browser_without_a_session_is_sent_to_the_airflow_login_page_and_back(server):
    status, headers, body = http_get(server.base_url + PREFIX + "/?application=monitored-app", {"Accept": "text/html"})
    assert status == 303 and body == b""
    assert headers["location"] == "/auth/login?next=" + quote(
        f"{server.base_url}{PREFIX}/?application=monitored-app", safe=""
    )


def test_the_plugin_adds_a_navigation_entry_and_a_dag_run_view(server, token):
    status, body = http_json("GET", server.base_url + "/api/v2/plugins", token)
    assert status == 200
    (plugin,) = [plugin for plugin in body["plugins"] if plugin["name"] == "kinesis_lease"]
    assert plugin["fastapi_apps"] == [
        {"app": "fastapi.applications.FastAPI", "url_prefix": PREFIX, "name": "Kinesis lease monitoring"}
    ]
    views = {view["destination"]: view["href"] for view in plugin["external_views"]}
    assert views == {"nav": "kinesis-lease/", "dag_run": "kinesis-lease/dag-runs/{DAG_ID}/{RUN_ID}"}


def test_the_page_and_its_assets_are_served_to_a_signed_in_user(server, token):
    status, _, page = http_get(server.base_url + PREFIX + "/", {"Authorization": f"Bearer {token}"})
    assert status == 200
    assert b'data-base="/kinesis-lease" data-view="application"' in page
    status, headers, _ = http_get(
        server.base_url + PREFIX + "/static/monitoring.js", {"Authorization": f"Bearer {token}"}
    )
    assert status == 200 and headers["content-type"].startswith("text/javascript")


def test_the_overview_shows_each_worker_with_its_load_leases_and_its_cpu_of_the_last_round_only(
    server, token, application
):
    status, overview = get(server, f"/api/applications/{application}", token)
    assert status == 200, overview
    workers = {worker["worker_id"]: worker for worker in overview["workers"]}
    assert list(workers) == [f"{application}-worker-{i}" for i in range(3)] + ["(unassigned)"]
    figures = {name: (w["leases"], w["throughput_kbps"], w["load"], w["cpu_percent"]) for name, w in workers.items()}
    assert figures == {
        f"{application}-worker-0": (2, 400.0, 1.0, 55.0),
        f"{application}-worker-1": (1, 200.0, 0.5, 20.0),
        f"{application}-worker-2": (0, 0.0, 0.0, None),
        "(unassigned)": (1, 0.0, 0.0, None),
    }
    assert workers["(unassigned)"]["unassigned"] and workers[f"{application}-worker-0"][
        "throughput_share"
    ] == pytest.approx(2 / 3)


def test_the_leases_page_shows_each_shards_owner_checkpoint_throughput_and_last_round_lag_and_freshness(
    server, token, application
):
    status, page = get(server, f"/api/applications/{application}/leases", token)
    assert status == 200, page
    rows = {
        lease["lease_key"]: (
            lease["owner"],
            lease["checkpoint"],
            lease["throughput_kbps"],
            lease["parent_shard_ids"],
            lease["last_round"],
        )
        for lease in page["leases"]
    }
    assert rows == {
        "shardId-000": (
            f"{application}-worker-0",
            "100",
            300.0,
            [],
            {
                "records": 50,
                "millis_behind_latest": 1200,
                "oldest_unlanded_age_millis": 2500,
                "newest_landed_age_millis": 2600,
                "outcome": "caught_up",
                "worker_id": f"{application}-worker-0",
                "error": None,
                "dead_lettered": 2,
            },
        ),
        "shardId-001": (f"{application}-worker-0", "200", 100.0, [], None),
        "shardId-002": (
            f"{application}-worker-1",
            "300",
            200.0,
            ["shardId-000"],
            {
                "records": 25,
                "millis_behind_latest": 0,
                "oldest_unlanded_age_millis": None,
                "newest_landed_age_millis": None,
                "outcome": "limit",
                "worker_id": f"{application}-worker-1",
                "error": None,
                "dead_lettered": None,
            },
        ),
        "shardId-003": (None, "TRIM_HORIZON", None, [], None),
    }
    assert (page["total"], page["filtered"], page["last_round"]) == (4, 4, 2)
    assert page["owners"] == [f"{application}-worker-0", f"{application}-worker-1", "(unassigned)"]
    assert page["outcomes"] == ["caught_up", "limit", "(not read)"]
    _, overview = get(server, f"/api/applications/{application}", token)
    assert "leases" not in overview and overview["summary"]["lease_count"] == 4 and overview["last_round"] == 2


def test_the_overview_shows_the_running_leader_and_the_rounds_newest_first_with_their_runs(server, token, application):
    trigger(server, "manual__round-2", {"application_name": application})
    _, overview = get(server, f"/api/applications/{application}", token)
    leader = overview["leader"]
    assert (leader["owner"], leader["released"], leader["running"]) == (LEADER, False, True)
    assert 0 <= overview["now_millis"] - leader["heartbeat_at"] < leader["lease_duration_millis"] == 120_000
    assert leader["last_round_at"] == 1_800_000_000_003
    shown = ("round", "records", "dead_lettered", "idle", "dag_id", "state", "run_url")
    rounds = [tuple(entry[name] for name in shown) for entry in overview["rounds"]]
    assert rounds == [
        (3, 0, 0, True, DAG_ID, None, f"/dags/{DAG_ID}/runs/manual__idle-3"),  # its run was deleted or never made
        (2, 75, 2, False, DAG_ID, "queued", f"/dags/{DAG_ID}/runs/manual__round-2"),  # no scheduler runs it here
        (1, 40, None, False, None, None, None),  # an older release's entry whose run Airflow does not know
    ]
    assert overview["tables"] == dict.fromkeys(("lease", "worker_metrics", "coordinator_state"), application)
    assert overview["table_layout"]["layout"] == "single"
    assert overview["table_layout"]["table_migration"] is None


def test_before_leases_report_throughput_the_load_follows_lease_counts(server, token, moto_endpoint, unique_name):
    store = dynamodb_store(moto_endpoint, unique_name)
    for key, owner in (("shardId-0", "worker-a"), ("shardId-1", "worker-a"), ("shardId-2", "worker-b")):
        lease = Lease(key)
        assert store.create_lease_if_not_exists(lease) and store.assign_lease(lease, owner).applied
    _, overview = get(server, f"/api/applications/{unique_name}", token)
    assert [(worker["worker_id"], worker["load"]) for worker in overview["workers"]] == [
        ("worker-a", 1.0),
        ("worker-b", 0.5),
    ]
    assert overview["leader"] is None and overview["rounds"] == [] and overview["last_round"] is None


def test_an_application_without_tables_is_a_404_naming_its_lease_table(server, token):
    status, body = get(server, "/api/applications/never-initialised", token)
    assert status == 404
    assert body == {
        "table": "never-initialised",
        "detail": "DynamoDB table 'never-initialised' does not exist; run `leasectl init` to create the tables",
    }


def test_an_invalid_application_name_is_a_422_naming_the_setting(server, token):
    status, body = get(server, "/api/applications/a%20b", token)
    assert status == 422 and body["key"] == "application_name"


def test_a_dynamodb_failure_is_a_502_naming_the_failed_call(server, token, proxy, application):
    proxy.set_faults([FaultRule("server_error", 1.0, "Scan")])
    try:
        status, body = get(server, f"/api/applications/{application}", token)
    finally:
        proxy.set_faults([])
    assert status == 502
    assert (body["service"], body["operation"]) == ("dynamodb", "Scan")
    assert body["detail"].startswith("dynamodb Scan failed after 6 attempt(s): InternalServerError")


def test_the_default_application_is_the_pipeline_dags_param_default(server, token):
    assert get(server, "/api/default-application", token) == (
        200,
        {"dag_id": DAG_ID, "application": DEFAULT_APPLICATION},
    )


def test_the_deployments_pipelines_are_listed_by_dag_with_their_applications(server, token):
    assert get(server, "/api/applications", token) == (
        200,
        {
            "pipelines": [
                {"dag_id": "audit_to_lake", "application": "audit-app"},
                {"dag_id": "clicks_to_lake", "application": "clicks-app"},
                {"dag_id": DAG_ID, "application": DEFAULT_APPLICATION},
            ]
        },
    )


def test_a_dag_run_shows_the_application_of_its_conf_and_the_round_it_wrote(server, token, application, moto_endpoint):
    trigger(server, "manual__round-2b", {"application_name": application})
    RoundHistory(coordinator_state(moto_endpoint, application)).append(
        {**round_summary(4, "manual__round-2b", records=7), "dag_id": DAG_ID}
    )
    status, body = get(server, f"/api/dag-runs/{DAG_ID}/manual__round-2b", token)
    assert status == 200, body
    assert (body["dag_id"], body["run_id"], body["application"]) == (DAG_ID, "manual__round-2b", application)
    assert body["overview"]["application"] == application
    assert (body["round"]["round"], body["round"]["records"], body["round"]["state"]) == (4, 7, "queued")
    assert body["round"]["run_url"] == f"/dags/{DAG_ID}/runs/manual__round-2b"


def test_a_dag_run_without_conf_shows_the_default_application(server, token):
    trigger(server, "manual__defaults", {})
    status, body = get(server, f"/api/dag-runs/{DAG_ID}/manual__defaults", token)
    assert (status, body["table"]) == (404, DEFAULT_APPLICATION)


def test_a_backfill_run_shows_the_application_the_backfill_consumes_as(server, token, application):
    conf = {
        "application_name": application,
        "mode": "backfill",
        "start": "2026-11-01T00:00:00+00:00",
        "end": "2026-11-02T00:00:00+00:00",
    }
    trigger(server, "manual__backfill", conf)
    status, body = get(server, f"/api/dag-runs/{DAG_ID}/manual__backfill", token)
    assert status == 404
    assert body["table"].startswith(f"{application}-backfill-")


def test_an_unknown_dag_run_is_a_404(server, token):
    status, body = get(server, f"/api/dag-runs/{DAG_ID}/no_such_run", token)
    assert (status, body) == (404, {"detail": f"DAG run 'no_such_run' of DAG '{DAG_ID}' not found"})


# --- the leases endpoint -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def many_leases(moto_endpoint: str) -> str:
    """250 leases over two owners and none, keyed so that natural and text order differ."""
    name = "many-leases-app"
    store = dynamodb_store(moto_endpoint, name)
    for index in range(250):
        lease = Lease(f"shardId-{index}", throughput_kbps=float(index % 7))
        assert store.create_lease_if_not_exists(lease)
        if index % 5:
            assert store.assign_lease(lease, f"worker-{index % 2}").applied
    return name


def test_leases_come_a_page_at_a_time_in_natural_key_order(server, token, many_leases):
    status, page = get(server, f"/api/applications/{many_leases}/leases?offset=5&limit=10", token)
    assert status == 200, page
    assert [lease["lease_key"] for lease in page["leases"]] == [f"shardId-{index}" for index in range(5, 15)]
    assert (page["total"], page["filtered"], page["offset"], page["limit"]) == (250, 250, 5, 10)


def test_leases_are_filtered_and_sorted_before_they_are_paged(server, token, many_leases):
    path = f"/api/applications/{many_leases}/leases?owner=worker-1&sort=throughput_kbps&order=desc&limit=3"
    _, page = get(server, path, token)
    # worker-1 holds the odd keys not divisible by 5; throughput 6 first, ties in natural key order.
    assert [(lease["lease_key"], lease["throughput_kbps"]) for lease in page["leases"]] == [
        ("shardId-13", 6.0),
        ("shardId-27", 6.0),
        ("shardId-41", 6.0),
    ]
    assert page["filtered"] == 100 and page["owners"] == ["worker-0", "worker-1", "(unassigned)"]
    _, unassigned = get(server, f"/api/applications/{many_leases}/leases?owner=%28unassigned%29&q=shardId-24", token)
    assert [lease["lease_key"] for lease in unassigned["leases"]] == ["shardId-240", "shardId-245"]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        pytest.param("limit=1001", "limit", id="limit-over-1000"),
        pytest.param("limit=0", "limit", id="limit-0"),
        pytest.param("offset=-1", "offset", id="negative-offset"),
        pytest.param("sort=checkpoint", "sort", id="unknown-sort"),
        pytest.param("order=up", "order", id="unknown-order"),
        pytest.param("offset=ten", "offset", id="not-a-number"),
    ],
)
def test_a_leases_parameter_out_of_range_is_a_422_naming_it(server, token, many_leases, query, param):
    status, body = get(server, f"/api/applications/{many_leases}/leases?{query}", token)
    assert (status, body["param"]) == (422, param)
    assert body["detail"].startswith(f"invalid parameter {param!r}: ")


def test_the_next_page_is_served_from_the_read_of_the_first_and_fresh_reads_anew(server, token, proxy, many_leases):
    assert get(server, f"/api/applications/{many_leases}/leases?fresh=1", token)[0] == 200
    proxy.set_faults([FaultRule("server_error", 1.0, "Scan")])
    try:
        cached_status, cached = get(server, f"/api/applications/{many_leases}/leases?offset=100", token)
        fresh_status, fresh = get(server, f"/api/applications/{many_leases}/leases?offset=100&fresh=1", token)
    finally:
        proxy.set_faults([])
    assert (cached_status, cached["leases"][0]["lease_key"]) == (200, "shardId-100")
    assert (fresh_status, fresh["operation"]) == (502, "Scan")


# --- leader, workers, corrupt items --------------------------------------------------------------


def test_after_a_round_released_the_lock_no_round_runs_and_the_last_leader_is_named_with_its_time(
    server, token, moto_endpoint, unique_name
):
    state = coordinator_state(moto_endpoint, unique_name)
    lock = LeaderLock(state, f"{DAG_ID}/manual__done/abc")
    assert lock.try_acquire() and lock.release()
    RoundHistory(state).append({**round_summary(1, "manual__done", 3), "leader": f"{DAG_ID}/manual__done/abc"})
    _, overview = get(server, f"/api/applications/{unique_name}", token)
    assert overview["leader"] == {
        "owner": f"{DAG_ID}/manual__done/abc",
        "released": True,
        "running": False,
        "lease_duration_millis": None,
        "heartbeat_at": None,
        "seen_at": 1_800_000_000_001,
        "last_round_at": 1_800_000_000_001,
    }


def test_a_dead_rounds_lock_older_than_its_lease_is_not_running(server, token, moto_endpoint, unique_name):
    state = coordinator_state(moto_endpoint, unique_name)
    an_hour_ago = int(time.time() * 1000) - 3_600_000
    assert LeaderLock(state, f"{DAG_ID}/manual__died/abc", wall_clock_millis=lambda: an_hour_ago).try_acquire()
    _, overview = get(server, f"/api/applications/{unique_name}", token)
    leader = overview["leader"]
    assert (leader["owner"], leader["released"], leader["running"]) == (f"{DAG_ID}/manual__died/abc", False, False)
    assert (leader["heartbeat_at"], leader["seen_at"], leader["last_round_at"]) == (an_hour_ago, an_hour_ago, None)


def test_a_slot_that_holds_no_lease_shows_no_cpu_even_with_metrics_of_the_last_round(
    server, token, moto_endpoint, unique_name
):
    store = dynamodb_store(moto_endpoint, unique_name)
    lease = Lease("shardId-0")
    assert store.create_lease_if_not_exists(lease) and store.assign_lease(lease, f"{unique_name}-worker-0").applied
    metrics = dynamodb_worker_metrics(moto_endpoint, unique_name)
    for worker in ("worker-0", "worker-1"):  # both read in round 5; worker-1's lease was deleted since
        publish_worker_metrics(metrics, f"{unique_name}-{worker}", 100.0, now=1_800_000_000, round=5)
    rows = [
        {"lease_key": "shardId-0", "outcome": "caught_up", "worker_id": f"{unique_name}-worker-0"},
        {"lease_key": "shardId-1", "outcome": "shard_end", "worker_id": f"{unique_name}-worker-1"},
    ]
    RoundHistory(coordinator_state(moto_endpoint, unique_name)).record_lease_rows(5, rows)
    _, overview = get(server, f"/api/applications/{unique_name}", token)
    assert [(w["worker_id"], w["leases"], w["cpu_percent"]) for w in overview["workers"]] == [
        (f"{unique_name}-worker-0", 1, 100.0),
        (f"{unique_name}-worker-1", 0, None),
    ]


def test_tables_holding_both_layouts_show_the_conflict_naming_them_beside_the_leases(
    server, token, moto_endpoint, unique_name
):
    store = dynamodb_store(moto_endpoint, unique_name, layout="separate")
    assert store.create_lease_if_not_exists(Lease("shardId-0"))
    put_raw_item(store, LEADER_LOCK)  # a KCL 3.5 leader's lock in the lease table
    status, overview = get(server, f"/api/applications/{unique_name}", token)
    assert status == 200
    layout = overview["table_layout"]
    assert (layout["layout"], layout["lease_table"]) == ("conflict", unique_name)
    assert layout["separate_tables"] == [f"{unique_name}-WorkerMetricStats", f"{unique_name}-CoordinatorState"]
    assert f"lease table {unique_name!r}" in layout["reason"]
    assert overview["summary"]["lease_count"] == 1
    # Where the worker metrics and rounds are kept cannot be told: none are read.
    assert [(w["worker_id"], w["cpu_percent"]) for w in overview["workers"]] == [("(unassigned)", None)]
    assert overview["rounds"] == []


def test_corrupt_lease_items_are_named_with_their_attribute(server, token, moto_endpoint, unique_name):
    store = dynamodb_store(moto_endpoint, unique_name)
    assert store.create_lease_if_not_exists(Lease("shardId-0"))
    put_raw_item(store, {"leaseKey": {"S": "shardId-1"}, "leaseCounter": {"S": "two"}, "checkpoint": {"S": "LATEST"}})
    _, overview = get(server, f"/api/applications/{unique_name}", token)
    (item,) = overview["summary"]["corrupt_items"]
    assert (item["lease_key"], item["attribute"]) == ("shardId-1", "leaseCounter")
    assert "leaseCounter" in item["problem"]
    assert overview["summary"]["lease_count"] == 1
