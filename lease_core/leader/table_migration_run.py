"""The leader's step of KCL 3.5's table migration, at the end of a round (docs/protocol.md §1.8).

`TableMigrationRun.advance` reads what the decision needs (`table_migration.decide_migration`) and
carries it out: a status written conditional on the recorded one, coordinator-state records moved to
the lease table in transactions of 25 (each one fenced by the lock: a condition that the separate
table's `Leader` is still ours, as KCL's is), or COMPLETE written to both tables in one transaction
fenced the same way. The caller holds the lock and releases it afterwards: after COMPLETE the next
round takes it in the lease table.

A round killed anywhere leaves a state the next round's leader goes on from: a status is one write, a
moved record is in exactly one table, and the move starts again from what the separate table still
holds before PENDING is written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from lease_core.leader.leader_lock import wall_clock_millis
from lease_core.metrics.worker_metrics import LAST_UPDATE, ROUND, SUPPORT_CODE, SUPPORT_UPDATE, WORKER_ID
from lease_core.retry import RetryPolicy
from lease_core.store.coordinator_state import KEY as COORDINATOR_STATE_KEY
from lease_core.store.migration_transactions import MigrationTransactions
from lease_core.store.record_table import Record, RecordTable
from lease_core.store.table_migration import (
    COMPLETE,
    INIT,
    PENDING,
    SINGLE_TABLE_MIGRATION_SUPPORT,
    STATUS,
    STAYS_IN_SEPARATE_TABLE,
    TABLE_MIGRATION_KEY,
    MigrationFacts,
    MigrationStep,
    TableMigrationState,
    decide_migration,
    local_status,
    new_state,
    newest_by_worker,
    reads_both_tables,
)

logger = logging.getLogger(__name__)

# KCL's batch: 25 records, each a put and a delete, plus the lock's condition (at most 100 items).
MOVE_BATCH = 25
# KCL counts a worker active while its metrics are younger than twice its 30 s reporting interval; a
# slot of this project is active in the round it wrote (its `round`).
ACTIVE_SECONDS = 60


@dataclass(frozen=True)
class MigrationTables:
    """The record tables the migration reads and writes, and the names of the tables it moves between."""

    lease_table: str
    coordinator_state_table: str
    separate_state: RecordTable
    separate_metrics: RecordTable
    lease_table_metrics: RecordTable


class TableMigrationRun:
    def __init__(
        self,
        client: Any,
        tables: MigrationTables,
        owner: str,
        *,
        migrate_all: bool,
        complete_bake_seconds: int,
        current_round: Callable[[], int],
        retry_policy: RetryPolicy | None = None,
        clock_millis: Callable[[], int] = wall_clock_millis,
    ) -> None:
        self.tables = tables
        self.owner = owner
        self.migrate_all = migrate_all
        self.complete_bake_seconds = complete_bake_seconds
        self._current_round = current_round
        self._transactions = MigrationTransactions(
            client, tables.lease_table, tables.coordinator_state_table, retry_policy
        )
        self._clock_millis = clock_millis

    def advance(self) -> dict[str, Any]:
        """One step of the migration, as its summary: the status before and after, what was done and why."""
        record = self.tables.separate_state.get(TABLE_MIGRATION_KEY)
        recorded = None if record is None else TableMigrationState.from_record(record)
        status = None if recorded is None else recorded.status
        step = decide_migration(self._facts(recorded))
        done, left = self._carry_out(step, recorded)
        after = status
        if done:
            after = None if step.action == "delete" else step.status
        summary: dict[str, Any] = {
            "status": status,
            "action": step.action,
            "why": step.why,
            "done": done,
            "status_after": after,
        }
        if left:
            # Changed while they were being moved, written there since, or refused by the lease table: the
            # next round moves them; PENDING waits for it.
            summary["not_moved"] = list(left)
        if step.action != "none":
            logger.info("table migration: %s", summary)
        return summary

    # --- reading ------------------------------------------------------------------------------

    def _facts(self, recorded: TableMigrationState | None) -> MigrationFacts:
        """What the decision reads: nothing more before a migration is asked for or after COMPLETE."""
        now = self._clock_millis()
        status = None if recorded is None else recorded.status
        working = local_status(status, self.migrate_all)
        active: dict[str, tuple[str, Record]] = {}
        keys: tuple[str, ...] = ()
        if working in (INIT, PENDING) and (recorded is not None or self.migrate_all):
            active = self._active_metrics(now, reads_both_tables(status))
        if working == PENDING:
            keys = self._separate_state_keys()
        support_met = all(_supports_the_migration(item) for _, item in active.values())
        writers = tuple(sorted(worker for worker, (place, _) in active.items() if place == "separate"))
        return MigrationFacts(
            recorded, self.migrate_all, len(active), support_met, writers, keys, now, self.complete_bake_seconds
        )

    def _active_metrics(self, now_millis: int, both_tables: bool) -> dict[str, tuple[str, Record]]:
        """Each active worker's newest worker metrics and where they are ("separate" or "lease"): written
        in this round (a slot's `round`), or by a KCL worker within its active window (`lut`). The lease
        table is read only when it may hold some (`both_tables`): that is a scan of every lease."""
        separate = self.tables.separate_metrics.scan()
        in_lease_table = self.tables.lease_table_metrics.scan() if both_tables else []
        current_round = self._current_round()
        active = {}
        for worker, (place, item) in newest_by_worker(separate, in_lease_table, WORKER_ID).items():
            written_round = item.get(ROUND)
            if written_round is not None:
                recent = _number(written_round) >= current_round
            else:
                recent = now_millis // 1000 - _number(item.get(LAST_UPDATE)) <= ACTIVE_SECONDS
            if recent:
                active[worker] = (place, dict(item))
        return active

    def _separate_state_keys(self) -> tuple[str, ...]:
        keys = (str(record.get(COORDINATOR_STATE_KEY)) for record in self.tables.separate_state.scan())
        return tuple(sorted(key for key in keys if key not in STAYS_IN_SEPARATE_TABLE))

    # --- writing ------------------------------------------------------------------------------

    def _carry_out(self, step: MigrationStep, recorded: TableMigrationState | None) -> tuple[bool, tuple[str, ...]]:
        """Whether the step's write was made, and the records a move left in the separate table."""
        now = self._clock_millis()
        state = self.tables.separate_state
        if step.action == "none":
            return False, ()
        if step.action == "delete":
            assert recorded is not None
            return state.delete(TABLE_MIGRATION_KEY, expected={STATUS: recorded.status}), ()
        assert step.status is not None
        if step.action == "write":
            return self._write_status(step.status, recorded, now), ()
        assert recorded is not None
        if step.action == "move_then_pending":
            self._move(step.keys)
            left = self._separate_state_keys()
            if left:
                logger.warning("table migration: records left in the separate table after the move: %s", left)
                return False, left
            return self._write_status(PENDING, recorded, now), ()
        return self._complete(recorded, now), ()

    def _write_status(self, status: str, recorded: TableMigrationState | None, now_millis: int) -> bool:
        """KCL's conditional write: a first record only if there is none, a change only from the status
        read. A change keeps the record's other attributes, as KCL's does (a whole PutItem, so that the
        round's role needs no UpdateItem on the coordinator-state table)."""
        state = self.tables.separate_state
        if recorded is None:
            record = new_state(status, self.owner, now_millis).to_record()
            return state.put(TABLE_MIGRATION_KEY, record, expected={state.hash_key: None})
        stored = state.get(TABLE_MIGRATION_KEY) or {}
        record = {**stored, **recorded.moved_to(status, self.owner, now_millis).to_record()}
        return state.put(TABLE_MIGRATION_KEY, record, expected={STATUS: recorded.status})

    def _move(self, keys: Sequence[str]) -> None:
        """Each record into the lease table and out of the separate table, 25 to a transaction fenced by
        the lock; a record gone since the listing (moved or deleted) is skipped."""
        for start in range(0, len(keys), MOVE_BATCH):
            batch = keys[start : start + MOVE_BATCH]
            records = [(key, record) for key in batch if (record := self.tables.separate_state.get(key)) is not None]
            if records:
                self._transactions.move(records, self.owner)

    def _complete(self, recorded: TableMigrationState, now_millis: int) -> bool:
        return self._transactions.complete(recorded.moved_to(COMPLETE, self.owner, now_millis).to_record(), self.owner)


def _supports_the_migration(item: Record) -> bool:
    """KCL's support code of the migration, written with the metrics (`slu` not before `lut`: a release
    that does not know the code updates `lut` alone, and so is found out)."""
    written_with = _number(item.get(SUPPORT_UPDATE)) >= _number(item.get(LAST_UPDATE))
    return _number(item.get(SUPPORT_CODE)) >= SINGLE_TABLE_MIGRATION_SUPPORT and written_with


def _number(value: Any) -> int:
    return int(value) if isinstance(value, int | Decimal) and not isinstance(value, bool) else -1
