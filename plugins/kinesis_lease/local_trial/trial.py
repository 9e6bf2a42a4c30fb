"""The local trial's emulators as background processes that outlive the command starting them.

`up` starts moto's server (DynamoDB, S3) and kinesis-mock (Kinesis) detached, on loopback, and writes
what it started to `state.json` in the state folder: each process' PID, port, command and start time,
and its log file beside it. When kinesis-mock cannot run (no Node.js, or not installed) Kinesis is
moto's own, in the same process, which refuses to reshard (`emulators`). `down` stops exactly the
processes the state names, and only while they are still the ones it started: a PID whose process has
another start time or command line (the trial's processes ended, and the PID was reused) is left alone.
Nothing outside the state folder is touched; the emulators keep their data in memory only, so a
stopped trial's streams and tables are gone. `up` and `down` hold an exclusive lock on `state.lock`
in the state folder while they look and act: two `up`s at once (two terminals, a script and a user)
start one trial, the second finding it running, instead of two whose first nobody could stop.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from kinesis_lease.local_trial.emulators import (
    KINESIS_MOCK_HEALTH_PATH,
    KINESIS_MOCK_PACKAGE,
    MISSING_MOTO,
    MOTO_HEALTH_PATH,
    endpoint_of,
    free_port,
    kinesis_mock_environment,
    kinesis_mock_home,
    moto_available,
    moto_command,
    wait_for_http,
)
from kinesis_lease.local_trial.environment import Endpoints

DEFAULT_STATE_DIR = Path("~/.kinesis-lease/local")
STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
# Where `up` looks for kinesis-mock unless told: a folder npm installed it into.
KINESIS_MOCK_FOLDER = "kinesis-mock"
# (Not KINESIS_LEASE_*: those are the consumer settings, and an unknown one is refused as a typo.)
KINESIS_MOCK_VARIABLE = "KINESIS_MOCK_HOME"
KINESIS_CHOICES = ("auto", "kinesis-mock", "moto")
STARTUP_SECONDS = 60.0
TERMINATE_GRACE_SECONDS = 2.0
KILL_WAIT_SECONDS = 10.0
MOTO = "moto"
KINESIS_MOCK = "kinesis-mock"


class TrialError(Exception):
    """The trial cannot start as asked; the message says what to install or change."""


@dataclass(frozen=True)
class Service:
    """One process the trial started, and how to tell later that a PID is still that process."""

    name: str  # "moto" or "kinesis-mock"
    pid: int
    port: int
    create_time: float  # the process' start time (psutil), which a reused PID does not share
    command: list[str]
    log: str

    @property
    def endpoint(self) -> str:
        return endpoint_of(self.port)

    def process(self) -> psutil.Process | None:
        """The running process, if the PID is still the one started (same start time and command)."""
        try:
            process = psutil.Process(self.pid)
            same = abs(process.create_time() - self.create_time) < 0.01 and process.cmdline() == self.command
            return process if same and not ended(process) else None
        except psutil.Error:
            return None


@dataclass(frozen=True)
class TrialState:
    services: list[Service]
    kinesis: str  # the Kinesis emulator: "kinesis-mock", or "moto" (moto's own, in the moto process)

    @property
    def moto(self) -> Service:
        return next(service for service in self.services if service.name == MOTO)

    @property
    def endpoints(self) -> Endpoints:
        kinesis = next((service for service in self.services if service.name == KINESIS_MOCK), self.moto)
        return Endpoints(dynamodb=self.moto.endpoint, kinesis=kinesis.endpoint, s3=self.moto.endpoint)

    def served_by(self, service: Service) -> str:
        """The services `service` emulates: moto serves Kinesis too when kinesis-mock does not run."""
        if service.name == KINESIS_MOCK:
            return "Kinesis"
        return "DynamoDB, S3" if self.kinesis == KINESIS_MOCK else "DynamoDB, S3, Kinesis"

    def running(self) -> bool:
        return all(service.process() is not None for service in self.services)

    def to_json(self) -> str:
        services = [asdict(service) for service in self.services]
        return json.dumps({"kinesis": self.kinesis, "services": services}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrialState:
        document = json.loads(text)
        return cls([Service(**entry) for entry in document["services"]], document["kinesis"])


@dataclass(frozen=True)
class Stopped:
    """What `down` did with each recorded process: stopped it, found it gone, or left a stranger alone."""

    stopped: list[Service]
    gone: list[Service]


class LocalTrial:
    """The trial whose state lives in `state_dir`."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir.expanduser()
        self.state_file = self.state_dir / STATE_FILE

    def state(self) -> TrialState | None:
        return TrialState.from_json(self.state_file.read_text()) if self.state_file.exists() else None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the state folder's lock (another `up` or `down` waits for it); the kernel releases it
        when this process ends, however it ends."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / LOCK_FILE).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def up(self, kinesis: str = "auto", kinesis_mock: Path | None = None) -> tuple[TrialState, bool]:
        """The running trial, started unless it ran already (then False); a trial whose processes are not
        all running any more is stopped (what of it is still ours) and started anew."""
        with self._locked():
            return self._up(kinesis, kinesis_mock)

    def _up(self, kinesis: str, kinesis_mock: Path | None) -> tuple[TrialState, bool]:
        former = self.state()
        if former is not None:
            if former.running():
                return former, False
            self._down()
        if not moto_available():
            raise TrialError(MISSING_MOTO)
        home = self._kinesis_mock_home(kinesis, kinesis_mock)
        started: list[Service] = []
        try:
            port = free_port()
            started.append(
                self._start(MOTO, moto_command(port, refuse_reshards=home is None), port, MOTO_HEALTH_PATH, os.environ)
            )
            if home is not None:
                port = free_port()
                command, env = ["node", "main.js"], kinesis_mock_environment(port)
                started.append(self._start(KINESIS_MOCK, command, port, KINESIS_MOCK_HEALTH_PATH, env, home))
        except BaseException:
            _stop_all(started)
            raise
        state = TrialState(started, MOTO if home is None else KINESIS_MOCK)
        self.state_file.write_text(state.to_json())
        return state, True

    def down(self) -> Stopped | None:
        """Stop the recorded processes that are still the trial's, and forget the state; None if none."""
        if not self.state_dir.exists():  # nothing ever started here: nothing to create either
            return None
        with self._locked():
            return self._down()

    def _down(self) -> Stopped | None:
        state = self.state()
        if state is None:
            return None
        ours = {service.name: service.process() for service in state.services}
        stopped = [service for service in state.services if ours[service.name] is not None]
        _stop_all(stopped)
        self.state_file.unlink()
        return Stopped(stopped, [service for service in state.services if service not in stopped])

    def _kinesis_mock_home(self, kinesis: str, explicit: Path | None) -> Path | None:
        """kinesis-mock's folder, or None when Kinesis is to be moto's."""
        if kinesis == MOTO:
            return None
        given = explicit or (Path(os.environ[KINESIS_MOCK_VARIABLE]) if os.environ.get(KINESIS_MOCK_VARIABLE) else None)
        home = kinesis_mock_home((given or self.state_dir / KINESIS_MOCK_FOLDER).expanduser())
        problem = (
            "Node.js (node) is not on PATH"
            if shutil.which("node") is None
            else None
            if (home / "main.js").exists()
            else f"kinesis-mock is not installed at {home}"
        )
        if problem is None:
            return home.resolve()
        if kinesis == KINESIS_MOCK:
            raise TrialError(f"{problem}: {self.kinesis_mock_hint()}")
        return None

    def kinesis_mock_hint(self) -> str:
        folder = self.state_dir / KINESIS_MOCK_FOLDER
        return (
            f"install Node.js, then `npm install --prefix {folder} {KINESIS_MOCK_PACKAGE}` "
            f"(or give its folder with --kinesis-mock or {KINESIS_MOCK_VARIABLE})"
        )

    def _start(
        self, name: str, command: list[str], port: int, health: str, env: Mapping[str, str], cwd: Path | None = None
    ) -> Service:
        """Start `command` in a session of its own (no terminal's Ctrl-C reaches it), output to its log, in
        the state folder unless `cwd` says otherwise (so no module in the caller's folder shadows ours)."""
        log = self.state_dir / f"{name}.log"
        with log.open("ab") as output:
            process = subprocess.Popen(
                command,
                env=dict(env),
                cwd=cwd or self.state_dir,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = Service(name, process.pid, port, psutil.Process(process.pid).create_time(), command, str(log))
        try:
            wait_for_http(endpoint_of(port) + health, STARTUP_SECONDS, process)
        except BaseException as error:
            _stop_all([service])
            raise TrialError(f"{name} did not start ({error}); its log: {log}") from None
        return service


def _stop_all(services: list[Service]) -> None:
    """Terminate each process that is still the one started, then kill what has not ended after a moment
    (kinesis-mock ignores SIGTERM); by PID only, and only those processes."""
    processes = [process for service in services if (process := service.process()) is not None]
    for process in processes:
        process.terminate()
    alive = _wait_ended(processes, TERMINATE_GRACE_SECONDS)
    for process in alive:
        process.kill()
    _wait_ended(alive, KILL_WAIT_SECONDS)


def _wait_ended(processes: list[psutil.Process], timeout_seconds: float) -> list[psutil.Process]:
    """The processes that have not ended within the timeout. An ended process that is not this one's
    child stays a zombie until its new parent reaps it (which some init processes never do): ended too."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        alive = [process for process in processes if not ended(process)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def ended(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
