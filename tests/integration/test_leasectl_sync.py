"""`leasectl sync` end to end: real lineages resharded on kinesis-mock, leases in DynamoDB on moto.

The seed lineage (0+1 -> 6, 2+3 -> 7, 6+7 -> 8, 5 -> 9 and 10) is built with real merges and splits;
KCL's choices with leases 4, 5 and 7 present are LATEST -> 6, TRIM_HORIZON -> 0 and 1,
AT_TIMESTAMP -> 0 and 1.
"""

from __future__ import annotations

import json

import pytest

from devtools.kinesis_streams import create_stream, kinesis_client, split_shard
from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from tests.support.leasectl import run_leasectl
from tests.support.seed_lineage import build_seed_lineage
from tests.support.stores import dynamodb_store, raw_item


def leasectl(*arguments: str, moto: str, kinesis: str):
    return run_leasectl(*arguments, dynamodb=moto, kinesis=kinesis)


def sync_json(app: str, *arguments: str, moto: str, kinesis: str) -> dict:
    result = leasectl("--app", app, "sync", *arguments, "--json", moto=moto, kinesis=kinesis)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def seed(kinesis_endpoint, unique_name) -> dict[int, str]:
    return build_seed_lineage(kinesis_client(kinesis_endpoint), unique_name)


@pytest.mark.parametrize(
    ("position", "extra", "expected_seed_names", "checkpoint"),
    [
        pytest.param("LATEST", (), [6], "LATEST", id="latest-creates-6"),
        pytest.param("TRIM_HORIZON", (), [0, 1], "TRIM_HORIZON", id="trim-horizon-creates-0-and-1"),
        pytest.param(
            "AT_TIMESTAMP",
            ("--timestamp", "2026-01-01T00:00:00Z"),
            [0, 1],
            "AT_TIMESTAMP",
            id="at-timestamp-creates-0-and-1",
        ),
    ],
)
def test_sync_reproduces_kcl_choices_on_the_real_seed_lineage(
    moto_endpoint, kinesis_endpoint, unique_name, seed, position, extra, expected_seed_names, checkpoint
):
    store = dynamodb_store(moto_endpoint, unique_name)
    for name in (4, 5, 7):
        store.create_lease_if_not_exists(Lease(seed[name], checkpoint=ExtendedSequenceNumber("1")))
    report = sync_json(
        unique_name,
        "--stream",
        unique_name,
        "--initial-position",
        position,
        *extra,
        moto=moto_endpoint,
        kinesis=kinesis_endpoint,
    )
    assert report["created"] == [seed[name] for name in expected_seed_names]
    for name in expected_seed_names:
        lease = store.get_lease(seed[name])
        assert lease.checkpoint.sequence_number == checkpoint
        assert lease.lease_owner is None and lease.lease_counter == 0
    assert (
        sync_json(
            unique_name,
            "--stream",
            unique_name,
            "--initial-position",
            position,
            *extra,
            moto=moto_endpoint,
            kinesis=kinesis_endpoint,
        )["created"]
        == []
    ), "a second sync creates nothing"


def test_an_empty_table_at_latest_gets_the_open_shards_with_their_parents_recorded(
    moto_endpoint, kinesis_endpoint, unique_name, seed
):
    store = dynamodb_store(moto_endpoint, unique_name)
    report = sync_json(
        unique_name,
        "--stream",
        unique_name,
        "--initial-position",
        "LATEST",
        moto=moto_endpoint,
        kinesis=kinesis_endpoint,
    )
    assert sorted(report["created"]) == sorted(seed[name] for name in (4, 8, 9, 10))
    assert report["streams"][0]["table_was_empty"] is True
    assert store.get_lease(seed[8]).parent_shard_ids == {seed[6], seed[7]}
    assert store.get_lease(seed[9]).hash_key_range is not None


def test_a_finished_parent_is_cleaned_up_once_its_children_have_started(moto_endpoint, kinesis_endpoint, unique_name):
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, unique_name, 1)
    store = dynamodb_store(moto_endpoint, unique_name)
    sync_json(
        unique_name,
        "--stream",
        unique_name,
        "--initial-position",
        "TRIM_HORIZON",
        moto=moto_endpoint,
        kinesis=kinesis_endpoint,
    )
    low, high = split_shard(client, unique_name, "shardId-000000000000")
    parent = store.get_lease("shardId-000000000000")
    store.update_lease(parent.with_checkpoint(ExtendedSequenceNumber("SHARD_END")).with_child_shard_ids({low, high}))
    for child in (low, high):
        store.create_lease_if_not_exists(
            Lease(child, checkpoint=ExtendedSequenceNumber("5"), parent_shard_ids={"shardId-000000000000"})
        )
    report = sync_json(unique_name, "--stream", unique_name, moto=moto_endpoint, kinesis=kinesis_endpoint)
    assert report["deleted"] == ["shardId-000000000000"] and report["possibly_unread"] == []
    assert store.get_lease("shardId-000000000000") is None


def test_a_sync_against_another_stream_fails_naming_both_and_leaves_every_lease_untouched(
    moto_endpoint, kinesis_endpoint, unique_name
):
    client = kinesis_client(kinesis_endpoint)
    orders, payments = f"{unique_name[:40]}-orders", f"{unique_name[:40]}-payments"
    create_stream(client, orders, 2)
    create_stream(client, payments, 1)
    store = dynamodb_store(moto_endpoint, unique_name)
    sync_json(unique_name, "--stream", orders, moto=moto_endpoint, kinesis=kinesis_endpoint)
    before = {key: raw_item(store, key) for key in ("shardId-000000000000", "shardId-000000000001")}

    result = leasectl("--app", unique_name, "sync", "--stream", payments, moto=moto_endpoint, kinesis=kinesis_endpoint)

    assert result.returncode == 1, result.stderr
    assert f"'{orders}'" in result.stderr and f"'{payments}'" in result.stderr and "Traceback" not in result.stderr
    assert {key: raw_item(store, key) for key in before} == before
    assert sorted(lease.lease_key for lease in store.list_leases()) == sorted(before)


def test_several_streams_select_multi_stream_keys(moto_endpoint, kinesis_endpoint, unique_name):
    client = kinesis_client(kinesis_endpoint)
    first, second = f"{unique_name[:40]}-a", f"{unique_name[:40]}-b"
    create_stream(client, first, 2)
    create_stream(client, second, 1)
    dynamodb_store(moto_endpoint, unique_name)
    result = leasectl(
        "--app",
        unique_name,
        "sync",
        "--stream",
        first,
        "--stream",
        second,
        "--json",
        moto=moto_endpoint,
        kinesis=kinesis_endpoint,
    )
    assert result.returncode == 0, result.stderr
    created = json.loads(result.stdout)["created"]
    assert len(created) == 3
    assert all(key.split(":")[1] in {first, second} and key.split(":")[3].startswith("shardId-") for key in created)
    assert {key.split(":")[0] for key in created} == {"000000000000"}, "kinesis-mock's default account"


@pytest.mark.parametrize(
    ("arguments", "status", "message"),
    [
        pytest.param(
            ("--stream", "no-such-stream"), 1, "Kinesis stream 'no-such-stream' does not exist", id="unknown-stream"
        ),
        pytest.param(
            ("--stream", "s", "--initial-position", "AT_TIMESTAMP", "--timestamp", "last tuesday"),
            2,
            "'initial_position_timestamp'",
            id="bad-timestamp",
        ),
        pytest.param(
            ("--stream", "s", "--initial-position", "AT_TIMESTAMP"),
            2,
            "AT_TIMESTAMP needs initial_position_timestamp",
            id="timestamp-missing",
        ),
        pytest.param(("--initial-position", "LATEST"), 2, "--stream", id="no-stream"),
    ],
)
def test_bad_sync_input_is_refused_naming_the_problem(
    moto_endpoint, kinesis_endpoint, unique_name, arguments, status, message
):
    dynamodb_store(moto_endpoint, unique_name)
    result = leasectl("--app", unique_name, "sync", *arguments, moto=moto_endpoint, kinesis=kinesis_endpoint)
    assert result.returncode == status
    assert message in result.stderr and "Traceback" not in result.stderr
