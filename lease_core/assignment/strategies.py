"""The `lease_assignment_strategy` setting, resolved to a decider (docs/protocol.md §4)."""

from __future__ import annotations

from collections.abc import Callable

from lease_core.assignment.count import CountAssignment
from lease_core.assignment.decision import AssignmentDecider
from lease_core.assignment.makespan import MakespanAssignment
from lease_core.assignment.variance import VarianceAssignment
from lease_core.config.settings import LEASE_ASSIGNMENT_STRATEGIES

_DECIDERS: dict[str, Callable[[], AssignmentDecider]] = {
    "makespan": MakespanAssignment,
    "variance": VarianceAssignment,
    "count": CountAssignment,
}
assert tuple(_DECIDERS) == LEASE_ASSIGNMENT_STRATEGIES, "a strategy name without its decider, or the reverse"


def decider_for(strategy_name: str) -> AssignmentDecider:
    try:
        return _DECIDERS[strategy_name]()
    except KeyError:
        known = ", ".join(sorted(_DECIDERS))
        raise ValueError(f"unknown lease assignment strategy {strategy_name!r}; expected one of {known}") from None


# KCL's deciders rebalance on every `variance_balancing_frequency`-th run of the assignment manager.
# makespan rebalances in every round: a round's slowest slot sets its length, so the imbalance a
# measurement reveals costs every round it is left in place, and a move is made only when it
# lowers the largest load (and within `makespan_max_moves_per_round`).
_BALANCES_EVERY_ROUND = frozenset({"makespan"})


def balances_in_round(strategy_name: str, round_number: int, variance_balancing_frequency: int) -> bool:
    """Whether assignment round `round_number` (from 1) runs the strategy's balancing phase."""
    return strategy_name in _BALANCES_EVERY_ROUND or (round_number - 1) % variance_balancing_frequency == 0
