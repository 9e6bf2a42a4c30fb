"""The `lease_assignment_strategy` setting, resolved to a decider (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Callable

from lease_core.assignment import AssignmentDecider
from lease_core.count_assignment import CountAssignment
from lease_core.makespan_assignment import MakespanAssignment
from lease_core.variance_assignment import VarianceAssignment

_DECIDERS: dict[str, Callable[[], AssignmentDecider]] = {
    "variance": VarianceAssignment,
    "count": CountAssignment,
    "makespan": MakespanAssignment,
}


def decider_for(strategy_name: str) -> AssignmentDecider:
    try:
        return _DECIDERS[strategy_name]()
    except KeyError:
        known = ", ".join(sorted(_DECIDERS))
        raise ValueError(f"unknown lease assignment strategy {strategy_name!r}; expected one of {known}") from None
