"""A pipeline set up wrong (a decoder or transform that cannot be loaded, an output that cannot be
opened) fails its consume step once, at once and without Airflow's retries, and both the task's
error and the round's history say what is wrong and where, in full."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from devtools.airflow_env import REPOSITORY
from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.leader.round_history import RoundHistory
from tests.support.pipeline import ConsumerPipeline

# The fixtures `dag` and `airflow_run_environment` (Spark `local[2,4]`) are in tests/e2e/conftest.py.

USERS_EVENTS = '''
"""The user's code: a decoder, a transform, and a value that is no function."""


def decode(data, record):
    return {"text": data.decode()}


def clean(table):
    return table


VERSION = "1.0"
'''

# conf changes, the error's name, what its message must say (the path and the cause), and where it is
# found: by the consume step before it submits the job (the driver would run on its machine, so it
# imports the functions as the driver would), or by the job's driver, which reports it to the step.
BEFORE_SUBMIT, BY_THE_JOB = "before spark-submit", "by the job"
CASES = {
    "decoder module missing": (
        {"decode": "my_company.evnts:decode"},
        "FunctionLoadError",
        "decoder 'my_company.evnts:decode' cannot be loaded: No module named 'my_company.evnts'",
        BEFORE_SUBMIT,
    ),
    "decoder attribute missing": (
        {"decode": "my_company.events:decod"},
        "FunctionLoadError",
        "decoder 'my_company.events:decod' cannot be loaded: module 'my_company.events' has no attribute 'decod'",
        BEFORE_SUBMIT,
    ),
    "decoder not callable": (
        {"decode": "my_company.events:VERSION"},
        "FunctionLoadError",
        "decoder 'my_company.events:VERSION' cannot be loaded: 'VERSION' is not callable (it is of type 'str')",
        BEFORE_SUBMIT,
    ),
    "transform module missing": (
        {"transform": "my_company.cleaning:clean"},
        "FunctionLoadError",
        "transform 'my_company.cleaning:clean' cannot be loaded: No module named 'my_company.cleaning'",
        BEFORE_SUBMIT,
    ),
    "output under a file": (
        {"output_uri": "{tmp}/a-file/lake"},
        "SinkError",
        "sink '{tmp}/a-file/lake': cannot check that the dataset root is writable: [Errno 20] Not a directory",
        BY_THE_JOB,
    ),
}


@pytest.fixture
def users_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's package `my_company` (module `events`), on the path of Airflow's task and of the Spark job."""
    package = tmp_path / "code" / "my_company"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "events.py").write_text(textwrap.dedent(USERS_EVENTS))
    path = [str(package.parent), str(REPOSITORY), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, path)))
    return package


@pytest.mark.parametrize(("changes", "name", "complaint", "found"), CASES.values(), ids=CASES.keys())
def test_a_pipeline_set_up_wrong_fails_its_consume_step_once_at_once_naming_the_cause_in_the_task_and_the_history(
    dag: Any,
    airflow_run_environment: None,
    users_code: Path,
    unique_name: str,
    kinesis_endpoint: str,
    moto_endpoint: str,
    tmp_path: Path,
    changes: dict[str, str],
    name: str,
    complaint: str,
    found: str,
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    ledger.produce(3)
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
        # In one process, `dag.test` runs keep an earlier run's values of what a conf leaves out.
        "mode": "live",
        "decode": None,
        "transform": None,
        **{key: value.replace("{tmp}", str(tmp_path)) for key, value in changes.items()},
    }
    complaint = complaint.replace("{tmp}", str(tmp_path))
    consume = dag.get_task("consume")
    run, raised = run_catching_failures(dag, "consume", conf)

    tries = {ti.task_id: ti for ti in run.get_task_instances()}
    consumed = tries["consume"]
    assert (consumed.state, consumed.try_number) == ("failed", 1), "failed once, not retried"
    # Found before the job: well within the retry delay. Found by the job: spark-submit starting Spark
    # takes 10 to 25 s on 2 busy cores, still short of the 20 s and 40 s a retried step would wait.
    delay = consume.retry_delay.total_seconds()
    assert (consumed.end_date - consumed.start_date).total_seconds() < (
        delay / 2 if found == BEFORE_SUBMIT else 3 * delay
    )
    assert (tries["record_failed_round"].state, tries["release_leadership"].state) == ("success", "success")
    [error] = raised
    assert f"{name}: {complaint}" in str(error) and "Cannot execute" not in str(error), str(error)
    entry = RoundHistory(ledger.state).rounds()[-1]
    assert entry["run_id"] == run.run_id and f"{name}: {complaint}" in entry["error"], entry["error"]


def test_a_decoder_that_cannot_be_loaded_fails_a_round_of_a_quiet_stream_once_naming_it(
    dag: Any,
    airflow_run_environment: None,
    users_code: Path,
    unique_name: str,
    kinesis_endpoint: str,
    moto_endpoint: str,
    tmp_path: Path,
) -> None:
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
        "mode": "live",
        "decode": "my_company.events:decod",
        "transform": None,
    }
    run, raised = run_catching_failures(dag, "check_idle", conf)

    tries = {ti.task_id: ti for ti in run.get_task_instances()}
    assert (tries["check_idle"].state, tries["check_idle"].try_number) == ("failed", 1), "failed once, not retried"
    assert tries["consume"].state == "upstream_failed"
    assert tries["release_leadership"].state == "success"
    [error] = raised
    complaint = "decoder 'my_company.events:decod' cannot be loaded: module 'my_company.events' has no attribute"
    assert f"FunctionLoadError: {complaint}" in str(error), str(error)


def run_catching_failures(dag: Any, task_id: str, conf: dict[str, Any]) -> tuple[Any, list[BaseException]]:
    """A DAG run of `conf`, and the exceptions the task `task_id` failed with in it."""
    task = dag.get_task(task_id)
    raised: list[BaseException] = []
    callbacks = task.on_failure_callback
    task.on_failure_callback = [lambda context: raised.append(context["exception"])]
    try:
        return dag.test(run_conf=conf), raised
    finally:
        task.on_failure_callback = callbacks
