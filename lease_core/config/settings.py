"""The consumer's configuration: KCL's lease-management settings in snake_case, plus a few of ours.

`ConsumerConfig` is a frozen pydantic model (strict: a bool is not an int) and the one place every
setting is declared: each field carries its one-sentence doc, its KCL name, what our batch adaptation
changes and, in its type, its constraints, so the reference documentation (`describe()`) and the JSON
schema (`model_json_schema()`) are generated from the fields and cannot drift from the code. Every
problem raises `ConfigurationError` naming the offending key, never pydantic's `ValidationError`.

`load_config` layers the sources, later ones winning: defaults < TOML file (flat top-level keys) <
environment (`KINESIS_LEASE_<KEY>`) < overrides (`--set key=value` of the CLI, DAG params), and an
error names where the bad value came from. That layering is ours, not pydantic-settings': it merges
its sources into one dict before validating, so its errors cannot name the file, variable or `--set`
of a value; it reads only the variables of known fields, so a misspelt `KINESIS_LEASE_*` would be
ignored instead of reported with the closest name; and a `BaseSettings` reads the environment at every
construction, where `ConsumerConfig()` must mean the defaults.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeAlias, get_args, get_origin
from urllib.parse import urlsplit

from annotated_types import Ge, Gt, Le
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from lease_core.errors import ConfigurationError

ENV_PREFIX = "KINESIS_LEASE_"
# KCL 3.0-3.4 derive these table names from the application name; KCL tooling expects them.
WORKER_METRICS_TABLE_SUFFIX = "-WorkerMetricStats"
COORDINATOR_STATE_TABLE_SUFFIX = "-CoordinatorState"

Tags: TypeAlias = tuple[tuple[str, str], ...]
"""Table tags as sorted (key, value) pairs: a tuple, unlike a dict, keeps the config hashable."""

# The names of `lease_assignment_strategy`, the default first: the one list the configuration, the
# DAG's form, the deciders (`lease_core.assignment.strategies`) and the benchmarks use.
LeaseAssignmentStrategy: TypeAlias = Literal["makespan", "variance", "count"]
LEASE_ASSIGNMENT_STRATEGIES: tuple[str, ...] = get_args(LeaseAssignmentStrategy)

# KCL's metrics levels and dimension names (its MetricsLevel and MetricsUtil), and the word of
# `metricsEnabledDimensions` that enables every dimension (MetricsScope.METRICS_DIMENSIONS_ALL).
MetricsLevelName: TypeAlias = Literal["NONE", "SUMMARY", "DETAILED"]
METRICS_DIMENSIONS: tuple[str, ...] = ("Operation", "ShardId", "StreamId", "WorkerIdentifier")
ALL_METRICS_DIMENSIONS = "ALL"


# --------------------------------------------------------------------------------------------------
# What pydantic's constraints do not say: checks in words, and rules between settings.


@dataclass(frozen=True)
class _Allowed:
    """The values a setting allows, in words; with `test`, also the check (None, meaning unset, passes)."""

    allowed: str
    test: Callable[[Any], bool] | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        schema = handler(source)
        if self.test is None:  # words for a constraint pydantic checks (a pattern)
            return schema
        test = self.test

        def check(value: Any) -> Any:
            if value is not None and not test(value):
                raise PydanticCustomError("not_allowed", "not allowed")
            return value

        return core_schema.no_info_after_validator_function(check, schema)


def _must_be(allowed: str, value: object) -> str:
    return f"must be {allowed}, got {value!r}"


@dataclass(frozen=True)
class _Below:
    """Strictly below another setting divided by `divisor`."""

    other: str
    divisor: int = 1

    @property
    def allowed(self) -> str:
        return f"less than {self.other}" + (f" // {self.divisor}" if self.divisor != 1 else "")

    def problem(self, value: int, config: ConsumerConfig) -> str | None:
        limit = getattr(config, self.other) // self.divisor
        return None if value < limit else _must_be(f"{self.allowed} ({limit})", value)


@dataclass(frozen=True)
class _AtLeast:
    """At least another setting."""

    other: str

    @property
    def allowed(self) -> str:
        return f"at least {self.other}"

    def problem(self, value: int, config: ConsumerConfig) -> str | None:
        limit = getattr(config, self.other)
        return None if value >= limit else _must_be(f"{self.allowed} ({limit})", value)


@dataclass(frozen=True)
class _TimestampGiven:
    """AT_TIMESTAMP needs initial_position_timestamp (the lease only stores the sentinel)."""

    allowed: str = "accompanied by initial_position_timestamp when AT_TIMESTAMP"

    def problem(self, value: str, config: ConsumerConfig) -> str | None:
        if value == "AT_TIMESTAMP" and config.initial_position_timestamp is None:
            return "AT_TIMESTAMP needs initial_position_timestamp to be set"
        return None


_RULES_BETWEEN_SETTINGS = (_Below, _AtLeast, _TimestampGiven)


def parse_iso_timestamp(text: str) -> datetime:
    """An ISO 8601 time with a zone (`Z` accepted); ValueError otherwise."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return moment


def _is_iso_timestamp(text: str) -> bool:
    try:
        parse_iso_timestamp(text)
    except ValueError:
        return False
    return True


def _is_http_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _table_name_words(max_length: int) -> str:
    return f"3 to {max_length} characters from A-Z a-z 0-9 _ - . (a DynamoDB table name)"


def _accept_tags(value: object) -> Tags:
    # A table (TOML, JSON, a mapping) or the stored form, a tuple of pairs (as with_overrides passes it).
    try:
        tags = dict(value) if isinstance(value, tuple) else value
    except (TypeError, ValueError):
        raise ValueError(f"expected a table of string tags, got {value!r}") from None
    if isinstance(tags, Mapping) and all(
        isinstance(key, str) and key and isinstance(tag, str) for key, tag in tags.items()
    ):
        return tuple(sorted(tags.items()))
    raise ValueError(f"expected a table of string tags with non-empty keys, got {value!r}")


def _accept_dimensions(value: object) -> tuple[str, ...]:
    # A list (TOML, JSON), comma-separated text, or the stored form, a tuple; duplicates once, in order.
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"expected a list of dimension names, got {value!r}")
    names = [name.strip() for name in names if name.strip()]
    choices = (ALL_METRICS_DIMENSIONS, *METRICS_DIMENSIONS)
    unknown = [name for name in names if name not in choices]
    if unknown or not names:
        problem = f"unknown dimension {unknown[0]!r}" if unknown else "it names no dimension"
        raise ValueError(f"{problem}; the names are {', '.join(choices)}, got {value!r}")
    return tuple(dict.fromkeys(names))


def _is_cloudwatch_namespace(text: str) -> bool:
    # CloudWatch's rule: 1-255 of these characters, one not a space, and not AWS's own "AWS/".
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/#: ")
    return 0 < len(text) <= 255 and set(text) <= allowed and bool(text.strip()) and not text.startswith("AWS/")


def _dump_float(value: float) -> float | str:
    # JSON has no infinity; "inf" is what the float reader accepts back.
    return "inf" if value == math.inf else value


# The field types. NaN is refused by the lower bound every float setting has (it compares false).
_Float = Annotated[float, PlainSerializer(_dump_float, when_used="json")]
_PositiveFloat = Annotated[_Float, Field(gt=0)]
_PositiveInt = Annotated[int, Field(gt=0)]
_NonNegativeInt = Annotated[int, Field(ge=0)]
_AtLeastOne = Annotated[int, Field(ge=1)]
_Percentage = Annotated[int, Field(ge=1, le=100)]
_PercentageOrZero = Annotated[int, Field(ge=0, le=100)]
_MAX_APPLICATION_NAME = 255 - len(WORKER_METRICS_TABLE_SUFFIX)  # room for the derived tables' suffixes
_ApplicationName = Annotated[
    str | None,
    Field(pattern=rf"^[A-Za-z0-9_.-]{{3,{_MAX_APPLICATION_NAME}}}$"),
    _Allowed(_table_name_words(_MAX_APPLICATION_NAME)),
]
_TableName = Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_.-]{3,255}$"), _Allowed(_table_name_words(255))]
# RegisterStreamConsumer's ConsumerName: 1-128 of these characters.
_ConsumerName = Annotated[
    str | None,
    Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$"),
    _Allowed("1 to 128 letters, digits, '_', '.' or '-'"),
]
_Region = Annotated[str | None, Field(pattern=r"^[a-z0-9-]+$"), _Allowed("an AWS region name such as 'eu-west-1'")]
_EndpointUrl = Annotated[str | None, _Allowed("an http:// or https:// URL", _is_http_url)]
_IsoTimestamp = Annotated[
    str | None,
    _Allowed("an ISO 8601 time with a time zone, such as 2026-11-22T10:00:00Z", _is_iso_timestamp),
]
_Dimensions = Annotated[
    tuple[str, ...],
    PlainValidator(_accept_dimensions, json_schema_input_type=list[str]),
    PlainSerializer(list),
    _Allowed("a comma-separated list of " + ", ".join((ALL_METRICS_DIMENSIONS, *METRICS_DIMENSIONS))),
]
_Namespace = Annotated[
    str | None,
    _Allowed(
        "1 to 255 characters from A-Z a-z 0-9 . - _ / # : and space, not starting with 'AWS/' (a CloudWatch namespace)",
        _is_cloudwatch_namespace,
    ),
]
# Given as a table, a JSON object or k=v pairs; stored as sorted pairs, written back as a table.
_TagTable = Annotated[Tags, PlainValidator(_accept_tags, json_schema_input_type=dict[str, str]), PlainSerializer(dict)]


def _setting(default: Any, doc: str, kcl_name: str | None, *, batch_note: str | None = None) -> Any:
    """A field with the metadata `describe()` reads; its constraints are in its type."""
    extra = {"kcl_name": kcl_name, "batch_note": batch_note}
    return Field(default, description=doc, json_schema_extra={key: value for key, value in extra.items() if value})


# --------------------------------------------------------------------------------------------------
# The configuration object.


@dataclass(frozen=True)
class SettingDescription:
    """One row of the settings reference, generated from a `ConsumerConfig` field."""

    key: str
    type_name: str
    default: object
    kcl_name: str | None
    doc: str
    batch_note: str | None
    allowed: str | None


class ConsumerConfig(BaseModel):
    """Every setting of the consumer; any construction validates, raising `ConfigurationError`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    application_name: _ApplicationName = _setting(
        None,
        "Name of the consuming application; it names the lease table and the tables derived from it.",
        "applicationName",
    )
    lease_table_name: _TableName = _setting(
        None,
        "Name of the DynamoDB lease table; unset means the application name, as in KCL.",
        "tableName",
    )
    lease_table_layout: Literal["separate", "single"] = _setting(
        "single",
        "Where a new application keeps its worker metrics and coordinator state: `single` in the lease table, "
        "tagged by `entityType` (KCL 3.5's default for a new application), or `separate` in "
        "`<app>-WorkerMetricStats` and `<app>-CoordinatorState` (KCL 3.0-3.4). Setup records a new "
        "application's layout; an existing application's layout is read from its tables and followed "
        "whatever this says (docs/protocol.md §1.7).",
        None,
    )
    migrate_all_entities_to_lease_table: bool = _setting(
        False,
        "Move a `separate`-layout application's worker metrics and coordinator state into its lease table "
        "(KCL 3.5's table migration): the rounds run it through INIT, DEPLOYED and PENDING to COMPLETE, and "
        "turning it off again before COMPLETE rolls it back to DEPLOYED (docs/protocol.md §1.8).",
        "migrateAllEntitiesToLeaseTable",
        batch_note="In KCL this is phase 2, refused before phase 1 (which KCL 3.5 starts by itself) reached "
        "DEPLOYED; here it starts phase 1 and then goes on, since a round's slots all run one release.",
    )
    table_migration_complete_bake_time_seconds: Annotated[int, Field(ge=3600, le=604_800)] = _setting(
        86_400,
        "How long a table migration stays PENDING, every record in the lease table and nothing written "
        "to the separate tables, before it is made COMPLETE (from 1 hour to 1 week).",
        "tableMigrationCompleteBakeTimeSeconds",
        batch_note="KCL clamps a value outside [1 hour, 1 week] silently; here it is refused, naming the key.",
    )
    failover_time_millis: _PositiveInt = _setting(
        10000,
        "Lease duration: a lease whose counter has not moved for this long is considered expired.",
        "failoverTimeMillis",
        batch_note="Slot tasks claim their leases and renew them every renewer interval while they work.",
    )
    # Against the floored third, so that the renewer interval stays at least 1 ms.
    epsilon_millis: Annotated[_NonNegativeInt, _Below("failover_time_millis", divisor=3)] = _setting(
        25,
        "Safety margin subtracted from a third of the lease duration to get the renewer interval.",
        "epsilonMillis",
    )
    max_leases_for_worker: _AtLeastOne = _setting(
        2147483647,
        "Most leases one worker may hold (KCL's Integer.MAX_VALUE means unlimited).",
        "maxLeasesForWorker",
        batch_note="A worker is one slot of a round, so this caps the leases one slot task reads.",
    )
    max_leases_to_steal_at_one_time: _AtLeastOne = _setting(
        1,
        "Most leases the count-based rules move to one worker in one assignment run.",
        "maxLeasesToStealAtOneTime",
    )
    enable_priority_lease_assignment: bool = _setting(
        True,
        "Whether leases unrenewed for three lease durations are assigned before others.",
        "enablePriorityLeaseAssignment",
    )
    max_lease_renewal_threads: _AtLeastOne = _setting(
        20,
        "Size of the thread pool that renews a worker's leases.",
        "maxLeaseRenewalThreads",
    )
    consistent_reads: bool = _setting(
        False,
        "Whether reads of single leases are strongly consistent.",
        "consistentReads",
    )
    billing_mode: Literal["PAY_PER_REQUEST", "PROVISIONED"] = _setting(
        "PAY_PER_REQUEST",
        "Billing mode of the tables this project creates.",
        "billingMode",
    )
    initial_lease_table_read_capacity: _AtLeastOne = _setting(
        10,
        "Read capacity units of a PROVISIONED lease table at creation.",
        "initialLeaseTableReadCapacity",
    )
    initial_lease_table_write_capacity: _AtLeastOne = _setting(
        10,
        "Write capacity units of a PROVISIONED lease table at creation.",
        "initialLeaseTableWriteCapacity",
    )
    lease_table_deletion_protection_enabled: bool = _setting(
        False,
        "Whether the lease table is created with deletion protection (applied only at creation).",
        "leaseTableDeletionProtectionEnabled",
    )
    lease_table_pitr_enabled: bool = _setting(
        False,
        "Whether point-in-time recovery is switched on for the lease table, new or existing.",
        "leaseTablePitrEnabled",
    )
    tags: _TagTable = _setting(
        (),
        "Tags put on the tables at creation, given as a table, a JSON object or k=v,k2=v2.",
        "tags",
    )
    lease_table_scan_total_segments: Annotated[int, Field(ge=0, le=1_000_000)] = _setting(
        0,
        "Segments of the parallel lease-table scan; 0 sizes them from the table size as KCL does.",
        "leaseTableScanTotalSegments",
    )
    table_creation_timeout_seconds: _PositiveFloat = _setting(
        600.0,
        "How long to wait for a created table to become ACTIVE (fixed at 600 s in KCL).",
        None,
    )
    table_status_poll_seconds: _PositiveFloat = _setting(
        10.0,
        "How often to poll a table's status while waiting for it (fixed at 10 s in KCL).",
        None,
    )
    initial_position_in_stream: Annotated[Literal["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"], _TimestampGiven()] = (
        _setting(
            "LATEST",
            "Where leases created by shard sync start: TRIM_HORIZON, LATEST or AT_TIMESTAMP.",
            "initialPositionInStream",
        )
    )
    initial_position_timestamp: _IsoTimestamp = _setting(
        None,
        "The time AT_TIMESTAMP starts at, ISO 8601 with a time zone; only stored in configuration, "
        "as in KCL (the lease holds the sentinel AT_TIMESTAMP).",
        "initialPositionInStreamExtended.timestamp",
    )
    ignore_unexpected_child_shards: bool = _setting(
        False,
        "Sync anyway when child shards of still-open parents are listed, giving those children no lease.",
        "ignoreUnexpectedChildShards",
    )
    cleanup_leases_upon_shard_completion: bool = _setting(
        True,
        "Delete a SHARD_END lease once all its children have started and its own parents are gone.",
        "cleanupLeasesUponShardCompletion",
        batch_note="Cleanup runs in the leader's shard-sync step of every round instead of a 60 s timer.",
    )
    garbage_lease_cleanup_interval_millis: _NonNegativeInt = _setting(
        1_800_000,
        "Shortest time between two passes that ask Kinesis, shard by shard, whether the shards missing "
        "from the listing still exist; a lease is deleted as garbage only when Kinesis says its shard does not.",
        "garbageLeaseCleanupIntervalMillis",
        batch_note="Checked in the shard-sync step of each round; the time of a stream's last pass is kept "
        "in the coordinator-state table, and every pass that probed restarts the interval.",
    )
    leases_recovery_auditor_inconsistency_confidence_threshold: _AtLeastOne = _setting(
        3,
        "Consecutive audits that must see the same hash-range hole before it is confirmed (KCL then runs a full "
        "shard sync).",
        "leasesRecoveryAuditorInconsistencyConfidenceThreshold",
        batch_note="Counted in rounds and kept in the coordinator-state table. Every round runs a full shard sync "
        "first and is audited after it, so a confirmed hole is one that sync cannot close; the sync step's "
        "result reports it (`audits`).",
    )
    multi_stream: bool = _setting(
        False,
        "Consume several streams with one lease table, keyed <account>:<stream>:<creationEpoch>:<shardId>.",
        "MultiStreamTracker",
    )
    former_streams_leases_deletion_strategy: Literal[
        "NO_STREAMS_LEASES_DELETION", "FORMER_STREAMS_AUTO_DETECTION_DEFERRED_DELETION"
    ] = _setting(
        "NO_STREAMS_LEASES_DELETION",
        "What happens to the leases of a stream that is no longer configured (multi-stream mode).",
        "formerStreamsLeasesDeletionStrategy",
    )
    wait_period_to_delete_former_streams_millis: _NonNegativeInt = _setting(
        3_600_000,
        "How long a former stream must stay unconfigured before its leases are deleted.",
        "waitPeriodToDeleteFormerStreams",
    )
    lease_assignment_strategy: LeaseAssignmentStrategy = _setting(
        LEASE_ASSIGNMENT_STRATEGIES[0],
        "How the leader assigns leases: makespan (ours), variance (KCL's WORKER_UTILIZATION_AWARE) or "
        "count (LEASE_COUNT_BASED).",
        "leaseAssignmentStrategy",
        batch_note="KCL's default is variance. Here it is makespan, chosen by measurement "
        "(bench/balance_pipeline.py): a round ends when its slowest slot does, makespan brings the busiest "
        "slot to the lower bound and rebalances every round, while count left two hot shards on one slot "
        "(1.83x the bound) in every round, and so did variance until the load probe placed new leases by "
        "what waits on them (docs/performance.md).",
    )
    makespan_max_moves_per_round: _NonNegativeInt = _setting(
        0,
        "Most leases the makespan strategy may move while rebalancing in one round; 0 means no budget.",
        None,
    )
    rebalance_min_effect_percentage: _PercentageOrZero = _setting(
        8,
        "Smallest expected effect of a rebalance, in percent of the load it relieves, for it to be made at "
        "all (makespan: of the busiest slot's load; variance: of the fleet-average metric); 0 turns the "
        "floor off.",
        None,
        batch_note="KCL's open PR #1814 skips a variance rebalance whose expected CPU effect is under 1 "
        "point. Here the floor is relative and also applies to makespan, so that +/-5 % measurement noise "
        "moves no lease once the assignment has converged; 5 still let makespan reshuffle a converged "
        "fleet now and then (bench/assignment_stability.py).",
    )
    rebalance_threshold_percentage: _Percentage = _setting(
        10,
        "How far from the mean utilization a worker may be before variance balancing moves leases.",
        "reBalanceThresholdPercentage",
    )
    dampening_percentage: _Percentage = _setting(
        60,
        "Share of the computed excess throughput that balancing moves in one run (KCL's code says 60, "
        "its deep-dive doc 80).",
        "dampeningPercentage",
    )
    allow_throughput_overshoot: bool = _setting(
        True,
        "Whether balancing may move one lease more than the dampened excess when that lease is needed.",
        "allowThroughputOvershoot",
    )
    max_throughput_per_host_kbps: _PositiveFloat = _setting(
        math.inf,
        "Most throughput assigned to one worker, in KB/s; inf (KCL's Double.MAX_VALUE) means no limit.",
        "maxThroughputPerHostKBps",
    )
    variance_balancing_frequency: _AtLeastOne = _setting(
        3,
        "Variance balancing runs on every this-many-th assignment run.",
        "varianceBalancingFrequency",
        batch_note="Counted in rounds, since the leader assigns once per round.",
    )
    worker_metrics_ema_alpha: Annotated[_Float, Field(gt=0, le=1)] = _setting(
        0.5,
        "Weight of the newest sample in the exponential moving average of worker metrics.",
        "workerMetricsEMAAlpha",
    )
    no_of_persisted_metrics_per_worker_metrics: _AtLeastOne = _setting(
        10,
        "Number of values kept per metric in a worker-metrics item.",
        "noOfPersistedMetricsPerWorkerMetrics",
    )
    stale_worker_metrics_entry_cleanup_duration_millis: _PositiveInt = _setting(
        86_400_000,
        "A worker-metrics item of a worker that is not one of the round's slots and was last updated "
        "longer ago than this is deleted by the round's assignment (conditional on its update time).",
        "staleWorkerMetricsEntryCleanupDuration",
        batch_note="The round's own slots are never deleted, however long ago their last round ran.",
    )
    graceful_lease_handoff_enabled: bool = _setting(
        True,
        "Whether a lease moved by balancing is handed over at a checkpoint instead of taken.",
        "isGracefulLeaseHandoffEnabled",
    )
    graceful_lease_handoff_timeout_millis: _NonNegativeInt = _setting(
        30000,
        "How long a graceful handoff may wait for the current owner before the lease is taken.",
        "gracefulLeaseHandoffTimeoutMillis",
    )
    leader_lease_duration_millis: _PositiveInt = _setting(
        120000,
        "Lease duration of the leader lock: an unchanged lock observed for this long may be taken over.",
        "dynamoDbLockBasedLeaderLeaseDurationInMillis",
        batch_note="One round at a time per application: whoever runs the round's current step holds it.",
    )
    leader_heartbeat_period_millis: Annotated[_PositiveInt, _Below("leader_lease_duration_millis", divisor=3)] = (
        _setting(
            30000,
            "How often the leader lock's holder heartbeats it.",
            "dynamoDbLockBasedLeaderHeartbeatPeriodInMillis",
            batch_note="The Spark driver heartbeats the lock too while the consume step runs. Below a third of "
            "the lease, so that a holder whose one heartbeat failed still holds the lock at the next one "
            "(a holder counts its lease a tenth short, for clock skew).",
        )
    )
    shard_read_limit_kbps: _PositiveFloat = _setting(
        2048.0,
        "Kinesis' read limit per shard in KB/s (KB = 1024 bytes, as in throughputKBps): a shard reader "
        "paces its GetRecords calls so that the bytes it reads (data plus partition key) stay within it.",
        None,
        batch_note="Kinesis allows 2 MB/s per shard, shared by every reader of the shard; set it lower "
        "when another consumer reads the same stream, or to a stand-in's cap in benchmarks.",
    )
    retrieval: Literal["polling", "fan_out"] = _setting(
        "polling",
        "How slots read their shards: polling (GetRecords, sharing each shard's 5 calls/s and 2 MB/s with "
        "the stream's other polling readers) or fan_out (SubscribeToShard through the application's "
        "registered stream consumer, a dedicated 2 MB/s per shard).",
        "retrievalMode",
        batch_note="KCL's default is fan-out; here polling is, because a consumer is billed per shard-hour "
        "even between rounds (docs/cost.md). Rounds may switch modes: checkpoints mean the same in both.",
    )
    consumer_name: _ConsumerName = _setting(
        None,
        "Name of the application's enhanced fan-out consumer on each stream (fan_out retrieval); unset "
        "means the application name, as in KCL.",
        "consumerName",
    )
    consumer_activation_timeout_millis: _PositiveInt = _setting(
        60000,
        "How long registering the application's fan-out consumer (the table step, `leasectl init`) waits "
        "for it to become ACTIVE before failing with an error naming it.",
        None,
        batch_note="KCL describes the consumer up to maxDescribeStreamConsumerRetries (10) times, "
        "retryBackoffMillis (1 s) apart, and its always-on worker tries again later. Here a consumer is "
        "registered once per application, and a table step that gives up fails its round before any lease "
        "moves, so it waits longer: Kinesis takes seconds to tens of seconds, more while the stream has "
        "5 consumers in CREATING at once.",
    )
    metrics_level: MetricsLevelName = _setting(
        "DETAILED",
        "Which of the round's metrics go to CloudWatch: NONE, SUMMARY (the most significant) or DETAILED "
        "(all); each metric's level is in docs/metrics.md. NONE also sends nothing to Airflow's metrics backend.",
        "metricsLevel",
        batch_note="Published once per round by its finalize step, at the round's end, instead of every "
        "metricsBufferTimeMillis; a failure to publish is logged and kept in the round's summary, and never "
        "fails the round.",
    )
    metrics_enabled_dimensions: _Dimensions = _setting(
        (ALL_METRICS_DIMENSIONS,),
        "The dimensions the CloudWatch metrics keep, of Operation, ShardId, StreamId, WorkerIdentifier, or "
        "ALL; Operation is always kept, and values left with the same dimensions are added up.",
        "metricsEnabledDimensions",
    )
    metrics_namespace: _Namespace = _setting(
        None,
        "CloudWatch namespace of the metrics; unset means the application name, as in KCL.",
        "namespace",
    )
    aws_region: _Region = _setting(
        None,
        "AWS region of every client; unset means boto3's default chain.",
        None,
    )
    aws_endpoint_url_dynamodb: _EndpointUrl = _setting(
        None,
        "DynamoDB endpoint; unset means boto3's resolution (AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL).",
        None,
    )
    aws_endpoint_url_kinesis: _EndpointUrl = _setting(
        None,
        "Kinesis endpoint; unset means boto3's resolution (AWS_ENDPOINT_URL_KINESIS, AWS_ENDPOINT_URL).",
        None,
    )
    aws_endpoint_url_s3: _EndpointUrl = _setting(
        None,
        "S3 endpoint of the sink; unset means boto3's resolution (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL).",
        None,
    )
    aws_endpoint_url_cloudwatch: _EndpointUrl = _setting(
        None,
        "CloudWatch endpoint of the metrics; unset means boto3's resolution (AWS_ENDPOINT_URL_CLOUDWATCH, "
        "AWS_ENDPOINT_URL).",
        None,
    )
    dependency_retry_attempts: _AtLeastOne = _setting(
        6,
        "Attempts per AWS call that fails for a reason that may go away (throttling, 5xx, transport).",
        None,
    )
    dependency_retry_base_millis: _AtLeastOne = _setting(
        50,
        "First backoff between attempts of a failing AWS call; it doubles with each retry.",
        None,
    )
    dependency_retry_max_millis: Annotated[int, _AtLeast("dependency_retry_base_millis")] = _setting(
        5000,
        "Longest backoff between attempts of a failing AWS call.",
        None,
    )

    if not TYPE_CHECKING:  # type checkers keep the typed keyword signature pydantic declares

        def __init__(self, **values: Any) -> None:
            try:
                super().__init__(**values)
            except ValidationError as error:
                raise _configuration_error(error) from None

    @model_validator(mode="after")
    def _check_rules_between_settings(self) -> Self:
        # After every field is valid, so that a rule only ever compares well-typed values.
        for name, spec in type(self).model_fields.items():
            value = getattr(self, name)
            for rule in spec.metadata if value is not None else ():
                if isinstance(rule, _RULES_BETWEEN_SETTINGS):
                    problem = rule.problem(value, self)
                    if problem is not None:
                        raise ConfigurationError(name, problem)
        return self

    @property
    def renewer_interval_millis(self) -> int:
        """KCL's renewer period: floor(lease duration / 3) - epsilon (3308 ms by default)."""
        return self.failover_time_millis // 3 - self.epsilon_millis

    @property
    def stream_consumer_name(self) -> str:
        """The enhanced fan-out consumer's name: `consumer_name`, else the application name (KCL)."""
        return self.consumer_name or self.require_application_name()

    @property
    def cloudwatch_namespace(self) -> str:
        """The metrics' namespace: `metrics_namespace`, else the application name (KCL)."""
        return self.metrics_namespace or self.require_application_name()

    @property
    def lease_table(self) -> str:
        return self.lease_table_name or self.require_application_name()

    @property
    def worker_metrics_table(self) -> str:
        return self.require_application_name() + WORKER_METRICS_TABLE_SUFFIX

    @property
    def coordinator_state_table(self) -> str:
        return self.require_application_name() + COORDINATOR_STATE_TABLE_SUFFIX

    def require_application_name(self) -> str:
        """The application name, for the commands that cannot work without one."""
        if not self.application_name:
            raise ConfigurationError(
                "application_name",
                f"is required: set it in the TOML file, as {ENV_PREFIX}APPLICATION_NAME "
                "or with --set application_name=...",
            )
        return self.application_name

    def with_overrides(self, **changes: Any) -> ConsumerConfig:
        """A copy with typed `changes`, validated like any construction."""
        for key in changes:
            _known_key(key, _KEYS, "with_overrides")
        return type(self)(**{**dict(self), **changes})

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable settings; `load_config(overrides=...)` reads them back unchanged."""
        return self.model_dump(mode="json")

    @classmethod
    def describe(cls) -> list[SettingDescription]:
        """The settings reference, one row per field, in declaration order."""
        return [
            SettingDescription(
                key=name,
                type_name=_type_name(spec),
                default=spec.default,
                kcl_name=_extra(spec).get("kcl_name"),
                doc=spec.description or "",
                batch_note=_extra(spec).get("batch_note"),
                allowed=" and ".join(_allowed(spec)) or None,
            )
            for name, spec in cls.model_fields.items()
        ]


# --------------------------------------------------------------------------------------------------
# Reading the fields: type names, allowed values, pydantic's errors in our words.


def _extra(spec: FieldInfo) -> dict[str, Any]:
    return spec.json_schema_extra if isinstance(spec.json_schema_extra, dict) else {}


def _type_name(spec: FieldInfo) -> str:
    """The type as the reference names it and as text is read: tags are a table of strings."""
    annotation = spec.annotation
    if get_origin(annotation) is Literal:
        return "str"
    if annotation == Tags:
        return "dict[str, str]"
    if annotation == tuple[str, ...]:
        return "list[str]"
    if set(get_args(annotation)) == {str, type(None)}:
        return "str | None"
    return getattr(annotation, "__name__", str(annotation))


def _range(spec: FieldInfo) -> str | None:
    low = next((item for item in spec.metadata if isinstance(item, Gt | Ge)), None)
    high = next((item.le for item in spec.metadata if isinstance(item, Le)), None)
    if isinstance(low, Gt):
        return f"greater than {low.gt}" + (f" and at most {high}" if high is not None else "")
    if isinstance(low, Ge):
        return f"at least {low.ge}" if high is None else f"between {low.ge} and {high}"
    return None if high is None else f"at most {high}"


def _one_of(spec: FieldInfo) -> str | None:
    if get_origin(spec.annotation) is not Literal:
        return None
    return "one of " + ", ".join(repr(choice) for choice in get_args(spec.annotation))


def _constraints(spec: FieldInfo) -> list[str]:
    """What the type of `spec` allows, in words: its choices or range, then its checks."""
    parts = [part for part in (_one_of(spec), _range(spec)) if part]
    return parts + [item.allowed for item in spec.metadata if isinstance(item, _Allowed)]


def _allowed(spec: FieldInfo) -> list[str]:
    """What `spec` allows, in words: its constraints and the rules that relate it to other settings."""
    return _constraints(spec) + [item.allowed for item in spec.metadata if isinstance(item, _RULES_BETWEEN_SETTINGS)]


_EXPECTED = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean", "string_type": "a string"}


def _configuration_error(error: ValidationError) -> ConfigurationError:
    """The first of pydantic's errors, in the words of the reference, naming the key."""
    first = error.errors(include_url=False)[0]
    kind, value, context = first["type"], first["input"], first.get("ctx", {})
    if isinstance(rule_error := context.get("error"), ConfigurationError):  # a rule between settings
        return rule_error
    key = str(first["loc"][0])
    if kind == "extra_forbidden":
        return ConfigurationError(key, _unknown_key_problem(key, _KEYS, "ConsumerConfig"))
    spec = ConsumerConfig.model_fields[key]
    if kind in _EXPECTED:
        return ConfigurationError(key, f"expected {_EXPECTED[kind]}, got {value!r}")
    if kind == "value_error":  # our validators word the whole problem
        return ConfigurationError(key, str(context["error"]))
    # A constraint of the type: a range, a choice, a pattern or an `_Allowed` check.
    return ConfigurationError(key, _must_be(" and ".join(_constraints(spec)) or first["msg"], value))


_KEYS = {name: name for name in ConsumerConfig.model_fields}
_ENV_KEYS = {ENV_PREFIX + name.upper(): name for name in ConsumerConfig.model_fields}


# --------------------------------------------------------------------------------------------------
# Reading text (environment, --set): per type, raising ValueError with the problem; callers add the key.


def _expected(what: str, value: object) -> ValueError:
    return ValueError(f"expected {what}, got {value!r}")


def _read_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _expected("an integer", text) from None


def _read_float(text: str) -> float:
    try:
        value = float(text)  # "inf" included: the value of no limit
    except ValueError:
        raise _expected("a number", text) from None
    if math.isnan(value):
        raise _expected("a number", text)
    return value


_BOOLEAN_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _read_bool(text: str) -> bool:
    try:
        return _BOOLEAN_WORDS[text.strip().lower()]
    except KeyError:
        raise _expected("true/false, yes/no or 1/0", text) from None


def _read_optional_str(text: str) -> str | None:
    # Text cannot carry None, and an empty value is how shells and forms say "unset".
    return None if text.strip().lower() in ("", "none", "null") else text


def _read_tags(text: str) -> object:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"expected a JSON object of tags: {error}") from None
    return dict(_tag_pair(item) for item in text.split(",") if item.strip())


def _read_names(text: str) -> object:
    # Comma-separated names; a JSON list too, as `to_dict` writes one.
    return json.loads(text) if text.lstrip().startswith("[") else text


def _tag_pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise _expected("k=v,k2=v2 tag pairs", item.strip())
    return key.strip(), value.strip()


_TEXT_READERS: dict[str, Callable[[str], object]] = {
    "int": _read_int,
    "float": _read_float,
    "bool": _read_bool,
    "str": str,
    "str | None": _read_optional_str,
    "dict[str, str]": _read_tags,
    "list[str]": _read_names,
}
_FIELD_READERS = {row.key: _TEXT_READERS[row.type_name] for row in ConsumerConfig.describe()}


# --------------------------------------------------------------------------------------------------
# Loading.


@dataclass(frozen=True)
class _Setting:
    """One value read from one source; `origin` says where, for error messages."""

    key: str
    value: object
    origin: str


def load_config(
    toml_path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Sequence[str] | Mapping[str, object] = (),
) -> ConsumerConfig:
    """Defaults < TOML file < `KINESIS_LEASE_*` environment < overrides, validated."""
    settings: dict[str, _Setting] = {}
    for setting in (
        *_toml_settings(toml_path),
        *_env_settings(os.environ if environ is None else environ),
        *_override_settings(overrides),
    ):
        settings[setting.key] = setting  # later sources win
    try:
        values: dict[str, Any] = {key: setting.value for key, setting in settings.items()}
        return ConsumerConfig(**values)
    except ConfigurationError as error:
        if error.key not in settings:
            raise
        raise _located(error.key, error.problem, settings[error.key].origin) from None


def _located(key: str, problem: str, origin: str) -> ConfigurationError:
    return ConfigurationError(key, f"{problem} (from {origin})")


def _unknown_key_problem(name: str, names: Mapping[str, str], origin: str) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"is not a known setting (in {origin}){hint}"


def _known_key(name: str, names: Mapping[str, str], origin: str) -> str:
    """The setting `name` stands for; an unknown name is an error suggesting the closest one."""
    if name in names:
        return names[name]
    raise ConfigurationError(name, _unknown_key_problem(name, names, origin))


def _text_setting(key: str, text: str, origin: str) -> _Setting:
    try:
        return _Setting(key, _FIELD_READERS[key](text), origin)
    except ValueError as error:
        raise _located(key, str(error), origin) from None


def _toml_settings(path: str | os.PathLike[str] | None) -> list[_Setting]:
    if path is None:
        return []
    origin = f"TOML file {os.fspath(path)}"
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as error:
        raise ConfigurationError("config_file", f"cannot read {os.fspath(path)}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError("config_file", f"{os.fspath(path)} is not valid TOML: {error}") from None
    except UnicodeDecodeError as error:  # tomllib reads bytes but decodes them all as UTF-8 first
        raise ConfigurationError(
            "config_file",
            f"{os.fspath(path)} is not UTF-8 text, as TOML must be: byte {error.object[error.start]:#04x} "
            f"at offset {error.start} ({error.reason}); save the file as UTF-8",
        ) from None
    # TOML values are typed already; ConsumerConfig checks them (a bool is not an int).
    return [_Setting(_known_key(key, _KEYS, origin), value, origin) for key, value in document.items()]


def _env_key(name: str) -> str:
    """The setting a `KINESIS_LEASE_*` variable sets; an unknown one is an error suggesting the variable
    of the closest setting, matched on the part after the prefix in any case (the prefix every
    variable shares would make any name look close to some setting)."""
    if name in _ENV_KEYS:
        return _ENV_KEYS[name]
    close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX).lower(), _KEYS, n=1)
    hint = f"; did you mean {ENV_PREFIX + close[0].upper()!r}?" if close else ""
    raise ConfigurationError(name, f"is not a known setting (in the environment){hint}")


def _env_settings(environ: Mapping[str, str]) -> list[_Setting]:
    return [
        _text_setting(_env_key(name), text, f"environment variable {name}")
        for name, text in sorted(environ.items())
        if name.startswith(ENV_PREFIX)
    ]


def _override_settings(overrides: Sequence[str] | Mapping[str, object]) -> list[_Setting]:
    if isinstance(overrides, Mapping):
        return [_mapped_setting(_known_key(key, _KEYS, "overrides"), value) for key, value in overrides.items()]
    # A bare string is a Sequence[str] too: read it as one override, not one per character.
    return [_assignment(text) for text in ([overrides] if isinstance(overrides, str) else overrides)]


def _mapped_setting(key: str, value: object) -> _Setting:
    # Strings read like --set values: DAG params often arrive as text, and to_dict writes inf as "inf".
    if isinstance(value, str):
        return _text_setting(key, value, "overrides")
    return _Setting(key, value, "overrides")


def _assignment(text: str) -> _Setting:
    key, sep, value = text.partition("=")
    if not sep:
        raise ConfigurationError(text, "an override must look like key=value")
    origin = f"override {text!r}"
    return _text_setting(_known_key(key.strip(), _KEYS, origin), value.strip(), origin)
