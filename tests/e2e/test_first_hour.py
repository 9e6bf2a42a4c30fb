"""A data engineer's first hour, from the built wheel in a fresh venv, in a folder outside the checkout,
as the README's "Your own pipelines" walk-through leads them (`tests/support/first_hour.py`): two
pipelines of their own (JSON clicks with a decoder into Iceberg on a SQLite catalog with dead letters;
KPL orders with a transform into a local Delta folder), rounds with `airflow dags test`, a split, a
replay of the dead letters with a fixed decoder, a backfill of a time window, and the mistakes a
newcomer makes, each refused naming what is wrong. Every command runs from the venv as a process."""

from __future__ import annotations

import json
import re
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from devtools.kinesis_streams import create_stream, kinesis_client, open_shards, split_shard
from tests.support.first_hour import CLICKS, NAMESPACE, FirstHour, sorted_column
from tests.support.installed_package import build_wheel, installed_venv, outside_environment, run

ORDERS_BEFORE_SPLIT = range(1, 21)
ORDERS_AFTER_SPLIT = range(21, 31)
ROUND_TIMEOUT = 420


def dag_test(python: Path, dag_id: str, hour: FirstHour, env: dict[str, str], *conf: str) -> str:
    """`airflow dags test DAG_ID [-c CONF]` from the venv; its state and output."""
    result = run(
        python, "-I", "-m", "airflow", "dags", "test", dag_id, *conf, cwd=hour.root, env=env, timeout=ROUND_TIMEOUT
    )
    output = result.stdout + result.stderr
    finished = re.search(rf"DagRun Finished: dag_id={re.escape(dag_id)},.*? state=(\w+),", output)
    assert finished is not None and finished[1] == "success", output[-4000:]
    return output


def test_a_newcomers_two_pipelines_land_once_across_a_split_then_replay_and_backfill_from_the_installed_wheel(
    airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    python = installed_venv(tmp_path / "installed", build_wheel(tmp_path / "dist"))
    hour = FirstHour.create(tmp_path / "user", unique_name)
    env = outside_environment(
        {
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([hour.bundle()]),
            "PYSPARK_PYTHON": str(python),
            **hour.catalog_environment(),
            # what the local trial tells a newcomer to export, for leasectl and boto3
            "AWS_ENDPOINT_URL_DYNAMODB": moto_endpoint,
            "AWS_ENDPOINT_URL_S3": moto_endpoint,
            "AWS_ENDPOINT_URL_KINESIS": kinesis_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }
    )
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, hour.clicks, 1)
    create_stream(kinesis, hour.orders, 2)
    run(
        python,
        "-I",
        "-c",
        f"from pyiceberg.catalog import load_catalog; load_catalog('lake').create_namespace({NAMESPACE!r})",
        env=env,
        cwd=hour.root,
    )

    # Round 1 of each: every valid click once, the two bad ones in the dead letters; every order once.
    hour.produce_clicks(kinesis)
    window_start = datetime.now(UTC) - timedelta(seconds=1)
    hour.produce_orders(kinesis, ORDERS_BEFORE_SPLIT)
    time.sleep(2.0)
    window_end = datetime.now(UTC)
    time.sleep(1.0)
    dag_test(python, "clicks_to_lake", hour, env)
    dag_test(python, "orders_to_lake", hour, env)

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
    dag_test(python, "orders_to_lake", hour, env)
    assert sorted_column(hour.orders_table(), "order_id") == [*ORDERS_BEFORE_SPLIT, *ORDERS_AFTER_SPLIT]

    # The replay: the fixed decoder lands the one it can read and gives up on the garbage, saying so.
    leasectl = python.with_name("leasectl")
    replay = run(
        leasectl,
        "--app",
        hour.clicks,
        "replay-dead-letters",
        "--output-uri",
        f"iceberg://lake/{NAMESPACE}.clicks",
        "--decode",
        "users_code:replay_click",
        cwd=hour.root,
        env={**env, "PYTHONPATH": str(hour.code.parent)},
    )
    assert "except the 1 the decoder left out on purpose" in replay.stdout, replay.stdout
    assert sorted_column(hour.clicks_table(), "click_id") == [*range(1, CLICKS + 1), 7000]

    # A backfill of the first orders' window into a Delta table of its own, beside the live one.
    window = {"mode": "backfill", "start": window_start.isoformat(), "end": window_end.isoformat()}
    dag_test(python, "orders_to_lake", hour, env, "-c", json.dumps(window))
    [backfill] = (hour.lake / "orders-backfill").iterdir()
    assert sorted_column(hour.orders_table(str(backfill)), "order_id") == list(ORDERS_BEFORE_SPLIT)

    # The mistakes, each refused naming what is wrong: a misspelled setting when its file is parsed,
    # an unconfigured catalog when its round starts, before anything is read, and without retries.
    errors = subprocess.run(
        [python, "-I", "-m", "airflow", "dags", "list-import-errors", "-o", "json"],
        capture_output=True,
        text=True,
        cwd=hour.root,
        env=env,
        check=False,
    )
    listed = json.loads(errors.stdout.strip().splitlines()[-1])  # (Airflow's warnings are logged before it)
    found = {Path(entry["filepath"]).stem: entry["error"] for entry in listed}
    assert set(found) == {"misspelled_setting"}, found
    assert "did you mean 'max_leases_for_worker'?" in found["misspelled_setting"]
    started = time.monotonic()
    failed = subprocess.run(
        [python, "-I", "-m", "airflow", "dags", "test", "unconfigured_catalog"],
        capture_output=True,
        text=True,
        cwd=hour.root,
        env=env,
        check=False,
        timeout=ROUND_TIMEOUT,
    )
    output = failed.stdout + failed.stderr
    assert re.search(r"DagRun Finished: dag_id=unconfigured_catalog,.*? state=failed,", output), output[-4000:]
    assert "catalog 'nowhere'" in output and time.monotonic() - started < 120, output[-4000:]
