"""Behaviour of the variance decider, KCL 3.x's default (docs/protocol.md §4.2-4.5).

Failing, inactive and invalid workers are filtered out by the coordinator before the decider runs
(§4.1), so here a failing worker is simply one that is absent from `workers`.
"""

from __future__ import annotations

import pytest

from devtools.assignment_snapshots import cpu_worker, default_worker, held, lease, loads_after, snapshot
from lease_core.assignment.decision import AssignmentInput
from lease_core.assignment.variance import VarianceAssignment
from lease_core.assignment.view import build_view, ema
from tests.support.assignment import single_owner_violations


# Two CPU workers within ±10% of their 80% average; `a` reports 84 against an operating range of
# `range_a`, and each holds twenty leases of 1 KB/s, so one lease adds 4 points of CPU to `b`.
def near_average(range_a: float = 80.0, **settings: object) -> AssignmentInput:
    return snapshot(
        held("a", *[1.0] * 20) + held("b", *[1.0] * 20),
        [cpu_worker("a", 84, range_max=range_a), cpu_worker("b", 76)],
        balance=True,
        **settings,
    )


SKEWED_DEFAULT = snapshot(held("a", 10, 10, 10, 10), [default_worker("a"), default_worker("b")], balance=True)

CASES = [
    pytest.param(
        snapshot(
            [lease("u")],
            [cpu_worker("hot", 80), cpu_worker("cool", 20), cpu_worker("warm", 50)],
            up_for_grabs=("u",),
        ),
        [("u", None, "cool")],
        (),
        id="unassigned-lease-goes-to-coolest-worker",
    ),
    pytest.param(
        snapshot([lease("u", "failing")], [cpu_worker("a", 30), cpu_worker("b", 20)], up_for_grabs=("u",)),
        [("u", "failing", "b")],
        (),
        id="failing-worker-absent-from-workers-gets-nothing",
    ),
    pytest.param(
        snapshot(
            [lease("x", "gone", 5.0), lease("y", "gone", 5.0), *held("a", 5.0)],
            [default_worker("a"), default_worker("b")],
            up_for_grabs=("x", "y"),
        ),
        # b has the most headroom and takes x; then both are at 2/3 of their share and the tie
        # goes to the lower id: 10 vs 5 KB/s either way.
        [("x", "gone", "b"), ("y", "gone", "a")],
        (),
        id="dead-owner-leases-go-to-the-worker-with-headroom-left",
    ),
    pytest.param(
        near_average(range_a=80.0),
        [("a-*", "a", "b")],
        (),
        id="above-operating-range-makes-worker-a-donor",
    ),
    pytest.param(near_average(range_a=100.0), [], (), id="within-threshold-and-range-no-balancing"),
    pytest.param(
        near_average(range_a=80.0, allow_throughput_overshoot=False),
        [],
        (),
        id="excess-below-smallest-lease-moves-nothing-without-overshoot",
    ),
    pytest.param(
        snapshot(
            [lease(f"u{i}") for i in range(5)],
            [default_worker("a"), default_worker("b")],
            up_for_grabs=tuple(f"u{i}" for i in range(5)),
            max_leases_for_worker=2,
        ),
        # Nothing measured yet: each lease is half of a's share, a keeps headroom >= b's until full.
        [("u0", None, "a"), ("u1", None, "a"), ("u2", None, "b"), ("u3", None, "b")],
        ("u4",),
        id="max-leases-for-worker-spills-over-the-rest",
    ),
    pytest.param(
        snapshot(
            held("a", 20.0) + [lease(f"u{i}", None, 10.0) for i in range(3)],
            [default_worker("a"), default_worker("b")],
            up_for_grabs=("u0", "u1", "u2"),
            max_throughput_per_host_kbps=15.0,
        ),
        [("u0", None, "b"), ("u1", None, "b")],
        ("u2",),
        id="max-throughput-per-host-crossing-assignment-made-then-worker-leaves",
    ),
    pytest.param(SKEWED_DEFAULT, [("a-*", "a", "b")], (), id="default-metric-workers-balanced-by-throughput-share"),
    pytest.param(
        snapshot(held("a", 10, 10, 10, 10), [default_worker("a"), default_worker("b")], balance=False),
        [],
        (),
        id="balance-false-does-no-balancing",
    ),
    pytest.param(
        snapshot(
            held("a", 10, 10, 10, 10),
            [default_worker("a"), default_worker("b")],
            balance=True,
            blocked=frozenset(f"a-{i}" for i in range(4)),
        ),
        [],
        (),
        id="blocked-on-handoff-never-moved",
    ),
]


def _matches(move: tuple[str, str | None, str], expected: tuple[str, str | None, str]) -> bool:
    key, source, target = expected
    key_ok = move[0].startswith(key[:-1]) if key.endswith("*") else move[0] == key
    return key_ok and move[1:] == (source, target)


@pytest.mark.parametrize(("snap", "expected_moves", "expected_spillover"), CASES)
def test_plan(snap: AssignmentInput, expected_moves: list, expected_spillover: tuple[str, ...]) -> None:
    plan = VarianceAssignment().decide(snap)
    moves = [(m.lease_key, m.from_owner, m.to_owner) for m in plan.moves]
    assert len(moves) == len(expected_moves)
    assert all(_matches(move, want) for move, want in zip(sorted(moves), sorted(expected_moves)))
    assert plan.spillover == expected_spillover
    assert single_owner_violations(snap, plan) == []


def test_balancing_lowers_the_busiest_default_metric_worker() -> None:
    loads = loads_after(SKEWED_DEFAULT, VarianceAssignment().decide(SKEWED_DEFAULT))
    assert loads == {"a": 30.0, "b": 10.0}


def test_same_seed_gives_same_plan_and_seed_drives_the_donor_shuffle() -> None:
    leases = held("a", *[float(i % 7 + 1) for i in range(40)])
    plans = {
        seed: VarianceAssignment().decide(
            snapshot(leases, [default_worker("a"), default_worker("b"), default_worker("c")], balance=True, seed=seed)
        )
        for seed in (1, 1, 2, 3)
    }
    again = VarianceAssignment().decide(
        snapshot(leases, [default_worker("a"), default_worker("b"), default_worker("c")], balance=True, seed=1)
    )
    assert again == plans[1]
    assert len({plan.moves for plan in plans.values()}) > 1


EMA_CASES = [
    pytest.param((), 0.0, id="no-values-is-zero"),
    pytest.param((40.0,), 40.0, id="single-value"),
    pytest.param((40.0, 80.0), 60.0, id="alpha-half-averages-two"),
    pytest.param((-1.0, 40.0, -1.0, 80.0), 60.0, id="missing-samples-ignored"),
]


@pytest.mark.parametrize(("values", "expected"), EMA_CASES)
def test_ema(values: tuple[float, ...], expected: float) -> None:
    assert ema(values, 0.5) == expected


def test_view_gives_unmeasured_leases_the_average_and_default_workers_their_share() -> None:
    view = build_view(snapshot([lease("x", "a", 30.0), lease("y", "b")], [default_worker("a"), default_worker("b")]))
    assert view.average_lease_throughput == 30.0
    assert view.target_average_throughput == 30.0
    assert view.lease_throughput == {"x": 30.0, "y": 30.0}
    assert view.metric_values == {"a": {"T": 100.0}, "b": {"T": 100.0}}


def test_view_of_an_idle_fleet_has_zero_share_not_nan() -> None:
    view = build_view(snapshot([lease("x", "a")], [default_worker("a")]))
    assert view.target_average_throughput == 0.0
    assert view.metric_values == {"a": {"T": 0.0}}


# Two CPU workers around a 50 % average: a at 56 is above the +-10 % band; each lease is 1 KB/s, so
# one lease is 1/20 of a's throughput and is expected to lower a by 2.8 points, 5.6 % of the average.
def jittered(**settings: object) -> AssignmentInput:
    return snapshot(
        held("a", *[1.0] * 20) + held("b", *[1.0] * 20),
        [cpu_worker("a", 56), cpu_worker("b", 44)],
        balance=True,
        **settings,
    )


# a doubled one lease (10 KB/s beside ten of 1) and reads 80 % against b's 40 %.
DOUBLED = snapshot(
    held("a", 10.0, *[1.0] * 10) + held("b", *[1.0] * 10), [cpu_worker("a", 80), cpu_worker("b", 40)], balance=True
)


# Few large leases per slot, as in a batch: a's 10 KB/s lease doubled and a reads 90 % against about
# 50 %; its smallest lease would lift the coolest slot 29 points, past the 60.5 % average (KCL's cap)
# but still more than the effect floor below a.
def coarse(a_cpu: float) -> AssignmentInput:
    return snapshot(
        held("a", 20.0, 10.0, 10.0) + held("b", 6.0, 6.0, 6.0) + held("c", 6.0, 6.0, 6.0) + held("d", 6.0, 6.0, 6.0),
        [cpu_worker("a", a_cpu), cpu_worker("b", 50), cpu_worker("c", 50), cpu_worker("d", 52)],
        balance=True,
    )


ZERO_THROUGHPUT = snapshot(
    held("a", 0.0, 0.0, 0.0),
    [cpu_worker("a", 80), cpu_worker("b", 20)],
    balance=True,
    rebalance_min_effect_percentage=0,
)

EFFECT_FLOOR = [
    pytest.param(jittered(), 0, id="jitter-over-the-band-under-the-floor-moves-nothing"),
    pytest.param(jittered(rebalance_min_effect_percentage=0), 1, id="floor-zero-acts-on-jitter-as-kcl-does"),
    pytest.param(DOUBLED, 2, id="doubled-lease-rebalanced-in-one-balancing-run"),
    pytest.param(near_average(range_a=80.0), 1, id="donor-above-its-operating-range-sheds-under-the-floor"),
    pytest.param(ZERO_THROUGHPUT, 0, id="zero-throughput-leases-never-picked"),
    pytest.param(coarse(90), 1, id="few-large-leases-one-moves-past-the-average-while-under-the-donor-by-the-floor"),
    pytest.param(coarse(75), 0, id="few-large-leases-a-move-that-would-not-lower-the-higher-of-the-two-is-refused"),
]


@pytest.mark.parametrize(("snap", "expected_moves"), EFFECT_FLOOR)
def test_rebalance_is_made_only_when_a_donor_is_expected_to_fall_by_the_floor(
    snap: AssignmentInput, expected_moves: int
) -> None:
    plan = VarianceAssignment().decide(snap)
    assert len(plan.moves) == expected_moves
    assert single_owner_violations(snap, plan) == []


def test_zero_throughput_leases_are_not_picked_though_they_always_fit_the_excess() -> None:
    # a must shed 1.5 KB/s: one 1 KB/s lease, and (in KCL) any number of its 0 KB/s leases besides.
    snap = snapshot(
        held("a", 0.0, 0.0, 0.0, 0.0, *[1.0] * 10) + held("b", *[1.0] * 10),
        [cpu_worker("a", 80), cpu_worker("b", 40)],
        balance=True,
    )
    moved = [move.lease_key for move in VarianceAssignment().decide(snap).moves]
    assert len(moved) == 1
    assert {item.lease_key: item.throughput_kbps for item in snap.leases}[moved[0]] == 1.0
