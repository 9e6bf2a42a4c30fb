"""The leader's shard-sync step of a round: sync every configured stream, then tidy the lease table.

Single-stream mode syncs one stream with bare shard-id lease keys, once it has checked that the
stream is the one the application consumes (`consumed_stream`). Multi-stream mode (more than one
stream, or `multi_stream = true`) keys leases by stream identifier, syncs each configured stream,
and applies the former-streams strategy to streams that are no longer configured.

Cleanup deletes a lease only when it has provably finished, or when Kinesis says its shard does not
exist (`lease_lifecycle`, `garbage_probe`); a stream whose listing does not cover the hash key
space is left exactly as it is for the round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from lease_core.config.settings import ConsumerConfig
from lease_core.errors import ConfigurationError, CorruptLeaseError
from lease_core.lifecycle.lease_lifecycle import (
    AwaitingVisibility,
    CleanupOutcome,
    apply_cleanup,
    plan_lease_cleanup,
    unlisted_leases,
)
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.shards import InitialPositionInStream, Shard, StreamDescription
from lease_core.retrieval.pending_work import probe_unmeasured_leases
from lease_core.retrieval.record_source import Retrieval
from lease_core.retrieval.shard_source import ShardSource
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.lease_store import LeaseScan, LeaseStore
from lease_core.store.load_probes import record_load_probes
from lease_core.sync.consumed_stream import ConsumedStream, remember_consumed_stream
from lease_core.sync.garbage_probe import GarbageProbe
from lease_core.sync.stream_tracking import FormerStreamsCleaner, FormerStreamsOutcome, stream_exists_via
from lease_core.sync.syncer import ShardSyncer, StreamSyncResult, initial_position_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardSyncReport:
    """What the step did. consumed_stream: single-stream mode only."""

    multi_stream: bool
    streams: tuple[StreamSyncResult, ...]
    cleanups: tuple[CleanupOutcome, ...]
    former_streams: FormerStreamsOutcome | None = None
    consumed_stream: ConsumedStream | None = None
    # The lease table as the step left it (its one scan plus its own writes), for the step's auditor.
    leases: tuple[Lease, ...] | None = field(default=None, repr=False, compare=False)
    # Items of the table that are not readable leases: the round skips them, and their shards are
    # not read until they are repaired (`leasectl repair`).
    corrupt: tuple[CorruptLeaseError, ...] = ()

    @property
    def created(self) -> tuple[str, ...]:
        return tuple(key for result in self.streams for key in result.created)

    @property
    def deleted(self) -> tuple[str, ...]:
        former = self.former_streams.deleted_leases.values() if self.former_streams else ()
        cleaned = (key for cleanup in self.cleanups for key in cleanup.deleted)
        return (*cleaned, *(key for keys in former for key in keys))

    @property
    def changed(self) -> tuple[str, ...]:
        """Leases planned for deletion but kept: they changed after the snapshot that judged them."""
        former = self.former_streams.changed_leases.values() if self.former_streams else ()
        cleaned = (key for cleanup in self.cleanups for key in cleanup.changed)
        return (*cleaned, *(key for keys in former for key in keys))

    @property
    def closed_lease_keys(self) -> frozenset[str]:
        """The leases of shards the step's listings say are closed: read to their end, they are work."""
        return frozenset(key for result in self.streams for key in result.closed_lease_keys)

    @property
    def possibly_unread(self) -> tuple[str, ...]:
        """Leases deleted before they reached SHARD_END because Kinesis says their shard is gone: potential loss."""
        return tuple(key for cleanup in self.cleanups for key in cleanup.possibly_unread)

    def to_dict(self) -> dict[str, object]:
        return {
            "multi_stream": self.multi_stream,
            "streams": [
                {**result.to_dict(), "cleanup": asdict(cleanup)} for result, cleanup in zip(self.streams, self.cleanups)
            ],
            "created": list(self.created),
            "deleted": list(self.deleted),
            "changed": list(self.changed),
            "possibly_unread": list(self.possibly_unread),
            "former_streams_pending": dict(self.former_streams.pending) if self.former_streams else {},
            "consumed_stream": self.consumed_stream.to_dict() if self.consumed_stream else None,
            "corrupt_leases": [{"lease_key": error.lease_key, "problem": error.problem} for error in self.corrupt],
        }


def is_multi_stream(config: ConsumerConfig, stream_names: Sequence[str]) -> bool:
    return config.multi_stream or len(stream_names) > 1


def require_matching_lease_mode(leases: Iterable[Lease], multi_stream: bool, command: str = "this sync") -> None:
    """Refuse to work on a table whose leases were keyed in the other mode: a sync's keys would not
    match the shards (cleanup would take every lease for garbage), a consume job's slots would skip
    every lease."""
    for lease in leases:
        if lease.is_multi_stream != multi_stream:
            found = "multi-stream" if lease.is_multi_stream else "single-stream"
            raise ConfigurationError(
                "multi_stream",
                f"the lease table holds {found} leases (e.g. {lease.lease_key!r}) but {command} runs in "
                f"{'multi' if multi_stream else 'single'}-stream mode; set multi_stream = "
                f"{str(lease.is_multi_stream).lower()} (several --stream options also select multi-stream mode)",
            )


class _StreamStep:
    """Sync one stream, then clean up its leases from what the sync listed and Kinesis answered."""

    def __init__(
        self,
        config: ConsumerConfig,
        store: LeaseStore,
        source: ShardSource,
        state: CoordinatorStateStore,
        clock_millis: Callable[[], int],
        awaiting_visibility: AwaitingVisibility | None,
    ) -> None:
        self.store = store
        self.awaiting_visibility = awaiting_visibility
        self.syncer = ShardSyncer(
            store, source, initial_position_of(config), config.ignore_unexpected_child_shards, clock_millis
        )
        self.probe = GarbageProbe(source, state, clock_millis, config.garbage_lease_cleanup_interval_millis)
        self.cleanup_on_completion = config.cleanup_leases_upon_shard_completion

    def run(
        self, stream_name: str, stream_key: str, scheme: LeaseKeyScheme, snapshot: LeaseScan
    ) -> tuple[StreamSyncResult, CleanupOutcome, LeaseScan]:
        """`stream_key` names the stream in the coordinator state: its name, or its serialized identifier.

        `snapshot` is the lease table as the step scanned it, kept current with what this step wrote
        (returned): one scan per step, however many streams. The leader lock keeps other writers of
        the table out, and a lease that changed anyway is only judged late: every cleanup delete is
        conditional on the lease being as the snapshot has it.
        """
        result = self.syncer.sync(stream_name, scheme, snapshot)
        snapshot = _with_changes(snapshot, created=result.created_leases)
        if result.listing_incomplete is not None:
            return result, CleanupOutcome(), snapshot
        leases = list(snapshot.leases)
        unlisted = {scheme.shard_id_of(lease) for lease in unlisted_leases(leases, result.full_listing, scheme)}
        answers = self.probe.ask(stream_key, stream_name, unlisted)
        plan = plan_lease_cleanup(
            leases, result.full_listing, scheme, self.cleanup_on_completion, answers, self.awaiting_visibility
        )
        cleanup = apply_cleanup(self.store, plan)
        return result, cleanup, _with_changes(snapshot, deleted=cleanup.deleted)


# Streams whose identity and listing a sync asks Kinesis for while it scans the lease table.
_LISTINGS_AT_ONCE = 8


class _ListingsAhead:
    """A ShardSource whose first answers for each stream were asked while the lease table was scanned.

    The scan and the listings ask different services, so a step waits for the longer of them instead
    of both (at 10,000 leases in 10 streams: moto's scan, ~7.5 s, and 100 ListShards pages, up to
    4.6 s). Each early answer is used once, as the step asks for it; a failed one raises there, as
    the call would have. A listing is only as old as the scan it stands beside, and the step judges
    both as before: every cleanup delete is conditional, and a lease whose shard the listing lacks
    is asked about (`garbage_probe`) before anything is deleted.
    """

    def __init__(
        self, source: ShardSource, stream_names: Sequence[str], multi_stream: bool, pool: ThreadPoolExecutor
    ) -> None:
        self._source = source
        self._listings = {name: pool.submit(source.list_shards, name) for name in stream_names}
        identify = source.stream_identifier if multi_stream else source.describe_stream
        self._identities: dict[str, Future[Any]] = {name: pool.submit(identify, name) for name in stream_names}

    def list_shards(self, stream_name: str) -> list[Shard]:
        early = self._listings.pop(stream_name, None)
        return early.result() if early is not None else self._source.list_shards(stream_name)

    def list_shards_for_new_application(
        self, stream_name: str, initial_position: InitialPositionInStream
    ) -> list[Shard]:
        return self._source.list_shards_for_new_application(stream_name, initial_position)

    def stream_identifier(self, stream_name: str) -> StreamIdentifier:
        early = self._identities.pop(stream_name, None)
        return early.result() if early is not None else self._source.stream_identifier(stream_name)

    def describe_stream(self, stream_name: str) -> StreamDescription:
        early = self._identities.pop(stream_name, None)
        return early.result() if early is not None else self._source.describe_stream(stream_name)

    def shard_exists(self, stream_name: str, shard_id: str) -> bool:
        return self._source.shard_exists(stream_name, shard_id)


def _with_changes(snapshot: LeaseScan, created: Iterable[Lease] = (), deleted: Iterable[str] = ()) -> LeaseScan:
    """Pure: the snapshot after this step's own creations and deletions."""
    gone = set(deleted)
    kept = tuple(lease for lease in snapshot.leases if lease.lease_key not in gone)
    return LeaseScan(kept + tuple(created), snapshot.corrupt)


def _scan(store: LeaseStore) -> LeaseScan:
    scan = store.scan_leases()
    for error in scan.corrupt:
        log.warning("skipping an unreadable lease-table item: %s", error)
    return scan


def sync_streams(
    stream_names: Sequence[str],
    config: ConsumerConfig,
    store: LeaseStore,
    source: ShardSource,
    state: CoordinatorStateStore,
    clock_millis: Callable[[], int] = lambda: int(time.time() * 1000),
    awaiting_visibility: AwaitingVisibility | None = None,
) -> ShardSyncReport:
    """One full shard sync of every configured stream (no auditor involved). `awaiting_visibility`
    tells the cleanup which leases' committed batches may not be visible in the sink yet; without it
    (a sync that knows no sink), no lease carrying a record of committed batches is deleted."""
    if not stream_names:
        raise ValueError("at least one stream is needed")
    multi_stream = is_multi_stream(config, stream_names)
    with ThreadPoolExecutor(max_workers=min(len(stream_names), _LISTINGS_AT_ONCE)) as pool:
        source = _ListingsAhead(source, stream_names, multi_stream, pool)
        snapshot = _scan(store)
    require_matching_lease_mode(snapshot.leases, multi_stream)
    step = _StreamStep(config, store, source, state, clock_millis, awaiting_visibility)
    if not multi_stream:
        name = stream_names[0]
        consumed = remember_consumed_stream(state, source.describe_stream(name), table_has_leases=bool(snapshot.leases))
        result, cleanup, snapshot = step.run(name, name, LeaseKeyScheme(), snapshot)
        return ShardSyncReport(
            False, (result,), (cleanup,), consumed_stream=consumed, leases=snapshot.leases, corrupt=snapshot.corrupt
        )
    identifiers = [source.stream_identifier(name) for name in stream_names]
    outcomes = []
    for stream in identifiers:
        result, cleanup, snapshot = step.run(stream.stream_name, stream.serialize(), LeaseKeyScheme(stream), snapshot)
        outcomes.append((result, cleanup))
    cleaner = FormerStreamsCleaner(
        store,
        state,
        stream_exists_via(source.stream_identifier),
        clock_millis,
        config.former_streams_leases_deletion_strategy,
        config.wait_period_to_delete_former_streams_millis,
        awaiting_visibility,
    )
    former = cleaner.run(identifiers, snapshot.leases)
    deleted = (key for keys in former.deleted_leases.values() for key in keys)
    return ShardSyncReport(
        True,
        tuple(result for result, _ in outcomes),
        tuple(cleanup for _, cleanup in outcomes),
        former,
        leases=_with_changes(snapshot, deleted=deleted).leases,
        corrupt=snapshot.corrupt,
    )


def probe_load(
    leases: Sequence[Lease],
    stream_names: Sequence[str],
    retrieval: Retrieval,
    config: ConsumerConfig,
    state: CoordinatorStateStore,
    clock_millis: Callable[[], int] = lambda: int(time.time() * 1000),
) -> dict[str, float]:
    """The sync step's second look, in a round with work: probe the leases with no throughput yet
    and keep what the probes say for the round's assignment (docs/protocol.md §6). Returns them."""
    try:
        probes = probe_unmeasured_leases(leases, stream_names, retrieval, config, clock_millis)
    except Exception as error:  # a hint for the assignment, never a reason to fail the round
        log.warning("the load probe failed, so new leases keep the average as their load: %r", error, exc_info=True)
        return {}
    record_load_probes(state, probes, clock_millis())
    return probes
