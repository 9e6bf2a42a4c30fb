"""One contract for the coordinator-state store: in memory and on DynamoDB (moto), in its own table
(`<app>-CoordinatorState`) and in the lease table (KCL 3.5's single-table layout, docs/protocol.md §1.7)."""

from __future__ import annotations

import itertools
from decimal import Decimal

import boto3
import pytest

from lease_core.errors import CoordinatorStateConflictError
from lease_core.store.coordinator_state import (
    DynamoDBCoordinatorStateStore,
    InMemoryCoordinatorStateStore,
    decide_and_record,
    update_record,
)
from lease_core.store.lease_table_records import coordinator_state_records
from lease_core.store.record_table import DynamoDBRecordTable, InMemoryRecordTable
from lease_core.store.tables import TableAdministrator
from tests.support.faults import AnswerLostClient
from tests.support.stores import FAST_RETRIES, fast_config


@pytest.fixture(params=["memory", "dynamodb", "memory lease table", "dynamodb lease table"])
def state(request, unique_name):
    if request.param == "memory":
        return InMemoryCoordinatorStateStore()
    if request.param == "memory lease table":
        return coordinator_state_records(InMemoryRecordTable("in-memory-leases", "leaseKey"))
    endpoint = request.getfixturevalue("moto_endpoint")
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    config = fast_config(unique_name, lease_table_layout="separate")
    TableAdministrator(client, config, retry_policy=FAST_RETRIES).ensure_tables()
    if request.param == "dynamodb lease table":
        return coordinator_state_records(DynamoDBRecordTable(client, config.lease_table, "leaseKey", FAST_RETRIES))
    return DynamoDBCoordinatorStateStore(client, config.coordinator_state_table, retry_policy=FAST_RETRIES)


def test_a_missing_record_reads_as_none(state):
    assert state.get("Leader") is None


def test_put_then_get_returns_the_record_with_its_key(state):
    assert state.put("Leader", {"ownerName": "a", "leaseDuration": "120000"})
    assert state.get("Leader") == {"key": "Leader", "ownerName": "a", "leaseDuration": "120000"}


def test_put_expecting_absence_succeeds_once(state):
    assert state.put("Leader", {"ownerName": "a"}, expected={"key": None})
    assert not state.put("Leader", {"ownerName": "b"}, expected={"key": None})
    assert state.get("Leader")["ownerName"] == "a"


def test_put_expecting_a_value_replaces_only_the_matching_version(state):
    state.put("Leader", {"recordVersionNumber": "v1"})
    assert not state.put("Leader", {"recordVersionNumber": "v3"}, expected={"recordVersionNumber": "v2"})
    assert state.put("Leader", {"recordVersionNumber": "v2"}, expected={"recordVersionNumber": "v1"})
    assert state.get("Leader")["recordVersionNumber"] == "v2"


def test_numbers_are_compared_numerically_in_expectations(state):
    state.put("Auditor", {"count": 2})
    assert state.put("Auditor", {"count": 3}, expected={"count": Decimal("2.0")})
    assert state.get("Auditor")["count"] == Decimal(3)


RECORD_WITH_EVERY_TYPE = {
    "name": "orders",
    "count": 7,
    "share": Decimal("0.25"),
    "flag": True,
    "streams": ["a", "b"],
    "pending": {"a": 400},
    "children": {"shardId-1", "shardId-2"},
    "packed": b"\x00\x01",
}


def test_plain_values_read_back_as_dynamodb_gives_them(state):
    state.put("Record", RECORD_WITH_EVERY_TYPE)
    assert state.get("Record") == {**RECORD_WITH_EVERY_TYPE, "key": "Record"}
    assert isinstance(state.get("Record")["count"], Decimal)


def test_a_float_is_refused_naming_the_attribute(state):
    with pytest.raises(TypeError, match="attribute 'share'"):
        state.put("Record", {"share": 0.25})
    assert state.get("Record") is None


def test_update_sets_its_attributes_and_keeps_the_others(state):
    state.put("Record", {"name": "orders", "count": 1})
    state.update("Record", {"count": 2, "flag": False})
    state.update("Other", {"count": 5})
    assert state.get("Record") == {"key": "Record", "name": "orders", "count": 2, "flag": False}
    assert sorted(record["key"] for record in state.scan()) == ["Other", "Record"]


def test_an_update_with_nothing_to_set_creates_the_bare_record(state):
    state.update("Bare", {})
    assert state.get("Bare") == {"key": "Bare"}


def test_on_dynamodb_records_are_stored_with_the_types_kcl_tooling_expects(moto_endpoint, unique_name):
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    config = fast_config(unique_name, lease_table_layout="separate")
    TableAdministrator(client, config, retry_policy=FAST_RETRIES).ensure_tables()
    state = DynamoDBCoordinatorStateStore(client, config.coordinator_state_table, retry_policy=FAST_RETRIES)
    state.put("Record", RECORD_WITH_EVERY_TYPE)
    item = client.get_item(TableName=config.coordinator_state_table, Key={"key": {"S": "Record"}})["Item"]
    item["children"]["SS"].sort()
    assert item == {
        "key": {"S": "Record"},
        "name": {"S": "orders"},
        "count": {"N": "7"},
        "share": {"N": "0.25"},
        "flag": {"BOOL": True},
        "streams": {"L": [{"S": "a"}, {"S": "b"}]},
        "pending": {"M": {"a": {"N": "400"}}},
        "children": {"SS": ["shardId-1", "shardId-2"]},
        "packed": {"B": b"\x00\x01"},
    }


def test_conditional_delete_removes_only_the_expected_record(state):
    state.put("Leader", {"recordVersionNumber": "v1"})
    assert not state.delete("Leader", expected={"recordVersionNumber": "v0"})
    assert state.delete("Leader", expected={"recordVersionNumber": "v1"})
    assert state.get("Leader") is None
    assert state.delete("Leader")


# --- update_record: versioned read-modify-write --------------------------------------------------


def appended(value: str):
    """A change that appends `value` to the record's `items` list (kept as a string)."""

    def change(record):
        items = record["items"].split(",") if record else []
        return {"items": ",".join([*items, value])}

    return change


def test_update_record_creates_then_changes_a_record_with_a_new_version_each_time(state):
    first = update_record(state, "History", appended("a"))
    second = update_record(state, "History", appended("b"))
    assert state.get("History")["items"] == "a,b"
    assert first["version"] != second["version"] == state.get("History")["version"]


def test_update_record_writes_nothing_when_the_change_says_so(state):
    update_record(state, "History", appended("a"))
    before = state.get("History")
    assert update_record(state, "History", lambda record: None) == before
    assert state.get("History") == before


def test_a_concurrent_writer_between_read_and_write_is_not_overwritten(state):
    update_record(state, "History", appended("a"))
    interloped = []

    def change(record):
        if not interloped:  # another writer lands between this attempt's read and its write
            interloped.append(update_record(state, "History", appended("other")))
        return appended("mine")(record)

    update_record(state, "History", change)
    assert state.get("History")["items"] == "a,other,mine"


def test_decide_and_record_returns_the_decision_taken_from_the_record_it_wrote_over(state):
    update_record(state, "History", appended("a"))
    interloped = []

    def decide(record):
        if not interloped:  # the first decision is taken from a record that changes before the write
            interloped.append(update_record(state, "History", appended("other")))
        return record["items"], appended("mine")(record)

    assert decide_and_record(state, "History", decide) == "a,other"
    assert state.get("History")["items"] == "a,other,mine"


def test_a_record_written_without_a_version_is_updated_only_while_it_still_lacks_one(state):
    state.put("History", {"items": "legacy"})
    update_record(state, "History", appended("a"))
    assert state.get("History")["items"] == "legacy,a" and "version" in state.get("History")


def test_a_record_that_changes_under_every_attempt_raises_a_retryable_conflict(state):
    versions = itertools.count()

    def change(record):
        state.put("History", {"items": "someone else", "version": f"theirs-{next(versions)}"})
        return {"items": "mine"}

    with pytest.raises(CoordinatorStateConflictError, match=r"'History'.*3 attempts") as raised:
        update_record(state, "History", change, attempts=3)
    assert raised.value.retryable and state.get("History")["items"] == "someone else"


def test_a_write_whose_answer_was_lost_is_recognised_and_not_applied_twice(moto_endpoint, unique_name):
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    config = fast_config(unique_name, lease_table_layout="separate")
    TableAdministrator(client, config, retry_policy=FAST_RETRIES).ensure_tables()
    lossy = AnswerLostClient(client, lambda method, number: method == "put_item" and number == 2)
    state = DynamoDBCoordinatorStateStore(lossy, config.coordinator_state_table, retry_policy=FAST_RETRIES)
    update_record(state, "History", appended("a"))
    update_record(state, "History", appended("b"))  # lands, answer lost, the retry fails its condition
    assert lossy.calls["put_item"] == 3
    assert state.get("History")["items"] == "a,b"


def test_a_write_whose_answer_was_lost_and_was_then_written_over_is_not_applied_twice(state):
    update_record(state, "History", appended("a"))

    class LostThenOverwritten:
        """Our put lands, its answer is lost, and another writer updates the record before we look."""

        def __init__(self, inner):
            self.inner, self.table_name, self.lost = inner, inner.table_name, False

        def get(self, key):
            return self.inner.get(key)

        def put(self, key, attributes, expected=None):
            if self.lost:
                return self.inner.put(key, attributes, expected)
            self.lost = self.inner.put(key, attributes, expected)
            update_record(self.inner, key, appended("other"))
            return False

    update_record(LostThenOverwritten(state), "History", appended("b"))
    assert state.get("History")["items"] == "a,b,other"
