"""Airflow in this process, on the emulators: the DAG `kinesis_lease_pipeline` run with `dag.test()`.

Used by the embedded demo and the end-to-end tests. Airflow reads its home and settings when first
imported, so `home_environment` must be in `os.environ` before anything imports Airflow;
`run_environment` (the connections) is read by each DAG run. The venv's bin is not put on PATH: the
consume step finds this Python's spark-submit by itself, as it must under an Airflow started without
activating its venv.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kinesis_lease.local_trial.environment import REGION as REGION  # the demo's and the tests' name
from kinesis_lease.local_trial.environment import Endpoints, aws_connection

REPOSITORY = Path(__file__).resolve().parents[1]
DAG_FILE = REPOSITORY / "dags" / "kinesis_lease_pipeline.py"
PLUGIN_ENTRY_POINT = "kinesis_lease.plugin:KinesisLeasePlugin"


def home_environment(home: Path | str, dags_folder: Path = REPOSITORY / "dags") -> dict[str, str]:
    """A throwaway home (its SQLite database is there), no example DAGs, and the home's own plugins folder:
    the monitoring UI's plugin comes from the installed package's entry point, as in a deployment."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(Path(home) / "plugins"),
    }


def require_installed_plugin() -> None:
    """Airflow processes load the monitoring UI's plugin from the installed project's entry point: fail
    early, saying why, in a venv whose install of the project predates it (`uv sync` reinstalls it)."""
    targets = {entry_point.value for entry_point in importlib.metadata.entry_points(group="airflow.plugins")}
    if PLUGIN_ENTRY_POINT not in targets:
        raise RuntimeError(f"no airflow.plugins entry point {PLUGIN_ENTRY_POINT} is installed: run `uv sync`")


def run_environment(
    kinesis_endpoint: str,
    moto_endpoint: str,
    spark_connection: Mapping[str, Any],
    extra: Mapping[str, str] | None = None,
    s3_endpoint: str | None = None,
    credentials: str = "testing",
) -> dict[str, str]:
    """The variables of a DAG run on the emulators with `spark_connection`; `extra` (spark-submit's own) last.

    DynamoDB and S3 go to `moto_endpoint` unless `s3_endpoint` names another one for S3. `credentials`
    is the dummy access key id and secret of the `aws_default` connection.
    """
    endpoints = Endpoints(dynamodb=moto_endpoint, kinesis=kinesis_endpoint, s3=s3_endpoint or moto_endpoint)
    return {
        "AIRFLOW_CONN_AWS_DEFAULT": aws_connection(endpoints, credentials),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(dict(spark_connection)),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **(extra or {}),
    }


def migrate_metadata_db() -> None:
    """`airflow db migrate` on the home in `os.environ`, which must be set already."""
    airflow = Path(sys.executable).with_name("airflow")
    migration = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, check=False)
    if migration.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{migration.stderr[-2000:]}")


def load_dag_module(name: str, path: Path = DAG_FILE) -> Any:
    """The DAG file at `path` (the shipped one by default) run as a module called `name` (the shipped
    DAG is its `dag`); not registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
