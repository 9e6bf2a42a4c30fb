"""A worker holding a lease: claim, heartbeat, checkpoint, loss (docs/protocol.md §2.4-2.5), on both stores."""

from __future__ import annotations

import dataclasses
import time

import pytest

from lease_core.errors import LeaseLostError
from lease_core.lifecycle.lease_holder import HeldLease, LeaseHeartbeat
from lease_core.model.lease import AgedOutRange, Lease
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.store.lease_store import ConditionalLeaseStore, WriteResult
from lease_core.store.memory_store import InMemoryLeaseStore
from tests.support.stores import dynamodb_store

ESN = ExtendedSequenceNumber
KEY = "shardId-000000000000"
DURATION = 10_000


@pytest.fixture(params=["memory", "dynamodb"])
def store(request: pytest.FixtureRequest, unique_name: str) -> ConditionalLeaseStore:
    if request.param == "memory":
        return InMemoryLeaseStore()
    return dynamodb_store(request.getfixturevalue("moto_endpoint"), unique_name)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def assigned(store: ConditionalLeaseStore, owner: str = "app-worker-0") -> Lease:
    store.create_lease_if_not_exists(Lease(KEY, checkpoint=TRIM_HORIZON))
    lease = store.get_lease(KEY, consistent=True)
    assert lease is not None
    result = store.assign_lease(lease, owner)
    assert result.applied and result.lease is not None
    return result.lease


def stored(store: ConditionalLeaseStore) -> Lease:
    lease = store.get_lease(KEY, consistent=True)
    assert lease is not None
    return lease


def held(store: ConditionalLeaseStore, clock: FakeClock | None = None) -> HeldLease:
    holder = HeldLease(store, assigned(store), DURATION, clock or FakeClock())
    assert holder.claim()
    return holder


def test_a_claim_is_a_counter_conditional_renewal(store):
    lease = assigned(store)
    holder = HeldLease(store, lease, DURATION, FakeClock())
    assert holder.claim() is True
    assert stored(store).lease_counter == lease.lease_counter + 1
    assert holder.lease == stored(store)


def test_a_claim_fails_when_someone_wrote_the_lease_since_it_was_read(store):
    lease = assigned(store)
    # Another attempt of the same slot claimed and renewed it. (A single write by the same owner is
    # indistinguishable from our own write whose response was lost: KCL's rule accepts that one.)
    store.renew_lease(store.renew_lease(lease).lease)  # type: ignore[arg-type]
    holder = HeldLease(store, lease, DURATION, FakeClock())
    assert holder.claim() is False
    assert "condition failed" in (holder.lost_reason or "")


def test_prepare_then_commit_moves_the_checkpoint_and_clears_the_pending_one(store):
    holder = held(store)
    holder.prepare(ESN("100"), b"batch")
    assert (stored(store).pending_checkpoint, stored(store).pending_checkpoint_state) == (ESN("100"), b"batch")
    holder.commit(ESN("100"))
    after = stored(store)
    assert (after.checkpoint, after.pending_checkpoint, after.pending_checkpoint_state) == (ESN("100"), None, None)


@pytest.mark.parametrize("write", ["renew", "prepare", "commit"])
def test_after_the_leader_assigns_the_lease_elsewhere_every_write_of_the_old_holder_fails(store, write):
    holder = held(store)
    assert store.assign_lease(stored(store), "app-worker-1").applied
    if write == "renew":
        assert holder.renew() is False
    else:
        with pytest.raises(LeaseLostError, match="app-worker-1"):
            holder.prepare(ESN("5"), None) if write == "prepare" else holder.commit(ESN("5"))
    assert holder.is_lost
    assert stored(store).lease_owner == "app-worker-1"
    assert stored(store).checkpoint == TRIM_HORIZON


def test_a_lease_without_a_renewal_for_a_whole_duration_is_lost_without_writing(store):
    clock = FakeClock()
    holder = held(store, clock)
    counter = stored(store).lease_counter
    clock.now += DURATION + 1
    assert holder.is_lost
    assert holder.renew() is False
    with pytest.raises(LeaseLostError, match="no successful renewal"):
        holder.commit(ESN("7"))
    assert stored(store).lease_counter == counter


def test_a_successful_write_counts_as_a_heartbeat(store):
    clock = FakeClock()
    holder = held(store, clock)
    clock.now += DURATION - 1
    holder.prepare(ESN("9"), None)
    clock.now += DURATION - 1
    assert not holder.is_lost


def test_writing_before_claiming_is_refused(store):
    holder = HeldLease(store, assigned(store), DURATION, FakeClock())
    with pytest.raises(LeaseLostError, match="never claimed"):
        holder.commit(ESN("1"))


def test_a_lease_being_handed_off_is_reported_as_lost_with_both_owners(store):
    holder = held(store)
    assert store.initiate_graceful_handoff(stored(store), "app-worker-2").applied
    assert holder.renew() is False
    assert "handed from app-worker-0 to app-worker-2" in (holder.lost_reason or "")


def test_the_final_renewal_stores_the_lease_throughput(store):
    holder = held(store)
    assert holder.renew(throughput_kbps=12.5)
    assert stored(store).throughput_kbps == 12.5


def test_an_unowned_lease_cannot_be_held(store):
    store.create_lease_if_not_exists(Lease(KEY))
    with pytest.raises(ValueError, match="no owner"):
        HeldLease(store, stored(store), DURATION)


class ResponseLostStore:
    """Applies each write, then retries it as a client does after a lost response: the caller sees
    only the retry's outcome (a lost condition against its own write), marked as sent again."""

    def __init__(self, store: ConditionalLeaseStore) -> None:
        self._store = store

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def claim_lease(self, lease: Lease, token: str) -> WriteResult:
        assert self._store.claim_lease(lease, token).applied
        return dataclasses.replace(self._store.claim_lease(lease, token), retried=True)

    def renew_lease(self, lease: Lease) -> WriteResult:
        assert self._store.renew_lease(lease).applied
        return dataclasses.replace(self._store.renew_lease(lease), retried=True)

    def update_lease(self, lease: Lease, losses: frozenset[AgedOutRange] = frozenset()) -> WriteResult:
        assert self._store.update_lease(lease, losses).applied
        return dataclasses.replace(self._store.update_lease(lease, losses), retried=True)


def test_a_renewal_whose_response_was_lost_is_recognised_as_applied(store):
    lease = assigned(store)
    holder = HeldLease(ResponseLostStore(store), lease, DURATION, FakeClock())  # type: ignore[arg-type]
    assert holder.claim() is True
    assert holder.lease.lease_counter == stored(store).lease_counter == lease.lease_counter + 1


@pytest.mark.parametrize("write", ["prepare", "commit"])
def test_a_checkpoint_write_whose_response_was_lost_is_recognised_as_applied(store, write):
    lease = assigned(store)
    holder = HeldLease(ResponseLostStore(store), lease, DURATION, FakeClock())  # type: ignore[arg-type]
    assert holder.claim()
    after = holder.prepare(ESN("42"), b"s") if write == "prepare" else holder.commit(ESN("42"))
    assert after == stored(store)
    assert not holder.is_lost


def test_the_heartbeat_renews_every_interval_until_the_lease_is_released(store):
    holder = HeldLease(store, assigned(store), DURATION)  # the real clock: renewals fall due as time passes
    assert holder.claim()
    before = stored(store).lease_counter
    with LeaseHeartbeat([holder], interval_millis=20) as heartbeat:
        deadline = time.monotonic() + 5
        while stored(store).lease_counter < before + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        heartbeat.release(holder)
        released_at = stored(store).lease_counter
        time.sleep(0.1)
    assert released_at >= before + 3
    assert stored(store).lease_counter <= released_at + 1  # at most one renewal already in flight


def test_the_heartbeat_skips_a_lease_written_within_the_interval_and_renews_it_once_it_is_due(store):
    """A checkpoint write raised the counter like a renewal: the heartbeat need not write it again, and
    no renewal waits behind a write in progress to renew a lease whose batch just landed."""
    clock = FakeClock()
    holder = held(store, clock)
    heartbeat = LeaseHeartbeat([holder], interval_millis=1000)
    clock.now += 400
    holder.commit(ESN("7"))
    clock.now += 700  # 1,100 ms after the claim, 700 ms after the commit
    counter = stored(store).lease_counter
    heartbeat.renew_all()
    assert (stored(store).lease_counter, heartbeat.renewals) == (counter, 0)
    clock.now += 300  # the commit is an interval old
    heartbeat.renew_all()
    assert (stored(store).lease_counter, heartbeat.renewals) == (counter + 1, 1)


def test_a_stopped_heartbeat_starts_no_renewal_its_pass_has_not_begun(store):
    clock = FakeClock()
    holders = [held(store, clock)]
    heartbeat = LeaseHeartbeat(holders, interval_millis=1000)
    clock.now += 5_000
    heartbeat.stop()
    counter = stored(store).lease_counter
    heartbeat.renew_all()
    assert (stored(store).lease_counter, heartbeat.renewals) == (counter, 0)


def test_the_heartbeat_skips_lost_leases(store):
    holder = held(store)
    holder.mark_lost("test")
    heartbeat = LeaseHeartbeat([holder], interval_millis=1000)
    counter = stored(store).lease_counter
    heartbeat.renew_all()
    assert (stored(store).lease_counter, heartbeat.renewals) == (counter, 0)


# --- fencing per attempt (issue 13, hole 1): two attempts of one slot share its owner name ----------


def twin_attempts(store: ConditionalLeaseStore) -> tuple[HeldLease, HeldLease]:
    """Attempt 0 claims; attempt 1 of the same slot (same owner) reads the lease after it and claims."""
    first = HeldLease(store, assigned(store), DURATION, FakeClock(), claim_token="app-worker-0/attempt-0")
    assert first.claim()
    second = HeldLease(store, stored(store), DURATION, FakeClock(), claim_token="app-worker-0/attempt-1")
    assert second.claim()
    return first, second


def test_a_newer_attempts_claim_fences_the_older_one_whose_next_renewal_fails_naming_the_other_attempt(store):
    first, second = twin_attempts(store)
    # The stored item now has our owner at exactly our counter + 1: KCL's rule alone would take it for
    # our own renewal whose answer was lost and adopt the other attempt's state.
    assert stored(store).lease_counter == first.lease.lease_counter + 1
    assert first.renew() is False
    assert "claimed by another attempt" in (first.lost_reason or "")
    assert second.claim_token in (first.lost_reason or "")
    with pytest.raises(LeaseLostError):
        first.prepare(ESN("20"), b"(C, r20]")
    assert stored(store).pending_checkpoint is None
    assert second.renew()


def test_a_claim_never_adopts_a_checkpoint_another_attempt_committed_since_the_lease_was_read(store):
    older = HeldLease(store, assigned(store), DURATION, FakeClock(), claim_token="attempt-0")
    assert older.claim()
    read_by_newer = stored(store)
    older.commit(ESN("30"))  # exactly one write since the newer attempt read the lease
    newer = HeldLease(store, read_by_newer, DURATION, FakeClock(), claim_token="attempt-1")
    assert newer.claim() is False
    assert newer.lease == read_by_newer, "it keeps its own view (and the slot reads the lease again)"
    assert "claimed by another attempt" in (newer.lost_reason or "")


def test_a_lost_answer_is_not_assumed_for_a_write_that_was_sent_once(store):
    first, _second = twin_attempts(store)
    first_view = first.lease
    # Even were the stored item exactly what the older attempt's renewal would have written (owner,
    # counter + 1), a request sent once cannot have been applied unseen.
    result = store.renew_lease(first_view)
    assert not result.applied and not result.retried
    assert first.renew() is False


def test_a_retried_write_is_not_taken_for_ours_when_another_attempt_claimed_in_between(store):
    lease = assigned(store)
    older = HeldLease(store, lease, DURATION, FakeClock(), claim_token="attempt-0")
    assert older.claim()
    newer = HeldLease(store, stored(store), DURATION, FakeClock(), claim_token="attempt-1")
    assert newer.claim()
    lossy = HeldLease(ResponseLostStore(store), stored(store), DURATION, FakeClock())  # type: ignore[arg-type]
    # A retried claim by a third attempt is recognised as its own: the stored token is its token.
    assert lossy.claim()
    assert older.renew() is False and newer.renew() is False
