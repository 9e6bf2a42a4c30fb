"""Benchmark: do converged leases stay put under measurement noise, and does a real change still move them?

Method (pure deciders, no I/O; seeded). 64 leases with Zipf-skewed throughput (bench/assignment.py's
draw) start round-robin over 8 slots. Every round, each lease's measured throughput is its true rate
times a uniform factor in [1 - noise, 1 + noise], and each slot's CPU is its true load (scaled so that
the mean slot sits at 50 %) times its own such factor, appended to the slot's stored CPU values as a
slot does at the end of its task. The leader then decides with the strategy and with the product's
cadence (`balances_in_round`: makespan every round, variance and count every third round), and the
plan lands before the next round. `variance` runs twice: with the slots' CPU (`variance-cpu`) and
with no CPU figure, throughput being the load (`variance-T`). After --rounds steady rounds, one
mid-sized lease doubles its rate and --after more rounds follow.

It prints, per round, each strategy's lease moves and max/LB of the true slot loads (LB = max(total /
W, the largest lease), which no assignment beats), then per strategy: moves over the steady rounds
from round 11 on (after convergence), and the moves and max/LB in the rounds after the doubling.

Run: .venv/bin/python bench/assignment_stability.py [--seed 7] [--noise 0.05] [--rounds 50] [--after 6]
[--floor P] (under a second).
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.assignment import zipf_leases
from devtools.assignment_snapshots import apply_plan, snapshot
from lease_core.assignment.decision import WorkerLoad
from lease_core.assignment.strategies import balances_in_round, decider_for
from lease_core.config.settings import ConsumerConfig
from lease_core.model.lease import Lease

LEASES, WORKERS = 64, 8
MEAN_CPU = 50.0
CONVERGED_FROM = 11
# (row name, strategy, whether slots report CPU)
RUNS: tuple[tuple[str, str, bool], ...] = (
    ("makespan", "makespan", False),
    ("variance-cpu", "variance", True),
    ("variance-T", "variance", False),
    ("count", "count", False),
)


@dataclass
class Fleet:
    """One strategy's lease table and slots' stored CPU values as the rounds go by."""

    leases: tuple[Lease, ...]
    cpu_history: dict[str, list[float]] = field(default_factory=dict)


def slot_ids() -> list[str]:
    return [f"app-worker-{i}" for i in range(WORKERS)]


def true_loads(fleet: Fleet, rates: dict[str, float]) -> dict[str, float]:
    loads = dict.fromkeys(slot_ids(), 0.0)
    for item in fleet.leases:
        loads[item.lease_owner or ""] = loads.get(item.lease_owner or "", 0.0) + rates[item.lease_key]
    return loads


def max_over_bound(loads: dict[str, float], rates: dict[str, float]) -> float:
    bound = max(sum(rates.values()) / WORKERS, *rates.values())
    return max(loads[slot] for slot in slot_ids()) / bound


def play_round(
    fleet: Fleet,
    rates: dict[str, float],
    run: tuple[str, str, bool],
    number: int,
    rng: random.Random,
    arguments: argparse.Namespace,
) -> int:
    """Measure with noise, decide, land the plan; the number of leases moved."""
    _, strategy, reports_cpu = run
    config, noise = ConsumerConfig(), arguments.noise
    measured = tuple(
        item.replace(throughput_kbps=rates[item.lease_key] * rng.uniform(1 - noise, 1 + noise)) for item in fleet.leases
    )
    loads = true_loads(fleet, rates)
    scale = MEAN_CPU / (sum(rates.values()) / WORKERS)
    workers = []
    for slot in slot_ids():
        history = fleet.cpu_history.setdefault(slot, [])
        history.append(min(100.0, loads[slot] * scale * rng.uniform(1 - noise, 1 + noise)))
        del history[: -config.no_of_persisted_metrics_per_worker_metrics]
        metrics = {"C": tuple(history)} if reports_cpu else {}
        workers.append(WorkerLoad(slot, metrics=metrics, operating_range={"C": 100.0} if reports_cpu else {}))
    balance = balances_in_round(strategy, number, config.variance_balancing_frequency)
    snap = snapshot(
        list(measured), workers, balance=balance, seed=number, rebalance_min_effect_percentage=arguments.floor
    )
    plan = decider_for(strategy).decide(snap)
    fleet.leases = apply_plan(measured, plan)
    return len(plan.moves)


def doubling_lease(rates: dict[str, float]) -> str:
    """The largest lease whose doubled rate still fits under a mean slot: a change balancing can answer."""
    mean_slot = sum(rates.values()) / WORKERS
    return max((key for key, rate in rates.items() if 2 * rate < mean_slot / 2), key=rates.__getitem__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--noise", type=float, default=0.05, help="relative noise per round, e.g. 0.05 for 5 %%")
    parser.add_argument("--rounds", type=int, default=50, help="steady rounds")
    parser.add_argument("--after", type=int, default=6, help="rounds after one lease doubles")
    parser.add_argument(
        "--floor",
        type=int,
        default=ConsumerConfig().rebalance_min_effect_percentage,
        help="rebalance_min_effect_percentage (default: the setting's default; 0: no floor)",
    )
    arguments = parser.parse_args(argv)
    if arguments.rounds < CONVERGED_FROM or arguments.after < 1 or not 0 <= arguments.noise < 1:
        parser.error(f"--rounds must be at least {CONVERGED_FROM}, --after at least 1, --noise in [0, 1)")
    start = zipf_leases(LEASES, WORKERS)
    rates = {item.lease_key: item.throughput_kbps or 0.0 for item in start}
    fleets = {run[0]: Fleet(start) for run in RUNS}
    rngs = {run[0]: random.Random(arguments.seed) for run in RUNS}
    doubled = doubling_lease(rates)
    rows: list[tuple[int, dict[str, tuple[int, float]]]] = []
    for number in range(1, arguments.rounds + arguments.after + 1):
        if number == arguments.rounds + 1:
            rates[doubled] *= 2
        cells = {}
        for run in RUNS:
            moves = play_round(fleets[run[0]], rates, run, number, rngs[run[0]], arguments)
            cells[run[0]] = (moves, max_over_bound(true_loads(fleets[run[0]], rates), rates))
        rows.append((number, cells))
    print(
        f"{LEASES} Zipf leases x {WORKERS} slots, noise +/-{arguments.noise:.0%} per round on every lease's throughput "
        f"and every slot's CPU, seed {arguments.seed}, rebalance_min_effect_percentage {arguments.floor}; "
        f"{doubled} doubles before round {arguments.rounds + 1}"
    )
    print_rounds(rows, arguments.rounds)
    print_summary(rows, arguments.rounds)


def print_rounds(rows: list[tuple[int, dict[str, tuple[int, float]]]], steady: int) -> None:
    header = f"{'round':>5}" + "".join(f"{name + ' moves':>20}{'max/LB':>8}" for name, _, _ in RUNS)
    print("\n" + header)
    for number, cells in rows:
        mark = "*" if number == steady + 1 else " "
        print(f"{number:>4}{mark}" + "".join(f"{cells[name][0]:>20}{cells[name][1]:>8.3f}" for name, _, _ in RUNS))
    print("(* the first round after the doubling; max/LB is after that round's plan, on the true rates)")


def print_summary(rows: list[tuple[int, dict[str, tuple[int, float]]]], steady: int) -> None:
    print(f"\n{'strategy':<14}{'moves r' + str(CONVERGED_FROM) + '-' + str(steady):>16}{'max/LB r' + str(steady):>12}")
    print(f"{'':<14}{'moves after doubling':>36}{'max/LB after round 1, last':>30}")
    for name, _, _ in RUNS:
        converged = sum(cells[name][0] for number, cells in rows if CONVERGED_FROM <= number <= steady)
        after = [cells[name] for number, cells in rows if number > steady]
        per_round = ",".join(str(moves) for moves, _ in after)
        print(
            f"{name:<14}{converged:>16}{rows[steady - 1][1][name][1]:>12.3f}{per_round:>20}"
            f"{after[0][1]:>15.3f}{after[-1][1]:>15.3f}"
        )


if __name__ == "__main__":
    main()
