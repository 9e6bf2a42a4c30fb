"""KCL's LeaseCountBasedLeaseAssignmentDecider (docs/protocol.md §4.6), as a pure decider.

Every active worker should hold `target` leases (the §4.6 rule, capped by `max_leases_for_worker`).
Up-for-grabs leases fill the workers with the fewest leases first; balancing then moves leases one
at a time from the fullest worker to the emptiest until both ends are at target. Ties in lease
count are broken by worker id, and a donor gives its leases in key order, so plans are reproducible.
"""

from __future__ import annotations

import math

from lease_core.assignment.decision import AssignmentInput, AssignmentPlan, moves_to


def count_target(lease_count: int, worker_count: int, max_leases_for_worker: int) -> int:
    """Leases each worker should hold: one each if workers outnumber leases, else an even share rounded up."""
    target = 1 if worker_count >= lease_count else math.ceil(lease_count / worker_count)
    return min(target, max_leases_for_worker)


class CountAssignment:
    """The `count` strategy: equal lease counts, whatever each lease's throughput."""

    def decide(self, snapshot: AssignmentInput) -> AssignmentPlan:
        if not snapshot.workers:
            return AssignmentPlan(moves=(), spillover=tuple(snapshot.up_for_grabs))
        leases_of = _leases_by_active_worker(snapshot)
        target = count_target(len(snapshot.leases), len(leases_of), snapshot.settings.max_leases_for_worker)
        owners = {lease.lease_key: lease.actual_owner for lease in snapshot.leases}
        spillover = _assign_up_for_grabs(snapshot, leases_of, owners, target)
        if snapshot.balance:
            _balance(snapshot, leases_of, owners, target)
        return AssignmentPlan(moves=moves_to(snapshot, owners), spillover=spillover)


def _leases_by_active_worker(snapshot: AssignmentInput) -> dict[str, set[str]]:
    leases_of: dict[str, set[str]] = {worker.worker_id: set() for worker in snapshot.workers}
    for lease in snapshot.leases:
        if lease.actual_owner in leases_of:
            leases_of[lease.actual_owner].add(lease.lease_key)
    return leases_of


def _by_count(leases_of: dict[str, set[str]]) -> list[str]:
    return sorted(leases_of, key=lambda worker: (len(leases_of[worker]), worker))


def _move(lease_key: str, to_owner: str, leases_of: dict[str, set[str]], owners: dict[str, str | None]) -> None:
    previous = owners[lease_key]
    if previous in leases_of:
        leases_of[previous].discard(lease_key)
    leases_of[to_owner].add(lease_key)
    owners[lease_key] = to_owner


def _assign_up_for_grabs(
    snapshot: AssignmentInput, leases_of: dict[str, set[str]], owners: dict[str, str | None], target: int
) -> tuple[str, ...]:
    """Fill workers in ascending count order up to target; what is left spills over to the next run."""
    waiting = [key for key in snapshot.up_for_grabs if key in owners and key not in snapshot.blocked_on_handoff]
    workers = iter(_by_count(leases_of))
    current: str | None = next(workers)
    for index, lease_key in enumerate(waiting):
        while current is not None and len(leases_of[current]) >= target:
            current = next(workers, None)
        if current is None:
            return tuple(waiting[index:])
        _move(lease_key, current, leases_of, owners)
    return ()


def _balance(
    snapshot: AssignmentInput, leases_of: dict[str, set[str]], owners: dict[str, str | None], target: int
) -> None:
    """Two pointers over workers sorted by count: move one lease at a time from the top to the bottom."""
    workers = _by_count(leases_of)
    low, high = 0, len(workers) - 1
    while low < high:
        receiver, donor = workers[low], workers[high]
        if len(leases_of[receiver]) >= target:
            low += 1
        elif len(leases_of[donor]) <= target:
            high -= 1
        else:
            movable = sorted(leases_of[donor] - snapshot.blocked_on_handoff)
            if movable:
                _move(movable[0], receiver, leases_of, owners)
            else:
                high -= 1
