"""Fixtures of the end-to-end tests: the DAG, the metadata database and the run's connections.

A module picks its Spark master by overriding `spark_connection` (default: `local[2,4]`) and may add
variables for spark-submit by overriding `spark_submit_environment`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.airflow_env import load_dag_module, migrate_metadata_db, run_environment
from tests.support.airflow_dag import LOCAL_SPARK_CONNECTION, airflow_environment
from tests.support.installed_package import PipVenv, build_wheel, pip_install_wheel


@pytest.fixture(scope="module")
def dag() -> Any:
    return load_dag_module("kinesis_lease_pipeline_under_test").dag


@pytest.fixture(scope="session")
def airflow_metadata_db() -> None:
    migrate_metadata_db()


@pytest.fixture(scope="module")
def spark_connection() -> dict[str, Any]:
    """The `spark_default` connection of this module's DAG runs."""
    return dict(LOCAL_SPARK_CONNECTION)


@pytest.fixture(scope="module")
def spark_submit_environment() -> dict[str, str]:
    return {}


@pytest.fixture(scope="module")
def airflow_run_environment(
    kinesis_endpoint: str,
    moto_endpoint: str,
    spark_connection: dict[str, Any],
    spark_submit_environment: dict[str, str],
    airflow_metadata_db: None,
) -> Iterator[None]:
    """The metadata database and the AWS and Spark connections, for this module only."""
    variables = run_environment(kinesis_endpoint, moto_endpoint, spark_connection, spark_submit_environment)
    with airflow_environment(variables):
        yield


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def pip_installed(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> PipVenv:
    """A fresh venv with `pip install "<wheel>[local]"`, as the README's walk-through installs it (pip
    resolving every dependency for real, about 1.5 minutes): made once, for every module that needs it."""
    venv = pip_install_wheel(tmp_path_factory.mktemp("pip-installed") / "venv", built_wheel)
    print(f"pip install <wheel>[local]: {venv.seconds:.0f} s", file=sys.stderr)
    return venv
