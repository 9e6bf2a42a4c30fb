"""One assignment round of the leader: load, decide, write, remember (docs/protocol.md §4.1).

The round's workers are the slots `<app>-worker-0..W-1` (or any listed ids). A lease whose actual
owner is not an active slot is up for grabs. The decider is chosen by `lease_assignment_strategy`;
its plan is written lease by lease with `assign_lease` (owner-conditional, fences the previous
owner), or with a graceful handoff when the current owner is a slot that is running right now.
Lost conditions are counted, not raised.

What the leader remembers between rounds is a `RoundSnapshot` in the coordinator-state table: the
round number and who assigned it, when, every lease's counter, and since when each handoff has been
in progress. KCL's leader watches counters between its runs to find dead workers (docs/protocol.md
§4.1); a batch leader compares with the snapshot instead (`judge_leases`):
- a lease whose actual owner says it is running (`running_workers`) but whose counter has not moved
  since a snapshot older than the failover time is expired, like an unowned one;
- a handoff always finishes: when its checkpoint owner is not running, has stopped renewing, or has
  held the handoff longer than the handoff timeout plus the failover time, the lease is assigned
  plainly (clearing `checkpointOwner`), to where the decider places it; between rounds no slot runs,
  so every handoff found then is finished.
A retry of the same round (the same `round_owner`, e.g. an Airflow retry of the assign step) keeps
its round number.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from lease_core.assignment.decision import AssignmentInput, AssignmentPlan, AssignmentSettings
from lease_core.assignment.strategies import balances_in_round, decider_for
from lease_core.assignment.view import build_view
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import LeaseCoreError
from lease_core.metrics.worker_metrics import CPU_METRIC, WorkerMetricsStore, active_workers
from lease_core.model.lease import Lease
from lease_core.store.compressed_json import compress_map, decompress_map
from lease_core.store.coordinator_state import CoordinatorStateStore, update_record
from lease_core.store.lease_store import LeaseStore, WriteResult
from lease_core.store.load_probes import LOAD_PROBES_KEY, load_probes_of
from lease_core.store.record_table import Record, whole_number

log = logging.getLogger(__name__)

ROUND_KEY = "AssignmentRound"
# Every lease's counter, compressed (store/compressed_json.py says why).
COUNTERS = "leaseCountersZ"
FORMER_COUNTERS = "leaseCounters"  # the former format, a map: still read


def with_load_probes(leases: Sequence[Lease], probes: Mapping[str, float]) -> list[Lease]:
    """The leases as the decider should see them: one with no throughput yet carries its probe's
    figure, if it has one (the others get the average, docs/protocol.md §4.2)."""
    return [
        lease.replace(throughput_kbps=probes[lease.lease_key])
        if lease.throughput_kbps is None and lease.lease_key in probes
        else lease
        for lease in leases
    ]


def current_round(state: CoordinatorStateStore) -> int:
    """The round the last assignment wrote (0 before the first assignment)."""
    return RoundSnapshot.from_item(state.get(ROUND_KEY)).round_number


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
    # Items of the lease table that are not readable leases, each with its bad attribute: not assigned.
    corrupt_leases: tuple[str, ...] = ()
    # Workers (not slots of this round) whose metrics items had not been updated for
    # `stale_worker_metrics_entry_cleanup_duration_millis`, deleted by this round.
    deleted_worker_metrics: tuple[str, ...] = ()

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
        rebalance_min_effect_percentage=config.rebalance_min_effect_percentage,
        max_moves_per_round=config.makespan_max_moves_per_round or None,
    )


def up_for_grabs(leases: Sequence[Lease], active: set[str], expired: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Leases with no actual owner first (never owned), then those of slots that are not active or
    that stopped renewing them (`expired`)."""
    unowned = sorted(lease.lease_key for lease in leases if lease.actual_owner is None)
    orphaned = sorted(
        lease.lease_key
        for lease in leases
        if lease.actual_owner is not None and (lease.actual_owner not in active or lease.lease_key in expired)
    )
    return (*unowned, *orphaned)


@dataclass(frozen=True)
class HandoffSeen:
    """A handoff in progress as a round saw it, and since when (epoch ms) it has been seen so."""

    lease_owner: str
    checkpoint_owner: str
    since_millis: int


@dataclass(frozen=True)
class RoundSnapshot:
    """What the leader remembers of the last assignment round (the `AssignmentRound` record)."""

    round_number: int = 0
    assigned_at_millis: int = 0
    round_owner: str | None = None
    lease_counters: Mapping[str, int] = field(default_factory=dict)
    handoffs: Mapping[str, HandoffSeen] = field(default_factory=dict)

    @classmethod
    def from_item(cls, item: Record | None) -> RoundSnapshot:
        if item is None:
            return cls()
        handoffs = {
            key: HandoffSeen(value["leaseOwner"], value["checkpointOwner"], int(value["since"]))
            for key, value in item.get("handoffs", {}).items()
        }
        return cls(
            round_number=whole_number(item, "round"),
            assigned_at_millis=whole_number(item, "assignedAt"),
            round_owner=item.get("roundOwner"),
            lease_counters=_lease_counters_of(item),
            handoffs=handoffs,
        )

    def to_item(self) -> Record:
        item: Record = {
            "round": self.round_number,
            "assignedAt": self.assigned_at_millis,
            COUNTERS: compress_map(self.lease_counters),
            "handoffs": {
                key: {
                    "leaseOwner": seen.lease_owner,
                    "checkpointOwner": seen.checkpoint_owner,
                    "since": seen.since_millis,
                }
                for key, seen in self.handoffs.items()
            },
        }
        if self.round_owner is not None:
            item["roundOwner"] = self.round_owner
        return item

    def next(
        self, round_number: int, round_owner: str | None, now_millis: int, leases: Sequence[Lease]
    ) -> RoundSnapshot:
        """The snapshot of a round assigned now; a handoff keeps its `since` while its pair is unchanged."""
        handoffs = {}
        for lease in leases:
            if lease.lease_owner is None or lease.checkpoint_owner is None:
                continue
            seen = self.handoffs.get(lease.lease_key)
            unchanged = seen is not None and (seen.lease_owner, seen.checkpoint_owner) == (
                lease.lease_owner,
                lease.checkpoint_owner,
            )
            handoffs[lease.lease_key] = HandoffSeen(
                lease.lease_owner,
                lease.checkpoint_owner,
                seen.since_millis if seen is not None and unchanged else now_millis,
            )
        counters = {lease.lease_key: lease.lease_counter for lease in leases}
        return RoundSnapshot(round_number, now_millis, round_owner, counters, handoffs)


def _lease_counters_of(item: Record) -> dict[str, int]:
    if COUNTERS in item:
        return {key: int(value) for key, value in decompress_map(bytes(item[COUNTERS])).items()}
    return {key: int(value) for key, value in item.get(FORMER_COUNTERS, {}).items()}


@dataclass(frozen=True)
class LeaseJudgement:
    """expired: owned by a running worker that stopped renewing them. finish_handoff: handoffs to
    finish with a plain assignment. blocked_on_handoff: handoffs still in progress, left alone."""

    expired: frozenset[str] = frozenset()
    finish_handoff: frozenset[str] = frozenset()
    blocked_on_handoff: frozenset[str] = frozenset()


def judge_leases(
    leases: Sequence[Lease],
    previous: RoundSnapshot,
    running_workers: frozenset[str],
    now_millis: int,
    failover_time_millis: int,
    handoff_timeout_millis: int,
) -> LeaseJudgement:
    """Pure: which leases the round must treat as expired, which handoffs it finishes (module doc)."""
    silent_for = now_millis - previous.assigned_at_millis

    def stopped_renewing(lease: Lease) -> bool:
        counter = previous.lease_counters.get(lease.lease_key)
        return counter == lease.lease_counter and silent_for > failover_time_millis

    expired = {
        lease.lease_key
        for lease in leases
        if lease.actual_owner in running_workers and not lease.is_at_shard_end and stopped_renewing(lease)
    }
    finish, blocked = set(), set()
    for lease in leases:
        if not lease.is_in_handoff:
            continue
        seen = previous.handoffs.get(lease.lease_key)
        stuck = (
            seen is not None
            and (seen.lease_owner, seen.checkpoint_owner) == (lease.lease_owner, lease.checkpoint_owner)
            and now_millis - seen.since_millis > handoff_timeout_millis + failover_time_millis
        )
        if lease.checkpoint_owner not in running_workers or lease.lease_key in expired or stuck:
            finish.add(lease.lease_key)
        else:
            blocked.add(lease.lease_key)
    return LeaseJudgement(frozenset(expired - finish), frozenset(finish), frozenset(blocked))


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

    def run(
        self,
        worker_ids: Sequence[str],
        running_workers: frozenset[str] = frozenset(),
        round_owner: str | None = None,
    ) -> AssignmentReport:
        """One assignment round for `worker_ids`; `running_workers` are slots working right now.

        `round_owner` names the round (the DAG run's leader owner); a second run with the same owner
        is a retry of the same round and keeps its number.
        """
        if not worker_ids:
            raise ValueError("an assignment round needs at least one worker")
        previous = RoundSnapshot.from_item(self.state.get(ROUND_KEY))
        retry = round_owner is not None and previous.round_owner == round_owner
        round_number = previous.round_number if retry else previous.round_number + 1
        scan = self.store.scan_leases()
        leases = list(scan.leases)
        stale_before = (self.clock_millis() - self.config.stale_worker_metrics_entry_cleanup_duration_millis) // 1000
        stored, stale = self.metrics.read_for_round(worker_ids, stale_before)
        workers, notes = active_workers(worker_ids, stored, round_number)
        active = {worker.worker_id for worker in workers}
        judgement = judge_leases(
            leases,
            previous,
            running_workers,
            self.clock_millis(),
            self.config.failover_time_millis,
            self.config.graceful_lease_handoff_timeout_millis,
        )
        probes = load_probes_of(self.state.get(LOAD_PROBES_KEY))
        snapshot = AssignmentInput(
            leases=tuple(with_load_probes(leases, probes)),
            workers=tuple(workers),
            up_for_grabs=up_for_grabs(leases, active, judgement.expired | judgement.finish_handoff),
            balance=balances_in_round(
                self.config.lease_assignment_strategy, round_number, self.config.variance_balancing_frequency
            ),
            settings=settings_of(self.config),
            blocked_on_handoff=judgement.blocked_on_handoff,
            seed=round_number,
        )
        plan = decider_for(self.config.lease_assignment_strategy).decide(snapshot)
        by_key = {lease.lease_key: lease for lease in leases}
        written = self._write(plan, by_key, snapshot, running_workers, judgement.finish_handoff)
        planned = {move.lease_key for move, _ in written}
        written += self._finish_handoffs(judgement.finish_handoff - planned, by_key, active)
        moves = tuple(move for move, _ in written)
        self._remember(previous, round_number, round_owner, leases_after_writes(leases, written))
        deleted = self._delete_stale_worker_metrics(stale)
        return AssignmentReport(
            strategy=self.config.lease_assignment_strategy,
            round_number=round_number,
            balanced=snapshot.balance,
            moves=moves,
            workers=_worker_rows(snapshot, moves, notes, worker_ids),
            spillover=plan.spillover,
            lost_conditions=sum(not move.applied for move in moves),
            excluded_workers={worker: notes[worker] for worker in worker_ids if worker not in active},
            corrupt_leases=tuple(str(error) for error in scan.corrupt),
            deleted_worker_metrics=deleted,
        )

    def _delete_stale_worker_metrics(self, stale: Mapping[str, int]) -> tuple[str, ...]:
        """Delete the worker-metrics items `read_for_round` found stale, each only if its `lut` is still
        the one read (a zombie slot that wrote since keeps its item), as KCL's leader does (§5.2).
        A worker whose item goes publishes again at the end of its next task. Housekeeping: a delete
        that fails (throttled past its retries, refused by a role without DeleteItem on the table) is
        logged and left to the next round, never a reason to fail this one."""
        deleted: list[str] = []
        for worker, lut in sorted(stale.items()):
            try:
                if self.metrics.delete_if_unchanged(worker, lut):
                    deleted.append(worker)
            except LeaseCoreError as error:
                log.warning("could not delete the stale worker metrics of %s: %s", worker, error)
        if deleted:
            log.info("deleted stale worker metrics (stale_worker_metrics_entry_cleanup_duration_millis): %s", deleted)
        return tuple(deleted)

    def _write(
        self,
        plan: AssignmentPlan,
        by_key: Mapping[str, Lease],
        snapshot: AssignmentInput,
        running_workers: frozenset[str],
        finishing_handoff: frozenset[str],
    ) -> tuple[tuple[MoveRow, WriteResult], ...]:
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
            reason = "handoff finished" if move.lease_key in finishing_handoff else move.reason
            row = MoveRow(
                move.lease_key,
                move.from_owner,
                move.to_owner,
                reason,
                "handoff" if handoff else "assign",
                result.applied,
            )
            rows.append((row, result))
        return tuple(rows)

    def _finish_handoffs(
        self, keys: frozenset[str], by_key: Mapping[str, Lease], active: set[str]
    ) -> tuple[tuple[MoveRow, WriteResult], ...]:
        """Handoffs the plan left where they are: assigned plainly, which clears `checkpointOwner` so
        that the lease is read again; to the owner the decider saw (the old one) when it is an active
        slot, else to the handoff's target (the decider could not place it: limits reached)."""
        rows = []
        for key in sorted(keys):
            lease = by_key[key]
            owner = lease.actual_owner if lease.actual_owner in active else lease.lease_owner
            assert owner is not None  # a lease in handoff has both owners
            result = self.store.assign_lease(lease, owner)
            row = MoveRow(key, lease.checkpoint_owner, owner, "handoff finished", "assign", result.applied)
            rows.append((row, result))
        return tuple(rows)

    def _remember(
        self, previous: RoundSnapshot, round_number: int, round_owner: str | None, leases: Sequence[Lease]
    ) -> None:
        """Keep the round's snapshot, unless a newer round was assigned meanwhile (conditional write)."""
        now = self.clock_millis()

        def change(record: Record | None) -> Record | None:
            stored = RoundSnapshot.from_item(record)
            if stored.round_number > round_number or (
                stored.round_number == round_number and stored.round_owner != round_owner
            ):
                return None
            return previous.next(round_number, round_owner, now, leases).to_item()

        update_record(self.state, ROUND_KEY, change)


def leases_after_writes(leases: Sequence[Lease], written: Sequence[tuple[MoveRow, WriteResult]]) -> list[Lease]:
    """Pure: the leases as the round's writes left them, without scanning the table again.

    An applied write answers with the lease it stored, a lost condition with the lease that beat it,
    or with nothing when the lease is gone. A lease someone renewed meanwhile keeps its older counter
    here: the next round then sees its counter move, which only ever delays an expiry.
    """
    after: dict[str, Lease | None] = {lease.lease_key: lease for lease in leases}
    for move, result in written:
        after[move.lease_key] = result.lease
    return [lease for lease in after.values() if lease is not None]


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
    cpu = {
        worker.worker_id: view.metric_values.get(worker.worker_id, {}).get(CPU_METRIC) for worker in snapshot.workers
    }

    # Sums per owner in one pass each: a per-worker pass over every lease is W x N (10^7 at 10,000 leases).
    counts_before, load_before = _per_owner(before, view.lease_throughput)
    counts_after, load_after = _per_owner(after, view.lease_throughput)
    return tuple(
        WorkerRow(
            worker_id=worker,
            leases_before=counts_before[worker],
            leases_after=counts_after[worker],
            load_before_kbps=round(load_before[worker], 3),
            load_after_kbps=round(load_after[worker], 3),
            cpu_percent=cpu.get(worker),
            note=notes.get(worker),
        )
        for worker in worker_ids
    )


def _per_owner(
    owners: Mapping[str, str | None], throughput: Mapping[str, float]
) -> tuple[Counter[str], defaultdict[str, float]]:
    """Pure: leases and summed throughput (KB/s) per owner."""
    counts: Counter[str] = Counter()
    loads: defaultdict[str, float] = defaultdict(float)
    for key, owner in owners.items():
        if owner is not None:
            counts[owner] += 1
            loads[owner] += throughput[key]
    return counts, loads
