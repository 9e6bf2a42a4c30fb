"""The round history the monitoring page reads stays within DynamoDB's item limit at 100 rounds of 100 slots (moto)."""

from __future__ import annotations

import json

import pytest
from kinesis_lease.operators import round_summary

from lease_core.leader import round_history
from lease_core.leader.round_history import (
    HISTORY_BUDGET_BYTES,
    HISTORY_KEY,
    LAST_ROUND_KEY,
    LEASE_ROW_FIELDS,
    RoundHistory,
)
from lease_core.store.coordinator_state import CoordinatorStateStore
from spark_jobs.round_report import LeaseReport, RoundFigures, RoundReport, SlotReport
from tests.support.stores import dynamodb_state_store, dynamodb_store

DYNAMODB_ITEM_LIMIT = 400 * 1024

pytestmark = pytest.mark.moto


@pytest.fixture
def state(moto_endpoint: str, unique_name: str) -> CoordinatorStateStore:
    dynamodb_store(moto_endpoint, unique_name)
    return dynamodb_state_store(moto_endpoint, unique_name)


def figures(round_number: int, slots: int) -> RoundFigures:
    """A round of `slots` slots reading one lease each, with figures of realistic width."""
    return RoundReport.build(
        "orders-application",
        round_number,
        ["orders"],
        "s3://lake/orders",
        "2026-11-24T03:00:00+00:00",
        61.25,
        [
            SlotReport(
                f"orders-application-worker-{index}",
                0,
                58.125,
                37.123456,
                (
                    LeaseReport(
                        f"shardId-{index:012d}",
                        "orders",
                        f"shardId-{index:012d}",
                        f"orders-application-worker-{index}",
                        "caught_up",
                        "49600000000000000000000000000000000000000000000000000000",
                        "49600000000000000000000000000000000000000000000000009999",
                        records=123456,
                        bytes=98765432,
                        millis_behind_latest=1234,
                        dead_lettered=2 if index == 0 else 0,
                    ),
                ),
            )
            for index in range(slots)
        ],
    ).figures()


def summary(round_number: int, slots: int = 100) -> dict[str, object]:
    return round_summary(
        figures(round_number, slots),
        {"round_number": round_number, "moves": [{}] * 7},
        {},
        f"scheduled__round-{round_number:03d}",
        "kinesis_lease_pipeline",
        f"kinesis_lease_pipeline/scheduled__round-{round_number:03d}/0123456789abcdef",
    )


def stored_item_bytes(state: CoordinatorStateStore, key: str) -> int:
    """The item's size as DynamoDB counts it: attribute names plus values (strings, numbers, binaries)."""
    record = state.get(key)
    assert record is not None
    sizes = 0
    for name, value in record.items():
        text = value if isinstance(value, str | bytes) else json.dumps(value, default=str)
        sizes += len(name.encode()) + len(text.encode() if isinstance(text, str) else text)
    return sizes


def test_a_hundred_rounds_of_a_hundred_slots_are_all_kept_within_the_item_limit(state):
    history = RoundHistory(state)
    for number in range(1, 101):
        history.append(summary(number))
    unbudgeted = len(json.dumps([summary(number) for number in range(1, 101)]))
    assert unbudgeted > DYNAMODB_ITEM_LIMIT  # what the budget is for: this would not be written whole

    rounds = history.rounds()
    assert [entry["round"] for entry in rounds] == list(range(1, 101))
    assert stored_item_bytes(state, HISTORY_KEY) < DYNAMODB_ITEM_LIMIT
    assert len(state.get(HISTORY_KEY)["rounds"]) <= HISTORY_BUDGET_BYTES
    # The newest rounds keep their per-slot rows; the oldest made way for them but keep their totals.
    with_slots = [entry["round"] for entry in rounds if entry["slots"] is not None]
    assert with_slots == list(range(with_slots[0], 101)) and len(with_slots) >= 50
    assert len(rounds[-1]["slots"]["rows"]) == 100
    assert rounds[0]["slots"] is None and rounds[0]["records"] == 100 * 123456 and rounds[0]["moves"] == 7
    assert rounds[-1]["dead_lettered"] == 2  # slot 0's lease set two records aside


def test_past_the_budget_without_per_slot_rows_the_oldest_rounds_go_and_the_newest_stays(state):
    history = RoundHistory(state, budget_bytes=8_000)
    for number in range(1, 31):
        history.append(summary(number, slots=10))
    kept = [entry["round"] for entry in history.rounds()]
    assert kept == list(range(kept[0], 31)) and kept[0] > 1
    assert len(state.get(HISTORY_KEY)["rounds"]) <= 8_000
    lone = RoundHistory(state, budget_bytes=100)
    lone.append(summary(31, slots=10))
    assert [entry["round"] for entry in lone.rounds()] == [31]


def test_the_last_rounds_rows_of_ten_thousand_leases_fit_one_item_and_read_back(state):
    (row,) = figures(5, 1).lease_rows()
    many = [{**row, "lease_key": f"shardId-{index:012d}", "records": index} for index in range(10_000)]
    history = RoundHistory(state)
    history.record_lease_rows(5, many)
    assert stored_item_bytes(state, LAST_ROUND_KEY) < DYNAMODB_ITEM_LIMIT
    assert history.lease_rows() == (5, many)


def test_rows_past_the_budget_keep_what_the_page_shows_of_them_the_dead_letter_count_among_it(state, monkeypatch):
    # 1,000 rows: whole, about 6.7 KB compressed; their shown fields, about 4.3 KB.
    monkeypatch.setattr(round_history, "LEASE_ROWS_BUDGET_BYTES", 5_000)
    (row,) = figures(5, 1).lease_rows()
    many = [
        {**row, "lease_key": f"shardId-{index:012d}", "start": f"{index:056d}", "dead_lettered": index % 3}
        for index in range(1_000)
    ]
    history = RoundHistory(state)
    history.record_lease_rows(5, many)
    _, kept, left_out = history.kept_lease_rows()
    assert kept and len(kept) + left_out == 1_000
    assert all(set(kept_row) == set(LEASE_ROW_FIELDS) for kept_row in kept)
    assert [kept_row["dead_lettered"] for kept_row in kept] == [index % 3 for index in range(len(kept))]


def test_the_kept_history_never_exceeds_its_budget_counting_every_separator(state):
    entry_size = len(json.dumps({"records": 1, "run_id": "r-000"}, separators=(",", ":")))
    budget = 100 * entry_size + 99 + 2 - 1  # one byte short of 100 entries with their commas and brackets
    history = RoundHistory(state, keep=100, budget_bytes=budget)
    for index in range(100):
        history.append({"run_id": f"r-{index:03d}", "records": 1})
    stored = state.get(HISTORY_KEY)
    assert stored is not None and len(stored["rounds"].encode()) <= budget
    assert [entry["run_id"] for entry in history.rounds()] == [f"r-{index:03d}" for index in range(1, 100)]
