"""AWS emulators on loopback, each in its own process: moto's server (DynamoDB, S3, and Kinesis when
kinesis-mock cannot run) and kinesis-mock (Kinesis).

moto is served behind a lock that serialises requests: moto's backends check a write's condition and
apply it without any locking, so two concurrent conditional writes can both succeed on it, which real
DynamoDB never allows (and two concurrent PutRecords to one shard lose records). Serialising requests
restores the per-item atomicity the lease protocol relies on.

kinesis-mock (npm `kinesis-local`) is the Kinesis emulator that models resharding correctly
(ChildShards, closed shards ending, ShardFilter); it needs Node.js. moto's own Kinesis does not
reshard faithfully (a split or merge copies records, a closed shard never ends, ShardFilter is
ignored), so a moto server started with `refuse_reshards` answers SplitShard, MergeShards and
UpdateShardCount with an error that says so, rather than let a round stall or land duplicates.

`EmulatorProcess` is a child of the caller, stopped when the caller is done (the tests, the demo);
`kinesis_lease.local_trial.trial` starts the same commands detached, for a trial that outlives the
command. Run moto directly: `python -m kinesis_lease.local_trial.emulators moto --port N`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
MOTO_HEALTH_PATH = "/moto-api/"
KINESIS_MOCK_HEALTH_PATH = "/"
# The pinned Kinesis emulator (packaging/kinesis-mock/package-lock.json in the project's checkout).
KINESIS_MOCK_PACKAGE = "kinesis-local@0.6.2"
RESHARD_OPERATIONS = ("SplitShard", "MergeShards", "UpdateShardCount")
KINESIS_TARGET_PREFIX = "Kinesis_20131202."
RESHARD_REFUSAL = (
    "this local trial's Kinesis is moto's, which cannot split or merge shards faithfully (it copies "
    "records and never ends a closed shard); install Node.js and kinesis-mock "
    f"(npm install {KINESIS_MOCK_PACKAGE}) and start the trial again to reshard"
)
MISSING_MOTO = (
    "moto's server is not installed, which the local trial runs DynamoDB and S3 on: "
    "pip install 'kinesis-lease-batch[local]'"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def endpoint_of(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


def wait_for_http(url: str, timeout_seconds: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `url` until it answers (any HTTP status), the process dies, or time runs out."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"emulator process exited with status {process.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing answered at {url} within {timeout_seconds:.0f} s") from None
            time.sleep(0.05)


def moto_available() -> bool:
    """Whether moto's server (the `local` extra: moto[server]) can be imported here."""
    try:
        import moto.moto_server.werkzeug_app  # noqa: F401
    except ImportError:
        return False
    return True


def moto_command(port: int, refuse_reshards: bool = False) -> list[str]:
    command = [sys.executable, "-m", "kinesis_lease.local_trial.emulators", "moto", "--port", str(port)]
    return [*command, "--refuse-reshards"] if refuse_reshards else command


def kinesis_mock_home(package_folder: Path) -> Path:
    """Where kinesis-mock's `main.js` is, given the folder npm installed it into (or the package itself)."""
    installed = package_folder / "node_modules" / "kinesis-local"
    return package_folder if (package_folder / "main.js").exists() else installed


def kinesis_mock_environment(
    port: int, reshard_duration: str = "50ms", shard_limit: int = 2000, extra_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """kinesis-mock's settings: plain HTTP on `port`, in memory, with fast stream operations."""
    return {
        **os.environ,
        "KINESIS_MOCK_PLAIN_PORT": str(port),
        "KINESIS_MOCK_TLS_PORT": str(free_port()),  # its TLS listener would otherwise take 4567
        "LOG_LEVEL": "WARN",
        "SHARD_LIMIT": str(shard_limit),
        "SHOULD_PERSIST_DATA": "false",
        **dict.fromkeys(
            (
                "CREATE_STREAM_DURATION",
                "DELETE_STREAM_DURATION",
                "SPLIT_SHARD_DURATION",
                "MERGE_SHARDS_DURATION",
                "UPDATE_SHARD_COUNT_DURATION",
            ),
            reshard_duration,
        ),
        **(extra_env or {}),
    }


class EmulatorProcess:
    """A child process serving on a loopback port; stopped by PID, waited for, never left behind."""

    def __init__(
        self,
        command: list[str],
        port: int,
        health_path: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        startup_seconds: float = 60.0,
        stop_grace_seconds: float = 10.0,
    ) -> None:
        self.port = port
        self.endpoint = endpoint_of(port)
        self._command = command
        self._health_url = self.endpoint + health_path
        self._env = env
        self._cwd = cwd
        self._startup_seconds = startup_seconds
        self._stop_grace_seconds = stop_grace_seconds
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> EmulatorProcess:
        self._process = subprocess.Popen(
            self._command,
            env=self._env,
            cwd=self._cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_http(self._health_url, self._startup_seconds, self._process)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=self._stop_grace_seconds)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def moto_server(port: int | None = None, extra_env: dict[str, str] | None = None) -> EmulatorProcess:
    """A moto server (DynamoDB and S3) with serialised requests, on a free loopback port."""
    port = port or free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    return EmulatorProcess(moto_command(port), port, MOTO_HEALTH_PATH, env=env)


def kinesis_mock(
    home: Path,
    port: int | None = None,
    reshard_duration: str = "50ms",
    shard_limit: int = 2000,
    extra_env: dict[str, str] | None = None,
) -> EmulatorProcess:
    """kinesis-mock from `home` (the folder of its main.js) on a free loopback port, with fast stream operations."""
    if not (home / "main.js").exists():
        raise FileNotFoundError(f"kinesis-mock is not installed at {home}")
    port = port or free_port()
    env = kinesis_mock_environment(port, reshard_duration, shard_limit, extra_env)
    # kinesis-mock does not exit on SIGTERM (measured: the full grace period every time), and it
    # keeps nothing worth a graceful shutdown (SHOULD_PERSIST_DATA=false): kill it after a moment.
    return EmulatorProcess(
        ["node", "main.js"], port, KINESIS_MOCK_HEALTH_PATH, env=env, cwd=str(home), stop_grace_seconds=1.0
    )


# --- moto's server --------------------------------------------------------------------------------


Application = Callable[..., Iterable[bytes]]


def _serialised(app: Application) -> Callable[..., list[bytes]]:
    lock = threading.Lock()

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with lock:
            return list(app(environ, start_response))

    return application


def _refusing_reshards(app: Application) -> Application:
    """Answer Kinesis' reshard operations with an error in Kinesis' JSON shape, and pass the rest on."""

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        operation = str(environ.get("HTTP_X_AMZ_TARGET", "")).removeprefix(KINESIS_TARGET_PREFIX)
        if operation not in RESHARD_OPERATIONS:
            return app(environ, start_response)
        body = json.dumps({"__type": "UnsupportedOperationException", "message": RESHARD_REFUSAL}).encode()
        start_response("400 Bad Request", [("Content-Type", "application/x-amz-json-1.1")])
        return [body]

    return application


def serve_moto(port: int, refuse_reshards: bool = False) -> None:
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app: Application = DomainDispatcherApplication(create_backend_app)
    if refuse_reshards:
        app = _refusing_reshards(app)
    make_server(LOOPBACK, port, _serialised(app), threaded=True, request_handler=MotoRequestHandler).serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kinesis_lease.local_trial.emulators")
    parser.add_argument("emulator", choices=["moto"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--refuse-reshards", action="store_true", help=", ".join(RESHARD_OPERATIONS))
    arguments = parser.parse_args(argv)
    serve_moto(arguments.port, arguments.refuse_reshards)


if __name__ == "__main__":
    main()
