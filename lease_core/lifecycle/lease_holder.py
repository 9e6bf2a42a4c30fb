"""Holding a lease while working on it: claim, heartbeat, checkpoint, and noticing the loss.

A worker's view of one lease (docs/protocol.md §2.4-2.5). `HeldLease` keeps the value this
worker last wrote and serialises every write to it, so its counter is always the latest this worker
produced. A lost condition, or no successful renewal for a whole lease duration, means the lease is
lost: every later write raises `LeaseLostError`, and the caller stops reading the shard.

Fencing per attempt. Two attempts of one slot share its worker id as owner (an Airflow retry while
the failed try's driver still runs, an executor Spark gave up on whose Python worker goes on), so
the owner cannot tell them apart. Each `HeldLease` therefore draws a claim token; the claim stores
it, and every later write of the attempt is conditional on it as well as on the counter. An attempt
never takes over anything another attempt wrote: whatever it adopts carries its own token.

Spurious-failure recovery (§2.4): a write whose response never arrived may have been applied, and
then its retry loses the counter condition against our own write. That is accepted only when the
store says the write was indeed sent again after an unknown outcome (`WriteResult.retried`), and
the stored item carries our token. Then a renewal counts as successful when the stored item has
our owner and exactly our counter + 1 (KCL's rule); a checkpoint write counts as applied when the
stored item shows exactly what we wrote, at our counter + 1.

`LeaseHeartbeat` renews every held lease at the renewer interval on a background thread.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from lease_core.errors import LeaseCoreError, LeaseLostError
from lease_core.model.lease import AgedOutRange, Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.store.lease_store import LeaseStore, WriteResult

log = logging.getLogger(__name__)

T = TypeVar("T")


def monotonic_millis() -> int:
    return time.monotonic_ns() // 1_000_000


class HeldLease:
    """One lease this worker holds; thread-safe (the heartbeat and the reading thread share it)."""

    def __init__(
        self,
        store: LeaseStore,
        lease: Lease,
        lease_duration_millis: int,
        clock_millis: Callable[[], int] = monotonic_millis,
        claim_token: str | None = None,
    ) -> None:
        if lease.lease_owner is None:
            raise ValueError(f"lease {lease.lease_key!r} has no owner; only an owned lease can be held")
        self._store = store
        self._lease = lease
        # Unique to this attempt; a caller may prefix it with who it is, for operators reading the table.
        self.claim_token = f"{claim_token or 'attempt'}/{secrets.token_hex(8)}"
        self._duration = lease_duration_millis
        self._clock = clock_millis
        self._lock = threading.Lock()
        self._renewed_at: int | None = None
        self._lost_reason: str | None = None

    @property
    def lease_key(self) -> str:
        return self._lease.lease_key

    @property
    def lease(self) -> Lease:
        """The stored value as of this worker's last write."""
        with self._lock:
            return self._lease

    @property
    def lost_reason(self) -> str | None:
        with self._lock:
            self._expire_locked()
            return self._lost_reason

    @property
    def is_lost(self) -> bool:
        return self.lost_reason is not None

    def claim(self) -> bool:
        """The first renewal, storing this attempt's claim token, made even though the lease has no
        local renewal time yet (§2.4). It fences any other attempt that held the lease. The lease's
        measurement is written as the holder was given it (`lease_core.metrics.throughput.claimed_measurement`)."""
        with self._lock:
            if self._renewed_at is not None:
                raise LeaseCoreError(f"lease {self._lease.lease_key!r} was already claimed by this attempt")
            result = self._store.claim_lease(self._lease, self.claim_token)
            return self._renewed(self._lease.replace(claim_token=self.claim_token), result, "claim")

    def renew(self, throughput_kbps: float | None = None, read_through_millis: int | None = None) -> bool:
        """Heartbeat; with `throughput_kbps`, also store the lease's throughput (§2.1) and the data
        time `read_through_millis` it was measured through. False once lost."""
        with self._lock:
            if self._expire_locked():
                return False
            if self._renewed_at is None:
                self._lose_locked("renewed before it was claimed: claim() must succeed first")
                return False
            local = self._lease
            if throughput_kbps is not None:
                # A measurement of the holder's own: whatever a claim stood in for it is settled.
                local = local.replace(
                    throughput_kbps=throughput_kbps, read_through_millis=read_through_millis, measured_before_claim=None
                )
            return self._renewed(local, self._store.renew_lease(local), "renew")

    def renew_if_due(self, interval_millis: int) -> bool | None:
        """The heartbeat's renewal: None when the lease is lost, or when this attempt's last applied
        write (a claim, a renewal, a prepare or a commit: each raised the counter) is younger than
        `interval_millis`, so that it needs no renewal yet; else `renew()`'s answer."""
        with self._lock:
            if self._expire_locked():
                return None
            if self._renewed_at is not None and self._clock() - self._renewed_at < interval_millis:
                return None
        return self.renew()

    def fenced(self, write: Callable[[Lease], T]) -> T:
        """Run `write` with the current value while no renewal or checkpoint of this lease can run.

        For a write of its own that is conditional on the held value (`lease_writes.create_children`):
        the counter it sees is the latest this attempt wrote. A `LeaseLostError` it raises marks the
        lease lost.
        """
        with self._lock:
            self._raise_if_lost()
            try:
                return write(self._lease)
            except LeaseLostError as error:
                self._lose_locked(error.reason)
                raise

    def _renewed(self, local: Lease, result: WriteResult, what: str) -> bool:
        if result.applied or _renewal_recovered(local, result):
            self._adopt(result.lease)
            return True
        self._lose_locked(_why_lost(what, result, local.claim_token))
        return False

    def prepare(
        self, value: ExtendedSequenceNumber, state: bytes | None, losses: frozenset[AgedOutRange] = frozenset()
    ) -> Lease:
        """Record `value` (and `state`) as this lease's pending checkpoint (§2.6); `losses` are the
        retention losses met before it, kept on the lease until a round report names them."""
        return self._update(lambda lease: lease.with_pending_checkpoint(value, state), "prepare", losses)

    def commit(
        self,
        value: ExtendedSequenceNumber,
        record: str | None = None,
        losses: frozenset[AgedOutRange] = frozenset(),
    ) -> Lease:
        """Checkpoint at `value`, clearing the pending checkpoint (§2.5); `record` is the sink's record
        of the committed batches (`Lease.committed_batch`); `losses` as for `prepare`."""
        return self._update(lambda lease: lease.with_checkpoint(value, record), "checkpoint", losses)

    def require_held(self) -> Lease:
        """The current value; raises `LeaseLostError` when the lease is lost or locally expired."""
        with self._lock:
            self._raise_if_lost()
            return self._lease

    def mark_lost(self, reason: str) -> None:
        with self._lock:
            self._lose_locked(reason)

    def _update(self, change: Callable[[Lease], Lease], what: str, losses: frozenset[AgedOutRange]) -> Lease:
        with self._lock:
            self._raise_if_lost()
            intended = change(self._lease)
            # A DynamoDB error propagates and leaves the local value as it was (§2.5).
            result = self._store.update_lease(intended, losses)
            if result.applied or _update_recovered(intended, result):
                self._adopt(result.lease)
                return self._lease
            self._lose_locked(_why_lost(what, result, intended.claim_token))
            self._raise_if_lost()
            raise AssertionError("unreachable: a lost lease raised above")

    def _adopt(self, stored: Lease | None) -> None:
        if stored is None:  # pragma: no cover - an applied write always returns the item
            raise LeaseCoreError(f"lease {self._lease.lease_key!r}: the store returned no item for an applied write")
        self._lease = stored
        # Every applied write raised the counter, so it is as good a heartbeat as a renewal.
        self._renewed_at = self._clock()

    def _expire_locked(self) -> bool:
        """Whether the lease is lost, marking it lost when the last renewal is older than the duration."""
        if self._lost_reason is None and self._renewed_at is not None:
            silent_for = self._clock() - self._renewed_at
            if silent_for > self._duration:
                self._lost_reason = f"no successful renewal for {silent_for} ms (lease duration {self._duration} ms)"
        return self._lost_reason is not None

    def _lose_locked(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason
            log.warning("lease %s lost: %s", self._lease.lease_key, reason)

    def _raise_if_lost(self) -> None:
        if self._expire_locked():
            raise LeaseLostError(self._lease.lease_key, self._lost_reason or "lost")
        if self._renewed_at is None:
            raise LeaseLostError(self._lease.lease_key, "never claimed: claim() must succeed before writing")


def _renewal_recovered(local: Lease, result: WriteResult) -> bool:
    """Our own renewal, applied although its answer was lost: only for a request sent again."""
    stored = result.lease
    return (
        result.retried
        and stored is not None
        and stored.claim_token == local.claim_token
        and stored.actual_owner == local.actual_owner
        and stored.lease_counter == local.lease_counter + 1
    )


def _update_recovered(intended: Lease, result: WriteResult) -> bool:
    """Our own checkpoint write, applied although its answer was lost: only for a request sent again."""
    stored = result.lease
    return (
        result.retried
        and stored is not None
        and stored.claim_token == intended.claim_token
        and stored.lease_counter == intended.lease_counter + 1
        and stored.lease_owner == intended.lease_owner
        and stored.checkpoint_owner == intended.checkpoint_owner
        and stored.checkpoint == intended.checkpoint
        and stored.pending_checkpoint == intended.pending_checkpoint
        and stored.pending_checkpoint_state == intended.pending_checkpoint_state
        and stored.committed_batch == intended.committed_batch
    )


def _why_lost(what: str, result: WriteResult, local_token: str | None) -> str:
    stored = result.lease
    if stored is None:
        return f"the {what} found the lease deleted"
    if stored.is_in_handoff:
        return (
            f"the {what} condition failed: the lease is being handed from {stored.checkpoint_owner} "
            f"to {stored.lease_owner}"
        )
    if stored.claim_token is not None and stored.claim_token != local_token:
        return (
            f"the {what} condition failed: the table has owner {stored.lease_owner or '(none)'} at counter "
            f"{stored.lease_counter}, claimed by another attempt ({stored.claim_token})"
        )
    return (
        f"the {what} condition failed: the table has owner {stored.lease_owner or '(none)'} "
        f"at counter {stored.lease_counter}"
    )


class LeaseHeartbeat:
    """Renews the held leases every `interval_millis` on a daemon thread (§2.4), until stopped.

    A lease that this attempt wrote within the interval (a batch's prepare or commit raised its
    counter) is not renewed at that tick: the write was as good a heartbeat, and a renewal that waited
    behind it would only add a write. A stopped heartbeat starts no renewal of the pass in progress.
    A renewal that raises (DynamoDB unreachable after every retry) is logged and tried again at the
    next tick; if that goes on for a whole lease duration the lease expires locally and is lost.
    """

    def __init__(self, leases: Iterable[HeldLease], interval_millis: int, max_threads: int = 20) -> None:
        if interval_millis <= 0:
            raise ValueError(f"interval_millis must be positive, got {interval_millis}")
        self._leases = {held.lease_key: held for held in leases}
        self._interval_millis = interval_millis
        self._interval = interval_millis / 1000.0
        self._max_threads = max_threads
        self._mutex = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.failures = 0

    def add(self, held: HeldLease) -> None:
        """Renew `held` too from the next tick on (a lease taken up while the others are worked)."""
        with self._mutex:
            self._leases[held.lease_key] = held

    def release(self, held: HeldLease) -> None:
        """Stop renewing `held` (its work is done; the lease stays with its owner)."""
        with self._mutex:
            self._leases.pop(held.lease_key, None)

    def renew_all(self) -> None:
        with self._mutex:
            held = list(self._leases.values())
        if not held:
            return
        with ThreadPoolExecutor(max_workers=min(self._max_threads, len(held)), thread_name_prefix="renewer") as pool:
            outcomes = [outcome for outcome in pool.map(self._renew, held) if outcome is not None]
        with self._mutex:
            self.renewals += sum(outcomes)
            self.failures += len(outcomes) - sum(outcomes)

    def start(self) -> LeaseHeartbeat:
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> LeaseHeartbeat:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            self.renew_all()

    def _renew(self, held: HeldLease) -> bool | None:
        """`held.renew_if_due`; None for a renewal not made (not due, lost, or the heartbeat stopped)."""
        if self._stopped.is_set():
            return None
        try:
            return held.renew_if_due(self._interval_millis)
        except LeaseCoreError as error:
            log.warning("renewing lease %s failed: %s", held.lease_key, error)
            return False
