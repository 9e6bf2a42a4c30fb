"""Shard sync, the I/O side: list shards, plan (lease_core.sync.planner), create leases parents first."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from lease_core.config.settings import ConsumerConfig, parse_iso_timestamp
from lease_core.errors import InconsistentShardsError
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.shards import InitialPosition, InitialPositionInStream, Shard
from lease_core.retrieval.shard_source import ShardSource, hash_space_gap
from lease_core.store.lease_store import LeaseScan, LeaseStore
from lease_core.sync.planner import inconsistent_shards, plan_for_empty_table, plan_for_existing_leases

log = logging.getLogger(__name__)


def initial_position_of(config: ConsumerConfig) -> InitialPositionInStream:
    timestamp: datetime | None = None
    if config.initial_position_in_stream == InitialPosition.AT_TIMESTAMP.value:
        assert config.initial_position_timestamp is not None  # ConsumerConfig validates this pairing
        timestamp = parse_iso_timestamp(config.initial_position_timestamp)
    return InitialPositionInStream(InitialPosition(config.initial_position_in_stream), timestamp)


@dataclass(frozen=True)
class StreamSyncResult:
    """What one shard sync of one stream did.

    listing_incomplete: why the full listing was not trusted (its open shards leave a gap in the
    hash key space, or overlap); then the sync created nothing and cleanup must not run either.
    """

    stream_name: str
    table_was_empty: bool
    shards_listed: int
    created: tuple[str, ...]
    already_existed: tuple[str, ...]
    skipped_inconsistent: tuple[str, ...]
    # The full listing (None when the sync used the filtered listing of an empty table).
    full_listing: tuple[Shard, ...] | None = field(default=None, repr=False, compare=False)
    listing_incomplete: str | None = None
    # The leases this sync created, as written: the caller's snapshot of the table stays current without a scan.
    created_leases: tuple[Lease, ...] = field(default=(), repr=False, compare=False)
    # The lease keys of the shards the listing says are closed (listed with an EndingSequenceNumber).
    closed_lease_keys: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def to_dict(self) -> dict[str, object]:
        """JSON-serialisable, without the listing, the created leases and the closed shards themselves."""
        left_out = ("full_listing", "created_leases", "closed_lease_keys")
        return {key: value for key, value in asdict(self).items() if key not in left_out}


class ShardSyncer:
    """KCL's ShardSyncTask for one stream: one full sync now, whatever the auditor thinks."""

    def __init__(
        self,
        store: LeaseStore,
        source: ShardSource,
        initial_position: InitialPositionInStream,
        ignore_unexpected_child_shards: bool = False,
        clock_millis: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        """`clock_millis`: the wall clock a lease created at LATEST is pinned at (`Lease.pinned_at_latest`)."""
        self.store = store
        self.source = source
        self.initial_position = initial_position
        self.ignore_unexpected_child_shards = ignore_unexpected_child_shards
        self.clock_millis = clock_millis

    def sync(
        self, stream_name: str, scheme: LeaseKeyScheme = LeaseKeyScheme(), snapshot: LeaseScan | None = None
    ) -> StreamSyncResult:
        """`snapshot`: the lease table as the caller just scanned it (one scan serves a whole step);
        None scans it here. An unreadable item counts as a lease: the table is not empty."""
        snapshot = self.store.scan_leases() if snapshot is None else snapshot
        leases = snapshot.leases
        table_was_empty = not leases and not snapshot.corrupt
        shards = (
            self.source.list_shards_for_new_application(stream_name, self.initial_position)
            if table_was_empty
            else self.source.list_shards(stream_name)
        )
        inconsistent = inconsistent_shards(shards)
        if inconsistent and not self.ignore_unexpected_child_shards:
            # Checked before the leases are even listed, as KCL does: the sync must not half-run.
            raise InconsistentShardsError(stream_name, tuple(sorted(inconsistent)))
        incomplete = None if table_was_empty else self._incomplete_listing_reason(stream_name, shards, inconsistent)
        created: list[Lease] = []
        existed: list[str] = []
        # Parents first: a crash part-way never leaves a child without its parent.
        planned = () if incomplete else self._plan(shards, table_was_empty, leases, inconsistent, scheme)
        now = self.clock_millis()
        for lease in (lease.pinned_at_latest(now) for lease in planned):
            if self.store.create_lease_if_not_exists(lease):
                created.append(lease)
            else:
                existed.append(lease.lease_key)
        return StreamSyncResult(
            stream_name=stream_name,
            table_was_empty=table_was_empty,
            shards_listed=len(shards),
            created=tuple(lease.lease_key for lease in created),
            already_existed=tuple(existed),
            skipped_inconsistent=tuple(sorted(inconsistent)),
            full_listing=None if table_was_empty else tuple(shards),
            listing_incomplete=incomplete,
            created_leases=tuple(created),
            closed_lease_keys=frozenset(scheme.lease_key(shard.shard_id) for shard in shards if not shard.is_open),
        )

    def _plan(
        self,
        shards: list[Shard],
        table_was_empty: bool,
        leases: tuple[Lease, ...],
        inconsistent: frozenset[str],
        scheme: LeaseKeyScheme,
    ) -> list[Lease]:
        position = self.initial_position.position
        if table_was_empty:
            consistent = [shard for shard in shards if shard.shard_id not in inconsistent]
            return plan_for_empty_table(consistent, position, scheme)
        leased = {scheme.shard_id_of(lease) for lease in leases if scheme.owns(lease)}
        return plan_for_existing_leases(shards, leased, position, inconsistent, scheme)

    @staticmethod
    def _incomplete_listing_reason(stream_name: str, shards: list[Shard], inconsistent: frozenset[str]) -> str | None:
        """Why the full listing cannot be the stream's: its open shards must tile the hash key space.

        A partial answer (a page lost, an eventually consistent read during a reshard) leaves a gap
        or an overlap; planning from it would create leases at the initial position for shards
        whose ancestors it missed, and cleanup would take leases of unlisted shards for garbage.
        Children of open parents are left out (they overlap their parent by design, §3.3).
        """
        gap = hash_space_gap(shard for shard in shards if shard.is_open and shard.shard_id not in inconsistent)
        if gap is not None:
            log.warning(
                "stream %s: the shard listing's open shards do not cover the hash key space (%s); "
                "nothing is created or deleted for this stream this round",
                stream_name,
                gap,
            )
        return gap
