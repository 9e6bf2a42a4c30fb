"""The monitoring page in the Airflow UI, in headless Chromium against a real `airflow api-server`.

A user signs in on Airflow's own login page (SimpleAuthManager), opens the plugin's navigation entry,
picks the application, and sees the load bars and the per-shard table of leases written to DynamoDB
on moto; a request without the session is refused.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, FrameLocator, Page, expect, sync_playwright

from lease_core.leader.round_history import RoundHistory
from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.store.coordinator_state import DynamoDBCoordinatorStateStore
from tests.support.airflow_server import PASSWORDS, AirflowServer, airflow_api_server
from tests.support.stores import FAST_RETRIES, dynamodb_store, fast_config, put_raw_item

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
APPLICATION = "browser-app"
WORKER_0, WORKER_1 = f"{APPLICATION}-worker-0", f"{APPLICATION}-worker-1"

pytestmark = pytest.mark.moto


@pytest.fixture(scope="module")
def server(moto_endpoint: str) -> Iterator[AirflowServer]:
    with airflow_api_server(moto_endpoint) as airflow:
        yield airflow


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def application(moto_endpoint: str) -> str:
    """Two leases on worker 0 (300 + 100 KB/s), one on worker 1 (100 KB/s), a corrupt item, and one finished round."""
    store = dynamodb_store(moto_endpoint, APPLICATION)
    for key, checkpoint, throughput, owner in (
        ("shardId-000", "1000", 300.0, WORKER_0),
        ("shardId-001", "2000", 100.0, WORKER_0),
        ("shardId-002", "3000", 100.0, WORKER_1),
    ):
        lease = Lease(key, ExtendedSequenceNumber(checkpoint), throughput_kbps=throughput)
        assert store.create_lease_if_not_exists(lease) and store.assign_lease(lease, owner).applied
    # A fourth item that is not a readable lease: the page names it and its attribute.
    put_raw_item(store, {"leaseKey": {"S": "shardId-003"}, "leaseCounter": {"S": "x"}, "checkpoint": {"S": "LATEST"}})
    state = DynamoDBCoordinatorStateStore(store.client, fast_config(APPLICATION).coordinator_state_table, FAST_RETRIES)
    history = RoundHistory(state)
    history.append(
        {
            "round": 7,
            "run_id": "scheduled__7",
            "records": 1234,
            "bytes": 56789,
            "files": 3,
            "busiest_over_bound": 1.0712,
        }
    )
    history.record_lease_rows(
        7,
        [
            {
                "lease_key": "shardId-000",
                "records": 1234,
                "millis_behind_latest": 4500,
                "outcome": "caught_up",
                "worker_id": WORKER_0,
            }
        ],
    )
    return APPLICATION


def sign_in(page: Page, server: AirflowServer) -> None:
    page.goto(server.base_url + "/")
    page.locator("input[name=username]").fill("viewer")
    page.locator("input[name=password]").fill(PASSWORDS["viewer"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Welcome")).to_be_visible()


def open_monitoring(page: Page, application: str) -> FrameLocator:
    page.get_by_role("link", name="Kinesis leases").click()
    frame = page.frame_locator("iframe[title='Kinesis leases']")
    frame.locator("#application-input").fill(application)
    frame.get_by_role("button", name="Show").click()
    return frame


def test_a_signed_in_user_sees_load_bars_and_the_shards_of_an_application(server, browser, application):
    page = browser.new_page()
    sign_in(page, server)
    frame = open_monitoring(page, application)

    expect(frame.locator("#application-name")).to_have_text(application)
    bars = {WORKER_0: "100%", WORKER_1: "25%"}
    for worker, width in bars.items():
        expect(frame.locator(f".worker[data-worker='{worker}'] .fill")).to_have_attribute("style", f"width: {width};")
    expect(frame.locator(f".worker[data-worker='{WORKER_0}'] .worker-figures")).to_contain_text("2 lease(s) (67%)")

    shards = frame.locator("#leases tbody tr")
    expect(shards).to_have_count(3)
    expect(frame.locator("tr[data-lease-key='shardId-000'] td")).to_have_text(
        ["shardId-000", WORKER_0, "1000", "-", "4,500", "300.0", "caught_up · 1,234 record(s)", "-", "-", "1"]
    )
    expect(frame.locator("tr[data-lease-key='shardId-002'] td").nth(1)).to_have_text(WORKER_1)
    expect(frame.locator("#corrupt-items li")).to_have_text(
        ["lease item 'shardId-003' is not a valid KCL lease: attribute 'leaseCounter' must be of type N, found S"]
    )
    expect(frame.locator("#leader")).to_have_text("none (no round has taken the lock)")
    expect(frame.locator("#rounds tr[data-round='7'] td").nth(2)).to_have_text("1,234")
    expect(frame.locator("#rounds tr[data-round='7'] td").last).to_have_text("1.07x")
    page.close()


def test_the_json_api_refuses_a_browser_without_the_airflow_session(server, browser, application):
    context = browser.new_context()
    response = context.request.get(f"{server.base_url}/kinesis-lease/api/applications/{application}")
    assert (response.status, response.json()) == (401, {"detail": "Not authenticated"})
    page = context.new_page()
    page.goto(f"{server.base_url}/kinesis-lease/?application={application}")
    expect(page.locator("input[name=username]")).to_be_visible()  # the login page, no lease data
    context.close()
