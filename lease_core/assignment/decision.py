"""Lease assignment: the leader's decision of which worker slot holds which lease.

A decider is pure: it takes an `AssignmentInput` (a snapshot of the leases, the active workers with
their metrics, and which leases are up for grabs) and returns an `AssignmentPlan`. The coordinator
that loads the snapshot and writes the plan (assign or graceful handoff) lives elsewhere.

Strategies (`lease_assignment_strategy`): `variance` (KCL 3.x worker-utilization aware,
docs/protocol.md §4.2-4.5), `count` (KCL's lease-count based, §4.6), `makespan` (ours, §4.7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from lease_core.model.lease import Lease

THROUGHPUT_METRIC = "T"


@dataclass(frozen=True)
class WorkerLoad:
    """An active worker as the decider sees it.

    `metrics` maps a metric short name (`C` for CPU, docs/protocol.md §5.1) to the stored per-interval
    values, oldest first, -1 marking an interval without a sample; `operating_range` maps the same
    names to the maximum utilization. A worker with no metrics is a default-metric worker whose load
    is its share of throughput (§4.2).
    """

    worker_id: str
    metrics: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    operating_range: Mapping[str, float] = field(default_factory=dict)

    @property
    def is_default_metric_worker(self) -> bool:
        return not self.metrics or THROUGHPUT_METRIC in self.metrics


@dataclass(frozen=True)
class AssignmentSettings:
    """The knobs of docs/protocol.md §4.3, in snake_case (see ConsumerConfig for docs and defaults)."""

    rebalance_threshold_percentage: int = 10
    dampening_percentage: int = 60
    allow_throughput_overshoot: bool = True
    max_throughput_per_host_kbps: float = float("inf")
    max_leases_for_worker: int = 2147483647
    worker_metrics_ema_alpha: float = 0.5
    # makespan and variance: a rebalance expected to relieve less than this percentage is not made.
    rebalance_min_effect_percentage: float = 8.0
    # makespan only: how many leases one round may move while rebalancing (None: no budget).
    max_moves_per_round: int | None = None


@dataclass(frozen=True)
class AssignmentInput:
    """The snapshot a decider works on.

    leases: every lease of the application. workers: the active workers (failing, inactive and
    invalid ones already removed). up_for_grabs: keys of leases that are unassigned, owned by a
    worker that is not active, or expired, ordered longest-waiting first (KCL sorts them by last
    counter increment, never-owned first). balance: whether this run also rebalances (KCL does so
    on every `variance_balancing_frequency`-th run).
    """

    leases: tuple[Lease, ...]
    workers: tuple[WorkerLoad, ...]
    up_for_grabs: tuple[str, ...]
    balance: bool
    settings: AssignmentSettings = AssignmentSettings()
    # A lease in a graceful handoff whose deadline has not passed must not be moved again.
    blocked_on_handoff: frozenset[str] = frozenset()
    # Seeds the variance decider's donor-lease shuffle (random in KCL) so that a plan is reproducible.
    seed: int = 0


@dataclass(frozen=True)
class LeaseMove:
    lease_key: str
    from_owner: str | None
    to_owner: str
    reason: str  # "unassigned" (priority phase) or "balance"


@dataclass(frozen=True)
class AssignmentPlan:
    moves: tuple[LeaseMove, ...]
    # Leases up for grabs that no worker could take this run (limits reached): KCL's "spillover".
    spillover: tuple[str, ...] = ()


class AssignmentDecider(Protocol):
    def decide(self, snapshot: AssignmentInput) -> AssignmentPlan: ...


def moves_to(snapshot: AssignmentInput, owners: Mapping[str, str | None]) -> tuple[LeaseMove, ...]:
    """The moves that take every lease from its actual owner to `owners[key]` (an active worker)."""
    active = {worker.worker_id for worker in snapshot.workers}
    grabs = set(snapshot.up_for_grabs)
    return tuple(
        LeaseMove(lease.lease_key, lease.actual_owner, owner, "unassigned" if lease.lease_key in grabs else "balance")
        for lease in snapshot.leases
        if (owner := owners.get(lease.lease_key)) is not None and owner != lease.actual_owner and owner in active
    )


def projected_owners(snapshot: AssignmentInput, plan: AssignmentPlan) -> dict[str, str | None]:
    """lease key -> actual owner after applying the plan (used by reports, tests and benchmarks)."""
    owners = {lease.lease_key: lease.actual_owner for lease in snapshot.leases}
    for move in plan.moves:
        owners[move.lease_key] = move.to_owner
    return owners
