"""The faults: what each one does to a running round, and how its outcome is judged.

Every fault becomes an `Injection`: what was done (`detail`, with the numbers) and, once judged, an
`outcome` (a category, so the table can count them). A fault that breaks a rule the project
promises (a refusal that does not name the holder, a lock taken over too early, two rounds running
at once) adds a campaign violation as well. Whether any record was duplicated or lost is judged
once, at the end, over everything (`verdict`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.chaos import subscription_faults
from bench.chaos.commit_faults import (
    ANSWER_AS_CONFLICT,
    ANSWER_LOST,
    KILLED_AFTER,
    KILLED_BEFORE,
    STALLED,
    CommitNote,
)
from bench.chaos.processes import TrackedProcess
from bench.chaos.schedule import (
    AIRFLOW_RETRY,
    DRIVER_KILL,
    FAN_OUT_ONLY,
    IN_USE_WINDOW,
    LEADER_DEATH,
    MERGE,
    PROXY_FAULTS,
    RESET,
    RETENTION_TRIM,
    SPLIT,
    SUBSCRIPTION_CUT,
    TABLE_COMMIT,
    TWIN_ATTEMPT,
    WORKER_SIGKILL,
    ZOMBIE_SUBSCRIPTION,
    Fault,
)
from bench.chaos.stack import set_arguments
from devtools.fault_proxy import FAULT_KINDS as PROXY_FAULT_KINDS
from devtools.fault_proxy import FaultRule
from devtools.kinesis_streams import merge_shards, open_shards, split_shard
from lease_core.model.shards import Shard
from lease_core.ops.landed_audit import LandedBatch
from sinks.parquet import STAGED_PREFIX
from sinks.table.committer import SUMMARY_COMMIT_ID
from sinks.table.delta import DeltaSink
from spark_jobs.round_report import Publication

if TYPE_CHECKING:
    from bench.chaos.leader import Taking
    from bench.chaos.rounds import Attempt, RoundRun

# 30 % of the data plane's calls fail: the first matching rule whose draw hits decides a call, so
# the shares compound to 1 - 0.84 * 0.92 * 0.94 * 0.96 = 30.3 %.
PROXY_RULES = (
    FaultRule("throttle", 0.16),
    FaultRule("server_error", 0.08),
    FaultRule("drop_response", 0.06),  # the call is applied, its answer lost
    FaultRule("drop_request", 0.04),  # the connection drops, nothing is applied
)
LEADER_HOLDING_TIMEOUT_SECONDS = 60.0
# A trim ages out at most this many unread records (the backlog of a shard can be thousands).
MAX_TRIMMED_RECORDS = 50
# A driver frozen before its table commit is resumed at the latest after this long (the retry beside
# it normally commits within a round's time).
MAX_STALL_SECONDS = 120.0
LOG_ENTRY = re.compile(r"^\d{20}\.json$")  # a commit in a Delta table's log
LEASECTL = Path(sys.executable).with_name("leasectl")


@dataclass
class Injection:
    kind: str
    round: int
    fault: Fault
    at: float  # seconds on the round's timeline
    detail: str
    outcome: str = "not judged"
    count: int = 0  # a figure the table sums: calls failed, records aged out
    evidence: dict[str, Any] = field(default_factory=dict)

    def short(self) -> str:
        variant = f"[{self.fault.variant}]" if self.fault.variant else ""
        return f"{self.kind}{variant}@+{self.at:.1f}s"


def inject(run: RoundRun, fault: Fault) -> Injection | None:
    """Do `fault` now; None when what it needs does not exist (it is deferred to the next round)."""
    actions = {
        WORKER_SIGKILL: worker_sigkill,
        DRIVER_KILL: driver_kill,
        TWIN_ATTEMPT: twin_attempt,
        AIRFLOW_RETRY: airflow_retry,
        SPLIT: reshard,
        MERGE: reshard,
        PROXY_FAULTS: proxy_faults_on,
        RESET: reset_during_round,
        RETENTION_TRIM: retention_trim,
        TABLE_COMMIT: table_commit,
        SUBSCRIPTION_CUT: subscription_faults.subscription_cut,
        ZOMBIE_SUBSCRIPTION: subscription_faults.zombie_subscription,
        IN_USE_WINDOW: subscription_faults.in_use_window,
    }
    return actions[fault.kind](run, fault)


def new_injection(run: RoundRun, fault: Fault, detail: str, **evidence: Any) -> Injection:
    return Injection(fault.kind, run.plan.number, fault, round(run.now(), 1), detail, evidence=dict(evidence))


def _choose(items: list[Any], pick: float) -> Any:
    return items[min(int(pick * len(items)), len(items) - 1)]


# --- the consume job's processes ---------------------------------------------------------------


def worker_sigkill(run: RoundRun, fault: Fault) -> Injection | None:
    """SIGKILL one slot's Python worker inside a batch (between its prepare and its commit)."""
    candidates = [candidate for candidate in run.batching_workers() if candidate[2].in_batch]
    if not candidates:
        return None
    attempt, worker, note = _choose(candidates, fault.pick)
    attempt.process.kill([worker])
    attempt.killed.append("worker")
    where = "inside a batch (between its prepare and its commit)" if note.in_batch else "between batches"
    return new_injection(
        run,
        fault,
        f"SIGKILL Python worker {worker.pid} of {attempt.label}: slot {note.slot}, task attempt "
        f"{note.task_attempt}, {where}",
        attempt=attempt.number,
        slot=note.slot,
        task_attempt=note.task_attempt,
        in_batch=note.in_batch,
    )


def driver_kill(run: RoundRun, fault: Fault) -> Injection | None:
    """SIGKILL the driver of a running try: its JVM, its Python driver, or both (`variant`)."""
    live = run.live_main_line()
    if not live:
        return None
    attempt = _choose(live, fault.pick)
    jvm, python = attempt.process.driver_jvm(), attempt.process.python_driver()
    targets = {"jvm": jvm, "python": python, "both": jvm + python}[fault.variant] or jvm
    what = fault.variant if fault.variant != "python" or python else "jvm (the Python driver had not started)"
    killed = attempt.process.kill(targets)
    attempt.killed.append("driver")
    return new_injection(
        run, fault, f"SIGKILL {what} driver of {attempt.label} (pids {killed})", attempt=attempt.number
    )


def twin_attempt(run: RoundRun, fault: Fault) -> Injection:
    """A second consume job of the same application beside the running one."""
    from bench.chaos.rounds import TWIN_BY_HAND, TWIN_SAME_OWNER

    beside = [attempt.label for attempt in run.live_main_line()]
    twin = run.start_attempt(TWIN_SAME_OWNER if fault.variant == "same_owner" else TWIN_BY_HAND)
    return new_injection(
        run,
        fault,
        f"{twin.label} started beside {', '.join(beside) or 'no running try'}",
        twin=twin.number,
        beside=len(beside),
    )


def airflow_retry(run: RoundRun, fault: Fault) -> Injection:
    """Airflow's retry of the consume step: the try is killed as Airflow kills a failed task
    (spark-submit and everything it started, SIGKILL), then a new try of the same round starts,
    resuming the lock by the round's owner name."""
    from bench.chaos.rounds import RETRY

    main = [attempt for attempt in run.attempts if attempt.main_line]
    target = main[-1]
    if target.process.running:
        target.process.kill(target.process.refresh())  # spark-submit and everything it started
        target.process.stop()
        target.killed.append("airflow")
        how = f"killed {target.label}"
    else:
        how = f"{target.label} had ended (exit {target.process.returncode})"
    retry = run.start_attempt(RETRY)
    return new_injection(
        run,
        fault,
        f"{how}; {retry.label} started",
        retry=retry.number,
        killed=target.process.returncode is None or "airflow" in target.killed,
    )


# --- the leader --------------------------------------------------------------------------------


def leader_death(run: RoundRun, fault: Fault) -> Injection:
    """A leader process takes the lock, syncs and assigns, and is SIGKILLed `delay` s after it holds it."""
    owner = f"chaos/{run.campaign.seed}/dying-leader-{run.plan.number}/{run.plan.token}"
    settings = run.stack.control_settings()
    command = [
        sys.executable,
        "-m",
        "bench.chaos.dying_leader",
        "--owner",
        owner,
        "--stream",
        run.stack.stream,
        "--workers",
        str(run.plan.workers),
        "--set",
        f"application_name={settings['application_name']}",
        *set_arguments(settings),
    ]
    log = run.campaign.workdir / "rounds" / f"round-{run.plan.number:03d}" / "dying-leader.log"
    leader = TrackedProcess(f"dying leader of round {run.plan.number}", command, run.stack.process_env(), log)
    deadline = time.monotonic() + LEADER_HOLDING_TIMEOUT_SECONDS
    while "holding" not in leader.output() and leader.running and time.monotonic() < deadline:
        time.sleep(0.05)
    held = "holding" in leader.output()
    time.sleep(fault.delay)
    phase = "after assigning" if "assigned" in leader.output() else "while syncing or assigning"
    leader.kill(leader.refresh())
    killed_at = time.monotonic()
    leader.wait(10)
    injection = new_injection(
        run,
        fault,
        f"leader {owner} SIGKILLed {fault.delay:.1f} s after it held the lock ({phase})"
        if held
        else f"leader {owner} never held the lock: {leader.output()[-300:]!r}",
        owner=owner,
        killed_at=killed_at,
        held=held,
    )
    injection.at = 0.0
    return injection


def judge_leader_deaths(run: RoundRun, taking: Taking) -> None:
    """The round's take after a dead leader: refused naming the dead holder, then taken over, not
    before the lock's lease duration has passed since the holder's last heartbeat."""
    taken_at = time.monotonic()
    lease_seconds = run.config.leader_lease_duration_millis / 1000
    for injection in run.injections:
        if injection.kind != LEADER_DEATH:
            continue
        if not injection.evidence["held"]:
            injection.outcome = "the dying leader never held the lock"
            run.campaign.violation(f"round {run.plan.number}: {injection.detail}")
            continue
        owner, waited = injection.evidence["owner"], taken_at - injection.evidence["killed_at"]
        injection.detail += f"; the round took the lock over {waited:.1f} s after the kill"
        if not any(owner in refusal for refusal in taking.refusals):
            injection.outcome = "VIOLATION: not refused naming the dead holder"
            run.campaign.violation(
                f"round {run.plan.number}: the lock of dead leader {owner} was not refused naming "
                f"it (refusals: {taking.refusals})"
            )
        elif waited < 0.9 * lease_seconds:
            injection.outcome = "VIOLATION: taken over too early"
            run.campaign.violation(
                f"round {run.plan.number}: the dead leader's lock was taken over {waited:.1f} s after "
                f"its death, before its lease duration ({lease_seconds:.0f} s)"
            )
        else:
            injection.outcome = "refused: holder named, taken over after the lease duration"


# --- the stream --------------------------------------------------------------------------------


def reshard(run: RoundRun, fault: Fault) -> Injection | None:
    """Split an open shard at its midpoint, or merge two adjacent open shards (chosen by `pick`).

    Only shards whose lease is being read (its checkpoint a sequence number) are resharded, as an
    operator reshards a busy shard: resharding shards whose parents are still unread would stack
    up generations faster than rounds (one generation each) can drain them.
    """
    kinesis, stream = run.stack.kinesis(), run.stack.stream
    read = {
        lease.lease_key
        for lease in run.stack.lease_store().list_leases()
        if not lease.is_at_shard_end and not lease.checkpoint.is_sentinel
    }
    shards = open_shards(kinesis, stream)
    running = bool(run.live_main_line())
    when = "while a try ran" if running else "after the tries ended"
    if fault.kind == SPLIT:
        candidates = [shard for shard in shards if shard.shard_id in read]
        if not candidates:
            return None
        parent = _choose(candidates, fault.pick)
        children = split_shard(kinesis, stream, parent.shard_id)
        return new_injection(
            run,
            fault,
            f"split {parent.shard_id} -> {', '.join(children)} {when}",
            parents=[parent.shard_id],
            children=list(children),
            running=running,
        )
    pairs = [(left, right) for left, right in _adjacent_pairs(shards) if {left.shard_id, right.shard_id} <= read]
    if not pairs:
        return None
    left, right = _choose(pairs, fault.pick)
    child = merge_shards(kinesis, stream, left.shard_id, right.shard_id)
    return new_injection(
        run,
        fault,
        f"merge {left.shard_id} + {right.shard_id} -> {child} {when}",
        parents=[left.shard_id, right.shard_id],
        children=[child],
        running=running,
    )


def _adjacent_pairs(shards: list[Shard]) -> list[tuple[Shard, Shard]]:
    return [
        (left, right)
        for left, right in itertools.pairwise(shards)
        if left.hash_key_range.ending_hash_key + 1 == right.hash_key_range.starting_hash_key
    ]


def retention_trim(run: RoundRun, fault: Fault) -> Injection | None:
    """Age out the oldest unread records of a lease's shard (through the Kinesis proxy).

    Only a lease already read at least once (its checkpoint a sequence number) is trimmed: a lease
    at TRIM_HORIZON starts wherever the trim horizon is, so records that aged out before its first
    read are not a loss it could see. `depth` says how many of its unread records age out.
    """
    produced = run.campaign.produced_by_shard()
    leases = [
        lease
        for lease in run.stack.lease_store().list_leases()
        if not lease.is_at_shard_end and not lease.checkpoint.is_sentinel and produced.get(lease.lease_key)
    ]
    if not leases:
        return None
    unread_of = {
        lease.lease_key: [
            r for r in produced[lease.lease_key] if int(r.sequence_number) > int(lease.checkpoint.sequence_number)
        ]
        for lease in leases
    }
    pool = sorted(
        [lease for lease in leases if unread_of[lease.lease_key]] or leases, key=lambda lease: lease.lease_key
    )
    lease = _choose(pool, fault.pick)
    shard, unread = lease.lease_key, unread_of[lease.lease_key]
    if unread:
        index = min(int(fault.depth * len(unread)), len(unread) - 1, MAX_TRIMMED_RECORDS)
        before = unread[index].sequence_number
    else:
        index, before = 0, produced[shard][-1].sequence_number
    previous = run.campaign.trims.get(shard)
    if previous is not None and int(previous) >= int(before):
        before, index = previous, 0  # retention only ever moves forward
    assert run.stack.kinesis_proxy is not None
    run.stack.kinesis_proxy.trim(run.stack.stream, shard, before, mode=fault.variant)
    run.campaign.trims[shard] = before
    return new_injection(
        run,
        fault,
        f"trim horizon of {shard} moved to …{before[-8:]} ({fault.variant}): {index} unread "
        f"record(s) behind checkpoint …{str(lease.checkpoint)[-8:]} age out",
        shard=shard,
        before=before,
        at_risk=index,
    )


# --- the data plane's calls ----------------------------------------------------------------------


def proxy_faults_on(run: RoundRun, fault: Fault) -> Injection:
    """30 % of the job's Kinesis and DynamoDB calls throttled, failed, dropped or unanswered, for a window."""
    for proxy in _proxies(run):
        proxy.set_faults(PROXY_RULES)
    injection = new_injection(
        run, fault, f"30 % of calls failing for {fault.duration:.1f} s", before=_failed_calls(run)
    )
    run.proxy_off_at = run.now() + fault.duration
    run.proxy_injection = injection
    return injection


def proxy_faults_off(run: RoundRun) -> None:
    for proxy in _proxies(run):
        proxy.set_faults([])
    injection = run.proxy_injection
    if injection is not None:
        injection.count = _failed_calls(run) - injection.evidence["before"]
        injection.detail += f": {injection.count} calls failed"
    run.proxy_off_at, run.proxy_injection = None, None


def _proxies(run: RoundRun) -> list[Any]:
    return [proxy for proxy in (run.stack.kinesis_proxy, run.stack.dynamodb_proxy) if proxy is not None]


def _failed_calls(run: RoundRun) -> int:
    return sum(
        count
        for proxy in _proxies(run)
        for name, count in proxy.stats().items()
        if name.partition(":")[0] in PROXY_FAULT_KINDS
    )


# --- the operator --------------------------------------------------------------------------------


def reset_during_round(run: RoundRun, fault: Fault) -> Injection | None:
    """`leasectl reset` of a lease (chosen by `pick`) to its own checkpoint, while the round runs.

    The target is where the lease already is, so the reset moves no data on purpose: it only
    discards a prepared batch and fences the lease's holder. While the round holds the leader lock
    it must be refused, naming the holder.
    """
    leases = sorted(
        (lease for lease in run.stack.lease_store().list_leases() if not lease.is_at_shard_end),
        key=lambda lease: lease.lease_key,
    )
    if not leases:
        return None
    # An operator resets a lease that looks stuck: one with a prepared batch, if there is one.
    lease = _choose([lease for lease in leases if lease.pending_checkpoint is not None] or leases, fault.pick)
    process = TrackedProcess(
        f"reset in round {run.plan.number}",
        _reset_command(run, lease.lease_key, str(lease.checkpoint)),
        run.stack.process_env(),
        run.campaign.workdir / "rounds" / f"round-{run.plan.number:03d}" / f"reset-{len(run.injections) + 1}.log",
    )
    injection = new_injection(
        run,
        fault,
        f"leasectl reset {lease.lease_key} --to {str(lease.checkpoint)[-12:]}",
        lease=lease.lease_key,
        running=[attempt.label for attempt in run.live_main_line()],
    )
    run.resets.append((injection, process))
    if fault.variant == "retry_after_round":
        run.after_round.append(injection)
    return injection


def _reset_command(run: RoundRun, lease_key: str, target: str) -> list[str]:
    settings = run.stack.control_settings()
    return [
        str(LEASECTL),
        "--app",
        settings["application_name"],
        *set_arguments(settings),
        "reset",
        "--shard",
        lease_key,
        "--to",
        target,
        "--yes",
        "--json",
    ]


def judge_reset_during_round(run: RoundRun, injection: Injection, process: TrackedProcess) -> None:
    output, code = process.output(), process.returncode
    if code == 1 and run.owner in output:
        injection.outcome = "refused: holder named"
    elif code == 1 and "SHARD_END" in output:
        injection.outcome = "refused: lease at SHARD_END"
    elif code == 0 and not injection.evidence["running"]:
        injection.outcome = "applied: no try held the round's lock"
    else:
        injection.outcome = (
            f"VIOLATION: exit {code} while {', '.join(injection.evidence['running']) or 'the round'} held the lock"
        )
        run.campaign.violation(
            f"round {run.plan.number}: {injection.detail} exited {code} while the round held the "
            f"leader lock {run.owner}: {output.strip()[-400:]}"
        )


def reset_after_round(run: RoundRun, injection: Injection) -> None:
    """The operator, refused during the round, resets the same lease once the round released the lock.

    docs/operating.md on a discarded prepared batch: its file is never in the dataset (a batch file
    becomes visible only after its commit, which the reset fences); a slot may have left it staged
    under a `_staged-` name, to delete unless a lease names it in `committedBatchFile`. The campaign
    checks the first and does the second.
    """
    import subprocess

    store = run.stack.lease_store()
    lease = store.get_lease(injection.evidence["lease"], consistent=True)
    if lease is None or lease.is_at_shard_end:
        injection.outcome += ", after the round the lease had finished"
        return
    command = _reset_command(run, lease.lease_key, str(lease.checkpoint))
    completed = subprocess.run(
        command, env=run.stack.process_env(), capture_output=True, text=True, timeout=120, check=False
    )
    if completed.returncode != 0:
        injection.outcome += ", VIOLATION: refused after the round"
        run.campaign.violation(
            f"round {run.plan.number}: leasectl reset {lease.lease_key} after the round (lock "
            f"released) exited {completed.returncode}: {completed.stderr.strip()[-400:]}"
        )
        return
    discarded = json.loads(completed.stdout).get("discarded_batch")
    path = discarded.get("path") if discarded else None
    injection.evidence["discarded"] = discarded
    if path is not None and not Path(run.stack.output_uri).is_absolute():
        # A table sink: the discarded batch was staged but never committed, so no lease record names it
        # and no round publishes it; the final check of every record (and leasectl verify) says so.
        injection.outcome += ", reset after the round (discarded a prepared batch, never published)"
        return
    if path is None:
        injection.outcome += ", reset after the round" + (
            " (discarded a prepared batch without a file)" if discarded else ""
        )
        return
    visible = Path(run.stack.output_uri) / path
    if visible.exists():
        injection.outcome += ", VIOLATION: the discarded batch's file is visible"
        run.campaign.violation(
            f"round {run.plan.number}: leasectl reset {lease.lease_key} discarded the prepared "
            f"batch {path}, and that uncommitted batch's file is visible in the dataset"
        )
    committed = {other.committed_batch for other in store.list_leases() if other.committed_batch}
    root = Path(run.stack.output_uri)
    staged = [
        copy
        for copy in visible.parent.glob(f"{STAGED_PREFIX}*.{visible.name}")
        if str(copy.relative_to(root)) not in committed
    ]
    for copy in staged:
        _delete(copy)
    injection.detail += f"; reset after the round, discarded batch {path}, {len(staged)} staged copy(ies) deleted"
    injection.outcome += ", reset after the round (discarded a prepared batch)"


def _delete(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


# --- the table's commit (a Delta table) -----------------------------------------------------------


@dataclass
class Stall:
    """A driver frozen before its table commit (`commit_faults.STALLED`), until `resume_stalled`."""

    attempt: Attempt
    note: CommitNote
    log: frozenset[str]  # the table's log entries when it froze
    since: float  # on the round's timeline
    injection: Injection


def table_commit(run: RoundRun, fault: Fault) -> Injection | None:
    """What the round's first try met at its first table commit (`commit_faults`), once it has met it;
    None while it has not, and for a second such fault of the round (one deferred from the round
    before): the try meets one, the other waits for the next round. A frozen driver gets a retry of the
    round beside it at once (Airflow, having lost sight of it, retries the task); a driver whose
    commit's answer was lost gets one once it has exited, as Airflow retries a failed task."""
    from bench.chaos.rounds import RETRY

    note, hooked = CommitNote.read(run.commit_note), run.hooked
    if note is None or hooked is None or fault is not run.commit_fault:
        return None
    if note.variant != STALLED and hooked.process.running:
        return None  # dying, or still writing the report of its failed publication
    retry = run.start_attempt(RETRY) if note.variant in (ANSWER_LOST, STALLED) else None
    what = {
        KILLED_BEFORE: f"SIGKILL once its position map of transaction version {note.version} was written, "
        "before its commit",
        KILLED_AFTER: f"SIGKILL once its commit (transaction version {note.version}) was in the log, before its report",
        ANSWER_LOST: f"its commit (transaction version {note.version}) made, the answer lost as a dropped "
        f"connection, the try exited {hooked.process.returncode}",
        ANSWER_AS_CONFLICT: f"its commit (transaction version {note.version}) made, answered as a lost race "
        "(CommitFailedError)",
        STALLED: f"frozen (SIGSTOP) before its commit of transaction version {note.version}",
    }[note.variant]
    injection = new_injection(
        run,
        fault,
        f"{hooked.label}, Python driver {note.pid}: {what}" + (f"; {retry.label} started" if retry else ""),
        note=note,
        hooked=hooked.number,
        retry=None if retry is None else retry.number,
    )
    injection.at = round(run.now() - (time.time() - note.at), 1)
    if note.variant == STALLED:
        run.stalled = Stall(hooked, note, _log_entries(run), run.now(), injection)
    return injection


def resume_stalled(run: RoundRun, at_teardown: bool = False) -> None:
    """SIGCONT the frozen driver once another commit is in the table's log (its own plan is then stale),
    once every other try has ended without one, after `MAX_STALL_SECONDS`, or at the round's teardown."""
    stall = run.stalled
    assert stall is not None
    newer = sorted(_log_entries(run) - stall.log)
    others_ended = not any(a.process.running for a in run.attempts if a is not stall.attempt)
    waited = run.now() - stall.since
    if not (newer or others_ended or at_teardown or waited > MAX_STALL_SECONDS):
        return
    with contextlib.suppress(ProcessLookupError):  # killed meanwhile
        os.kill(stall.note.pid, signal.SIGCONT)
    reason = (
        f"once table version {int(newer[-1].removesuffix('.json'))} was in the log"
        if newer
        else "the other tries had ended without a commit"
        if others_ended
        else "at the teardown"
        if at_teardown
        else "after the longest stall"
    )
    stall.injection.detail += f"; resumed {waited:.1f} s later, {reason}"
    stall.injection.evidence["resumed_on_newer_head"] = bool(newer)
    run.stalled = None


def _log_entries(run: RoundRun) -> frozenset[str]:
    log = Path(_delta_sink(run).location) / "_delta_log"
    try:
        return frozenset(name for name in os.listdir(log) if LOG_ENTRY.match(name))
    except FileNotFoundError:
        return frozenset()


def _delta_sink(run: RoundRun) -> DeltaSink:
    return DeltaSink(run.stack.output_uri, run.stack.application)


def _judge_table_commit(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    """Whether the commit landed, and that no other commit of the application holds its batches too."""
    note: CommitNote = injection.evidence["note"]
    sink = _delta_sink(run)
    table = sink.table()
    history = [] if table is None else table.history()
    landed_at = next((int(e["version"]) for e in history if e.get(SUMMARY_COMMIT_ID) == note.commit_id), None)
    twice = [] if landed_at is None else _held_twice(sink.landed_batches(), landed_at)
    if twice:
        injection.outcome = "VIOLATION: another commit holds its batches too"
        run.campaign.violation(
            f"round {run.plan.number}: {injection.detail}; the commit at table version {landed_at} and "
            f"another hold the same records: {'; '.join(twice[:5])}"
        )
        return
    where = "not in the table" if landed_at is None else f"at table version {landed_at}"
    hooked = _attempt(run, injection.evidence["hooked"])
    report = hooked.report()
    publication = None if report is None else report.publication
    if note.variant == KILLED_BEFORE:
        injection.outcome = f"killed between its position map and its commit (commit {where}), {_round_word(succeeded)}"
    elif note.variant == KILLED_AFTER:
        injection.outcome = f"killed once its commit was in the table, before its report, {_round_word(succeeded)}"
    elif note.variant == ANSWER_LOST:
        retry = _attempt(run, injection.evidence["retry"])
        injection.outcome = "commit landed, answer lost; " + (
            "the retry added none of its batches again, round ok"
            if retry.process.returncode == 0
            else f"retry failed (exit {retry.process.returncode})"
        )
    elif note.variant == ANSWER_AS_CONFLICT:
        landed = "commit landed" if landed_at is not None else "commit not in the table"
        injection.outcome = f"{landed}, answered as a lost race: {_told(publication)}, {_round_word(succeeded)}"
    else:
        newer = injection.evidence.get("resumed_on_newer_head", False)
        refused = landed_at is None and publication is not None and publication.commits == 0
        injection.outcome = (
            "frozen before its commit, resumed after the retry's commit: "
            + ("its commit refused, it added nothing" if refused else f"its commit {where}")
            if newer
            else f"frozen before its commit, resumed with no newer commit: its commit {where}"
        ) + f", {_round_word(succeeded)}"
    if publication is not None and publication.error is not None and note.variant != ANSWER_LOST:
        injection.outcome += f" (its publication failed: {publication.error[:120]})"


def _told(publication: Publication | None) -> str:
    """What the driver made of a commit answered as a lost race (its own commit, or a reason to plan again)."""
    if publication is None or publication.error is not None:
        return "its publication failed"
    if publication.commits:
        return "the driver found its commit and reported it as the round's"
    if publication.batches_already_visible:
        return "planned again, found its batches held"
    return "the driver reported nothing published"


def _held_twice(landed: list[LandedBatch], version: int) -> list[str]:
    """The batches of the commit at table `version` whose records another commit adds too."""
    mine = [batch for batch in landed if batch.commit == version]
    return [
        f"{batch.lease_key} {batch.start}..{batch.end} (version {version}) and {other.start}..{other.end} "
        f"(version {other.commit})"
        for batch in mine
        for other in landed
        if other.commit != version
        and other.lease_key == batch.lease_key
        and batch.start < other.end
        and other.start < batch.end
    ]


# --- outcomes judged when the round is over ----------------------------------------------------


def judge(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    if injection.kind in FAN_OUT_ONLY:
        subscription_faults.judge(run, injection, succeeded)
        return
    judges = {
        WORKER_SIGKILL: _judge_worker_sigkill,
        DRIVER_KILL: _judge_driver_kill,
        TWIN_ATTEMPT: _judge_twin,
        AIRFLOW_RETRY: _judge_retry,
        PROXY_FAULTS: _judge_by_round,
        TABLE_COMMIT: _judge_table_commit,
    }
    judging = judges.get(injection.kind)
    if judging is not None:
        judging(run, injection, succeeded)


def _attempt(run: RoundRun, number: int) -> Attempt:
    return run.attempts[number - 1]


def _round_word(succeeded: bool) -> str:
    return "round ok" if succeeded else "round failed"


def _leadership_lost(attempt: Attempt) -> bool:
    report = attempt.report()
    return report is not None and report.leadership_lost


def _judge_worker_sigkill(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    attempt = _attempt(run, injection.evidence["attempt"])
    report, slot = attempt.report(), injection.evidence["slot"]
    where = "mid-batch" if injection.evidence["in_batch"] else "between batches"
    if report is None:
        later = attempt.killed[attempt.killed.index("worker") + 1 :]
        injection.outcome = (
            f"killed {where}, the try was killed later too"
            if later
            else f"killed {where}, the try ended without a report (exit {attempt.process.returncode})"
        )
        return
    slot_report = next((s for s in report.slots if s.worker_id.endswith(f"-worker-{slot}")), None)
    if slot_report is None and report.leadership_lost:
        injection.outcome = f"killed {where}, the try had lost its lock and stopped its slots"
        return
    if slot_report is None or slot_report.attempt <= injection.evidence["task_attempt"]:
        injection.outcome = (
            f"killed {where}, slot not retried (try exit {attempt.process.returncode}), {_round_word(succeeded)}"
        )
        return
    redid = any(lease.replayed_batches for lease in slot_report.leases)
    injection.outcome = (
        f"killed {where}, Spark retried the slot"
        + (", which redid the prepared batch" if redid else "")
        + f", {_round_word(succeeded)}"
    )


def _judge_driver_kill(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    injection.outcome = "try died, " + ("a later try finished the round" if succeeded else "round failed")


def _judge_retry(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    retry = _attempt(run, injection.evidence["retry"])
    injection.outcome = (
        "retry resumed the lock and finished the round"
        if retry.process.returncode == 0
        else f"retry failed (exit {retry.process.returncode})"
    )


def _judge_by_round(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    injection.outcome = _round_word(succeeded)


def _judge_twin(run: RoundRun, injection: Injection, succeeded: bool) -> None:
    twin = _attempt(run, injection.evidence["twin"])
    code, output = twin.process.returncode, twin.process.output()
    if not twin.main_line:
        if code == 1 and run.owner in output:
            injection.outcome = "refused: holder named"
            return
        overlapping = [
            a
            for a in run.attempts
            if a.main_line and a.process.returncode == 0 and _overlap(a, twin) and not _leadership_lost(a)
        ]
        if code == 0 and overlapping:
            injection.outcome = "VIOLATION: ran beside the round"
            run.campaign.violation(
                f"round {run.plan.number}: {twin.label} ran to the end beside "
                f"{', '.join(a.label for a in overlapping)}, which held the round's lock"
            )
        elif code == 0:
            injection.outcome = "ran: the round's lock had expired (no try heartbeating it)"
        else:
            injection.outcome = f"exit {code} without naming the round's lock holder"
            run.campaign.violation(
                f"round {run.plan.number}: {twin.label} exited {code} without naming the holder "
                f"{run.owner}: {output.strip()[-300:]}"
            )
        return
    others = [a for a in run.attempts if a.main_line and a is not twin and _overlap(a, twin)]
    if not others:
        injection.outcome = "ran after the other tries had ended: " + ("finished" if code == 0 else f"exit {code}")
        return
    first_ok = any(a.process.returncode == 0 for a in others)
    lost = [a for a in [*others, twin] if _leadership_lost(a)]
    if code == 0 and first_ok:
        injection.outcome = "both tries finished, each holding the lock in turn"
    elif code == 0:
        injection.outcome = "twin finished, the try beside it stopped" + (" (lock lost)" if lost else "")
    elif first_ok:
        injection.outcome = "twin stopped, the try beside it finished" + (" (lock lost)" if lost else "")
    else:
        injection.outcome = "both stopped, " + _round_word(succeeded)


def _overlap(one: Attempt, other: Attempt) -> bool:
    one_end = one.ended_at if one.ended_at is not None else float("inf")
    other_end = other.ended_at if other.ended_at is not None else float("inf")
    return one.started_at < other_end and other.started_at < one_end
