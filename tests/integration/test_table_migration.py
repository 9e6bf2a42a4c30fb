"""KCL 3.5's table migration of a three-table application, round by round, on moto (docs/protocol.md §1.8).

Each round's end is what the DAG's release step does: a fresh process (a new `LeaseApplication`, which
reads the layout from the tables), the lock taken, one step of the migration, the lock released. The
migration's clock is given, so a bake of an hour or a day is a number, not a wait.
"""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest
from kinesis_lease.aws_connection import AwsAccess
from kinesis_lease.operators import ReleaseLeadershipOperator

from lease_core.application import LeaseApplication
from lease_core.errors import LayoutConflictError, LeadershipLostError, TableMigrationChangedError
from lease_core.leader.leader_lock import wall_clock_millis
from lease_core.metrics.worker_metrics import publish_worker_metrics
from lease_core.model.lease import Lease
from lease_core.store.coordinator_state import update_record
from lease_core.store.table_layout import SEPARATE, SINGLE
from lease_core.store.table_migration import COMPLETE, DEPLOYED, INIT, PENDING
from tests.support.leasectl import run_leasectl
from tests.support.stores import fast_config, table_names

HOUR_MILLIS = 3_600_000
WORKERS = ("app-worker-0", "app-worker-1")
# More than one transaction's 25 records, so that a move can be cut between two of them: the shard-sync
# auditor's records of thirty streams.
RECORDS = tuple(f"ShardSyncAuditor:stream-{n:02}" for n in range(30))


@pytest.fixture
def client(moto_endpoint):
    return boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def start() -> int:
    return wall_clock_millis()


def application(moto_endpoint: str, name: str, *, migrate_all: bool = False) -> LeaseApplication:
    """A process of the application, as each round step starts one: the layout is read from the tables."""
    config = fast_config(
        name,
        lease_table_layout="separate",
        aws_endpoint_url_dynamodb=moto_endpoint,
        migrate_all_entities_to_lease_table=migrate_all,
        table_migration_complete_bake_time_seconds=3600,
        leader_lease_duration_millis=300,
        leader_heartbeat_period_millis=90,
    )
    return LeaseApplication(config)


def end_of_round(app: LeaseApplication, owner: str, now_millis: int) -> dict[str, Any]:
    lock = app.leader_lock(owner)
    assert lock.try_acquire()
    migration = app.table_migration(owner, clock_millis=lambda: now_millis)
    assert migration is not None
    summary = migration.advance()
    assert lock.release()
    return summary


def slots_write_metrics(app: LeaseApplication, round_number: int) -> None:
    """What a round's slots write at the end of their tasks, and the round its assignment recorded."""
    update_record(app.state_store, "AssignmentRound", lambda record: {**(record or {}), "round": round_number})
    for worker in WORKERS:
        publish_worker_metrics(app.worker_metrics, worker, 40.0, now=int(time.time()), round=round_number)


def items(client, table_name: str, key: str) -> dict[str, dict]:
    return {item[key]["S"]: item for item in client.scan(TableName=table_name, ConsistentRead=True)["Items"]}


@pytest.fixture
def three_tables(moto_endpoint, unique_name) -> str:
    """A `separate` application after its first round: two leases, the slots' metrics, the round's
    records and thirty more coordinator-state records."""
    app = application(moto_endpoint, unique_name)
    app.tables.ensure_tables()
    for n, worker in enumerate(WORKERS):
        app.lease_store.create_lease_if_not_exists(Lease(f"shardId-00000000000{n}", lease_owner=worker))
    slots_write_metrics(app, 1)
    for key in RECORDS:
        app.state_store.put(key, {"value": key})
    return unique_name


def deployed_and_phase_two_slots(moto_endpoint: str, name: str, start: int) -> None:
    """Phase 1 run to DEPLOYED, then a round with `migrate_all_entities_to_lease_table` whose slots wrote
    their metrics to the lease table."""
    phase_one = application(moto_endpoint, name, migrate_all=True)
    assert end_of_round(phase_one, "round-1", start)["status_after"] == INIT
    phase_one = application(moto_endpoint, name, migrate_all=True)
    assert end_of_round(phase_one, "round-2", start + HOUR_MILLIS)["status_after"] == DEPLOYED
    slots_write_metrics(application(moto_endpoint, name, migrate_all=True), 2)


def test_a_three_table_application_migrates_to_its_lease_table_in_kcl_s_four_steps(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    unasked = end_of_round(application(moto_endpoint, name), "round-0", start)
    assert (unasked["status"], unasked["action"], unasked["status_after"]) == (None, "none", None)
    first = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-1", start)
    assert (first["status"], first["action"], first["status_after"]) == (None, "write", INIT)
    baking = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-2", start + HOUR_MILLIS - 60_000)
    assert (baking["action"], baking["status_after"]) == ("none", INIT)
    deployed = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-3", start + HOUR_MILLIS)
    assert deployed["status_after"] == DEPLOYED
    turned_off = end_of_round(application(moto_endpoint, name), "round-4", start + 2 * HOUR_MILLIS)
    assert (turned_off["action"], turned_off["status_after"]) == ("none", DEPLOYED)

    # Phase 2: this round's slots still wrote to the separate table, so the leader waits for the next.
    waiting = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-5", start + 2 * HOUR_MILLIS)
    assert (waiting["action"], waiting["status_after"]) == ("none", DEPLOYED)
    assert "app-worker-0, app-worker-1 still write metrics to the separate table" in waiting["why"]
    slots_write_metrics(application(moto_endpoint, name, migrate_all=True), 2)
    lease_items = items(client, name, "leaseKey")
    assert {lease_items[worker]["entityType"]["S"] for worker in WORKERS} == {"WORKER_METRIC_STATS"}
    assert {lease_items[worker]["round"]["N"] for worker in WORKERS} == {"2"}

    moved = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-6", start + 2 * HOUR_MILLIS)
    assert (moved["action"], moved["done"], moved["status_after"]) == ("move_then_pending", True, PENDING)
    assert set(items(client, f"{name}-CoordinatorState", "key")) == {"TableMigration3.5"}
    lease_items = items(client, name, "leaseKey")
    for key in (*RECORDS, "AssignmentRound"):
        assert lease_items[key]["entityType"] == {"S": "LEADER"}
    assert lease_items[RECORDS[7]]["value"] == {"S": RECORDS[7]}

    pending = application(moto_endpoint, name, migrate_all=True)
    assert (pending.table_layout.layout, pending.table_layout.table_migration) == (SEPARATE, PENDING)
    assert pending.current_round() == 2
    assert pending.state_store.get(RECORDS[7])["value"] == RECORDS[7]
    pending_at = int(items(client, f"{name}-CoordinatorState", "key")["TableMigration3.5"]["mts"]["N"])
    baked = end_of_round(pending, "round-7", pending_at + HOUR_MILLIS - 1000)
    assert (baked["action"], baked["status_after"]) == ("none", PENDING)
    done = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-8", pending_at + HOUR_MILLIS)
    assert (done["action"], done["done"], done["status_after"]) == ("complete", True, COMPLETE)

    for table_name, key in ((name, "leaseKey"), (f"{name}-CoordinatorState", "key")):
        record = items(client, table_name, key)["TableMigration3.5"]
        assert record["tm"] == {"S": COMPLETE}
        assert [entry["M"]["tm"]["S"] for entry in record["h"]["L"]] == [PENDING, DEPLOYED, INIT]
    assert items(client, name, "leaseKey")["TableMigration3.5"]["entityType"] == {"S": "TABLE_MIGRATION"}

    single = application(moto_endpoint, name)
    assert single.table_layout.layout == SINGLE
    assert single.current_round() == 2
    assert single.worker_metrics.get("app-worker-1").round == 2
    lock = single.leader_lock("round-9")
    assert lock.try_acquire()
    assert items(client, name, "leaseKey")["Leader"]["ownerName"] == {"S": "round-9"}
    assert "Leader" not in items(client, f"{name}-CoordinatorState", "key")
    assert lock.release()
    assert sorted(lease.lease_key for lease in single.lease_store.list_leases()) == [
        "shardId-000000000000",
        "shardId-000000000001",
    ]


def kill_after_transactions(client: Any, transactions: int) -> None:
    """Kill the process (as far as this client can tell) at its transaction after the first `transactions`."""
    went_through = 0

    def before_transaction(**_: Any) -> None:
        nonlocal went_through
        if went_through == transactions:
            raise KeyboardInterrupt("killed")  # nothing of the process runs after this
        went_through += 1

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", before_transaction)


def test_a_round_killed_midway_through_the_move_leaves_every_record_readable_and_the_next_round_finishes_it(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    dying = application(moto_endpoint, name, migrate_all=True)
    assert dying.leader_lock("round-3").try_acquire()
    migration = dying.table_migration("round-3", clock_millis=lambda: start + 2 * HOUR_MILLIS)
    kill_after_transactions(dying.client("dynamodb"), transactions=1)
    with pytest.raises(KeyboardInterrupt):
        migration.advance()

    in_lease_table = {key for key in items(client, name, "leaseKey") if key in (*RECORDS, "AssignmentRound")}
    left = set(items(client, f"{name}-CoordinatorState", "key")) - {"Leader", "TableMigration3.5"}
    assert (len(in_lease_table), len(left)) == (25, 6)
    assert not in_lease_table & left, "a record is in one table, never both"
    reader = application(moto_endpoint, name, migrate_all=True)
    assert reader.table_layout.table_migration == DEPLOYED
    assert {record["key"] for record in reader.state_store.scan()} >= {*RECORDS, "AssignmentRound"}
    assert reader.current_round() == 2

    # The next round takes the dead round's lock over once it has seen it unchanged for its duration.
    successor = application(moto_endpoint, name, migrate_all=True)
    assert not successor.leader_lock("round-4").try_acquire()
    time.sleep(0.4)
    resumed = end_of_round(successor, "round-4", start + 2 * HOUR_MILLIS)
    assert (resumed["action"], resumed["done"], resumed["status_after"]) == ("move_then_pending", True, PENDING)
    lease_items = items(client, name, "leaseKey")
    assert all(lease_items[key]["value"] == {"S": key} for key in RECORDS)
    assert set(items(client, f"{name}-CoordinatorState", "key")) == {"TableMigration3.5"}


def test_turning_phase_two_off_before_complete_rolls_the_migration_back_to_deployed(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    moved = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-3", start + 2 * HOUR_MILLIS)
    assert moved["status_after"] == PENDING
    rolled_back = application(moto_endpoint, name)
    slots_write_metrics(rolled_back, 3)  # the slots of a release without phase 2 write the separate table
    assert items(client, f"{name}-WorkerMetricStats", "wid")["app-worker-0"]["round"] == {"N": "3"}
    back = end_of_round(rolled_back, "round-4", start + 5 * HOUR_MILLIS)
    assert (back["action"], back["status_after"]) == ("write", DEPLOYED)
    assert application(moto_endpoint, name).current_round() == 3
    # Phase 2 again: the leader waits for a round whose slots write to the lease table.
    waiting = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-5", start + 5 * HOUR_MILLIS)
    assert (waiting["action"], waiting["status_after"]) == ("none", DEPLOYED)


def test_the_move_is_refused_to_a_leader_whose_lock_was_taken_over(moto_endpoint, client, three_tables, start):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    app = application(moto_endpoint, name, migrate_all=True)
    assert app.leader_lock("round-4").try_acquire()
    zombie = app.table_migration("round-3", clock_millis=lambda: start + 2 * HOUR_MILLIS)
    with pytest.raises(LeadershipLostError):
        zombie.advance()
    assert {*RECORDS, "AssignmentRound"} <= set(items(client, f"{name}-CoordinatorState", "key"))
    assert not set(RECORDS) & set(items(client, name, "leaseKey"))


def test_status_shows_a_migration_under_way_and_teardown_of_a_migrated_application_removes_all_three_tables(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    end_of_round(application(moto_endpoint, name, migrate_all=True), "round-3", start + 2 * HOUR_MILLIS)
    status = run_leasectl("--app", name, "status", dynamodb=moto_endpoint)
    assert status.returncode == 0, status.stderr
    assert "table migration: TABLE_MIGRATION_STATUS_PENDING" in status.stdout
    assert "Table layout: separate" in status.stdout
    pending_at = int(items(client, f"{name}-CoordinatorState", "key")["TableMigration3.5"]["mts"]["N"])
    end_of_round(application(moto_endpoint, name, migrate_all=True), "round-4", pending_at + HOUR_MILLIS)

    # A round holds the lock in the lease table now: teardown must wait for it there.
    holder = application(moto_endpoint, name).leader_lock("round-5")
    assert holder.try_acquire()
    refused = run_leasectl("--app", name, "teardown", "--yes", dynamodb=moto_endpoint)
    assert refused.returncode != 0
    assert "round-5" in refused.stderr
    assert holder.release()
    torn_down = run_leasectl("--app", name, "teardown", "--yes", dynamodb=moto_endpoint)
    assert torn_down.returncode == 0, torn_down.stderr
    assert not {name, f"{name}-WorkerMetricStats", f"{name}-CoordinatorState"} & set(table_names(client))


def test_a_slot_of_a_release_that_predates_the_support_code_holds_phase_one_back(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    assert end_of_round(application(moto_endpoint, name, migrate_all=True), "round-1", start)["status_after"] == INIT
    app = application(moto_endpoint, name, migrate_all=True)
    update_record(app.state_store, "AssignmentRound", lambda record: {**(record or {}), "round": 2})
    # The older release's slot updates its own attributes and leaves `sup` and `slu` as they were.
    client.update_item(
        TableName=f"{name}-WorkerMetricStats",
        Key={"wid": {"S": "app-worker-1"}},
        UpdateExpression="SET lut = :lut, #round = :round",
        ExpressionAttributeNames={"#round": "round"},
        ExpressionAttributeValues={":lut": {"N": str(int(time.time()) + 5)}, ":round": {"N": "2"}},
    )
    restarted = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-2", start + HOUR_MILLIS)
    assert (restarted["action"], restarted["done"], restarted["status_after"]) == ("delete", True, None)
    assert "TableMigration3.5" not in items(client, f"{name}-CoordinatorState", "key")


def test_a_record_recreated_in_the_separate_table_after_a_move_is_moved_over_its_older_copy(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    moved = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-3", start + 2 * HOUR_MILLIS)
    assert moved["status_after"] == PENDING
    # A writer that read the record before the move puts it back where it read it, newer than the copy moved.
    client.put_item(
        TableName=f"{name}-CoordinatorState",
        Item={"key": {"S": RECORDS[3]}, "value": {"S": "rewritten"}},
    )
    reader = application(moto_endpoint, name, migrate_all=True)
    assert reader.state_store.get(RECORDS[3])["value"] == "rewritten", "the separate table's copy is read first"
    back = end_of_round(reader, "round-4", start + 3 * HOUR_MILLIS)
    assert (back["action"], back["status_after"]) == ("write", DEPLOYED)
    moved = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-5", start + 3 * HOUR_MILLIS)
    assert (moved["action"], moved["done"], moved["status_after"]) == ("move_then_pending", True, PENDING)
    assert items(client, name, "leaseKey")[RECORDS[3]]["value"] == {"S": "rewritten"}
    assert set(items(client, f"{name}-CoordinatorState", "key")) == {"TableMigration3.5"}


def test_turning_phase_two_off_after_a_cut_move_keeps_every_record_read_and_turning_it_on_finishes_the_move(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    dying = application(moto_endpoint, name, migrate_all=True)
    lock = dying.leader_lock("round-3")
    assert lock.try_acquire()
    migration = dying.table_migration("round-3", clock_millis=lambda: start + 2 * HOUR_MILLIS)
    kill_after_transactions(dying.client("dynamodb"), transactions=1)
    with pytest.raises(KeyboardInterrupt):
        migration.advance()
    assert lock.release()

    switched_off = application(moto_endpoint, name)
    assert {record["key"] for record in switched_off.state_store.scan()} >= {*RECORDS, "AssignmentRound"}
    assert switched_off.current_round() == 2
    slots_write_metrics(switched_off, 3)
    assert switched_off.current_round() == 3
    assert "AssignmentRound" not in items(client, f"{name}-CoordinatorState", "key"), "written where it was moved"
    idle = end_of_round(application(moto_endpoint, name), "round-4", start + 3 * HOUR_MILLIS)
    assert (idle["action"], idle["status_after"]) == ("none", DEPLOYED)

    switched_on = application(moto_endpoint, name, migrate_all=True)
    slots_write_metrics(switched_on, 4)
    finished = end_of_round(switched_on, "round-5", start + 4 * HOUR_MILLIS)
    assert (finished["action"], finished["done"], finished["status_after"]) == ("move_then_pending", True, PENDING)
    assert set(items(client, f"{name}-CoordinatorState", "key")) == {"TableMigration3.5"}
    assert application(moto_endpoint, name, migrate_all=True).current_round() == 4


def test_a_record_a_writer_changes_during_the_move_keeps_the_change_and_is_moved_by_the_next_round(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    app = application(moto_endpoint, name, migrate_all=True)
    changed = RECORDS[4]

    def writer_before_the_first_transaction(**_: Any) -> None:
        if client.get_item(TableName=f"{name}-CoordinatorState", Key={"key": {"S": changed}}).get("Item"):
            client.put_item(
                TableName=f"{name}-CoordinatorState", Item={"key": {"S": changed}, "value": {"S": "changed"}}
            )

    app.client("dynamodb").meta.events.register(
        "before-call.dynamodb.TransactWriteItems", writer_before_the_first_transaction
    )
    cut = end_of_round(app, "round-3", start + 2 * HOUR_MILLIS)
    assert (cut["action"], cut["done"], cut["status_after"], cut["not_moved"]) == (
        "move_then_pending",
        False,
        DEPLOYED,
        [changed],
    )
    separate = items(client, f"{name}-CoordinatorState", "key")
    assert set(separate) == {"TableMigration3.5", changed}
    assert separate[changed]["value"] == {"S": "changed"}, "the writer's change is not lost"

    slots_write_metrics(application(moto_endpoint, name, migrate_all=True), 3)
    moved = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-4", start + 3 * HOUR_MILLIS)
    assert (moved["done"], moved["status_after"]) == (True, PENDING)
    assert items(client, name, "leaseKey")[changed]["value"] == {"S": "changed"}


def test_a_process_that_read_the_layout_before_complete_cannot_lead_from_the_separate_table(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    end_of_round(application(moto_endpoint, name, migrate_all=True), "round-3", start + 2 * HOUR_MILLIS)
    stale = application(moto_endpoint, name, migrate_all=True)
    assert stale.table_layout.layout == SEPARATE
    pending_at = int(items(client, f"{name}-CoordinatorState", "key")["TableMigration3.5"]["mts"]["N"])
    done = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-4", pending_at + HOUR_MILLIS)
    assert done["status_after"] == COMPLETE

    with pytest.raises(
        TableMigrationChangedError, match="went from TABLE_MIGRATION_STATUS_PENDING to TABLE_MIGRATION_STATUS_COMPLETE"
    ):
        stale.leader_lock("stale-leasectl").try_acquire()
    assert "Leader" not in items(client, f"{name}-CoordinatorState", "key"), "the lock it took is released"
    leader = application(moto_endpoint, name).leader_lock("round-5")
    assert leader.try_acquire()
    assert leader.release()


def release_step(moto_endpoint: str, name: str, owner: str, *, migrate_all: bool) -> dict[str, Any]:
    """The DAG's release step of the round whose lock `owner` holds, as Airflow runs it."""
    config = application(moto_endpoint, name, migrate_all=migrate_all).config
    access = AwsAccess(boto3.Session(aws_access_key_id="t", aws_secret_access_key="t", region_name="us-east-1"), config)
    step = ReleaseLeadershipOperator(task_id="release_leadership", settings={}, leader_owner=owner)
    return step.run(access, None)


def test_the_release_step_takes_the_migration_s_step_and_then_releases_the_lock(moto_endpoint, client, three_tables):
    name = three_tables
    assert application(moto_endpoint, name).leader_lock("dag/run-1/token").try_acquire()
    summary = release_step(moto_endpoint, name, "dag/run-1/token", migrate_all=True)
    assert summary["table_migration"]["status_after"] == INIT
    assert summary["released"] is True
    assert "Leader" not in items(client, f"{name}-CoordinatorState", "key")


def test_a_release_step_whose_migration_step_fails_still_releases_the_lock(moto_endpoint, client, three_tables):
    name = three_tables
    client.put_item(
        TableName=f"{name}-CoordinatorState",
        Item={"key": {"S": "TableMigration3.5"}, "tm": {"S": "TABLE_MIGRATION_STATUS_BAKING"}},
    )
    assert application(moto_endpoint, name).leader_lock("dag/run-2/token").try_acquire()
    summary = release_step(moto_endpoint, name, "dag/run-2/token", migrate_all=True)
    assert "TABLE_MIGRATION_STATUS_BAKING" in summary["table_migration"]["error"]
    assert summary["released"] is True
    assert "Leader" not in items(client, f"{name}-CoordinatorState", "key")


def test_a_record_kcl_s_move_left_untagged_in_the_lease_table_is_moved_over(moto_endpoint, client, three_tables, start):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    client.put_item(TableName=name, Item={"leaseKey": {"S": RECORDS[5]}, "value": {"S": "moved by KCL, untagged"}})
    moved = end_of_round(application(moto_endpoint, name, migrate_all=True), "round-3", start + 2 * HOUR_MILLIS)
    assert (moved["done"], moved["status_after"]) == (True, PENDING)
    assert items(client, name, "leaseKey")[RECORDS[5]]["value"] == {"S": RECORDS[5]}


def test_a_record_without_a_version_that_a_step_updates_during_the_move_keeps_the_update(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    deployed_and_phase_two_slots(moto_endpoint, name, start)
    app = application(moto_endpoint, name, migrate_all=True)
    updated = RECORDS[6]  # written by `put` (an earlier release, KCL), without a version
    writer = application(moto_endpoint, name, migrate_all=True)
    writes = []

    def step_updating_before_the_first_transaction(**_: Any) -> None:
        if not writes:
            writes.append(update_record(writer.state_store, updated, lambda record: {**(record or {}), "extra": 1}))

    app.client("dynamodb").meta.events.register(
        "before-call.dynamodb.TransactWriteItems", step_updating_before_the_first_transaction
    )
    cut = end_of_round(app, "round-3", start + 2 * HOUR_MILLIS)
    assert cut["not_moved"] == [updated]
    assert items(client, f"{name}-CoordinatorState", "key")[updated]["extra"] == {"N": "1"}


def test_tables_of_both_layouts_are_refused_though_the_separate_table_records_a_migration_in_init(
    moto_endpoint, client, three_tables, start
):
    name = three_tables
    assert end_of_round(application(moto_endpoint, name, migrate_all=True), "round-1", start)["status_after"] == INIT
    client.put_item(TableName=name, Item={"leaseKey": {"S": "AssignmentRound"}, "entityType": {"S": "LEADER"}})
    with pytest.raises(LayoutConflictError):
        _ = application(moto_endpoint, name).table_layout


def test_a_process_that_read_init_cannot_lead_once_the_records_were_moved(moto_endpoint, client, three_tables, start):
    name = three_tables
    assert end_of_round(application(moto_endpoint, name, migrate_all=True), "round-1", start)["status_after"] == INIT
    stale = application(moto_endpoint, name, migrate_all=True)
    assert stale.table_layout.table_migration == INIT
    assert (
        end_of_round(application(moto_endpoint, name, migrate_all=True), "round-2", start + HOUR_MILLIS)["status_after"]
        == DEPLOYED
    )
    with pytest.raises(TableMigrationChangedError, match="went from TABLE_MIGRATION_STATUS_INIT"):
        stale.leader_lock("stale").try_acquire()
