"""Which closing parents other slots of a round are still reading: what an idle slot waits on.

A slot that has run out of work does not have to end its task while another slot of the same round
is still reading a closed shard: when that parent reaches SHARD_END its children become readable, and
the idle slot can take one up (owner-conditional, so exactly one slot gets each) instead of leaving
every child to the slot that ended the parent. A slot whose own children wait on a parent another
slot reads waits the same way, instead of giving them up for a round.

A parent counts as being read while a slot of this round other than the watcher owns it, its own
parents have finished (a lease that waits on its parents is renewed, not read), and its lease
counter keeps moving: its holder renews it while it works, so a counter that stood still for
`stale_after_seconds` (a failover time: KCL's expiry) means nobody reads it any more in this round.
A parent once let go is never watched again, so a slot's wait always ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from lease_core.lifecycle.lease_lifecycle import parents_have_finished
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.store.lease_store import LeaseStore


def closing_lease_keys(
    leases: Iterable[Lease], closed_keys: Collection[str], slots: Collection[str]
) -> tuple[str, ...]:
    """Leases of closed shards that a slot of this round holds and has not read to SHARD_END."""
    return tuple(
        sorted(
            lease.lease_key
            for lease in leases
            if lease.lease_key in closed_keys and not lease.is_at_shard_end and lease.lease_owner in slots
        )
    )


@dataclass
class _Seen:
    counter: int
    since: float


class ParentWatch:
    """Watches parent leases for the moment they end; lets go of one nobody reads any more.

    `poll` reads every watched lease once (strongly consistent) and returns those that reached
    SHARD_END since the last poll; `in_flight` says whether any watched parent is still being read.
    """

    def __init__(
        self,
        watcher: str,
        slots: Collection[str],
        stale_after_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._watcher = watcher
        self._slots = frozenset(slots)
        self._stale_after = stale_after_seconds
        self._clock = clock
        self._watched: dict[str, _Seen | None] = {}
        self._let_go: set[str] = set()
        self._unblocked: set[str] = set()

    def watch(self, lease_keys: Iterable[str]) -> None:
        for key in lease_keys:
            if key not in self._let_go:
                self._watched.setdefault(key, None)

    def stop(self) -> None:
        """Watch nothing any more."""
        self._let_go.update(self._watched)
        self._watched.clear()

    @property
    def in_flight(self) -> bool:
        return bool(self._watched)

    def poll(self, store: LeaseStore) -> list[Lease]:
        ended = []
        for key in list(self._watched):
            lease = store.get_lease(key, consistent=True)
            if lease is not None and lease.is_at_shard_end:
                ended.append(lease)
            if lease is None or not self._read_elsewhere(store, key, lease):
                del self._watched[key]
                self._let_go.add(key)
        return ended

    def _read_elsewhere(self, store: LeaseStore, key: str, lease: Lease) -> bool:
        if lease.is_at_shard_end or lease.lease_owner == self._watcher or lease.lease_owner not in self._slots:
            return False
        if not self._parents_done(store, lease):
            return False
        now, seen = self._clock(), self._watched[key]
        if seen is None or seen.counter != lease.lease_counter:
            self._watched[key] = _Seen(lease.lease_counter, now)
            return True
        return now - seen.since < self._stale_after

    def _parents_done(self, store: LeaseStore, lease: Lease) -> bool:
        """Whether the lease's own parents have finished (once true, it stays true: cached)."""
        if lease.lease_key in self._unblocked or not lease.parent_shard_ids:
            return True
        stream = StreamIdentifier.parse(lease.stream_name) if lease.is_multi_stream and lease.stream_name else None
        if not parents_have_finished(store, lease, LeaseKeyScheme(stream)):
            return False
        self._unblocked.add(lease.lease_key)
        return True
