"""A quiet stream's runs are skipped as idle only when nothing waits: a closed shard's lease that has not
reached SHARD_END, or a committed batch left staged, makes the next run consume, once.

The DAG's Kinesis calls (the Spark executors' included) go through a proxy that ends closed shards one
call after their last records, as real Kinesis may: kinesis-mock alone answers the end with them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.airflow_env import run_environment
from devtools.fault_proxy import LATE_SHARD_END_STAT, FaultProxy
from devtools.kinesis_streams import create_stream, kinesis_client, split_shard
from lease_core.model.sequence import SHARD_END
from sinks.parquet import visible_path
from tests.support.airflow_dag import airflow_environment, run_round
from tests.support.pipeline import ConsumerPipeline, duplicates


@pytest.fixture(scope="module")
def late_ends(kinesis_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(kinesis_endpoint) as proxy:
        proxy.end_shards_after_last_records()
        yield proxy


@pytest.fixture(scope="module")
def rounds_with_late_ends(
    late_ends: FaultProxy,
    moto_endpoint: str,
    spark_connection: dict[str, Any],
    spark_submit_environment: dict[str, str],
    airflow_metadata_db: None,
) -> Iterator[None]:
    variables = run_environment(late_ends.endpoint, moto_endpoint, spark_connection, spark_submit_environment)
    with airflow_environment(variables):
        yield


def one_round_read(name: str, proxy: FaultProxy, moto_endpoint: str, lake: Path) -> tuple[ConsumerPipeline, dict]:
    create_stream(kinesis_client(proxy.endpoint), name, 1)
    ledger = ConsumerPipeline(name, (name,), proxy.endpoint, moto_endpoint, str(lake))
    conf = {
        "streams": [name],
        "application_name": name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(lake),
    }
    ledger.produce(30)
    return ledger, conf


def test_a_closed_shard_at_its_last_record_is_ended_by_the_next_run_of_a_quiet_stream(
    dag, rounds_with_late_ends, late_ends, moto_endpoint, unique_name, tmp_path
):
    ledger, conf = one_round_read(unique_name, late_ends, moto_endpoint, tmp_path / "lake")
    assert run_round(dag, conf)["consume"] == "success"
    (parent,) = ledger.leases()
    children = set(split_shard(ledger.kinesis, unique_name, parent))  # and nothing more is written
    ended_late = late_ends.stats().get(LATE_SHARD_END_STAT, 0)

    ending = run_round(dag, conf)

    assert ending["consume"] == "success", ending
    leases = ledger.leases()
    assert leases[parent].checkpoint == SHARD_END and children <= set(leases)
    assert late_ends.stats().get(LATE_SHARD_END_STAT, 0) > ended_late
    assert run_round(dag, conf)["consume"] == "skipped"  # now the stream is really idle
    assert set(ledger.landed()) == set(ledger.produced) and duplicates(ledger.landed()) == []


def test_a_committed_batch_left_invisible_is_made_visible_by_the_next_run_of_a_quiet_stream(
    dag, rounds_with_late_ends, late_ends, moto_endpoint, unique_name, tmp_path
):
    ledger, conf = one_round_read(unique_name, late_ends, moto_endpoint, tmp_path / "lake")
    assert run_round(dag, conf)["consume"] == "success"
    (lease,) = ledger.leases().values()
    staged = lease.committed_batch
    assert staged is not None
    # The state a crash between the commit and the promotion leaves: the committed file only staged.
    lake = tmp_path / "lake"
    os.replace(lake / visible_path(staged), lake / staged)
    assert ledger.landed() == []

    promoting = run_round(dag, conf)

    assert promoting["consume"] == "success", promoting
    assert set(ledger.landed()) == set(ledger.produced) and duplicates(ledger.landed()) == []
    assert run_round(dag, conf)["consume"] == "skipped"
