"""Pipelines users define in their own DAG files with `kinesis_lease.pipeline`: a round embedded in a
DAG of the user's own, its lineage, and bad arguments refused at parse time. Two pipelines of a DAG
file side by side, from the wheel installed with pip: tests/e2e/test_first_hour.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from devtools.airflow_env import load_dag_module
from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.errors import ConfigurationError
from tests.support.airflow_dag import run_round
from tests.support.pipeline import ConsumerPipeline

# The fixture `airflow_run_environment` (Spark `local[2,4]`) is in tests/e2e/conftest.py.


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


JSON_PIPELINE_DAG_FILE = '''
"""A pipeline whose records are JSON orders, decoded by the built-in json decoder with their schema."""
from airflow.sdk import DAG
from kinesis_lease.pipeline import kinesis_pipeline

orders: DAG = kinesis_pipeline(
    "{dag_id}",
    streams=["{stream}"],
    application_name="{stream}",
    output_uri="{lake}",
    schedule=None,
    num_workers=1,
    initial_position="TRIM_HORIZON",
    decode="json",
    decode_options={{"schema": {{
        "type": "object",
        "properties": {{"order_id": {{"type": "string"}}, "amount": {{"type": "number"}}}},
        "required": ["order_id"],
    }}}},
    bad_records="dead_letter",
)
'''


def test_a_pipeline_declared_with_the_json_decoder_lands_typed_columns_and_dead_letters_the_rest(
    airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, monkeypatch
):
    import pyarrow.dataset as ds

    from devtools.kinesis_streams import put_entries
    from sinks.dead_lettering import dead_letter_uri

    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    lake = tmp_path / "lake"
    payloads = [json.dumps({"order_id": f"o-{n}", "amount": n / 2}).encode() for n in range(12)]
    payloads.append(b'{"amount": "no order"}')
    put_entries(kinesis_client(kinesis_endpoint), unique_name, [{"Data": p, "PartitionKey": "k"} for p in payloads])
    dag_id = f"{unique_name.replace('-', '_')}_json"
    text = JSON_PIPELINE_DAG_FILE.format(dag_id=dag_id, stream=unique_name, lake=lake)
    dag = users_dag_file(tmp_path / "dags", "json_orders", text, monkeypatch).orders

    states = run_round(dag, {})

    assert states["consume"] == "success" and states["finalize_round"] == "success", states
    landed = ds.dataset(lake, format="parquet", partitioning="hive").to_table(columns=["order_id", "amount"])
    assert sorted(landed.column("order_id").to_pylist()) == sorted(f"o-{n}" for n in range(12))
    assert str(landed.schema.field("amount").type) == "double"
    dead = ds.dataset(dead_letter_uri(str(lake)), format="parquet", partitioning="hive").to_table()
    assert dead.num_rows == 1 and "Column(/amount) changed from number to string" in dead.column("error")[0].as_py()
