"""Multi-stream mode: which streams to sync, and what becomes of a former stream's leases (docs/protocol.md §7).

In a batch round the configured streams are exactly the tracked ones: each is synced every round.
Streams that still have leases but are no longer configured are "former" streams; under the
deferred-deletion strategy their leases are deleted once they have been unconfigured for the wait
period (counted from the first round that saw them so, and remembered in the coordinator-state
table), or at once when the stream no longer exists in Kinesis.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lease_core.errors import StreamNotFoundError
from lease_core.lifecycle.lease_lifecycle import AwaitingVisibility, may_await_visibility
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.store.coordinator_state import CoordinatorStateStore, decide_and_record
from lease_core.store.lease_store import LeaseStore
from lease_core.store.record_table import Record

NO_DELETION = "NO_STREAMS_LEASES_DELETION"
DEFERRED_DELETION = "FORMER_STREAMS_AUTO_DETECTION_DEFERRED_DELETION"
FORMER_STREAMS_KEY = "FormerStreams"

log = logging.getLogger(__name__)


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
    """Streams are serialized identifiers. changed_leases: leases of a stream being deleted that
    changed after the snapshot (someone still works them) or whose committed batches may not be
    visible yet (`may_await_visibility`); they are judged again next round."""

    pending: Mapping[str, int]
    deleted_leases: Mapping[str, tuple[str, ...]]  # stream -> lease keys deleted
    changed_leases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class FormerStreamsCleaner:
    """Applies `decide_former_streams` to the lease table, remembering pending streams across rounds.

    The pending map is read, decided on and written back with `decide_and_record`, so a concurrent
    writer's update is never lost; leases are deleted only if unchanged since they were listed.
    """

    def __init__(
        self,
        store: LeaseStore,
        state: CoordinatorStateStore,
        stream_exists: Callable[[StreamIdentifier], bool],
        clock_millis: Callable[[], int],
        strategy: str,
        wait_millis: int,
        awaiting_visibility: AwaitingVisibility | None = None,
    ) -> None:
        self.store = store
        self.awaiting_visibility = awaiting_visibility
        self.state = state
        self.stream_exists = stream_exists
        self.clock_millis = clock_millis
        self.strategy = strategy
        self.wait_millis = wait_millis

    def run(
        self, configured: Iterable[StreamIdentifier], snapshot: Sequence[Lease] | None = None
    ) -> FormerStreamsOutcome:
        """`snapshot`: the lease table as the caller's step has it (None: scan it here); a lease
        changed since is kept, as every delete is conditional on it being unchanged."""
        leases = [
            lease
            for lease in (self.store.list_leases() if snapshot is None else snapshot)
            if lease.stream_name is not None
        ]
        in_table = {lease.stream_name for lease in leases if lease.stream_name}
        configured_ids = {stream.serialize() for stream in configured}
        former = in_table - configured_ids
        gone = {s for s in former if self.strategy != NO_DELETION and not self.stream_exists(StreamIdentifier.parse(s))}
        now = self.clock_millis()

        def decide(record: Record | None) -> tuple[FormerStreamsDecision, Record | None]:
            pending = _pending(record)
            decision = decide_former_streams(
                configured_ids, in_table, pending, gone, now, self.strategy, self.wait_millis
            )
            return decision, None if dict(decision.pending) == pending else _pending_item(decision.pending)

        decision = decide_and_record(self.state, FORMER_STREAMS_KEY, decide)
        deleted: dict[str, tuple[str, ...]] = {}
        changed: dict[str, tuple[str, ...]] = {}
        for stream in decision.delete_leases_of:
            of_stream = [
                lease for lease in sorted(leases, key=lambda lease: lease.lease_key) if lease.stream_name == stream
            ]
            waiting = tuple(
                lease.lease_key for lease in of_stream if may_await_visibility(lease, self.awaiting_visibility)
            )
            results = [
                (lease.lease_key, self.store.delete_lease_if_unchanged(lease))
                for lease in of_stream
                if lease.lease_key not in waiting
            ]
            # A lease already gone counts as deleted: possibly by this very delete, its answer lost.
            deleted[stream] = tuple(key for key, result in results if not result.lost_to_a_change)
            kept = tuple(key for key, result in results if result.lost_to_a_change) + waiting
            if kept:
                log.info(
                    "former stream %s: %d lease(s) changed since listed or await their batches' visibility, and stay",
                    stream,
                    len(kept),
                )
                changed[stream] = kept
        return FormerStreamsOutcome(decision.pending, deleted, changed)


def _pending(record: Record | None) -> dict[str, int]:
    return {stream: int(since) for stream, since in (record or {}).get("pending", {}).items()}


def _pending_item(pending: Mapping[str, int]) -> Record:
    return {"pending": dict(pending)}


def stream_exists_via(identify: Callable[[str], StreamIdentifier]) -> Callable[[StreamIdentifier], bool]:
    """A stream exists if Kinesis knows its name with the same creation epoch (a re-created stream is new)."""

    def exists(stream: StreamIdentifier) -> bool:
        try:
            return identify(stream.stream_name) == stream
        except StreamNotFoundError:
            return False

    return exists
