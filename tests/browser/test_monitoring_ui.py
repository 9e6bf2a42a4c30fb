"""The monitoring page in the Airflow UI, in headless Chromium at 1280 px against a real `airflow api-server`.

A user signs in on Airflow's own login page (SimpleAuthManager) and opens the plugin's navigation entry
or a DAG run's tab. The applications are written to DynamoDB on moto: one with 250 leases on three
slots (and a fourth slot that holds none), a corrupt item and five rounds of history (one idle) whose
DAG runs exist in the server's metadata database with their states; one whose round is running now;
one that has tables and nothing else; one that reads two streams of moto's Kinesis with enhanced fan-out,
whose consumer on one of them was re-created by hand. Full-page screenshots (light and dark) are saved as test
artifacts (`$TEST_ARTIFACTS_DIR`, else `test-artifacts/browser/`).
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, FrameLocator, Locator, Page, expect, sync_playwright

from devtools.kinesis_streams import create_stream
from lease_core.application import LeaseApplication
from lease_core.leader.leader_lock import LeaderLock
from lease_core.leader.round_history import RoundHistory
from lease_core.metrics.worker_metrics import publish_worker_metrics
from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.sync.step import sync_streams
from tests.support.airflow_server import DATABASE, PASSWORDS, REPO, AirflowServer, airflow_api_server, http_json
from tests.support.stores import (
    dynamodb_state_store,
    dynamodb_store,
    dynamodb_worker_metrics,
    fast_config,
    put_raw_item,
)

CHROMIUM = "/usr/bin/chromium"  # Debian's package; Playwright never downloads a browser here
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 900}
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", REPO / "test-artifacts")) / "browser"
DAG_ID = "kinesis_lease_pipeline"
APPLICATION = "browser-app"
RUNNING_APPLICATION = "browser-running-app"
EMPTY_APPLICATION = "browser-empty-app"
FAN_OUT_APPLICATION = "browser-fan-out-app"
OURS_STREAM = "browser-fan-out-orders"  # its consumer is the one the application registered
RECREATED_STREAM = "browser-fan-out-clicks"  # its consumer was deregistered and registered again by hand
NOT_OURS = "(not this application's: never used nor deregistered)"
WORKERS = [f"{APPLICATION}-worker-{index}" for index in range(4)]  # worker 3 reported CPU but holds no lease
LEASE_COUNT = 250
CHECKPOINT_PREFIX = "49590338271490256608559692538361571095921575989136"  # 50 digits, + 6 = 56
FIRST_ROUND_AT = 1_800_000_000_000  # 2027-01-15 08:00:00 UTC; rounds every 5 minutes
ROUND_MILLIS = 300_000
NEWEST_LEADER = f"{DAG_ID}/manual__r5/4f2a"
# (round, run id, DAG run state in the metadata database, records; 0 records: idle). scheduled__r4 has
# no DAG run in the database: its state is unknown.
ROUNDS = [
    (1, "manual__r1", "success", 900),
    (2, "manual__r2", "failed", 700),
    (3, "manual__r3", "success", 0),
    (4, "scheduled__r4", None, 1100),
    (5, "manual__r5", "success", 1234),
]

pytestmark = pytest.mark.moto


def lease_key(index: int) -> str:
    return f"shardId-{index:03d}"


def lease_owner(index: int) -> str | None:
    return None if index % 10 == 9 else WORKERS[index % 3]


def checkpoint(index: int) -> str:
    return f"{CHECKPOINT_PREFIX}{index:06d}"


def finished_at(number: int) -> int:
    return FIRST_ROUND_AT + (number - 1) * ROUND_MILLIS


# A second pipeline of the deployment, defined in a user's DAG file beside the shipped one.
USERS_PIPELINES = f"""
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

empty: DAG = kinesis_pipeline(
    "empty_to_lake", streams=["empty"], application_name="{EMPTY_APPLICATION}", output_uri="/tmp/e", schedule=None
)
"""


def utc(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


@pytest.fixture(scope="module")
def server(moto_endpoint: str) -> Iterator[AirflowServer]:
    """The api-server with the pipeline DAG serialized, so that its runs can be triggered and linked."""
    with airflow_api_server(moto_endpoint) as airflow:
        shutil.copy(REPO / "dags" / "kinesis_lease_pipeline.py", airflow.dags_folder)
        (Path(airflow.dags_folder) / "users_pipelines.py").write_text(USERS_PIPELINES)
        airflow.airflow("dags", "reserialize", env={"KINESIS_PIPELINE_APPLICATION": APPLICATION})
        yield airflow


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def application(moto_endpoint: str, server: AirflowServer) -> str:
    """250 leases, a corrupt item, CPU of four slots, five rounds (one idle) and their DAG runs."""
    store = dynamodb_store(moto_endpoint, APPLICATION)
    for index in range(LEASE_COUNT):
        lease = Lease(
            lease_key(index),
            ExtendedSequenceNumber(checkpoint(index)),
            lease_owner=lease_owner(index),
            throughput_kbps=float(index),
            parent_shard_ids=frozenset({lease_key(4), lease_key(5)}) if index == 10 else frozenset(),
        )
        assert store.create_lease_if_not_exists(lease)
    # An item that is not a readable lease: the page names it and its attribute.
    put_raw_item(
        store, {"leaseKey": {"S": "shardId-corrupt"}, "leaseCounter": {"S": "x"}, "checkpoint": {"S": "LATEST"}}
    )
    metrics = dynamodb_worker_metrics(moto_endpoint, APPLICATION)
    for worker, cpu in zip(WORKERS, (55.0, 40.0, 20.0, 100.0), strict=True):
        publish_worker_metrics(metrics, worker, cpu, now=FIRST_ROUND_AT // 1000, round=5)
    history = RoundHistory(dynamodb_state_store(moto_endpoint, APPLICATION))
    for number, run_id, state, records in ROUNDS:
        history.append(round_entry(number, run_id, records))
        if state is not None:
            create_dag_run(server, run_id, state)
    history.record_lease_rows(5, last_round_rows())
    return APPLICATION


def round_entry(number: int, run_id: str, records: int) -> dict[str, Any]:
    """A history entry as the finalize step writes it (`operators.round_summary`); 0 records: idle,
    and then, as in a real idle round, no round number (nothing was assigned), no consume time, and
    nothing the output lacks (its newest record as the round before left it). Round 5 dead-lettered two
    records; round 1 was written before rounds kept that count, or their freshness."""
    idle = records == 0
    entry = {
        "round": None if idle else number,
        "run_id": run_id,
        "dag_id": DAG_ID,
        "leader": f"{DAG_ID}/{run_id}/4f2a",
        "finished_at": finished_at(number),
        "consumed": not idle,
        "records": records,
        "bytes": records * 46,
        "files": 0 if idle else 3,
        "seconds": 0.0 if idle else 12.5 + number,
        "leases": 0 if idle else 225,
        "leases_behind": 0 if idle else number,
        "max_millis_behind_latest": None if idle else 1000 * number + 500,
        "oldest_unlanded_age_millis": 0 if idle else 30_000 * number,
        "newest_landed_age_millis": 10_000 * number,
        "outcomes": {} if idle else {"caught_up": 223, "failed": 1, "limit": 1},
        "lost_leases": 1 if number == 4 else 0,
        "failed_leases": 1 if number == 2 else 0,
        "retention_losses": 0,
        "dead_lettered": 2 if number == 5 else 0,
        "possibly_unread": 0,
        "corrupt_leases": 1,
        "moves": 0 if idle else number % 3,
        "busiest_over_bound": None if idle else 1.0712,
        # A 64-bit Iceberg snapshot id, beyond what a JavaScript number holds exactly.
        "snapshot_id": None if idle else f"{9_007_199_254_740_993 + number}",
        "table_commits": None if idle else 1,
        "output": "iceberg://glue/lake.orders",
        "slots": None
        if idle
        else {
            "columns": ["slot", "leases", "records", "bytes", "seconds", "cpu_percent"],
            "rows": [
                [slot, 75, records // 3, round(records * 46 / 3 * share), 10.0, 40.0]
                for slot, share in enumerate((1.07, 1.0, 0.93))
            ],
        },
    }
    if number == 1:
        del entry["dead_lettered"], entry["oldest_unlanded_age_millis"], entry["newest_landed_age_millis"]
    return entry


def last_round_rows() -> list[dict[str, Any]]:
    outcomes = {0: "caught_up", 1: "failed", 2: "limit"}
    return [
        {
            "lease_key": lease_key(index),
            "records": 1234 if index == 0 else 10 * index,
            "millis_behind_latest": 4500 if index == 0 else index,
            # The failed lease landed nothing: the oldest record its shard lacks is the oldest of all.
            "oldest_unlanded_age_millis": 200_000 if index == 1 else 1000 + index,
            "newest_landed_age_millis": 2000 + index,
            "outcome": outcomes.get(index, "caught_up"),
            "worker_id": lease_owner(index),
            "dead_lettered": 2 if index == 0 else 0,
        }
        for index in range(LEASE_COUNT)
        if lease_owner(index) is not None
    ]


def create_dag_run(server: AirflowServer, run_id: str, state: str) -> None:
    """A DAG run of the application in the server's metadata database, in `state`: triggered through
    Airflow's REST API, then set to `state` in the database (no scheduler runs it here)."""
    body = {"dag_run_id": run_id, "logical_date": None, "conf": {"application_name": APPLICATION}}
    status, answer = http_json("POST", f"{server.base_url}/api/v2/dags/{DAG_ID}/dagRuns", server.token("admin"), body)
    assert status == 200, answer
    with sqlite3.connect(server.home / DATABASE) as database:
        changed = database.execute(
            "UPDATE dag_run SET state = ? WHERE dag_id = ? AND run_id = ?", (state, DAG_ID, run_id)
        ).rowcount
    assert changed == 1


@pytest.fixture(scope="module")
def running_application(moto_endpoint: str) -> str:
    """An application whose round holds the leader lock now."""
    dynamodb_store(moto_endpoint, RUNNING_APPLICATION)
    state = dynamodb_state_store(moto_endpoint, RUNNING_APPLICATION)
    assert LeaderLock(state, f"{DAG_ID}/manual__now/77").try_acquire()
    return RUNNING_APPLICATION


@pytest.fixture(scope="module")
def empty_application(moto_endpoint: str) -> str:
    """An application with its tables and nothing in them: no leases, no workers, no round."""
    store = dynamodb_store(moto_endpoint, EMPTY_APPLICATION)
    assert isinstance(store, DynamoDBLeaseStore)
    return EMPTY_APPLICATION


@pytest.fixture(scope="module")
def fan_out_consumers(moto_endpoint: str) -> dict[str, str]:
    """The ARN, by stream, of the consumer Kinesis has under the fan-out application's name on each of its
    two streams. The application's lifecycle registered both (as its table step does) and a shard sync
    recorded both streams (multi-stream leases); then its consumer on RECREATED_STREAM was deregistered
    and one of the same name registered by hand, which the application's record does not name."""
    config = fast_config(
        FAN_OUT_APPLICATION,
        aws_endpoint_url_dynamodb=moto_endpoint,
        aws_endpoint_url_kinesis=moto_endpoint,  # the api-server's aws_default connection points here too
        aws_region="us-east-1",
        retrieval="fan_out",
    )
    app = LeaseApplication(config)
    kinesis = app.client("kinesis")
    streams = [OURS_STREAM, RECREATED_STREAM]
    for stream in streams:
        create_stream(kinesis, stream, 1)
    app.tables.ensure_tables()
    registered = {stream: app.stream_consumers.ensure(stream) for stream in streams}
    sync_streams(streams, config, app.lease_store, app.shard_source, app.state_store)
    recreated = registered[RECREATED_STREAM]
    kinesis.deregister_stream_consumer(ConsumerARN=recreated.consumer_arn)
    stream_arn = kinesis.describe_stream_summary(StreamName=RECREATED_STREAM)["StreamDescriptionSummary"]["StreamARN"]
    by_hand = kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=recreated.consumer_name)
    ours = registered[OURS_STREAM].consumer_arn
    assert ours is not None
    return {OURS_STREAM: ours, RECREATED_STREAM: by_hand["Consumer"]["ConsumerARN"]}


@pytest.fixture
def context(browser: Browser, server: AirflowServer) -> Iterator[BrowserContext]:
    """A signed-in browser at 1280 px that may use the clipboard."""
    context = browser.new_context(viewport=VIEWPORT)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base_url)
    page = context.new_page()
    sign_in(page, server)
    page.close()
    yield context
    context.close()


def sign_in(page: Page, server: AirflowServer) -> None:
    page.goto(server.base_url + "/")
    page.locator("input[name=username]").fill("viewer")
    page.locator("input[name=password]").fill(PASSWORDS["viewer"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Welcome")).to_be_visible()


def open_monitoring(page: Page, server: AirflowServer, application: str) -> FrameLocator:
    """The Airflow UI's "Kinesis leases" entry, showing `application`."""
    page.goto(server.base_url + "/")
    page.get_by_role("link", name="Kinesis leases").click()
    frame = page.frame_locator("iframe[title='Kinesis leases']")
    # The page's first load (the pipeline's default application) ends before the form is typed in:
    # its late answer would otherwise write that name into the field while the test types.
    expect(frame.locator("body[data-loads]")).to_have_count(1)
    frame.locator("#application-input").fill(application)
    with page.expect_event("framenavigated", lambda navigated: f"application={application}" in navigated.url):
        frame.get_by_role("button", name="Show").click()
    expect(frame.locator("#application-name")).to_have_text(application)
    return frame


def open_page(context: BrowserContext, server: AirflowServer, application: str) -> Page:
    """The plugin's page on its own (not in Airflow's iframe), showing `application`."""
    page = context.new_page()
    page.goto(f"{server.base_url}/kinesis-lease/?application={application}")
    expect(page.locator("#application-name")).to_have_text(application)
    return page


def chart(frame: FrameLocator | Page, key: str) -> Locator:
    return frame.locator(f"figure[data-chart='{key}']")


def legend_values(figure: Locator) -> Locator:
    return figure.locator(".u-legend .u-series .u-value")


def assert_fits(locator: Locator) -> None:
    """No horizontal scroll: the content is no wider than the box."""
    scroll, client = locator.evaluate("node => [node.scrollWidth, node.clientWidth]")
    assert scroll <= client, f"{scroll} px of content in a {client} px box"


def test_the_history_charts_show_the_last_rounds_with_the_idle_one_shaded(context, server, application):
    page = context.new_page()
    frame = open_monitoring(page, server, application)

    charts = frame.locator("figure.chart")
    expect(charts).to_have_count(6)
    expect(frame.locator("figure.chart canvas")).to_have_count(6)
    for figure in charts.all():
        expect(figure).to_have_attribute("data-rounds", "5")
        expect(figure).to_have_attribute("data-idle-rounds", "1")
    expect(frame.locator("#history-caption")).to_contain_text("The last 5 round(s), 1 idle")
    # Without a cursor the legends show the newest round (5): one entry per series, after the round's.
    landed = chart(frame, "landed")
    expect(landed.locator(".u-legend .u-series th")).to_have_text(["Round", "Records", "Bytes"])
    expect(legend_values(landed)).to_have_text(["round 5 · 2027-01-15 08:20 UTC", "1,234", "55.4 KiB"])
    expect(legend_values(chart(frame, "backlog"))).to_have_text(["round 5 · 2027-01-15 08:20 UTC", "5.5 s", "5"])
    expect(legend_values(chart(frame, "balance"))).to_have_text(
        ["round 5 · 2027-01-15 08:20 UTC", "17.5 s", "1.07x", "1.00x"]
    )
    moves = chart(frame, "moves")
    expect(moves.locator(".u-legend .u-series th").nth(4)).to_have_text("Retention losses")
    expect(moves.locator(".u-legend .u-series th").nth(5)).to_have_text("Dead-lettered")
    expect(legend_values(moves)).to_have_text(["round 5 · 2027-01-15 08:20 UTC", "2", "0", "0", "0", "2", "0", "1"])
    expect(chart(frame, "slots").locator(".u-legend .u-series th")).to_have_text(
        ["Round", "slot 0", "slot 1", "slot 2"]
    )
    expect(legend_values(chart(frame, "slots"))).to_have_text(
        ["round 5 · 2027-01-15 08:20 UTC", "19.8 KiB", "18.5 KiB", "17.2 KiB"]
    )
    # Rounds are 5 minutes apart: the idle round 3 is in the middle of the plot; it reads "idle", not 0.
    plot = landed.locator(".u-over")
    box = plot.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(legend_values(landed)).to_have_text(["idle round · 2027-01-15 08:10 UTC", "idle", "idle"])
    expect(legend_values(chart(frame, "backlog"))).to_have_text(["idle round · 2027-01-15 08:10 UTC", "idle", "idle"])
    expect(legend_values(chart(frame, "balance")).first).to_have_text("idle round · 2027-01-15 08:10 UTC")
    expect(legend_values(chart(frame, "balance")).nth(1)).to_have_text("idle")
    # Round 1, a tenth of the way in, was written before rounds counted dead letters: not known, not 0.
    page.mouse.move(box["x"] + box["width"] / 10, box["y"] + box["height"] / 2)
    expect(legend_values(moves).first).to_have_text("round 1 · 2027-01-15 08:00 UTC")
    expect(legend_values(moves).nth(5)).to_have_text("-")
    page.close()


def test_freshness_shows_beside_the_lag_for_the_application_and_each_shard_with_its_history(
    context, server, application
):
    page = context.new_page()
    frame = open_monitoring(page, server, application)

    expect(frame.locator("#last-round .freshness")).to_have_text(
        "freshness: oldest record not landed ≤ 2.5 min old · newest landed 50.0 s old"
    )
    expect(frame.locator("#rounds thead th").nth(7)).to_have_text("Max lag")
    expect(frame.locator("#rounds thead th").nth(8)).to_have_text("Freshness")
    expect(frame.locator("#rounds tr[data-round='5'] td").nth(8)).to_have_text("2.5 min")
    expect(frame.locator("#rounds tr[data-run-id='manual__r3'] td").nth(8)).to_have_text("0 ms")  # idle: lacks nothing
    expect(frame.locator("#rounds tr[data-round='1'] td").nth(8)).to_have_text("-")  # kept before freshness was
    freshness = chart(frame, "freshness")
    expect(freshness.locator(".u-legend .u-series th")).to_have_text(["Round", "Oldest not landed", "Newest landed"])
    expect(legend_values(freshness)).to_have_text(["round 5 · 2027-01-15 08:20 UTC", "2.5 min", "50.0 s"])
    # Per shard, beside its lag: the failed lease's shard is the stalest, first when sorted by it.
    headers = frame.locator("#leases thead th")
    expect(headers.nth(6)).to_have_text("Lag")
    expect(headers.nth(7)).to_have_text("Freshness")
    headers.nth(7).get_by_role("button").click()
    expect(headers.nth(7)).to_have_attribute("aria-sort", "descending")
    first = frame.locator("#leases tbody tr").first
    expect(first).to_have_attribute("data-lease-key", lease_key(1))
    expect(first.locator("td").nth(7)).to_have_text("3.3 min")
    assert_fits(frame.locator("#leases-frame"))
    page.close()


def test_the_state_now_names_the_last_leader_and_the_last_round(context, server, application):
    page = context.new_page()
    frame = open_monitoring(page, server, application)

    expect(frame.locator("#leader")).to_have_text(
        f"no round running; last leader {NEWEST_LEADER} at {utc(finished_at(5))} UTC"
    )
    expect(frame.locator("#last-round a")).to_have_text("Round 5")
    expect(frame.locator("#last-round .badge")).to_have_text(["success"])
    expect(frame.locator("#last-round")).to_contain_text(
        f"finished {utc(finished_at(5))} UTC · 1,234 records, 55.4 KiB; max lag 5.5 s"
    )
    expect(frame.locator("#updated")).to_have_text(re.compile(r"^Updated \d\d:\d\d:\d\d UTC$"))
    page.close()


def test_a_round_running_now_is_named_with_its_heartbeat(context, server, running_application):
    page = open_page(context, server, running_application)
    expect(page.locator("#leader")).to_have_text(
        re.compile(rf"^round running: {DAG_ID}/manual__now/77 \(heartbeat at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)$")
    )
    page.close()


def test_each_round_links_to_its_dag_run_and_shows_its_state(context, server, application):
    page = context.new_page()
    frame = open_monitoring(page, server, application)

    rows = frame.locator("#rounds tbody tr")
    expect(rows).to_have_count(5)
    expect(frame.locator("#rounds tbody tr td:nth-child(2) .badge:first-child")).to_have_text(
        ["success", "unknown", "success", "failed", "success"]
    )
    idle = frame.locator("#rounds tr[data-run-id='manual__r3']")
    expect(idle).to_have_class("idle")
    expect(idle.locator("td").first).to_have_text("-")  # an idle round assigned nothing: no number
    expect(idle.locator("td").nth(3)).to_have_text("idle")
    expect(idle.locator("td").nth(6)).to_have_text("idle")  # no consume step, no duration
    expect(frame.locator("#rounds tr[data-round='5'] td").nth(2)).to_have_text(utc(finished_at(5)))
    expect(frame.locator("#rounds thead th").nth(13)).to_have_text("Dead-lettered")
    for number, dead_lettered in ((5, "2"), (2, "0"), (1, "-")):  # round 1 predates the count
        expect(frame.locator(f"#rounds tr[data-round='{number}'] td").nth(13)).to_have_text(dead_lettered)
    expect(frame.locator("#rounds tr[data-round='4'] td a")).to_have_count(1)  # linked, though the run is gone
    link = frame.locator("#rounds tr[data-round='2'] td a")
    expect(link).to_have_attribute("href", f"{server.base_url}/dags/{DAG_ID}/runs/manual__r2")
    expect(link).to_have_attribute("target", "_top")
    link.click()
    expect(page).to_have_url(f"{server.base_url}/dags/{DAG_ID}/runs/manual__r2")
    page.close()


def test_corrupt_items_are_listed_by_key_and_attribute(context, server, application):
    page = open_page(context, server, application)
    expect(page.locator("#corrupt-section")).to_be_visible()
    expect(page.locator("#corrupt-items tbody tr td").first).to_have_text("shardId-corrupt")
    expect(page.locator("#corrupt-items tbody tr td").nth(1)).to_have_text("leaseCounter")
    expect(page.locator("#lease-summary")).to_contain_text("1 corrupt item(s)")
    page.close()


def test_a_slot_that_holds_no_lease_shows_no_cpu(context, server, application):
    page = open_page(context, server, application)
    figures = page.locator(".worker .worker-figures")
    expect(page.locator(f".worker[data-worker='{WORKERS[0]}'] .worker-figures")).to_contain_text("CPU 55%")
    expect(page.locator(f".worker[data-worker='{WORKERS[3]}'] .worker-figures")).to_have_text(
        "0 lease(s) (0%) · 0.0 KB/s (0%) · no leases, no CPU figure"
    )
    expect(figures.filter(has_text="CPU 100%")).to_have_count(0)
    page.close()


def test_the_lease_table_fits_1280_px_with_short_checkpoints_copied_whole(context, server, application):
    page = context.new_page()
    frame = open_monitoring(page, server, application)

    row = frame.locator(f"tr[data-lease-key='{lease_key(7)}']")
    expect(row).to_be_visible()
    assert_fits(frame.locator("#leases-frame"))
    # Only the lease that set records aside says so, under its outcome.
    expect(frame.locator("#leases .lease-note")).to_have_count(1)
    expect(frame.locator(f"tr[data-lease-key='{lease_key(0)}'] .lease-note")).to_have_text("2 dead-lettered")
    short = row.locator("td").nth(2).locator("code")
    expect(short).to_have_text("495903…000007")
    expect(short).to_have_attribute("title", checkpoint(7))
    row.get_by_role("button", name="Copy the full checkpoint").click()
    expect(row.get_by_role("button", name="Copied")).to_be_visible()
    assert row.evaluate("() => navigator.clipboard.readText()") == checkpoint(7)
    # Lineage is one collapsed cell: two parents, listed when opened.
    lineage = frame.locator(f"tr[data-lease-key='{lease_key(10)}'] td.lineage")
    lineage.get_by_text("2 parents").click()
    expect(lineage.locator("li")).to_have_text([f"parent {lease_key(4)}", f"parent {lease_key(5)}"])
    assert_fits(frame.locator("#leases-frame"))
    page.close()


def test_250_leases_page_sort_and_filter_by_owner_outcome_and_text(context, server, application):
    page = open_page(context, server, application)
    rows = page.locator("#leases tbody tr")
    keys = rows.locator("td:first-child")
    expect(page.locator("#lease-range")).to_have_text("1–100 of 250")
    expect(rows).to_have_count(100)

    page.get_by_role("button", name="Next").click()
    expect(page.locator("#lease-range")).to_have_text("101–200 of 250")
    expect(keys.first).to_have_text(lease_key(100))
    page.get_by_role("button", name="Next").click()
    expect(page.locator("#lease-range")).to_have_text("201–250 of 250")
    expect(page.get_by_role("button", name="Next")).to_be_disabled()

    page.get_by_role("button", name="KB/s").click()  # a new sort starts on the first page, largest first
    expect(page.locator("th[data-sort='throughput_kbps']")).to_have_attribute("aria-sort", "descending")
    expect(page.locator("#lease-range")).to_have_text("1–100 of 250")
    expect(keys.first).to_have_text(lease_key(249))
    page.get_by_role("button", name="KB/s").click()
    expect(page.locator("th[data-sort='throughput_kbps']")).to_have_attribute("aria-sort", "ascending")
    expect(keys.first).to_have_text(lease_key(0))

    owned_by_1 = sum(lease_owner(index) == WORKERS[1] for index in range(LEASE_COUNT))
    page.get_by_label("Owner").select_option(WORKERS[1])
    expect(page.locator("#lease-range")).to_have_text(f"1–{owned_by_1} of {owned_by_1} (filtered from 250)")
    expect(rows.locator("td:nth-child(2)").filter(has_not_text=WORKERS[1])).to_have_count(0)
    page.get_by_label("Owner").select_option("")
    page.get_by_label("Outcome").select_option("failed")
    expect(page.locator("#lease-range")).to_have_text("1–1 of 1 (filtered from 250)")
    expect(keys).to_have_text([lease_key(1)])
    page.get_by_label("Outcome").select_option("")
    page.get_by_label("Search").fill("shardId-24")
    expect(keys).to_have_text([lease_key(index) for index in range(240, 250)])
    page.get_by_label("Search").fill("no-such-shard")
    expect(page.locator("#leases-empty")).to_have_text("No lease matches these filters (250 lease(s) in all).")
    expect(page.locator("#leases-frame")).to_be_hidden()
    page.close()


def test_the_deployments_pipelines_are_listed_and_choosing_one_shows_its_application(
    context, server, application, empty_application
):
    page = open_page(context, server, application)
    select = page.get_by_role("combobox", name="The deployment's pipelines")
    expect(select.locator("option")).to_have_text([f"{EMPTY_APPLICATION} (empty_to_lake)", f"{APPLICATION} ({DAG_ID})"])
    expect(select).to_have_value(APPLICATION)
    with page.expect_navigation(url=lambda url: f"application={EMPTY_APPLICATION}" in url):
        select.select_option(EMPTY_APPLICATION)
    expect(page.locator("#application-name")).to_have_text(EMPTY_APPLICATION)
    expect(page.locator("#leader")).to_have_text("no round has run yet")
    page.close()


def test_an_application_without_rounds_leases_or_workers_says_what_each_empty_part_means(
    context, server, empty_application
):
    page = open_page(context, server, empty_application)
    expect(page.locator("#leader")).to_have_text("no round has run yet")
    expect(page.locator("#last-round")).to_have_text("No round has finished yet.")
    expect(page.locator("#history-empty")).to_have_text(
        "No history yet: charts appear once a round of this application has finished."
    )
    expect(page.locator("figure.chart")).to_have_count(0)
    expect(page.locator("#rounds-empty")).to_have_text(
        "No rounds yet: the pipeline has not finished a round of this application."
    )
    expect(page.locator("#rounds")).to_be_hidden()
    expect(page.locator("#workers-empty")).to_have_text(
        "No workers: no lease has an owner and no slot has reported metrics yet."
    )
    expect(page.locator("#leases-empty")).to_have_text(
        "No leases: shard sync has not created any for this application yet (its first round does)."
    )
    expect(page.locator("#corrupt-section")).to_be_hidden()
    page.close()


def consumer_entry(stream: str, note: str, arn: str) -> str:
    """A pattern of one consumer on the page's fan-out line; moto's clock sets its creation time."""
    created = r", created \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 "
    return re.escape(f"{stream}: {FAN_OUT_APPLICATION} ACTIVE") + created + re.escape(f"{note} {arn}")


def test_the_fan_out_consumers_are_listed_by_stream_and_one_the_application_did_not_register_is_flagged(
    context, server, fan_out_consumers
):
    page = open_page(context, server, FAN_OUT_APPLICATION)
    line = page.locator("#stream-consumers")
    entries = [
        consumer_entry(RECREATED_STREAM, NOT_OURS, fan_out_consumers[RECREATED_STREAM]),
        consumer_entry(OURS_STREAM, "(ours)", fan_out_consumers[OURS_STREAM]),
    ]
    expect(line).to_have_text(re.compile(f"^Fan-out consumers: {' · '.join(entries)}$"))
    expect(line.locator(".outcome.bad")).to_have_text([NOT_OURS])
    page.close()


def test_a_dag_run_tab_shows_its_round_and_a_lease_table_that_fits(context, server, application):
    page = context.new_page()
    page.goto(f"{server.base_url}/dags/{DAG_ID}/runs/manual__r5")
    page.get_by_test_id("main-content").get_by_role("link", name="Kinesis leases").click()
    frame = page.frame_locator("iframe[title='Kinesis leases']")

    expect(frame.locator("#run-heading")).to_have_text(f"DAG run manual__r5 of {DAG_ID}")
    expect(frame.locator("#run-round .badge")).to_have_text(["success"])
    expect(frame.locator("#run-round dd").nth(3)).to_have_text("1,234")
    expect(frame.locator("#run-round")).to_contain_text("table snapshot9007199254740998")
    expect(frame.locator("#run-round")).to_contain_text("dead-lettered2")
    expect(frame.locator("#run-round")).to_contain_text("outputiceberg://glue/lake.orders")
    expect(frame.locator("#leases tbody tr")).to_have_count(100)
    assert_fits(frame.locator("#leases-frame"))
    assert_fits(frame.locator("#rounds-section .table-frame"))
    assert_fits(frame.locator("body"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "monitoring-dag-run-tab.png"))
    page.close()


def test_the_page_follows_airflows_dark_mode(context, server, application):
    page = context.new_page()
    frame = open_monitoring(page, server, application)
    expect(frame.locator("html")).to_have_attribute("data-theme", "light")
    light = frame.locator("body").evaluate("body => getComputedStyle(body).backgroundColor")

    page.evaluate("() => localStorage.setItem('theme', 'dark')")  # Airflow's own setting (next-themes)
    frame = open_monitoring(page, server, application)
    expect(page.locator("html")).to_have_class(re.compile(r"\bdark\b"))
    expect(frame.locator("html")).to_have_attribute("data-theme", "dark")
    dark = frame.locator("body").evaluate("body => getComputedStyle(body).backgroundColor")
    assert dark != light
    expect(frame.locator("figure.chart canvas")).to_have_count(6)
    # Switched back in Airflow while the page is open: it follows without a reload.
    page.evaluate("() => { document.documentElement.classList.replace('dark', 'light'); }")
    expect(frame.locator("html")).to_have_attribute("data-theme", "light")
    page.close()


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_screenshots_of_the_page_at_1280_px_are_saved(context, server, application, mode):
    page = context.new_page()
    page.goto(server.base_url + "/")
    page.evaluate("mode => localStorage.setItem('theme', mode)", mode)
    page.goto(f"{server.base_url}/kinesis-lease/?application={application}")
    expect(page.locator("html")).to_have_attribute("data-theme", mode)
    expect(page.locator("figure.chart canvas")).to_have_count(6)
    expect(page.locator("#leases tbody tr")).to_have_count(100)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"monitoring-{mode}.png"
    page.screenshot(path=str(path), full_page=True)
    # The part an operator reads first (state now, history, last rounds): the one docs/operating.md shows.
    box = page.locator("#rounds-section").bounding_box()
    assert box is not None
    top = ARTIFACTS / f"monitoring-{mode}-top.png"
    page.set_viewport_size({"width": VIEWPORT["width"], "height": round(box["y"] + box["height"])})
    page.screenshot(path=str(top))
    assert path.stat().st_size > 0 and top.stat().st_size > 0
    page.close()


def test_the_json_api_refuses_a_browser_without_the_airflow_session(server, browser, application):
    context = browser.new_context()
    response = context.request.get(f"{server.base_url}/kinesis-lease/api/applications/{application}")
    assert (response.status, response.json()) == (401, {"detail": "Not authenticated"})
    page = context.new_page()
    page.goto(f"{server.base_url}/kinesis-lease/?application={application}")
    expect(page.locator("input[name=username]")).to_be_visible()  # the login page, no lease data
    context.close()
