"""Pipelines users define in their own DAG files with `kinesis_lease.pipeline`: two applications on
two streams side by side in one deployment, and a round embedded in a DAG of the user's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from devtools.airflow_env import REPOSITORY, load_dag_module
from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.errors import ConfigurationError
from lease_core.leader.round_history import RoundHistory
from spark_jobs.sinks.parquet import ParquetSink
from tests.support.airflow_dag import consumed_cleanly, run_round
from tests.support.pipeline import ConsumerPipeline, duplicates

# The fixture `airflow_run_environment` (Spark `local[2,4]`) is in tests/e2e/conftest.py.

USERS_DAG_FILE = '''
"""Two pipelines, one per stream, each with its own application, output and settings."""
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

orders: DAG = kinesis_pipeline(
    "{orders}_to_lake",
    streams=["{orders}"],
    application_name="{orders}",
    output_uri="{lake}/orders",
    schedule=None,
    num_workers=2,
    initial_position="TRIM_HORIZON",
    settings={{"max_leases_for_worker": 8}},
)
clicks: DAG = kinesis_pipeline(
    "{clicks}_to_lake",
    streams=["{clicks}"],
    application_name="{clicks}",
    output_uri="{lake}/clicks",
    schedule=None,
    num_workers=1,
    initial_position="TRIM_HORIZON",
    transform="tests.support.spark_transforms:upper_case_data",
)
'''


def users_dag_file(folder: Path, name: str, text: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The user's DAG file, written in a DAG folder outside the repository that Airflow is given as a
    DAG bundle of its own (`dag.test` syncs its DAG from the configured bundles), and parsed as
    Airflow parses it."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    bundle = {
        "name": "users-dags",
        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(folder)},
    }
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([bundle]))
    return load_dag_module(name, path)


def test_two_pipelines_on_two_streams_run_side_by_side_with_their_own_tables_history_and_outputs(
    airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, monkeypatch
):
    # The clicks pipeline's transform is importable where Spark runs (here: the checkout on its path).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])))
    orders, clicks = f"{unique_name}-o", f"{unique_name}-c"
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, orders, 2)
    create_stream(kinesis, clicks, 1)
    ledgers = {
        name: ConsumerPipeline(name, (name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake" / folder))
        for name, folder in ((orders, "orders"), (clicks, "clicks"))
    }
    for ledger in ledgers.values():
        ledger.produce(30)
    text = USERS_DAG_FILE.format(orders=orders, clicks=clicks, lake=tmp_path / "lake")
    module = users_dag_file(tmp_path / "dags", "users_pipelines", text, monkeypatch)
    assert {module.orders.dag_id, module.clicks.dag_id} == {f"{orders}_to_lake", f"{clicks}_to_lake"}
    assert "kinesis-lease" in module.orders.tags

    for dag in (module.orders, module.clicks):
        states = run_round(dag, {})
        assert consumed_cleanly(states), (dag.dag_id, states)

    for name, ledger in ledgers.items():
        landed = ledger.landed()
        assert duplicates(landed) == []
        assert sorted(record.sequence_number for record in landed) == sorted(
            record.sequence_number for record in ledger.produced
        ), name
        (entry,) = RoundHistory(ledger.state).rounds()
        assert (entry["dag_id"], entry["records"]) == (f"{name}_to_lake", 30)
        assert ledger.leases(), f"{name}'s own lease table holds its leases"
    assert {record.data for record in ledgers[clicks].landed()} == {
        record.data.upper() for record in ledgers[clicks].produced
    }, "the clicks pipeline's own transform ran on its records, and only there"
    assert all(record.data.islower() for record in ledgers[orders].landed())


EMBEDDING_DAG_FILE = '''
"""A DAG of the user's own whose first part is a pipeline's round."""
from datetime import UTC, datetime

from airflow.sdk import DAG, task
from kinesis_lease.pipeline import kinesis_round

with DAG(
    "{dag_id}",
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    max_active_runs=1,
    render_template_as_native_obj=True,
) as dag:
    land = kinesis_round(
        streams=["{stream}"],
        application_name="{stream}",
        output_uri="{lake}",
        num_workers=1,
        initial_position="TRIM_HORIZON",
    )

    @task
    def report_landed(figures):
        return int(figures["totals"]["records"])

    land >> report_landed(land.children["kinesis_round.consume"].output)
'''


def test_a_round_embedded_in_a_users_dag_runs_as_a_task_group_before_the_users_own_tasks(
    airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, monkeypatch
):
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    ledger.produce(25)
    dag_id = f"{unique_name.replace('-', '_')}_users_dag"
    text = EMBEDDING_DAG_FILE.format(dag_id=dag_id, stream=unique_name, lake=tmp_path / "lake")
    dag = users_dag_file(tmp_path / "dags", "users_dag", text, monkeypatch).dag

    states = run_round(dag, {})

    assert states["kinesis_round.finalize_round"] == "success" and states["report_landed"] == "success", states
    assert sorted(record.sequence_number for record in ledger.landed()) == sorted(
        record.sequence_number for record in ledger.produced
    )


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"settings": {"failover_time_milis": 5}}, "did you mean 'failover_time_millis'"),
        ({"settings": {"application_name": "x"}}, "is an argument of the pipeline"),
        ({"num_workers": 0}, "num_workers"),
        ({"output_uri": "gs://bucket/x"}, "output_uri"),
        ({"transform": "not a spec"}, "transform"),
    ],
    ids=["a misspelt setting", "a setting that is an argument", "no workers", "an unknown sink", "a bad transform"],
)
def test_a_pipeline_with_a_bad_argument_is_refused_when_its_dag_file_is_parsed_naming_it(changes, complaint):
    from kinesis_lease.pipeline import kinesis_pipeline

    arguments = {"streams": ["orders"], "application_name": "orders", "output_uri": "/tmp/lake", **changes}
    with pytest.raises(ConfigurationError, match=complaint):
        kinesis_pipeline("refused", **arguments)


DECODER_MODULE = '''
"""The user's decoder: JSON order events to typed columns."""
import json

import pyarrow as pa


def decode(data, record):
    event = json.loads(data)
    return {"order_id": event["id"], "amount": event["amount"], "placed_at_shard": record.shard_id}


decode.schema = pa.schema([("order_id", pa.int64()), ("amount", pa.float64()), ("placed_at_shard", pa.string())])
'''

DECODING_DAG_FILE = """
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

orders: DAG = kinesis_pipeline(
    "{stream}_decoded",
    streams=["{stream}"],
    application_name="{stream}",
    output_uri="{lake}",
    schedule=None,
    num_workers=1,
    initial_position="TRIM_HORIZON",
    decode="orders_decoding:decode",
    py_files="{module}",
)
"""


def test_a_decoder_shipped_with_the_job_lands_typed_columns_from_json_payloads(
    airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, monkeypatch
):
    """The decoder's module is nowhere on the path of Airflow, the driver or the executors: only in
    the job's --py-files."""
    module = tmp_path / "users_code" / "orders_decoding.py"
    module.parent.mkdir()
    module.write_text(DECODER_MODULE)
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, unique_name, 2)
    events = [{"id": n, "amount": n * 1.5} for n in range(1, 31)]
    for event in events:
        kinesis.put_record(StreamName=unique_name, Data=json.dumps(event).encode(), PartitionKey=str(event["id"]))
    text = DECODING_DAG_FILE.format(stream=unique_name, lake=tmp_path / "lake", module=module)
    dag = users_dag_file(tmp_path / "dags", "decoded_pipeline", text, monkeypatch).orders

    states = run_round(dag, {})

    assert consumed_cleanly(states), states
    landed = ParquetSink.from_uri(str(tmp_path / "lake")).read_dataset()
    assert landed.schema.field("order_id").type == pa.int64() and landed.schema.field("amount").type == pa.float64()
    assert "data" not in landed.column_names
    rows = sorted(landed.select(["order_id", "amount"]).to_pylist(), key=lambda row: row["order_id"])
    assert rows == [{"order_id": event["id"], "amount": event["amount"]} for event in events]
    assert set(landed.column("placed_at_shard").to_pylist()) <= {"shardId-000000000000", "shardId-000000000001"}


def test_a_rounds_lineage_names_the_streams_it_read_and_the_dataset_it_landed_in(
    airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, monkeypatch
):
    """Through Airflow's OpenLineage integration, with its file transport, in `airflow dags test`: a
    process of its own, as the provider reads its configuration once per process."""
    events_file = tmp_path / "openlineage.jsonl"
    monkeypatch.setenv(
        "AIRFLOW__OPENLINEAGE__TRANSPORT",
        json.dumps({"type": "file", "log_file_path": str(events_file), "append": True}),
    )
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "lineage-test")
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    ledger.produce(10)
    dag_id = f"{unique_name.replace('-', '_')}_lineage"
    text = EMBEDDING_DAG_FILE.format(dag_id=dag_id, stream=unique_name, lake=tmp_path / "lake")
    users_dag_file(tmp_path / "dags", "lineage_dag", text, monkeypatch)

    run = subprocess.run(
        [sys.executable, "-m", "airflow", "dags", "test", dag_id],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    completed = [
        event
        for event in events
        if event["eventType"] == "COMPLETE" and event["job"]["name"].endswith("kinesis_round.consume")
    ]
    assert len(completed) == 1, [(event["eventType"], event["job"]["name"]) for event in events]
    (event,) = completed
    assert event["job"]["namespace"] == "lineage-test"
    assert [(dataset["namespace"], dataset["name"]) for dataset in event["inputs"]] == [
        ("arn:aws:kinesis:us-east-1:000000000000", f"stream/{unique_name}")
    ]
    assert [(dataset["namespace"], dataset["name"]) for dataset in event["outputs"]] == [
        ("file", str(tmp_path / "lake"))
    ]
    assert sorted(record.sequence_number for record in ledger.landed()) == sorted(
        record.sequence_number for record in ledger.produced
    )
