"""A real Spark standalone cluster on loopback for tests: one master and N workers.

They are started with the scripts inside the pip-installed pyspark (`$SPARK_HOME` = the `pyspark`
package folder; it has `sbin/spark-daemon.sh` but no `start-master.sh`), bound to 127.0.0.1 on
ports chosen free at start, with every file (PID files, daemon logs, worker and local dirs, an
empty configuration dir) in a directory of the cluster's own. `spark-daemon.sh stop` kills by the
PID file that `start` wrote, so only processes this cluster started are ever signalled; `stop()`
then checks that those processes and their executors are gone and kills the rest by PID.

The daemons (and so the executors they launch) get a clean environment: no AWS credentials, no
PYTHONPATH, no PYSPARK_* of the test process. What an application's executors need must come with
the application, as on a real cluster whose workers are other machines.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil
import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_DAEMON = SPARK_HOME / "sbin" / "spark-daemon.sh"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
HOST = "127.0.0.1"

# Variables of the test process the daemons keep; everything else is left behind.
INHERITED_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "JAVA_HOME", "TMPDIR")
LOG_TAIL_LINES = 30
# The cluster's spark-defaults.conf, read by its daemons and by a spark-submit given `submit_environment`:
# the first job waits until every executor registered (standalone's default ratio is 0, so a job may
# start on the first executor and run its W slot tasks one after the other).
SPARK_DEFAULTS = {"spark.scheduler.minRegisteredResourcesRatio": "1.0"}


class SparkClusterError(RuntimeError):
    """The cluster did not come up (the message carries the daemons' log tails)."""


@dataclass(frozen=True)
class SparkDaemon:
    """One daemon: its class, its instance number (the PID file's name) and its arguments."""

    command: str
    instance: int
    arguments: tuple[str, ...]

    @property
    def role(self) -> str:
        return f"{self.command.rsplit('.', 1)[-1].lower()}-{self.instance}"


class SparkStandaloneCluster:
    """`with SparkStandaloneCluster(directory) as cluster:` a master and `workers` workers, ALIVE.

    `master_url` is the `spark://` URL to submit to; `status()` is the master's JSON (workers,
    active and completed applications); `worker_work_dirs` hold the executors' directories
    (`app-*/<executor id>/` with their stdout and stderr). `environment` adds variables to the
    daemons' (and so the executors') clean environment. Ports are chosen free when it is made.
    """

    def __init__(
        self,
        directory: Path,
        workers: int = 2,
        cores_per_worker: int = 1,
        memory_per_worker: str = "1g",
        environment: Mapping[str, str] | None = None,
        start_timeout_seconds: float = 60.0,
        stop_timeout_seconds: float = 20.0,
    ) -> None:
        self.directory = Path(directory)
        self.ident = f"test-{os.getpid()}-{time.monotonic_ns()}"
        self.start_timeout_seconds = start_timeout_seconds
        self.stop_timeout_seconds = stop_timeout_seconds
        ports = _free_ports(2 + 2 * workers)
        self.master_port, self.master_webui_port = ports[:2]
        self.worker_ports, self.worker_webui_ports = ports[2 : 2 + workers], ports[2 + workers :]
        self.worker_work_dirs = [self.directory / f"worker-{index}" for index in range(1, workers + 1)]
        self.master = SparkDaemon(
            MASTER_CLASS,
            1,
            ("--host", HOST, "--port", str(self.master_port), "--webui-port", str(self.master_webui_port)),
        )
        self.workers = [
            SparkDaemon(
                WORKER_CLASS,
                index + 1,
                (
                    "--host",
                    HOST,
                    "--port",
                    str(self.worker_ports[index]),
                    "--webui-port",
                    str(self.worker_webui_ports[index]),
                    "--cores",
                    str(cores_per_worker),
                    "--memory",
                    memory_per_worker,
                    "--work-dir",
                    str(self.worker_work_dirs[index]),
                    self.master_url,
                ),
            )
            for index in range(workers)
        ]
        self.environment = self._daemon_environment(environment or {})
        self.stopped_pids: list[int] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def master_webui_url(self) -> str:
        return f"http://{HOST}:{self.master_webui_port}"

    @property
    def conf_dir(self) -> Path:
        return self.directory / "conf"

    def submit_environment(self) -> dict[str, str]:
        """Environment for a spark-submit to this cluster: its configuration dir (spark-defaults.conf)."""
        return {"SPARK_CONF_DIR": str(self.conf_dir)}

    @property
    def daemons(self) -> list[SparkDaemon]:
        return [self.master, *self.workers]

    # --- start ---------------------------------------------------------------------------------

    def __enter__(self) -> SparkStandaloneCluster:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master, then the workers at once; return when the master lists them all ALIVE."""
        for folder in ("pids", "logs", "conf", "local", *(path.name for path in self.worker_work_dirs)):
            (self.directory / folder).mkdir(parents=True, exist_ok=True)
        (self.conf_dir / "spark-defaults.conf").write_text(
            "".join(f"{key} {value}\n" for key, value in SPARK_DEFAULTS.items())
        )
        launches: list[subprocess.Popen[str]] = []
        try:
            launches.append(self._launch(self.master))
            # A worker that finds no master retries only after 5-15 s: give it a listening master.
            self._wait_for(lambda: _listening(self.master_port), "the master to listen on its port")
            launches += [self._launch(worker) for worker in self.workers]
            for launch in launches:  # each script returns ~2.5 s after its daemon started
                output, _ = launch.communicate(timeout=self.start_timeout_seconds)
                if launch.returncode != 0 or "failed to launch" in output:
                    raise SparkClusterError(f"spark-daemon.sh start failed:\n{output}{self.log_tails()}")
            self._wait_for(lambda: len(self.alive_workers()) == len(self.workers), f"{len(self.workers)} ALIVE workers")
        except BaseException:
            for launch in launches:
                if launch.poll() is None:
                    launch.kill()
            self.stop()
            raise

    def _launch(self, daemon: SparkDaemon) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", str(SPARK_DAEMON), "start", daemon.command, str(daemon.instance), *daemon.arguments],
            env=self.environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, which stops the cluster
        )

    def _daemon_environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        inherited = {name: os.environ[name] for name in INHERITED_VARIABLES if name in os.environ}
        return {
            **inherited,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONF_DIR": str(self.conf_dir),  # ours: no spark-env.sh or defaults of the machine
            "SPARK_PID_DIR": str(self.directory / "pids"),
            "SPARK_LOG_DIR": str(self.directory / "logs"),
            "SPARK_LOCAL_DIRS": str(self.directory / "local"),
            "SPARK_IDENT_STRING": self.ident,
            "SPARK_LOCAL_IP": HOST,
            **extra,
        }

    def _wait_for(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_seconds
        while not condition():
            if time.monotonic() > deadline:
                raise SparkClusterError(
                    f"Spark standalone cluster: no {what} within {self.start_timeout_seconds:.0f} s{self.log_tails()}"
                )
            time.sleep(0.2)

    # --- status --------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The master's JSON status: `workers`, `activeapps`, `completedapps`, ..."""
        return _get_json(f"{self.master_webui_url}/json/")

    def worker_status(self, index: int) -> dict[str, Any]:
        """Worker `index` (0-based)'s JSON status: its `executors` and `finishedexecutors`."""
        return _get_json(f"http://{HOST}:{self.worker_webui_ports[index]}/json/")

    def alive_workers(self) -> list[dict[str, Any]]:
        try:
            workers = self.status()["workers"]
        except (OSError, ValueError):  # not serving yet
            return []
        return [worker for worker in workers if worker["state"] == "ALIVE"]

    def completed_applications(self) -> list[dict[str, Any]]:
        return self.status()["completedapps"]

    def executor_dirs(self, index: int) -> list[Path]:
        """Executor directories `app-*/<executor id>` that worker `index` (0-based) created."""
        return sorted(path for path in self.worker_work_dirs[index].glob("app-*/*") if path.is_dir())

    def pid_file(self, daemon: SparkDaemon) -> Path:
        return self.directory / "pids" / f"spark-{self.ident}-{daemon.command}-{daemon.instance}.pid"

    def pids(self) -> dict[str, int]:
        """The running daemons' PIDs by role (`master-1`, `worker-1`, ...), from their PID files."""
        return {
            daemon.role: int(self.pid_file(daemon).read_text().strip())
            for daemon in self.daemons
            if self.pid_file(daemon).exists()
        }

    def log_tails(self) -> str:
        parts = []
        for log in sorted((self.directory / "logs").glob("*.out")):
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            parts.append(f"\n--- {log.name} (last {len(lines)} lines) ---\n" + "\n".join(lines))
        return "".join(parts)

    # --- stop ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every daemon with `spark-daemon.sh stop`, then make sure they and their executors are gone."""
        started = self._our_processes()
        for daemon in [*self.workers, self.master]:  # workers first: they do not try to reach a stopped master
            if self.pid_file(daemon).exists():
                subprocess.run(
                    ["bash", str(SPARK_DAEMON), "stop", daemon.command, str(daemon.instance)],
                    env=self.environment,
                    capture_output=True,
                    text=True,
                    timeout=self.stop_timeout_seconds,
                    check=False,
                )
        _, alive = psutil.wait_procs(started, timeout=self.stop_timeout_seconds)
        for process in alive:  # psutil refuses to signal a PID that was reused meanwhile
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        _, still_alive = psutil.wait_procs(alive, timeout=5)
        self.stopped_pids = [process.pid for process in started]
        if still_alive:
            raise SparkClusterError(f"Spark processes still running after kill: {[p.pid for p in still_alive]}")

    def _our_processes(self) -> list[psutil.Process]:
        """The daemons of our PID files (if still the JVMs we started) and their children (executors)."""
        processes = []
        for daemon in self.daemons:
            try:
                process = psutil.Process(int(self.pid_file(daemon).read_text().strip()))
                if daemon.command in process.cmdline():
                    processes += [process, *process.children(recursive=True)]
            except (FileNotFoundError, ValueError, psutil.NoSuchProcess):
                continue
        return processes


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free on loopback now (held together, so none is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())
