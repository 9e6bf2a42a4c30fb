"""Worker metrics: a slot's own utilization, the KCL `WorkerMetricStats` item, and the leader's view of it.

A Spark slot task is a KCL worker (`<app>-worker-<i>`, docs/protocol.md §0). At the end of its task the slot
appends its utilization for the round to its item in `<app>-WorkerMetricStats` (docs/protocol.md §5.1-5.2).
The leader reads all items and `active_workers` decides which slots take part in assignment, and
with which metrics (§5.2, §4.5), counting freshness in rounds instead of KCL's 2 x 30 seconds.

The utilization is the slot's own: the CPU time of its process over the data time its reads covered
(`slot_utilization_percent`), never a host or container figure, which slots sharing a host (every
slot of `local[*]`, several tasks per executor) would all report alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, TypeGuard

from lease_core.assignment import view as assignment_view
from lease_core.assignment.decision import THROUGHPUT_METRIC, WorkerLoad
from lease_core.retry import RetryPolicy
from lease_core.store.record_table import DynamoDBRecordTable, InMemoryRecordTable, Record, RecordTable

CPU_METRIC = "C"
NO_SAMPLE = assignment_view.NO_SAMPLE
DEFAULT_OPERATING_RANGE_MAX = 100.0
DEFAULT_KEEP = 10  # noOfPersistedMetricsPerWorkerMetrics

# KCL's attribute names (§5.1), and ours: `round` is the round number of the last write. KCL and its
# tooling ignore attributes they do not know, so the item stays readable by them.
WORKER_ID = "wid"
LAST_UPDATE = "lut"
STATS = "sts"
OPERATING_RANGE = "opr"
ROUND = "round"
# KCL 3.5's support code (`sup`, the highest migration feature the worker runs: 1 = the single-table
# migration, docs/protocol.md §1.8) and when it was last written (`slu`, epoch seconds).
SUPPORT_CODE = "sup"
SUPPORT_UPDATE = "slu"
SINGLE_TABLE_MIGRATION_SUPPORT = 1

_SIX_DECIMALS = Decimal("0.000001")


# --- A slot's utilization -----------------------------------------------------------------------


def slot_utilization_percent(cpu_seconds: float, covered_seconds: float | None) -> float | None:
    """The share of one core a slot's leases need to be kept up with as their data arrives, 0..100.

    `cpu_seconds` is what the slot's own process spent in the round (every thread of its Python
    worker: reading, parsing, transform, Parquet); `covered_seconds` the data time its reads covered
    (the leases' throughput window, `lease_core.metrics.throughput`). An always-on KCL worker processes data
    as it arrives, so this is the utilization it would show for the same leases. Capped at 100, as
    KCL's is; six decimals, half up. None when the slot's reads covered no data time (it ran no
    lease): then it publishes nothing and is a default-metric worker for the next round.
    """
    if cpu_seconds < 0:
        raise ValueError(f"cpu_seconds must be >= 0, got {cpu_seconds}")
    if covered_seconds is None or covered_seconds <= 0:
        return None
    return round_half_up(min(100.0, cpu_seconds / covered_seconds * 100.0))


def round_half_up(value: float) -> float:
    return float(Decimal(repr(value)).quantize(_SIX_DECIMALS, rounding=ROUND_HALF_UP))


# --- The WorkerMetricStats item -------------------------------------------------------------------


def ema(values: Iterable[float], alpha: float = 0.5) -> float:
    """The value assignment uses (§4.2): EMA in stored order skipping -1; [50, 60] -> 55; none -> 0."""
    return assignment_view.ema(values, alpha)


@dataclass(frozen=True)
class WorkerMetricStats:
    """One worker's item: `wid`, `lut` (epoch seconds), `sts` (name -> last values, oldest first,
    -1 = no sample), `opr` (name -> [max]) and KCL 3.5's `sup` (its support code; `slu` is written as
    `lut`) as KCL writes them, plus our `round` (the round of the last write). A worker with neither
    stats nor ranges is a default-metric (throughput) worker.
    """

    worker_id: str
    last_update_epoch_seconds: int | None = None
    stats: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    operating_range: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    round: int | None = None
    support_code: int | None = None

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("a worker id must not be empty")
        object.__setattr__(self, "stats", {k: tuple(map(float, v)) for k, v in self.stats.items()})
        object.__setattr__(self, "operating_range", {k: tuple(map(float, v)) for k, v in self.operating_range.items()})

    @property
    def is_default_metric_worker(self) -> bool:
        return (not self.stats and not self.operating_range) or THROUGHPUT_METRIC in self.stats

    def appended(
        self, value: float, now: int, round: int, keep: int = DEFAULT_KEEP, metric: str = CPU_METRIC
    ) -> WorkerMetricStats:
        """This item after one more reporting interval of `metric` (0..100, or -1 for no sample)."""
        if value != NO_SAMPLE and not 0 <= value <= 100:
            raise ValueError(
                f"worker {self.worker_id!r}: metric {metric!r} value must be in [0, 100] or -1, got {value}"
            )
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        values = (*self.stats.get(metric, ()), value)[-keep:]
        ranges = {metric: (DEFAULT_OPERATING_RANGE_MAX,), **self.operating_range}
        stats = {**self.stats, metric: values}
        return replace(
            self,
            last_update_epoch_seconds=now,
            stats=stats,
            operating_range=ranges,
            round=round,
            support_code=SINGLE_TABLE_MIGRATION_SUPPORT,
        )

    def invalid_reason(self) -> str | None:
        """Why the leader must not trust this item (§5.2), or None when it is valid."""
        if self.last_update_epoch_seconds is None:
            return f"attribute {LAST_UPDATE!r} is missing"
        if self.is_default_metric_worker:
            return None
        if not self.stats or not self.operating_range:
            return f"attributes {STATS!r} and {OPERATING_RANGE!r} must both be present"
        for name, values in self.stats.items():
            if name not in self.operating_range:
                return f"metric {name!r} has no operating range"
            if not values:  # KCL never writes an empty list (§5.2); it would carry no load
                return f"metric {name!r} has no values"
        for name, bounds in self.operating_range.items():
            if not bounds or bounds[0] == 0:
                return f"operating range of {name!r} must start with a non-zero maximum"
        return None

    def is_valid(self) -> bool:
        return self.invalid_reason() is None

    def is_failing(self) -> bool:
        """The latest interval of some metric had no sample (an older -1 is fine)."""
        return not self.is_default_metric_worker and any(
            values and values[-1] == NO_SAMPLE for values in self.stats.values()
        )

    def is_fresh(self, current_round: int, max_rounds_old: int = 1) -> bool:
        """Written this round or within `max_rounds_old` rounds before it; an item without `round` is not."""
        return self.round is not None and current_round - self.round <= max_rounds_old

    def to_worker_load(self) -> WorkerLoad:
        if self.is_default_metric_worker:
            return WorkerLoad(self.worker_id)
        return WorkerLoad(
            self.worker_id,
            metrics=dict(self.stats),
            operating_range={name: bounds[0] for name, bounds in self.operating_range.items()},
        )

    def to_item(self) -> Record:
        item: Record = {
            WORKER_ID: self.worker_id,
            STATS: _number_lists(self.stats),
            OPERATING_RANGE: _number_lists(self.operating_range),
        }
        if self.last_update_epoch_seconds is not None:
            item[LAST_UPDATE] = self.last_update_epoch_seconds
        if self.round is not None:
            item[ROUND] = self.round
        if self.support_code is not None:
            item[SUPPORT_CODE] = self.support_code
            if self.last_update_epoch_seconds is not None:
                item[SUPPORT_UPDATE] = self.last_update_epoch_seconds
        return item

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> WorkerMetricStats:
        """Decode an item, raising ValueError naming the worker and the attribute that is wrong."""
        reader = _StatsReader(item)
        return cls(
            worker_id=reader.worker_id,
            last_update_epoch_seconds=reader.integer(LAST_UPDATE),
            stats=reader.number_lists(STATS),
            operating_range=reader.number_lists(OPERATING_RANGE),
            round=reader.integer(ROUND),
            support_code=reader.integer(SUPPORT_CODE),
        )


def _number(value: float) -> Decimal:
    """Six decimals, half up, as KCL stores them; written without an exponent (100, not 1E+2)."""
    rounded = Decimal(repr(float(value))).quantize(_SIX_DECIMALS, rounding=ROUND_HALF_UP).normalize()
    return Decimal(format(rounded, "f"))


def _number_lists(lists: Mapping[str, tuple[float, ...]]) -> dict[str, list[Decimal]]:
    return {name: [_number(value) for value in values] for name, values in lists.items()}


class _StatsReader:
    """Reads an item other tooling may have written: every wrong value is named, never a KeyError."""

    def __init__(self, item: Mapping[str, Any]) -> None:
        self._item = item
        worker_id = item.get(WORKER_ID)
        if not isinstance(worker_id, str) or not worker_id:
            raise ValueError(f"worker metrics item: attribute {WORKER_ID!r} must be a non-empty string (S)")
        self.worker_id: str = worker_id

    def _error(self, name: str, problem: str) -> ValueError:
        return ValueError(f"worker metrics item {self.worker_id!r}: attribute {name!r} {problem}")

    def _typed(self, name: str, value: Any, kind: type | tuple[type, ...], type_code: str) -> Any:
        if not isinstance(value, kind) or isinstance(value, bool):
            raise self._error(name, f"must be of type {type_code}")
        return value

    def _decimal(self, name: str, raw: Any) -> Decimal:
        number = Decimal(self._typed(name, raw, (Decimal, int), "N"))
        if not number.is_finite():
            raise self._error(name, f"must be finite, got {raw!r}")
        return number

    def integer(self, name: str) -> int | None:
        if name not in self._item:
            return None
        number = self._decimal(name, self._item[name])
        if number != number.to_integral_value():
            raise self._error(name, f"must be an integer, got {number}")
        return int(number)

    def number_lists(self, name: str) -> dict[str, tuple[float, ...]]:
        if name not in self._item:
            return {}
        lists = self._typed(name, self._item[name], dict, "M")
        return {
            metric: tuple(float(self._decimal(name, entry)) for entry in self._typed(name, values, list, "L"))
            for metric, values in lists.items()
        }


# --- Stores ------------------------------------------------------------------------------------


class WorkerMetricsStore:
    """The `WorkerMetricStats` items of a record table keyed by `wid`."""

    def __init__(self, table: RecordTable) -> None:
        self.table = table
        self.table_name = table.table_name

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        record = self.table.get(worker_id)
        return WorkerMetricStats.from_item(record) if record is not None else None

    def list_all(self) -> list[WorkerMetricStats]:
        return [WorkerMetricStats.from_item(record) for record in self.table.scan()]

    def read_for_round(
        self, worker_ids: Iterable[str], stale_before_epoch_seconds: int
    ) -> tuple[dict[str, WorkerMetricStats], dict[str, int]]:
        """One scan for a round's assignment (KCL's leader scans the table too, docs/protocol.md §4.1):
        the stored stats of `worker_ids`, by worker (only those are decoded: an item of any other
        worker cannot fail the round), and, by worker, the `lut` of every other worker's item last
        updated before `stale_before_epoch_seconds`, which KCL's leader deletes (§5.2). An item
        without a readable `wid` and `lut` is never judged stale: nothing says when it was written."""
        wanted = set(worker_ids)
        stored: dict[str, WorkerMetricStats] = {}
        stale: dict[str, int] = {}
        for record in self.table.scan():
            worker_id, updated = record.get(WORKER_ID), record.get(LAST_UPDATE)
            if worker_id in wanted:
                stats = WorkerMetricStats.from_item(record)
                stored[stats.worker_id] = stats
            elif isinstance(worker_id, str) and _is_integer(updated) and _seconds(updated) < stale_before_epoch_seconds:
                stale[worker_id] = int(updated)
        return stored, stale

    def put(self, stats: WorkerMetricStats) -> None:
        """Upsert `lut`, `sts`, `opr`, `round`, `sup` and `slu`; absent values and attributes of others are
        left alone (§5.2)."""
        self.table.update(stats.worker_id, stats.to_item())

    def delete_if_unchanged(self, worker_id: str, lut: int) -> bool:
        """Delete the item only if it exists and still has this `lut` (the leader's stale-entry cleanup, §5.2)."""
        return self.table.delete(worker_id, expected={LAST_UPDATE: lut})


# Releases before 2026-11-29 wrote a slot's `lut` in milliseconds; no time in seconds is this large
# before the year 5138, so such a value is read as milliseconds when judging an item stale.
_MILLISECONDS_FROM = 10**11


def _seconds(lut: int | Decimal) -> int:
    return int(lut) // 1000 if lut >= _MILLISECONDS_FROM else int(lut)


def _is_integer(value: object) -> TypeGuard[int | Decimal]:
    return isinstance(value, int | Decimal) and not isinstance(value, bool) and value == int(value)


class InMemoryWorkerMetricsStore(WorkerMetricsStore):
    def __init__(self, table_name: str = "in-memory-WorkerMetricStats") -> None:
        super().__init__(InMemoryRecordTable(table_name, WORKER_ID))


class DynamoDBWorkerMetricsStore(WorkerMetricsStore):
    def __init__(
        self, client: Any, table_name: str, retry_policy: RetryPolicy | None = None, page_size: int | None = None
    ) -> None:
        super().__init__(DynamoDBRecordTable(client, table_name, WORKER_ID, retry_policy, page_size))


def publish_worker_metrics(
    store: WorkerMetricsStore, worker_id: str, value: float, now: int, round: int, keep: int = DEFAULT_KEEP
) -> WorkerMetricStats:
    """A slot's end-of-task write: its CPU average for this round appended to its stored history."""
    previous = store.get(worker_id) or WorkerMetricStats(worker_id)
    stats = previous.appended(value, now=now, round=round, keep=keep)
    store.put(stats)
    return stats


# --- The leader's decision -----------------------------------------------------------------------


def active_workers(
    requested_slots: Sequence[str], stored: Mapping[str, WorkerMetricStats], current_round: int
) -> tuple[list[WorkerLoad], dict[str, str]]:
    """The round's workers for assignment, and a note for every slot whose metrics were not used.

    A slot is excluded iff it is missing from the returned loads (invalid or failing fresh metrics,
    §4.5). Unlike KCL, stale metrics do not exclude: in a batch round a slot that did not run last
    round carried no load, so its old CPU says nothing and its throughput share is the right signal;
    it takes part as a default-metric worker, noted as "stale". Slots without metrics are
    default-metric workers too (no note).
    """
    loads: list[WorkerLoad] = []
    notes: dict[str, str] = {}
    for slot in requested_slots:
        stats = stored.get(slot)
        if stats is None:
            loads.append(WorkerLoad(slot))
        elif not stats.is_fresh(current_round):
            loads.append(WorkerLoad(slot))
            notes[slot] = f"stale: last written in round {stats.round}, metrics ignored, balanced by throughput"
        elif (reason := stats.invalid_reason()) is not None:
            notes[slot] = f"invalid: {reason}"
        elif stats.is_failing():
            notes[slot] = "failing: the latest interval of a metric has no sample (-1)"
        else:
            loads.append(stats.to_worker_load())
    return loads, notes
