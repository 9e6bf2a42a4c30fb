"""Assignment snapshots as values and what a plan does to them: for the decider tests, the simulation, the bench."""

from __future__ import annotations

from typing import Any

from lease_core.assignment.decision import (
    AssignmentInput,
    AssignmentPlan,
    AssignmentSettings,
    WorkerLoad,
    projected_owners,
)
from lease_core.model.lease import Lease


def lease(key: str, owner: str | None = None, throughput: float | None = None, **fields: Any) -> Lease:
    return Lease(key, lease_owner=owner, throughput_kbps=throughput, **fields)


def held(owner: str, *throughputs: float) -> list[Lease]:
    """Leases `<owner>-0..n` held by `owner` with the given throughputs."""
    return [lease(f"{owner}-{index}", owner, value) for index, value in enumerate(throughputs)]


def cpu_worker(worker_id: str, *cpu: float, range_max: float = 100.0) -> WorkerLoad:
    return WorkerLoad(worker_id, metrics={"C": tuple(cpu)}, operating_range={"C": range_max})


def default_worker(worker_id: str) -> WorkerLoad:
    return WorkerLoad(worker_id)


def snapshot(
    leases: list[Lease],
    workers: list[WorkerLoad],
    up_for_grabs: tuple[str, ...] = (),
    balance: bool = False,
    blocked: frozenset[str] = frozenset(),
    seed: int = 0,
    **settings: Any,
) -> AssignmentInput:
    return AssignmentInput(
        leases=tuple(leases),
        workers=tuple(workers),
        up_for_grabs=up_for_grabs,
        balance=balance,
        settings=AssignmentSettings(**settings),
        blocked_on_handoff=blocked,
        seed=seed,
    )


def loads_after(snap: AssignmentInput, plan: AssignmentPlan) -> dict[str, float]:
    """Projected throughput per active worker; leases never measured count as zero here."""
    owners = projected_owners(snap, plan)
    loads = {worker.worker_id: 0.0 for worker in snap.workers}
    for item in snap.leases:
        owner = owners[item.lease_key]
        if owner in loads:
            loads[owner] += item.throughput_kbps or 0.0
    return loads


def apply_plan(leases: tuple[Lease, ...], plan: AssignmentPlan) -> tuple[Lease, ...]:
    """The lease table after the plan's assignments land (handoffs complete, counters bumped)."""
    targets = {move.lease_key: move.to_owner for move in plan.moves}
    return tuple(
        item.replace(lease_owner=targets[item.lease_key], checkpoint_owner=None, lease_counter=item.lease_counter + 1)
        if item.lease_key in targets
        else item
        for item in leases
    )
