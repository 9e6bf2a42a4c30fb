"""Benchmark: how evenly each assignment strategy spreads the real work of a round over its slots.

Method. The run starts its own moto (DynamoDB) and kinesis-mock (Kinesis) on loopback. For each
case it creates one stream of 8 shards and, every round, puts the round's records with a fixed
share per shard (explicit hash keys): `hot-pair` is 30, 25, 10, 10, 8, 7, 5 and 5 % (two hot shards
that a count-based split may well put on one slot), `zipf` is 1/k. Each strategy has its own
application (own tables, own sink) on that stream, and every round each runs what a DAG run runs:
shard sync, an assignment round over W slots with its `lease_assignment_strategy` (every other
setting at its default), and the consume job's `run_round` on one shared SparkSession (local[W]).
So the loop under test is the product's: slots report what their leases cost (throughput, their
utilization), and the next round's leader assigns on those figures.

Per round and strategy it prints:
- busiest / LB: the bytes the busiest slot landed over the lower bound LB = max(total / W, the
  largest lease's bytes), which no assignment can beat. Round 1 assigns new leases with nothing
  measured yet; the goal for the default strategy is <= 1.10 from round 2 on.
- slowest / mean: the slowest slot's seconds over the mean of the W slots' seconds (the round's
  makespan against perfect balance; on 2 cores W=4 slots run in two waves, which it includes).
- moves: leases the assignment moved (churn once balanced is a cost, not a gain).
Every application must land exactly the records written; the run fails loudly otherwise.

Run: .venv/bin/python bench/balance_pipeline.py [--rounds R] [--records N] [--workers W]
(defaults 5 rounds, 4,000 records of 200 B per round, W=4: about 4 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import boto3  # noqa: E402

from bench.harness import (  # noqa: E402
    PAYLOAD_BYTES,
    REGION,
    Application,
    BenchmarkFailure,
    Position,
    machine_facts,
    positions,
    prepare_environment,
    start_spark,
)
from devtools.emulators import kinesis_mock, moto_server  # noqa: E402
from devtools.kinesis_streams import create_stream, put_entries  # noqa: E402
from lease_core.config.settings import LEASE_ASSIGNMENT_STRATEGIES  # noqa: E402
from spark_jobs.round_report import RoundReport, busiest_over_bound  # noqa: E402

SHARDS = 8
STRATEGIES = LEASE_ASSIGNMENT_STRATEGIES
HOT_PAIR = (30, 25, 10, 10, 8, 7, 5, 5)
GOAL = 1.10


def zipf_shares(count: int) -> tuple[float, ...]:
    weights = [1 / rank for rank in range(1, count + 1)]
    return tuple(100 * weight / sum(weights) for weight in weights)


CASES: dict[str, tuple[float, ...]] = {"hot-pair": HOT_PAIR, "zipf": zipf_shares(SHARDS)}


@dataclass(frozen=True)
class Balance:
    """How one round of one strategy spread its work."""

    case: str
    strategy: str
    round: int
    busiest_over_bound: float
    slowest_over_mean: float
    moves: int


def balance_of(case: str, strategy: str, round_: int, report: RoundReport, workers: int, moves: int) -> Balance:
    slot_bytes = [slot.bytes for slot in report.slots] + [0] * (workers - len(report.slots))
    lease_bytes = [lease.bytes for slot in report.slots for lease in slot.leases]
    seconds = [slot.seconds for slot in report.slots] + [0.0] * (workers - len(report.slots))
    mean = statistics.fmean(seconds)
    ratio = busiest_over_bound(slot_bytes, lease_bytes)
    return Balance(case, strategy, round_, 1.0 if ratio is None else ratio, max(seconds) / mean if mean else 1.0, moves)


# --- the stream ----------------------------------------------------------------------------------


def stream_of_shards(kinesis: Any, name: str) -> list[str]:
    """An ACTIVE stream of SHARDS shards; the starting hash key of each, in shard order."""
    create_stream(kinesis, name, SHARDS)
    shards = sorted(kinesis.list_shards(StreamName=name)["Shards"], key=lambda shard: shard["ShardId"])
    return [shard["HashKeyRange"]["StartingHashKey"] for shard in shards]


def put_round(
    kinesis: Any, stream: str, hash_keys: Sequence[str], shares: Sequence[float], records: int
) -> set[Position]:
    """The round's records, `shares` percent of them on each shard; what was written."""
    entries = [
        {
            "Data": f"{stream}-{time.time_ns()}-{shard}-{index}".encode().ljust(PAYLOAD_BYTES, b"."),
            "PartitionKey": "p",
            "ExplicitHashKey": hash_key,
        }
        for shard, (hash_key, share) in enumerate(zip(hash_keys, shares))
        for index in range(round(records * share / 100))
    ]
    return positions(put_entries(kinesis, stream, entries))


# --- reporting ------------------------------------------------------------------------------------


def print_rounds(rows: list[Balance]) -> None:
    print("| case | round | strategy | busiest / LB | slowest / mean | moves |")
    print("|---|---:|---|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row.case} | {row.round} | {row.strategy} | {row.busiest_over_bound:.2f} | "
            f"{row.slowest_over_mean:.2f} | {row.moves} |"
        )


def print_summary(rows: list[Balance]) -> None:
    print(
        f"| case | strategy | worst busiest / LB from round 2 | mean from round 2 | rounds <= {GOAL:.2f} | "
        "moves from round 3 |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for case in CASES:
        for strategy in STRATEGIES:
            later = [row for row in rows if (row.case, row.strategy) == (case, strategy) and row.round >= 2]
            if not later:
                continue
            ratios = [row.busiest_over_bound for row in later]
            churn = sum(row.moves for row in later if row.round >= 3)
            print(
                f"| {case} | {strategy} | {max(ratios):.2f} | {statistics.fmean(ratios):.2f} | "
                f"{sum(ratio <= GOAL for ratio in ratios)}/{len(ratios)} | {churn} |"
            )


# --- the run --------------------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per strategy and case (default 5)")
    parser.add_argument("--records", type=int, default=4_000, help="records put per round (default 4,000)")
    parser.add_argument("--workers", type=int, default=4, help="slots W (default 4)")
    arguments = parser.parse_args(argv)
    if min(arguments.rounds, arguments.records, arguments.workers) < 1:
        parser.error("--rounds, --records and --workers must be at least 1")
    return arguments


def run(arguments: argparse.Namespace, stack: ExitStack) -> None:
    started = time.perf_counter()
    moto = stack.enter_context(moto_server())
    mock = stack.enter_context(kinesis_mock())
    scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-balance-")))
    kinesis = boto3.client("kinesis", endpoint_url=mock.endpoint, region_name=REGION)
    spark = start_spark()
    stack.callback(spark.stop)
    rows: list[Balance] = []
    for case, shares in CASES.items():
        stream = f"balance-{case}"
        hash_keys = stream_of_shards(kinesis, stream)
        applications = {
            strategy: Application(
                f"{case}-{strategy}",
                moto.endpoint,
                mock.endpoint,
                str(scratch / case / strategy),
                stream=stream,
                lease_assignment_strategy=strategy,
            )
            for strategy in STRATEGIES
        }
        written: set[Position] = set()
        for round_ in range(1, arguments.rounds + 1):
            written |= put_round(kinesis, stream, hash_keys, shares, arguments.records)
            for strategy, application in applications.items():
                times = application.round(spark, arguments.workers)
                rows.append(
                    balance_of(case, strategy, round_, times.report, arguments.workers, len(times.assignment.moves))
                )
        for application in applications.values():
            application.check_landed(written)
    print(
        f"\n{arguments.rounds} rounds of {arguments.records:,} records of {PAYLOAD_BYTES} B per case, "
        f"W={arguments.workers}; "
        "every application landed exactly the records written\n"
    )
    print_rounds(rows)
    print()
    print_summary(rows)
    print()
    print(machine_facts())
    print(f"whole run: {time.perf_counter() - started:.0f} s")


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    prepare_environment()
    with ExitStack() as stack:  # unwinds Spark, the scratch directory, then the emulators (by PID)
        run(arguments, stack)


if __name__ == "__main__":
    try:
        main()
    except BenchmarkFailure as failure:
        sys.exit(f"bench/balance_pipeline.py: {failure}")
