"""KCL 3.x's VarianceBasedLeaseAssignmentDecider (docs/protocol.md §4.3-4.4), as a pure decider.

One `decide` builds the §4.2 view, gives the up-for-grabs leases to the workers with the most
headroom, then (when the snapshot asks for it) moves throughput away from workers whose metric is
off the fleet average. The working state of one decision lives in `_VarianceRun`, which nothing
outside this module sees.

Departures from KCL, all for determinism or safety: candidate-queue ties are broken by worker id
(Java leaves them unordered); metrics are scanned in name order (Java: hash-map order); the donor
shuffle uses `random.Random(snapshot.seed)`; leases in `blocked_on_handoff` are never selected (KCL
selects them and its write phase skips them).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from lease_core.assignment.decision import THROUGHPUT_METRIC, AssignmentInput, AssignmentPlan, LeaseMove
from lease_core.assignment.view import AssignmentView, build_view


@dataclass(frozen=True)
class _Donor:
    worker_id: str
    throughput_to_take: float


@dataclass(frozen=True)
class _WorkingState:
    planned: dict[str, LeaseMove]
    owner_of: dict[str, str | None]
    leases_of: dict[str | None, set[str]]
    throughput_of: dict[str | None, float]
    values: dict[str, dict[str, float]]


class VarianceAssignment:
    """The default strategy (`variance`): worker-utilization aware, throughput when CPU is missing."""

    def decide(self, snapshot: AssignmentInput) -> AssignmentPlan:
        run = _VarianceRun(snapshot, build_view(snapshot))
        run.assign_up_for_grabs()
        if snapshot.balance:
            run.balance()
        return run.plan()


class _VarianceRun:
    """The mutable state of one decision: the view as leases move, extrapolated metrics, the queue."""

    def __init__(self, snapshot: AssignmentInput, view: AssignmentView) -> None:
        self.snapshot = snapshot
        self.settings = snapshot.settings
        self.view = view
        self.leases = {lease.lease_key: lease for lease in snapshot.leases}
        self.owner_of = {lease.lease_key: lease.actual_owner for lease in snapshot.leases}
        self.leases_of = {owner: set(keys) for owner, keys in view.leases_by_owner.items()}
        self.throughput_of = dict(view.throughput_by_owner)
        self.values = {worker: dict(metrics) for worker, metrics in view.metric_values.items()}
        self.fleet_average = _fleet_averages(view)
        # Fixed for the run (§4.3), even though the priority phase changes lease counts.
        self.target_lease_per_worker = max(len(snapshot.leases) // max(len(snapshot.workers), 1), 1)
        self.rng = random.Random(snapshot.seed)
        self.planned: dict[str, LeaseMove] = {}
        self.spillover: list[str] = []
        self.queue: list[tuple[float, str]] = []
        for worker in snapshot.workers:
            if self._within_limits(worker.worker_id):
                self._push(worker.worker_id)

    # --- candidate queue ---------------------------------------------------------------------------

    def _headroom(self, worker_id: str) -> float:
        """Least relative distance below the fleet average over the worker's metrics; idle counts as 1."""
        values = self.values[worker_id]
        return min(
            (1.0 if v == 0 else (self.fleet_average[m] - v) / v for m, v in values.items()),
            default=1.0,
        )

    def _push(self, worker_id: str) -> None:
        # Most headroom first; the worker id breaks ties so that plans are reproducible.
        heapq.heappush(self.queue, (-self._headroom(worker_id), worker_id))

    def _pop(self) -> str | None:
        return heapq.heappop(self.queue)[1] if self.queue else None

    def _within_limits(self, worker_id: str) -> bool:
        return (
            self.throughput_of[worker_id] <= self.settings.max_throughput_per_host_kbps
            and len(self.leases_of[worker_id]) < self.settings.max_leases_for_worker
        )

    # --- moving a lease ------------------------------------------------------------------------------

    def _metric_increase(self, metric: str, throughput: float) -> float:
        """How much a worker's metric is expected to grow when it takes a lease of this throughput.

        Batch adaptation for the synthetic throughput metric `T` of default-metric workers: T is
        defined as the worker's share of the target throughput x 100, so the increase is exact
        (t / target x 100, or one lease's share of 100 when nothing has been measured yet). KCL's
        general formula scales by the fleet average, which is 0 on a fleet that has no leases yet
        (every slot in a batch application's first round), and would hand every lease to one slot.
        """
        if metric == THROUGHPUT_METRIC:
            target = self.view.target_average_throughput
            return throughput / target * 100 if target > 0 else 100 / self.target_lease_per_worker
        if self.view.target_average_throughput > 0:
            return throughput * self.fleet_average[metric] / self.view.target_average_throughput
        return self.fleet_average[metric] / self.target_lease_per_worker

    def _assign(self, lease_key: str, worker_id: str, reason: str) -> None:
        lease = self.leases[lease_key]
        expired_phase = reason == "unassigned"
        if worker_id == self.owner_of[lease_key] and not (expired_phase and lease.is_in_handoff):
            self._push(worker_id)
            return
        throughput = self.view.lease_throughput[lease_key]
        # Only the taker's metrics are extrapolated; KCL leaves the donor's values as they were.
        for metric in self.values[worker_id]:
            self.values[worker_id][metric] += self._metric_increase(metric, throughput)
        self._move_in_view(lease_key, worker_id, throughput)
        self.planned[lease_key] = LeaseMove(lease_key, lease.actual_owner, worker_id, reason)
        if self._within_limits(worker_id):
            self._push(worker_id)

    def _move_in_view(self, lease_key: str, worker_id: str, throughput: float) -> None:
        previous = self.owner_of[lease_key]
        self.leases_of[previous].discard(lease_key)
        self.throughput_of[previous] -= throughput
        self.leases_of[worker_id].add(lease_key)
        self.throughput_of[worker_id] += throughput
        self.owner_of[lease_key] = worker_id

    # --- phases --------------------------------------------------------------------------------------

    def assign_up_for_grabs(self) -> None:
        """Priority phase: longest-waiting first, each to the worker with most headroom, no average check."""
        waiting = [
            key
            for key in self.snapshot.up_for_grabs
            if key in self.leases and key not in self.snapshot.blocked_on_handoff
        ]
        for index, lease_key in enumerate(waiting):
            worker_id = self._pop()
            if worker_id is None:
                self.spillover = waiting[index:]
                return
            self._assign(lease_key, worker_id, "unassigned")

    def balance(self) -> None:
        """Drain the donors of the worst metric; undo it all if its expected effect is under the floor.

        The floor is KCL PR #1814's answer to leases moving back and forth under normal jitter: a
        rebalance that would lower no donor's metric by `rebalance_min_effect_percentage` of the fleet
        average is not worth its handoffs. A donor's metric is expected to fall in proportion to the
        throughput it gives away (the extrapolation of §4.3 run backwards). A donor above its operating
        range is overloaded, not jittering: it sheds whatever the floor says.
        """
        metric, donors = self._donors_of_worst_metric()
        before = self._working_state()
        for donor in donors:
            self._drain(donor)
        if donors and not self._overloaded(metric, donors):
            falls = [self._expected_fall(metric, donor.worker_id, before) for donor in donors]
            if max(falls) < self.settings.rebalance_min_effect_percentage:
                self._restore(before)

    def _working_state(self) -> _WorkingState:
        """Copies of what balancing changes, so that a rebalance under the floor can be undone."""
        return _WorkingState(
            dict(self.planned),
            dict(self.owner_of),
            {owner: set(keys) for owner, keys in self.leases_of.items()},
            dict(self.throughput_of),
            {worker: dict(metrics) for worker, metrics in self.values.items()},
        )

    def _restore(self, state: _WorkingState) -> None:
        self.planned, self.owner_of, self.leases_of = state.planned, state.owner_of, state.leases_of
        self.throughput_of, self.values = state.throughput_of, state.values

    def _overloaded(self, metric: str, donors: list[_Donor]) -> bool:
        # The synthetic T's range is 100, its average: "above range" there only means "above average".
        return metric != THROUGHPUT_METRIC and any(
            self.values[donor.worker_id][metric] > self._range_max(donor.worker_id, metric) for donor in donors
        )

    def _expected_fall(self, metric: str, worker_id: str, before: _WorkingState) -> float:
        """How far the donor's metric should fall, in percent of the fleet average: in proportion to
        the share of its throughput it gave away."""
        average, throughput = self.fleet_average[metric], before.throughput_of[worker_id]
        if average <= 0 or throughput <= 0:
            return 0.0
        given = throughput - self.throughput_of[worker_id]
        return before.values[worker_id][metric] * given / throughput / average * 100

    def _donors_of_worst_metric(self) -> tuple[str, list[_Donor]]:
        """The metric whose donors would give away the most throughput, and those donors (§4.3)."""
        best_total, best_metric, best_donors = -1.0, "", []
        for metric in sorted(self.fleet_average):
            donors = self._donors_for(metric)
            total = sum(donor.throughput_to_take for donor in donors)
            if total > best_total:
                best_total, best_metric, best_donors = total, metric, donors
        return best_metric, sorted(best_donors, key=lambda donor: (-donor.throughput_to_take, donor.worker_id))

    def _donors_for(self, metric: str) -> list[_Donor]:
        average = self.fleet_average[metric]
        threshold = self.settings.rebalance_threshold_percentage / 100
        upper, lower = average * (1 + threshold), average * (1 - threshold)
        reporting = {w: values[metric] for w, values in self.values.items() if metric in values}
        overloaded = {w for w, v in reporting.items() if v > self._range_max(w, metric)}
        triggered = overloaded or any(v > upper or v < lower for v in reporting.values())
        if not triggered:
            return []
        donor_ids = sorted({w for w, v in reporting.items() if v >= upper} | overloaded)
        if not donor_ids:
            donor_ids = [max(sorted(reporting), key=lambda w: reporting[w])]
        return [_Donor(w, self._throughput_to_take(w, reporting[w], average)) for w in donor_ids]

    def _throughput_to_take(self, worker_id: str, value: float, average: float) -> float:
        # A worker at value 0 has nothing measurable to give (Java would divide by zero here).
        if value <= 0:
            return 0.0
        dampening = self.settings.dampening_percentage / 100
        return self.throughput_of[worker_id] * ((value - average) / value) * dampening

    def _range_max(self, worker_id: str, metric: str) -> float:
        return self.view.operating_range[worker_id].get(metric, math.inf)

    def _drain(self, donor: _Donor) -> None:
        """Move the donor's selected leases to the best candidates until one would go above average."""
        for lease_key in self._select_leases(donor):
            candidate = self._pop()
            if candidate is None:
                return
            if self._would_exceed(candidate, self.view.lease_throughput[lease_key], donor.worker_id):
                # KCL quirk kept: the popped candidate is not put back, so it gets nothing more this run.
                return
            self._assign(lease_key, candidate, "balance")

    def _select_leases(self, donor: _Donor) -> list[str]:
        throughput = self.view.lease_throughput
        # A lease with no throughput relieves nobody; KCL PR #1814: picking one moved it every run.
        keys = sorted(
            key for key in self.leases_of[donor.worker_id] - self.snapshot.blocked_on_handoff if throughput[key] > 0
        )
        if not keys:
            return []
        self.rng.shuffle(keys)
        selected, remaining = [], donor.throughput_to_take
        for key in keys:
            # Strictly positive remainder: a lease that would use up the whole excess is skipped.
            if remaining - throughput[key] > 0:
                selected.append(key)
                remaining -= throughput[key]
        if not selected and self.settings.allow_throughput_overshoot:
            selected = [min(keys, key=lambda key: (throughput[key], key))]
        return selected

    def _would_exceed(self, worker_id: str, throughput: float, donor_id: str) -> bool:
        """Whether the candidate would end above what it may take on: its operating range, and, as in
        KCL, the fleet average; or, past the average (batch adaptation), the effect floor below the
        donor's value. A batch slot holds few leases, each often a sizable share of its load: KCL's
        cap then refuses every move, even off a slot that a doubled shard put far above the rest. A
        receiver ending at least the floor below where the donor stood lowers the higher of the two,
        and the move back would not pass the same test."""
        donor, floor = self.values[donor_id], self.settings.rebalance_min_effect_percentage / 100
        for metric, value in self.values[worker_id].items():
            average = self.fleet_average[metric]
            allowed = max(average, donor.get(metric, average) - floor * average)
            if value + self._metric_increase(metric, throughput) > min(allowed, self._range_max(worker_id, metric)):
                return True
        return False

    def plan(self) -> AssignmentPlan:
        moves = tuple(
            move
            for move in self.planned.values()
            if move.to_owner != move.from_owner or self.leases[move.lease_key].is_in_handoff
        )
        return AssignmentPlan(moves=moves, spillover=tuple(self.spillover))


def _fleet_averages(view: AssignmentView) -> dict[str, float]:
    """Mean value of each metric over the workers that report it (§4.3).

    Batch adaptation: the synthetic throughput metric `T` averages 100 by construction once every
    lease is placed (a worker at exactly its share of the target throughput reads 100), so 100 is
    its reference. KCL averages the current values, which is the same in a settled fleet but 0 when
    leases are still unassigned, as in every batch application's first round; then every loaded
    worker has the same headroom and balancing can never place a lease.
    """
    sums: dict[str, list[float]] = {}
    for values in view.metric_values.values():
        for metric, value in values.items():
            sums.setdefault(metric, []).append(value)
    averages = {metric: sum(values) / len(values) for metric, values in sums.items()}
    if THROUGHPUT_METRIC in averages:
        averages[THROUGHPUT_METRIC] = 100.0
    return averages
