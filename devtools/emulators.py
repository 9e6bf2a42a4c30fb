"""Local AWS emulators for the embedded default and the tests, each in its own process on loopback.

`MotoServer` runs moto (DynamoDB, S3) behind a lock that serialises requests: moto's backends
check a write's condition and apply it without any locking, so two concurrent conditional writes
can both succeed on it, which real DynamoDB never allows. Serialising requests restores the
per-item atomicity the lease protocol relies on.

`KinesisMock` runs kinesis-mock (npm `kinesis-local`), the Kinesis emulator that models resharding
correctly (ChildShards, closed shards ending, ShardFilter), installed by `scripts/bootstrap.sh` under
`packaging/kinesis-mock/`.

Run moto directly: `python -m devtools.emulators moto --port N`.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
KINESIS_MOCK_HOME = (
    Path(__file__).resolve().parents[1] / "packaging" / "kinesis-mock" / "node_modules" / "kinesis-local"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


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
        self.endpoint = f"http://{LOOPBACK}:{port}"
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
    command = [sys.executable, "-m", "devtools.emulators", "moto", "--port", str(port)]
    return EmulatorProcess(
        command, port, "/moto-api/", env={**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    )


def kinesis_mock(
    port: int | None = None,
    reshard_duration: str = "50ms",
    shard_limit: int = 2000,
    extra_env: dict[str, str] | None = None,
) -> EmulatorProcess:
    """kinesis-mock on a free loopback port, with fast stream operations for tests and the demo."""
    if not (KINESIS_MOCK_HOME / "main.js").exists():
        raise FileNotFoundError(f"kinesis-mock is not installed at {KINESIS_MOCK_HOME}; run scripts/bootstrap.sh first")
    port = port or free_port()
    env = {
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
    # kinesis-mock does not exit on SIGTERM (measured: the full grace period every time), and it
    # keeps nothing worth a graceful shutdown (SHOULD_PERSIST_DATA=false): kill it after a moment.
    return EmulatorProcess(["node", "main.js"], port, "/", env=env, cwd=str(KINESIS_MOCK_HOME), stop_grace_seconds=1.0)


def _serialised(app: Callable[..., Iterable[bytes]]) -> Callable[..., list[bytes]]:
    lock = threading.Lock()

    def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with lock:
            return list(app(environ, start_response))

    return application


def _serve_moto(port: int) -> None:
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = _serialised(DomainDispatcherApplication(create_backend_app))
    make_server(LOOPBACK, port, app, threaded=True, request_handler=MotoRequestHandler).serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devtools.emulators")
    parser.add_argument("emulator", choices=["moto"])
    parser.add_argument("--port", type=int, required=True)
    arguments = parser.parse_args(argv)
    _serve_moto(arguments.port)


if __name__ == "__main__":
    main()
