"""Which spark-submit the consume step runs: the deployment's choice when it made one, else this Python's.

Airflow started as `<venv>/bin/airflow` without activating the venv has no spark-submit on PATH; the
operator then runs the one inside the installed pyspark package by its absolute path
(`kinesis_lease.operators.spark_submit_binary`). tests/e2e run every DAG with PATH as the test process
has it (the venv's bin is not on it), and tests/e2e/test_pip_install_of_the_wheel.py runs the provider's hook
as the operator configures it in a pip-installed venv.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyspark
import pytest
from kinesis_lease.operators import spark_submit_binary

THIS_PYSPARK = Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"


@pytest.fixture
def no_spark_choice(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return monkeypatch


def test_without_a_choice_it_is_the_spark_submit_inside_this_pythons_pyspark(no_spark_choice):
    binary = spark_submit_binary(None, "spark_default", {"PYSPARK_PYTHON": "/usr/bin/python3"})
    assert binary == str(THIS_PYSPARK)
    assert os.access(binary, os.X_OK)


def test_a_missing_connection_is_no_choice(no_spark_choice):
    assert spark_submit_binary(None, "no_such_spark_connection", None) == str(THIS_PYSPARK)


def test_the_operators_spark_binary_wins(no_spark_choice):
    assert spark_submit_binary("spark3-submit", "spark_default", None) == "spark3-submit"


def test_the_connections_spark_binary_is_left_to_the_provider(no_spark_choice):
    extra = {"conn_type": "spark", "host": "yarn", "extra": {"spark-binary": "spark3-submit"}}
    no_spark_choice.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(extra))
    assert spark_submit_binary(None, "spark_default", None) is None


def test_a_spark_home_in_the_workers_environment_is_left_to_the_provider(no_spark_choice):
    no_spark_choice.setenv("SPARK_HOME", "/opt/spark")
    assert spark_submit_binary(None, "spark_default", None) is None


def test_a_spark_home_in_the_tasks_env_vars_is_left_to_the_provider(no_spark_choice):
    assert spark_submit_binary(None, "spark_default", {"SPARK_HOME": "/opt/spark"}) is None
