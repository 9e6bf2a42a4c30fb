"""Administration acts only on the application's own tables: init, teardown and the DAG's table step
refuse a table of another schema or with items that are not the application's, and leave every
table as it was (DynamoDB and Kinesis on a moto server; leasectl as a real process)."""

from __future__ import annotations

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException
from kinesis_lease.aws_connection import AwsAccess
from kinesis_lease.errors import airflow_error
from kinesis_lease.operators import EnsureLeaseTablesOperator

from lease_core.errors import ForeignTableError, StreamNotFoundError
from lease_core.store.tables import TableAdministrator
from tests.support.kcl_tables import LEASE, TABLE_MIGRATION, WORKER_METRIC_STATS
from tests.support.leasectl import run_leasectl
from tests.support.stores import FAST_RETRIES, fast_config

REGION = "us-east-1"


def administrator(client, name: str) -> TableAdministrator:
    return TableAdministrator(client, fast_config(name), retry_policy=FAST_RETRIES)


def leasectl(endpoint: str, app: str, *command: str):
    """leasectl on an application set up in the separate layout: the refusals here name one of its three tables."""
    return run_leasectl("--app", app, *command, dynamodb=endpoint, KINESIS_LEASE_LEASE_TABLE_LAYOUT="separate")


def create_table(client, name: str, hash_key: str, key_type: str = "S", items=()) -> None:
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": hash_key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": hash_key, "AttributeType": key_type}],
        BillingMode="PAY_PER_REQUEST",
    )
    for item in items:
        client.put_item(TableName=name, Item=item)


def replace_table(client, name: str, hash_key: str, key_type: str = "S", items=()) -> None:
    client.delete_table(TableName=name)
    create_table(client, name, hash_key, key_type, items)


def items_of(client, name: str) -> list[dict]:
    return sorted(client.scan(TableName=name)["Items"], key=repr)


def table_names(client, prefix: str) -> set[str]:
    # Every page: the session's moto holds the tables of every test before this one.
    pages = client.get_paginator("list_tables").paginate()
    return {name for page in pages for name in page["TableNames"] if name.startswith(prefix)}


def the_three(app: str) -> set[str]:
    return {app, f"{app}-WorkerMetricStats", f"{app}-CoordinatorState"}


ORDERS = [{"id": {"S": f"order-{n}"}, "total": {"N": str(n)}} for n in range(3)]
KCL_LEASE = {
    "leaseKey": {"S": "shardId-000000000000"},
    "leaseCounter": {"N": "12"},
    "leaseOwner": {"S": "kcl-worker-1"},
    "checkpoint": {"S": "49590338271490256608559692538361571095921575989136588898"},
    "checkpointSubSequenceNumber": {"N": "0"},
    "ownerSwitchesSinceCheckpoint": {"N": "0"},
}


# --- teardown --------------------------------------------------------------------------------------


def test_teardown_refuses_an_unrelated_table_under_the_lease_tables_name_and_keeps_its_items(
    moto_endpoint, dynamodb_client, unique_name
):
    create_table(dynamodb_client, unique_name, "id", items=ORDERS)
    result = leasectl(moto_endpoint, unique_name, "teardown", "--yes")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"leasectl: DynamoDB table {unique_name!r} is not this application's lease table: its key schema is "
        "id (HASH), not leaseKey (HASH); teardown refused, no table was created, changed or deleted "
        "(check application_name and lease_table_name)"
    ]
    assert items_of(dynamodb_client, unique_name) == sorted(ORDERS, key=repr)


FOREIGN = [
    pytest.param("", "id", "S", ORDERS, "its key schema is id (HASH), not leaseKey (HASH)", id="lease-key-schema"),
    pytest.param(
        "",
        "leaseKey",
        "S",
        [{"leaseKey": {"S": "order-1"}, "total": {"N": "3"}}],
        "its item 'order-1' is not a lease: attribute 'leaseCounter' is missing",
        id="lease-items",
    ),
    pytest.param("-WorkerMetricStats", "wid", "N", (), "its hash key 'wid' is of type N, not S", id="metrics-type"),
    pytest.param(
        "-WorkerMetricStats",
        "wid",
        "S",
        [{"wid": {"S": "alice"}, "email": {"S": "alice@example.com"}}],
        "its item 'alice' is not a worker-metrics item: attribute 'email' is not one of KCL's",
        id="metrics-items",
    ),
    pytest.param(
        "-CoordinatorState",
        "key",
        "S",
        [{"key": {"S": "feature-flags"}, "dark-mode": {"BOOL": True}}],
        "its item 'feature-flags' is not a coordinator-state record",
        id="coordinator-state-items",
    ),
]


@pytest.mark.parametrize(("suffix", "hash_key", "key_type", "items", "mismatch"), FOREIGN)
def test_teardown_with_one_foreign_table_deletes_none_and_takes_no_lock(
    moto_endpoint, dynamodb_client, unique_name, suffix, hash_key, key_type, items, mismatch
):
    assert leasectl(moto_endpoint, unique_name, "init").returncode == 0
    replace_table(dynamodb_client, unique_name + suffix, hash_key, key_type, items)
    before = {name: items_of(dynamodb_client, name) for name in the_three(unique_name)}
    result = leasectl(moto_endpoint, unique_name, "teardown", "--yes")
    assert result.returncode == 1
    assert f"DynamoDB table {unique_name + suffix!r} is not this application's" in result.stderr
    assert mismatch in result.stderr and "teardown refused" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    # Every table is still there with exactly its items: not even the leader lock was written.
    assert {name: items_of(dynamodb_client, name) for name in the_three(unique_name)} == before


def test_teardown_deletes_a_kcl_2x_lease_table_without_index_and_the_applications_tables_with_their_items(
    moto_endpoint, dynamodb_client, unique_name
):
    kcl_35_item = {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER"}}
    create_table(dynamodb_client, unique_name, "leaseKey", items=[KCL_LEASE, kcl_35_item])
    create_table(
        dynamodb_client,
        f"{unique_name}-WorkerMetricStats",
        "wid",
        items=[
            {
                "wid": {"S": "kcl-worker-1"},
                "lut": {"N": "1700000000"},
                "sts": {"M": {"C": {"L": [{"N": "42.5"}]}}},
                "opr": {"M": {"C": {"L": [{"N": "100"}]}}},
            }
        ],
    )
    create_table(
        dynamodb_client,
        f"{unique_name}-CoordinatorState",
        "key",
        items=[{"key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_3X"}}],
    )
    result = leasectl(moto_endpoint, unique_name, "teardown", "--yes")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == sorted(["deleted"] * 3 + list(the_three(unique_name)))
    assert table_names(dynamodb_client, unique_name) == set()


def test_teardown_deletes_a_kcl_2x_lease_table_alone(moto_endpoint, dynamodb_client, unique_name):
    create_table(dynamodb_client, unique_name, "leaseKey", items=[KCL_LEASE])
    result = leasectl(moto_endpoint, unique_name, "teardown", "--yes")
    assert (result.returncode, result.stdout.split()) == (0, ["deleted", unique_name]), result.stderr
    assert table_names(dynamodb_client, unique_name) == set()


def test_teardown_deletes_a_kcl_3_5_single_table_lease_table_under_the_lock_in_it(
    moto_endpoint, dynamodb_client, unique_name
):
    create_table(dynamodb_client, unique_name, "leaseKey", items=[LEASE, WORKER_METRIC_STATS, TABLE_MIGRATION])
    result = leasectl(moto_endpoint, unique_name, "teardown", "--yes")
    assert (result.returncode, result.stdout.split()) == (0, ["deleted", unique_name]), result.stderr
    assert table_names(dynamodb_client, unique_name) == set()


def test_teardown_refuses_a_lease_table_whose_worker_metrics_item_is_not_kcl_s(
    moto_endpoint, dynamodb_client, unique_name
):
    foreign = {**WORKER_METRIC_STATS, "price": {"N": "3"}}
    create_table(dynamodb_client, unique_name, "leaseKey", items=[LEASE, foreign])
    result = leasectl(moto_endpoint, unique_name, "teardown", "--yes")
    assert result.returncode == 1
    assert "'worker-1' is not a worker-metrics item: attribute 'price' is not one of KCL's" in result.stderr
    assert table_names(dynamodb_client, unique_name) == {unique_name}


# --- init and ensure_tables --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["-CoordinatorState", "-WorkerMetricStats"])
def test_init_for_an_application_named_after_another_applications_table_refuses_and_creates_nothing(
    moto_endpoint, dynamodb_client, unique_name, suffix
):
    assert leasectl(moto_endpoint, unique_name, "init").returncode == 0
    colliding = unique_name + suffix
    before = dynamodb_client.describe_table(TableName=colliding)["Table"]
    result = leasectl(moto_endpoint, colliding, "init")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"leasectl: DynamoDB table {colliding!r} is not this application's lease table: its key schema is "
        f"{'key' if suffix == '-CoordinatorState' else 'wid'} (HASH), not leaseKey (HASH); table setup refused, "
        "no table was created, changed or deleted (check application_name and lease_table_name)"
    ]
    after = dynamodb_client.describe_table(TableName=colliding)["Table"]
    assert after.get("GlobalSecondaryIndexes", []) == before.get("GlobalSecondaryIndexes", []) == []
    assert table_names(dynamodb_client, colliding) == {colliding}  # none of the colliding app's own was created
    teardown = leasectl(moto_endpoint, colliding, "teardown", "--yes")
    assert teardown.returncode == 1 and "teardown refused" in teardown.stderr
    assert table_names(dynamodb_client, unique_name) == the_three(unique_name)


@pytest.mark.parametrize(
    ("suffix", "hash_key", "key_type"),
    [
        pytest.param("", "leaseKey", "N", id="lease-key-of-another-type"),
        pytest.param("-WorkerMetricStats", "id", "S", id="metrics-of-another-schema"),
        pytest.param("-CoordinatorState", "id", "S", id="coordinator-state-of-another-schema"),
    ],
)
def test_ensure_tables_refuses_a_foreign_table_before_creating_or_changing_anything(
    dynamodb_client, unique_name, suffix, hash_key, key_type
):
    create_table(dynamodb_client, unique_name + suffix, hash_key, key_type)
    with pytest.raises(ForeignTableError, match=f"{unique_name + suffix}' is not this application's") as refused:
        administrator(dynamodb_client, unique_name).ensure_tables()
    assert not refused.value.retryable
    assert table_names(dynamodb_client, unique_name) == {unique_name + suffix}
    assert (
        dynamodb_client.describe_table(TableName=unique_name + suffix)["Table"].get("GlobalSecondaryIndexes", []) == []
    )


def test_a_refused_table_fails_the_airflow_task_without_retrying():
    error = ForeignTableError("orders", "lease table", "its key schema is id (HASH), not leaseKey (HASH)", "teardown")
    assert isinstance(airflow_error(error), AirflowFailException)


# --- the DAG's ensure_tables step ----------------------------------------------------------------------


def access_to(moto_endpoint: str, application: str) -> AwsAccess:
    config = fast_config(
        application,
        aws_endpoint_url_dynamodb=moto_endpoint,
        aws_endpoint_url_kinesis=moto_endpoint,
        aws_region=REGION,
        lease_table_layout="separate",
    )
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)
    return AwsAccess(session, config)


def ensure_tables_step(streams) -> EnsureLeaseTablesOperator:
    return EnsureLeaseTablesOperator(task_id="ensure_tables", settings={}, streams=streams)


def test_the_dags_table_step_creates_no_table_for_a_stream_that_does_not_exist(
    moto_endpoint, dynamodb_client, unique_name
):
    access = access_to(moto_endpoint, unique_name)
    with pytest.raises(StreamNotFoundError, match=f"stream '{unique_name}-missing' does not exist"):
        ensure_tables_step([f"{unique_name}-missing"]).run(access, None)
    assert table_names(dynamodb_client, unique_name) == set()


def test_the_dags_table_step_creates_the_tables_once_every_stream_exists(moto_endpoint, dynamodb_client, unique_name):
    kinesis = boto3.client("kinesis", endpoint_url=moto_endpoint, region_name=REGION)
    kinesis.create_stream(StreamName=unique_name, ShardCount=1)
    access = access_to(moto_endpoint, unique_name)
    with pytest.raises(StreamNotFoundError):
        ensure_tables_step(f"{unique_name},{unique_name}-missing").run(access, None)
    assert table_names(dynamodb_client, unique_name) == set()
    summary = ensure_tables_step([unique_name]).run(access, None)
    assert [(table["name"], table["created"]) for table in summary["tables"]] == [
        (unique_name, True),
        (f"{unique_name}-WorkerMetricStats", True),
        (f"{unique_name}-CoordinatorState", True),
    ]
