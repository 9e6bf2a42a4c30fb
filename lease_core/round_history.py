"""The last rounds' figures, kept in the coordinator-state table for operators and the UI.

The round's finalize step appends a short summary of each round (records, bytes, files, lag, leases
lost and failed, retention losses, per-slot load) to one `RoundHistory` record; the newest
`keep` summaries are kept. One record rather than one per round: the UI reads it with a single
GetItem, and its size stays bounded (a summary is well under 1 KB without per-lease rows, so 50 stay
far below DynamoDB's 400 KB item limit). The per-lease rows of the latest round only (records,
lag, outcome: the UI's per-shard view) go to a second record, `LastRoundLeases`.

Appends are conditional on the version read, so two finalize steps racing (which the leader lock
already prevents) cannot drop each other's round.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from lease_core.coordinator_state import CoordinatorStateStore

HISTORY_KEY = "RoundHistory"
LAST_ROUND_KEY = "LastRoundLeases"
DEFAULT_KEEP = 50
_APPEND_ATTEMPTS = 5


class RoundHistory:
    def __init__(self, state: CoordinatorStateStore, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.state = state
        self.keep = keep

    def rounds(self) -> list[dict[str, Any]]:
        """The kept summaries, oldest first."""
        record = self.state.get(HISTORY_KEY)
        return [] if record is None else json.loads(record["rounds"]["S"])

    def append(self, summary: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Add one round's summary (JSON-serialisable); the kept summaries afterwards."""
        for _ in range(_APPEND_ATTEMPTS):
            record = self.state.get(HISTORY_KEY)
            rounds = [] if record is None else json.loads(record["rounds"]["S"])
            rounds = [*rounds, dict(summary)][-self.keep :]
            expected = {"version": record["version"]} if record is not None else {"version": None}
            attributes = {"rounds": {"S": json.dumps(rounds, sort_keys=True)}, "version": {"S": uuid.uuid4().hex}}
            if self.state.put(HISTORY_KEY, attributes, expected=expected):
                return rounds
        raise RuntimeError(f"the round history kept changing during {_APPEND_ATTEMPTS} attempts to append to it")

    def record_lease_rows(self, round_number: int, rows: list[Mapping[str, Any]]) -> None:
        """Replace the latest round's per-lease rows (JSON-serialisable mappings)."""
        attributes = {"round": {"N": str(round_number)}, "leases": {"S": json.dumps(list(rows), sort_keys=True)}}
        self.state.put(LAST_ROUND_KEY, attributes)

    def lease_rows(self) -> tuple[int | None, list[dict[str, Any]]]:
        """The latest round's number and per-lease rows; (None, []) before the first round."""
        record = self.state.get(LAST_ROUND_KEY)
        if record is None:
            return None, []
        return int(record["round"]["N"]), json.loads(record["leases"]["S"])
