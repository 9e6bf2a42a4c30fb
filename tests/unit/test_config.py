"""Behaviour of the consumer configuration: KCL defaults, source precedence, validation, reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from lease_core.config.settings import ENV_PREFIX, ConsumerConfig, load_config
from lease_core.errors import ConfigurationError


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "consumer.toml"
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults --------------------------------------------------------------------------------------

KCL_DEFAULTS = [
    ("failover_time_millis", 10000),
    ("epsilon_millis", 25),
    ("renewer_interval_millis", 3308),
    ("max_leases_for_worker", 2**31 - 1),
    ("max_leases_to_steal_at_one_time", 1),
    ("enable_priority_lease_assignment", True),
    ("max_lease_renewal_threads", 20),
    ("consistent_reads", False),
    ("billing_mode", "PAY_PER_REQUEST"),
    ("initial_lease_table_read_capacity", 10),
    ("initial_lease_table_write_capacity", 10),
    ("lease_table_deletion_protection_enabled", False),
    ("lease_table_pitr_enabled", False),
    ("tags", ()),
    ("lease_table_scan_total_segments", 0),
    ("table_creation_timeout_seconds", 600.0),
    ("table_status_poll_seconds", 10.0),
    ("rebalance_threshold_percentage", 10),
    ("dampening_percentage", 60),
    ("allow_throughput_overshoot", True),
    ("max_throughput_per_host_kbps", math.inf),
    ("variance_balancing_frequency", 3),
    ("worker_metrics_ema_alpha", 0.5),
    ("no_of_persisted_metrics_per_worker_metrics", 10),
    ("graceful_lease_handoff_enabled", True),
    ("graceful_lease_handoff_timeout_millis", 30000),
    ("leader_lease_duration_millis", 120000),
    ("leader_heartbeat_period_millis", 30000),
    ("metrics_level", "DETAILED"),
    ("metrics_enabled_dimensions", ("ALL",)),
]


@pytest.mark.parametrize(("key", "expected"), KCL_DEFAULTS, ids=[key for key, _ in KCL_DEFAULTS])
def test_defaults_equal_kcl_defaults(key: str, expected: object) -> None:
    assert getattr(ConsumerConfig(), key) == expected


def test_the_default_strategy_is_makespan_not_kcls_variance_chosen_by_measurement() -> None:
    # bench/balance_pipeline.py: variance left two hot shards on one slot in every round.
    assert ConsumerConfig().lease_assignment_strategy == "makespan"


def test_loading_nothing_gives_the_defaults() -> None:
    assert load_config(environ={}) == ConsumerConfig()


def test_environ_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}DAMPENING_PERCENTAGE", "80")
    assert load_config().dampening_percentage == 80


# --- precedence ------------------------------------------------------------------------------------

PRECEDENCE = [
    # (toml, env, --set, expected failover, expected epsilon)
    pytest.param(None, None, None, 10000, 25, id="defaults"),
    pytest.param(20000, None, None, 20000, 25, id="toml-over-default"),
    pytest.param(20000, "30000", None, 30000, 25, id="env-over-toml"),
    pytest.param(None, "30000", None, 30000, 25, id="env-over-default"),
    pytest.param(20000, "30000", "40000", 40000, 25, id="set-over-env"),
    pytest.param(20000, None, "40000", 40000, 25, id="set-over-toml"),
]


@pytest.mark.parametrize(("toml", "env", "override", "failover", "epsilon"), PRECEDENCE)
def test_later_sources_override_earlier_ones_for_the_same_key(
    tmp_path: Path, toml: int | None, env: str | None, override: str | None, failover: int, epsilon: int
) -> None:
    path = write_toml(tmp_path, f"failover_time_millis = {toml}\n") if toml is not None else None
    environ = {f"{ENV_PREFIX}FAILOVER_TIME_MILLIS": env} if env is not None else {}
    overrides = [f"failover_time_millis={override}"] if override is not None else []
    config = load_config(path, environ=environ, overrides=overrides)
    assert (config.failover_time_millis, config.epsilon_millis) == (failover, epsilon)


def test_each_source_leaves_the_keys_it_does_not_set_untouched(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'application_name = "orders"\ndampening_percentage = 70\n')
    environ = {f"{ENV_PREFIX}DAMPENING_PERCENTAGE": "80", f"{ENV_PREFIX}CONSISTENT_READS": "yes"}
    config = load_config(path, environ=environ, overrides=["max_leases_for_worker=4"])
    assert (config.application_name, config.dampening_percentage, config.consistent_reads) == ("orders", 80, True)
    assert (config.max_leases_for_worker, config.failover_time_millis) == (4, 10000)


def test_variables_without_the_prefix_are_ignored() -> None:
    assert load_config(environ={"FAILOVER_TIME_MILLIS": "nonsense", "HOME": "/root"}) == ConsumerConfig()


def test_mapping_overrides_take_typed_values() -> None:
    config = load_config(environ={}, overrides={"consistent_reads": True, "tags": {"team": "data"}})
    assert config.consistent_reads is True
    assert config.tags == (("team", "data"),)


def test_a_single_override_string_is_one_override() -> None:
    assert load_config(environ={}, overrides="epsilon_millis=30").epsilon_millis == 30


# --- coercion from text ----------------------------------------------------------------------------

COERCIONS = [
    pytest.param("failover_time_millis", "15000", 15000, id="int"),
    pytest.param("max_throughput_per_host_kbps", "inf", math.inf, id="float-inf"),
    pytest.param("max_throughput_per_host_kbps", "1024.5", 1024.5, id="float"),
    pytest.param("worker_metrics_ema_alpha", "1", 1.0, id="float-from-int-text"),
    pytest.param("consistent_reads", "TRUE", True, id="bool-true-any-case"),
    pytest.param("consistent_reads", "yes", True, id="bool-yes"),
    pytest.param("consistent_reads", "1", True, id="bool-one"),
    pytest.param("allow_throughput_overshoot", "No", False, id="bool-no"),
    pytest.param("allow_throughput_overshoot", "0", False, id="bool-zero"),
    pytest.param("allow_throughput_overshoot", "false", False, id="bool-false"),
    pytest.param("billing_mode", "PROVISIONED", "PROVISIONED", id="str"),
    pytest.param("aws_region", "eu-west-1", "eu-west-1", id="optional-str"),
    pytest.param("aws_region", "", None, id="optional-empty-is-none"),
    pytest.param("aws_region", "None", None, id="optional-none-is-none"),
    pytest.param("lease_table_name", "null", None, id="optional-null-is-none"),
    pytest.param("tags", '{"team": "data", "env": "dev"}', (("env", "dev"), ("team", "data")), id="tags-json"),
    pytest.param("tags", "team=data, env=dev", (("env", "dev"), ("team", "data")), id="tags-pairs"),
    pytest.param("tags", "", (), id="tags-empty"),
    pytest.param("metrics_enabled_dimensions", "Operation, ShardId", ("Operation", "ShardId"), id="dimensions"),
    pytest.param("metrics_enabled_dimensions", '["WorkerIdentifier"]', ("WorkerIdentifier",), id="dimensions-json"),
    pytest.param("metrics_enabled_dimensions", "ShardId,ShardId", ("ShardId",), id="dimensions-once"),
]


@pytest.mark.parametrize(("key", "text", "expected"), COERCIONS)
def test_text_values_are_coerced_to_the_setting_type_in_env_and_overrides(
    key: str, text: str, expected: object
) -> None:
    from_env = load_config(environ={ENV_PREFIX + key.upper(): text})
    from_set = load_config(environ={}, overrides=[f"{key}={text}"])
    assert getattr(from_env, key) == getattr(from_set, key) == expected


def test_toml_values_keep_their_types_and_ints_are_accepted_for_floats(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'worker_metrics_ema_alpha = 1\nconsistent_reads = true\ntags = { team = "data" }\n'
        'aws_endpoint_url_dynamodb = "http://localhost:8000"\n',
    )
    config = load_config(path, environ={})
    assert config.worker_metrics_ema_alpha == 1.0 and isinstance(config.worker_metrics_ema_alpha, float)
    assert config.consistent_reads is True
    assert config.tags == (("team", "data"),)
    assert config.aws_endpoint_url_dynamodb == "http://localhost:8000"


# --- bad input -------------------------------------------------------------------------------------

BAD_TEXT = [
    pytest.param("failover_time_millis", "1.5", "expected an integer", id="int-from-float-text"),
    pytest.param("failover_time_millis", "ten", "expected an integer", id="int-from-word"),
    pytest.param("max_throughput_per_host_kbps", "fast", "expected a number", id="float-from-word"),
    pytest.param("worker_metrics_ema_alpha", "nan", "expected a number", id="float-nan"),
    pytest.param("consistent_reads", "maybe", "true/false", id="bool"),
    pytest.param("tags", "team", "tag pairs", id="tags-without-equals"),
    pytest.param("tags", "{not json", "JSON object", id="tags-bad-json"),
    pytest.param("tags", '{"team": 1}', "string tags", id="tags-json-non-string"),
    pytest.param("tags", '["team"]', "tag pairs", id="tags-json-array-is-not-pairs"),
    pytest.param("metrics_enabled_dimensions", "Shard", "unknown dimension 'Shard'", id="dimension-unknown"),
    pytest.param("metrics_enabled_dimensions", " , ", "names no dimension", id="dimensions-none"),
    pytest.param("metrics_enabled_dimensions", "[1]", "a list of dimension names", id="dimensions-json-numbers"),
]


@pytest.mark.parametrize(("key", "text", "problem"), BAD_TEXT)
@pytest.mark.parametrize("source", ["env", "set"])
def test_text_that_does_not_fit_the_type_is_rejected_naming_the_key_and_source(
    source: str, key: str, text: str, problem: str
) -> None:
    variable = ENV_PREFIX + key.upper()
    with pytest.raises(ConfigurationError) as raised:
        if source == "env":
            load_config(environ={variable: text})
        else:
            load_config(environ={}, overrides=[f"{key}={text}"])
    assert raised.value.key == key
    assert problem in raised.value.problem
    assert (variable if source == "env" else "override") in raised.value.problem


BAD_VALUES = [
    pytest.param(
        {"failover_time_millis": 0}, "failover_time_millis", "must be greater than 0, got 0", id="failover-zero"
    ),
    pytest.param({"epsilon_millis": -1}, "epsilon_millis", "must be at least 0, got -1", id="epsilon-negative"),
    pytest.param(
        {"max_leases_for_worker": 0}, "max_leases_for_worker", "must be at least 1, got 0", id="max-leases-zero"
    ),
    pytest.param(
        {"max_leases_to_steal_at_one_time": 0}, "max_leases_to_steal_at_one_time", "at least 1", id="steal-zero"
    ),
    pytest.param({"max_lease_renewal_threads": 0}, "max_lease_renewal_threads", "at least 1", id="threads-zero"),
    pytest.param(
        {"initial_lease_table_read_capacity": 0}, "initial_lease_table_read_capacity", "at least 1", id="rcu-zero"
    ),
    pytest.param(
        {"initial_lease_table_write_capacity": 0}, "initial_lease_table_write_capacity", "at least 1", id="wcu-zero"
    ),
    pytest.param(
        {"lease_table_scan_total_segments": 1_000_001},
        "lease_table_scan_total_segments",
        "between 0 and 1000000",
        id="segments-too-many",
    ),
    pytest.param(
        {"table_creation_timeout_seconds": 0}, "table_creation_timeout_seconds", "greater than 0", id="timeout-zero"
    ),
    pytest.param(
        {"table_status_poll_seconds": -1.0}, "table_status_poll_seconds", "greater than 0", id="poll-negative"
    ),
    pytest.param(
        {"dampening_percentage": 0}, "dampening_percentage", "must be between 1 and 100, got 0", id="dampening-zero"
    ),
    pytest.param(
        {"rebalance_threshold_percentage": 101},
        "rebalance_threshold_percentage",
        "between 1 and 100, got 101",
        id="threshold-over-100",
    ),
    pytest.param(
        {"rebalance_min_effect_percentage": -1},
        "rebalance_min_effect_percentage",
        "between 0 and 100, got -1",
        id="effect-floor-negative",
    ),
    pytest.param(
        {"max_throughput_per_host_kbps": 0.0}, "max_throughput_per_host_kbps", "greater than 0", id="throughput-zero"
    ),
    pytest.param(
        {"variance_balancing_frequency": 0}, "variance_balancing_frequency", "at least 1", id="frequency-zero"
    ),
    pytest.param(
        {"worker_metrics_ema_alpha": 0.0}, "worker_metrics_ema_alpha", "greater than 0 and at most 1", id="alpha-zero"
    ),
    pytest.param(
        {"worker_metrics_ema_alpha": 1.5},
        "worker_metrics_ema_alpha",
        "greater than 0 and at most 1",
        id="alpha-over-one",
    ),
    pytest.param(
        {"no_of_persisted_metrics_per_worker_metrics": 0},
        "no_of_persisted_metrics_per_worker_metrics",
        "at least 1",
        id="persisted-zero",
    ),
    pytest.param(
        {"graceful_lease_handoff_timeout_millis": -1},
        "graceful_lease_handoff_timeout_millis",
        "at least 0",
        id="handoff-negative",
    ),
    pytest.param(
        {"leader_lease_duration_millis": 0}, "leader_lease_duration_millis", "greater than 0", id="leader-lease-zero"
    ),
    pytest.param({"dependency_retry_attempts": 0}, "dependency_retry_attempts", "at least 1", id="attempts-zero"),
    pytest.param(
        {"dependency_retry_base_millis": 0}, "dependency_retry_base_millis", "at least 1", id="retry-base-zero"
    ),
    pytest.param(
        {"billing_mode": "ON_DEMAND"}, "billing_mode", "one of 'PAY_PER_REQUEST', 'PROVISIONED'", id="billing-enum"
    ),
    pytest.param(
        {"lease_assignment_strategy": "random"},
        "lease_assignment_strategy",
        "one of 'makespan', 'variance', 'count'",
        id="strategy-enum",
    ),
    pytest.param(
        {"aws_endpoint_url_dynamodb": "localhost:8000"},
        "aws_endpoint_url_dynamodb",
        "http:// or https://",
        id="endpoint-no-scheme",
    ),
    pytest.param(
        {"aws_endpoint_url_kinesis": "ftp://host"},
        "aws_endpoint_url_kinesis",
        "http:// or https://",
        id="endpoint-bad-scheme",
    ),
    pytest.param(
        {"aws_endpoint_url_s3": "http://"}, "aws_endpoint_url_s3", "http:// or https://", id="endpoint-no-host"
    ),
    pytest.param(
        {"application_name": "my app"}, "application_name", "DynamoDB table name", id="application-name-chars"
    ),
    pytest.param({"lease_table_name": "ab"}, "lease_table_name", "DynamoDB table name", id="lease-table-too-short"),
    pytest.param({"aws_region": "EU West"}, "aws_region", "AWS region", id="region"),
    # cross-field rules name the key being checked
    pytest.param(
        {"epsilon_millis": 3333},
        "epsilon_millis",
        "less than failover_time_millis // 3 (3333)",
        id="epsilon-vs-failover",
    ),
    pytest.param(
        {"failover_time_millis": 90, "epsilon_millis": 30},
        "epsilon_millis",
        "(30), got 30",
        id="epsilon-vs-small-failover",
    ),
    pytest.param(
        {"leader_heartbeat_period_millis": 40000},
        "leader_heartbeat_period_millis",
        "less than leader_lease_duration_millis // 3 (40000)",
        id="heartbeat-vs-lease",
    ),
    pytest.param(
        {"dependency_retry_max_millis": 49},
        "dependency_retry_max_millis",
        "at least dependency_retry_base_millis (50)",
        id="retry-max-vs-base",
    ),
    # wrong types
    pytest.param(
        {"failover_time_millis": True}, "failover_time_millis", "expected an integer, got True", id="bool-is-not-int"
    ),
    pytest.param({"failover_time_millis": 1.5}, "failover_time_millis", "expected an integer", id="float-is-not-int"),
    pytest.param(
        {"worker_metrics_ema_alpha": False}, "worker_metrics_ema_alpha", "expected a number", id="bool-is-not-float"
    ),
    pytest.param({"consistent_reads": 1}, "consistent_reads", "expected a boolean", id="int-is-not-bool"),
    pytest.param({"aws_region": 3}, "aws_region", "expected a string, got 3", id="int-is-not-str"),
    pytest.param(
        {"billing_mode": 3}, "billing_mode", "one of 'PAY_PER_REQUEST', 'PROVISIONED', got 3", id="int-is-not-a-choice"
    ),
    pytest.param({"tags": {"": "x"}}, "tags", "non-empty keys", id="tags-empty-key"),
    pytest.param({"metrics_level": "ALL"}, "metrics_level", "one of 'NONE', 'SUMMARY', 'DETAILED'", id="metrics-level"),
    pytest.param(
        {"metrics_namespace": "AWS/Kinesis"}, "metrics_namespace", "not starting with 'AWS/'", id="namespace-aws"
    ),
    pytest.param({"metrics_namespace": "a|b"}, "metrics_namespace", "(a CloudWatch namespace)", id="namespace-chars"),
    pytest.param(
        {"aws_endpoint_url_cloudwatch": "localhost:4566"},
        "aws_endpoint_url_cloudwatch",
        "an http:// or https:// URL",
        id="cloudwatch-endpoint",
    ),
]


@pytest.mark.parametrize(("changes", "key", "problem"), BAD_VALUES)
def test_invalid_values_are_rejected_naming_the_key_and_the_allowed_values(
    changes: dict[str, object], key: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        ConsumerConfig(**changes)  # type: ignore[arg-type]
    assert raised.value.key == key
    assert problem in raised.value.problem
    assert str(raised.value).startswith(f"configuration key {key!r}: ")


@pytest.mark.parametrize(("changes", "key", "problem"), BAD_VALUES)
def test_every_way_of_setting_a_value_validates_it(changes: dict[str, object], key: str, problem: str) -> None:
    with pytest.raises(ConfigurationError) as from_load:
        load_config(environ={}, overrides=changes)
    with pytest.raises(ConfigurationError) as from_replace:
        ConsumerConfig().with_overrides(**changes)
    assert from_load.value.key == from_replace.value.key == key


def test_the_range_message_reads_as_one_sentence() -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_config(environ={}, overrides=["dampening_percentage=0"])
    assert str(raised.value) == (
        "configuration key 'dampening_percentage': must be between 1 and 100, got 0 "
        "(from override 'dampening_percentage=0')"
    )


TOML_TYPE_ERRORS = [
    pytest.param("failover_time_millis = true", "failover_time_millis", id="bool-for-int"),
    pytest.param('failover_time_millis = "10000"', "failover_time_millis", id="string-for-int"),
    pytest.param("consistent_reads = 1", "consistent_reads", id="int-for-bool"),
    pytest.param('tags = "team=data"', "tags", id="string-for-tags"),
    pytest.param("dampening_percentage = 0", "dampening_percentage", id="out-of-range"),
]


@pytest.mark.parametrize(("text", "key"), TOML_TYPE_ERRORS)
def test_toml_values_of_the_wrong_type_or_range_are_rejected_naming_the_file(
    tmp_path: Path, text: str, key: str
) -> None:
    path = write_toml(tmp_path, text + "\n")
    with pytest.raises(ConfigurationError) as raised:
        load_config(path, environ={})
    assert raised.value.key == key
    assert str(path) in raised.value.problem


UNKNOWN_KEYS = [
    pytest.param("toml", "failover_time_milis", "failover_time_millis", id="toml"),
    pytest.param("env", f"{ENV_PREFIX}FAILOVER_TIME_MILIS", f"{ENV_PREFIX}FAILOVER_TIME_MILLIS", id="env"),
    pytest.param("set", "dampening_percent", "dampening_percentage", id="set"),
    pytest.param("mapping", "max_lease_for_worker", "max_leases_for_worker", id="mapping"),
    pytest.param("with_overrides", "epsilon_milis", "epsilon_millis", id="with-overrides"),
    pytest.param("toml", "consumer", "consumer_name", id="toml-table-is-not-used"),
    pytest.param("env", f"{ENV_PREFIX}X", None, id="env-prefix-alone-is-not-close"),
    pytest.param("env", f"{ENV_PREFIX}FOO", None, id="env-unrelated-name"),
    pytest.param(
        "env", f"{ENV_PREFIX}failover_time_millis", f"{ENV_PREFIX}FAILOVER_TIME_MILLIS", id="env-in-lower-case"
    ),
    pytest.param(
        "env", f"{ENV_PREFIX}MAX_LEASES_PER_WORKER", f"{ENV_PREFIX}MAX_LEASES_FOR_WORKER", id="env-wrong-word"
    ),
]


@pytest.mark.parametrize(("source", "name", "suggestion"), UNKNOWN_KEYS)
def test_unknown_keys_are_rejected_with_a_suggestion_when_one_is_close(
    tmp_path: Path, source: str, name: str, suggestion: str | None
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        if source == "toml":
            load_config(write_toml(tmp_path, f"[{name}]\n" if name == "consumer" else f"{name} = 1\n"), environ={})
        elif source == "env":
            load_config(environ={name: "1"})
        elif source == "set":
            load_config(environ={}, overrides=[f"{name}=1"])
        elif source == "mapping":
            load_config(environ={}, overrides={name: 1})
        else:
            ConsumerConfig().with_overrides(**{name: 1})
    assert raised.value.key == name
    assert "is not a known setting" in raised.value.problem
    if suggestion is None:
        assert "did you mean" not in raised.value.problem
    else:
        assert raised.value.problem.endswith(f"did you mean {suggestion!r}?")


def test_an_override_without_equals_is_rejected_naming_it() -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_config(environ={}, overrides=["failover_time_millis"])
    assert raised.value.key == "failover_time_millis"
    assert "key=value" in raised.value.problem


def test_a_missing_config_file_is_rejected_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigurationError) as raised:
        load_config(path, environ={})
    assert raised.value.key == "config_file"
    assert str(path) in raised.value.problem


def test_a_config_file_that_is_not_utf8_is_rejected_naming_the_file_and_the_encoding(tmp_path: Path) -> None:
    path = tmp_path / "consumer.toml"
    path.write_bytes('application_name = "café"\n'.encode("latin-1"))
    with pytest.raises(ConfigurationError) as raised:
        load_config(path, environ={})
    assert raised.value.key == "config_file"
    assert str(path) in raised.value.problem
    assert "not UTF-8" in raised.value.problem


def test_a_toml_syntax_error_is_rejected_with_the_parser_message(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "failover_time_millis = = 3\n")
    with pytest.raises(ConfigurationError) as raised:
        load_config(path, environ={})
    assert raised.value.key == "config_file"
    assert str(path) in raised.value.problem
    assert "line 1" in raised.value.problem


def test_configuration_errors_pickle_by_value() -> None:
    import pickle

    with pytest.raises(ConfigurationError) as raised:
        ConsumerConfig(dampening_percentage=0)
    copy = pickle.loads(pickle.dumps(raised.value))
    assert (copy.key, str(copy)) == ("dampening_percentage", str(raised.value))


# --- table names -----------------------------------------------------------------------------------

TABLE_NAMES = [
    pytest.param(None, "orders", id="lease-table-defaults-to-application-name"),
    pytest.param("orders-leases", "orders-leases", id="explicit-lease-table"),
]


@pytest.mark.parametrize(("lease_table_name", "expected"), TABLE_NAMES)
def test_the_lease_table_is_named_by_the_setting_or_else_the_application(
    lease_table_name: str | None, expected: str
) -> None:
    config = ConsumerConfig(application_name="orders", lease_table_name=lease_table_name)
    assert config.lease_table == expected


def test_the_derived_tables_are_named_as_kcl_3_names_them() -> None:
    config = ConsumerConfig(application_name="orders", lease_table_name="orders-leases")
    assert config.worker_metrics_table == "orders-WorkerMetricStats"
    assert config.coordinator_state_table == "orders-CoordinatorState"


def test_the_application_name_is_returned_when_required() -> None:
    assert ConsumerConfig(application_name="orders").require_application_name() == "orders"


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(ConsumerConfig.require_application_name, id="require"),
        pytest.param(lambda config: config.lease_table, id="lease-table"),
        pytest.param(lambda config: config.worker_metrics_table, id="worker-metrics-table"),
        pytest.param(lambda config: config.coordinator_state_table, id="coordinator-state-table"),
    ],
)
def test_a_missing_application_name_is_reported_where_it_is_needed(read: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        read(ConsumerConfig())  # type: ignore[operator]
    assert raised.value.key == "application_name"
    assert "is required" in raised.value.problem


# --- value semantics -------------------------------------------------------------------------------


def test_the_config_is_frozen_and_hashable() -> None:
    config = ConsumerConfig(tags={"team": "data"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="frozen"):
        config.epsilon_millis = 1  # type: ignore[misc]
    assert hash(config) == hash(ConsumerConfig(tags=(("team", "data"),)))


def test_with_overrides_changes_only_the_given_keys() -> None:
    config = ConsumerConfig(application_name="orders").with_overrides(dampening_percentage=80)
    assert (config.application_name, config.dampening_percentage) == ("orders", 80)
    assert config.epsilon_millis == 25


ROUND_TRIPS = [
    pytest.param(ConsumerConfig(), id="defaults"),
    pytest.param(
        ConsumerConfig(
            application_name="orders",
            lease_table_name="orders-leases",
            tags={"team": "data", "env": "dev"},  # type: ignore[arg-type]
            max_throughput_per_host_kbps=2048.0,
            billing_mode="PROVISIONED",
            aws_region="eu-west-1",
            aws_endpoint_url_kinesis="http://127.0.0.1:4567",
            lease_assignment_strategy="makespan",
            consistent_reads=True,
            metrics_level="SUMMARY",
            metrics_enabled_dimensions=("Operation", "ShardId"),
            metrics_namespace="Team/Orders",
        ),
        id="everything-set",
    ),
]


@pytest.mark.parametrize("config", ROUND_TRIPS)
def test_to_dict_is_json_and_reads_back_unchanged_as_overrides(config: ConsumerConfig) -> None:
    as_json = json.dumps(config.to_dict(), allow_nan=False)
    assert load_config(environ={}, overrides=json.loads(as_json)) == config


def test_the_metrics_namespace_is_the_application_name_unless_set() -> None:
    assert ConsumerConfig(application_name="orders").cloudwatch_namespace == "orders"
    assert (
        ConsumerConfig(application_name="orders", metrics_namespace="Team/Orders").cloudwatch_namespace == "Team/Orders"
    )


def test_toml_takes_the_enabled_dimensions_as_a_list(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'metrics_enabled_dimensions = ["Operation", "WorkerIdentifier"]\n')
    assert load_config(path, environ={}).metrics_enabled_dimensions == ("Operation", "WorkerIdentifier")


def test_infinity_is_written_as_inf() -> None:
    assert ConsumerConfig().to_dict()["max_throughput_per_host_kbps"] == "inf"


# --- reference -------------------------------------------------------------------------------------


def test_describe_covers_every_field_with_a_doc() -> None:
    rows = ConsumerConfig.describe()
    assert [row.key for row in rows] == list(ConsumerConfig.model_fields)
    assert all(row.doc.strip() and row.type_name for row in rows)


def test_describe_gives_defaults_kcl_names_and_allowed_values() -> None:
    rows = {row.key: row for row in ConsumerConfig.describe()}
    assert (rows["failover_time_millis"].default, rows["failover_time_millis"].kcl_name) == (
        10000,
        "failoverTimeMillis",
    )
    assert rows["aws_region"].kcl_name is None
    assert rows["dampening_percentage"].allowed == "between 1 and 100"
    assert rows["epsilon_millis"].allowed == "at least 0 and less than failover_time_millis // 3"
    assert rows["consistent_reads"].allowed is None
    assert rows["lease_assignment_strategy"].batch_note
