"""Behaviour of the makespan decider (ours, docs/protocol.md §4.7): the round ends with its slowest slot."""

from __future__ import annotations

import pytest

from devtools.assignment_snapshots import default_worker, held, lease, loads_after, snapshot
from lease_core.assignment.decision import AssignmentInput
from lease_core.assignment.makespan import MakespanAssignment, lower_bound
from tests.support.assignment import single_owner_violations

AB = [default_worker("a"), default_worker("b")]
ABC = [*AB, default_worker("c")]

REACHES_LOWER_BOUND = [
    pytest.param(snapshot(held("a", 4, 4, 2, 2), AB, balance=True), 6.0, id="two-workers-even-split"),
    pytest.param(snapshot(held("a", 10, 1, 1), AB, balance=True), 10.0, id="largest-lease-bounds"),
    pytest.param(snapshot(held("a", *[2] * 6), ABC, balance=True), 4.0, id="three-workers-equal-leases"),
    pytest.param(
        snapshot(held("a", 6, 4) + held("b", 5, 3), AB, balance=True), 9.0, id="swap-when-no-single-move-helps"
    ),
    pytest.param(
        snapshot(
            [lease(f"u{i}", None, t) for i, t in enumerate((1, 3, 1, 3, 1, 3))],
            ABC,
            up_for_grabs=tuple(f"u{i}" for i in range(6)),
        ),
        4.0,
        id="lpt-places-up-for-grabs-largest-first",
    ),
]


@pytest.mark.parametrize(("snap", "bound"), REACHES_LOWER_BOUND)
def test_reaches_lower_bound(snap: AssignmentInput, bound: float) -> None:
    plan = MakespanAssignment().decide(snap)
    assert lower_bound(snap) == bound
    assert max(loads_after(snap, plan).values()) == bound
    assert single_owner_violations(snap, plan) == []


BUDGETS = [
    pytest.param(None, 4, id="unlimited-moves-only-while-gaining"),
    pytest.param(2, 2, id="budget-two"),
    pytest.param(0, 0, id="budget-zero-is-sticky"),
]


@pytest.mark.parametrize(("budget", "expected_moves"), BUDGETS)
def test_move_budget(budget: int | None, expected_moves: int) -> None:
    snap = snapshot(held("a", *[1] * 8), AB, balance=True, max_moves_per_round=budget)
    assert len(MakespanAssignment().decide(snap).moves) == expected_moves


def test_swap_is_skipped_when_only_one_move_is_left() -> None:
    snap = snapshot(held("a", 6, 4) + held("b", 5, 3), AB, balance=True, max_moves_per_round=1)
    assert MakespanAssignment().decide(snap).moves == ()


CASES = [
    pytest.param(
        snapshot(held("a", 5) + held("b", 2) + [lease("u", None, 1)], ABC, up_for_grabs=("u",)),
        {"a": 5, "b": 2, "c": 1},
        (),
        id="unassigned-lease-goes-to-least-loaded-worker",
    ),
    pytest.param(
        snapshot([lease("x", "gone", 3), lease("y", "gone", 2), *held("a", 4)], AB, up_for_grabs=("x", "y")),
        {"a": 4, "b": 5},
        (),
        id="dead-owner-leases-reassigned",
    ),
    pytest.param(
        snapshot(
            [lease(f"u{i}", None, 1) for i in range(3)], AB, up_for_grabs=("u0", "u1", "u2"), max_leases_for_worker=1
        ),
        {"a": 1, "b": 1},
        ("u2",),
        id="max-leases-for-worker-spills-over",
    ),
    pytest.param(
        snapshot([*held("a", 8), lease("u", None, 5)], AB[:1], up_for_grabs=("u",), max_throughput_per_host_kbps=10),
        {"a": 8},
        ("u",),
        id="max-throughput-per-host-is-strict",
    ),
    pytest.param(snapshot(held("a", 4, 4), AB, balance=False), {"a": 8, "b": 0}, (), id="balance-false-is-sticky"),
    pytest.param(
        snapshot(held("a", 4, 4, 4), AB, balance=True, blocked=frozenset({"a-0", "a-1", "a-2"})),
        {"a": 12, "b": 0},
        (),
        id="blocked-on-handoff-never-moved",
    ),
    pytest.param(
        snapshot(held("a", 4) + held("b", 4), AB, balance=True), {"a": 4, "b": 4}, (), id="balanced-fleet-no-moves"
    ),
]


@pytest.mark.parametrize(("snap", "expected_loads", "expected_spillover"), CASES)
def test_plan(snap: AssignmentInput, expected_loads: dict[str, float], expected_spillover: tuple[str, ...]) -> None:
    plan = MakespanAssignment().decide(snap)
    assert loads_after(snap, plan) == expected_loads
    assert plan.spillover == expected_spillover
    assert single_owner_violations(snap, plan) == []


# Slot a's leases were (3, 1, 1, 1) and b's (2, 2, 1, 1): 6 each. Measurement noise shifts them by a
# few percent; a real change doubles a-0.
NOISE_FLOOR = [
    pytest.param(
        snapshot(held("a", 3.1, 1.04, 1.02, 0.98) + held("b", 1.9, 1.96, 0.97, 0.96), AB, balance=True),
        0,
        id="noise-of-a-few-percent-moves-nothing",
    ),
    pytest.param(
        snapshot(
            held("a", 3.1, 1.04, 1.02, 0.98) + held("b", 1.9, 1.96, 0.97, 0.96),
            AB,
            balance=True,
            rebalance_min_effect_percentage=0,
        ),
        4,
        id="floor-zero-trades-leases-over-noise",
    ),
    pytest.param(
        snapshot(held("a", 6, 1, 1, 1) + held("b", 2, 2, 1, 1), AB, balance=True), 1, id="doubled-lease-rebalanced"
    ),
    pytest.param(
        snapshot(held("a", 6, 1, 1, 1) + held("b", 2, 2, 1, 1), AB, balance=True, rebalance_min_effect_percentage=12),
        0,
        id="gain-under-a-higher-floor-moves-nothing",
    ),
]


# a's first lease doubled; the others carry a percent or two of noise. Two moves restore the balance.
DOUBLED_AMID_NOISE = held("a", 6, 1.02, 0.98, 1.01, 0.99) + held("b", 2, 2.03, 1, 0.97, 1.01)
DOUBLED_AMID_NOISE += held("c", 2.01, 1.99, 1.02, 0.98, 1.0)
NOISE_FLOOR += [
    pytest.param(snapshot(DOUBLED_AMID_NOISE, ABC, balance=True), 2, id="after-a-real-change-the-noise-is-not-chased"),
    pytest.param(
        snapshot(DOUBLED_AMID_NOISE, ABC, balance=True, rebalance_min_effect_percentage=0),
        4,
        id="floor-zero-chases-the-noise-after-a-real-change",
    ),
]


@pytest.mark.parametrize(("snap", "expected_moves"), NOISE_FLOOR)
def test_rebalance_is_made_only_when_it_lowers_the_busiest_load_by_the_floor(
    snap: AssignmentInput, expected_moves: int
) -> None:
    assert len(MakespanAssignment().decide(snap).moves) == expected_moves


def test_up_for_grabs_leases_are_placed_whatever_the_floor() -> None:
    snap = snapshot([*held("a", 1), lease("u", None, 1)], AB, up_for_grabs=("u",), rebalance_min_effect_percentage=100)
    assert [(move.lease_key, move.to_owner) for move in MakespanAssignment().decide(snap).moves] == [("u", "b")]


def test_a_slot_added_to_many_gets_leases_though_it_lowers_the_busiest_load_by_less_than_the_floor() -> None:
    # 12 slots of 20 equal leases and a 13th, new: the busiest can fall from 20 to 19, 5 % < the 8 % floor.
    slots = [f"w{index:02d}" for index in range(12)]
    leases = [item for slot in slots for item in held(slot, *[1.0] * 20)]
    snap = snapshot(leases, [default_worker(slot) for slot in [*slots, "w12"]], balance=True)
    loads = loads_after(snap, MakespanAssignment().decide(snap))
    assert loads["w12"] > 0
    assert max(loads.values()) == 19
