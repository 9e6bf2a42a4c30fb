"""The DAG `kinesis_lease_pipeline` run in-process with `dag.test()` against the emulators.

`airflow_environment` sets what a run needs in `os.environ` (the `aws_default` and `spark_default`
connections as AIRFLOW_CONN_* variables, spark-submit on PATH, the executors' Python) and puts
back what was there before, so a module's Spark connection never leaks into another module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
DAG_FILE = REPOSITORY / "dags" / "kinesis_lease_pipeline.py"
LOCAL_SPARK_CONNECTION = {"conn_type": "spark", "host": "local[2,4]"}


def load_dag_module(name: str = "kinesis_lease_pipeline_under_test") -> Any:
    spec = importlib.util.spec_from_file_location(name, DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_round(dag: Any, conf: dict[str, Any]) -> dict[str, str]:
    """One DAG run with `conf`; the state of each task instance."""
    run = dag.test(run_conf=conf)
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def migrate_metadata_db() -> None:
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True, capture_output=True)


def run_environment(
    kinesis_endpoint: str,
    moto_endpoint: str,
    spark_connection: Mapping[str, Any],
    extra: Mapping[str, str] | None = None,
    s3_endpoint: str | None = None,
) -> dict[str, str]:
    """The variables of a DAG run on the emulators with `spark_connection`; `extra` (spark-submit's own) last.

    DynamoDB and S3 go to `moto_endpoint` unless `s3_endpoint` names another one for S3.
    """
    service_config = {"kinesis": {"endpoint_url": kinesis_endpoint}}
    if s3_endpoint is not None:
        service_config["s3"] = {"endpoint_url": s3_endpoint}
    return {
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {"region_name": "us-east-1", "endpoint_url": moto_endpoint, "service_config": service_config},
            }
        ),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(dict(spark_connection)),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **(extra or {}),
    }


@contextmanager
def airflow_environment(variables: Mapping[str, str]) -> Iterator[None]:
    """`os.environ` with `variables` set, restored (values and absences) on exit."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
