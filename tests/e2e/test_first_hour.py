"""A data engineer's first hour: the README's walk-through ("Your own pipelines") run as written, block by
block (`tests/support/readme_walkthrough.py`), in a home folder of its own outside the checkout, from
the wheel installed with pip. Then the mistakes a newcomer makes, each refused naming what is wrong.

Step 1 (a fresh venv, `pip install "<wheel>[local]"`) is the session's `pip_installed`, which runs
those commands (tests/e2e/conftest.py); the shell activates that venv. Every later block runs as the
README has it: `kinesis-lease local up` (on kinesis-mock, which a user installs with npm: here the
project's copy, named by KINESIS_MOCK_HOME), two streams, a JSON producer and a KPL one, an
Iceberg table on a SQLite catalog and a Delta folder, rounds with `airflow dags test`, a split, the
replay of the dead letters, a backfill, the API server and its JSON routes with a token.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog

from tests.support.delta_tables import delta_rows
from tests.support.installed_package import REPOSITORY, PipVenv
from tests.support.readme_walkthrough import ReadmeShell, walkthrough_blocks

KINESIS_MOCK = REPOSITORY / "packaging" / "kinesis-mock"
FIRST_BLOCK = [
    "python3.11 -m venv ~/kinesis-trial/venv",
    ". ~/kinesis-trial/venv/bin/activate",
    'pip install "$(ls kinesis_lease_batch-*.whl)[local]"',
]
CLICKS = list(range(1, 13))
ORDERS = list(range(1, 31))
# A newcomer's mistakes, each in a DAG file of its own (a file that fails to import takes every pipeline in it).
MISTAKES = {
    "misspelled_setting.py": 'settings={"max_leases_for_workr": 8}, output_uri="delta:/tmp/never"',
    "unconfigured_catalog.py": 'output_uri="iceberg://nowhere/web.clicks", initial_position="TRIM_HORIZON"',
    "misnamed_decoder.py": 'decode="events:decode_clicks", py_files="{code}", initial_position="TRIM_HORIZON", output_uri="iceberg://lake/web.again"',
}
MISTAKE = """
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

mistake: DAG = kinesis_pipeline("{name}", streams=["clicks"], application_name="{name}", schedule=None, {arguments})
"""


@pytest.fixture
def shell(pip_installed: PipVenv, tmp_path: Path) -> Iterator[ReadmeShell]:
    """A terminal in a fresh home, with the session's pip-installed venv activated."""
    environment = pip_installed.environment(KINESIS_MOCK_HOME=str(KINESIS_MOCK))
    newcomer = ReadmeShell(tmp_path / "home", tmp_path, environment)
    try:
        yield newcomer
    finally:
        newcomer.stop()
        newcomer.run("kinesis-lease local down")


def test_the_readmes_walkthrough_runs_as_written_from_the_pip_installed_wheel(shell, pip_installed):
    first, *blocks = walkthrough_blocks()
    assert first.strip().splitlines() == FIRST_BLOCK, "the session's pip_installed runs these commands"
    shell.run(f". {pip_installed.bin / 'activate'}")

    outputs = [shell.run(block) for block in blocks]

    told = "\n".join(outputs)
    rounds = re.findall(r"DagRun Finished: dag_id=(\w+),.*? state=(\w+)", told)
    assert rounds == [
        ("clicks_to_lake", "success"),
        ("orders_to_lake", "success"),
        ("orders_to_lake", "success"),
        ("orders_to_lake", "success"),
    ], told[-5000:]
    assert "every dead letter is in the output except the 1 the decoder left out on purpose" in told
    trial = shell.home / "kinesis-trial"
    lake = load_catalog("lake", **catalog_properties(trial))
    clicks = lake.load_table("web.clicks").scan().to_arrow()
    assert sorted(clicks.column("click_id").to_pylist()) == [*CLICKS, 7000], "each click once, the replayed one too"
    assert {"data", "explicit_hash_key"}.isdisjoint(clicks.column_names), "a decoded table has no payload columns"
    dead = lake.load_table("web.clicks_dead_letters").scan().to_arrow()
    assert sorted(dead.column("data").to_pylist()) == [b"\x00\x01garbage", b"click 7000 /home"]
    orders = delta_rows(str(trial / "lake" / "orders"))
    assert sorted(orders.column("order_id").to_pylist()) == ORDERS, "each order once, across the split"
    [backfill] = (trial / "lake" / "orders-backfill").iterdir()
    window = delta_rows(str(backfill))
    assert sorted(window.column("order_id").to_pylist()) == ORDERS[:20], "the window's orders, once"
    page = MonitoringApi(shell)
    assert page.get("applications")["pipelines"] == [
        {"dag_id": "clicks_to_lake", "application": "clicks-lake"},
        {"dag_id": "orders_to_lake", "application": "orders-lake"},
    ]
    assert len(page.get("applications/orders-lake")["rounds"]) == 2, "the live pipeline's two rounds"

    check_the_mistakes_are_refused_naming_what_is_wrong(shell)


def check_the_mistakes_are_refused_naming_what_is_wrong(shell: ReadmeShell) -> None:
    """A misspelled setting when its file is parsed; an unconfigured catalog and a decoder that is not
    there when their round starts, at once and without retries."""
    dags = Path(shell.variable("AIRFLOW_HOME")) / "dags"
    for file, arguments in MISTAKES.items():
        code = dags.parents[1] / "code" / "events.py"  # the walk-through's module, as its pipelines ship it
        (dags / file).write_text(MISTAKE.format(name=Path(file).stem, arguments=arguments.replace("{code}", str(code))))
    started = time.monotonic()
    output = shell.run("airflow dags test unconfigured_catalog 2>&1 || true")
    assert re.search(r"DagRun Finished: dag_id=unconfigured_catalog,.*? state=failed", output), output[-4000:]
    assert "catalog 'nowhere' is not configured" in output, output[-4000:]
    assert time.monotonic() - started < 120, "refused at once, not after the task's retries"

    started = time.monotonic()
    output = shell.run("airflow dags test misnamed_decoder 2>&1 || true")
    assert re.search(r"DagRun Finished: dag_id=misnamed_decoder,.*? state=failed", output), output[-4000:]
    assert "decoder 'events:decode_clicks' cannot be loaded: module 'events' has no attribute" in output, output[-4000:]
    assert time.monotonic() - started < 120, "refused at once, not after the task's retries"

    # (the run parsed the DAG folder and recorded what failed to import)
    listed = shell.run("airflow dags list-import-errors -o json || true").strip().splitlines()
    found = {Path(entry["filepath"]).name: entry["error"] for entry in json.loads(listed[-1])}
    assert set(found) == {"misspelled_setting.py"}, found
    assert "did you mean 'max_leases_for_worker'?" in found["misspelled_setting.py"]


class MonitoringApi:
    """The page's JSON routes on the walk-through's API server, signed in as the README says."""

    def __init__(self, shell: ReadmeShell) -> None:
        self.base = f"http://127.0.0.1:{shell.port}"
        passwords = Path(shell.variable("AIRFLOW_HOME")) / "simple_auth_manager_passwords.json.generated"
        credentials = {"username": "admin", "password": json.loads(passwords.read_text())["admin"]}
        self.token = self._call("/auth/token", json.dumps(credentials).encode())["access_token"]

    def get(self, route: str) -> Any:
        return self._call(f"/kinesis-lease/api/{route}")

    def _call(self, path: str, body: bytes | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if body is None:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.base + path, data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)


def catalog_properties(trial: Path) -> dict[str, str]:
    """The README's catalog `lake` (step 4), for this test's own reads."""
    return {"type": "sql", "uri": f"sqlite:///{trial}/lake/catalog.db", "warehouse": f"file://{trial}/lake"}
