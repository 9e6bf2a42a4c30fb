"""The end-to-end tests' DAG runs: one `dag.test()` round, and a run environment scoped to a test module.

`airflow_environment` sets a run's variables (devtools.airflow_env.run_environment) in `os.environ`
and puts back what was there before, so a module's Spark connection never leaks into another module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

LOCAL_SPARK_CONNECTION = {"conn_type": "spark", "host": "local[2,4]"}


def run_round(dag: Any, conf: dict[str, Any]) -> dict[str, str]:
    """One DAG run with `conf`; the state of each task instance."""
    run = dag.test(run_conf=conf)
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def consumed_cleanly(states: Mapping[str, str]) -> bool:
    """Every step of the run succeeded (the failure recorder, which runs whatever happened, included)."""
    return set(states.values()) == {"success"}


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
