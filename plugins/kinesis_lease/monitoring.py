"""What the monitoring UI shows of one application, as JSON documents built from lease_core reads.

`read_application` does the reads (one Scan of the lease table, one of the worker-metrics table, five
GetItems of the coordinator-state table and one more per stream it consumes, for the stream's enhanced
fan-out consumer record, and a DescribeStreamConsumer per record); the document functions are pure
over them, so the API's shape does not depend on where the reads came from. `ReadsCache` keeps the reads of the last
few applications for a few seconds, so that paging through 10,000 leases does not scan the lease
table per page.

The overview (`application_document`) has no lease list: the leases come a page at a time from
`leases_document`, sorted and filtered over the cached reads (`LeaseQuery`).

A worker's `load` is the share of the busiest worker's throughput it carries (lease counts when no
lease has reported throughput yet): the bars of the page, where the busiest worker is full width.
This is the load the `makespan` strategy equalises; CPU, the `variance` strategy's load when slots
report it, is shown beside it, and only for a slot that read a lease in the last round that read
any and holds a lease now (a slot that holds none carries no load, whatever it measured before).

The leader: the `Leader` item says who holds or held the lock. Its time is our `heartbeatAt`
attribute, which every acquire and heartbeat of ours writes (`lease_core.leader.leader_lock`; KCL's
lock client ignores it and writes none), so `running` is true only while the lock is not released
and its last write is at most one lease duration old (a lock without `heartbeatAt`: until the
shared `LeaderObservation` shows it unchanged for longer than its lease, the contenders' own rule).
A round releases the lock by deleting the item, as KCL does; the last leader is then the newest
round history entry's `leader` (its owner name, kept since this release) at that round's
`finished_at`. Entries written before have no `leader`: the owner is then null. Rounds heartbeat
only while one of their steps runs, so a lock whose heartbeat is older than its lease still counts
as running while its owner's DAG run (`<dag id>/<run id>/<token>`) runs in Airflow.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any
from urllib.parse import quote

from kinesis_lease.round_plan import plan_round
from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.leader.leader_lock import LockHolder, SharedObservation, wall_clock_millis
from lease_core.leader.round_history import RoundHistory
from lease_core.metrics.freshness import ages_at_newest_round
from lease_core.metrics.worker_metrics import CPU_METRIC, NO_SAMPLE, WorkerMetricStats
from lease_core.model.stream_consumer import StreamConsumerState
from lease_core.ops.status import (
    UNASSIGNED,
    LeaseRow,
    OwnerRow,
    StatusReport,
    consumed_stream_names,
    status_report,
)
from lease_core.store.lease_store import LeaseScan
from lease_core.store.table_layout import CONFLICT, SINGLE

ROUNDS_SHOWN = 100
# The lock is only read: the name never writes, it is what LeaderLock requires of a contender.
MONITOR_OWNER = "monitor"
# The `outcome` filter's name for the leases the last round did not read.
NOT_READ = "(not read)"
# ... and for the leases whose row did not fit the last round's record (`RoundHistory`): not known.
NOT_KEPT = "(not kept)"
NOT_KEPT_ROW: Mapping[str, Any] = {"outcome": NOT_KEPT}
SORT_FIELDS = ("lease_key", "owner", "throughput_kbps", "lag", "freshness", "records", "outcome", "lease_counter")
MAX_PAGE = 1000
# What a round's entry shows, each null when the entry (written by an older release) lacks it.
ROUND_FIELDS = (
    "round",
    "run_id",
    "dag_id",
    "leader",
    "finished_at",
    "consumed",
    "records",
    "bytes",
    "files",
    "seconds",
    "leases",
    "leases_behind",
    "max_millis_behind_latest",
    # Freshness at the round's end (docs/metrics.md), and whether the round succeeded.
    "oldest_unlanded_age_millis",
    "newest_landed_age_millis",
    "succeeded",
    "outcomes",
    "lost_leases",
    "failed_leases",
    "retention_losses",
    "dead_lettered",
    "possibly_unread",
    "corrupt_leases",
    "moves",
    "busiest_over_bound",
    "slots",
    "snapshot_id",
    "table_commits",
    "output",
    "error",
    "failures",
    "metrics",  # what the round's publication to CloudWatch and Airflow's metrics backend did
)
_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True)
class ApplicationReads:
    """Everything the documents need of one application, as read from its three tables, and when."""

    config: ConsumerConfig
    scan: LeaseScan
    worker_metrics: tuple[WorkerMetricStats, ...]
    leader: LockHolder | None
    rounds: tuple[dict[str, Any], ...]
    last_round: int | None
    last_round_leases: tuple[dict[str, Any], ...]
    leader_observation: SharedObservation | None = None
    read_at_millis: int = 0
    last_round_left_out: int = 0  # rows of the last round that did not fit its record (round_history)
    stream_consumers: tuple[StreamConsumerState, ...] = ()  # the application's fan-out consumers
    table_layout: Mapping[str, Any] = field(default_factory=dict)  # `LeaseApplication.layout_document`

    @cached_property
    def report(self) -> StatusReport:
        return status_report(self.config.lease_table, self.scan)

    @cached_property
    def leases(self) -> tuple[dict[str, Any], ...]:
        """Every lease's document, in natural lease-key order (`shardId-...10` after `...9`)."""
        rows = {row["lease_key"]: row for row in self.last_round_leases if "lease_key" in row}
        # Without its row, a lease was not read, unless rows were left out: then it is not known.
        missing = NOT_KEPT_ROW if self.last_round_left_out else None
        newest = self.rounds[-1] if self.rounds else None
        documents = [lease_document(row, rows.get(row.lease_key, missing), newest) for row in self.report.leases]
        return tuple(sorted(documents, key=lambda document: natural_key(document["lease_key"])))


def read_application(app: LeaseApplication, now_millis: Callable[[], int] = wall_clock_millis) -> ApplicationReads:
    """Read the application's tables; a missing table raises `TableNotFoundError` naming it. Tables that
    hold both layouts show their leases and the conflict alone: where the rest is kept cannot be told."""
    config = app.config
    scan = app.lease_store.scan_leases()  # first, so an application without tables is reported by its lease table
    layout = app.layout_document()
    if layout["layout"] == CONFLICT:
        return ApplicationReads(config, scan, (), None, (), None, (), read_at_millis=now_millis(), table_layout=layout)
    lock = app.leader_lock(MONITOR_OWNER)
    history = RoundHistory(app.state_store)
    worker_metrics = tuple(app.worker_metrics.list_all())
    leader = lock.holder()
    observation = lock.observation() if leader is not None and leader.heartbeat_at_millis is None else None
    rounds = tuple(history.rounds())
    last_round, last_round_leases, left_out = history.kept_lease_rows()
    consumers = app.stream_consumers.describe_streams(consumed_stream_names(scan.leases, app.state_store))
    return ApplicationReads(
        config,
        scan,
        worker_metrics,
        leader,
        rounds,
        last_round,
        tuple(last_round_leases),
        observation,
        now_millis(),
        left_out,
        tuple(consumers),
        layout,
    )


# --- the overview -------------------------------------------------------------------------------


def _tables(config: ConsumerConfig, layout: str | None) -> dict[str, str]:
    """The application's tables by role; in the single layout all three roles are the lease table's."""
    if layout == SINGLE:
        return dict.fromkeys(("lease", "worker_metrics", "coordinator_state"), config.lease_table)
    return {
        "lease": config.lease_table,
        "worker_metrics": config.worker_metrics_table,
        "coordinator_state": config.coordinator_state_table,
    }


@dataclass(frozen=True)
class RunLinks:
    """What the Airflow metadata database says of the rounds' DAG runs: state by (dag id, run id),
    and the Airflow UI's root path (the `{root}/dags/{dag}/runs/{run}` of a run's page)."""

    states: Mapping[tuple[str, str], str | None] = field(default_factory=dict)
    ui_root: str = ""

    def dag_of(self, run_id: str) -> str | None:
        """The DAG of an entry that does not name one (an older release's): the only DAG with that run."""
        dags = {dag_id for dag_id, run in self.states if run == run_id}
        return dags.pop() if len(dags) == 1 else None


def application_document(reads: ApplicationReads, runs: RunLinks | None = None) -> dict[str, Any]:
    """The overview of one application: tables, leader, summary, workers with their load, last rounds."""
    config = reads.config
    report = reads.report
    application = config.require_application_name()
    return {
        "application": application,
        "tables": _tables(config, reads.table_layout.get("layout")),
        "table_layout": dict(reads.table_layout),
        "now_millis": reads.read_at_millis,
        "leader": leader_document(reads, runs or RunLinks()),
        "summary": {
            "lease_count": report.lease_count,
            "in_handoff": report.in_handoff,
            "at_shard_end": report.at_shard_end,
            "pending_checkpoints": report.pending_checkpoints,
            "corrupt_items": [
                {"lease_key": error.lease_key, "attribute": error.attribute, "problem": error.problem}
                for error in reads.scan.corrupt
            ],
        },
        "workers": worker_documents(
            report.owners,
            reads.worker_metrics,
            reads.last_round,
            None if reads.last_round_left_out else _readers(reads.last_round_leases),
        ),
        "stream_consumers": [consumer.to_dict() for consumer in reads.stream_consumers],
        "last_round": reads.last_round,
        "rounds": [
            round_document(entry, application, runs or RunLinks()) for entry in reversed(reads.rounds[-ROUNDS_SHOWN:])
        ],
    }


def leader_document(reads: ApplicationReads, runs: RunLinks) -> dict[str, Any] | None:
    """Who holds or last held the lock, whether a round holds it now, and when that owner was last
    seen (`seen_at`: its heartbeat, or the finish of its round once released; module docstring).
    None when no round ever took it."""
    newest = reads.rounds[-1] if reads.rounds else None
    last_round_at = newest.get("finished_at") if newest else None
    holder = reads.leader
    if holder is None:
        if newest is None:
            return None
        return {
            "owner": newest.get("leader"),
            "released": True,
            "running": False,
            "lease_duration_millis": None,
            "heartbeat_at": None,
            "seen_at": last_round_at,
            "last_round_at": last_round_at,
        }
    live = holder.is_live(reads.read_at_millis, reads.leader_observation)
    run = owner_run(holder.owner_name)
    return {
        "owner": holder.owner_name,
        "released": holder.is_released,
        # Between two steps nobody heartbeats: the owner's DAG run, still running, says the round is.
        "running": not holder.is_released and (live or (run is not None and runs.states.get(run) == "running")),
        "lease_duration_millis": holder.lease_duration_millis,
        "heartbeat_at": holder.heartbeat_at_millis,
        "seen_at": holder.heartbeat_at_millis,
        "last_round_at": last_round_at,
    }


def owner_run(owner: str) -> tuple[str, str] | None:
    """The (DAG id, run id) of a lock owner named `<dag id>/<run id>/<token>` as the pipeline's
    rounds name it (a DAG id has no '/'); None for another owner (leasectl, KCL)."""
    dag_id, _, rest = owner.partition("/")
    run_id, _, token = rest.rpartition("/")
    return (dag_id, run_id) if dag_id and run_id and token else None


def worker_documents(
    owners: Sequence[OwnerRow],
    metrics: Sequence[WorkerMetricStats],
    last_round: int | None = None,
    readers: frozenset[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per lease owner and per slot with metrics (a slot may hold no lease this round).

    `readers`: the slots that read a lease in round `last_round` (None: not known, every slot with
    metrics of that round counts as one)."""
    by_owner = {row.owner: row for row in owners}
    by_worker = {stats.worker_id: stats for stats in metrics}
    names = sorted(set(by_owner) | set(by_worker), key=lambda name: (name == UNASSIGNED, name))
    load = _load_measure(owners)
    workers = []
    for name in names:
        row = by_owner.get(name) or OwnerRow(name, leases=0, throughput_kbps=0.0, lease_share=0.0, throughput_share=0.0)
        read = row.leases > 0 and (readers is None or name in readers)
        workers.append(
            {
                "worker_id": name,
                "unassigned": name == UNASSIGNED,
                "leases": row.leases,
                "throughput_kbps": row.throughput_kbps,
                "lease_share": row.lease_share,
                "throughput_share": row.throughput_share,
                "load": load(row),
                **cpu_document(by_worker.get(name), last_round, read),
            }
        )
    return workers


def _readers(rows: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(row["worker_id"] for row in rows if row.get("worker_id"))


def _load_measure(owners: Sequence[OwnerRow]) -> Callable[[OwnerRow], float]:
    """A worker's share of the busiest one: by throughput, or by lease count while no lease reports any."""
    busiest_throughput = max((row.throughput_kbps for row in owners), default=0.0)
    if busiest_throughput > 0:
        return lambda row: row.throughput_kbps / busiest_throughput
    most_leases = max((row.leases for row in owners), default=0)
    return lambda row: row.leases / most_leases if most_leases else 0.0


def cpu_document(stats: WorkerMetricStats | None, last_round: int | None = None, read: bool = True) -> dict[str, Any]:
    """The slot's utilization history (oldest first) and its figure for the last round; -1 (no
    sample) shows as null, and so does the figure of a slot that did not `read` (it read no lease in
    the last round, or holds none now) or whose metrics are an older round's (it wrote none then:
    its latest value is an older round's)."""
    values = stats.stats.get(CPU_METRIC, ()) if stats else ()
    history = [None if value == NO_SAMPLE else value for value in values]
    current = read and stats is not None and (last_round is None or stats.round == last_round)
    return {
        "cpu_percent": history[-1] if history and current else None,
        "cpu_history": history,
        "metrics_round": stats.round if stats else None,
    }


def round_document(entry: Mapping[str, Any], application: str, runs: RunLinks) -> dict[str, Any]:
    """A kept round's summary with every field (null when an older release did not write it), whether it
    was idle (the sync found nothing to read, so nothing was consumed), its DAG run's state and page."""
    run_id: str | None = entry.get("run_id")
    dag_id: str | None = entry.get("dag_id") or (runs.dag_of(run_id) if run_id else None)
    run = (dag_id, run_id) if dag_id and run_id else None
    return {
        **dict.fromkeys(ROUND_FIELDS),
        **entry,
        "dag_id": dag_id,
        "idle": entry.get("consumed") is False,
        "slots": slot_documents(entry.get("slots"), application),
        "state": runs.states.get(run) if run else None,
        "run_url": f"{runs.ui_root}/dags/{quote(run[0], safe='')}/runs/{quote(run[1], safe='')}" if run else None,
    }


def slot_documents(slots: Any, application: str) -> list[dict[str, Any]] | None:
    """A round's per-slot rows as objects, from the compact columns (`round_report.history_figures`)
    or an older release's objects; None when the entry has none (an idle round, or one whose rows
    made way for newer rounds')."""
    if slots is None:
        return None
    rows = [dict(zip(slots["columns"], row)) for row in slots["rows"]] if isinstance(slots, Mapping) else slots
    documents = []
    for row in rows:
        slot = row.get("slot", row.get("worker_id"))
        cpu = row.get("cpu_percent")
        documents.append(
            {
                "worker_id": f"{application}-worker-{slot}" if isinstance(slot, int) else slot,
                **{name: row.get(name) for name in ("leases", "records", "bytes", "seconds")},
                "cpu_percent": None if cpu is None or cpu == NO_SAMPLE else cpu,
            }
        )
    return documents


# --- the leases ---------------------------------------------------------------------------------


def lease_document(
    row: LeaseRow, last_round: Mapping[str, Any] | None, newest_round: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A lease's stored state, with what the latest round did to it (records, lag, outcome, the error
    that stopped it and the records it dead-lettered), if anything, and its freshness at the end of
    the newest round (`newest_round`, the history's last entry)."""
    return {
        **{name: getattr(row, name) for name in _LEASE_ROW_FIELDS},
        "last_round": None if last_round is None else _last_round_document(last_round, newest_round),
    }


def _last_round_document(row: Mapping[str, Any], newest_round: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a lease shows of its last round's row. A row without an outcome is a lease the round did not
    read, kept for its freshness (`lease_core.metrics.freshness.fresh_lease_rows`)."""
    return (
        {key: row.get(key) for key in _LAST_ROUND_FIELDS}
        | ages_at_newest_round(row, newest_round)
        | {"outcome": row.get("outcome") or NOT_READ}
    )


_LEASE_ROW_FIELDS = tuple(field.name for field in fields(LeaseRow))
# What a lease shows of its last round's row, each null when the row (an older release's) lacks it.
_LAST_ROUND_FIELDS = (
    "records",
    "millis_behind_latest",
    "oldest_unlanded_age_millis",
    "newest_landed_age_millis",
    "outcome",
    "worker_id",
    "error",
    "dead_lettered",
)


@dataclass(frozen=True)
class LeaseQuery:
    """One page of the leases: `sort` one of `SORT_FIELDS`, `order` "asc" or "desc"; `owner` an owner
    name or `UNASSIGNED`, `outcome` a last-round outcome or `NOT_READ`, `q` a case-insensitive part of
    the lease key or owner. Leases without the sorted value come last in either order; ties are in
    natural lease-key order."""

    offset: int = 0
    limit: int = 100
    sort: str = "lease_key"
    order: str = "asc"
    owner: str | None = None
    outcome: str | None = None
    q: str | None = None

    def __post_init__(self) -> None:
        problems = {
            "offset": self.offset < 0,
            "limit": not 1 <= self.limit <= MAX_PAGE,
            "sort": self.sort not in SORT_FIELDS,
            "order": self.order not in ("asc", "desc"),
        }
        for name, wrong in problems.items():
            if wrong:
                raise ValueError(f"invalid {name}: {getattr(self, name)!r}")


def leases_document(reads: ApplicationReads, query: LeaseQuery) -> dict[str, Any]:
    """A page of the application's leases, with the owners and outcomes the filters can take."""
    every = reads.leases
    chosen = _sorted([lease for lease in every if _matches(lease, query)], query.sort, query.order == "desc")
    outcomes = {_outcome(lease) for lease in every}
    return {
        "application": reads.config.require_application_name(),
        "now_millis": reads.read_at_millis,
        "last_round": reads.last_round,
        "total": len(every),
        "filtered": len(chosen),
        "offset": query.offset,
        "limit": query.limit,
        "sort": query.sort,
        "order": query.order,
        "leases": chosen[query.offset : query.offset + query.limit],
        "owners": [row.owner for row in reads.report.owners],
        "outcomes": sorted(outcome for outcome in outcomes if outcome not in (NOT_READ, NOT_KEPT))
        + [name for name in (NOT_KEPT, NOT_READ) if name in outcomes],
    }


def natural_key(text: str) -> tuple[Any, ...]:
    """`text` in natural order: digit runs compare as numbers (`shardId-9` < `shardId-10`)."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(text))


def _matches(lease: Mapping[str, Any], query: LeaseQuery) -> bool:
    if query.owner is not None and (lease["owner"] or UNASSIGNED) != query.owner:
        return False
    if query.outcome is not None and _outcome(lease) != query.outcome:
        return False
    if query.q:
        needle = query.q.casefold()
        return any(needle in (lease[name] or "").casefold() for name in ("lease_key", "owner", "checkpoint_owner"))
    return True


def _outcome(lease: Mapping[str, Any]) -> str:
    return lease["last_round"]["outcome"] if lease["last_round"] else NOT_READ


_SORT_VALUES: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "owner": lambda lease: lease["owner"],
    "throughput_kbps": lambda lease: lease["throughput_kbps"],
    "lag": lambda lease: lease["last_round"] and lease["last_round"]["millis_behind_latest"],
    "freshness": lambda lease: lease["last_round"] and lease["last_round"]["oldest_unlanded_age_millis"],
    "records": lambda lease: lease["last_round"] and lease["last_round"]["records"],
    "outcome": lambda lease: lease["last_round"] and lease["last_round"]["outcome"],
    "lease_counter": lambda lease: lease["lease_counter"],
}


def _sorted(leases: list[dict[str, Any]], sort: str, descending: bool) -> list[dict[str, Any]]:
    """`leases` (in natural key order) by `sort`; Python's sort is stable, in reverse too, so ties keep
    the natural order and values that are missing stay last."""
    if sort == "lease_key":
        return leases[::-1] if descending else leases
    value = _SORT_VALUES[sort]
    present = [lease for lease in leases if value(lease) is not None]
    present.sort(key=value, reverse=descending)
    return present + [lease for lease in leases if value(lease) is None]


# --- a DAG run's view ---------------------------------------------------------------------------


def run_settings(params: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer settings a run of the pipeline used, from its params: the DAG's own plan.

    A backfill run consumes under its own application name, so the plan decides, not the
    `application_name` param alone. A missing or invalid param raises `ConfigurationError` naming it.
    """
    return plan_round(params).settings


def run_document(dag_id: str, run_id: str, reads: ApplicationReads, runs: RunLinks | None = None) -> dict[str, Any]:
    """A DAG run's view: the application it consumed as, its overview and the round the run wrote, if it has yet."""
    overview = application_document(reads, runs)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "application": overview["application"],
        "round": next(
            (entry for entry in overview["rounds"] if entry["run_id"] == run_id and entry["dag_id"] in (dag_id, None)),
            None,
        ),
        "overview": overview,
    }


# --- the cache of reads -------------------------------------------------------------------------


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    reads: ApplicationReads | None = None
    started: float = 0.0  # when the kept reads started and finished (monotonic seconds)
    finished: float = 0.0


class ReadsCache:
    """The latest reads of the last `max_entries` applications, each served for `ttl_seconds`.

    A page of leases is a slice of a Scan of the whole lease table, so paging must not scan again:
    reads are served for `ttl_seconds` after they finished (a Scan of 10,000 leases on moto takes
    longer than the TTL), and a `fresh` call (the overview's refresh, `?fresh=1`) takes only reads
    that started after it was made. Callers of one key wait for one read instead of each making
    their own. Thread-safe: FastAPI runs the routes in a thread pool. Evicts the least recently used key.
    """

    def __init__(
        self, ttl_seconds: float = 5.0, max_entries: int = 8, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._clock = clock
        self._slots: OrderedDict[Any, _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, read: Callable[[], ApplicationReads], fresh: bool = False) -> ApplicationReads:
        asked = self._clock()
        slot = self._slot(key)
        with slot.lock:
            kept = slot.reads is not None and (
                slot.started >= asked if fresh else asked - slot.finished <= self.ttl_seconds
            )
            if kept and slot.reads is not None:
                return slot.reads
            started = self._clock()
            try:
                reads = read()  # an error leaves the kept reads as they were
            except BaseException:
                if slot.reads is None:  # nothing to keep (a mistyped name): make no room for it
                    self._forget(key, slot)
                raise
            slot.reads, slot.started, slot.finished = reads, started, self._clock()
            return reads

    def _forget(self, key: Any, slot: _Slot) -> None:
        with self._lock:
            if self._slots.get(key) is slot:
                del self._slots[key]

    def _slot(self, key: Any) -> _Slot:
        with self._lock:
            slot = self._slots.pop(key, None) or _Slot()
            self._slots[key] = slot
            while len(self._slots) > self.max_entries:
                self._slots.popitem(last=False)
            return slot
