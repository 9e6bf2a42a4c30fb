"""Processes the campaign starts: each tracked with every descendant it was seen with, stopped by PID.

A consume attempt is `spark-submit` in a session of its own (PySpark's daemon signals its whole
process group when it shuts down, which must never reach the campaign): the launcher execs the
driver JVM, which starts the Python driver (`consume_job.py`) and, per executor, a
`pyspark.daemon` that forks one Python worker per running task, here one per slot.

Every process the campaign starts carries `KINESIS_CHAOS_RUN=<id>` in its environment, so that
`stop_leftovers` finds (and kills, by PID) anything still alive at the end, including children that
outlived a killed parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

RUN_MARKER = "KINESIS_CHAOS_RUN"
STOP_GRACE_SECONDS = 5.0


class TrackedProcess:
    """A process started by the campaign and the descendants seen so far (children outlive parents)."""

    def __init__(
        self, label: str, command: Sequence[str], env: dict[str, str], log_path: Path, cwd: Path | None = None
    ) -> None:
        self.label = label
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            list(command),
            env=env,
            cwd=cwd or log_path.parent,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._seen: dict[int, psutil.Process] = {}
        self.refresh()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def refresh(self) -> list[psutil.Process]:
        """Every live process of the tree, remembering new descendants."""
        try:
            root = psutil.Process(self.popen.pid)
            for process in [root, *root.children(recursive=True)]:
                self._seen.setdefault(process.pid, process)
        except psutil.Error:
            pass
        return [process for process in self._seen.values() if _alive(process)]

    def find(self, *fragments: str) -> list[psutil.Process]:
        """Live processes of the tree whose command line contains every fragment, oldest first."""
        found = [process for process in self.refresh() if all(f in _cmdline(process) for f in fragments)]
        return sorted(found, key=lambda process: (process.create_time(), process.pid))

    def kill(self, processes: Sequence[psutil.Process], sig: int = signal.SIGKILL) -> list[int]:
        killed = []
        for process in processes:
            try:
                process.send_signal(sig)
                killed.append(process.pid)
            except psutil.Error:
                pass
        return killed

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM the tree, SIGKILL what is left after the grace period; reap the root."""
        live = self.refresh()
        self.kill(live, signal.SIGTERM)
        _, still = psutil.wait_procs(live, timeout=grace_seconds)
        self.kill(still, signal.SIGKILL)
        psutil.wait_procs(still, timeout=5)
        self.wait(5)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if self.popen.poll() is not None and not self._log.closed:
                self._log.close()

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class ConsumeAttempt(TrackedProcess):
    """One `spark-submit` of the consume job: its driver JVM, Python driver and slot workers."""

    def __init__(
        self,
        label: str,
        command: Sequence[str],
        env: dict[str, str],
        log_path: Path,
        report_path: Path,
        leader_owner: str | None,
    ) -> None:
        super().__init__(label, command, env, log_path)
        self.report_path = report_path
        self.leader_owner = leader_owner

    def driver_jvm(self) -> list[psutil.Process]:
        """The JVM running SparkSubmit (not the short-lived launcher JVM that builds its command line)."""
        return [
            process
            for process in self.find("org.apache.spark.deploy.SparkSubmit")
            if "org.apache.spark.launcher.Main" not in _cmdline(process)
        ]

    def python_driver(self) -> list[psutil.Process]:
        return [process for process in self.find("consume_job.py") if "java" not in process.name()]

    def slot_workers(self) -> list[psutil.Process]:
        """Python workers forked by a pyspark.daemon (the daemon itself is excluded)."""
        daemons = {process.pid for process in self.find("pyspark.daemon")}
        return [process for process in self.find("pyspark.daemon") if _parent_pid(process) in daemons]


def stop_leftovers(run_id: str) -> list[int]:
    """Kill, by PID, every process that carries this campaign's marker (none should be left)."""
    leftovers = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(RUN_MARKER) == run_id:
                process.kill()
                leftovers.append(process.pid)
        except psutil.Error:
            continue
    return leftovers


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _parent_pid(process: psutil.Process) -> int | None:
    try:
        return process.ppid()
    except psutil.Error:
        return None
