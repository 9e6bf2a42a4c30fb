"""Holding the leader lock while writing: the fence of every control-plane writer (docs/protocol.md §5.4).

Whoever writes the lease table or the coordinator state for the application as a whole (shard sync
and cleanup, assignment, `leasectl` commands, the round's steps) does so inside `hold(lock)`: the
lock is acquired or resumed, heartbeaten from a background thread, and checked before every write
through the stores that `Leadership` hands out. The moment a heartbeat fails or our own clock says
the lock may have expired, the next write raises `LeadershipLostError` instead of being sent, so a
leader that lost its lock (paused, cut off, taken over) stops writing rather than racing its
successor. Only reads pass unchecked.

Stores built with `Leadership.retry_policy` also check the lock before each retry of a call, so a
call that keeps failing does not land minutes later. What is left is one attempt already in flight
when the lock is lost: it was checked while the lock was ours by a margin
(`LeaderLock.held_for_millis`), and the lease writes are themselves conditional.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from lease_core.errors import LeadershipLostError, LeaseCoreError
from lease_core.leader.leader_lock import LeaderLock, LockHeartbeat
from lease_core.retry import RetryPolicy
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.lease_store import LeaseStore

log = logging.getLogger(__name__)

# Everything else a store offers is a write, and is fenced: a method added later is fenced by default.
_LEASE_STORE_READS = frozenset(
    {
        "get_lease",
        "scan_leases",
        "list_leases",
        "list_lease_keys_for_owner",
        "list_leases_for_owner",
        "is_lease_table_empty",
    }
)
_STATE_STORE_READS = frozenset({"get"})


class Leadership:
    """A held leader lock and its heartbeat; hands out stores whose writes need the lock."""

    def __init__(self, lock: LeaderLock, heartbeat: LockHeartbeat, step: str) -> None:
        self.lock = lock
        self.heartbeat = heartbeat
        self.step = step

    @property
    def owner_name(self) -> str:
        return self.lock.owner_name

    @property
    def lost(self) -> bool:
        return self.heartbeat.lost.is_set() or not self.lock.is_held

    def ensure_held(self) -> None:
        """Raise `LeadershipLostError` unless the lock is still ours by our own clock."""
        if self.lost:
            raise LeadershipLostError(self.lock.owner_name, self.step)

    def retry_policy(self, policy: RetryPolicy) -> RetryPolicy:
        """`policy`, checking the lock before every retry: build the stores to fence with it."""
        return dataclasses.replace(policy, before_retry=self.ensure_held)

    def lease_store(self, store: LeaseStore) -> LeaseStore:
        return cast(LeaseStore, _Fenced(store, _LEASE_STORE_READS, self.ensure_held))

    def state_store(self, state: CoordinatorStateStore) -> CoordinatorStateStore:
        return cast(CoordinatorStateStore, _Fenced(state, _STATE_STORE_READS, self.ensure_held))


class _Fenced:
    """Delegates to `target`; calls of anything but the named reads first call `check`."""

    def __init__(self, target: Any, reads: frozenset[str], check: Callable[[], None]) -> None:
        self._target = target
        self._reads = reads
        self._check = check

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if name in self._reads or not callable(attribute):
            return attribute

        def fenced(*args: Any, **kwargs: Any) -> Any:
            self._check()
            return attribute(*args, **kwargs)

        return fenced


@contextmanager
def hold(lock: LeaderLock, step: str, *, acquire: bool, release: bool) -> Iterator[Leadership]:
    """Hold `lock` for `step`: acquire it (`acquire`) or resume it under our owner name, heartbeat it,
    and on leaving release it (`release`), whatever happened.

    Raises `LeadershipUnavailableError` when it cannot be had, naming the holder; and
    `LeadershipLostError` on leaving when it was lost after the step's last write, since the step's
    successor could not resume it either.
    """
    if not (lock.try_acquire() if acquire else lock.resume_as_owner()):
        raise lock.unavailable()
    try:
        with LockHeartbeat(lock) as heartbeat:
            leadership = Leadership(lock, heartbeat, step)
            yield leadership
        leadership.ensure_held()
    finally:
        if release:
            release_quietly(lock)


def release_quietly(lock: LeaderLock) -> None:
    """Release `lock` if it is ours; a failure is logged, never raised (the caller's outcome stands)."""
    if lock.record_version_number is None:
        return  # never acquired, or already lost
    try:
        if not lock.release():
            log.warning("the leader lock of %s was no longer ours to release", lock.owner_name)
    except LeaseCoreError as error:
        # The outcome of the step stands; a lock left behind is taken over once it is seen expired.
        log.warning("could not release the leader lock of %s: %s", lock.owner_name, error)
