"""The leader's shard-sync step of a round: sync every configured stream, then tidy the lease table.

Single-stream mode syncs one stream with bare shard-id lease keys. Multi-stream mode (more than one
stream, or `multi_stream = true`) keys leases by stream identifier, syncs each configured stream,
and applies the former-streams strategy to streams that are no longer configured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from lease_core.config import ConsumerConfig
from lease_core.errors import ConfigurationError
from lease_core.coordinator_state import CoordinatorStateStore
from lease_core.lease_lifecycle import CleanupOutcome, apply_cleanup, plan_lease_cleanup
from lease_core.lease_store import LeaseStore
from lease_core.shard_source import ShardSource
from lease_core.shard_sync import LeaseKeyScheme
from lease_core.shard_syncer import ShardSyncer, StreamSyncResult, initial_position_of
from lease_core.stream_tracking import FormerStreamsCleaner, FormerStreamsOutcome, stream_exists_via


@dataclass(frozen=True)
class ShardSyncReport:
    multi_stream: bool
    streams: tuple[StreamSyncResult, ...]
    cleanups: tuple[CleanupOutcome, ...]
    former_streams: FormerStreamsOutcome | None = None

    @property
    def created(self) -> tuple[str, ...]:
        return tuple(key for result in self.streams for key in result.created)

    @property
    def deleted(self) -> tuple[str, ...]:
        former = self.former_streams.deleted_leases.values() if self.former_streams else ()
        cleaned = (key for cleanup in self.cleanups for key in cleanup.deleted)
        return (*cleaned, *(key for keys in former for key in keys))

    @property
    def possibly_unread(self) -> tuple[str, ...]:
        """Leases deleted because their shard vanished before they reached SHARD_END: potential loss."""
        return tuple(key for cleanup in self.cleanups for key in cleanup.possibly_unread)

    def to_dict(self) -> dict[str, object]:
        return {
            "multi_stream": self.multi_stream,
            "streams": [asdict(result) for result in self.streams],
            "created": list(self.created),
            "deleted": list(self.deleted),
            "possibly_unread": list(self.possibly_unread),
            "former_streams_pending": dict(self.former_streams.pending) if self.former_streams else {},
        }


def is_multi_stream(config: ConsumerConfig, stream_names: Sequence[str]) -> bool:
    return config.multi_stream or len(stream_names) > 1


def _require_matching_lease_mode(store: LeaseStore, multi_stream: bool) -> None:
    """Refuse to sync a table whose leases were keyed in the other mode: the keys would not match
    the shards, and cleanup would take every lease for garbage."""
    for lease in store.list_leases():
        if lease.is_multi_stream != multi_stream:
            found = "multi-stream" if lease.is_multi_stream else "single-stream"
            raise ConfigurationError(
                "multi_stream",
                f"the lease table holds {found} leases (e.g. {lease.lease_key!r}) but this sync runs in "
                f"{'multi' if multi_stream else 'single'}-stream mode; set multi_stream = "
                f"{str(lease.is_multi_stream).lower()} (several --stream options also select multi-stream mode)",
            )


def sync_streams(
    stream_names: Sequence[str],
    config: ConsumerConfig,
    store: LeaseStore,
    source: ShardSource,
    state: CoordinatorStateStore,
    clock_millis: Callable[[], int] = lambda: int(time.time() * 1000),
) -> ShardSyncReport:
    """One full shard sync of every configured stream (no auditor involved)."""
    if not stream_names:
        raise ValueError("at least one stream is needed")
    multi_stream = is_multi_stream(config, stream_names)
    _require_matching_lease_mode(store, multi_stream)
    syncer = ShardSyncer(store, source, initial_position_of(config), config.ignore_unexpected_child_shards)

    def sync_and_clean(stream_name: str, scheme: LeaseKeyScheme) -> tuple[StreamSyncResult, CleanupOutcome]:
        result = syncer.sync(stream_name, scheme)
        plan = plan_lease_cleanup(
            store.list_leases(), result.full_listing, scheme, config.cleanup_leases_upon_shard_completion
        )
        return result, apply_cleanup(store, plan)

    if not multi_stream:
        result, cleanup = sync_and_clean(stream_names[0], LeaseKeyScheme())
        return ShardSyncReport(False, (result,), (cleanup,))
    identifiers = [source.stream_identifier(name) for name in stream_names]
    outcomes = [sync_and_clean(stream.stream_name, LeaseKeyScheme(stream)) for stream in identifiers]
    cleaner = FormerStreamsCleaner(
        store,
        state,
        stream_exists_via(source.stream_identifier),
        clock_millis,
        config.former_streams_leases_deletion_strategy,
        config.wait_period_to_delete_former_streams_millis,
    )
    return ShardSyncReport(
        True, tuple(result for result, _ in outcomes), tuple(cleanup for _, cleanup in outcomes), cleaner.run(identifiers)
    )
