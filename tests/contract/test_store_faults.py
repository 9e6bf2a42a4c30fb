"""The DynamoDB lease store under injected faults (a wrapper around a real client on moto)."""

from __future__ import annotations

import boto3
import botocore.exceptions
import pytest

from lease_core.errors import DependencyError, IndexNotFoundError, TableNotFoundError, ThrottledError
from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.model.lease import Lease
from lease_core.retry import RetryPolicy
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from tests.support.faults import AnswerLostClient, FaultInjectingClient, client_error
from tests.support.stores import FAST_RETRIES, dynamodb_store


class RecordingSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def faulty_store(
    endpoint: str, name: str, fault, attempts: int = 4
) -> tuple[DynamoDBLeaseStore, FaultInjectingClient, RecordingSleep]:
    healthy = dynamodb_store(endpoint, name)
    client = FaultInjectingClient(healthy.client, fault)
    sleep = RecordingSleep()
    policy = RetryPolicy(attempts=attempts, base_millis=10, max_millis=40, sleep=sleep)
    return DynamoDBLeaseStore(client, name, retry_policy=policy), client, sleep


def first_calls_fail(method: str, count: int, error: Exception):
    return lambda name, number: error if name == method and number <= count else None


def test_throttled_writes_are_retried_with_backoff_and_apply_exactly_once(moto_endpoint, unique_name):
    throttle = client_error("ProvisionedThroughputExceededException", "UpdateItem")
    store, client, sleep = faulty_store(moto_endpoint, unique_name, first_calls_fail("update_item", 2, throttle))
    store.create_lease_if_not_exists(Lease("shardId-0"))
    result = store.renew_lease(store.get_lease("shardId-0"))
    assert result.applied and result.lease.lease_counter == 1
    assert client.calls["update_item"] == 3
    assert len(sleep.delays) == 2 and all(0 <= delay <= 0.04 for delay in sleep.delays)


def test_throttling_that_never_clears_raises_a_retryable_throttled_error(moto_endpoint, unique_name):
    throttle = client_error("ThrottlingException", "UpdateItem")
    store, client, _ = faulty_store(moto_endpoint, unique_name, first_calls_fail("update_item", 99, throttle))
    store.create_lease_if_not_exists(Lease("shardId-0"))
    with pytest.raises(ThrottledError) as raised:
        store.renew_lease(store.get_lease("shardId-0"))
    assert raised.value.retryable and raised.value.attempts == 4 and client.calls["update_item"] == 4
    assert store.get_lease("shardId-0").lease_counter == 0


def test_transport_failures_that_persist_raise_a_retryable_dependency_error(moto_endpoint, unique_name):
    unreachable = botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    store, _, _ = faulty_store(moto_endpoint, unique_name, first_calls_fail("scan", 99, unreachable))
    with pytest.raises(DependencyError, match="Scan failed after 4 attempt") as raised:
        store.list_leases()
    assert raised.value.retryable


def test_server_errors_are_retried_until_they_clear(moto_endpoint, unique_name):
    server_error = client_error("InternalServerError", "GetItem", status=500)
    store, client, _ = faulty_store(moto_endpoint, unique_name, first_calls_fail("get_item", 3, server_error))
    store.create_lease_if_not_exists(Lease("shardId-0"))
    assert store.get_lease("shardId-0").lease_key == "shardId-0"
    assert client.calls["get_item"] == 4


def test_unprocessed_keys_of_a_batch_read_are_asked_for_again(moto_endpoint, unique_name):
    def leave_one_unprocessed(name, number):
        if name == "batch_get_item" and number == 1:
            healthy = store_client.batch_get_item(
                RequestItems={unique_name: {"Keys": [{"leaseKey": {"S": "shardId-0"}}]}}
            )
            healthy["UnprocessedKeys"] = {unique_name: {"Keys": [{"leaseKey": {"S": "shardId-1"}}]}}
            return healthy
        return None

    store, client, sleep = faulty_store(moto_endpoint, unique_name, leave_one_unprocessed)
    store_client = client._client
    for n in range(2):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}"))
        store.assign_lease(store.get_lease(f"shardId-{n}"), "worker-a")
    assert [lease.lease_key for lease in store.list_leases_for_owner("worker-a")] == ["shardId-0", "shardId-1"]
    assert client.calls["batch_get_item"] == 2 and len(sleep.delays) == 1


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(lambda store: store.get_lease("shardId-0"), id="get"),
        pytest.param(lambda store: store.list_leases(), id="scan"),
        pytest.param(lambda store: store.create_lease_if_not_exists(Lease("shardId-0")), id="create"),
        pytest.param(lambda store: store.renew_lease(Lease("shardId-0")), id="renew"),
        pytest.param(lambda store: store.delete_lease("shardId-0"), id="delete"),
    ],
)
def test_every_operation_on_a_missing_table_names_the_table(moto_endpoint, operation):
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    store = DynamoDBLeaseStore(client, "no-such-application")
    with pytest.raises(TableNotFoundError, match="'no-such-application' does not exist"):
        operation(store)


def test_a_lease_table_without_the_owner_index_says_so(moto_endpoint, dynamodb_client, unique_name):
    dynamodb_client.create_table(
        TableName=unique_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with pytest.raises(IndexNotFoundError, match="LeaseOwnerToLeaseKeyIndex"):
        DynamoDBLeaseStore(dynamodb_client, unique_name).list_leases_for_owner("worker-a")


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        pytest.param(
            client_error("ProvisionedThroughputExceededException", "UpdateItem"), False, id="throttled-was-refused"
        ),
        pytest.param(
            botocore.exceptions.ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), False, id="never-sent"
        ),
        pytest.param(
            client_error("InternalServerError", "UpdateItem", status=500), True, id="server-error-may-have-applied"
        ),
        pytest.param(botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), True, id="answer-lost"),
    ],
)
def test_a_write_says_it_was_sent_again_only_after_an_attempt_that_may_have_been_applied(
    moto_endpoint, unique_name, error, retried
):
    store, _, _ = faulty_store(moto_endpoint, unique_name, first_calls_fail("update_item", 1, error))
    store.create_lease_if_not_exists(Lease("shardId-0"))
    result = store.renew_lease(store.get_lease("shardId-0"))
    assert (result.applied, result.retried) == (True, retried)


def test_a_renewal_whose_answer_was_lost_is_recognised_by_its_holder_through_the_stores_retry(
    moto_endpoint, unique_name
):
    healthy = dynamodb_store(moto_endpoint, unique_name)
    healthy.create_lease_if_not_exists(Lease("shardId-0"))
    owned = healthy.assign_lease(healthy.get_lease("shardId-0", consistent=True), "app-worker-0").lease
    lossy = AnswerLostClient(healthy.client, lambda name, number: name == "update_item" and number == 2)
    store = DynamoDBLeaseStore(lossy, unique_name, retry_policy=FAST_RETRIES)
    holder = HeldLease(store, owned, 10_000)
    assert holder.claim()
    assert holder.renew(), "applied, answer lost, retried against itself: still ours"
    assert healthy.get_lease("shardId-0", consistent=True).lease_counter == owned.lease_counter + 2
    assert lossy.calls["update_item"] == 3
