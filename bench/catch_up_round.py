"""Benchmark: a catch-up round over many more shards than a slot reads at once, against Kinesis' cap.

Method. The Kinesis stand-in (devtools/kinesis_standin.py, its own process) serves S shards, each
holding a backlog of --seconds of data at the per-shard cap (--cap-mb MiB/s; 0.25 by default, so
that on this 2-core machine the cap, not the CPU, is what bounds a round), as --record-bytes records.
moto serves DynamoDB. Each case is one full round on a fresh application (own tables, own output):
shard sync at TRIM_HORIZON, an assignment over W slots, and the consume job's `run_round` on one
shared SparkSession (warmed up first), timed on `run_round`; every case must land every record once.
1. "pipeline": the stand-in's limits off, twice (the first run also warms up the JVM and the Python
   workers; the faster counts). The round is bound by the machine: total bytes / its time is the
   pipeline rate of this machine (reading, parsing, Arrow, Parquet, publishing, checkpoints).
2. The limits on, with the slots reading 8 leases at a time (the job's default until 2026-11), then
   with the job's default: every lease of the slot at once, batches sharing the slot's buffer. The
   limits are Kinesis' scaled to the cap: 5 GetRecords/s, and per call at most 5 s of the cap in
   bytes and the same share of 10,000 records (Kinesis: 10 MB and 10,000 records a call at 2 MB/s),
   with Kinesis' accounting (a large read leaves the shard in debt).
The bound of a capped round is max((backlog per shard - the 1 s burst) / cap, total bytes / pipeline
rate): no reader can beat the cap on its shard, and no machine its own rate. The ratio round time /
bound is the figure (goal <= 1.10). The stand-in's refusals are counted: a reader that keeps to the
limits gets none.

Run: .venv/bin/python bench/catch_up_round.py [--shards 64] [--workers 2] [--cap-mb 0.25] [--seconds 20]
(about 4 minutes on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from bench.harness import Application, BenchmarkFailure, prepare_environment, start_spark  # noqa: E402
from devtools.emulators import moto_server  # noqa: E402
from devtools.kinesis_standin import MIB, KinesisStandIn, Limits, StreamSpec  # noqa: E402
from devtools.stream_records import landed_records  # noqa: E402
from lease_core.leader.assignment_round import AssignmentCoordinator, slot_ids  # noqa: E402
from lease_core.sync.step import sync_streams  # noqa: E402
from spark_jobs.consume_job import run_round  # noqa: E402
from spark_jobs.consume_spec import ConsumeSpec  # noqa: E402
from spark_jobs.round_report import Outcome as LeaseOutcome  # noqa: E402
from spark_jobs.round_report import RoundReport  # noqa: E402

STREAM = "bench-catch-up"
KINESIS_CAP = 2 * MIB
KINESIS_MAX_CALL_BYTES = 10 * MIB
KINESIS_MAX_CALL_RECORDS = 10_000
# The default before slots read every lease they hold at once.
FORMER_LEASE_THREADS = 8


@dataclass(frozen=True)
class Case:
    name: str
    limits: Limits
    lease_threads: int | None  # None: the job's default, every lease of the slot at once

    @property
    def label(self) -> str:
        """A name for the case's tables and output."""
        return "".join(character if character.isalnum() else "-" for character in self.name)


@dataclass(frozen=True)
class Outcome:
    case: Case
    seconds: float
    landed_bytes: int
    refusals: dict[str, int]
    slowest_slot_seconds: float  # the slot task itself, as it timed its own work
    slowest_lease_seconds: float  # one lease's work in it, from its claim to its last write


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cap-mb", type=float, default=0.25, help="per-shard read cap, MiB/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="backlog per shard, in seconds at the cap")
    parser.add_argument("--record-bytes", type=int, default=1000)
    return parser.parse_args(argv)


def run_case(spark: Any, standin: KinesisStandIn, moto: str, case: Case, arguments: argparse.Namespace) -> Outcome:
    standin.set_limits(case.limits)
    standin.reset()
    output = tempfile.mkdtemp(prefix=f"bench-catch-up-{case.label}-")
    application = Application(
        case.label,
        moto,
        standin.endpoint,
        output,
        stream=STREAM,
        shard_read_limit_kbps=arguments.cap_mb * 1024 if case.limits.read_bytes_per_second else 2048.0,
    )
    sync_streams((STREAM,), application.config, application.store, application.source, application.state)
    assignment = AssignmentCoordinator(application.store, application.metrics, application.state, application.config)
    round_number = assignment.run(slot_ids(application.name, arguments.workers)).round_number
    spec = ConsumeSpec(
        streams=(STREAM,),
        num_workers=arguments.workers,
        output_uri=output,
        round_number=round_number,
        lease_threads=case.lease_threads,
        settings=application.config.to_dict(),
    )
    started = time.monotonic()
    report = run_round(spark, spec)
    seconds = time.monotonic() - started
    if not report.succeeded:
        raise BenchmarkFailure(f"case {case.name}: the round failed:\n{report.summary()}")
    check_landed(output, arguments, report)
    refusals = standin.stats()["violations"]
    slowest_slot = max(slot.seconds for slot in report.slots)
    slowest_lease = max(lease.seconds for slot in report.slots for lease in slot.leases)
    return Outcome(case, seconds, report.totals.bytes, refusals, slowest_slot, slowest_lease)


def check_landed(output: str, arguments: argparse.Namespace, report: RoundReport) -> None:
    """Every record served landed once; otherwise the failure names the leases that did not catch up."""
    landed = [(record.shard_id, record.sequence_number) for record in landed_records(output)]
    expected = arguments.shards * records_per_shard(arguments)
    if len(landed) != expected or len(set(landed)) != expected:
        behind = [
            f"{lease.lease_key}: {lease.outcome}, {lease.records} records ({lease.detail or 'no detail'})"
            for slot in report.slots
            for lease in slot.leases
            if lease.outcome != LeaseOutcome.CAUGHT_UP
        ]
        raise BenchmarkFailure(
            f"{len(landed)} rows ({len(set(landed))} distinct) landed for {expected} served; "
            f"outcomes {report.totals.outcomes}:\n" + "\n".join(behind)
        )


def records_per_shard(arguments: argparse.Namespace) -> int:
    return math.ceil(arguments.cap_mb * MIB * arguments.seconds / arguments.record_bytes)


def print_table(outcomes: list[Outcome], arguments: argparse.Namespace) -> None:
    pipeline = outcomes[0]
    rate = pipeline.landed_bytes / pipeline.seconds
    # The bucket starts with 1 s of the cap in it (Kinesis' burst): that much needs no waiting.
    per_shard_seconds = records_per_shard(arguments) * arguments.record_bytes / (arguments.cap_mb * MIB) - 1.0
    bound = max(per_shard_seconds, pipeline.landed_bytes / rate)
    every_lease = math.ceil(arguments.shards / arguments.workers)
    print(
        f"\n{arguments.shards} shards x {records_per_shard(arguments):,} records of {arguments.record_bytes} B "
        f"({pipeline.landed_bytes / MIB:.0f} MiB), {arguments.workers} slots, cap {arguments.cap_mb} MiB/s per shard"
    )
    print(f"pipeline rate of this machine (limits off): {rate / MIB:.1f} MiB/s in {pipeline.seconds:.1f} s")
    print(f"bound of a capped round: max({per_shard_seconds:.1f} s at the cap, {pipeline.landed_bytes / rate:.1f} s)")
    print(
        f"\n{'case':<34}{'lease threads':>14}{'round s':>9}{'/ bound':>9}{'slowest slot s':>16}"
        f"{'slowest lease s':>17}{'refused calls':>15}"
    )
    for outcome in outcomes[1:]:
        refused = sum(outcome.refusals.values())
        print(
            f"{outcome.case.name:<34}{outcome.case.lease_threads or every_lease:>14}{outcome.seconds:>9.1f}"
            f"{outcome.seconds / bound:>9.2f}{outcome.slowest_slot_seconds:>16.1f}"
            f"{outcome.slowest_lease_seconds:>17.1f}{refused:>15}"
        )
    print(
        "(round s: the consume job's run_round; the slot and lease columns are what the slowest ones timed themselves)"
    )


def run(arguments: argparse.Namespace, stack: ExitStack) -> None:
    prepare_environment()
    moto = stack.enter_context(moto_server()).endpoint
    spec = StreamSpec(
        STREAM,
        shards=arguments.shards,
        records_per_shard=records_per_shard(arguments),
        record_bytes=arguments.record_bytes,
        backlog_seconds=arguments.seconds,
    )
    standin = stack.enter_context(KinesisStandIn([spec], Limits.off()))
    spark = start_spark()
    stack.callback(spark.stop)
    every_lease = math.ceil(arguments.shards / arguments.workers)
    capped = capped_limits(arguments.cap_mb * MIB)
    cases = [
        Case("pipeline", Limits.off(), every_lease),
        Case("pipeline", Limits.off(), every_lease),
        Case(f"capped, {FORMER_LEASE_THREADS} leases at a time", capped, FORMER_LEASE_THREADS),
        Case("capped, the default (every lease)", capped, None),
    ]
    outcomes = [run_case(spark, standin, moto, case, arguments) for case in cases]
    print_table([min(outcomes[:2], key=lambda outcome: outcome.seconds), *outcomes[2:]], arguments)


def capped_limits(cap: float) -> Limits:
    """Kinesis' per-shard limits with the byte cap scaled: a call returns at most 5 s of the cap."""
    share = cap / KINESIS_CAP
    return Limits(
        read_bytes_per_second=cap,
        max_bytes_per_call=int(KINESIS_MAX_CALL_BYTES * share),
        max_records_per_call=max(1, int(KINESIS_MAX_CALL_RECORDS * share)),
    )


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    with ExitStack() as stack:
        run(arguments, stack)


if __name__ == "__main__":
    main()
