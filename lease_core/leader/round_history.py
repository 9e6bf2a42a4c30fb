"""The last rounds' figures, kept in the coordinator-state table for operators and the UI.

The round's finalize step appends a short summary of each round (records, bytes, files, lag, leases
lost and failed, retention losses, per-slot load) to one `RoundHistory` record; the newest
`keep` (100) summaries are kept. One record rather than one per round: the UI reads it with a single
GetItem. A DynamoDB item holds at most 400 KB, and a summary's per-slot rows grow with the slots
(100 rounds of 100 slots are well over), so the kept JSON never exceeds `HISTORY_BUDGET_BYTES`:
past it the oldest summaries lose their per-slot rows first (their totals stay, `slots` becomes
null), then the oldest summaries go.

The per-lease rows of the latest round only (records, lag, outcome: the UI's per-shard view) go to
a second record, `LastRoundLeases`, as zlib-compressed JSON (10,000 leases' rows are megabytes of
JSON, a few hundred KB compressed); past `LEASE_ROWS_BUDGET_BYTES` compressed, only the fields the
UI shows are kept (`LEASE_ROW_FIELDS`), and past it still, the rows that do not fit are left out
(the record's `leftOut` counts them). Records written by an older release (plain JSON) still read.

Both records are written with `update_record` (conditional on the version read), so two finalize
steps racing (which the leader lock already prevents) cannot drop each other's round, and a write
whose answer was lost is recognised rather than made twice. Airflow retries a failed finalize step
in a new process, after its append may have landed: a summary whose `run_id` is already kept
replaces that entry, so a round appears once however often its finalize step ran.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from lease_core.store.coordinator_state import CoordinatorStateStore, update_record
from lease_core.store.record_table import Record, whole_number

HISTORY_KEY = "RoundHistory"
LAST_ROUND_KEY = "LastRoundLeases"
DEFAULT_KEEP = 100
# Below DynamoDB's 400 KB item limit with room for the key, the version and the recent versions.
HISTORY_BUDGET_BYTES = 350_000
LEASE_ROWS_BUDGET_BYTES = 350_000
# What the UI shows of a lease's row: what is kept when whole rows do not fit.
# The moments of its freshness too: the next round carries them (lease_core.metrics.freshness).
LEASE_ROW_FIELDS = (
    "lease_key",
    "worker_id",
    "outcome",
    "records",
    "millis_behind_latest",
    "error",
    "dead_lettered",
    "oldest_unlanded_age_millis",
    "newest_landed_age_millis",
    "landed_through_millis",
    "newest_arrival_millis",
)


class RoundHistory:
    def __init__(
        self, state: CoordinatorStateStore, keep: int = DEFAULT_KEEP, budget_bytes: int = HISTORY_BUDGET_BYTES
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.state = state
        self.keep = keep
        self.budget_bytes = budget_bytes

    def rounds(self) -> list[dict[str, Any]]:
        """The kept summaries, oldest first."""
        return _summaries(self.state.get(HISTORY_KEY))

    def append(self, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Add one round's summary (JSON-serialisable), or replace the kept one of the same `run_id`;
        the kept summaries afterwards."""

        def change(record: Record | None) -> Record:
            rounds = _with_summary(_summaries(record), dict(summary))[-self.keep :]
            return {"rounds": _within_budget(rounds, self.budget_bytes)}

        return _summaries(update_record(self.state, HISTORY_KEY, change))

    def record_lease_rows(self, round_number: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Keep the per-lease rows (JSON-serialisable mappings) of the newest round: rows of a round
        older than the kept ones are ignored, so a late retry of an old round's finalize step cannot
        hide the newer round; the same round's rows replace the kept ones."""

        packed = _packed_rows(rows)

        def change(record: Record | None) -> Record | None:
            if record is not None and whole_number(record, "round") > round_number:
                return None
            return {"round": round_number, **packed}

        update_record(self.state, LAST_ROUND_KEY, change)

    def lease_rows(self) -> tuple[int | None, list[dict[str, Any]]]:
        """The latest round's number and per-lease rows; (None, []) before the first round."""
        round_number, rows, _ = self.kept_lease_rows()
        return round_number, rows

    def kept_lease_rows(self) -> tuple[int | None, list[dict[str, Any]], int]:
        """`lease_rows`, and how many rows of that round did not fit the record (module docstring):
        a lease without a row was then not necessarily left unread."""
        record = self.state.get(LAST_ROUND_KEY)
        if record is None:
            return None, [], 0
        round_number = whole_number(record, "round")
        if "leasesZ" in record:
            left_out = whole_number(record, "leftOut") if "leftOut" in record else 0
            return round_number, json.loads(zlib.decompress(record["leasesZ"])), left_out
        return round_number, json.loads(record["leases"]), 0  # an older release's record


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


def _within_budget(rounds: list[dict[str, Any]], budget_bytes: int) -> str:
    """The summaries as JSON of at most `budget_bytes`: the oldest lose their per-slot rows first,
    then the oldest go (the newest always stays)."""
    sizes = [_json_size(entry) for entry in rounds]

    def total() -> int:  # the entries, a comma between two, and the brackets
        return sum(sizes) + max(len(sizes) - 1, 0) + 2

    stripped = 0
    while total() > budget_bytes and stripped < len(rounds) - 1:
        if rounds[stripped].get("slots"):
            rounds[stripped] = {**rounds[stripped], "slots": None}
            sizes[stripped] = _json_size(rounds[stripped])
        stripped += 1
    while total() > budget_bytes and len(rounds) > 1:
        rounds, sizes = rounds[1:], sizes[1:]
    return _json(rounds)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _json_size(value: Any) -> int:
    return len(_json(value).encode())


def _packed_rows(rows: Sequence[Mapping[str, Any]]) -> Record:
    """The `LastRoundLeases` attributes for `rows`: compressed JSON within the budget (module docstring)."""
    whole = _compressed(rows)
    if len(whole) <= LEASE_ROWS_BUDGET_BYTES:
        return {"leasesZ": whole, "leftOut": 0}
    shown = [{field: row.get(field) for field in LEASE_ROW_FIELDS} for row in rows]
    kept = len(shown)
    packed = _compressed(shown)
    while len(packed) > LEASE_ROWS_BUDGET_BYTES:  # compression is nearly linear: shrink in proportion
        kept = int(kept * LEASE_ROWS_BUDGET_BYTES / len(packed) * 0.95)
        packed = _compressed(shown[:kept])
    return {"leasesZ": packed, "leftOut": len(rows) - kept}


def _compressed(rows: Sequence[Mapping[str, Any]]) -> bytes:
    return zlib.compress(json.dumps(list(rows), sort_keys=True, separators=(",", ":")).encode(), 6)
