"""The last rounds' figures in the coordinator-state table, on both stores."""

from __future__ import annotations

import pytest

from lease_core.coordinator_state import DynamoDBCoordinatorStateStore, InMemoryCoordinatorStateStore
from lease_core.round_history import RoundHistory
from tests.support.stores import FAST_RETRIES, dynamodb_store, fast_config


@pytest.fixture(params=["memory", "dynamodb"])
def state(request: pytest.FixtureRequest, unique_name: str):
    if request.param == "memory":
        return InMemoryCoordinatorStateStore()
    store = dynamodb_store(request.getfixturevalue("moto_endpoint"), unique_name)
    return DynamoDBCoordinatorStateStore(store.client, fast_config(unique_name).coordinator_state_table, FAST_RETRIES)


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


def test_the_latest_rounds_lease_rows_replace_the_previous_ones(state):
    history = RoundHistory(state)
    assert history.lease_rows() == (None, [])
    history.record_lease_rows(1, [{"lease_key": "shardId-1", "millis_behind_latest": 5}])
    history.record_lease_rows(2, [{"lease_key": "shardId-2", "millis_behind_latest": 0}])
    assert history.lease_rows() == (2, [{"lease_key": "shardId-2", "millis_behind_latest": 0}])
