"""The last rounds' figures in the coordinator-state table, on both stores."""

from __future__ import annotations

import json
import uuid

import boto3
import pytest

from lease_core.leader.round_history import HISTORY_KEY, LAST_ROUND_KEY, RoundHistory
from lease_core.store.coordinator_state import DynamoDBCoordinatorStateStore, InMemoryCoordinatorStateStore
from lease_core.store.tables import TableAdministrator
from tests.support.faults import AnswerLostClient
from tests.support.stores import FAST_RETRIES, dynamodb_state_store, dynamodb_store, fast_config


@pytest.fixture(params=["memory", "dynamodb"])
def state(request: pytest.FixtureRequest, unique_name: str):
    if request.param == "memory":
        return InMemoryCoordinatorStateStore()
    endpoint = request.getfixturevalue("moto_endpoint")
    dynamodb_store(endpoint, unique_name)
    return dynamodb_state_store(endpoint, unique_name)


def test_an_empty_history_has_no_rounds(state):
    assert RoundHistory(state).rounds() == []


def test_appended_rounds_read_back_oldest_first(state):
    history = RoundHistory(state)
    history.append({"round": 1, "records": 10})
    history.append({"round": 2, "records": 0})
    assert RoundHistory(state).rounds() == [{"round": 1, "records": 10}, {"round": 2, "records": 0}]


def test_only_the_newest_rounds_are_kept(state):
    history = RoundHistory(state, keep=3)
    for number in range(1, 6):
        history.append({"round": number})
    assert [entry["round"] for entry in history.rounds()] == [3, 4, 5]


def test_a_history_keeps_at_least_one_round():
    with pytest.raises(ValueError, match="keep"):
        RoundHistory(InMemoryCoordinatorStateStore(), keep=0)


@pytest.mark.parametrize(
    ("retried", "expected_runs"),
    [
        pytest.param("run-b", ["run-a", "run-b"], id="the-latest-run"),
        pytest.param("run-a", ["run-a", "run-b"], id="an-earlier-run-keeps-its-place"),
    ],
)
def test_a_retried_append_of_a_kept_run_replaces_its_entry_instead_of_adding_one(state, retried, expected_runs):
    history = RoundHistory(state)
    history.append({"run_id": "run-a", "round": 1, "finished_at": 1})
    history.append({"run_id": "run-b", "round": 2, "finished_at": 2})
    retry = {"run_id": retried, "round": 9, "finished_at": 3}
    after_retry = history.append(retry)
    assert after_retry == history.rounds()
    assert [entry["run_id"] for entry in after_retry] == expected_runs
    assert retry in after_retry


def test_summaries_without_a_run_id_are_each_kept_as_rounds_of_their_own(state):
    history = RoundHistory(state)
    history.append({"round": 1})
    history.append({"round": 1})
    assert history.rounds() == [{"round": 1}, {"round": 1}]


@pytest.mark.parametrize(
    "summary",
    [
        pytest.param({"run_id": "run-b", "round": 2}, id="with-run-id"),
        pytest.param({"round": 2}, id="without-run-id"),
    ],
)
def test_an_append_whose_answer_was_lost_is_kept_once(moto_endpoint, unique_name, summary):
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    config = fast_config(unique_name, lease_table_layout="separate")
    TableAdministrator(client, config, retry_policy=FAST_RETRIES).ensure_tables()
    lossy = AnswerLostClient(client, lambda method, number: method == "put_item" and number == 2)
    history = RoundHistory(DynamoDBCoordinatorStateStore(lossy, config.coordinator_state_table, FAST_RETRIES))
    history.append({"run_id": "run-a", "round": 1})
    history.append(summary)  # lands, its answer is lost, and the retried put fails its condition against itself
    assert lossy.calls["put_item"] == 3
    assert history.rounds() == [{"run_id": "run-a", "round": 1}, summary]


@pytest.mark.parametrize(
    ("first", "second", "kept"),
    [
        pytest.param(1, 2, (2, "second"), id="a-newer-round-replaces"),
        pytest.param(2, 2, (2, "second"), id="the-same-round-replaces"),
        pytest.param(3, 2, (3, "first"), id="an-older-round-is-ignored"),
    ],
)
def test_lease_rows_are_kept_for_the_newest_round_recorded(state, first, second, kept):
    history = RoundHistory(state)
    assert history.lease_rows() == (None, [])
    history.record_lease_rows(first, [{"lease_key": "shardId-1", "recorded": "first"}])
    history.record_lease_rows(second, [{"lease_key": "shardId-1", "recorded": "second"}])
    kept_round, kept_rows = kept
    assert history.lease_rows() == (kept_round, [{"lease_key": "shardId-1", "recorded": kept_rows}])


def test_records_the_previous_release_wrote_are_read_and_updated(state):
    # It versioned the history with a random hex token, and wrote the lease rows unversioned.
    previous_history = json.dumps([{"run_id": "run-a", "round": 1}])
    state.put(HISTORY_KEY, {"rounds": previous_history, "version": uuid.uuid4().hex})
    state.put(LAST_ROUND_KEY, {"round": 1, "leases": "[]"})
    history = RoundHistory(state)
    history.append({"run_id": "run-b", "round": 2})
    history.record_lease_rows(2, [{"lease_key": "shardId-1"}])
    assert [entry["run_id"] for entry in history.rounds()] == ["run-a", "run-b"]
    assert history.lease_rows() == (2, [{"lease_key": "shardId-1"}])
