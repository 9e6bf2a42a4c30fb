"""Table management against DynamoDB on a moto server: layout, options, idempotence, races, teardown."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from lease_core.errors import TableNotReadyError, TableProtectedError
from lease_core.store.tables import TableAdministrator
from tests.support.faults import FaultInjectingClient
from tests.support.stores import FAST_RETRIES, fast_config, table_names


def administrator(client, name: str, **settings) -> TableAdministrator:
    return TableAdministrator(client, fast_config(name, **settings), retry_policy=FAST_RETRIES)


def key_schema(description) -> list[tuple[str, str]]:
    return [(key["AttributeName"], key["KeyType"]) for key in description["KeySchema"]]


def test_init_creates_the_three_tables_exactly_as_kcl_lays_them_out(dynamodb_client, unique_name):
    reports = administrator(dynamodb_client, unique_name, lease_table_layout="separate").ensure_tables()
    assert [(r.name, r.created) for r in reports] == [
        (unique_name, True),
        (f"{unique_name}-WorkerMetricStats", True),
        (f"{unique_name}-CoordinatorState", True),
    ]
    lease = dynamodb_client.describe_table(TableName=unique_name)["Table"]
    assert key_schema(lease) == [("leaseKey", "HASH")]
    assert {(a["AttributeName"], a["AttributeType"]) for a in lease["AttributeDefinitions"]} == {
        ("leaseKey", "S"),
        ("leaseOwner", "S"),
    }
    assert lease["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    (index,) = lease["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "LeaseOwnerToLeaseKeyIndex"
    assert key_schema(index) == [("leaseOwner", "HASH"), ("leaseKey", "RANGE")]
    assert index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    for suffix, hash_key in (("-WorkerMetricStats", "wid"), ("-CoordinatorState", "key")):
        table = dynamodb_client.describe_table(TableName=unique_name + suffix)["Table"]
        assert key_schema(table) == [(hash_key, "HASH")]
        assert table["AttributeDefinitions"] == [{"AttributeName": hash_key, "AttributeType": "S"}]
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert table.get("GlobalSecondaryIndexes", []) == []


def test_init_of_a_new_application_creates_the_lease_table_alone_and_records_kcl_3_5_single_layout(
    dynamodb_client, unique_name
):
    reports = administrator(dynamodb_client, unique_name).ensure_tables()
    assert [(r.role, r.name, r.created) for r in reports] == [("lease", unique_name, True)]
    record = dynamodb_client.get_item(TableName=unique_name, Key={"leaseKey": {"S": "TableLayout"}})["Item"]
    assert (record["layout"], record["entityType"]) == ({"S": "single"}, {"S": "LEADER"})
    separate = {f"{unique_name}-CoordinatorState", f"{unique_name}-WorkerMetricStats"}
    assert table_names(dynamodb_client) & separate == set()


@pytest.mark.parametrize(
    ("layout", "tables"), [pytest.param("single", 1, id="single"), pytest.param("separate", 3, id="separate")]
)
def test_init_is_idempotent_and_reports_existing_tables(dynamodb_client, unique_name, layout, tables):
    administrator(dynamodb_client, unique_name, lease_table_layout=layout).ensure_tables()
    again = administrator(dynamodb_client, unique_name, lease_table_layout=layout).ensure_tables()
    assert [r.created for r in again] == [False] * tables


@pytest.mark.parametrize(
    ("layout", "tables"), [pytest.param("single", 1, id="single"), pytest.param("separate", 3, id="separate")]
)
def test_concurrent_creators_all_succeed_and_each_table_is_created_once(dynamodb_client, unique_name, layout, tables):
    def setup(_: int):
        return administrator(dynamodb_client, unique_name, lease_table_layout=layout).ensure_tables()

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(setup, range(6)))
    for position in range(tables):
        assert sum(reports[position].created for reports in results) == 1
        assert {reports[position].status for reports in results} == {"ACTIVE"}


def test_provisioned_billing_gives_table_and_index_the_configured_capacity(dynamodb_client, unique_name):
    administrator(
        dynamodb_client,
        unique_name,
        billing_mode="PROVISIONED",
        initial_lease_table_read_capacity=7,
        initial_lease_table_write_capacity=3,
    ).ensure_tables()
    lease = dynamodb_client.describe_table(TableName=unique_name)["Table"]

    def capacity(d):
        return (
            d["ProvisionedThroughput"]["ReadCapacityUnits"],
            d["ProvisionedThroughput"]["WriteCapacityUnits"],
        )

    assert capacity(lease) == (7, 3)
    assert capacity(lease["GlobalSecondaryIndexes"][0]) == (7, 3)


def test_pitr_tags_and_deletion_protection_are_applied_when_configured(dynamodb_client, unique_name):
    administrator(
        dynamodb_client,
        unique_name,
        lease_table_pitr_enabled=True,
        lease_table_deletion_protection_enabled=True,
        tags={"team": "data", "env": "test"},
    ).ensure_tables()
    backups = dynamodb_client.describe_continuous_backups(TableName=unique_name)
    assert (
        backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"]
        == "ENABLED"
    )
    lease = dynamodb_client.describe_table(TableName=unique_name)["Table"]
    assert lease["DeletionProtectionEnabled"] is True
    tags = dynamodb_client.list_tags_of_resource(ResourceArn=lease["TableArn"])["Tags"]
    assert {t["Key"]: t["Value"] for t in tags} == {"team": "data", "env": "test"}
    with pytest.raises(TableProtectedError, match="deletion protection"):
        administrator(dynamodb_client, unique_name).delete_tables()
    assert dynamodb_client.describe_table(TableName=unique_name)["Table"]["TableStatus"] == "ACTIVE"


def test_a_kcl_2x_lease_table_without_the_owner_index_gets_it_added(dynamodb_client, unique_name):
    dynamodb_client.create_table(
        TableName=unique_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    reports = administrator(dynamodb_client, unique_name).ensure_tables()
    assert reports[0].created is False
    indexes = dynamodb_client.describe_table(TableName=unique_name)["Table"]["GlobalSecondaryIndexes"]
    assert [index["IndexName"] for index in indexes] == ["LeaseOwnerToLeaseKeyIndex"]


def test_a_table_that_never_becomes_active_times_out_with_its_status(dynamodb_client, unique_name):
    def stuck_creating(method: str, call_number: int):
        if method == "describe_table" and call_number > 1:
            table = dynamodb_client.describe_table(TableName=unique_name)["Table"]
            return {"Table": {**table, "TableStatus": "CREATING"}}
        return None

    clock = iter(range(0, 10_000, 5))
    stuck = TableAdministrator(
        FaultInjectingClient(dynamodb_client, stuck_creating),
        fast_config(unique_name, table_creation_timeout_seconds=30),
        retry_policy=FAST_RETRIES,
        sleep=lambda seconds: None,
        monotonic=lambda: next(clock),
    )
    with pytest.raises(TableNotReadyError, match=f"{unique_name}' is still CREATING after 30 s"):
        stuck.ensure_tables()


def test_teardown_deletes_all_tables_and_a_second_teardown_finds_none(dynamodb_client, unique_name):
    admin = administrator(dynamodb_client, unique_name, lease_table_layout="separate")
    admin.ensure_tables()
    assert admin.delete_tables() == [unique_name, f"{unique_name}-WorkerMetricStats", f"{unique_name}-CoordinatorState"]
    assert admin.delete_tables() == []
    assert all(admin.describe(name) is None for name in (unique_name, f"{unique_name}-CoordinatorState"))
