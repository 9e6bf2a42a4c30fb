"""The in-memory view the assignment deciders work on (docs/protocol.md §4.2-4.3).

Built once per decision from an `AssignmentInput`; it is a value. Deciders that need to move leases
around while they decide copy the parts they mutate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lease_core.assignment.decision import THROUGHPUT_METRIC, AssignmentInput, WorkerLoad

NO_SAMPLE = -1.0
# A default-metric worker's synthetic metric is its throughput share in percent of the target.
DEFAULT_METRIC_RANGE = 100.0


@dataclass(frozen=True)
class AssignmentView:
    """What §4.2 derives from a snapshot.

    lease_throughput: every lease's throughput, the average standing in for leases never measured.
    leases_by_owner / throughput_by_owner: keyed by actual owner (None groups unowned leases); every
    active worker is present, possibly with no leases. metric_values: worker -> metric -> EMA value.
    operating_range: worker -> metric -> maximum utilization.
    """

    average_lease_throughput: float
    target_average_throughput: float
    lease_throughput: Mapping[str, float]
    leases_by_owner: Mapping[str | None, frozenset[str]]
    throughput_by_owner: Mapping[str | None, float]
    metric_values: Mapping[str, Mapping[str, float]]
    operating_range: Mapping[str, Mapping[str, float]]


def ema(values: Iterable[float], alpha: float) -> float:
    """Exponential moving average in stored order, skipping intervals without a sample (§4.3)."""
    average: float | None = None
    for value in values:
        if value == NO_SAMPLE:
            continue
        average = value if average is None else alpha * value + (1 - alpha) * average
    return 0.0 if average is None else average


def build_view(snapshot: AssignmentInput) -> AssignmentView:
    measured = [lease.throughput_kbps for lease in snapshot.leases if lease.throughput_kbps is not None]
    average = sum(measured) / len(measured) if measured else 0.0
    target = average * len(snapshot.leases) / max(1, len(snapshot.workers))
    lease_throughput = {
        lease.lease_key: average if lease.throughput_kbps is None else lease.throughput_kbps
        for lease in snapshot.leases
    }
    leases_by_owner: dict[str | None, set[str]] = {worker.worker_id: set() for worker in snapshot.workers}
    throughput_by_owner: dict[str | None, float] = {worker.worker_id: 0.0 for worker in snapshot.workers}
    for lease in snapshot.leases:
        owner = lease.actual_owner
        leases_by_owner.setdefault(owner, set()).add(lease.lease_key)
        throughput_by_owner[owner] = throughput_by_owner.get(owner, 0.0) + lease_throughput[lease.lease_key]
    alpha = snapshot.settings.worker_metrics_ema_alpha
    metric_values, operating_range = {}, {}
    for worker in snapshot.workers:
        effective = _effective_metrics(worker, throughput_by_owner[worker.worker_id], target)
        metric_values[worker.worker_id] = {name: ema(values, alpha) for name, values in effective.metrics.items()}
        operating_range[worker.worker_id] = dict(effective.operating_range)
    return AssignmentView(
        average_lease_throughput=average,
        target_average_throughput=target,
        lease_throughput=lease_throughput,
        leases_by_owner={owner: frozenset(keys) for owner, keys in leases_by_owner.items()},
        throughput_by_owner=throughput_by_owner,
        metric_values=metric_values,
        operating_range=operating_range,
    )


def _effective_metrics(worker: WorkerLoad, throughput: float, target_average: float) -> WorkerLoad:
    """A default-metric worker reports its throughput share instead of CPU, so balancing still works."""
    if not worker.is_default_metric_worker:
        return worker
    # KCL divides even when the target is 0 and gets NaN (0/0), which then never compares as a trigger;
    # we say "no load" (r = 0) instead, which is what an idle fleet is.
    ratio = throughput / target_average if target_average > 0 else 0.0
    share = ratio * DEFAULT_METRIC_RANGE
    return WorkerLoad(
        worker.worker_id,
        metrics={THROUGHPUT_METRIC: (share, share)},
        operating_range={THROUGHPUT_METRIC: DEFAULT_METRIC_RANGE},
    )
