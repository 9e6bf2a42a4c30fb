"""Behaviour of the count decider, KCL's LEASE_COUNT_BASED (docs/protocol.md §4.6)."""

from __future__ import annotations

from collections import Counter

import pytest

from devtools.assignment_snapshots import default_worker, held, lease, snapshot
from lease_core.assignment.count import CountAssignment, count_target
from lease_core.assignment.decision import AssignmentInput, projected_owners
from tests.support.assignment import single_owner_violations

TARGETS = [
    pytest.param(5, 2, 2147483647, 3, id="even-share-rounded-up"),
    pytest.param(2, 5, 2147483647, 1, id="more-workers-than-leases-one-each"),
    pytest.param(6, 3, 2147483647, 2, id="exact-share"),
    pytest.param(10, 3, 2, 2, id="capped-by-max-leases-for-worker"),
]


@pytest.mark.parametrize(("leases", "workers", "max_leases", "expected"), TARGETS)
def test_target(leases: int, workers: int, max_leases: int, expected: int) -> None:
    assert count_target(leases, workers, max_leases) == expected


ABC = [default_worker("a"), default_worker("b"), default_worker("c")]

CASES = [
    pytest.param(
        snapshot(
            held("a", 1, 1) + held("c", 1) + [lease(f"u{i}") for i in range(3)],
            ABC,
            up_for_grabs=("u0", "u1", "u2"),
        ),
        {"a": 2, "b": 2, "c": 2},
        (),
        id="up-for-grabs-fill-fewest-leases-first-up-to-target",
    ),
    pytest.param(
        snapshot([lease(f"u{i}") for i in range(3)], ABC[:2], up_for_grabs=("u0", "u1", "u2"), max_leases_for_worker=1),
        {"a": 1, "b": 1},
        ("u2",),
        id="max-leases-for-worker-spills-over",
    ),
    pytest.param(
        snapshot([lease("x", "gone"), lease("y", "gone"), *held("a", 1)], ABC[:2], up_for_grabs=("x", "y")),
        {"a": 1, "b": 2},
        (),
        id="dead-owner-leases-reassigned",
    ),
    pytest.param(
        snapshot(held("a", *[1] * 6), ABC, balance=True), {"a": 2, "b": 2, "c": 2}, (), id="two-pointer-balancing"
    ),
    pytest.param(
        snapshot(held("a", *[1] * 7), ABC, balance=True),
        {"a": 3, "b": 3, "c": 1},
        (),
        id="rounded-up-target-leaves-last-worker-short",
    ),
    pytest.param(snapshot(held("a", *[1] * 6), ABC, balance=False), {"a": 6}, (), id="balance-false-does-no-balancing"),
    pytest.param(
        snapshot(held("a", *[1] * 6), ABC, balance=True, blocked=frozenset(f"a-{i}" for i in range(5))),
        {"a": 5, "b": 1},
        (),
        id="blocked-on-handoff-never-moved",
    ),
]


@pytest.mark.parametrize(("snap", "expected_counts", "expected_spillover"), CASES)
def test_plan(snap: AssignmentInput, expected_counts: dict[str, int], expected_spillover: tuple[str, ...]) -> None:
    plan = CountAssignment().decide(snap)
    owners = projected_owners(snap, plan)
    assert Counter(owner for owner in owners.values() if owner is not None and owner != "gone") == expected_counts
    assert plan.spillover == expected_spillover
    assert single_owner_violations(snap, plan) == []
    assert all(move.lease_key not in snap.blocked_on_handoff for move in plan.moves)


def test_no_active_workers_spills_everything_over() -> None:
    plan = CountAssignment().decide(snapshot([lease("u")], [], up_for_grabs=("u",)))
    assert plan.moves == () and plan.spillover == ("u",)
