"""`kinesis-lease local`, run as a new user runs it: the console script of the built wheel installed into a
fresh venv (`tests/support/installed_package.py`), in a folder outside the checkout, with a state folder
of the test's own. Its emulators are real processes; what the trial started is stopped by `down` and
nothing else is: a PID in a state file that now belongs to another process is left alone."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from kinesis_lease.local_trial.trial import ended

from devtools.emulators import KINESIS_MOCK_HOME
from tests.support.installed_package import build_wheel, installed_venv, outside_environment

# What a user's boto3 does with the printed environment alone: write a record, read it back, list tables.
ROUND_TRIP = textwrap.dedent(
    """
    import sys, boto3
    kinesis = boto3.client("kinesis")
    written = kinesis.put_record(StreamName=sys.argv[1], Data=b"hello", PartitionKey="k")
    iterator = kinesis.get_shard_iterator(
        StreamName=sys.argv[1], ShardId=written["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    print([record["Data"].decode() for record in kinesis.get_records(ShardIterator=iterator)["Records"]])
    print(boto3.client("dynamodb").list_tables()["TableNames"])
    """
)
SPLIT = textwrap.dedent(
    """
    import sys, boto3
    kinesis = boto3.client("kinesis")
    shard = kinesis.list_shards(StreamName=sys.argv[1])["Shards"][0]["ShardId"]
    kinesis.split_shard(StreamName=sys.argv[1], ShardToSplit=shard, NewStartingHashKey="1000")
    """
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin folder: the wheel with the `local` extra's moto (this environment's)."""
    return installed_venv(tmp_path_factory.mktemp("installed"), wheel).parent


class Trial:
    """`kinesis-lease local` with one state folder, run from `folder` (outside the checkout)."""

    def __init__(self, bin_folder: Path, state_dir: Path, folder: Path) -> None:
        self.bin = bin_folder
        self.state_dir = state_dir
        self.folder = folder

    def run(self, *arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / "kinesis-lease"), "local", *arguments, "--state-dir", str(self.state_dir)]
        variables = outside_environment({"KINESIS_MOCK_HOME": str(KINESIS_MOCK_HOME), **(env or {})})
        return subprocess.run(
            command, cwd=self.folder, env=variables, capture_output=True, text=True, timeout=120, check=False
        )

    def python(self, code: str, *arguments: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "python"), "-I", "-c", code, *arguments],
            cwd=self.folder,
            env=outside_environment(environment),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def state(self) -> dict[str, object]:
        return json.loads((self.state_dir / "state.json").read_text())


@pytest.fixture
def trial(installed: Path, tmp_path: Path) -> Iterator[Trial]:
    folder = tmp_path / "user"
    folder.mkdir()
    trial = Trial(installed, tmp_path / "state", folder)
    yield trial
    trial.run("down")  # whatever a failed test left running


def exported(output: str) -> dict[str, str]:
    """The variables of the `export NAME=value` lines, as a shell's `eval` sets them."""
    pairs = [shlex.split(line.removeprefix("export "))[0] for line in output.splitlines() if line.startswith("export ")]
    return dict(pair.split("=", 1) for pair in pairs)


def port_open(endpoint: str) -> bool:
    host, port = endpoint.removeprefix("http://").split(":")
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((host, int(port))) == 0


def running(pid: int) -> bool:
    try:
        return not ended(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def test_a_trial_serves_a_stream_from_up_to_down_and_stops_exactly_its_processes(trial):
    up = trial.run("up")
    assert up.returncode == 0, up.stderr
    environment = exported(up.stdout)
    services = {service["name"]: service for service in trial.state()["services"]}
    assert set(services) == {"moto", "kinesis-mock"}
    assert environment["AWS_ENDPOINT_URL_KINESIS"] == f"http://127.0.0.1:{services['kinesis-mock']['port']}"
    assert environment["AWS_ENDPOINT_URL_DYNAMODB"] == environment["AWS_ENDPOINT_URL_S3"]
    connection = json.loads(environment["AIRFLOW_CONN_AWS_DEFAULT"])
    assert connection["extra"]["service_config"]["kinesis"]["endpoint_url"] == environment["AWS_ENDPOINT_URL_KINESIS"]

    created = trial.run("create-stream", "orders", "--shards", "2")
    assert created.returncode == 0, created.stderr
    round_trip = trial.python(ROUND_TRIP, "orders", environment=environment)
    assert round_trip.stdout.splitlines() == ["['hello']", "[]"], round_trip.stderr

    status = trial.run("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["running"] is True
    again = trial.run("up")
    assert again.returncode == 0 and "already running" in again.stdout
    assert exported(again.stdout) == environment
    assert {service["name"]: service for service in trial.state()["services"]} == services

    down = trial.run("down")
    assert down.returncode == 0, down.stderr
    assert "stopped moto" in down.stdout and "stopped kinesis-mock" in down.stdout
    for service in services.values():
        assert not running(service["pid"]) and not port_open(f"http://127.0.0.1:{service['port']}")
    after = trial.run("status")
    assert after.returncode == 1 and "no local trial runs" in after.stdout


def test_two_ups_at_once_start_one_trial_and_the_second_finds_it_running(trial):
    command = [str(trial.bin / "kinesis-lease"), "local", "up", "--kinesis", "moto"]
    command += ["--state-dir", str(trial.state_dir)]
    environment, pipe = outside_environment({}), subprocess.PIPE
    both = [
        subprocess.Popen(command, cwd=trial.folder, env=environment, stdout=pipe, stderr=pipe, text=True)
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120) for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    assert sorted("already running" in stdout for stdout, _ in outputs) == [False, True], outputs
    assert exported(outputs[0][0]) == exported(outputs[1][0])
    [moto] = trial.state()["services"]
    down = trial.run("down")
    assert down.returncode == 0 and "stopped moto" in down.stdout
    assert not running(moto["pid"])


def test_without_kinesis_mock_kinesis_is_motos_which_serves_records_and_refuses_to_reshard(trial):
    up = trial.run("up", "--kinesis", "moto")
    assert up.returncode == 0, up.stderr
    assert "refuses SplitShard" in up.stdout
    environment = exported(up.stdout)
    assert environment["AWS_ENDPOINT_URL_KINESIS"] == environment["AWS_ENDPOINT_URL_DYNAMODB"]
    assert trial.run("create-stream", "clicks").returncode == 0
    assert trial.python(ROUND_TRIP, "clicks", environment=environment).stdout.startswith("['hello']")

    split = trial.python(SPLIT, "clicks", environment=environment)
    assert split.returncode != 0 and "UnsupportedOperationException" in split.stderr
    assert "kinesis-mock" in split.stderr


def test_down_when_nothing_runs_says_so_and_succeeds(trial):
    down = trial.run("down")
    assert down.returncode == 0 and "nothing to stop" in down.stdout


def test_a_stale_state_whose_pid_now_belongs_to_another_process_leaves_that_process_alone(trial):
    stranger = subprocess.Popen(["sleep", "300"])  # the PID's new owner, after the trial's process ended
    try:
        trial.state_dir.mkdir()
        recorded = {
            "name": "moto",
            "pid": stranger.pid,
            "port": 9,
            "create_time": psutil.Process(stranger.pid).create_time() - 3600.0,
            "command": [str(trial.bin / "python"), "-m", "kinesis_lease.local_trial.emulators", "moto", "--port", "9"],
            "log": str(trial.state_dir / "moto.log"),
        }
        (trial.state_dir / "state.json").write_text(json.dumps({"kinesis": "moto", "services": [recorded]}))

        status = trial.run("status")
        assert status.returncode == 1 and "NOT running" in status.stdout
        down = trial.run("down")
        assert down.returncode == 0 and "left alone" in down.stdout
        assert stranger.poll() is None, "down killed a process the trial did not start"
        assert not (trial.state_dir / "state.json").exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_asking_for_kinesis_mock_where_it_is_not_installed_says_how_to_install_it(trial, tmp_path):
    up = trial.run("up", "--kinesis", "kinesis-mock", env={"KINESIS_MOCK_HOME": str(tmp_path / "none")})
    assert up.returncode == 2 and "npm install --prefix" in up.stderr and "kinesis-local@" in up.stderr
    assert not (trial.state_dir / "state.json").exists()


def test_without_moto_up_names_the_extra_to_install(wheel, tmp_path):
    bin_folder = installed_venv(tmp_path / "no-moto", wheel, leave_out=["moto"]).parent
    (tmp_path / "user").mkdir()
    up = Trial(bin_folder, tmp_path / "state", tmp_path / "user").run("up")
    assert up.returncode == 2 and "pip install 'kinesis-lease-batch[local]'" in up.stderr
    assert not (tmp_path / "state" / "state.json").exists()
