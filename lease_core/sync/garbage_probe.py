"""KCL's garbage check (docs/protocol.md §3.10) in rounds: asking Kinesis about the shards a listing lacks.

A shard missing from the full listing is only a candidate: a listing can be partial or stale, and a
lease deleted on its word would be recreated by the next sync at the initial position, skipping the
records left unread. So Kinesis is asked about each such shard alone (`ShardSource.shard_exists`),
and only its "no such shard" makes a lease garbage.

KCL asks at most every `garbageLeaseCleanupIntervalMillis`; here the time of a stream's last pass
that asked is kept in the coordinator-state table (`GarbageLeaseCleanup:<stream>`, written with
`update_record`), so the interval holds across rounds. Unlike KCL, whose stopwatch restarts only
when a pass deleted something, every pass that asked restarts it: a shard a listing keeps missing
costs one probe per interval, not one per round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from lease_core.retrieval.shard_source import ShardSource
from lease_core.store.coordinator_state import CoordinatorStateStore, update_record
from lease_core.store.record_table import Record, whole_number

log = logging.getLogger(__name__)

RECORD_KEY_PREFIX = "GarbageLeaseCleanup:"
LAST_PASS_AT = "lastPassAt"


def garbage_pass_due(last_pass_millis: int | None, now_millis: int, interval_millis: int) -> bool:
    """Whether Kinesis may be asked again: never asked, or asked at least `interval_millis` ago."""
    return last_pass_millis is None or now_millis - last_pass_millis >= interval_millis


def _last_pass(record: Record | None) -> int | None:
    return whole_number(record, LAST_PASS_AT) if record is not None and LAST_PASS_AT in record else None


class GarbageProbe:
    """Asks Kinesis about unlisted shards, one stream at a time, at most once per interval."""

    def __init__(
        self,
        source: ShardSource,
        state: CoordinatorStateStore,
        clock_millis: Callable[[], int],
        interval_millis: int,
    ) -> None:
        self.source = source
        self.state = state
        self.clock_millis = clock_millis
        self.interval_millis = interval_millis

    @staticmethod
    def record_key(stream_key: str) -> str:
        return RECORD_KEY_PREFIX + stream_key

    def ask(self, stream_key: str, stream_name: str, shard_ids: Collection[str]) -> Mapping[str, bool]:
        """Shard id -> whether Kinesis still knows it, for each of `shard_ids`; empty when there is
        nothing to ask or the stream's last pass is less than the interval ago.

        `stream_key` is the stream name (single-stream) or the serialized stream identifier. The pass
        is recorded only once every answer is in, so a failing probe is retried next round.
        """
        if not shard_ids:
            return {}
        key = self.record_key(stream_key)
        now = self.clock_millis()
        last = _last_pass(self.state.get(key))
        if not garbage_pass_due(last, now, self.interval_millis):
            log.info(
                "stream %s: %d shard(s) missing from the listing; Kinesis is asked about them again "
                "after %d ms (garbage_lease_cleanup_interval_millis)",
                stream_key,
                len(shard_ids),
                (last or 0) + self.interval_millis - now,
            )
            return {}
        answers = {shard_id: self.source.shard_exists(stream_name, shard_id) for shard_id in sorted(shard_ids)}
        # Versioned, so a concurrent pass's time is never lost; the later of the two is kept.
        update_record(self.state, key, lambda record: {LAST_PASS_AT: max(now, _last_pass(record) or now)})
        return answers
