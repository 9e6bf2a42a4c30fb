"""Multi-stream mode: which streams to sync, and what becomes of a former stream's leases (kcl-spec.md §9).

In a batch round the configured streams are exactly the tracked ones: each is synced every round.
Streams that still have leases but are no longer configured are "former" streams; under the
deferred-deletion strategy their leases are deleted once they have been unconfigured for the wait
period (counted from the first round that saw them so, and remembered in the coordinator-state
table), or at once when the stream no longer exists in Kinesis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from lease_core.coordinator_state import CoordinatorStateStore
from lease_core.errors import StreamNotFoundError
from lease_core.lease import StreamIdentifier
from lease_core.lease_store import LeaseStore

NO_DELETION = "NO_STREAMS_LEASES_DELETION"
DEFERRED_DELETION = "FORMER_STREAMS_AUTO_DETECTION_DEFERRED_DELETION"
FORMER_STREAMS_KEY = "FormerStreams"


@dataclass(frozen=True)
class FormerStreamsDecision:
    pending: Mapping[str, int]  # serialized stream id -> epoch ms when first seen unconfigured
    delete_leases_of: tuple[str, ...]


def decide_former_streams(
    configured: Iterable[str],
    in_lease_table: Iterable[str],
    pending: Mapping[str, int],
    deleted_in_kinesis: Iterable[str],
    now_millis: int,
    strategy: str,
    wait_millis: int,
) -> FormerStreamsDecision:
    """Pure: streams are serialized identifiers `<account>:<name>:<epoch>`."""
    former = set(in_lease_table) - set(configured)
    if strategy == NO_DELETION or not former:
        return FormerStreamsDecision({}, ())
    gone = set(deleted_in_kinesis)
    still_pending: dict[str, int] = {}
    delete: list[str] = []
    for stream in sorted(former):
        first_seen = pending.get(stream, now_millis)
        if stream in gone or now_millis - first_seen >= wait_millis:
            delete.append(stream)
        else:
            still_pending[stream] = first_seen
    return FormerStreamsDecision(still_pending, tuple(delete))


@dataclass(frozen=True)
class FormerStreamsOutcome:
    pending: Mapping[str, int]
    deleted_leases: Mapping[str, tuple[str, ...]]  # stream -> lease keys deleted


class FormerStreamsCleaner:
    """Applies `decide_former_streams` to the lease table, remembering pending streams across rounds."""

    def __init__(
        self,
        store: LeaseStore,
        state: CoordinatorStateStore,
        stream_exists: Callable[[StreamIdentifier], bool],
        clock_millis: Callable[[], int],
        strategy: str,
        wait_millis: int,
    ) -> None:
        self.store = store
        self.state = state
        self.stream_exists = stream_exists
        self.clock_millis = clock_millis
        self.strategy = strategy
        self.wait_millis = wait_millis

    def run(self, configured: Iterable[StreamIdentifier]) -> FormerStreamsOutcome:
        leases = [lease for lease in self.store.list_leases() if lease.stream_name is not None]
        in_table = {lease.stream_name for lease in leases if lease.stream_name}
        configured_ids = {stream.serialize() for stream in configured}
        former = in_table - configured_ids
        gone = {s for s in former if self.strategy != NO_DELETION and not self.stream_exists(StreamIdentifier.parse(s))}
        decision = decide_former_streams(
            configured_ids, in_table, self._pending(), gone, self.clock_millis(), self.strategy, self.wait_millis
        )
        deleted: dict[str, tuple[str, ...]] = {}
        for stream in decision.delete_leases_of:
            keys = tuple(sorted(lease.lease_key for lease in leases if lease.stream_name == stream))
            for key in keys:
                self.store.delete_lease(key)
            deleted[stream] = keys
        self.state.put(FORMER_STREAMS_KEY, {"pending": {"M": {s: {"N": str(t)} for s, t in decision.pending.items()}}})
        return FormerStreamsOutcome(decision.pending, deleted)

    def _pending(self) -> dict[str, int]:
        record = self.state.get(FORMER_STREAMS_KEY) or {}
        return {stream: int(value["N"]) for stream, value in record.get("pending", {}).get("M", {}).items()}


def stream_exists_via(identify: Callable[[str], StreamIdentifier]) -> Callable[[StreamIdentifier], bool]:
    """A stream exists if Kinesis knows its name with the same creation epoch (a re-created stream is new)."""

    def exists(stream: StreamIdentifier) -> bool:
        try:
            return identify(stream.stream_name) == stream
        except StreamNotFoundError:
            return False

    return exists
