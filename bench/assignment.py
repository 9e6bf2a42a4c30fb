"""Benchmark: lease assignment strategies on Zipf-skewed throughput (docs/architecture.md, "Assignment strategies").

Each lease's throughput is 1024 KB/s (a shard's write limit) divided by a rank drawn from a Zipf
distribution (s = 1.2, ranks 1..1000, seeded), so about a fifth of the leases run at the shard limit
and most are small. Leases start spread round-robin over the workers (the sticky previous
assignment); workers are default-metric, so throughput is the load. Every round balances and its
plan lands before the next round. "makespan@var" gets, each round, a move budget equal to what
variance moved in that round: the fair comparison of imbalance at no more moves.

Columns: max/mean and max/LB of the projected slot loads (LB = max(total/W, largest lease), the
best any assignment can do), leases moved so far, mean time per round. A case whose round takes
more than 60 s is reported as such and stopped.

Run: .venv/bin/python bench/assignment.py
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.assignment_snapshots import apply_plan, default_worker, lease, loads_after, snapshot
from lease_core.assignment.decision import AssignmentInput, AssignmentPlan
from lease_core.assignment.makespan import lower_bound
from lease_core.assignment.strategies import decider_for
from lease_core.model.lease import Lease

SIZES = [(1_000, 32), (100_000, 1_000)]
ROUNDS = 3
REPORTED_ROUNDS = (1, 3)
ROUND_TIMEOUT_SECONDS = 60.0
SEED = 42


def zipf_leases(count: int, workers: int) -> tuple[Lease, ...]:
    rng = random.Random(SEED)
    ranks = range(1, 1001)
    drawn = rng.choices(ranks, weights=[rank**-1.2 for rank in ranks], k=count)
    return tuple(lease(f"shard-{i:06d}", f"app-worker-{i % workers}", 1024.0 / rank) for i, rank in enumerate(drawn))


def round_snapshot(leases: tuple[Lease, ...], workers: int, seed: int, budget: int | None) -> AssignmentInput:
    slots = [default_worker(f"app-worker-{i}") for i in range(workers)]
    return snapshot(list(leases), slots, balance=True, seed=seed, max_moves_per_round=budget)


def run_case(
    count: int, workers: int, strategy: str, budgets: list[int | None], results: multiprocessing.Queue
) -> None:
    """Child process: play the rounds, reporting (round, max/mean, max/LB, moved, seconds) after each."""
    leases, moved = zipf_leases(count, workers), 0
    for number, budget in enumerate(budgets, start=1):
        snap = round_snapshot(leases, workers, number, budget)
        started = time.perf_counter()
        plan = decider_for(strategy).decide(snap)
        seconds = time.perf_counter() - started
        loads = list(loads_after(snap, plan).values())
        moved += len(plan.moves)
        imbalance, ratio = max(loads) / (sum(loads) / len(loads)), max(loads) / lower_bound(snap)
        results.put((number, imbalance, ratio, moved, seconds, len(plan.moves)))
        leases = apply_plan(leases, plan)


def play(count: int, workers: int, strategy: str, budgets: list[int | None]) -> list[tuple] | str:
    results: multiprocessing.Queue = multiprocessing.Queue()
    child = multiprocessing.Process(target=run_case, args=(count, workers, strategy, budgets, results))
    child.start()
    rows = []
    try:
        for _ in budgets:
            rows.append(results.get(timeout=ROUND_TIMEOUT_SECONDS))
    except queue.Empty:
        child.terminate()
        return f"round {len(rows) + 1} took more than {ROUND_TIMEOUT_SECONDS:.0f} s; stopped"
    finally:
        child.join()
    return rows


def print_case(name: str, rows: list[tuple] | str) -> None:
    if isinstance(rows, str):
        print(f"{name:<14}{rows}")
        return
    cells = []
    for number in REPORTED_ROUNDS:
        _, imbalance, ratio, moved, _, _ = rows[number - 1]
        cells.append(f"{imbalance:>13.3f}{ratio:>9.3f}{moved:>9}")
    mean_seconds = sum(row[4] for row in rows) / len(rows)
    print(f"{name:<14}{''.join(cells)}{mean_seconds * 1000:>12.1f}")


def main() -> None:
    header = (
        f"{'strategy':<14}"
        + "".join(f"{'r' + str(n) + ' max/mean':>13}{'max/LB':>9}{'moved':>9}" for n in REPORTED_ROUNDS)
        + f"{'ms/round':>12}"
    )
    for count, workers in SIZES:
        leases = zipf_leases(count, workers)
        start = round_snapshot(leases, workers, 0, None)
        loads = list(loads_after(start, AssignmentPlan(moves=())).values())
        print(
            f"\n{count:,} leases x {workers:,} workers; LB = {lower_bound(start):.1f} KB/s; "
            f"round-robin start: max/mean {max(loads) / (sum(loads) / len(loads)):.3f}, "
            f"max/LB {max(loads) / lower_bound(start):.3f}"
        )
        print(header)
        print("-" * len(header))
        variance = play(count, workers, "variance", [None] * ROUNDS)
        print_case("variance", variance)
        print_case("count", play(count, workers, "count", [None] * ROUNDS))
        print_case("makespan", play(count, workers, "makespan", [None] * ROUNDS))
        if not isinstance(variance, str):
            print_case("makespan@var", play(count, workers, "makespan", [row[5] for row in variance]))


if __name__ == "__main__":
    main()
