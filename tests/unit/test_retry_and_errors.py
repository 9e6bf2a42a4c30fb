"""Behaviour of retrying, of the AWS error translation, and of the error hierarchy."""

from __future__ import annotations

import inspect
import pickle
import random

import botocore.exceptions
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lease_core import errors
from lease_core.aws import AwsCaller, is_retryable
from lease_core.errors import (
    AccessError,
    CheckpointOrderError,
    ConfigurationError,
    CoordinatorStateConflictError,
    CorruptLeaseError,
    CorruptLeasesSkippedError,
    DependencyError,
    ForeignStreamConsumerError,
    ForeignTableError,
    IncompleteShardListError,
    InconsistentShardsError,
    IndexNotFoundError,
    InvalidSequenceNumberError,
    InvalidShardLineageError,
    LayoutConflictError,
    LeadershipLostError,
    LeadershipUnavailableError,
    LeaseCoreError,
    LeaseLostError,
    RecordsLostError,
    StreamConsumerError,
    StreamConsumerNotReadyError,
    StreamMismatchError,
    StreamNotActiveError,
    StreamNotFoundError,
    TableMigrationChangedError,
    TableNotFoundError,
    TableNotReadyError,
    TableProtectedError,
    ThrottledError,
)
from lease_core.retry import RetryPolicy
from sinks import errors as sink_errors
from sinks.errors import SinkError
from spark_jobs import errors as data_plane_errors
from spark_jobs.errors import FunctionLoadError, ReportedError, TransformError


def client_error(code: str, status: int = 400, operation: str = "UpdateItem") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


class RecordingSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class HighestJitter:
    """A random source that always picks the top of the range, so delays equal their ceilings."""

    def uniform(self, low: float, high: float) -> float:
        return high


class Failing:
    """An operation that fails with the given errors in turn, then returns "done"."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


class Retryable(Exception):
    pass


def retryable_only(error: Exception) -> bool:
    return isinstance(error, Retryable)


# --- RetryPolicy ------------------------------------------------------------------------------------


def test_retryable_failures_are_retried_up_to_attempts_then_the_last_one_is_raised() -> None:
    sleep = RecordingSleep()
    failures = [Retryable(f"attempt {n}") for n in range(1, 5)]
    operation = Failing(*failures)
    with pytest.raises(Retryable) as caught:
        RetryPolicy(attempts=4, sleep=sleep).call(operation, retryable_only)
    assert (caught.value, operation.calls, len(sleep.delays)) == (failures[-1], 4, 3)


def test_a_non_retryable_failure_is_raised_at_once() -> None:
    sleep = RecordingSleep()
    operation = Failing(ValueError("bad request"), Retryable())
    with pytest.raises(ValueError, match="bad request"):
        RetryPolicy(attempts=4, sleep=sleep).call(operation, retryable_only)
    assert (operation.calls, sleep.delays) == (1, [])


def test_a_failure_that_clears_up_before_the_last_attempt_gives_the_result() -> None:
    sleep = RecordingSleep()
    operation = Failing(Retryable(), Retryable())
    assert RetryPolicy(attempts=3, sleep=sleep).call(operation, retryable_only) == "done"
    assert (operation.calls, len(sleep.delays)) == (3, 2)


def test_a_single_attempt_policy_never_sleeps() -> None:
    sleep = RecordingSleep()
    with pytest.raises(Retryable):
        RetryPolicy(attempts=1, sleep=sleep).call(Failing(Retryable()), retryable_only)
    assert sleep.delays == []


def test_a_policy_without_attempts_is_refused() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_delay_ceilings_double_from_base_and_stop_at_max() -> None:
    sleep = RecordingSleep()
    jitter = HighestJitter()
    policy = RetryPolicy(attempts=9, base_millis=50, max_millis=2000, sleep=sleep, rng=jitter)  # type: ignore[arg-type]
    with pytest.raises(Retryable):
        policy.call(Failing(*[Retryable()] * 9), retryable_only)
    assert sleep.delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


@given(
    attempts=st.integers(1, 12),
    base_millis=st.integers(0, 1000),
    max_millis=st.integers(0, 10000),
    seed=st.integers(0, 2**32),
)
def test_every_delay_lies_between_zero_and_the_capped_exponential_ceiling(
    attempts: int, base_millis: int, max_millis: int, seed: int
) -> None:
    sleep = RecordingSleep()
    policy = RetryPolicy(attempts, base_millis, max_millis, sleep=sleep, rng=random.Random(seed))
    with pytest.raises(Retryable):
        policy.call(Failing(*[Retryable()] * attempts), retryable_only)
    assert len(sleep.delays) == attempts - 1
    for retry_number, delay in enumerate(sleep.delays, start=1):
        assert 0 <= delay <= min(max_millis, base_millis * 2 ** (retry_number - 1)) / 1000


# --- is_retryable -----------------------------------------------------------------------------------

RETRYABILITY = [
    pytest.param(client_error("ProvisionedThroughputExceededException"), True, id="throughput-exceeded"),
    pytest.param(client_error("ThrottlingException"), True, id="throttling"),
    pytest.param(client_error("RequestLimitExceeded"), True, id="request-limit"),
    pytest.param(client_error("InternalServerError", 500), True, id="internal-server-error"),
    pytest.param(client_error("ServiceUnavailable", 503), True, id="service-unavailable"),
    pytest.param(client_error("SomethingNew", 503), True, id="any-http-503"),
    pytest.param(client_error("ConditionalCheckFailedException"), False, id="conditional-check-failed"),
    pytest.param(client_error("ValidationException"), False, id="validation"),
    pytest.param(client_error("AccessDeniedException"), False, id="access-denied"),
    pytest.param(client_error("ResourceNotFoundException"), False, id="resource-not-found"),
    pytest.param(botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True, id="endpoint"),
    pytest.param(botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), True, id="read-timeout"),
    pytest.param(ValueError("not from AWS"), False, id="plain-exception"),
]


@pytest.mark.parametrize(("error", "retryable"), RETRYABILITY)
def test_throttling_server_and_transport_errors_are_retryable(error: Exception, retryable: bool) -> None:
    assert is_retryable(error) is retryable


# --- AwsCaller --------------------------------------------------------------------------------------


def caller(sleep: RecordingSleep, attempts: int = 4) -> AwsCaller:
    return AwsCaller("dynamodb", RetryPolicy(attempts=attempts, base_millis=1, max_millis=5, sleep=sleep))


def test_persistent_throttling_becomes_a_throttled_error_counting_every_attempt() -> None:
    sleep = RecordingSleep()
    operation = Failing(*[client_error("ProvisionedThroughputExceededException")] * 4)
    with pytest.raises(ThrottledError) as caught:
        caller(sleep).call("UpdateItem", operation, table_name="leases")
    error = caught.value
    assert (error.service, error.operation, error.attempts, operation.calls) == ("dynamodb", "UpdateItem", 4, 4)
    assert "ProvisionedThroughputExceededException" in error.detail
    assert isinstance(error.__cause__, botocore.exceptions.ClientError)


def test_a_persistent_server_error_becomes_a_dependency_error_not_a_throttled_one() -> None:
    operation = Failing(*[client_error("InternalServerError", 500)] * 3)
    with pytest.raises(DependencyError) as caught:
        caller(RecordingSleep(), attempts=3).call("GetItem", operation)
    assert (type(caught.value), caught.value.attempts) == (DependencyError, 3)


def test_a_persistent_transport_error_becomes_a_dependency_error() -> None:
    operation = Failing(*[botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")] * 2)
    with pytest.raises(DependencyError) as caught:
        caller(RecordingSleep(), attempts=2).call("Scan", operation)
    assert (type(caught.value), caught.value.operation, caught.value.attempts) == (DependencyError, "Scan", 2)


def test_a_missing_table_becomes_table_not_found_naming_the_table() -> None:
    operation = Failing(client_error("ResourceNotFoundException"))
    with pytest.raises(TableNotFoundError) as caught:
        caller(RecordingSleep()).call("GetItem", operation, table_name="my-app")
    assert (caught.value.table_name, operation.calls) == ("my-app", 1)


def test_access_denied_becomes_an_access_error_without_retrying() -> None:
    sleep = RecordingSleep()
    operation = Failing(client_error("AccessDeniedException"))
    with pytest.raises(AccessError) as caught:
        caller(sleep).call("PutItem", operation, table_name="my-app")
    assert (caught.value.operation, operation.calls, sleep.delays) == ("PutItem", 1, [])
    assert "AccessDeniedException" in str(caught.value)


def test_a_transient_error_that_clears_up_on_the_third_attempt_succeeds() -> None:
    sleep = RecordingSleep()
    operation = Failing(client_error("ThrottlingException"), client_error("InternalServerError", 500))
    assert caller(sleep).call("UpdateItem", operation) == "done"
    assert (operation.calls, len(sleep.delays)) == (3, 2)


# --- the error hierarchy ------------------------------------------------------------------------

INSTANCES = [
    pytest.param(LeaseCoreError("something"), id="LeaseCoreError"),
    pytest.param(ConfigurationError("failover_time_millis", "must be positive"), id="ConfigurationError"),
    pytest.param(TableNotFoundError("my-app"), id="TableNotFoundError"),
    pytest.param(TableNotFoundError("my-app", "create it"), id="TableNotFoundError-with-hint"),
    pytest.param(TableNotReadyError("my-app", "CREATING", 600.0), id="TableNotReadyError"),
    pytest.param(TableProtectedError("my-app"), id="TableProtectedError"),
    pytest.param(
        ForeignTableError("my-app", "lease table", "its key schema is id (HASH), not leaseKey (HASH)", "teardown"),
        id="ForeignTableError",
    ),
    pytest.param(LayoutConflictError("my-app", ("my-app-CoordinatorState",)), id="LayoutConflictError"),
    pytest.param(
        TableMigrationChangedError("my-app-CoordinatorState", "TABLE_MIGRATION_STATUS_INIT", None),
        id="TableMigrationChangedError",
    ),
    pytest.param(DependencyError("dynamodb", "Scan", "connection reset", 6), id="DependencyError"),
    pytest.param(ThrottledError("dynamodb", "UpdateItem", "ThrottlingException: m", 6), id="ThrottledError"),
    pytest.param(AccessError("dynamodb", "PutItem", "AccessDeniedException: m"), id="AccessError"),
    pytest.param(CorruptLeaseError("shardId-1", "attribute 'checkpoint' is missing"), id="CorruptLeaseError"),
    pytest.param(InvalidSequenceNumberError("12a", "not digits"), id="InvalidSequenceNumberError"),
    pytest.param(InvalidSequenceNumberError(-1, "must be >= 0"), id="InvalidSequenceNumberError-int"),
    pytest.param(CheckpointOrderError("shardId-1", "10", "9"), id="CheckpointOrderError"),
    pytest.param(IndexNotFoundError("my-app", "LeaseOwnerToLeaseKeyIndex"), id="IndexNotFoundError"),
    pytest.param(StreamNotFoundError("orders"), id="StreamNotFoundError"),
    pytest.param(StreamNotActiveError("orders", "CREATING"), id="StreamNotActiveError"),
    pytest.param(StreamConsumerError("orders", "orders-lake", "20 consumers"), id="StreamConsumerError"),
    pytest.param(ForeignStreamConsumerError("orders", "orders-lake", "not ours"), id="ForeignStreamConsumerError"),
    pytest.param(StreamConsumerNotReadyError("orders", "orders-lake", "CREATING"), id="StreamConsumerNotReadyError"),
    pytest.param(IncompleteShardListError("orders", "gap after 99"), id="IncompleteShardListError"),
    pytest.param(InconsistentShardsError("orders", ("shardId-9",)), id="InconsistentShardsError"),
    pytest.param(InvalidShardLineageError("shardId-1", "merged child names 1 parent"), id="InvalidShardLineageError"),
    pytest.param(
        StreamMismatchError("app-CoordinatorState", "'orders' (arn-1)", "'payments' (arn-2)", False),
        id="StreamMismatchError",
    ),
    pytest.param(
        StreamMismatchError("app-CoordinatorState", "'orders' (arn-1)", "'orders' (arn-1)", True),
        id="StreamMismatchError-recreated",
    ),
    pytest.param(LeadershipUnavailableError("leader-host-1"), id="LeadershipUnavailableError"),
    pytest.param(
        LeadershipUnavailableError("dag/run-1", "takes it over after 12:00"), id="LeadershipUnavailableError-detail"
    ),
    pytest.param(LeadershipLostError("dag/run-1", "sync_shards"), id="LeadershipLostError"),
    pytest.param(
        CoordinatorStateConflictError("app-CoordinatorState", "RoundHistory", 5), id="CoordinatorStateConflictError"
    ),
    pytest.param(LeaseLostError("shardId-1", "the renew condition failed"), id="LeaseLostError"),
    pytest.param(RecordsLostError(("lease shardId-1: records aged out",)), id="RecordsLostError"),
    pytest.param(
        CorruptLeasesSkippedError(("lease item 'shardId-2': attribute 'checkpoint' is missing",), ("a loss",)),
        id="CorruptLeasesSkippedError",
    ),
    pytest.param(SinkError("s3://lake/orders", "bucket 'lake' does not exist"), id="SinkError"),
    pytest.param(SinkError("s3://lake/orders", "503 SlowDown", retryable=True), id="SinkError-retryable"),
    pytest.param(TransformError("my_module:clean", "raised KeyError: 'id'"), id="TransformError"),
    pytest.param(TransformError("my_module:decode", "raised KeyError: 'id'", "decoder"), id="TransformError-decoder"),
    pytest.param(
        FunctionLoadError("my_company.evnts:decode", "No module named 'my_company.evnts'", "decoder"),
        id="FunctionLoadError",
    ),
    pytest.param(
        ReportedError("ThrottledError", "kinesis ListShards failed after 6 attempt(s)", True), id="ReportedError"
    ),
]

ERROR_CLASSES = [
    cls
    for module in (errors, sink_errors, data_plane_errors)
    for _, cls in inspect.getmembers(module, inspect.isclass)
    if issubclass(cls, LeaseCoreError) and cls.__module__ == module.__name__
]


def test_the_pickling_table_covers_every_error_class() -> None:
    assert {type(param.values[0]) for param in INSTANCES} == set(ERROR_CLASSES)


@pytest.mark.parametrize("error", INSTANCES)
def test_every_error_survives_pickling_with_its_message_and_attributes(error: LeaseCoreError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.args, vars(copy)) == (str(error), error.args, vars(error))
    assert copy.retryable is error.retryable


RETRYABLE_CLASSES = {
    DependencyError,
    ThrottledError,
    TableNotReadyError,
    StreamNotActiveError,
    StreamConsumerNotReadyError,
    IncompleteShardListError,
    LeadershipUnavailableError,
    LeadershipLostError,
    CoordinatorStateConflictError,
    TableMigrationChangedError,
}


@pytest.mark.parametrize(
    "cls", [cls for cls in ERROR_CLASSES if cls not in (SinkError, ReportedError)], ids=lambda cls: cls.__name__
)
def test_only_dependency_throttling_and_not_ready_errors_are_retryable(cls: type[LeaseCoreError]) -> None:
    assert cls.retryable is (cls in RETRYABLE_CLASSES)


def test_a_sink_error_is_retryable_only_when_the_storage_failure_may_go_away() -> None:
    assert (SinkError("/data", "disk full").retryable, SinkError("s3://b", "503", retryable=True).retryable) == (
        False,
        True,
    )


def test_a_reported_error_keeps_the_name_and_the_retryability_the_job_gave_it() -> None:
    reported = ReportedError("ThrottledError", "kinesis ListShards failed", True)
    assert (reported.kind, str(reported), reported.retryable) == ("ThrottledError", "kinesis ListShards failed", True)
    assert (TransformError("m:f", "raised").kind, ReportedError("SinkError", "x").retryable) == (
        "TransformError",
        False,
    )


VALUE_ERRORS = [ConfigurationError, InvalidSequenceNumberError, CheckpointOrderError]


@pytest.mark.parametrize("cls", VALUE_ERRORS, ids=[cls.__name__ for cls in VALUE_ERRORS])
def test_errors_about_bad_values_are_also_value_errors(cls: type[LeaseCoreError]) -> None:
    assert issubclass(cls, ValueError)
