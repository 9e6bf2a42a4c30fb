"""Worker metrics: a slot's own utilization, the KCL `WorkerMetricStats` item, and the leader's view of it.

A Spark slot task is a KCL worker (`<app>-worker-<i>`, DESIGN.md §4). At the end of its task the slot
appends its utilization for the round to its item in `<app>-WorkerMetricStats` (kcl-spec.md §6.1-6.2).
The leader reads all items and `active_workers` decides which slots take part in assignment, and
with which metrics (§6.3, §5.6), counting freshness in rounds instead of KCL's 2 x 30 seconds.

The utilization is the slot's own: the CPU time of its process over the data time its reads covered
(`slot_utilization_percent`), never a host or container figure, which slots sharing a host (every
slot of `local[*]`, several tasks per executor) would all report alike.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Protocol, TypeVar

import botocore.exceptions

from lease_core.assignment import view as assignment_view
from lease_core.assignment.decision import THROUGHPUT_METRIC, WorkerLoad
from lease_core.aws import AwsCaller, error_code
from lease_core.retry import RetryPolicy
from lease_core.store.codec import AttributeValue, Item
from lease_core.store.memory_store import values_equal

T = TypeVar("T")

CPU_METRIC = "C"
NO_SAMPLE = assignment_view.NO_SAMPLE
DEFAULT_OPERATING_RANGE_MAX = 100.0
DEFAULT_KEEP = 10  # noOfPersistedMetricsPerWorkerMetrics

# KCL's attribute names (§6.1), and ours: `round` is the round number of the last write. KCL and its
# tooling ignore attributes they do not know, so the item stays readable by them.
WORKER_ID = "wid"
LAST_UPDATE = "lut"
STATS = "sts"
OPERATING_RANGE = "opr"
ROUND = "round"

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
    """The value assignment uses (§6.3): EMA in stored order skipping -1; [50, 60] -> 55; none -> 0."""
    return assignment_view.ema(values, alpha)


@dataclass(frozen=True)
class WorkerMetricStats:
    """One worker's item: `wid`, `lut` (epoch seconds), `sts` (name -> last values, oldest first,
    -1 = no sample), `opr` (name -> [max]) as KCL writes them, plus our `round` (the round of the
    last write). A worker with neither stats nor ranges is a default-metric (throughput) worker.
    """

    worker_id: str
    last_update_epoch_seconds: int | None = None
    stats: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    operating_range: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    round: int | None = None

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
        return replace(self, last_update_epoch_seconds=now, stats=stats, operating_range=ranges, round=round)

    def invalid_reason(self) -> str | None:
        """Why the leader must not trust this item (§6.3), or None when it is valid."""
        if self.last_update_epoch_seconds is None:
            return f"attribute {LAST_UPDATE!r} is missing"
        if self.is_default_metric_worker:
            return None
        if not self.stats or not self.operating_range:
            return f"attributes {STATS!r} and {OPERATING_RANGE!r} must both be present"
        for name, values in self.stats.items():
            if name not in self.operating_range:
                return f"metric {name!r} has no operating range"
            if not values:  # KCL never writes an empty list (§6.2); it would carry no load
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

    def to_item(self) -> Item:
        item: Item = {
            WORKER_ID: {"S": self.worker_id},
            STATS: _number_lists(self.stats),
            OPERATING_RANGE: _number_lists(self.operating_range),
        }
        if self.last_update_epoch_seconds is not None:
            item[LAST_UPDATE] = {"N": str(self.last_update_epoch_seconds)}
        if self.round is not None:
            item[ROUND] = {"N": str(self.round)}
        return item

    @classmethod
    def from_item(cls, item: Mapping[str, AttributeValue]) -> WorkerMetricStats:
        """Decode an item, raising ValueError naming the worker and the attribute that is wrong."""
        reader = _StatsReader(item)
        return cls(
            worker_id=reader.worker_id,
            last_update_epoch_seconds=reader.integer(LAST_UPDATE),
            stats=reader.number_lists(STATS),
            operating_range=reader.number_lists(OPERATING_RANGE),
            round=reader.integer(ROUND),
        )


def _number(value: float) -> AttributeValue:
    rounded = Decimal(repr(float(value))).quantize(_SIX_DECIMALS, rounding=ROUND_HALF_UP).normalize()
    return {"N": format(rounded, "f")}


def _number_lists(lists: Mapping[str, tuple[float, ...]]) -> AttributeValue:
    return {"M": {name: {"L": [_number(value) for value in values]} for name, values in lists.items()}}


class _StatsReader:
    def __init__(self, item: Mapping[str, AttributeValue]) -> None:
        self._item = item
        raw = item.get(WORKER_ID)
        worker_id = raw.get("S") if isinstance(raw, dict) else None
        if not isinstance(worker_id, str) or not worker_id:
            raise ValueError(f"worker metrics item: attribute {WORKER_ID!r} must be a non-empty string (S)")
        self.worker_id: str = worker_id

    def _error(self, name: str, problem: str) -> ValueError:
        return ValueError(f"worker metrics item {self.worker_id!r}: attribute {name!r} {problem}")

    def _typed(self, name: str, value: Any, type_code: str) -> Any:
        if not isinstance(value, dict) or type_code not in value:
            raise self._error(name, f"must be of type {type_code}")
        return value[type_code]

    def _decimal(self, name: str, raw: Any) -> Decimal:
        try:
            number = Decimal(raw)
        except (InvalidOperation, TypeError):
            raise self._error(name, f"is not a number: {raw!r}") from None
        if not number.is_finite():
            raise self._error(name, f"must be finite, got {raw!r}")
        return number

    def integer(self, name: str) -> int | None:
        if name not in self._item:
            return None
        number = self._decimal(name, self._typed(name, self._item[name], "N"))
        if number != number.to_integral_value():
            raise self._error(name, f"must be an integer, got {number}")
        return int(number)

    def number_lists(self, name: str) -> dict[str, tuple[float, ...]]:
        if name not in self._item:
            return {}
        lists = self._typed(name, self._item[name], "M")
        return {
            metric: tuple(
                float(self._decimal(name, self._typed(name, entry, "N"))) for entry in self._typed(name, values, "L")
            )
            for metric, values in lists.items()
        }


# --- Stores ------------------------------------------------------------------------------------


class WorkerMetricsStore(Protocol):
    table_name: str

    def get(self, worker_id: str) -> WorkerMetricStats | None: ...
    def list_all(self) -> list[WorkerMetricStats]: ...
    def put(self, stats: WorkerMetricStats) -> None:
        """Upsert `lut`, `sts`, `opr` and `round`; absent values and attributes of others are left alone (§6.2)."""
        ...

    def delete_if_unchanged(self, worker_id: str, lut: int) -> bool:
        """Delete the item only if it exists and still has this `lut` (the leader's stale-entry cleanup, §6.3)."""
        ...


class InMemoryWorkerMetricsStore:
    def __init__(self, table_name: str = "in-memory-WorkerMetricStats") -> None:
        self.table_name = table_name
        self._items: dict[str, Item] = {}
        self._lock = threading.Lock()

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        with self._lock:
            item = self._items.get(worker_id)
        return WorkerMetricStats.from_item(item) if item is not None else None

    def list_all(self) -> list[WorkerMetricStats]:
        with self._lock:
            items = list(self._items.values())
        return [WorkerMetricStats.from_item(item) for item in items]

    def put(self, stats: WorkerMetricStats) -> None:
        with self._lock:
            stored = self._items.get(stats.worker_id, {})
            self._items[stats.worker_id] = {**stored, **copy.deepcopy(stats.to_item())}

    def delete_if_unchanged(self, worker_id: str, lut: int) -> bool:
        with self._lock:
            item = self._items.get(worker_id)
            if item is None or not values_equal(item.get(LAST_UPDATE), {"N": str(lut)}):
                return False
            del self._items[worker_id]
            return True

    def put_raw_item(self, item: Item) -> None:
        """Write an item as other tooling might (tests only)."""
        with self._lock:
            self._items[item[WORKER_ID]["S"]] = copy.deepcopy(item)


class DynamoDBWorkerMetricsStore:
    def __init__(
        self, client: Any, table_name: str, retry_policy: RetryPolicy | None = None, page_size: int | None = None
    ) -> None:
        self.client = client
        self.table_name = table_name
        self._caller = AwsCaller("dynamodb", retry_policy or RetryPolicy())
        self._page_limit = {"Limit": page_size} if page_size else {}

    def _call(self, operation: str, function: Callable[[], T]) -> T:
        return self._caller.call(operation, function, table_name=self.table_name)

    def get(self, worker_id: str) -> WorkerMetricStats | None:
        response = self._call(
            "GetItem",
            lambda: self.client.get_item(
                TableName=self.table_name, Key={WORKER_ID: {"S": worker_id}}, ConsistentRead=True
            ),
        )
        item = response.get("Item")
        return WorkerMetricStats.from_item(item) if item is not None else None

    def list_all(self) -> list[WorkerMetricStats]:
        arguments: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True, **self._page_limit}
        items: list[Item] = []
        while True:
            response = self._call("Scan", lambda: self.client.scan(**arguments))
            items.extend(response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return [WorkerMetricStats.from_item(item) for item in items]
            arguments["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def put(self, stats: WorkerMetricStats) -> None:
        attributes = {name: value for name, value in stats.to_item().items() if name != WORKER_ID}
        names = {f"#a{index}": name for index, name in enumerate(attributes)}
        values = {f":v{index}": value for index, value in enumerate(attributes.values())}
        assignments = ", ".join(f"#a{index} = :v{index}" for index in range(len(attributes)))
        self._call(
            "UpdateItem",
            lambda: self.client.update_item(
                TableName=self.table_name,
                Key={WORKER_ID: {"S": stats.worker_id}},
                UpdateExpression=f"SET {assignments}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            ),
        )

    def delete_if_unchanged(self, worker_id: str, lut: int) -> bool:
        def delete() -> bool:
            try:
                self.client.delete_item(
                    TableName=self.table_name,
                    Key={WORKER_ID: {"S": worker_id}},
                    ConditionExpression="attribute_exists(#wid) AND #lut = :lut",
                    ExpressionAttributeNames={"#wid": WORKER_ID, "#lut": LAST_UPDATE},
                    ExpressionAttributeValues={":lut": {"N": str(lut)}},
                )
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ConditionalCheckFailedException":
                    return False
                raise
            return True

        return self._call("DeleteItem", delete)


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
    §5.6). Unlike KCL, stale metrics do not exclude: in a batch round a slot that did not run last
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
