"""The StatsD daemon (npm `statsd`, pinned by packaging/statsd/package-lock.json and installed by
scripts/bootstrap.sh) on loopback, for the tests that send Airflow's metrics to it, and Airflow's metrics
backend pointed at it (`airflow_metrics_to`).

It runs in its own process with no backend and a flush interval longer than any test, so what
arrives stays in its memory: counters summed, the last value of each gauge, every timer's samples.
The test reads them back through the daemon's management interface (a TCP port: `counters`, `gauges`,
`timers`), which answers with Node's `util.inspect` of a flat object, `{ 'name': 5, ... }`.
"""

from __future__ import annotations

import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
from airflow.sdk.configuration import conf
from airflow.sdk.observability import stats
from airflow.sdk.observability.metrics import stats_utils

from devtools.emulators import LOOPBACK, free_port
from tests.support.airflow_dag import airflow_environment

STATSD_HOME = Path(__file__).resolve().parents[2] / "packaging" / "statsd" / "node_modules" / "statsd"
STARTUP_SECONDS = 20.0
# One entry of util.inspect's flat object: a quoted (or bare) key, and a number or an array of numbers.
_ENTRY = re.compile(r"(?:'((?:[^'\\]|\\.)*)'|([A-Za-z_$][\w$]*)): (\[[^\]]*\]|-?[\d.]+(?:e[-+]?\d+)?)")
_NUMBER = re.compile(r"-?[\d.]+(?:e[-+]?\d+)?")


@dataclass(frozen=True)
class StatsdDaemon:
    port: int  # UDP, where metrics are sent
    management_port: int  # TCP

    def counters(self) -> dict[str, float]:
        return {name: value for name, value in self._dump("counters").items() if isinstance(value, float)}

    def gauges(self) -> dict[str, float]:
        return {name: value for name, value in self._dump("gauges").items() if isinstance(value, float)}

    def timers(self) -> dict[str, list[float]]:
        return {name: value for name, value in self._dump("timers").items() if isinstance(value, list)}

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the daemon has handled every datagram sent to it so far: a marker sent after them
        arrives in the same receive queue behind them, and shows once they are counted."""
        marker = f"settled_{time.monotonic_ns()}"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(f"{marker}:1|c".encode(), (LOOPBACK, self.port))
        deadline = time.monotonic() + timeout
        while marker not in self.counters():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the StatsD daemon did not count {marker} within {timeout} s")
            time.sleep(0.02)

    def ask(self, command: str) -> str:
        """The management interface's answer to `command`, up to its END line (or the one line of `health`)."""
        with socket.create_connection((LOOPBACK, self.management_port), timeout=5) as connection:
            connection.sendall(command.encode() + b"\n")
            answer = b""
            while not (answer.endswith(b"END\n\n") or (command == "health" and answer.endswith(b"\n"))):
                chunk = connection.recv(65536)
                if not chunk:
                    break
                answer += chunk
        return answer.decode()

    def _dump(self, command: str) -> dict[str, float | list[float]]:
        text = self.ask(command).removesuffix("END\n\n")
        values: dict[str, float | list[float]] = {}
        for quoted, bare, value in _ENTRY.findall(text):
            name = quoted.replace("\\'", "'") if quoted else bare
            values[name] = (
                [float(number) for number in _NUMBER.findall(value)] if value.startswith("[") else float(value)
            )
        return values


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


@contextmanager
def statsd_daemon() -> Iterator[StatsdDaemon]:
    """A StatsD daemon on free loopback ports, stopped (by its PID) on exit."""
    main = STATSD_HOME / "stats.js"
    if not main.exists():
        raise FileNotFoundError(f"the StatsD daemon is not installed at {STATSD_HOME}; run scripts/bootstrap.sh first")
    daemon = StatsdDaemon(_free_udp_port(), free_port())
    with tempfile.TemporaryDirectory(prefix="statsd-") as folder:
        config = Path(folder) / "config.js"
        config.write_text(
            f'{{ port: {daemon.port}, address: "{LOOPBACK}", mgmt_port: {daemon.management_port}, '
            f'mgmt_address: "{LOOPBACK}", flushInterval: 86400000, backends: [] }}\n'
        )
        process = subprocess.Popen(["node", str(main), str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _await_health(daemon, process)
            yield daemon
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _await_health(daemon: StatsdDaemon, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        if process.poll() is not None:
            error = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"the StatsD daemon exited with status {process.returncode}: {error[-2000:]}")
        try:
            if daemon.ask("health").startswith("health: up"):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the StatsD daemon did not answer on port {daemon.management_port} in time")
        time.sleep(0.05)


@contextmanager
def airflow_metrics_to(daemon: StatsdDaemon, legacy_names: bool = True) -> Iterator[None]:
    """Airflow's `[metrics]` pointed at `daemon` (its environment variables), and its metrics backend in
    this process started as Airflow's task runner starts it in a task's; no backend again on exit."""
    variables = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": LOOPBACK,
        "AIRFLOW__METRICS__STATSD_PORT": str(daemon.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
        "AIRFLOW__METRICS__LEGACY_NAMES_ON": str(legacy_names),
    }
    with airflow_environment(variables):
        stats.initialize(
            factory=stats_utils.get_stats_factory(), export_legacy_names=conf.getboolean("metrics", "legacy_names_on")
        )
        try:
            yield
        finally:
            daemon.settle()
            stats.initialize(factory=NoStatsLogger, export_legacy_names=True)
