"""KCL 3.5's table migration: the decisions (docs/protocol.md §1.8). Pure; the leader's coordinator is
`lease_core.leader.table_migration_run`.

A `separate`-layout application (KCL 3.0-3.4's three tables) moves its worker metrics and coordinator
state into its lease table in KCL 3.5's four steps, kept in KCL's own record (`TableMigration3.5` in the
coordinator-state table: `tm` the status, `mb` who wrote it, `mts` when, in epoch milliseconds, `h`
the last ten earlier values):

- INIT: every active worker's metrics carry the support code of the migration (`sup` >= 1); the
  one-hour bake to DEPLOYED starts at `mts`;
- DEPLOYED: phase 1 baked; with `migrate_all_entities_to_lease_table` the slots write their metrics to
  the lease table, and once no worker writes them to the separate table any more the leader moves
  every coordinator-state record except the lock and the migration record into the lease table, in
  transactions fenced by its lock;
- PENDING: everything is in the lease table; the bake of `table_migration_complete_bake_time_seconds`
  starts at `mts`. A worker writing to the separate tables again, or a record left there, rolls it
  back to DEPLOYED;
- COMPLETE: written to both tables at once, fenced by the lock; from then on the application is
  `single` and the lock is taken in the lease table. There is no way back.

Each step is one conditional write or one transaction, so a round killed anywhere leaves a state the
next round's leader reads and goes on from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from lease_core.store.migrating_records import record_order
from lease_core.store.record_table import Record

TABLE_MIGRATION_KEY = "TableMigration3.5"
STATUS = "tm"
MODIFIED_BY = "mb"
MODIFIED_MILLIS = "mts"
HISTORY = "h"
HISTORY_KEPT = 10

INIT = "TABLE_MIGRATION_STATUS_INIT"
DEPLOYED = "TABLE_MIGRATION_STATUS_DEPLOYED"
PENDING = "TABLE_MIGRATION_STATUS_PENDING"
COMPLETE = "TABLE_MIGRATION_STATUS_COMPLETE"
STATUSES = (INIT, DEPLOYED, PENDING, COMPLETE)
# KCL's bake from INIT to DEPLOYED (TableMigrationStatus.DEPLOYED's default, not configurable).
DEPLOYED_BAKE_SECONDS = 3600
# The support code of the single-table migration (KCL's SupportedFeature.SINGLE_TABLE_MIGRATION).
SINGLE_TABLE_MIGRATION_SUPPORT = 1
# What stays in the coordinator-state table through the migration: the lock (until COMPLETE, when it
# is taken in the lease table) and the migration record itself.
STAYS_IN_SEPARATE_TABLE = frozenset({"Leader", TABLE_MIGRATION_KEY})


@dataclass(frozen=True)
class HistoryEntry:
    status: str
    modified_by: str
    modified_millis: int


@dataclass(frozen=True)
class TableMigrationState:
    """KCL's `TableMigration3.5` record."""

    status: str
    modified_by: str
    modified_millis: int
    history: tuple[HistoryEntry, ...] = ()

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TableMigrationState:
        """Raises ValueError naming what KCL would not read either (an unknown status, a missing field)."""
        status = record.get(STATUS)
        if status not in STATUSES:
            raise ValueError(f"{TABLE_MIGRATION_KEY!r}: {STATUS!r} is {status!r}, not one of {', '.join(STATUSES)}")
        history = record.get(HISTORY) or []
        if not isinstance(history, list) or not all(isinstance(entry, Mapping) for entry in history):
            raise ValueError(f"{TABLE_MIGRATION_KEY!r}: {HISTORY!r} is {history!r}, not a list of maps")
        return cls(
            str(status),
            _text(record, MODIFIED_BY),
            _millis(record, MODIFIED_MILLIS),
            tuple(
                HistoryEntry(_text(entry, STATUS), _text(entry, MODIFIED_BY), _millis(entry, MODIFIED_MILLIS))
                for entry in history
            ),
        )

    def to_record(self) -> Record:
        record: Record = {STATUS: self.status, MODIFIED_BY: self.modified_by, MODIFIED_MILLIS: self.modified_millis}
        if self.history:
            record[HISTORY] = [
                {STATUS: entry.status, MODIFIED_BY: entry.modified_by, MODIFIED_MILLIS: entry.modified_millis}
                for entry in self.history
            ]
        return record

    def moved_to(self, status: str, modified_by: str, now_millis: int) -> TableMigrationState:
        """The record after a change of status, the previous value first in its history (KCL keeps ten)."""
        previous = HistoryEntry(self.status, self.modified_by, self.modified_millis)
        return TableMigrationState(status, modified_by, now_millis, ((previous, *self.history))[:HISTORY_KEPT])

    def baked_for_seconds(self, now_millis: int) -> int:
        return now_millis // 1000 - self.modified_millis // 1000


def new_state(status: str, modified_by: str, now_millis: int) -> TableMigrationState:
    """A first record, as KCL writes one: created INIT, then updated to `status` (INIT in history)."""
    created = TableMigrationState(INIT, modified_by, now_millis)
    return created if status == INIT else created.moved_to(status, modified_by, now_millis)


def _text(record: Mapping[str, Any], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{TABLE_MIGRATION_KEY!r}: {name!r} is {value!r}, not a string")
    return value


def _millis(record: Mapping[str, Any], name: str) -> int:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int | Decimal) or value != int(value):
        raise ValueError(f"{TABLE_MIGRATION_KEY!r}: {name!r} is {value!r}, not a whole number of milliseconds")
    return int(value)


def local_status(recorded: str | None, migrate_all: bool) -> str:
    """The status a process works by, from the recorded one and `migrate_all_entities_to_lease_table`
    (KCL's override table): PENDING and COMPLETE write worker metrics and new coordinator state to the
    lease table, INIT and DEPLOYED to the separate tables.

    KCL refuses `migrateAllEntitiesToLeaseTable` before DEPLOYED (a rolling deployment may still run
    3.4 workers); a round's slots all run the release that started it, so here phase 1 runs first.
    """
    if recorded == COMPLETE:
        return COMPLETE
    if recorded in (DEPLOYED, PENDING):
        return PENDING if migrate_all else DEPLOYED
    # None, INIT, or a status this release does not know (the leader refuses to act on it): nothing
    # is written to the lease table.
    return INIT


def reads_both_tables(recorded: str | None) -> bool:
    """Whether records may be in either table: from DEPLOYED on, a process with
    `migrate_all_entities_to_lease_table` writes to the lease table, and a move (finished or cut short)
    or a rollback leaves records there, whatever the setting of the process reading them. KCL reads
    both in every status short of COMPLETE; in INIT nothing can have written to the lease table yet.
    A status this release does not know is read both ways, to miss nothing."""
    return recorded is not None and recorded not in (INIT, COMPLETE)


@dataclass(frozen=True)
class MigrationFacts:
    """What the leader reads before it decides, at the end of a round."""

    recorded: TableMigrationState | None
    migrate_all: bool
    # Workers whose newest metrics were written in the round (or, KCL's, within its active window):
    # without one, the round tells nothing of where the workers write (a consume step that failed).
    active_workers: int
    # Every active worker's newest worker-metrics item carries the migration's support code.
    support_met: bool
    # Workers whose newest worker metrics, written recently, are in the separate table.
    separate_metrics_writers: tuple[str, ...]
    # Coordinator-state keys in the separate table other than the lock and the migration record.
    separate_state_keys: tuple[str, ...]
    now_millis: int
    complete_bake_seconds: int


@dataclass(frozen=True)
class MigrationStep:
    """What the leader does: write a status (conditional on the recorded one), delete the record (the
    fleet lost the support code before DEPLOYED), move the coordinator state and then write PENDING,
    or write COMPLETE to both tables. `why` says it in words for the step's summary and the logs."""

    action: Literal["none", "write", "delete", "move_then_pending", "complete"]
    why: str
    status: str | None = None
    keys: tuple[str, ...] = field(default=())


def decide_migration(facts: MigrationFacts) -> MigrationStep:
    """The leader's step, as KCL's `TableMigrationStateMachineImpl.handleLeaderLockResult` decides it."""
    recorded = facts.recorded
    status = None if recorded is None else recorded.status
    working = local_status(status, facts.migrate_all)
    if working == COMPLETE:
        return MigrationStep("none", "the table migration is complete")
    if working == INIT:
        if recorded is None and not facts.migrate_all:
            return MigrationStep("none", "no table migration: migrate_all_entities_to_lease_table is off")
        return _phase_one(facts, recorded)
    if working == DEPLOYED:
        if status == PENDING:
            return MigrationStep("write", "migrate_all_entities_to_lease_table is off: back to DEPLOYED", DEPLOYED)
        return MigrationStep("none", "DEPLOYED: waiting for migrate_all_entities_to_lease_table")
    assert recorded is not None  # PENDING needs a recorded DEPLOYED or PENDING
    writers = facts.separate_metrics_writers
    if status == DEPLOYED:
        if not facts.active_workers:
            return MigrationStep("none", "DEPLOYED: no worker wrote its metrics in this round, nothing to go by")
        if writers:
            return MigrationStep("none", f"worker(s) {', '.join(writers)} still write metrics to the separate table")
        return MigrationStep(
            "move_then_pending",
            f"moving {len(facts.separate_state_keys)} coordinator-state record(s) to the lease table",
            PENDING,
            facts.separate_state_keys,
        )
    if writers or facts.separate_state_keys:
        left = writers or facts.separate_state_keys
        return MigrationStep("write", f"the separate tables are written again ({', '.join(left)}): DEPLOYED", DEPLOYED)
    if not facts.active_workers:
        return MigrationStep("none", "PENDING: no worker wrote its metrics in this round, nothing to go by")
    baked = recorded.baked_for_seconds(facts.now_millis)
    if baked >= facts.complete_bake_seconds:
        return MigrationStep("complete", f"PENDING baked {baked} s of {facts.complete_bake_seconds} s", COMPLETE)
    return MigrationStep("none", f"PENDING: baking, {baked} s of {facts.complete_bake_seconds} s")


def _phase_one(facts: MigrationFacts, recorded: TableMigrationState | None) -> MigrationStep:
    if not facts.active_workers:
        return MigrationStep("none", "no worker wrote its metrics in this round: the support code is not known")
    if not facts.support_met:
        if recorded is not None:
            return MigrationStep(
                "delete", "an active worker's metrics lack the migration's support code: INIT restarts"
            )
        return MigrationStep("none", "waiting for every active worker's metrics to carry the support code")
    if recorded is None:
        return MigrationStep("write", "every active worker supports the migration: INIT, the bake starts", INIT)
    baked = recorded.baked_for_seconds(facts.now_millis)
    if baked >= DEPLOYED_BAKE_SECONDS:
        return MigrationStep("write", f"INIT baked {baked} s of {DEPLOYED_BAKE_SECONDS} s: DEPLOYED", DEPLOYED)
    return MigrationStep("none", f"INIT: baking, {baked} s of {DEPLOYED_BAKE_SECONDS} s")


# What orders one worker's metrics items in time: this project's round, then KCL's `lut` (seconds).
METRICS_ORDER = ("round", "lut")


def newest_by_worker(
    separate: Sequence[Mapping[str, Any]], lease_table: Sequence[Mapping[str, Any]], worker_key: str
) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """Each worker's newest worker-metrics record (`METRICS_ORDER`; the lease table's on a tie) and where
    it is: "separate" or "lease"."""
    newest: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for place, records in (("separate", separate), ("lease", lease_table)):
        for record in records:
            worker = str(record.get(worker_key, ""))
            held = newest.get(worker)
            if held is None or record_order(record, METRICS_ORDER) >= record_order(held[1], METRICS_ORDER):
                newest[worker] = (place, record)
    return newest
