"""A corrupt lease item never stalls its shard silently: `leasectl status`, `sync` and `assign` do
their work and exit 1 naming the item and its attribute, and `leasectl repair` (a process, against
moto and kinesis-mock) makes it a lease again that the next sync and assignment treat as any other."""

from __future__ import annotations

import json

import boto3
import pytest

from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.model.sequence import TRIM_HORIZON
from tests.support.leasectl import run_leasectl
from tests.support.stores import dynamodb_store

CORRUPT_KEY = "shardId-000000000001"


@pytest.fixture()
def corrupted(moto_endpoint, kinesis_endpoint, unique_name):
    """A synced application on a 3-shard stream whose lease of shard 1 has a checkpoint of the wrong type."""
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 3)
    assert leasectl(unique_name, moto_endpoint, kinesis_endpoint, "init").returncode == 0
    sync = leasectl(
        unique_name,
        moto_endpoint,
        kinesis_endpoint,
        "--set",
        "initial_position_in_stream=TRIM_HORIZON",
        "sync",
        "--stream",
        unique_name,
    )
    assert sync.returncode == 0, sync.stderr
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.update_item(
        TableName=unique_name,
        Key={"leaseKey": {"S": CORRUPT_KEY}},
        UpdateExpression="SET checkpoint = :n",
        ExpressionAttributeValues={":n": {"N": "7"}},
    )
    return unique_name


def leasectl(app: str, moto: str, kinesis: str, *arguments: str):
    return run_leasectl("--app", app, *arguments, dynamodb=moto, kinesis=kinesis)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(("status",), id="status"),
        pytest.param(("sync", "--stream", "{stream}"), id="sync"),
        pytest.param(("assign", "--workers", "2"), id="assign"),
    ],
)
def test_a_command_that_meets_a_corrupt_item_exits_1_naming_it_and_its_attribute(
    moto_endpoint, kinesis_endpoint, corrupted, command
):
    arguments = [part.format(stream=corrupted) for part in command]
    result = leasectl(corrupted, moto_endpoint, kinesis_endpoint, *arguments)
    assert result.returncode == 1, result.stderr
    assert CORRUPT_KEY in result.stderr and "'checkpoint'" in result.stderr and "leasectl repair" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_assignment_still_places_the_readable_leases(moto_endpoint, kinesis_endpoint, corrupted):
    leasectl(corrupted, moto_endpoint, kinesis_endpoint, "assign", "--workers", "2")
    owners = {lease.lease_key: lease.lease_owner for lease in dynamodb_store(moto_endpoint, corrupted).list_leases()}
    assert set(owners) == {"shardId-000000000000", "shardId-000000000002"}
    assert None not in owners.values()


def test_repair_without_a_position_is_refused_when_the_checkpoint_is_what_does_not_read(
    moto_endpoint, kinesis_endpoint, corrupted
):
    result = leasectl(corrupted, moto_endpoint, kinesis_endpoint, "repair", "--lease", CORRUPT_KEY, "--yes")
    assert result.returncode == 1 and "give the position its shard resumes at (--to)" in result.stderr, result.stderr


def test_repair_writes_the_item_anew_and_every_command_is_clean_again(moto_endpoint, kinesis_endpoint, corrupted):
    unconfirmed = leasectl(
        corrupted, moto_endpoint, kinesis_endpoint, "repair", "--lease", CORRUPT_KEY, "--to", "TRIM_HORIZON"
    )
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    result = leasectl(
        corrupted,
        moto_endpoint,
        kinesis_endpoint,
        "repair",
        "--lease",
        CORRUPT_KEY,
        "--to",
        "TRIM_HORIZON",
        "--yes",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["lease_key"], report["checkpoint"], report["dropped_attributes"]) == (
        CORRUPT_KEY,
        "TRIM_HORIZON",
        [],
    )
    assert "'checkpoint'" in report["problem"]
    lease = dynamodb_store(moto_endpoint, corrupted).get_lease(CORRUPT_KEY, consistent=True)
    assert lease is not None and (lease.checkpoint, lease.lease_owner) == (TRIM_HORIZON, None)
    for command in (("status",), ("sync", "--stream", corrupted), ("assign", "--workers", "2")):
        assert leasectl(corrupted, moto_endpoint, kinesis_endpoint, *command).returncode == 0, command


@pytest.mark.parametrize(
    ("key", "message"),
    [
        pytest.param(
            "shardId-000000000000", "reads as a lease; move its checkpoint with `leasectl reset`", id="readable"
        ),
        pytest.param("shardId-000000000009", "has no lease item with this key", id="missing"),
    ],
)
def test_repair_refuses_a_readable_lease_and_a_missing_item_writing_nothing(
    moto_endpoint, kinesis_endpoint, corrupted, key, message
):
    before = {lease.lease_key: lease for lease in dynamodb_store(moto_endpoint, corrupted).list_leases()}
    result = leasectl(corrupted, moto_endpoint, kinesis_endpoint, "repair", "--lease", key, "--to", "LATEST", "--yes")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert {lease.lease_key: lease for lease in dynamodb_store(moto_endpoint, corrupted).list_leases()} == before
