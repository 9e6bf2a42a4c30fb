"""Tried as a new user would: the built wheel installed into a fresh venv, a DAG file of their own outside
the repository with two pipelines on two streams (a JSON decoder shipped with the job, one malformed
record among valid ones on each stream), run with `airflow dags test` from that venv, in a folder
outside the checkout (`tests/support/installed_package.py`, `tests/support/users_pipelines.py`).
The deployment tier runs the same DAG file under the scheduler (tests/deployment)."""

from __future__ import annotations

import json
import re

from tests.support.installed_package import build_wheel, installed_venv, outside_environment, run
from tests.support.users_pipelines import UsersPipelines

# The fixture `airflow_run_environment` (the metadata database, the connections) is in tests/e2e/conftest.py.


def test_two_pipelines_of_a_users_dag_file_run_from_the_installed_wheel_and_set_their_bad_records_aside(
    airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    python = installed_venv(tmp_path / "installed", build_wheel(tmp_path / "dist"))
    users = UsersPipelines.create(tmp_path / "user", unique_name, kinesis_endpoint, moto_endpoint)
    env = outside_environment(
        {
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([users.bundle()]),
            "PYSPARK_PYTHON": str(python),  # the executors run the venv's Python, as the driver does
        }
    )

    for dag_id in users.dag_ids:
        result = run(python, "-I", "-m", "airflow", "dags", "test", dag_id, cwd=users.folder, env=env, timeout=420)
        finished = re.search(
            rf"DagRun Finished: dag_id={re.escape(dag_id)},.*? state=(\w+),", result.stdout + result.stderr
        )
        assert finished is not None and finished[1] == "success", (result.stdout + result.stderr)[-3000:]

    users.check_landed()
