"""A real `airflow api-server` for tests, with the installed package's plugin and a throwaway home.

The server runs in its own process group (uvicorn and its workers are stopped together, by that
group's id), on a free loopback port, with a temporary AIRFLOW_HOME holding a SQLite database, no
example DAGs, an empty DAGs folder and the home's own (empty) plugins folder: the monitoring UI's
plugin comes from the installed package's `airflow.plugins` entry point. SimpleAuthManager with two
known users (`viewer`, role viewer, and `admin`, role admin) and the `aws_default` connection
pointing at the given DynamoDB endpoint. `airflow db migrate` (8-10 s here) runs once per test process;
later servers start from a copy of that database.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from devtools.airflow_env import home_environment, require_installed_plugin
from devtools.emulators import LOOPBACK, free_port

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = Path(sys.executable).with_name("airflow")
USERS = {"viewer": "viewer", "admin": "admin"}  # user name -> SimpleAuthManager role
PASSWORDS = {"viewer": "viewer-password", "admin": "admin-password"}
STARTUP_SECONDS = 120.0
STOP_GRACE_SECONDS = 15.0
CLI_TIMEOUT_SECONDS = 120.0
DATABASE = "airflow.db"


@dataclass(frozen=True)
class AirflowServer:
    base_url: str
    home: Path
    dags_folder: Path
    env: dict[str, str]

    def token(self, user: str = "viewer") -> str:
        """A JWT for `user` from SimpleAuthManager's `POST /auth/token`."""
        body = json.dumps({"username": user, "password": PASSWORDS[user]}).encode()
        request = urllib.request.Request(
            self.base_url + "/auth/token", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["access_token"]

    def airflow(self, *arguments: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the airflow CLI against this server's home and database (plus `env`); raises on failure."""
        return _run_cli(list(arguments), {**self.env, **(env or {})})


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET, without following redirects and without raising on 4xx/5xx."""
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def http_json(method: str, url: str, token: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def server_env(home: Path, dags_folder: Path, dynamodb_endpoint: str) -> dict[str, str]:
    """The test process's environment without its Airflow and AWS endpoint settings, plus the server's."""
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIRFLOW", "AWS_ENDPOINT_URL", "KINESIS_LEASE_"))
    }
    connection = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"region_name": "us-east-1", "endpoint_url": dynamodb_endpoint},
    }
    return {
        **inherited,
        "PATH": f"{AIRFLOW.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **home_environment(home, dags_folder),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / DATABASE}",
        "AIRFLOW__API__HOST": LOOPBACK,
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{user}:{role}" for user, role in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(32).hex(),
        "AIRFLOW__API__SECRET_KEY": os.urandom(32).hex(),
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection),
    }


@contextmanager
def airflow_api_server(dynamodb_endpoint: str) -> Iterator[AirflowServer]:
    """A started api-server whose `aws_default` connection points at `dynamodb_endpoint`; stopped on exit."""
    require_installed_plugin()
    home = Path(tempfile.mkdtemp(prefix="airflow-api-server-"))
    dags_folder = home / "dags"
    dags_folder.mkdir()
    shutil.copyfile(_migrated_database(), home / DATABASE)
    (home / "passwords.json").write_text(json.dumps(PASSWORDS))
    port = free_port()
    env = server_env(home, dags_folder, dynamodb_endpoint)
    log_path = home / "api-server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(AIRFLOW), "api-server", "--host", LOOPBACK, "--port", str(port), "--workers", "1"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so uvicorn's workers stop with it
        )
    try:
        base_url = f"http://{LOOPBACK}:{port}"
        _wait_until_healthy(base_url, process, log_path)
        yield AirflowServer(base_url, home, dags_folder, env)
    finally:
        stop_process_group(process)
        shutil.rmtree(home, ignore_errors=True)


@cache
def _migrated_database() -> Path:
    """A freshly migrated SQLite metadata database, made once per test session and copied per server."""
    home = Path(tempfile.mkdtemp(prefix="airflow-db-template-"))
    atexit.register(shutil.rmtree, home, True)
    _run_cli(["db", "migrate"], server_env(home, home, "http://unused"))
    return home / DATABASE


def _run_cli(arguments: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(AIRFLOW), *arguments], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_SECONDS, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"airflow {' '.join(arguments)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def _wait_until_healthy(base_url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"airflow api-server exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            if http_get(base_url + "/api/v2/monitor/health")[0] == 200:
                return
        except OSError:  # not listening yet
            pass
        time.sleep(0.2)
    raise TimeoutError(f"airflow api-server did not become healthy in {STARTUP_SECONDS:.0f} s:\n{_tail(log_path)}")


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group `process` leads, then SIGKILL what outlives the grace period."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_SECONDS)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers that outlived the server process, if any
    process.wait(timeout=10)


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
