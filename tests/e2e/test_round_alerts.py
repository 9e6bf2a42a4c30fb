"""A round that loses records for good fails its run (the alert) after landing and recording everything else,
once: the next round is clean."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devtools.airflow_env import run_environment
from devtools.fault_proxy import FaultProxy
from devtools.kinesis_streams import create_stream, kinesis_client
from devtools.stream_records import StreamRecord
from lease_core.leader.round_history import RoundHistory
from lease_core.ops.checkpoint_reset import render_position
from spark_jobs.slot_task import SlotTask
from tests.support.airflow_dag import airflow_environment, consumed_cleanly, run_round
from tests.support.leasectl import run_leasectl
from tests.support.pipeline import ConsumerPipeline, duplicates


@pytest.fixture(scope="module")
def trim_proxy(kinesis_endpoint: str) -> Iterator[FaultProxy]:
    """kinesis-mock behind a proxy that can simulate the trim horizon, which kinesis-mock never moves."""
    with FaultProxy(kinesis_endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def rounds_through_the_proxy(
    trim_proxy: FaultProxy,
    moto_endpoint: str,
    spark_connection: dict[str, Any],
    spark_submit_environment: dict[str, str],
    airflow_metadata_db: None,
) -> Iterator[None]:
    """The DAG's Kinesis calls, the Spark executors' included, go through `trim_proxy`."""
    variables = run_environment(trim_proxy.endpoint, moto_endpoint, spark_connection, spark_submit_environment)
    with airflow_environment(variables):
        yield


def read_once_then_trim(
    dag: Any, proxy: FaultProxy, moto_endpoint: str, name: str, tmp_path: Any
) -> tuple[ConsumerPipeline, dict[str, Any], list[StreamRecord]]:
    """A one-shard stream read by one DAG run; then 40 more records, the first 20 of which age out."""
    create_stream(kinesis_client(proxy.endpoint), name, 1)
    ledger = ConsumerPipeline(name, (name,), proxy.endpoint, moto_endpoint, str(tmp_path / "lake"))
    conf = {
        "streams": [name],
        "application_name": name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
    }
    ledger.produce(30)
    assert consumed_cleanly(run_round(dag, conf))
    later = ledger.produce(40)
    proxy.trim(name, later[20].shard_id, later[20].sequence_number)
    return ledger, conf, later


def test_records_that_aged_out_unread_fail_the_run_after_the_rest_landed_and_the_next_round_is_clean(
    dag, rounds_through_the_proxy, trim_proxy, moto_endpoint, unique_name, tmp_path
):
    ledger, conf, later = read_once_then_trim(dag, trim_proxy, moto_endpoint, unique_name, tmp_path)
    first_kept = later[20]
    alerted = run_round(dag, conf)

    assert alerted["consume"] == "success" and alerted["release_leadership"] == "success"
    assert alerted["finalize_round"] == "failed"
    landed = ledger.landed()
    assert duplicates(landed) == []
    assert set(landed) == set(ledger.produced) - set(later[:20])
    latest = RoundHistory(ledger.state).rounds()[-1]
    assert (latest["records"], latest["retention_losses"]) == (20, 1)
    # The loss is kept (history, the failed run), so its lease no longer carries it: no second alert.
    assert ledger.leases()[first_kept.shard_id].unreported_losses == frozenset()

    assert run_round(dag, conf)["finalize_round"] == "success"


def test_a_loss_whose_driver_died_before_reporting_it_is_reported_by_the_next_run_even_on_an_idle_stream(
    dag, rounds_through_the_proxy, trim_proxy, moto_endpoint, unique_name, tmp_path
):
    ledger, conf, later = read_once_then_trim(dag, trim_proxy, moto_endpoint, unique_name, tmp_path)
    # A round's only slot reads across the gap and commits past it; its driver dies before the report.
    ledger.sync()
    SlotTask(ledger.spec(1, ledger.assign(1).round_number), slot_index=0).run()
    assert set(ledger.landed()) == set(ledger.produced) - set(later[:20])

    alerted = run_round(dag, conf)  # nothing new to read: only the carried loss makes the round run
    assert (alerted["consume"], alerted["finalize_round"]) == ("success", "failed")
    latest = RoundHistory(ledger.state).rounds()[-1]
    assert (latest["records"], latest["retention_losses"]) == (0, 1)

    quiet = run_round(dag, conf)
    assert (quiet["consume"], quiet["finalize_round"]) == ("skipped", "success")


def test_a_corrupt_lease_item_fails_the_run_after_the_rest_landed_until_leasectl_repair_makes_it_a_lease_again(
    dag, rounds_through_the_proxy, trim_proxy, moto_endpoint, unique_name, tmp_path
):
    create_stream(kinesis_client(trim_proxy.endpoint), unique_name, 2)
    ledger = ConsumerPipeline(unique_name, (unique_name,), trim_proxy.endpoint, moto_endpoint, str(tmp_path / "lake"))
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
    }
    ledger.produce(20)
    assert consumed_cleanly(run_round(dag, conf))
    corrupt, healthy = sorted(ledger.leases())
    landed_through = render_position(ledger.leases()[corrupt].checkpoint)
    ledger.dynamodb.update_item(
        TableName=unique_name,
        Key={"leaseKey": {"S": corrupt}},
        UpdateExpression="SET leaseCounter = :text",
        ExpressionAttributeValues={":text": {"S": "seven"}},
    )
    later = ledger.produce(40)

    alerted = run_round(dag, conf)
    assert (alerted["consume"], alerted["finalize_round"], alerted["release_leadership"]) == (
        "success",
        "failed",
        "success",
    )
    landed = ledger.landed()
    assert duplicates(landed) == []
    assert set(landed) == set(ledger.produced) - {record for record in later if record.shard_id == corrupt}
    assert RoundHistory(ledger.state).rounds()[-1]["corrupt_leases"] == 1

    repair = run_leasectl(
        "--app",
        unique_name,
        "repair",
        "--lease",
        corrupt,
        "--to",
        landed_through,
        "--yes",
        dynamodb=moto_endpoint,
    )
    assert repair.returncode == 0, repair.stderr
    assert consumed_cleanly(run_round(dag, conf))
    landed = ledger.landed()
    assert duplicates(landed) == [] and set(landed) == set(ledger.produced)
    assert healthy in ledger.leases()
