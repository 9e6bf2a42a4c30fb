"""A round's metrics, defined once: names, units, levels, dimensions and meanings (docs/metrics.md).

Every exporter (CloudWatch, `lease_core.metrics.cloudwatch`; Airflow's metrics backend,
`kinesis_lease.airflow_metrics`) publishes the values `round_metric_values` computes from one
`RoundObservation`, under the names `METRICS` defines. Where KCL publishes a figure, the metric has
KCL's operation, name, unit and level (KCL's `ProcessTask`, `ApplicationTracker`, `RenewAllLeases` and
`LeaseAssignmentManager` scopes), so that a dashboard or alarm built for a KCL application reads this
one unchanged; the figures KCL has no name for are ours, under the operations `Round` (the
application's round), `ProcessTask` (per shard) and `SlotTask` (per slot).

Like KCL's metrics scopes, every value is a statistic set (sample count, sum, minimum, maximum), and
`kcl_filtered` applies KCL's `metricsLevel` and `metricsEnabledDimensions` as KCL's
`FilteringMetricsScope` does: a value whose level is below the configured one is dropped, a dimension
that is not enabled is dropped (`Operation` never is), and values that then share their name and
dimensions are accumulated into one set, as KCL's publisher queue accumulates them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from lease_core.config.settings import ALL_METRICS_DIMENSIONS, METRICS_DIMENSIONS
from lease_core.metrics.freshness import Freshness

# KCL's dimension names (MetricsUtil) and the word that enables them all, as the settings name them.
OPERATION, SHARD_ID, STREAM_ID, WORKER_IDENTIFIER = METRICS_DIMENSIONS
ALL_DIMENSIONS = ALL_METRICS_DIMENSIONS


class MetricsLevel(IntEnum):
    """KCL's MetricsLevel and its values: a metric is published when its level is at least the configured one."""

    DETAILED = 9000
    SUMMARY = 10000
    NONE = 2**31 - 1


class Unit(str, Enum):
    """CloudWatch's StandardUnit names of the units the metrics use."""

    COUNT = "Count"
    BYTES = "Bytes"
    MILLISECONDS = "Milliseconds"


class Kind(str, Enum):
    """What a value is to a StatsD-like backend: summed over time, a level, or a duration."""

    COUNT = "count"
    GAUGE = "gauge"
    TIMING = "timing"


class Scope(str, Enum):
    """What one value describes, and so its dimensions besides `Operation`."""

    APPLICATION = "application"  # none
    SHARD = "shard"  # ShardId, and StreamId in multi-stream mode
    WORKER = "worker"  # WorkerIdentifier: a slot, `<application>-worker-<i>`


@dataclass(frozen=True)
class MetricDefinition:
    operation: str
    name: str
    unit: Unit
    level: MetricsLevel
    scope: Scope
    kind: Kind
    kcl: bool  # KCL publishes a metric of this operation and name
    meaning: str


# Every metric, in the order of the docs' table: operation | name | unit | level | scope | kind | KCL's? | meaning.
_TABLE = """
ProcessTask | RecordsProcessed | Count | SUMMARY | shard | count | KCL | Records the round took from the shard, into the output or its dead letters
ProcessTask | DataBytesProcessed | Bytes | SUMMARY | shard | count | KCL | Their data bytes
ProcessTask | MillisBehindLatest | Milliseconds | SUMMARY | shard | gauge | KCL | Kinesis' MillisBehindLatest of the lease's last read in the round
ProcessTask | Success | Count | SUMMARY | shard | gauge | KCL | 1 when the lease's work ended well, 0 when it failed or the lease was lost
ProcessTask | Time | Milliseconds | SUMMARY | shard | timing | KCL | How long the round worked on the lease
ProcessTask | RecordsDeadLettered | Count | SUMMARY | shard | count | ours | Records its processing rejected, set aside as dead letters
ProcessTask | ReadCalls | Count | DETAILED | shard | count | ours | Calls for records (GetRecords, or subscription events) the reads made
ProcessTask | ThrottledReadCalls | Count | DETAILED | shard | count | ours | Calls for records Kinesis refused for a limit
ProcessTask | OldestUnlandedRecordAge | Milliseconds | SUMMARY | shard | gauge | ours | How old the oldest record of the shard that the output lacks can be, at the end of the round
ProcessTask | NewestLandedRecordAge | Milliseconds | SUMMARY | shard | gauge | ours | How old the newest record of the shard in the output is, at the end of the round
ApplicationTracker | MillisBehindLatest | Milliseconds | SUMMARY | application | gauge | KCL | One sample per lease read in the round (0 in an idle round): the maximum is the furthest behind
RenewAllLeases | CurrentLeases | Count | SUMMARY | worker | gauge | KCL | Leases the slot held in the round
RenewAllLeases | LostLeases | Count | SUMMARY | worker | gauge | KCL | Leases the slot lost in the round (a renewal or checkpoint refused)
SlotTask | Time | Milliseconds | DETAILED | worker | timing | ours | How long the slot's task ran
LeaseAssignmentManager | TotalLeases | Count | SUMMARY | application | gauge | KCL | Leases the round's assignment placed on slots, and those it could not place
LeaseAssignmentManager | NumWorkers | Count | SUMMARY | application | gauge | KCL | Slots the round assigned leases to
LeaseAssignmentManager | NumOfLeasesReassignment | Count | SUMMARY | application | gauge | KCL | Leases the assignment moved to another slot
Round | Success | Count | SUMMARY | application | gauge | ours | 1 when the round succeeded, 0 when it failed (its run fails)
Round | Idle | Count | SUMMARY | application | gauge | ours | 1 when the round found nothing to read and skipped its consume step
Round | Time | Milliseconds | SUMMARY | application | timing | ours | How long the round's consume job ran
Round | RecordsProcessed | Count | SUMMARY | application | count | ours | Records the round took, into the output or its dead letters
Round | DataBytesProcessed | Bytes | SUMMARY | application | count | ours | Their data bytes
Round | RecordsDeadLettered | Count | SUMMARY | application | count | ours | Records set aside as dead letters
Round | LostLeases | Count | SUMMARY | application | count | ours | Leases lost during the round
Round | RetentionLosses | Count | SUMMARY | application | count | ours | Ranges of records that aged out of the stream before they were read
Round | ReadCalls | Count | DETAILED | application | count | ours | Calls for records the round's reads made
Round | ThrottledReadCalls | Count | DETAILED | application | count | ours | Calls for records Kinesis refused for a limit
Round | OldestUnlandedRecordAge | Milliseconds | SUMMARY | application | gauge | ours | How old the oldest record that the output lacks can be, on any shard, at the end of the round
Round | NewestLandedRecordAge | Milliseconds | SUMMARY | application | gauge | ours | How old the newest record in the output is, at the end of the round
"""  # noqa: E501


def _definition(row: str) -> MetricDefinition:
    operation, name, unit, level, scope, kind, kcl, meaning = (cell.strip() for cell in row.split("|"))
    return MetricDefinition(
        operation, name, Unit(unit), MetricsLevel[level], Scope(scope), Kind(kind), kcl == "KCL", meaning
    )


METRICS: tuple[MetricDefinition, ...] = tuple(_definition(row) for row in _TABLE.strip().splitlines())
_BY_KEY = {(metric.operation, metric.name): metric for metric in METRICS}


def metric(operation: str, name: str) -> MetricDefinition:
    """The definition of `operation`'s metric `name`; KeyError naming both when there is none."""
    try:
        return _BY_KEY[(operation, name)]
    except KeyError:
        raise KeyError(f"no metric {name!r} of operation {operation!r} is defined") from None


@dataclass(frozen=True)
class StatisticSet:
    """KCL's accumulation of samples: CloudWatch's StatisticValues."""

    sample_count: int
    sum: float
    minimum: float
    maximum: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> StatisticSet:
        if not samples:
            raise ValueError("a statistic set needs at least one sample")
        return cls(len(samples), float(sum(samples)), float(min(samples)), float(max(samples)))

    def merged(self, other: StatisticSet) -> StatisticSet:
        return StatisticSet(
            self.sample_count + other.sample_count,
            self.sum + other.sum,
            min(self.minimum, other.minimum),
            max(self.maximum, other.maximum),
        )


@dataclass(frozen=True)
class MetricValue:
    """One value of a metric, with its dimensions besides `Operation` as (name, value) pairs."""

    metric: MetricDefinition
    dimensions: tuple[tuple[str, str], ...]
    statistics: StatisticSet

    @property
    def all_dimensions(self) -> tuple[tuple[str, str], ...]:
        return ((OPERATION, self.metric.operation), *self.dimensions)


# --- what a round is made of, for the metrics ----------------------------------------------------


@dataclass(frozen=True)
class LeaseObservation:
    """One lease's figures in the round."""

    lease_key: str
    shard_id: str
    worker_id: str
    records: int
    bytes: int
    seconds: float
    millis_behind_latest: int | None
    read_calls: int
    refused_read_calls: int
    dead_lettered: int
    failed: bool
    lost: bool
    freshness: Freshness = field(default_factory=Freshness)

    @property
    def stream_id(self) -> str | None:
        """KCL's StreamId of a multi-stream lease (`<account>:<stream>:<creation epoch>`, its key without
        the shard id); None in single-stream mode, where KCL adds none."""
        suffix = ":" + self.shard_id
        return self.lease_key.removesuffix(suffix) if self.lease_key.endswith(suffix) else None


@dataclass(frozen=True)
class SlotObservation:
    worker_id: str
    seconds: float


@dataclass(frozen=True)
class RoundObservation:
    """A round as its metrics see it. `idle`: the sync found nothing to read and the consume step was
    skipped; `consumed`: the consume step's report was read (False when idle, or when the job failed
    before writing it). `total_leases`, `workers`, `moves`: the assignment's, None when it did not run."""

    application: str
    finished_at_millis: int
    idle: bool
    succeeded: bool
    consumed: bool
    seconds: float
    records: int
    bytes: int
    dead_lettered: int
    lost_leases: int
    retention_losses: int
    freshness: Freshness
    total_leases: int | None = None
    workers: int | None = None
    moves: int | None = None
    leases: tuple[LeaseObservation, ...] = ()
    slots: tuple[SlotObservation, ...] = ()


def round_metric_values(round_: RoundObservation) -> list[MetricValue]:
    """Every metric value of the round, before KCL's level and dimension filters (`kcl_filtered`)."""
    values = [*_application_values(round_), *_assignment_values(round_)]
    for lease in round_.leases:
        values.extend(_lease_values(lease, round_.finished_at_millis))
    for slot in round_.slots:
        values.extend(_slot_values(slot, round_.leases))
    return values


def _value(
    operation: str, name: str, samples: Sequence[float], dimensions: Sequence[tuple[str, str]] = ()
) -> MetricValue:
    return MetricValue(metric(operation, name), tuple(dimensions), StatisticSet.of(samples))


def _application_values(round_: RoundObservation) -> list[MetricValue]:
    at = round_.finished_at_millis
    values = [
        _value("Round", "Success", [int(round_.succeeded)]),
        _value("Round", "Idle", [int(round_.idle)]),
        _value("Round", "RecordsProcessed", [round_.records]),
        _value("Round", "DataBytesProcessed", [round_.bytes]),
        _value("Round", "RecordsDeadLettered", [round_.dead_lettered]),
        _value("Round", "LostLeases", [round_.lost_leases]),
        _value("Round", "RetentionLosses", [round_.retention_losses]),
    ]
    if round_.consumed:
        values += [
            _value("Round", "Time", [round_.seconds * 1000]),
            _value("Round", "ReadCalls", [sum(lease.read_calls for lease in round_.leases)]),
            _value("Round", "ThrottledReadCalls", [sum(lease.refused_read_calls for lease in round_.leases)]),
        ]
    behind = [lease.millis_behind_latest for lease in round_.leases if lease.millis_behind_latest is not None]
    if round_.idle:
        behind = [0]  # nothing to read: every lease is at its shard's tip
    if behind:
        values.append(_value("ApplicationTracker", "MillisBehindLatest", behind))
    values += _freshness_values("Round", round_.freshness, at)
    return values


def _assignment_values(round_: RoundObservation) -> list[MetricValue]:
    figures = {
        "TotalLeases": round_.total_leases,
        "NumWorkers": round_.workers,
        "NumOfLeasesReassignment": round_.moves,
    }
    return [_value("LeaseAssignmentManager", name, [value]) for name, value in figures.items() if value is not None]


def _lease_values(lease: LeaseObservation, at_millis: int) -> list[MetricValue]:
    stream = [] if lease.stream_id is None else [(STREAM_ID, lease.stream_id)]
    dimensions = [(SHARD_ID, lease.shard_id), *stream]
    figures: dict[str, float | None] = {
        "RecordsProcessed": lease.records,
        "DataBytesProcessed": lease.bytes,
        "MillisBehindLatest": lease.millis_behind_latest,
        "Success": int(not (lease.failed or lease.lost)),
        "Time": lease.seconds * 1000,
        "RecordsDeadLettered": lease.dead_lettered,
        "ReadCalls": lease.read_calls,
        "ThrottledReadCalls": lease.refused_read_calls,
    }
    values = [_value("ProcessTask", name, [value], dimensions) for name, value in figures.items() if value is not None]
    return values + _freshness_values("ProcessTask", lease.freshness, at_millis, dimensions)


def _freshness_values(
    operation: str, freshness: Freshness, at_millis: int, dimensions: Sequence[tuple[str, str]] = ()
) -> list[MetricValue]:
    ages = {
        "OldestUnlandedRecordAge": freshness.oldest_unlanded_age_millis(at_millis),
        "NewestLandedRecordAge": freshness.newest_landed_age_millis(at_millis),
    }
    return [_value(operation, name, [age], dimensions) for name, age in ages.items() if age is not None]


def _slot_values(slot: SlotObservation, leases: Iterable[LeaseObservation]) -> list[MetricValue]:
    held = [lease for lease in leases if lease.worker_id == slot.worker_id]
    worker = [(WORKER_IDENTIFIER, slot.worker_id)]
    return [
        _value("RenewAllLeases", "CurrentLeases", [len(held)], worker),
        _value("RenewAllLeases", "LostLeases", [sum(lease.lost for lease in held)], worker),
        _value("SlotTask", "Time", [slot.seconds * 1000], worker),
    ]


# --- KCL's metricsLevel and metricsEnabledDimensions ---------------------------------------------


def kcl_filtered(
    values: Iterable[MetricValue], level: MetricsLevel, enabled_dimensions: Iterable[str]
) -> list[MetricValue]:
    """`values` as KCL would publish them at `level` with `enabled_dimensions` (module docstring), in
    the order they first appear."""
    enabled = frozenset(enabled_dimensions)
    every = ALL_DIMENSIONS in enabled
    kept: dict[tuple[MetricDefinition, tuple[tuple[str, str], ...]], StatisticSet] = {}
    for value in values:
        if value.metric.level < level:
            continue
        dimensions = tuple((name, text) for name, text in value.dimensions if every or name in enabled)
        key = (value.metric, dimensions)
        kept[key] = kept[key].merged(value.statistics) if key in kept else value.statistics
    return [MetricValue(metric_, dimensions, statistics) for (metric_, dimensions), statistics in kept.items()]
