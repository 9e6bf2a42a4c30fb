"""What the monitoring UI shows of one application, as JSON documents built from lease_core reads.

`read_application` does the reads (one Scan of the lease table, one of the worker-metrics table and
three GetItems of the coordinator-state table); the document functions are pure over them, so the
API's shape does not depend on where the reads came from.

A worker's `load` is the share of the busiest worker's throughput it carries (lease counts when no
lease has reported throughput yet): the bars of the page, where the busiest worker is full width.
This is the load the `makespan` strategy equalises; CPU, the `variance` strategy's load when slots
report it, is shown beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kinesis_lease.round_plan import plan_round
from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.leader.leader_lock import LockHolder
from lease_core.leader.round_history import RoundHistory
from lease_core.metrics.worker_metrics import CPU_METRIC, NO_SAMPLE, WorkerMetricStats
from lease_core.ops.status import UNASSIGNED, LeaseRow, OwnerRow, status_report
from lease_core.store.lease_store import LeaseScan

ROUNDS_SHOWN = 10
# The lock is only read: the name never writes, it is what LeaderLock requires of a contender.
MONITOR_OWNER = "monitor"


@dataclass(frozen=True)
class ApplicationReads:
    """Everything the documents need of one application, as read from its three tables."""

    config: ConsumerConfig
    scan: LeaseScan
    worker_metrics: tuple[WorkerMetricStats, ...]
    leader: LockHolder | None
    rounds: tuple[dict[str, Any], ...]
    last_round: int | None
    last_round_leases: tuple[dict[str, Any], ...]


def read_application(app: LeaseApplication) -> ApplicationReads:
    """Read the application's tables; a missing table raises `TableNotFoundError` naming it."""
    config = app.config
    lock = app.leader_lock(MONITOR_OWNER)
    history = RoundHistory(app.state_store)
    scan = app.lease_store.scan_leases()  # first, so an application without tables is reported by its lease table
    worker_metrics = tuple(app.worker_metrics.list_all())
    leader = lock.holder()
    rounds = tuple(history.rounds())
    last_round, last_round_leases = history.lease_rows()
    return ApplicationReads(config, scan, worker_metrics, leader, rounds, last_round, tuple(last_round_leases))


def application_document(reads: ApplicationReads) -> dict[str, Any]:
    """The overview of one application: tables, leader, workers with their load, leases, last rounds."""
    config = reads.config
    report = status_report(config.lease_table, reads.scan)
    last_round_rows = {row["lease_key"]: row for row in reads.last_round_leases if "lease_key" in row}
    return {
        "application": config.require_application_name(),
        "tables": {
            "lease": config.lease_table,
            "worker_metrics": config.worker_metrics_table,
            "coordinator_state": config.coordinator_state_table,
        },
        "leader": leader_document(reads.leader),
        "summary": {
            "lease_count": report.lease_count,
            "in_handoff": report.in_handoff,
            "at_shard_end": report.at_shard_end,
            "pending_checkpoints": report.pending_checkpoints,
            "corrupt_items": list(report.corrupt_items),
        },
        "workers": worker_documents(report.owners, reads.worker_metrics, reads.last_round),
        "leases": [lease_document(row, last_round_rows.get(row.lease_key)) for row in report.leases],
        "last_round": reads.last_round,
        "rounds": list(reversed(reads.rounds))[:ROUNDS_SHOWN],
    }


def leader_document(holder: LockHolder | None) -> dict[str, Any] | None:
    """The stored lock record; None when no round holds or held it (a released lock stays visible)."""
    if holder is None:
        return None
    return {
        "owner": holder.owner_name,
        "record_version_number": holder.record_version_number,
        "lease_duration_millis": holder.lease_duration_millis,
        "released": holder.is_released,
    }


def worker_documents(
    owners: Sequence[OwnerRow], metrics: Sequence[WorkerMetricStats], last_round: int | None = None
) -> list[dict[str, Any]]:
    """One row per lease owner and per slot with metrics (a slot may hold no lease this round)."""
    by_owner = {row.owner: row for row in owners}
    by_worker = {stats.worker_id: stats for stats in metrics}
    names = sorted(set(by_owner) | set(by_worker), key=lambda name: (name == UNASSIGNED, name))
    load = _load_measure(owners)
    workers = []
    for name in names:
        row = by_owner.get(name) or OwnerRow(name, leases=0, throughput_kbps=0.0, lease_share=0.0, throughput_share=0.0)
        workers.append(
            {
                "worker_id": name,
                "unassigned": name == UNASSIGNED,
                "leases": row.leases,
                "throughput_kbps": row.throughput_kbps,
                "lease_share": row.lease_share,
                "throughput_share": row.throughput_share,
                "load": load(row),
                **cpu_document(by_worker.get(name), last_round),
            }
        )
    return workers


def _load_measure(owners: Sequence[OwnerRow]) -> Callable[[OwnerRow], float]:
    """A worker's share of the busiest one: by throughput, or by lease count while no lease reports any."""
    busiest_throughput = max((row.throughput_kbps for row in owners), default=0.0)
    if busiest_throughput > 0:
        return lambda row: row.throughput_kbps / busiest_throughput
    most_leases = max((row.leases for row in owners), default=0)
    return lambda row: row.leases / most_leases if most_leases else 0.0


def cpu_document(stats: WorkerMetricStats | None, last_round: int | None = None) -> dict[str, Any]:
    """The slot's utilization history (oldest first) and its figure for the last round; -1 (no
    sample) shows as null, and so does the figure of a slot that read no lease in the last round
    (it wrote nothing then: its latest value is an older round's)."""
    values = stats.stats.get(CPU_METRIC, ()) if stats else ()
    history = [None if value == NO_SAMPLE else value for value in values]
    current = stats is not None and (last_round is None or stats.round == last_round)
    return {
        "cpu_percent": history[-1] if history and current else None,
        "cpu_history": history,
        "metrics_round": stats.round if stats else None,
    }


def lease_document(row: LeaseRow, last_round: Mapping[str, Any] | None) -> dict[str, Any]:
    """A lease's stored state, with what the latest round did to it (records, lag, outcome), if anything."""
    return {
        **asdict(row),
        "last_round": None
        if last_round is None
        else {key: last_round.get(key) for key in ("records", "millis_behind_latest", "outcome", "worker_id")},
    }


def run_settings(params: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer settings a run of the pipeline used, from its params: the DAG's own plan.

    A backfill run consumes under its own application name, so the plan decides, not the
    `application_name` param alone. A missing or invalid param raises `ConfigurationError` naming it.
    """
    return plan_round(params).settings


def run_document(dag_id: str, run_id: str, reads: ApplicationReads) -> dict[str, Any]:
    """A DAG run's view: its application's overview and the round summary the run wrote, if it has yet."""
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "round": next((summary for summary in reads.rounds if summary.get("run_id") == run_id), None),
        "overview": application_document(reads),
    }
