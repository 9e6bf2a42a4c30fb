"""One contract for the coordinator-state store: in memory and on DynamoDB (moto)."""

from __future__ import annotations

import boto3
import pytest

from lease_core.coordinator_state import DynamoDBCoordinatorStateStore, InMemoryCoordinatorStateStore
from lease_core.tables import TableAdministrator
from tests.support.stores import FAST_RETRIES, fast_config


@pytest.fixture(params=["memory", "dynamodb"])
def state(request, unique_name):
    if request.param == "memory":
        return InMemoryCoordinatorStateStore()
    endpoint = request.getfixturevalue("moto_endpoint")
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    config = fast_config(unique_name)
    TableAdministrator(client, config, retry_policy=FAST_RETRIES).ensure_tables()
    return DynamoDBCoordinatorStateStore(client, config.coordinator_state_table, retry_policy=FAST_RETRIES)


def test_a_missing_record_reads_as_none(state):
    assert state.get("Leader") is None


def test_put_then_get_returns_the_record_with_its_key(state):
    assert state.put("Leader", {"ownerName": {"S": "a"}, "leaseDuration": {"S": "120000"}})
    assert state.get("Leader") == {"key": {"S": "Leader"}, "ownerName": {"S": "a"}, "leaseDuration": {"S": "120000"}}


def test_put_expecting_absence_succeeds_once(state):
    assert state.put("Leader", {"ownerName": {"S": "a"}}, expected={"key": None})
    assert not state.put("Leader", {"ownerName": {"S": "b"}}, expected={"key": None})
    assert state.get("Leader")["ownerName"] == {"S": "a"}


def test_put_expecting_a_value_replaces_only_the_matching_version(state):
    state.put("Leader", {"recordVersionNumber": {"S": "v1"}})
    assert not state.put("Leader", {"recordVersionNumber": {"S": "v3"}}, expected={"recordVersionNumber": {"S": "v2"}})
    assert state.put("Leader", {"recordVersionNumber": {"S": "v2"}}, expected={"recordVersionNumber": {"S": "v1"}})
    assert state.get("Leader")["recordVersionNumber"] == {"S": "v2"}


def test_numbers_are_compared_numerically_in_expectations(state):
    state.put("Auditor", {"count": {"N": "2"}})
    assert state.put("Auditor", {"count": {"N": "3"}}, expected={"count": {"N": "2.0"}})


def test_conditional_delete_removes_only_the_expected_record(state):
    state.put("Leader", {"recordVersionNumber": {"S": "v1"}})
    assert not state.delete("Leader", expected={"recordVersionNumber": {"S": "v0"}})
    assert state.delete("Leader", expected={"recordVersionNumber": {"S": "v1"}})
    assert state.get("Leader") is None
    assert state.delete("Leader")
