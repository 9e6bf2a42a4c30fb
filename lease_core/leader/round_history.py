"""The last rounds' figures, kept in the coordinator-state table for operators and the UI.

The round's finalize step appends a short summary of each round (records, bytes, files, lag, leases
lost and failed, retention losses, per-slot load) to one `RoundHistory` record; the newest
`keep` summaries are kept. One record rather than one per round: the UI reads it with a single
GetItem, and its size stays bounded (a summary is well under 1 KB without per-lease rows, so 50 stay
far below DynamoDB's 400 KB item limit). The per-lease rows of the latest round only (records,
lag, outcome: the UI's per-shard view) go to a second record, `LastRoundLeases`.

Both records are written with `update_record` (conditional on the version read), so two finalize
steps racing (which the leader lock already prevents) cannot drop each other's round, and a write
whose answer was lost is recognised rather than made twice. Airflow retries a failed finalize step
in a new process, after its append may have landed: a summary whose `run_id` is already kept
replaces that entry, so a round appears once however often its finalize step ran.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lease_core.store.coordinator_state import CoordinatorStateStore, update_record
from lease_core.store.record_table import Record, whole_number

HISTORY_KEY = "RoundHistory"
LAST_ROUND_KEY = "LastRoundLeases"
DEFAULT_KEEP = 50


class RoundHistory:
    def __init__(self, state: CoordinatorStateStore, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.state = state
        self.keep = keep

    def rounds(self) -> list[dict[str, Any]]:
        """The kept summaries, oldest first."""
        return _summaries(self.state.get(HISTORY_KEY))

    def append(self, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Add one round's summary (JSON-serialisable), or replace the kept one of the same `run_id`;
        the kept summaries afterwards."""

        def change(record: Record | None) -> Record:
            rounds = _with_summary(_summaries(record), dict(summary))[-self.keep :]
            return {"rounds": json.dumps(rounds, sort_keys=True)}

        return _summaries(update_record(self.state, HISTORY_KEY, change))

    def record_lease_rows(self, round_number: int, rows: list[Mapping[str, Any]]) -> None:
        """Keep the per-lease rows (JSON-serialisable mappings) of the newest round: rows of a round
        older than the kept ones are ignored, so a late retry of an old round's finalize step cannot
        hide the newer round; the same round's rows replace the kept ones."""

        def change(record: Record | None) -> Record | None:
            if record is not None and whole_number(record, "round") > round_number:
                return None
            return {"round": round_number, "leases": json.dumps(list(rows), sort_keys=True)}

        update_record(self.state, LAST_ROUND_KEY, change)

    def lease_rows(self) -> tuple[int | None, list[dict[str, Any]]]:
        """The latest round's number and per-lease rows; (None, []) before the first round."""
        record = self.state.get(LAST_ROUND_KEY)
        if record is None:
            return None, []
        return whole_number(record, "round"), json.loads(record["leases"])


def _with_summary(rounds: list[dict[str, Any]], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """`rounds` with `summary` in place of the entry of its `run_id`, or added last.

    A summary without a `run_id` is always added. Only the DAG's finalize step has retries to absorb,
    and it always sets one; for any other caller, merging by a guessed key (the round number may be
    None, and a repeated assignment step gives the same run a new one) could drop a distinct round
    without a trace, while adding shows a duplicate at worst.
    """
    run_id = summary.get("run_id")
    if run_id is not None and any(entry.get("run_id") == run_id for entry in rounds):
        return [summary if entry.get("run_id") == run_id else entry for entry in rounds]
    return [*rounds, summary]


def _summaries(record: Record | None) -> list[dict[str, Any]]:
    return [] if record is None else json.loads(record["rounds"])
