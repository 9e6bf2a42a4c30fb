"""The consume job, run by spark-submit, reports the error that stops it without a round to the step that
started it (`--error-file`), and the step's one mapping to Airflow outcomes fails at once on a wrong
setup and keeps Airflow's retries for what may pass (throttling, a network error, the leader lock held by
another round)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from kinesis_lease.errors import airflow_error
from kinesis_lease.operators import check_user_functions

from devtools.fault_proxy import FaultProxy, FaultRule
from lease_core.leader.leader_lock import LeaderLock
from spark_jobs.job_errors import read_job_error
from spark_jobs.record_processing import RecordProcessing
from tests.support.consume_job_process import submit_consume_job
from tests.support.pipeline import ConsumerPipeline, pipeline_on_new_stream

FAST_FAILURES = ("--set", "dependency_retry_attempts=2", "--set", "dependency_retry_base_millis=10")


@pytest.fixture
def pipeline(unique_name: str, kinesis_endpoint: str, moto_endpoint: str, tmp_path: Path) -> ConsumerPipeline:
    return pipeline_on_new_stream(unique_name, 1, kinesis_endpoint, moto_endpoint, tmp_path)


def reported_outcome(
    pipeline: ConsumerPipeline, tmp_path: Path, *arguments: str, dynamodb: str | None = None
) -> tuple[str, AirflowException]:
    """The job's error as spark-submit's driver reported it, and the Airflow outcome the step makes of it."""
    error_file = tmp_path / "error.json"
    completed = submit_consume_job(
        pipeline.application_name,
        pipeline.streams[0],
        pipeline.output_uri,
        str(tmp_path / "report.json"),
        dynamodb or pipeline.dynamodb_endpoint,
        pipeline.kinesis_endpoint,
        workers=1,
        arguments=["--error-file", str(error_file), *arguments],
    )
    assert completed.returncode != 0, completed.stdout[-2000:]
    reported = read_job_error(str(error_file))
    assert reported is not None, completed.stderr[-3000:]
    assert json.loads(error_file.read_text())["message"] in completed.stdout + completed.stderr, "its log says it too"
    return reported.kind, airflow_error(reported)


@pytest.mark.parametrize(
    ("arguments", "kind", "message"),
    [
        (
            ("--set", "failover_time_millis=-5"),
            "ConfigurationError",
            "configuration key 'failover_time_millis': ",
        ),
        (
            ("--decode", "tests.support.decoders:amount"),
            "FunctionLoadError",
            "decoder 'tests.support.decoders:amount' cannot be loaded: module 'tests.support.decoders' has no "
            "attribute 'amount'",
        ),
        (
            ("--transform", "tests.support.transforms:NOT_CALLABLE"),
            "FunctionLoadError",
            "transform 'tests.support.transforms:NOT_CALLABLE' cannot be loaded: 'NOT_CALLABLE' is not callable",
        ),
    ],
    ids=["a setting out of range", "a decoder that is not there", "a transform that is not a function"],
)
def test_a_wrong_setup_the_driver_finds_fails_the_step_at_once_with_the_drivers_own_error(
    pipeline, tmp_path, arguments, kind, message
):
    reported, outcome = reported_outcome(pipeline, tmp_path, *arguments)

    assert isinstance(outcome, AirflowFailException), "not retried"
    assert reported == kind and str(outcome).startswith(f"{kind}: {message}"), str(outcome)


def test_dynamodb_out_of_reach_stays_retryable_and_says_so(pipeline, tmp_path):
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens there
    reported, outcome = reported_outcome(pipeline, tmp_path, *FAST_FAILURES, dynamodb=closed)

    assert not isinstance(outcome, AirflowFailException), "retried"
    assert reported == "DependencyError" and "dynamodb DescribeTable failed after 2 attempt(s)" in str(outcome)


def test_throttling_after_every_attempt_stays_retryable_and_says_so(pipeline, tmp_path):
    with FaultProxy(pipeline.dynamodb_endpoint) as proxy:
        proxy.set_faults([FaultRule("throttle", 1.0, "DescribeTable")])
        reported, outcome = reported_outcome(pipeline, tmp_path, *FAST_FAILURES, dynamodb=proxy.endpoint)

    assert not isinstance(outcome, AirflowFailException), "retried"
    assert reported == "ThrottledError" and "ProvisionedThroughputExceededException" in str(outcome)


def test_a_leader_lock_another_round_holds_stays_retryable_and_names_the_holder(pipeline, tmp_path):
    pipeline.produce(5)
    pipeline.sync()
    pipeline.assign(1)
    holder = LeaderLock(pipeline.state, "kinesis_lease_pipeline/scheduled__2026-11-28T18:00:00+00:00/abc")
    assert holder.try_acquire()

    reported, outcome = reported_outcome(pipeline, tmp_path, "--leader-owner", "kinesis_lease_pipeline/a-lost-run/def")

    assert not isinstance(outcome, AirflowFailException), "retried"
    assert reported == "LeadershipUnavailableError" and "scheduled__2026-11-28T18:00:00" in str(outcome)
    assert holder.release()


@pytest.mark.parametrize("shipped", ["py", "zip"])
def test_the_step_loads_the_functions_as_a_driver_started_on_its_machine_would_with_the_py_files_it_ships(
    shipped, tmp_path
):
    code = tmp_path / "code"
    code.mkdir()
    (code / "users_functions.py").write_text("def decode(data, record):\n    return {}\n\nNAME = 'decode'\n")
    py_files = str(code / "users_functions.py")
    if shipped == "zip":
        py_files = shutil.make_archive(str(tmp_path / "users"), "zip", code)
        (code / "users_functions.py").unlink()
    error_file = str(tmp_path / "error.json")

    decoding = RecordProcessing(decode="users_functions:decode")
    assert check_user_functions(decoding, py_files, {}, error_file) is None
    wrong = RecordProcessing(decode="users_functions:NAME", transform="users_functions:clean")
    refused = check_user_functions(wrong, py_files, {}, error_file)

    assert refused is not None and refused.kind == "FunctionLoadError" and not refused.retryable
    assert (
        str(refused) == "decoder 'users_functions:NAME' cannot be loaded: 'NAME' is not callable (it is of type 'str')"
    )
    assert check_user_functions(decoding, None, {}, error_file) is not None, "not shipped"


@pytest.fixture(scope="module")
def driver_only_python(tmp_path_factory) -> str:
    """A second Python (a venv of this one's interpreter) that has the project, and a module
    `driver_only_functions` this Python lacks: a driver's Python as `spark.pyspark.driver.python` names it."""
    root = tmp_path_factory.mktemp("driver-python")
    code = root / "code"
    code.mkdir()
    (code / "driver_only_functions.py").write_text("def decode(data, record):\n    return {}\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]  # with the project's editable install
    (Path(purelib) / "driver.pth").write_text(f"import site; site.addsitedir({ours!r})\n{code}\n")
    return str(python)


@pytest.mark.parametrize(
    ("conf", "variables"),
    [
        ({"spark.pyspark.driver.python": "DRIVER"}, {"PYSPARK_DRIVER_PYTHON": sys.executable}),
        ({"spark.pyspark.python": "DRIVER"}, {"PYSPARK_PYTHON": sys.executable}),
        ({}, {"PYSPARK_DRIVER_PYTHON": "DRIVER", "PYSPARK_PYTHON": sys.executable}),
        ({}, {"SPARK_CONF_DIR": "CONF", "PYSPARK_DRIVER_PYTHON": sys.executable}),
    ],
    ids=["the driver's setting", "the Python setting", "the driver's variable", "spark-defaults.conf"],
)
def test_the_step_loads_the_functions_with_the_python_spark_starts_the_driver_with(
    driver_only_python, conf, variables, tmp_path
):
    (tmp_path / "spark-defaults.conf").write_text(
        f"# the driver's\nspark.pyspark.driver.python  {driver_only_python}\n"
    )
    named = {"DRIVER": driver_only_python, "CONF": str(tmp_path)}
    conf = {name: named.get(value, value) for name, value in conf.items()}
    variables = {name: named.get(value, value) for name, value in variables.items()}
    decoding = RecordProcessing(decode="driver_only_functions:decode")
    error_file = str(tmp_path / "error.json")

    assert check_user_functions(decoding, None, {}, error_file) is not None, "this Python lacks the module"
    assert check_user_functions(decoding, None, variables, error_file, conf) is None


def test_a_driver_python_that_cannot_run_the_check_skips_it_with_a_logged_reason(tmp_path, caplog):
    """A Python without the project (or none at that path) cannot say whether the functions load: the
    job checks them when it starts; the step does not fail on a verdict it could not reach."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    decoding = RecordProcessing(decode="nowhere_functions:decode")
    for python in (str(bare / "bin" / "python"), str(tmp_path / "no-python")):
        caplog.clear()
        conf = {"spark.pyspark.driver.python": python}
        assert check_user_functions(decoding, None, {}, str(tmp_path / "error.json"), conf) is None
        assert f"could not be checked before the job with {python}" in caplog.text
