"""One assignment round of the leader: load, decide, write, remember (kcl-spec.md §5.2, DESIGN.md §4).

The round's workers are the slots `<app>-worker-0..W-1` (or any listed ids). A lease whose actual
owner is not an active slot is up for grabs. The decider is chosen by `lease_assignment_strategy`;
its plan is written lease by lease with `assign_lease` (owner-conditional, fences the previous
owner), or with a graceful handoff when the current owner is a slot that is running right now.
Lost conditions are counted, not raised. The round number and every lease's counter are kept in
the coordinator-state table, so the next round knows which leases did not move.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from lease_core.assignment import AssignmentInput, AssignmentPlan, AssignmentSettings, LeaseMove
from lease_core.assignment_strategies import decider_for
from lease_core.assignment_view import build_view
from lease_core.config import ConsumerConfig
from lease_core.coordinator_state import CoordinatorStateStore
from lease_core.lease import Lease
from lease_core.lease_store import LeaseStore
from lease_core.worker_metrics import CPU_METRIC, WorkerMetricsStore, active_workers

ROUND_KEY = "AssignmentRound"


def slot_ids(application_name: str, count: int) -> list[str]:
    """The worker ids of a round with `count` slots."""
    return [f"{application_name}-worker-{index}" for index in range(count)]


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    leases_before: int
    leases_after: int
    load_before_kbps: float
    load_after_kbps: float
    cpu_percent: float | None
    note: str | None


@dataclass(frozen=True)
class MoveRow:
    lease_key: str
    from_owner: str | None
    to_owner: str
    reason: str
    write: str  # "assign" or "handoff"
    applied: bool


@dataclass(frozen=True)
class AssignmentReport:
    strategy: str
    round_number: int
    balanced: bool
    moves: tuple[MoveRow, ...]
    workers: tuple[WorkerRow, ...]
    spillover: tuple[str, ...]
    lost_conditions: int
    excluded_workers: Mapping[str, str]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def settings_of(config: ConsumerConfig) -> AssignmentSettings:
    return AssignmentSettings(
        rebalance_threshold_percentage=config.rebalance_threshold_percentage,
        dampening_percentage=config.dampening_percentage,
        allow_throughput_overshoot=config.allow_throughput_overshoot,
        max_throughput_per_host_kbps=config.max_throughput_per_host_kbps,
        max_leases_for_worker=config.max_leases_for_worker,
        worker_metrics_ema_alpha=config.worker_metrics_ema_alpha,
        max_moves_per_round=config.makespan_max_moves_per_round or None,
    )


def up_for_grabs(leases: Sequence[Lease], active: set[str]) -> tuple[str, ...]:
    """Leases with no actual owner first (never owned), then those of slots that are not active."""
    unowned = sorted(lease.lease_key for lease in leases if lease.actual_owner is None)
    orphaned = sorted(
        lease.lease_key for lease in leases if lease.actual_owner is not None and lease.actual_owner not in active
    )
    return (*unowned, *orphaned)


class AssignmentCoordinator:
    def __init__(
        self,
        store: LeaseStore,
        metrics: WorkerMetricsStore,
        state: CoordinatorStateStore,
        config: ConsumerConfig,
        clock_millis: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.state = state
        self.config = config
        self.clock_millis = clock_millis

    def run(self, worker_ids: Sequence[str], running_workers: frozenset[str] = frozenset()) -> AssignmentReport:
        """One assignment round for `worker_ids`; `running_workers` are slots working right now."""
        if not worker_ids:
            raise ValueError("an assignment round needs at least one worker")
        round_number = self._previous_round() + 1
        leases = self.store.list_leases()
        stored = {worker: stats for worker in worker_ids if (stats := self.metrics.get(worker)) is not None}
        workers, notes = active_workers(worker_ids, stored, round_number)
        active = {worker.worker_id for worker in workers}
        snapshot = AssignmentInput(
            leases=tuple(leases),
            workers=tuple(workers),
            up_for_grabs=up_for_grabs(leases, active),
            balance=(round_number - 1) % self.config.variance_balancing_frequency == 0,
            settings=settings_of(self.config),
            blocked_on_handoff=frozenset(
                lease.lease_key for lease in leases if lease.is_in_handoff and lease.checkpoint_owner in running_workers
            ),
            seed=round_number,
        )
        plan = decider_for(self.config.lease_assignment_strategy).decide(snapshot)
        moves = self._write(plan, {lease.lease_key: lease for lease in leases}, snapshot, running_workers)
        self._remember(round_number)
        return AssignmentReport(
            strategy=self.config.lease_assignment_strategy,
            round_number=round_number,
            balanced=snapshot.balance,
            moves=moves,
            workers=_worker_rows(snapshot, moves, notes, worker_ids),
            spillover=plan.spillover,
            lost_conditions=sum(not move.applied for move in moves),
            excluded_workers={worker: notes[worker] for worker in worker_ids if worker not in active},
        )

    def _write(
        self,
        plan: AssignmentPlan,
        by_key: Mapping[str, Lease],
        snapshot: AssignmentInput,
        running_workers: frozenset[str],
    ) -> tuple[MoveRow, ...]:
        grabs = set(snapshot.up_for_grabs)
        rows = []
        for move in plan.moves:
            lease = by_key[move.lease_key]
            handoff = (
                self.config.graceful_lease_handoff_enabled
                and lease.actual_owner in running_workers
                and move.lease_key not in grabs
                and not lease.is_at_shard_end
                and not lease.is_in_handoff
            )
            # Between rounds no slot is running, so there is nobody to hand off from: a plain assign
            # fences any zombie attempt of the previous round through the counter.
            result = (
                self.store.initiate_graceful_handoff(lease, move.to_owner)
                if handoff
                else self.store.assign_lease(lease, move.to_owner)
            )
            rows.append(_move_row(move, "handoff" if handoff else "assign", result.applied))
        return tuple(rows)

    def _previous_round(self) -> int:
        record = self.state.get(ROUND_KEY)
        return int(record["round"]["N"]) if record and "round" in record else 0

    def _remember(self, round_number: int) -> None:
        counters = {lease.lease_key: {"N": str(lease.lease_counter)} for lease in self.store.list_leases()}
        self.state.put(
            ROUND_KEY,
            {
                "round": {"N": str(round_number)},
                "assignedAt": {"N": str(self.clock_millis())},
                "leaseCounters": {"M": counters},
            },
        )


def _move_row(move: LeaseMove, write: str, applied: bool) -> MoveRow:
    return MoveRow(move.lease_key, move.from_owner, move.to_owner, move.reason, write, applied)


def _worker_rows(
    snapshot: AssignmentInput,
    moves: tuple[MoveRow, ...],
    notes: Mapping[str, str],
    worker_ids: Sequence[str],
) -> tuple[WorkerRow, ...]:
    view = build_view(snapshot)
    before = {lease.lease_key: lease.actual_owner for lease in snapshot.leases}
    after = dict(before)
    for move in moves:
        if move.applied:
            after[move.lease_key] = move.to_owner
    cpu = {worker.worker_id: view.metric_values.get(worker.worker_id, {}).get(CPU_METRIC) for worker in snapshot.workers}

    def load(owners: Mapping[str, str | None], worker: str) -> float:
        return round(sum(view.lease_throughput[key] for key, owner in owners.items() if owner == worker), 3)

    return tuple(
        WorkerRow(
            worker_id=worker,
            leases_before=sum(owner == worker for owner in before.values()),
            leases_after=sum(owner == worker for owner in after.values()),
            load_before_kbps=load(before, worker),
            load_after_kbps=load(after, worker),
            cpu_percent=cpu.get(worker),
            note=notes.get(worker),
        )
        for worker in worker_ids
    )
