"""A new application's layout is recorded at setup, so that setups with different `lease_table_layout`
settings agree on one (docs/protocol.md §1.7), whatever the order of their steps (moto).

Each case interleaves two setups deterministically: the first runs until the named call, the second
runs to its end there, then the first finishes.
"""

from __future__ import annotations

from typing import Any

import pytest

from lease_core.store.table_layout import LAYOUT_RECORD_KEY, SEPARATE, SINGLE, TableLayoutName
from lease_core.store.tables import TableAdministrator
from tests.support.faults import FaultInjectingClient, InterleavingClient
from tests.support.stores import FAST_RETRIES, fast_config, table_names

Calls = list[tuple[str, dict[str, Any]]]


def administrator(client: Any, name: str, layout: TableLayoutName) -> TableAdministrator:
    return TableAdministrator(client, fast_config(name, lease_table_layout=layout), retry_policy=FAST_RETRIES)


def writes_the_layout_record(method: str, arguments: dict[str, Any], earlier: Calls) -> bool:
    return method == "put_item" and arguments["Item"]["leaseKey"]["S"] == LAYOUT_RECORD_KEY


def creates_a_separate_table(method: str, arguments: dict[str, Any], earlier: Calls) -> bool:
    return method == "create_table" and arguments["TableName"].endswith("-WorkerMetricStats")


def looks_for_separate_tables_after_recording(method: str, arguments: dict[str, Any], earlier: Calls) -> bool:
    recorded = any(writes_the_layout_record(*call, []) for call in earlier)
    return recorded and method == "describe_table" and arguments["TableName"].endswith("-WorkerMetricStats")


def layout_record(client: Any, name: str) -> dict[str, Any] | None:
    response = client.get_item(TableName=name, Key={"leaseKey": {"S": LAYOUT_RECORD_KEY}}, ConsistentRead=True)
    return response.get("Item")


@pytest.mark.parametrize(
    ("first", "second", "at", "agreed"),
    [
        pytest.param(SINGLE, SEPARATE, None, SINGLE, id="single-then-separate"),
        pytest.param(SEPARATE, SINGLE, None, SEPARATE, id="separate-then-single"),
        pytest.param(SINGLE, SEPARATE, writes_the_layout_record, SEPARATE, id="separate-done-before-single-records"),
        pytest.param(SEPARATE, SINGLE, writes_the_layout_record, SINGLE, id="single-done-before-separate-records"),
        pytest.param(SEPARATE, SINGLE, creates_a_separate_table, SEPARATE, id="single-while-separate-creates"),
        pytest.param(
            SINGLE, SEPARATE, looks_for_separate_tables_after_recording, SINGLE, id="separate-after-single-recorded"
        ),
    ],
)
def test_two_setups_with_different_settings_end_with_one_layout_both_see(
    dynamodb_client, unique_name, first, second, at, agreed
):
    second_setup = administrator(dynamodb_client, unique_name, second)
    interleaved: list[Any] = []
    first_client = dynamodb_client
    if at is not None:
        first_client = InterleavingClient(dynamodb_client, at, lambda: interleaved.append(second_setup.ensure_tables()))
    first_setup = administrator(first_client, unique_name, first)
    first_reports = first_setup.ensure_tables()
    assert len(interleaved) == (0 if at is None else 1), "the second setup ran between the first one's steps"
    second_reports = interleaved[0] if interleaved else second_setup.ensure_tables()
    assert first_setup.layout().layout == second_setup.layout().layout == agreed
    assert [report.role for report in first_reports] == [report.role for report in second_reports]
    separate_tables = {f"{unique_name}-WorkerMetricStats", f"{unique_name}-CoordinatorState"}
    existing = table_names(dynamodb_client)
    assert separate_tables <= existing if agreed == SEPARATE else not separate_tables & existing
    record = layout_record(dynamodb_client, unique_name)
    assert (record is None) if agreed == SEPARATE else record["layout"] == {"S": SINGLE}


def test_a_process_set_to_separate_reads_the_recorded_single_layout_without_scanning(dynamodb_client, unique_name):
    administrator(dynamodb_client, unique_name, SINGLE).ensure_tables()
    counting = FaultInjectingClient(dynamodb_client, lambda method, number: None)
    decision = administrator(counting, unique_name, SEPARATE).layout()
    assert (decision.layout, decision.from_setting) == (SINGLE, False)
    assert counting.calls.get("scan", 0) == 0


def test_a_setup_that_stopped_after_recording_separate_is_finished_by_the_next_setup(dynamodb_client, unique_name):
    stopped = administrator(dynamodb_client, unique_name, SEPARATE)
    stopped.ensure_tables()
    dynamodb_client.put_item(
        TableName=unique_name,
        Item={"leaseKey": {"S": LAYOUT_RECORD_KEY}, "layout": {"S": SEPARATE}, "entityType": {"S": "LEADER"}},
    )
    for suffix in ("-WorkerMetricStats", "-CoordinatorState"):
        dynamodb_client.delete_table(TableName=unique_name + suffix)
    reports = administrator(dynamodb_client, unique_name, SINGLE).ensure_tables()
    assert [(report.role, report.created) for report in reports] == [
        ("lease", False),
        ("worker_metrics", True),
        ("coordinator_state", True),
    ]
    assert layout_record(dynamodb_client, unique_name) is None
