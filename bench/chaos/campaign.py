"""The fault campaign: rounds of the real consume job under seeded faults, a drain, a verdict, a table.

    .venv/bin/python bench/chaos.py --seed N --minutes M [--faults K] [--sink parquet|iceberg|delta]
                                    [--retrieval polling|fan_out] [--shard-end alternate|...]

Method. The campaign starts moto and kinesis-mock on loopback, two fault proxies in front of them, a
stream of 4 shards and a producer thread writing records with unique payloads (40 records/s by
default) for the whole run. It then runs the rounds of a seeded schedule (`schedule`), each as a DAG
run does it (`rounds`): the leader takes the application's leader lock, syncs shards and assigns
leases to W slots under it, and hands it by owner name to the consume job, a real `spark-submit`
process on Spark local mode (`local[2,4]`: task retries on) whose Spark executors reach AWS only
through the proxies; the faults of the round fire at their moments (`injections`); the teardown
releases the lock. With a Delta table, a round may also start its first try with a driver that meets
a fault at its table commit (`commit_faults`: killed between its position map and its commit or just
after the commit, its commit's answer lost, or frozen before it while a retry commits), the faults
no process boundary can reach. Closed shards end both ways a Kinesis may end them: in odd rounds as
kinesis-mock ends them (the null iterator with the last records), in even rounds one call after the
last records, as the GetRecords documentation describes real Kinesis (the Kinesis proxy rewrites the
answers: `FaultProxy.end_shards_after_last_records`), or one way in every round (`--shard-end`).
With `--retrieval fan_out` the slots read by enhanced fan-out: the Kinesis proxy serves SubscribeToShard
from kinesis-mock's GetRecords (devtools/subscription_bridge.py), the round's leader registers the
application's consumer if it is gone (as the DAG's table step does), and the faults of subscriptions
join the others (`subscription_faults`). Once the time budget (minus a reserve for the
drain) or the schedule is used up, the faults stop, the producer stops, and clean rounds run until
every lease is caught up or finished (at most `MAX_DRAIN_ROUNDS`). Then the sink (`--sink`: a
Parquet dataset, an Iceberg table, a Delta table) is read and compared with what was produced
(`verdict`); a table's record of what landed is checked against the checkpoints with `leasectl verify`.

It prints one line per round, then the table (fault kind, times injected, outcomes), the verdict,
and every violation. Exit status: 0 clean; 1 any violation (duplicated, lost, unreported retention
loss, stuck lease or lock, a fault whose outcome breaks a documented rule); 2 usage.
The working directory (rounds' logs and reports, the dataset) is removed unless `--keep` is given
or something failed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.chaos.injections import LEASECTL
from bench.chaos.processes import stop_leftovers
from bench.chaos.producer import ProducedRecord, Producer
from bench.chaos.rounds import RoundResult, RoundRun
from bench.chaos.schedule import (
    FAULT_KINDS,
    LEADER_DEATH,
    MERGE,
    RETENTION_TRIM,
    SINK_ONLY,
    SPLIT,
    Fault,
    RoundPlan,
    build_schedule,
    kinds_for,
)
from bench.chaos.stack import SINKS, Stack, set_arguments
from bench.chaos.verdict import Verdict, check_records, read_by_duckdb, read_landed, reported_losses, stuck_leases
from bench.harness import prepare_environment
from devtools.fault_proxy import LATE_SHARD_END_STAT
from devtools.kinesis_streams import shards_of

APPLICATION = "chaos-app"
STREAM = "chaos-stream"
# What a round costs on two busy cores: a spark-submit start (~10-15 s), the slots, the leader steps;
# more with twins and retries (measured: 34-36 s on average with other work on the machine). It sizes
# the schedule: faults per round = faults / expected rounds.
ROUND_SECONDS_ESTIMATE = 34.0
STARTUP_SECONDS = 10.0
MAX_DRAIN_ROUNDS = 12
DRAIN_WORKERS = 2
MAX_EXTRA_ROUNDS = 3
SHARD_ENDS = ("alternate", "with_last_records", "after_last_records")
SHARD_END_WORDS = {
    "alternate": "with their last records in odd rounds, one call after them in even rounds",
    "with_last_records": "with their last records in every round",
    "after_last_records": "one call after their last records in every round",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    parser.add_argument(
        "--minutes", type=float, default=20.0, help="wall-time budget of the whole run, drain included (default 20)"
    )
    parser.add_argument(
        "--faults",
        type=int,
        default=250,
        help="faults to schedule (default 250; a few find nothing to act on and are dropped)",
    )
    parser.add_argument(
        "--kinds",
        type=_kinds,
        metavar="KIND,KIND",
        help=f"inject only these kinds (to reproduce one); default every kind the sink meets: {','.join(FAULT_KINDS)} "
        + "".join(f" ({kind}: {' and '.join(sorted(sinks))} only)" for kind, sinks in SINK_ONLY.items()),
    )
    parser.add_argument("--rate", type=float, default=40.0, help="records per second the producer writes (default 40)")
    parser.add_argument(
        "--workdir", type=Path, help="where logs, reports and the dataset go (default: a temporary directory)"
    )
    parser.add_argument(
        "--sink",
        choices=SINKS,
        default="parquet",
        help="where the rounds land: a Parquet dataset, an Iceberg table in a SQLite SQL catalog, or a Delta "
        "table in a local folder (default parquet)",
    )
    parser.add_argument(
        "--retrieval",
        choices=("polling", "fan_out"),
        default="polling",
        help="how the slots read: GetRecords, or enhanced fan-out through the application's consumer, "
        "subscriptions served by the Kinesis proxy (devtools/subscription_bridge.py), with the fan-out faults "
        "(default polling)",
    )
    parser.add_argument(
        "--shard-end",
        choices=SHARD_ENDS,
        default="alternate",
        help="how closed shards end: with their last records (as kinesis-mock ends them), one call after them (as "
        "Kinesis documents it), or the one in odd rounds and the other in even rounds (default alternate)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--summary", type=Path, help="also write the result as JSON here")
    return parser


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kind(s) {unknown}; the kinds are {', '.join(FAULT_KINDS)}")
    return kinds


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    if arguments.minutes <= 0 or arguments.faults < 1 or arguments.rate <= 0:
        print("bench/chaos.py: --minutes and --rate must be positive, --faults at least 1", file=sys.stderr)
        return 2
    possible = kinds_for(arguments.sink, arguments.retrieval)
    kinds = arguments.kinds or possible
    foreign = [kind for kind in kinds if kind not in possible]
    if foreign:
        print(
            f"bench/chaos.py: a {arguments.sink} sink read by {arguments.retrieval} never meets {', '.join(foreign)}",
            file=sys.stderr,
        )
        return 2
    prepare_environment(clear_overrides=True)
    workdir = arguments.workdir or Path(tempfile.mkdtemp(prefix="kinesis-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    campaign = Campaign(
        arguments.seed,
        arguments.minutes * 60,
        arguments.faults,
        arguments.rate,
        workdir,
        kinds,
        arguments.sink,
        arguments.retrieval,
        arguments.shard_end,
    )
    try:
        result = campaign.run()
    except KeyboardInterrupt:
        print(
            f"bench/chaos.py: interrupted; every process it started is stopped; working directory: {workdir}",
            file=sys.stderr,
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        leftovers = stop_leftovers(campaign.run_id)
        if leftovers:
            print(f"stopped leftover processes {leftovers}", file=sys.stderr)
    print(result.render())
    if arguments.summary:
        arguments.summary.write_text(json.dumps(result.to_dict(), indent=2))
    if result.clean and not arguments.keep and arguments.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"working directory kept: {workdir}")
    return 0 if result.clean else 1


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Campaign:
    def __init__(
        self,
        seed: int,
        budget_seconds: float,
        faults: int,
        rate: float,
        workdir: Path,
        kinds: tuple[str, ...] | None = None,
        sink: str = "parquet",
        retrieval: str = "polling",
        shard_end: str = "alternate",
    ) -> None:
        self.shard_end = shard_end
        self.seed = seed
        self.sink = sink
        self.retrieval = retrieval
        self.kinds = kinds or kinds_for(sink, retrieval)
        self.budget_seconds = budget_seconds
        self.faults = faults
        self.rate = rate
        self.workdir = workdir
        self.run_id = uuid.uuid4().hex
        self.rng = random.Random(seed)
        self.drain_reserve_seconds = min(150.0, max(50.0, 0.125 * budget_seconds))
        self.started = time.monotonic()
        self.violations: list[str] = []
        self.trims: dict[str, str] = {}
        self.results: list[RoundResult] = []
        self.final_leases: dict[str, Any] = {}
        self.log = (workdir / "campaign.log").open("a")
        self.stack: Stack
        self.producer: Producer

    # --- what the rounds use -------------------------------------------------------------------

    @property
    def control_config(self) -> Any:
        return self.stack.control_config()

    @property
    def takeover_bound_seconds(self) -> float:
        """How long a round's leader may wait for a dead holder's lock before that is a violation."""
        return 3 * self.stack.control_config().leader_lease_duration_millis / 1000 + 10

    def violation(self, text: str) -> None:
        self.violations.append(text)
        self._say(f"VIOLATION: {text}")

    def note(self, text: str) -> None:
        """A line for campaign.log only."""
        self.log.write(f"  {text}\n")
        self.log.flush()

    def produced_by_shard(self) -> dict[str, list[ProducedRecord]]:
        shards: dict[str, list[ProducedRecord]] = defaultdict(list)
        for record in self.producer.records():
            shards[record.shard_id].append(record)
        return {shard: sorted(records, key=lambda r: int(r.sequence_number)) for shard, records in shards.items()}

    def ends_shards_after_last_records(self, round_number: int) -> bool:
        """Whether closed shards end one call after their last records in this round (`--shard-end`)."""
        if self.shard_end == "alternate":
            return round_number % 2 == 0
        return self.shard_end == "after_last_records"

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # --- the run ---------------------------------------------------------------------------------

    def run(self) -> CampaignResult:
        expected = max(
            1, int((self.budget_seconds - STARTUP_SECONDS - self.drain_reserve_seconds) / ROUND_SECONDS_ESTIMATE)
        )
        schedule = build_schedule(self.rng, self.faults, expected, self.kinds)
        self._say(
            f"chaos campaign: seed {self.seed}, {self.retrieval}, {self.faults} faults over "
            f"{len(schedule.rounds)} planned rounds, "
            f"budget {self.budget_seconds / 60:.1f} min, workdir {self.workdir}"
        )
        drained, verdict = 0, Verdict()
        with Stack(self.workdir, self.run_id, APPLICATION, STREAM, self.sink, self.retrieval) as stack:
            self.stack = stack
            self.producer = Producer(stack.kinesis(), STREAM, f"seed-{self.seed}", self.rate).start()
            try:
                deferred = self._fault_rounds(list(schedule.rounds))
                self.producer.stop()
                drained, settled = self._drain()
                verdict = self._verdict(settled)
                self._verify_sink_record()
            finally:
                self.producer.stop()
        self._judge_final_outcomes(verdict)
        self.log.write(
            "final outcomes:\n"
            + "".join(
                f"  round {i.round} {i.short()}: {i.detail} => {i.outcome}\n"
                for r in self.results
                for i in r.injections
            )
        )
        self.log.flush()
        return CampaignResult(self, verdict, drained, deferred)

    def _fault_rounds(self, plans: list[RoundPlan]) -> int:
        """Run the schedule while the budget lasts; the number of faults never injected."""
        deferred: list[Fault] = []
        dropped, extra = 0, 0
        while plans or (deferred and extra < MAX_EXTRA_ROUNDS):
            if plans and self.elapsed() + self._estimate(plans[0]) + self.drain_reserve_seconds > self.budget_seconds:
                break
            if not plans and self.elapsed() + ROUND_SECONDS_ESTIMATE + self.drain_reserve_seconds > self.budget_seconds:
                break
            if plans:
                plan = plans.pop(0)
            else:
                extra += 1
                plan = RoundPlan(len(self.results) + 1, 2, (), f"{self.rng.getrandbits(32):08x}")
            plan = RoundPlan(len(self.results) + 1, plan.workers, (*deferred, *plan.faults), plan.token)
            run = RoundRun(self, plan)
            self._round(run)
            deferred = [replace(fault, deferrals=fault.deferrals + 1) for fault in run.deferred if not fault.deferrals]
            for fault in run.deferred:
                if fault.deferrals:
                    dropped += 1
                    self.note(f"round {plan.number}: {fault.describe()} dropped (deferred twice)")
        return dropped + sum(len(plan.faults) for plan in plans) + len(deferred)

    def _estimate(self, plan: RoundPlan) -> float:
        """What a round will take: a dead leader's lock costs one lease duration more."""
        takeover = any(fault.kind == LEADER_DEATH for fault in plan.faults)
        return ROUND_SECONDS_ESTIMATE + (self.control_config.leader_lease_duration_millis / 1000 if takeover else 0)

    def _round(self, run: RoundRun) -> RoundResult:
        result = run.run()
        previous = self.results[-1] if self.results else None
        self.results.append(result)
        if previous is not None and not previous.succeeded:
            suffix = "next round ok" if result.succeeded else "next round failed too"
            for injection in previous.injections:
                if "round failed" in injection.outcome or "retry failed" in injection.outcome:
                    injection.outcome += f", {suffix}"
        self._say(result.line())
        for injection in result.injections:
            self.log.write(
                f"  round {injection.round} {injection.short()}: {injection.detail} => {injection.outcome}\n"
            )
        self.log.write(f"  leader: {result.leading}\n")
        self.log.flush()
        return result

    def _drain(self) -> tuple[int, list[str]]:
        """Clean rounds until every lease is caught up or finished; the rounds run and what is still stuck."""
        stuck: list[str] = ["not drained yet"]
        for drained in range(1, MAX_DRAIN_ROUNDS + 1):
            result = self._round(
                RoundRun(self, RoundPlan(len(self.results) + 1, DRAIN_WORKERS, (), f"{self.rng.getrandbits(32):08x}"))
            )
            stuck = self._stuck()
            if result.succeeded and not stuck:
                return drained, []
        return MAX_DRAIN_ROUNDS, stuck

    def _stuck(self) -> list[str]:
        from lease_core.leader.leader_lock import LEADER_KEY, LockHolder

        leader = self.stack.state_store().get(LEADER_KEY)
        holder = None if leader is None else LockHolder.from_item(leader, 0).owner_name
        slots = {f"{APPLICATION}-worker-{index}" for index in range(DRAIN_WORKERS)}
        return stuck_leases(
            self.stack.lease_store().list_leases(),
            shards_of(self.stack.kinesis(), STREAM),
            self.produced_by_shard(),
            slots,
            holder,
        )

    def _verdict(self, stuck: list[str]) -> Verdict:
        reports = [report for result in self.results for attempt in result.attempts if (report := attempt.report())]
        verdict = check_records(
            self.producer.records(),
            self.producer.uncertain,
            read_landed(self.stack.output_uri),
            self.trims,
            reported_losses(reports),
            read_by_duckdb(self.stack.output_uri),
        )
        verdict.stuck = stuck
        self.final_leases = {lease.lease_key: lease for lease in self.stack.lease_store().list_leases()}
        return verdict

    def _verify_sink_record(self) -> None:
        """A sink that records what landed (an Iceberg or a Delta table) must agree with the checkpoints at the end:
        `leasectl verify` finds no gap, overlap or checkpoint ahead of the table."""
        if self.sink == "parquet":
            return
        settings = self.stack.control_settings()
        command = [
            str(LEASECTL),
            "--app",
            settings["application_name"],
            *set_arguments(settings),
            "verify",
            "--output-uri",
            self.stack.output_uri,
        ]
        completed = subprocess.run(
            command, env=self.stack.process_env(), capture_output=True, text=True, timeout=300, check=False
        )
        self._say(f"leasectl verify of {self.stack.output_uri}: exit {completed.returncode}\n{completed.stdout}")
        if completed.returncode != 0:
            self.violation(
                f"leasectl verify of {self.stack.output_uri} exited {completed.returncode}: "
                f"{(completed.stdout + completed.stderr).strip()[-800:]}"
            )

    def _judge_final_outcomes(self, verdict: Verdict) -> None:
        """Reshards: the parents ended and the children were read. Trims: what aged out, and was it reported."""
        settled = not verdict.stuck
        aged = {(r.shard_id, r.sequence_number) for r in verdict.aged_out}
        silent = {(r.shard_id, r.sequence_number) for r in verdict.silently_aged_out}
        counted: set[tuple[str, str]] = set()
        for injection in (i for result in self.results for i in result.injections):
            if injection.kind in (SPLIT, MERGE):
                parents = [self.final_leases.get(parent) for parent in injection.evidence["parents"]]
                ended = all(lease is None or lease.is_at_shard_end for lease in parents)
                injection.outcome = (
                    "parent ended, children read" if ended and settled else "VIOLATION: parent or children not settled"
                )
            elif injection.kind == RETENTION_TRIM:
                shard, before = injection.evidence["shard"], int(injection.evidence["before"])
                mine = {key for key in aged | silent if key[0] == shard and int(key[1]) < before} - counted
                counted |= mine
                injection.count = len(mine)
                if mine & silent:
                    injection.outcome = "VIOLATION: aged out without a loss report"
                elif mine:
                    injection.outcome = "aged-out records reported as retention loss"
                else:
                    injection.outcome = "nothing aged out unread (read before the trim)"

    def _say(self, text: str) -> None:
        line = f"[{self.elapsed():7.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()


class CampaignResult:
    def __init__(self, campaign: Campaign, verdict: Verdict, drained: int, never_injected: int) -> None:
        self.campaign = campaign
        self.verdict = verdict
        self.drained = drained
        self.never_injected = never_injected
        self.seconds = campaign.elapsed()
        self.injections = [i for result in campaign.results for i in result.injections]
        proxy = campaign.stack.kinesis_proxy
        self.late_shard_ends = proxy.stats().get(LATE_SHARD_END_STAT, 0) if proxy is not None else 0

    @property
    def violations(self) -> list[str]:
        return [*self.campaign.violations, *self.verdict.violations()]

    @property
    def clean(self) -> bool:
        return not self.violations

    def injected(self) -> dict[str, int]:
        counts = Counter(injection.kind for injection in self.injections)
        return {kind: counts.get(kind, 0) for kind in self.campaign.kinds}

    def table(self) -> str:
        lines = ["| fault kind | injected | outcome |", "|---|---:|---|"]
        for kind, count in self.injected().items():
            mine = [injection for injection in self.injections if injection.kind == kind]
            outcomes = "; ".join(f"{n} {outcome}" for outcome, n in Counter(i.outcome for i in mine).most_common())
            figure = sum(injection.count for injection in mine)
            if kind == "proxy_faults" and mine:
                outcomes += f" ({figure} calls failed in all)"
            if kind == RETENTION_TRIM and mine:
                outcomes += f" ({figure} records aged out in all)"
            lines.append(f"| {kind} | {count} | {outcomes or '-'} |")
        lines.append(f"| **total** | **{len(self.injections)}** | |")
        return "\n".join(lines)

    def render(self) -> str:
        campaign = self.campaign
        fault_rounds = len(campaign.results) - self.drained
        ok = sum(result.succeeded for result in campaign.results)
        lines = [
            "",
            f"chaos campaign seed {campaign.seed} ({campaign.retrieval}, {campaign.sink}): "
            f"{len(self.injections)} faults injected in {fault_rounds} rounds, "
            f"then {self.drained} drain round(s); {ok}/{len(campaign.results)} rounds succeeded; "
            f"wall time {self.seconds / 60:.1f} min"
            + (
                f"; {self.never_injected} scheduled fault(s) not injected (budget or nothing to act on)"
                if self.never_injected
                else ""
            ),
            f"closed shards ended {SHARD_END_WORDS[campaign.shard_end]} ({self.late_shard_ends} late ends answered)",
            "",
            self.table(),
            "",
            f"verdict: {self.verdict.summary()}",
        ]
        if self.violations:
            lines.append(f"VIOLATIONS ({len(self.violations)}):")
            lines += [f"  - {violation}" for violation in self.violations]
        else:
            lines.append("clean: 0 duplicated, 0 lost (beyond injected and reported retention losses), no lease stuck")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.campaign.seed,
            "retrieval": self.campaign.retrieval,
            "sink": self.campaign.sink,
            "seconds": round(self.seconds, 1),
            "rounds": len(self.campaign.results),
            "drain_rounds": self.drained,
            "injected": self.injected(),
            "shard_end": self.campaign.shard_end,
            "late_shard_ends": self.late_shard_ends,
            "injections": [
                {
                    "round": i.round,
                    "kind": i.kind,
                    "variant": i.fault.variant,
                    "at": i.at,
                    "detail": i.detail,
                    "outcome": i.outcome,
                }
                for i in self.injections
            ],
            "verdict": self.verdict.summary(),
            "violations": self.violations,
            "clean": self.clean,
            "table": self.table(),
        }
