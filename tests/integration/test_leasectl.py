"""`leasectl` run as a real process (the installed console script) against DynamoDB on moto."""

from __future__ import annotations

import json

import pytest

from lease_core.model.lease import AgedOutRange, Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from tests.support.kcl_tables import LEADER_LOCK
from tests.support.leasectl import run_leasectl
from tests.support.stores import dynamodb_store, put_raw_item

# For the tests about the three tables of the separate layout (the default is KCL 3.5's single table).
SEPARATE_LAYOUT = {"KINESIS_LEASE_LEASE_TABLE_LAYOUT": "separate"}


def leasectl(*arguments: str, endpoint: str | None = None, **environment: str):
    return run_leasectl(*arguments, dynamodb=endpoint, **environment)


def test_init_creates_the_three_tables_and_a_second_init_finds_them(moto_endpoint, dynamodb_client, unique_name):
    first = leasectl("--app", unique_name, "init", endpoint=moto_endpoint, **SEPARATE_LAYOUT)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split("\n")[0].split() == ["created", unique_name, "(lease,", "ACTIVE)"]
    for name in (unique_name, f"{unique_name}-WorkerMetricStats", f"{unique_name}-CoordinatorState"):
        assert dynamodb_client.describe_table(TableName=name)["Table"]["TableStatus"] == "ACTIVE"
    second = leasectl("--app", unique_name, "init", endpoint=moto_endpoint, **SEPARATE_LAYOUT)
    assert second.returncode == 0 and second.stdout.count("exists") == 3


def test_status_reports_leases_per_owner_with_throughput_and_checkpoints(moto_endpoint, unique_name):
    store = dynamodb_store(moto_endpoint, unique_name)
    for n, owner, kbps in ((0, "worker-0", 30.0), (1, "worker-0", 10.0), (2, "worker-1", 40.0), (3, None, None)):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}", checkpoint=ExtendedSequenceNumber(f"{n}00")))
        lease = store.get_lease(f"shardId-{n}")
        if owner is not None:
            lease = store.assign_lease(lease, owner).lease
            store.renew_lease(lease.replace(throughput_kbps=kbps))
    result = leasectl("--app", unique_name, "status", "--json", endpoint=moto_endpoint)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(o["owner"], o["leases"], o["throughput_kbps"], o["throughput_share"]) for o in report["owners"]] == [
        ("worker-0", 2, 40.0, 0.5),
        ("worker-1", 1, 40.0, 0.5),
        ("(unassigned)", 1, 0.0, 0.0),
    ]
    assert [lease["checkpoint"] for lease in report["leases"]] == ["000", "100", "200", "300"]
    text = leasectl("--app", unique_name, "status", endpoint=moto_endpoint)
    assert "4 lease(s), 2 owner(s)" in text.stdout
    assert any(line.split()[:3] == ["worker-0", "2", "50.0%"] for line in text.stdout.splitlines())


def test_status_names_retention_losses_that_no_kept_round_report_has_named_yet(moto_endpoint, unique_name):
    store = dynamodb_store(moto_endpoint, unique_name)
    store.create_lease_if_not_exists(Lease("shardId-0"))
    lease = store.assign_lease(store.get_lease("shardId-0"), "worker-0").lease
    store.update_lease(lease.with_checkpoint(ExtendedSequenceNumber("900")), frozenset({AgedOutRange("500", "700")}))
    text = leasectl("--app", unique_name, "status", endpoint=moto_endpoint).stdout
    assert (
        "UNREPORTED LOSS: lease shardId-0: records after 500 aged out unread (first still available: 700) "
        "(the next round reports it)"
    ) in text.splitlines()
    report = json.loads(leasectl("--app", unique_name, "status", "--json", endpoint=moto_endpoint).stdout)
    assert [lease["unreported_losses"] for lease in report["leases"]] == [
        ["records after 500 aged out unread (first still available: 700)"]
    ]


def test_status_flags_a_corrupt_item_without_hiding_the_other_leases_and_exits_1(
    moto_endpoint, dynamodb_client, unique_name
):
    store = dynamodb_store(moto_endpoint, unique_name)
    store.create_lease_if_not_exists(Lease("shardId-0"))
    dynamodb_client.put_item(TableName=unique_name, Item={"leaseKey": {"S": "shardId-x"}, "leaseCounter": {"N": "1"}})
    result = leasectl("--app", unique_name, "status", endpoint=moto_endpoint)
    # Exit 1: the shard of an unreadable item is not read until it is repaired (leasectl repair).
    assert result.returncode == 1
    assert "1 lease(s)" in result.stdout
    problem = "lease item 'shardId-x' is not a valid KCL lease: attribute 'checkpoint' is missing"
    assert f"WARNING: {problem}" in result.stdout
    assert problem in result.stderr and "leasectl repair" in result.stderr


def test_endpoints_come_from_the_generic_variable_or_from_configuration(moto_endpoint, unique_name, tmp_path):
    generic = leasectl("--app", unique_name, "init", AWS_ENDPOINT_URL=moto_endpoint)
    assert generic.returncode == 0, generic.stderr
    config = tmp_path / "consumer.toml"
    config.write_text(f'application_name = "{unique_name}"\naws_endpoint_url_dynamodb = "{moto_endpoint}"\n')
    configured = leasectl("--config", str(config), "status")
    assert configured.returncode == 0, configured.stderr


def test_teardown_needs_yes_and_then_deletes_every_table(moto_endpoint, dynamodb_client, unique_name):
    leasectl("--app", unique_name, "init", endpoint=moto_endpoint, **SEPARATE_LAYOUT)
    refused = leasectl("--app", unique_name, "teardown", endpoint=moto_endpoint)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    done = leasectl("--app", unique_name, "teardown", "--yes", endpoint=moto_endpoint)
    assert done.returncode == 0 and done.stdout.count("deleted") == 3
    for name in (unique_name, f"{unique_name}-WorkerMetricStats", f"{unique_name}-CoordinatorState"):
        with pytest.raises(dynamodb_client.exceptions.ResourceNotFoundException):
            dynamodb_client.describe_table(TableName=name)


def test_status_of_a_missing_table_fails_naming_the_table(moto_endpoint, unique_name):
    result = leasectl("--app", unique_name, "status", endpoint=moto_endpoint)
    assert result.returncode == 1
    assert f"DynamoDB table '{unique_name}' does not exist" in result.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param(("--app", "demo-app"), "required", id="no-command"),
        pytest.param(("--app", "demo-app", "frobnicate"), "invalid choice", id="unknown-command"),
        pytest.param(("status",), "'application_name': is required", id="no-application"),
        pytest.param(("--app", "x", "status"), "'application_name'", id="application-name-too-short"),
        pytest.param(
            ("--app", "demo-app", "--set", "failover_time_millis=soon", "status"),
            "'failover_time_millis'",
            id="bad-value",
        ),
        pytest.param(
            ("--app", "demo-app", "--set", "failover_time_milis=5", "status"),
            "did you mean 'failover_time_millis'",
            id="misspelt-key",
        ),
        pytest.param(
            ("--app", "demo-app", "--set", "dampening_percentage", "status"), "key=value", id="override-without-value"
        ),
        pytest.param(
            ("--app", "demo-app", "--config", "/nonexistent.toml", "status"), "'config_file'", id="missing-config-file"
        ),
    ],
)
def test_usage_and_configuration_errors_exit_2_naming_the_problem(arguments, message):
    result = leasectl(*arguments)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("leasectl: ") and "leasectl: leasectl" not in result.stderr


def test_a_subcommand_usage_error_names_the_program_once_and_the_subcommand():
    result = leasectl("--app", "demo-app", "reset")
    assert result.returncode == 2
    assert result.stderr.startswith("leasectl: reset: the following arguments are required: --shard, --to")


def test_a_config_file_that_is_not_utf8_exits_2_naming_the_file(tmp_path):
    config = tmp_path / "consumer.toml"
    config.write_bytes('application_name = "café"\n'.encode("latin-1"))
    result = leasectl("--config", str(config), "status")
    assert result.returncode == 2
    assert str(config) in result.stderr and "not UTF-8" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_setting_variable_exits_2_suggesting_the_closest_one():
    result = leasectl("--app", "demo-app", "status", KINESIS_LEASE_failover_time_milis="5")
    assert result.returncode == 2
    assert "did you mean 'KINESIS_LEASE_FAILOVER_TIME_MILLIS'?" in result.stderr


def test_status_of_tables_holding_both_layouts_shows_the_conflict_and_the_leases_and_exits_1(
    moto_endpoint, unique_name
):
    store = dynamodb_store(moto_endpoint, unique_name, layout="separate")
    store.create_lease_if_not_exists(Lease("shardId-0"))
    put_raw_item(store, LEADER_LOCK)  # a KCL 3.5 leader's lock in the lease table
    result = leasectl("--app", unique_name, "status", "--json", endpoint=moto_endpoint)
    assert result.returncode == 1 and "rounds refuse to run" in result.stderr
    report = json.loads(result.stdout)
    layout = report["table_layout"]
    assert (layout["layout"], layout["lease_table"]) == ("conflict", unique_name)
    assert layout["separate_tables"] == [f"{unique_name}-WorkerMetricStats", f"{unique_name}-CoordinatorState"]
    assert [lease["lease_key"] for lease in report["leases"]] == ["shardId-0"]
    text = leasectl("--app", unique_name, "status", endpoint=moto_endpoint)
    assert text.returncode == 1 and f"Table layout: conflict (lease table {unique_name!r}" in text.stdout
