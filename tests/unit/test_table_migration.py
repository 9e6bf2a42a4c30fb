"""KCL 3.5's table migration decided as KCL's leader decides it (docs/protocol.md §1.8), and its record."""

from __future__ import annotations

from decimal import Decimal

import pytest

from lease_core.store.table_migration import (
    COMPLETE,
    DEPLOYED,
    INIT,
    PENDING,
    MigrationFacts,
    TableMigrationState,
    decide_migration,
    local_status,
    new_state,
    newest_by_worker,
    reads_both_tables,
)

HOUR_MILLIS = 3_600_000
DAY = 86_400
T0 = 1_700_000_000_000


def recorded(status: str, at: int = T0) -> TableMigrationState:
    return TableMigrationState(status, "round-0", at)


def facts(
    state: TableMigrationState | None,
    *,
    migrate_all: bool = False,
    active: int = 2,
    support_met: bool = True,
    writers: tuple[str, ...] = (),
    keys: tuple[str, ...] = (),
    now: int = T0,
) -> MigrationFacts:
    return MigrationFacts(state, migrate_all, active, support_met, writers, keys, now, DAY)


@pytest.mark.parametrize(
    ("recorded_status", "migrate_all", "expected"),
    [
        pytest.param(None, False, INIT, id="none-phase-1"),
        pytest.param(INIT, False, INIT, id="init-phase-1"),
        pytest.param(None, True, INIT, id="none-phase-2-runs-phase-1-first"),
        pytest.param(INIT, True, INIT, id="init-phase-2-runs-phase-1-first"),
        pytest.param(DEPLOYED, False, DEPLOYED, id="deployed-phase-1"),
        pytest.param(PENDING, False, DEPLOYED, id="pending-phase-1-rolls-back"),
        pytest.param(DEPLOYED, True, PENDING, id="deployed-phase-2"),
        pytest.param(PENDING, True, PENDING, id="pending-phase-2"),
        pytest.param(COMPLETE, False, COMPLETE, id="complete-whatever-the-setting"),
        pytest.param(COMPLETE, True, COMPLETE, id="complete"),
        pytest.param("TABLE_MIGRATION_STATUS_LATER", True, INIT, id="unknown-writes-nothing-to-the-lease-table"),
    ],
)
def test_the_status_a_process_works_by_follows_kcl_s_override_table(recorded_status, migrate_all, expected):
    assert local_status(recorded_status, migrate_all) == expected


@pytest.mark.parametrize(
    ("case", "expected_action", "expected_status"),
    [
        pytest.param(facts(None), "none", None, id="not-asked-starts-nothing"),
        pytest.param(facts(None, migrate_all=True, support_met=False), "none", None, id="no-support-no-record-waits"),
        pytest.param(facts(None, migrate_all=True, active=0), "none", None, id="no-active-worker-no-start"),
        pytest.param(facts(recorded(INIT), support_met=False), "delete", None, id="support-lost-in-init-restarts"),
        pytest.param(facts(recorded(INIT), active=0), "none", None, id="a-round-without-metrics-tells-nothing"),
        pytest.param(facts(None, migrate_all=True), "write", INIT, id="asked-and-supported-writes-init"),
        pytest.param(facts(recorded(INIT), now=T0 + HOUR_MILLIS - 1000), "none", None, id="init-bakes-an-hour"),
        pytest.param(facts(recorded(INIT), now=T0 + HOUR_MILLIS), "write", DEPLOYED, id="init-baked-is-deployed"),
        pytest.param(facts(recorded(DEPLOYED)), "none", None, id="deployed-waits-for-phase-2"),
        pytest.param(facts(recorded(PENDING)), "write", DEPLOYED, id="pending-without-phase-2-rolls-back"),
        pytest.param(
            facts(recorded(DEPLOYED), migrate_all=True, writers=("app-worker-1",)),
            "none",
            None,
            id="phase-2-waits-while-a-worker-writes-the-separate-table",
        ),
        pytest.param(
            facts(recorded(DEPLOYED), migrate_all=True, keys=("AssignmentRound",)),
            "move_then_pending",
            PENDING,
            id="phase-2-moves-the-coordinator-state",
        ),
        pytest.param(
            facts(recorded(DEPLOYED), migrate_all=True, active=0, keys=("AssignmentRound",)),
            "none",
            None,
            id="phase-2-waits-for-a-round-whose-slots-wrote",
        ),
        pytest.param(
            facts(recorded(PENDING), migrate_all=True, active=0, keys=("RoundHistory",)),
            "write",
            DEPLOYED,
            id="pending-with-a-separate-record-rolls-back-without-active-workers",
        ),
        pytest.param(
            facts(recorded(PENDING), migrate_all=True, active=0, now=T0 + DAY * 1000),
            "none",
            None,
            id="pending-baked-waits-for-a-round-whose-slots-wrote",
        ),
        pytest.param(
            facts(recorded(PENDING), migrate_all=True, writers=("app-worker-1",), now=T0 + 2 * DAY * 1000),
            "write",
            DEPLOYED,
            id="pending-with-a-separate-writer-rolls-back-even-baked",
        ),
        pytest.param(
            facts(recorded(PENDING), migrate_all=True, keys=("RoundHistory",)),
            "write",
            DEPLOYED,
            id="pending-with-a-separate-record-rolls-back",
        ),
        pytest.param(
            facts(recorded(PENDING), migrate_all=True, now=T0 + DAY * 1000 - 1000),
            "none",
            None,
            id="pending-bakes",
        ),
        pytest.param(
            facts(recorded(PENDING), migrate_all=True, now=T0 + DAY * 1000), "complete", COMPLETE, id="pending-baked"
        ),
        pytest.param(facts(recorded(COMPLETE), migrate_all=True), "none", None, id="complete-is-final"),
    ],
)
def test_the_leader_s_step(case, expected_action, expected_status):
    step = decide_migration(case)
    assert (step.action, step.status) == (expected_action, expected_status), step.why


def test_the_move_names_the_records_it_moves():
    step = decide_migration(facts(recorded(DEPLOYED), migrate_all=True, keys=("AssignmentRound", "RoundHistory")))
    assert step.keys == ("AssignmentRound", "RoundHistory")


def test_a_change_of_status_keeps_the_previous_one_first_in_a_history_of_ten():
    state = new_state(INIT, "round-1", T0)
    for n in range(12):
        state = state.moved_to(DEPLOYED if n % 2 == 0 else PENDING, f"round-{n + 2}", T0 + n)
    assert len(state.history) == 10
    assert state.history[0].modified_by == "round-12"
    assert (state.status, state.modified_by, state.modified_millis) == (PENDING, "round-13", T0 + 11)


def test_the_record_round_trips_through_kcl_s_attribute_names():
    state = new_state(DEPLOYED, "round-1", T0)
    record = state.to_record()
    assert record == {
        "tm": DEPLOYED,
        "mb": "round-1",
        "mts": T0,
        "h": [{"tm": INIT, "mb": "round-1", "mts": T0}],
    }
    stored = {**record, "mts": Decimal(T0), "h": [{"tm": INIT, "mb": "round-1", "mts": Decimal(T0)}]}
    assert TableMigrationState.from_record(stored) == state


@pytest.mark.parametrize(
    ("record", "named"),
    [
        pytest.param({"tm": "TABLE_MIGRATION_STATUS_DONE", "mb": "x", "mts": 1}, "'tm'", id="unknown-status"),
        pytest.param({"tm": INIT, "mts": 1}, "'mb'", id="no-modifier"),
        pytest.param({"tm": INIT, "mb": "x", "mts": "soon"}, "'mts'", id="text-timestamp"),
        pytest.param({"tm": INIT, "mb": "x", "mts": 1, "h": ["junk"]}, "'h'", id="history-of-text"),
        pytest.param({"tm": INIT, "mb": "x", "mts": 1, "h": "abc"}, "'h'", id="history-not-a-list"),
    ],
)
def test_a_record_kcl_could_not_read_is_refused_naming_the_attribute(record, named):
    with pytest.raises(ValueError, match=named):
        TableMigrationState.from_record(record)


def test_each_worker_s_newest_metrics_are_chosen_across_both_tables():
    separate = [{"wid": "w-0", "lut": Decimal(10)}, {"wid": "w-1", "lut": Decimal(30)}]
    in_lease_table = [{"wid": "w-0", "lut": Decimal(20)}, {"wid": "w-1", "lut": Decimal(5)}, {"wid": "w-2", "lut": 1}]
    newest = newest_by_worker(separate, in_lease_table, "wid")
    assert {worker: place for worker, (place, _) in newest.items()} == {
        "w-0": "lease",
        "w-1": "separate",
        "w-2": "lease",
    }


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(None, False, id="no-migration"),
        pytest.param(INIT, False, id="phase-1-reads-one-table"),
        pytest.param(DEPLOYED, True, id="deployed"),
        pytest.param(PENDING, True, id="pending"),
        pytest.param(COMPLETE, False, id="complete-is-the-single-layout"),
        pytest.param("TABLE_MIGRATION_STATUS_LATER", True, id="unknown-misses-nothing"),
    ],
)
def test_both_tables_are_read_from_deployed_on_whatever_the_setting_of_the_reader(status, expected):
    assert reads_both_tables(status) is expected
