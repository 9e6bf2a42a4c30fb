"""What every assignment plan must respect, checked by the decider tests (builders: devtools.assignment_snapshots)."""

from __future__ import annotations

from collections import Counter

from lease_core.assignment.decision import AssignmentInput, AssignmentPlan


def single_owner_violations(snap: AssignmentInput, plan: AssignmentPlan) -> list[str]:
    """What breaks 'every lease has at most one owner after the plan', empty when nothing does."""
    active = {worker.worker_id for worker in snap.workers}
    counts = Counter(move.lease_key for move in plan.moves)
    problems = [f"{key} moved {count} times" for key, count in counts.items() if count > 1]
    problems += [f"{m.lease_key} to inactive {m.to_owner}" for m in plan.moves if m.to_owner not in active]
    known = {item.lease_key for item in snap.leases}
    problems += [f"unknown lease {m.lease_key}" for m in plan.moves if m.lease_key not in known]
    return problems
