"""A data engineer's first hour, as the README's "Your own pipelines" walk-through leads them, and as a
user of the published package does it: the wheel installed with pip into a fresh venv (the session's
`pip_installed`: `pip install "<wheel>[local]"`), the emulators of `kinesis-lease local up` and the
environment it prints, an Airflow home of their own with their DAG files in it, and their code in a
folder outside the checkout (`tests/support/first_hour.py`): two pipelines (JSON clicks with a decoder
into Iceberg on a SQLite catalog with dead letters; KPL orders with a transform into a local Delta
folder). Then rounds with `airflow dags test`, a split, a replay of the dead letters with a fixed
decoder, a backfill of a time window, and the mistakes a newcomer makes, each refused naming what is
wrong. Every command runs from the venv as a process, with its bin first on PATH as activating it does."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devtools.kinesis_streams import kinesis_client, open_shards, split_shard
from tests.support.first_hour import CLICKS, NAMESPACE, FirstHour, sorted_column
from tests.support.installed_package import REPOSITORY, PipVenv, run

ORDERS_BEFORE_SPLIT = range(1, 21)
ORDERS_AFTER_SPLIT = range(21, 31)
ROUND_TIMEOUT = 420
KINESIS_MOCK = REPOSITORY / "packaging" / "kinesis-mock"  # where `npm install kinesis-local@0.6.2` put it


@dataclass(frozen=True)
class Shell:
    """The newcomer's shell: the activated venv and the trial's environment."""

    venv: PipVenv
    env: dict[str, str]
    cwd: Path

    def run(self, command: str, *arguments: str | Path, **variables: str) -> subprocess.CompletedProcess[str]:
        return run(
            self.venv.bin / command, *arguments, env={**self.env, **variables}, cwd=self.cwd, timeout=ROUND_TIMEOUT
        )

    def attempt(self, command: str, *arguments: str) -> subprocess.CompletedProcess[str]:
        """A command that may fail."""
        return subprocess.run(
            [str(self.venv.bin / command), *arguments],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
            check=False,
            timeout=ROUND_TIMEOUT,
        )

    def dag_test(self, dag_id: str, *conf: str) -> str:
        """`airflow dags test DAG_ID [-c CONF]`, which must succeed; its output."""
        result = self.attempt("airflow", "dags", "test", dag_id, *conf)
        output = result.stdout + result.stderr
        finished = re.search(rf"DagRun Finished: dag_id={re.escape(dag_id)},.*? state=(\w+),", output)
        assert finished is not None and finished[1] == "success", output[-4000:]
        return output


@pytest.fixture
def shell(pip_installed: PipVenv, tmp_path: Path) -> Iterator[Shell]:
    """The README's steps 1-3: the activated venv, `kinesis-lease local up` (on kinesis-mock, which
    reshards) and what `kinesis-lease local env` prints, an Airflow home migrated; `down` afterwards."""
    path = f"{pip_installed.bin}{os.pathsep}{os.environ['PATH']}"
    newcomer = Shell(pip_installed, pip_installed.environment(PATH=path), tmp_path)
    state = ("--state-dir", str(tmp_path / "trial"))
    newcomer.run("kinesis-lease", "local", "up", "--kinesis", "kinesis-mock", "--kinesis-mock", KINESIS_MOCK, *state)
    try:
        for line in newcomer.run("kinesis-lease", "local", "env", *state).stdout.splitlines():
            if line.startswith("export "):
                name, _, value = shlex.split(line)[1].partition("=")
                newcomer.env[name] = value
        newcomer.env.update(AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__LOAD_EXAMPLES="False")
        newcomer.run("airflow", "db", "migrate")
        yield newcomer
    finally:
        newcomer.run("kinesis-lease", "local", "down", *state)


def test_a_newcomers_two_pipelines_land_once_across_a_split_then_replay_and_backfill_from_the_pip_install(
    shell, unique_name, tmp_path
):
    hour = FirstHour.create(tmp_path / "user", Path(shell.env["AIRFLOW_HOME"]) / "dags", unique_name)
    shell.env.update(hour.catalog_environment())
    for stream, shards in ((hour.clicks, "1"), (hour.orders, "2")):
        shell.run(
            "kinesis-lease",
            "local",
            "create-stream",
            stream,
            "--shards",
            shards,
            "--state-dir",
            str(tmp_path / "trial"),
        )
    shell.run(
        "python",
        "-c",
        f"from pyiceberg.catalog import load_catalog; load_catalog('lake').create_namespace({NAMESPACE!r})",
    )
    kinesis = kinesis_client(shell.env["AWS_ENDPOINT_URL_KINESIS"])

    # Round 1 of each: every valid click once, the two bad ones in the dead letters; every order once.
    hour.produce_clicks(kinesis)
    window_start = datetime.now(UTC) - timedelta(seconds=1)
    hour.produce_orders(kinesis, ORDERS_BEFORE_SPLIT)
    time.sleep(2.0)
    window_end = datetime.now(UTC)
    time.sleep(1.0)
    shell.dag_test("clicks_to_lake")
    shell.dag_test("orders_to_lake")

    clicks = hour.clicks_table()
    assert sorted_column(clicks, "click_id") == list(range(1, CLICKS + 1))
    assert {"data", "explicit_hash_key"}.isdisjoint(clicks.column_names), "a decoded table has no payload columns"
    dead = hour.clicks_table("clicks_dead_letters")
    assert sorted(dead.column("data").to_pylist()) == sorted([b"click 7000 /home", b"\x00\x01garbage"])
    assert sorted_column(hour.orders_table(), "order_id") == list(ORDERS_BEFORE_SPLIT)

    # A split, more orders, round 2: every order once across parent and children.
    hottest = open_shards(kinesis, hour.orders)[0].shard_id
    split_shard(kinesis, hour.orders, hottest)
    hour.produce_orders(kinesis, ORDERS_AFTER_SPLIT)
    shell.dag_test("orders_to_lake")
    assert sorted_column(hour.orders_table(), "order_id") == [*ORDERS_BEFORE_SPLIT, *ORDERS_AFTER_SPLIT]

    # The replay: the fixed decoder lands the one it can read and gives up on the garbage, saying so.
    replay = shell.run(
        "leasectl",
        "--app",
        hour.clicks,
        "replay-dead-letters",
        "--output-uri",
        f"iceberg://lake/{NAMESPACE}.clicks",
        "--decode",
        "users_code:replay_click",
        PYTHONPATH=str(hour.code.parent),
    )
    assert "except the 1 the decoder left out on purpose" in replay.stdout, replay.stdout
    assert sorted_column(hour.clicks_table(), "click_id") == [*range(1, CLICKS + 1), 7000]

    # A backfill of the first orders' window into a Delta table of its own, beside the live one.
    window = {"mode": "backfill", "start": window_start.isoformat(), "end": window_end.isoformat()}
    shell.dag_test("orders_to_lake", "-c", json.dumps(window))
    [backfill] = (hour.lake / "orders-backfill").iterdir()
    assert sorted_column(hour.orders_table(str(backfill)), "order_id") == list(ORDERS_BEFORE_SPLIT)

    # The mistakes, each refused naming what is wrong: a misspelled setting when its file is parsed,
    # an unconfigured catalog when its round starts, before anything is read, and without retries.
    errors = shell.attempt("airflow", "dags", "list-import-errors", "-o", "json")
    listed = json.loads(errors.stdout.strip().splitlines()[-1])  # (Airflow's warnings are logged before it)
    found = {Path(entry["filepath"]).stem: entry["error"] for entry in listed}
    assert set(found) == {"misspelled_setting"}, found
    assert "did you mean 'max_leases_for_worker'?" in found["misspelled_setting"]
    started = time.monotonic()
    failed = shell.attempt("airflow", "dags", "test", "unconfigured_catalog")
    output = failed.stdout + failed.stderr
    assert re.search(r"DagRun Finished: dag_id=unconfigured_catalog,.*? state=failed,", output), output[-4000:]
    assert "catalog 'nowhere'" in output and time.monotonic() - started < 120, output[-4000:]
