"""The consumer's configuration: KCL's lease-management settings in snake_case, plus a few of ours.

`ConsumerConfig` is the one place every setting is declared: each field's metadata carries its
one-sentence doc, its KCL name, what our batch adaptation changes and its checks, so the reference
documentation is generated from the fields and cannot drift from the code.

`load_config` layers the sources, later ones winning: defaults < TOML file (flat top-level keys) <
environment (`KINESIS_LEASE_<KEY>`) < overrides (`--set key=value` of the CLI, DAG params). Every
problem raises `ConfigurationError` naming the offending key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Protocol, TypeAlias, get_type_hints
from urllib.parse import urlsplit

from lease_core.errors import ConfigurationError

ENV_PREFIX = "KINESIS_LEASE_"
# KCL 3.0-3.4 derive these table names from the application name; KCL tooling expects them.
WORKER_METRICS_TABLE_SUFFIX = "-WorkerMetricStats"
COORDINATOR_STATE_TABLE_SUFFIX = "-CoordinatorState"

Tags: TypeAlias = tuple[tuple[str, str], ...]
"""Table tags as sorted (key, value) pairs: a tuple, unlike a dict, keeps the config hashable."""


# --------------------------------------------------------------------------------------------------
# Checks: each knows the values it allows, as text for the docs and as a test for validation.


class _Check(Protocol):
    @property
    def allowed(self) -> str: ...

    def problem(self, value: Any, config: ConsumerConfig) -> str | None: ...


def _must_be(allowed: str, value: object) -> str:
    return f"must be {allowed}, got {value!r}"


@dataclass(frozen=True)
class _Bounds:
    """A numeric range, closed unless `low_exclusive` (for settings that must be positive)."""

    low: float
    high: float | None = None
    low_exclusive: bool = False

    @property
    def allowed(self) -> str:
        if self.low_exclusive:
            low = f"greater than {self.low}"
            return low if self.high is None else f"{low} and at most {self.high}"
        return f"at least {self.low}" if self.high is None else f"between {self.low} and {self.high}"

    def problem(self, value: float, config: ConsumerConfig) -> str | None:
        too_low = value <= self.low if self.low_exclusive else value < self.low
        too_high = self.high is not None and value > self.high
        return _must_be(self.allowed, value) if too_low or too_high else None


@dataclass(frozen=True)
class _OneOf:
    choices: tuple[str, ...]

    @property
    def allowed(self) -> str:
        return "one of " + ", ".join(repr(choice) for choice in self.choices)

    def problem(self, value: str, config: ConsumerConfig) -> str | None:
        return None if value in self.choices else _must_be(self.allowed, value)


@dataclass(frozen=True)
class _HttpUrl:
    allowed: str = "an http:// or https:// URL"

    def problem(self, value: str, config: ConsumerConfig) -> str | None:
        parts = urlsplit(value)
        return None if parts.scheme in ("http", "https") and parts.netloc else _must_be(self.allowed, value)


@dataclass(frozen=True)
class _Matches:
    """Text matching `pattern` in full; `allowed` says the same for people."""

    pattern: str
    allowed: str

    def problem(self, value: str, config: ConsumerConfig) -> str | None:
        return None if re.fullmatch(self.pattern, value) else _must_be(self.allowed, value)


def _table_name(max_length: int = 255) -> _Matches:
    """A DynamoDB table name; a shorter `max_length` leaves room for the suffixes of derived tables."""
    return _Matches(
        rf"[A-Za-z0-9_.-]{{3,{max_length}}}",
        f"3 to {max_length} characters from A-Z a-z 0-9 _ - . (a DynamoDB table name)",
    )


@dataclass(frozen=True)
class _BelowSetting:
    """Strictly below another (earlier declared, so already validated) setting divided by `divisor`."""

    other: str
    divisor: int = 1

    @property
    def allowed(self) -> str:
        return f"less than {self.other}" + (f" // {self.divisor}" if self.divisor != 1 else "")

    def problem(self, value: int, config: ConsumerConfig) -> str | None:
        limit = getattr(config, self.other) // self.divisor
        return None if value < limit else _must_be(f"{self.allowed} ({limit})", value)


@dataclass(frozen=True)
class _AtLeastSetting:
    """At least another (earlier declared, so already validated) setting."""

    other: str

    @property
    def allowed(self) -> str:
        return f"at least {self.other}"

    def problem(self, value: int, config: ConsumerConfig) -> str | None:
        limit = getattr(config, self.other)
        return None if value >= limit else _must_be(f"{self.allowed} ({limit})", value)


def parse_iso_timestamp(text: str) -> datetime:
    """An ISO 8601 time with a zone (`Z` accepted); ValueError otherwise."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return moment


@dataclass(frozen=True)
class _IsoTimestamp:
    allowed: str = "an ISO 8601 time with a time zone, such as 2026-11-22T10:00:00Z"

    def problem(self, value: str, config: ConsumerConfig) -> str | None:
        try:
            parse_iso_timestamp(value)
        except ValueError:
            return _must_be(self.allowed, value)
        return None


@dataclass(frozen=True)
class _TimestampGiven:
    """AT_TIMESTAMP needs initial_position_timestamp (the lease only stores the sentinel)."""

    allowed: str = "accompanied by initial_position_timestamp when AT_TIMESTAMP"

    def problem(self, value: str, config: ConsumerConfig) -> str | None:
        if value == "AT_TIMESTAMP" and config.initial_position_timestamp is None:
            return "AT_TIMESTAMP needs initial_position_timestamp to be set"
        return None


_POSITIVE = _Bounds(0, low_exclusive=True)
_AT_LEAST_ONE = _Bounds(1)
_PERCENTAGE = _Bounds(1, 100)


def _setting(default: Any, doc: str, kcl_name: str | None, *checks: _Check, batch_note: str | None = None) -> Any:
    """A dataclass field with the metadata `describe()` and validation read."""
    return field(
        default=default,
        metadata={"doc": doc, "kcl_name": kcl_name, "batch_note": batch_note, "checks": checks},
    )


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


# The names of `lease_assignment_strategy`, the default first: the one list the configuration, the
# DAG's form, the deciders (`lease_core.assignment.strategies`) and the benchmarks use.
LEASE_ASSIGNMENT_STRATEGIES = ("makespan", "variance", "count")


@dataclass(frozen=True)
class ConsumerConfig:
    """Every setting of the consumer; any construction validates (see `__post_init__`)."""

    application_name: str | None = _setting(
        None,
        "Name of the consuming application; it names the lease table and the tables derived from it.",
        "applicationName",
        _table_name(255 - len(WORKER_METRICS_TABLE_SUFFIX)),
    )
    lease_table_name: str | None = _setting(
        None,
        "Name of the DynamoDB lease table; unset means the application name, as in KCL.",
        "tableName",
        _table_name(),
    )
    failover_time_millis: int = _setting(
        10000,
        "Lease duration: a lease whose counter has not moved for this long is considered expired.",
        "failoverTimeMillis",
        _POSITIVE,
        batch_note="Slot tasks claim their leases and renew them every renewer interval while they work.",
    )
    epsilon_millis: int = _setting(
        25,
        "Safety margin subtracted from a third of the lease duration to get the renewer interval.",
        "epsilonMillis",
        _Bounds(0),
        # Against the floored third, so that the renewer interval stays at least 1 ms.
        _BelowSetting("failover_time_millis", divisor=3),
    )
    max_leases_for_worker: int = _setting(
        2147483647,
        "Most leases one worker may hold (KCL's Integer.MAX_VALUE means unlimited).",
        "maxLeasesForWorker",
        _AT_LEAST_ONE,
        batch_note="A worker is one slot of a round, so this caps the leases one slot task reads.",
    )
    max_leases_to_steal_at_one_time: int = _setting(
        1,
        "Most leases the count-based rules move to one worker in one assignment run.",
        "maxLeasesToStealAtOneTime",
        _AT_LEAST_ONE,
    )
    enable_priority_lease_assignment: bool = _setting(
        True,
        "Whether leases unrenewed for three lease durations are assigned before others.",
        "enablePriorityLeaseAssignment",
    )
    max_lease_renewal_threads: int = _setting(
        20,
        "Size of the thread pool that renews a worker's leases.",
        "maxLeaseRenewalThreads",
        _AT_LEAST_ONE,
    )
    consistent_reads: bool = _setting(
        False,
        "Whether reads of single leases are strongly consistent.",
        "consistentReads",
    )
    billing_mode: str = _setting(
        "PAY_PER_REQUEST",
        "Billing mode of the tables this project creates.",
        "billingMode",
        _OneOf(("PAY_PER_REQUEST", "PROVISIONED")),
    )
    initial_lease_table_read_capacity: int = _setting(
        10,
        "Read capacity units of a PROVISIONED lease table at creation.",
        "initialLeaseTableReadCapacity",
        _AT_LEAST_ONE,
    )
    initial_lease_table_write_capacity: int = _setting(
        10,
        "Write capacity units of a PROVISIONED lease table at creation.",
        "initialLeaseTableWriteCapacity",
        _AT_LEAST_ONE,
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
    tags: Tags = _setting(
        (),
        "Tags put on the tables at creation, given as a table, a JSON object or k=v,k2=v2.",
        "tags",
    )
    lease_table_scan_total_segments: int = _setting(
        0,
        "Segments of the parallel lease-table scan; 0 sizes them from the table size as KCL does.",
        "leaseTableScanTotalSegments",
        _Bounds(0, 1_000_000),
    )
    table_creation_timeout_seconds: float = _setting(
        600.0,
        "How long to wait for a created table to become ACTIVE (fixed at 600 s in KCL).",
        None,
        _POSITIVE,
    )
    table_status_poll_seconds: float = _setting(
        10.0,
        "How often to poll a table's status while waiting for it (fixed at 10 s in KCL).",
        None,
        _POSITIVE,
    )
    initial_position_in_stream: str = _setting(
        "LATEST",
        "Where leases created by shard sync start: TRIM_HORIZON, LATEST or AT_TIMESTAMP.",
        "initialPositionInStream",
        _OneOf(("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP")),
        _TimestampGiven(),
    )
    initial_position_timestamp: str | None = _setting(
        None,
        "The time AT_TIMESTAMP starts at, ISO 8601 with a time zone; only stored in configuration, "
        "as in KCL (the lease holds the sentinel AT_TIMESTAMP).",
        "initialPositionInStreamExtended.timestamp",
        _IsoTimestamp(),
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
    garbage_lease_cleanup_interval_millis: int = _setting(
        1_800_000,
        "Shortest time between two passes that ask Kinesis, shard by shard, whether the shards missing "
        "from the listing still exist; a lease is deleted as garbage only when Kinesis says its shard does not.",
        "garbageLeaseCleanupIntervalMillis",
        _Bounds(0),
        batch_note="Checked in the shard-sync step of each round; the time of a stream's last pass is kept "
        "in the coordinator-state table, and every pass that probed restarts the interval.",
    )
    leases_recovery_auditor_inconsistency_confidence_threshold: int = _setting(
        3,
        "Consecutive audits that must see the same hash-range hole before a full shard sync runs.",
        "leasesRecoveryAuditorInconsistencyConfidenceThreshold",
        _AT_LEAST_ONE,
        batch_note="Counted in rounds (one audit per round) and kept in the coordinator-state table.",
    )
    multi_stream: bool = _setting(
        False,
        "Consume several streams with one lease table, keyed <account>:<stream>:<creationEpoch>:<shardId>.",
        "MultiStreamTracker",
    )
    former_streams_leases_deletion_strategy: str = _setting(
        "NO_STREAMS_LEASES_DELETION",
        "What happens to the leases of a stream that is no longer configured (multi-stream mode).",
        "formerStreamsLeasesDeletionStrategy",
        _OneOf(("NO_STREAMS_LEASES_DELETION", "FORMER_STREAMS_AUTO_DETECTION_DEFERRED_DELETION")),
    )
    wait_period_to_delete_former_streams_millis: int = _setting(
        3_600_000,
        "How long a former stream must stay unconfigured before its leases are deleted.",
        "waitPeriodToDeleteFormerStreams",
        _Bounds(0),
    )
    lease_assignment_strategy: str = _setting(
        LEASE_ASSIGNMENT_STRATEGIES[0],
        "How the leader assigns leases: makespan (ours), variance (KCL's WORKER_UTILIZATION_AWARE) or "
        "count (LEASE_COUNT_BASED).",
        "leaseAssignmentStrategy",
        _OneOf(LEASE_ASSIGNMENT_STRATEGIES),
        batch_note="KCL's default is variance. Here it is makespan, chosen by measurement "
        "(bench/balance_pipeline.py): a round ends when its slowest slot does, makespan brings the busiest "
        "slot to the lower bound from the second round on and rebalances every round, while variance and "
        "count left two hot shards on one slot (1.83x the bound) in every round.",
    )
    makespan_max_moves_per_round: int = _setting(
        0,
        "Most leases the makespan strategy may move while rebalancing in one round; 0 means no budget.",
        None,
        _Bounds(0),
    )
    rebalance_threshold_percentage: int = _setting(
        10,
        "How far from the mean utilization a worker may be before variance balancing moves leases.",
        "reBalanceThresholdPercentage",
        _PERCENTAGE,
    )
    dampening_percentage: int = _setting(
        60,
        "Share of the computed excess throughput that balancing moves in one run (KCL's code says 60, "
        "its deep-dive doc 80).",
        "dampeningPercentage",
        _PERCENTAGE,
    )
    allow_throughput_overshoot: bool = _setting(
        True,
        "Whether balancing may move one lease more than the dampened excess when that lease is needed.",
        "allowThroughputOvershoot",
    )
    max_throughput_per_host_kbps: float = _setting(
        math.inf,
        "Most throughput assigned to one worker, in KB/s; inf (KCL's Double.MAX_VALUE) means no limit.",
        "maxThroughputPerHostKBps",
        _POSITIVE,
    )
    variance_balancing_frequency: int = _setting(
        3,
        "Variance balancing runs on every this-many-th assignment run.",
        "varianceBalancingFrequency",
        _AT_LEAST_ONE,
        batch_note="Counted in rounds, since the leader assigns once per round.",
    )
    worker_metrics_ema_alpha: float = _setting(
        0.5,
        "Weight of the newest sample in the exponential moving average of worker metrics.",
        "workerMetricsEMAAlpha",
        _Bounds(0, 1, low_exclusive=True),
    )
    no_of_persisted_metrics_per_worker_metrics: int = _setting(
        10,
        "Number of values kept per metric in a worker-metrics item.",
        "noOfPersistedMetricsPerWorkerMetrics",
        _AT_LEAST_ONE,
    )
    graceful_lease_handoff_enabled: bool = _setting(
        True,
        "Whether a lease moved by balancing is handed over at a checkpoint instead of taken.",
        "isGracefulLeaseHandoffEnabled",
    )
    graceful_lease_handoff_timeout_millis: int = _setting(
        30000,
        "How long a graceful handoff may wait for the current owner before the lease is taken.",
        "gracefulLeaseHandoffTimeoutMillis",
        _Bounds(0),
    )
    leader_lease_duration_millis: int = _setting(
        120000,
        "Lease duration of the leader lock: an unchanged lock observed for this long may be taken over.",
        "dynamoDbLockBasedLeaderLeaseDurationInMillis",
        _POSITIVE,
        batch_note="One round at a time per application: whoever runs the round's current step holds it.",
    )
    leader_heartbeat_period_millis: int = _setting(
        30000,
        "How often the leader lock's holder heartbeats it.",
        "dynamoDbLockBasedLeaderHeartbeatPeriodInMillis",
        _POSITIVE,
        _BelowSetting("leader_lease_duration_millis", divisor=3),
        batch_note="The Spark driver heartbeats the lock too while the consume step runs. Below a third of "
        "the lease, so that a holder whose one heartbeat failed still holds the lock at the next one "
        "(a holder counts its lease a tenth short, for clock skew).",
    )
    aws_region: str | None = _setting(
        None,
        "AWS region of every client; unset means boto3's default chain.",
        None,
        _Matches(r"[a-z0-9-]+", "an AWS region name such as 'eu-west-1'"),
    )
    aws_endpoint_url_dynamodb: str | None = _setting(
        None,
        "DynamoDB endpoint; unset means boto3's resolution (AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL).",
        None,
        _HttpUrl(),
    )
    aws_endpoint_url_kinesis: str | None = _setting(
        None,
        "Kinesis endpoint; unset means boto3's resolution (AWS_ENDPOINT_URL_KINESIS, AWS_ENDPOINT_URL).",
        None,
        _HttpUrl(),
    )
    aws_endpoint_url_s3: str | None = _setting(
        None,
        "S3 endpoint of the sink; unset means boto3's resolution (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL).",
        None,
        _HttpUrl(),
    )
    dependency_retry_attempts: int = _setting(
        6,
        "Attempts per AWS call that fails for a reason that may go away (throttling, 5xx, transport).",
        None,
        _AT_LEAST_ONE,
    )
    dependency_retry_base_millis: int = _setting(
        50,
        "First backoff between attempts of a failing AWS call; it doubles with each retry.",
        None,
        _AT_LEAST_ONE,
    )
    dependency_retry_max_millis: int = _setting(
        5000,
        "Longest backoff between attempts of a failing AWS call.",
        None,
        _AtLeastSetting("dependency_retry_base_millis"),
    )

    def __post_init__(self) -> None:
        # Types first, so that checks (including cross-field ones) only ever see well-typed values.
        for spec in fields(self):
            try:
                value = _FIELD_TYPES[spec.name].accept(getattr(self, spec.name))
            except ValueError as error:
                raise ConfigurationError(spec.name, str(error)) from None
            # Store the normal form (float for float fields, sorted pairs for tags) so equal
            # configurations compare and hash equal.
            object.__setattr__(self, spec.name, value)
        for spec in fields(self):
            value = getattr(self, spec.name)
            for check in spec.metadata["checks"] if value is not None else ():
                problem = check.problem(value, self)
                if problem is not None:
                    raise ConfigurationError(spec.name, problem)

    @property
    def renewer_interval_millis(self) -> int:
        """KCL's renewer period: floor(lease duration / 3) - epsilon (3308 ms by default)."""
        return self.failover_time_millis // 3 - self.epsilon_millis

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
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable settings; `load_config(overrides=...)` reads them back unchanged."""
        return {spec.name: _FIELD_TYPES[spec.name].dump(getattr(self, spec.name)) for spec in fields(self)}

    @classmethod
    def describe(cls) -> list[SettingDescription]:
        """The settings reference, one row per field, in declaration order."""
        return [
            SettingDescription(
                key=spec.name,
                type_name=_FIELD_TYPES[spec.name].name,
                default=spec.default,
                kcl_name=spec.metadata["kcl_name"],
                doc=spec.metadata["doc"],
                batch_note=spec.metadata["batch_note"],
                allowed=" and ".join(check.allowed for check in spec.metadata["checks"]) or None,
            )
            for spec in fields(cls)
        ]


# --------------------------------------------------------------------------------------------------
# Value types: reading text (environment, --set), accepting typed values, writing JSON.
# Each function raises ValueError with a problem statement; callers add the key.


def _expected(what: str, value: object) -> ValueError:
    return ValueError(f"expected {what}, got {value!r}")


def _same(value: Any) -> Any:
    return value


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _expected("an integer", text) from None


def _parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _expected("a number", text) from None


_BOOLEAN_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _parse_bool(text: str) -> bool:
    try:
        return _BOOLEAN_WORDS[text.strip().lower()]
    except KeyError:
        raise _expected("true/false, yes/no or 1/0", text) from None


def _parse_optional_str(text: str) -> str | None:
    # Text cannot carry None, and an empty value is how shells and forms say "unset".
    return None if text.strip().lower() in ("", "none", "null") else text


def _parse_tags(text: str) -> object:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"expected a JSON object of tags: {error}") from None
    return dict(_tag_pair(item) for item in text.split(",") if item.strip())


def _tag_pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise _expected("k=v,k2=v2 tag pairs", item.strip())
    return key.strip(), value.strip()


def _accept_int(value: object) -> int:
    # bool is an int subclass, but `true` given for a count is a mistake, not 1.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _expected("an integer", value)


def _accept_float(value: object) -> float:
    # NaN compares false with every bound, so it would slip through every range check.
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        return float(value)
    raise _expected("a number", value)


def _accept_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _expected("a boolean", value)


def _accept_str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise _expected("a string", value)


def _accept_optional_str(value: object) -> str | None:
    return None if value is None else _accept_str(value)


def _accept_tags(value: object) -> Tags:
    # The stored form is a tuple of pairs; dataclasses.replace hands it back to the constructor.
    try:
        tags = dict(value) if isinstance(value, tuple) else value
    except (TypeError, ValueError):
        raise _expected("a table of string tags", value) from None
    if isinstance(tags, Mapping) and all(
        isinstance(key, str) and key and isinstance(tag, str) for key, tag in tags.items()
    ):
        return tuple(sorted(tags.items()))
    raise _expected("a table of string tags with non-empty keys", value)


def _dump_float(value: float) -> float | str:
    # JSON has no infinity; "inf" is what the float reader accepts back.
    return "inf" if value == math.inf else value


@dataclass(frozen=True)
class _ValueType:
    name: str
    parse: Callable[[str], object]
    accept: Callable[[object], object]
    dump: Callable[[Any], object] = _same


_VALUE_TYPES: dict[object, _ValueType] = {
    int: _ValueType("int", _parse_int, _accept_int),
    float: _ValueType("float", _parse_float, _accept_float, _dump_float),
    bool: _ValueType("bool", _parse_bool, _accept_bool),
    str: _ValueType("str", str, _accept_str),
    str | None: _ValueType("str | None", _parse_optional_str, _accept_optional_str),
    Tags: _ValueType("dict[str, str]", _parse_tags, _accept_tags, dict),
}

_FIELD_TYPES: dict[str, _ValueType] = {
    name: _VALUE_TYPES[hint] for name, hint in get_type_hints(ConsumerConfig).items()
}
_KEYS = {name: name for name in _FIELD_TYPES}
_ENV_KEYS = {ENV_PREFIX + name.upper(): name for name in _FIELD_TYPES}


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


def _known_key(name: str, names: Mapping[str, str], origin: str) -> str:
    """The setting `name` stands for; an unknown name is an error suggesting the closest one."""
    if name in names:
        return names[name]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigurationError(name, f"is not a known setting (in {origin}){hint}")


def _text_setting(key: str, text: str, origin: str) -> _Setting:
    try:
        return _Setting(key, _FIELD_TYPES[key].parse(text), origin)
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
    # TOML values are typed already; ConsumerConfig checks them (a bool is not an int).
    return [_Setting(_known_key(key, _KEYS, origin), value, origin) for key, value in document.items()]


def _env_settings(environ: Mapping[str, str]) -> list[_Setting]:
    return [
        _text_setting(_known_key(name, _ENV_KEYS, "the environment"), text, f"environment variable {name}")
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
