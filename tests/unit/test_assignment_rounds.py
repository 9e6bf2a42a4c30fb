"""Assignment over consecutive batch rounds (docs/protocol.md §4.1): the leader plans, the plan lands, repeat.

The workload is fixed and skewed (Zipf-like throughput, spread round-robin), every round balances,
and the fake clock only stamps rounds (its time seeds the variance shuffle, as a real leader could).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from devtools.assignment_snapshots import apply_plan, default_worker, lease, loads_after, snapshot
from lease_core.assignment.decision import AssignmentPlan
from lease_core.assignment.strategies import decider_for
from lease_core.model.lease import Lease
from tests.support.assignment import single_owner_violations

ROUNDS = 10
WORKERS = [default_worker(f"app-worker-{i}") for i in range(6)]


@dataclass
class FakeClock:
    now: float = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class Round:
    plan: AssignmentPlan
    imbalance: float  # most-loaded slot over the mean slot load


def skewed_leases() -> tuple[Lease, ...]:
    return tuple(lease(f"shard-{i:02d}", WORKERS[i % len(WORKERS)].worker_id, 100.0 / (i + 1)) for i in range(48))


def run_rounds(strategy: str) -> list[Round]:
    clock, leases, rounds = FakeClock(), skewed_leases(), []
    for _ in range(ROUNDS):
        clock.advance(300.0)
        snap = snapshot(list(leases), WORKERS, balance=True, seed=int(clock.now))
        plan = decider_for(strategy).decide(snap)
        assert single_owner_violations(snap, plan) == []
        loads = loads_after(snap, plan).values()
        rounds.append(Round(plan, max(loads) / (sum(loads) / len(loads))))
        leases = apply_plan(leases, plan)
    return rounds


STRATEGIES = [pytest.param(name, id=name) for name in ("variance", "count", "makespan")]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_plans_shrink_to_nothing_when_the_workload_does_not_change(strategy: str) -> None:
    sizes = [len(r.plan.moves) for r in run_rounds(strategy)]
    assert sizes[-2:] == [0, 0], sizes


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_lease_keeps_exactly_one_owner_through_the_rounds(strategy: str) -> None:
    leases = skewed_leases()
    for round_ in run_rounds(strategy):
        leases = apply_plan(leases, round_.plan)
    owners = [item.lease_owner for item in leases]
    assert len(leases) == 48 and all(owner in {w.worker_id for w in WORKERS} for owner in owners)


def test_makespan_imbalance_never_grows_after_round_three() -> None:
    imbalance = [r.imbalance for r in run_rounds("makespan")]
    assert all(later <= earlier for earlier, later in itertools.pairwise(imbalance[2:])), imbalance


def test_makespan_ends_no_more_imbalanced_than_variance() -> None:
    assert run_rounds("makespan")[-1].imbalance <= run_rounds("variance")[-1].imbalance


def test_an_unknown_strategy_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="'round-robin'"):
        decider_for("round-robin")
