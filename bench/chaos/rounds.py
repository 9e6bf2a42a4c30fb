"""One round under faults, as a DAG run does it, with the consume job as real `spark-submit` processes.

    take the lock (waiting out a dead leader's) -> shard sync + assignment under it
    -> consume: try 1 (spark-submit, --leader-owner, --round) ... faults fire on a timeline ...
       (twins, retries: more tries of the same round) -> every try has exited
    -> teardown: release the lock (whatever happened) -> resets the operator retries after the round

The timeline counts from the start of try 1. A fault fires `delay` seconds after its anchor (the
start of try 1, or the first moment a slot's Python worker has run a batch: `schedule.ANCHORS`);
one that finds nothing to act on (no shard being read to split, no lease read yet to trim) looks
again every second while a try runs. When every try has ended first, a fault that needs a running
try (a worker kill, a driver kill), or one meant for the slots' batches when no batch ran, is
deferred to the next round (once: a fault deferred twice is dropped and counted as not injected);
the others fire at once, while the round still holds its lock.

A table commit's fault (a Delta table) is met by the round's first try itself: it is started with
a driver that meets the fault at its first commit (`commit_faults`), and the fault counts as injected
once that driver's note says it was met. A frozen driver is resumed once the retry beside it has
committed (`injections.resume_stalled`), or at the teardown at the latest.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.chaos import injections
from bench.chaos.commit_faults import driver_environment
from bench.chaos.injections import Injection, Stall
from bench.chaos.leader import Taking, describe, finalize, lead, release, take
from bench.chaos.processes import ConsumeAttempt, TrackedProcess
from bench.chaos.schedule import (
    ANCHORS,
    BEFORE_ROUND,
    DRIVER_KILL,
    LEADER_DEATH,
    TABLE_COMMIT,
    WORKER_SIGKILL,
    Fault,
    RoundPlan,
)
from bench.chaos.stack import set_arguments
from bench.chaos.subscription_faults import Subscriber, before_round
from bench.chaos.transforms import WorkerNote, worker_note
from bench.harness import REPOSITORY
from lease_core.application import LeaseApplication
from lease_core.errors import LeaseCoreError
from spark_jobs.round_report import MalformedReportError, RoundReport

if TYPE_CHECKING:
    from bench.chaos.campaign import Campaign

POLL_SECONDS = 0.2
RETRY_SECONDS = 1.0
ROUND_TIMEOUT_SECONDS = 300.0
MAX_RECORDS_PER_FILE = 25
MAX_SECONDS_PER_LEASE = 20
TRANSFORM = "bench.chaos.transforms:pace"
# Spark-submit options: local mode with task retries (plain local[N] never retries a task), loopback,
# no UI, quiet logs, a JVM tuned for start-up time (it is started once per try).
SPARK_OPTIONS = [
    "--master",
    "local[2,4]",
    "--conf",
    "spark.ui.enabled=false",
    "--conf",
    "spark.log.level=WARN",
    "--conf",
    "spark.driver.host=127.0.0.1",
    "--conf",
    "spark.driver.bindAddress=127.0.0.1",
    "--driver-java-options",
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
]
# What fires only while a try of the round runs (and is deferred to the next round otherwise).
NEEDS_A_RUNNING_TRY = frozenset({WORKER_SIGKILL, DRIVER_KILL})

TRY, RETRY, TWIN_SAME_OWNER, TWIN_BY_HAND = "try", "retry", "twin(same owner)", "twin(by hand)"


@dataclass
class Attempt:
    number: int
    role: str
    process: ConsumeAttempt
    started_at: float  # seconds on the round's timeline
    ended_at: float | None = None
    killed: list[str] = field(default_factory=list)

    @property
    def main_line(self) -> bool:
        """A try that holds the round's lock by name (a by-hand twin takes no handed-over lock)."""
        return self.role != TWIN_BY_HAND

    @property
    def label(self) -> str:
        return f"try {self.number} ({self.role})"

    def report(self) -> RoundReport | None:
        """The report the try wrote, or None when it wrote none (killed, or failed before the end)."""
        try:
            return RoundReport.from_json(self.process.report_path.read_bytes(), str(self.process.report_path))
        except (OSError, MalformedReportError):
            return None


@dataclass
class RoundResult:
    number: int
    workers: int
    owner: str
    assignment_round: int | None
    attempts: list[Attempt]
    injections: list[Injection]
    succeeded: bool
    seconds: float
    release: str
    taking: Taking | None = None
    error: str | None = None
    leading: str = ""

    def line(self) -> str:
        tries = ", ".join(f"{a.label} exit {a.process.returncode}" for a in self.attempts) or "no try"
        faults = ", ".join(i.short() for i in self.injections) or "none"
        state = "ok" if self.succeeded else "FAILED"
        error = f" ({self.error})" if self.error else ""
        lock = "" if self.release == "released" else f" | lock at the teardown: {self.release}"
        return (
            f"round {self.number:>3} W={self.workers} {state}{error} in {self.seconds:5.1f} s | {tries} | "
            f"faults: {faults}{lock}"
        )


class RoundRun:
    def __init__(self, campaign: Campaign, plan: RoundPlan) -> None:
        self.campaign = campaign
        self.stack = campaign.stack
        self.plan = plan
        self.owner = f"chaos/{campaign.seed}/round-{plan.number}/{plan.token}"
        self.config = campaign.control_config
        self.attempts: list[Attempt] = []
        self.injections: list[Injection] = []
        self.deferred: list[Fault] = []
        self.started = time.monotonic()
        self.consume_started: float | None = None
        self.assignment_round: int | None = None
        self.leading = ""
        self.proxy_off_at: float | None = None
        self.proxy_injection: Injection | None = None
        self.resets: list[tuple[Injection, TrackedProcess]] = []
        self.after_round: list[Injection] = []
        # The table commit's fault: the try whose driver meets it, the note it leaves, a frozen driver.
        self.commit_fault = next((fault for fault in plan.faults if fault.kind == TABLE_COMMIT), None)
        self.commit_note = self.directory / "commit-fault.json"
        self.hooked: Attempt | None = None
        self.stalled: Stall | None = None
        # How the round's slots read (a mode switch makes a fan-out campaign's round poll), and the
        # subscribers the subscription faults started.
        self.retrieval = self.stack.retrieval
        self.subscribers: list[Subscriber] = []

    @property
    def directory(self) -> Path:
        """The round's logs and reports."""
        return self.campaign.workdir / "rounds" / f"round-{self.plan.number:03d}"

    # --- the round -----------------------------------------------------------------------------

    def run(self) -> RoundResult:
        taking, error = None, None
        assert self.stack.kinesis_proxy is not None
        # How closed shards end in this round (campaign doc, `--shard-end`).
        self.stack.kinesis_proxy.end_shards_after_last_records(
            self.campaign.ends_shards_after_last_records(self.plan.number)
        )
        try:
            for fault in self.plan.faults:
                if fault.kind in BEFORE_ROUND:
                    self.injections.append(before_round(self, fault))
            for fault in self.plan.faults:
                if fault.kind == LEADER_DEATH:
                    self.injections.append(injections.leader_death(self, fault))
            taking = take(self.config, self.owner, give_up_after_seconds=self.campaign.takeover_bound_seconds)
            injections.judge_leader_deaths(self, taking)
            if self.retrieval == "fan_out":
                # As the DAG's table step does every round: register the consumer if it is gone.
                LeaseApplication(self.config).stream_consumers.ensure(self.stack.stream)
            synced, assigned = lead(self.config, self.owner, [self.stack.stream], self.plan.workers)
            self.leading = describe(synced, assigned)
            self.assignment_round = assigned.round_number
            self._consume(
                [fault for fault in self.plan.faults if fault.kind != LEADER_DEATH and fault.kind not in BEFORE_ROUND]
            )
            self._finalize()
        except Exception as error_:  # a round that could not run is reported; the campaign goes on
            error = f"{type(error_).__name__}: {error_}"
            self.campaign.violation(f"round {self.plan.number}: {error}")
        finally:
            self._stop_everything()
            released = release(self.config, self.owner)
        for injection in self.after_round:
            injections.reset_after_round(self, injection)
        succeeded = error is None and self._succeeded()
        for injection in self.injections:
            injections.judge(self, injection, succeeded)
        return RoundResult(
            self.plan.number,
            self.plan.workers,
            self.owner,
            self.assignment_round,
            self.attempts,
            self.injections,
            succeeded,
            round(time.monotonic() - self.started, 1),
            released,
            taking,
            error,
            self.leading,
        )

    def now(self) -> float:
        """Seconds on the round's timeline (from the start of try 1)."""
        return time.monotonic() - (self.consume_started or self.started)

    def _consume(self, faults: list[Fault]) -> None:
        self.consume_started = time.monotonic()
        self.start_attempt(TRY)
        pending = sorted(faults, key=lambda fault: fault.delay)
        retry_at: dict[int, float] = {}  # faults that found nothing to act on yet: when to look again
        first_batch_at: float | None = None
        while True:
            now = self.now()
            live = [attempt for attempt in self.attempts if attempt.process.running]
            for attempt in self.attempts:
                if attempt.ended_at is None and not attempt.process.running:
                    attempt.ended_at = now
            if first_batch_at is None and self.batching_workers():
                first_batch_at = now
            for fault in list(pending):
                decision = self._due(fault, now, first_batch_at, live)
                if decision == "wait" or (decision == "fire" and now < retry_at.get(id(fault), 0.0)):
                    continue
                injection = None if decision == "defer" else injections.inject(self, fault)
                if injection is None and decision == "fire" and live:
                    retry_at[id(fault)] = now + RETRY_SECONDS  # a shard or lease to act on may come
                    continue
                pending.remove(fault)
                if injection is None:
                    self.deferred.append(fault)
                    self.campaign.note(f"round {self.plan.number}: {fault.describe()} deferred (nothing to act on)")
                else:
                    self.injections.append(injection)
            if self.proxy_off_at is not None and (now >= self.proxy_off_at or not live):
                injections.proxy_faults_off(self)
            if self.stalled is not None:
                injections.resume_stalled(self)
            self._judge_finished_resets()
            if not pending and not live and not self.resets:
                return
            if now > ROUND_TIMEOUT_SECONDS:
                raise TimeoutError(
                    f"the round still ran after {ROUND_TIMEOUT_SECONDS:.0f} s: " + ", ".join(a.label for a in live)
                )
            time.sleep(POLL_SECONDS)

    def _due(self, fault: Fault, now: float, first_batch_at: float | None, live: list[Attempt]) -> str:
        """ "fire", "wait" or "defer" for `fault` at `now`."""
        if fault.kind in NEEDS_A_RUNNING_TRY and not any(attempt.main_line for attempt in live):
            return "defer"
        if not live:
            # The tries ended before the fault's moment: a fault meant for the slots' batches waits
            # for the next round once; otherwise it fires now, while the round still holds its lock.
            batches_missed = ANCHORS[fault.kind] == "batches" and first_batch_at is None
            return "defer" if batches_missed and not fault.deferrals else "fire"
        anchor = first_batch_at if ANCHORS[fault.kind] == "batches" else 0.0
        if anchor is None or now < anchor + fault.delay:
            return "wait"
        if fault.kind == WORKER_SIGKILL and not any(note.in_batch for _, _, note in self.batching_workers()):
            return "wait"  # a worker inside a batch, not one idle between its slot's batches or tasks
        return "fire"

    def batching_workers(self) -> list[tuple[Attempt, Any, WorkerNote]]:
        """Python workers of running main-line tries that have run a batch: (try, process, its note)."""
        found = []
        for attempt in self.live_main_line():
            for worker in attempt.process.slot_workers():
                note = worker_note(self.stack.control_dir, worker.pid)
                if note is not None:
                    found.append((attempt, worker, note))
        return found

    def _judge_finished_resets(self) -> None:
        for injection, process in list(self.resets):
            if not process.running:
                process.wait(5)
                self.resets.remove((injection, process))
                injections.judge_reset_during_round(self, injection, process)

    def _finalize(self) -> None:
        """As the DAG's finalize: only after the consume step succeeded, with its last try's report.
        A lock the round no longer holds leaves the losses on the leases for a later round's report."""
        main = [attempt for attempt in self.attempts if attempt.main_line]
        report = main[-1].report() if main and self._succeeded() else None
        if report is None:
            return
        try:
            forgotten = finalize(self.config, self.owner, report)
        except LeaseCoreError as error:
            self.campaign.note(
                f"round {self.plan.number}: finalize could not run ({error}); the losses stay on the leases"
            )
            return
        if forgotten:
            self.campaign.note(f"round {self.plan.number}: finalize kept the report's losses of {', '.join(forgotten)}")

    def _succeeded(self) -> bool:
        """The round's last main-line try exited 0 (a DAG's consume step succeeded at its last try)."""
        main = [attempt for attempt in self.attempts if attempt.main_line]
        return bool(main) and main[-1].process.returncode == 0

    def _stop_everything(self) -> None:
        if self.proxy_off_at is not None:
            injections.proxy_faults_off(self)
        if self.stalled is not None:
            injections.resume_stalled(self, at_teardown=True)
        for attempt in self.attempts:
            if attempt.process.running or attempt.process.refresh():
                attempt.process.stop()
            if attempt.ended_at is None:
                attempt.ended_at = self.now()
        for _, process in self.resets:
            process.stop()
        for subscriber in self.subscribers:
            subscriber.stop()

    # --- tries -----------------------------------------------------------------------------------

    def start_attempt(self, role: str) -> Attempt:
        number = len(self.attempts) + 1
        report = self.directory / f"try-{number}.json"
        owner = None if role == TWIN_BY_HAND else self.owner
        command = self.consume_command(report, owner)
        extra: dict[str, str] = {}
        if role == TRY and self.commit_fault is not None and self.hooked is None:
            extra = driver_environment(self.stack.driver_launcher(), self.commit_fault.variant, self.commit_note)
        process = ConsumeAttempt(
            f"round {self.plan.number} try {number}",
            command,
            self.stack.process_env(extra),
            self.directory / f"try-{number}.log",
            report,
            owner,
        )
        attempt = Attempt(number, role, process, self.now())
        self.attempts.append(attempt)
        if extra:
            self.hooked = attempt
        return attempt

    def consume_command(self, report: Path, owner: str | None) -> list[str]:
        spark_submit = str(Path(sys.executable).with_name("spark-submit"))
        command = [
            spark_submit,
            *SPARK_OPTIONS,
            str(REPOSITORY / "spark_jobs" / "consume_job.py"),
            "--application-name",
            self.stack.application,
            "--stream",
            self.stack.stream,
            "--workers",
            str(self.plan.workers),
            "--output-uri",
            self.stack.output_uri,
            "--report-uri",
            str(report),
            "--max-records-per-file",
            str(MAX_RECORDS_PER_FILE),
            "--max-seconds-per-lease",
            str(MAX_SECONDS_PER_LEASE),
            "--transform",
            TRANSFORM,
        ]
        if self.assignment_round is not None:
            command += ["--round", str(self.assignment_round)]
        if owner is not None:
            command += ["--leader-owner", owner]
        return command + set_arguments({**self.stack.data_plane_settings(), "retrieval": self.retrieval})

    def live_main_line(self) -> list[Attempt]:
        return [attempt for attempt in self.attempts if attempt.main_line and attempt.process.running]
