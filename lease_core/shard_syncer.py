"""Shard sync, the I/O side: list shards, plan (lease_core.shard_sync), create leases parents first."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from lease_core.config import ConsumerConfig, parse_iso_timestamp
from lease_core.errors import InconsistentShardsError
from lease_core.lease_store import LeaseStore
from lease_core.shard_source import ShardSource
from lease_core.shard_sync import LeaseKeyScheme, inconsistent_shards, plan_for_empty_table, plan_for_existing_leases
from lease_core.shards import InitialPosition, InitialPositionInStream, Shard


def initial_position_of(config: ConsumerConfig) -> InitialPositionInStream:
    timestamp: datetime | None = None
    if config.initial_position_in_stream == InitialPosition.AT_TIMESTAMP.value:
        assert config.initial_position_timestamp is not None  # ConsumerConfig validates this pairing
        timestamp = parse_iso_timestamp(config.initial_position_timestamp)
    return InitialPositionInStream(InitialPosition(config.initial_position_in_stream), timestamp)


@dataclass(frozen=True)
class StreamSyncResult:
    """What one shard sync of one stream did."""

    stream_name: str
    table_was_empty: bool
    shards_listed: int
    created: tuple[str, ...]
    already_existed: tuple[str, ...]
    skipped_inconsistent: tuple[str, ...]
    # The full listing (None when the sync used the filtered listing of an empty table).
    full_listing: tuple[Shard, ...] | None = field(default=None, repr=False, compare=False)


class ShardSyncer:
    """KCL's ShardSyncTask for one stream: one full sync now, whatever the auditor thinks."""

    def __init__(
        self,
        store: LeaseStore,
        source: ShardSource,
        initial_position: InitialPositionInStream,
        ignore_unexpected_child_shards: bool = False,
    ) -> None:
        self.store = store
        self.source = source
        self.initial_position = initial_position
        self.ignore_unexpected_child_shards = ignore_unexpected_child_shards

    def sync(self, stream_name: str, scheme: LeaseKeyScheme = LeaseKeyScheme()) -> StreamSyncResult:
        table_was_empty = self.store.is_lease_table_empty()
        shards = (
            self.source.list_shards_for_new_application(stream_name, self.initial_position)
            if table_was_empty
            else self.source.list_shards(stream_name)
        )
        inconsistent = inconsistent_shards(shards)
        if inconsistent and not self.ignore_unexpected_child_shards:
            # Checked before the leases are even listed, as KCL does: the sync must not half-run.
            raise InconsistentShardsError(stream_name, tuple(sorted(inconsistent)))
        position = self.initial_position.position
        if table_was_empty:
            consistent = [shard for shard in shards if shard.shard_id not in inconsistent]
            plan = plan_for_empty_table(consistent, position, scheme)
        else:
            leased = {scheme.shard_id_of(lease) for lease in self.store.list_leases() if scheme.owns(lease)}
            plan = plan_for_existing_leases(shards, leased, position, inconsistent, scheme)
        created, existed = [], []
        for lease in plan:  # parents first: a crash part-way never leaves a child without its parent
            (created if self.store.create_lease_if_not_exists(lease) else existed).append(lease.lease_key)
        return StreamSyncResult(
            stream_name=stream_name,
            table_was_empty=table_was_empty,
            shards_listed=len(shards),
            created=tuple(created),
            already_existed=tuple(existed),
            skipped_inconsistent=tuple(sorted(inconsistent)),
            full_listing=None if table_was_empty else tuple(shards),
        )
