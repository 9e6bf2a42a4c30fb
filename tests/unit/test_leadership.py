"""Holding the leader lock while writing: every write through a leadership's stores needs the lock."""

from __future__ import annotations

import inspect

import pytest

from lease_core.errors import LeadershipLostError, LeadershipUnavailableError
from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock
from lease_core.leader.leadership import hold
from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.store.lease_store import LeaseStore
from lease_core.store.memory_store import InMemoryLeaseStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


LEASE = 120_000


def round_lock(state: InMemoryCoordinatorStateStore, owner: str, clock: FakeClock | None = None) -> LeaderLock:
    return LeaderLock(state, owner, LEASE, LEASE // 4, monotonic_millis=clock or FakeClock())


def take_over(state: InMemoryCoordinatorStateStore, owner: str = "dag/run-B") -> None:
    """Another round replaces the lock (here by deleting the record first: its takeover rule is tested elsewhere)."""
    state.delete(LEADER_KEY)
    assert round_lock(state, owner).try_acquire()


@pytest.fixture
def state() -> InMemoryCoordinatorStateStore:
    return InMemoryCoordinatorStateStore()


def lease_store_methods() -> list[str]:
    return [name for name, _ in inspect.getmembers(LeaseStore, inspect.isfunction) if not name.startswith("_")]


READS = {
    "get_lease",
    "scan_leases",
    "list_leases",
    "list_lease_keys_for_owner",
    "list_leases_for_owner",
    "is_lease_table_empty",
}


@pytest.mark.parametrize("method", sorted(set(lease_store_methods()) - READS))
def test_every_lease_store_write_is_refused_once_the_lock_is_lost_and_the_table_is_untouched(state, method):
    store = InMemoryLeaseStore()
    store.create_lease_if_not_exists(Lease("shardId-0", lease_owner="w0"))
    before = store.raw_item("shardId-0")
    with pytest.raises(LeadershipLostError, match="'dag/run-A' was lost during sync_shards"):
        with hold(round_lock(state, "dag/run-A"), "sync_shards", acquire=True, release=False) as leadership:
            fenced = leadership.lease_store(store)
            take_over(state)
            leadership.lock.heartbeat()  # the heartbeat notices
            getattr(fenced, method)(*_arguments(method))
    assert store.raw_item("shardId-0") == before and [lease.lease_key for lease in store.list_leases()] == ["shardId-0"]


def _arguments(method: str) -> tuple[object, ...]:
    lease = Lease("shardId-0", lease_owner="w0")
    table = {
        "create_lease_if_not_exists": (Lease("shardId-1"),),
        "delete_lease": ("shardId-0",),
        "take_lease": (lease, "w1"),
        "assign_lease": (lease, "w1"),
        "initiate_graceful_handoff": (lease, "w1"),
        "checkpoint": (lease, TRIM_HORIZON),
        "prepare_checkpoint": (lease, TRIM_HORIZON),
        "reset_checkpoint": (lease, TRIM_HORIZON),
    }
    if method == "update_lease_meta":
        from lease_core.store.lease_writes import MetaField

        return lease, MetaField.CHILD_SHARDS
    return table.get(method, (lease,))


@pytest.mark.parametrize("method", sorted(READS))
def test_reads_pass_after_the_lock_is_lost(state, method):
    store = InMemoryLeaseStore()
    store.create_lease_if_not_exists(Lease("shardId-0", lease_owner="w0"))
    arguments = {"get_lease": ("shardId-0",), "list_lease_keys_for_owner": ("w0",), "list_leases_for_owner": ("w0",)}
    answers = []
    with pytest.raises(LeadershipLostError):
        with hold(round_lock(state, "dag/run-A"), "assign_leases", acquire=True, release=False) as leadership:
            take_over(state)
            leadership.lock.heartbeat()
            answers.append(getattr(leadership.lease_store(store), method)(*arguments.get(method, ())))
    assert answers == [getattr(store, method)(*arguments.get(method, ()))]


def test_coordinator_state_writes_are_refused_once_our_own_clock_says_the_lock_may_have_expired(state):
    clock = FakeClock()
    with pytest.raises(LeadershipLostError):
        with hold(round_lock(state, "dag/run-A", clock), "assign_leases", acquire=True, release=False) as leadership:
            fenced = leadership.state_store(state)
            assert fenced.put("AssignmentRound", {"round": 1})
            clock.now = LEASE  # no heartbeat got through for a whole lease (e.g. the process was paused)
            assert fenced.get("AssignmentRound") is not None
            fenced.put("AssignmentRound", {"round": 2})
    assert state.get("AssignmentRound")["round"] == 1


def test_holding_fails_naming_the_holder_when_another_round_has_the_lock(state):
    assert round_lock(state, "dag/run-A").try_acquire()
    with pytest.raises(LeadershipUnavailableError, match="'dag/run-A'"):
        with hold(round_lock(state, "leasectl-host-1"), "leasectl sync", acquire=True, release=True):
            raise AssertionError("must not run")
    assert state.get(LEADER_KEY)["ownerName"] == "dag/run-A"


def test_a_step_resumes_the_lock_of_its_own_round_and_leaves_it_held(state):
    assert round_lock(state, "dag/run-A").try_acquire()
    with hold(round_lock(state, "dag/run-A"), "assign_leases", acquire=False, release=False) as leadership:
        assert not leadership.lost
    assert state.get(LEADER_KEY)["ownerName"] == "dag/run-A"


def test_a_command_releases_the_lock_it_acquired_even_when_it_fails(state):
    with pytest.raises(RuntimeError):
        with hold(round_lock(state, "leasectl-host-1"), "leasectl assign", acquire=True, release=True):
            raise RuntimeError("boom")
    assert state.get(LEADER_KEY) is None


def test_a_loss_noticed_after_the_last_write_still_fails_the_step(state):
    with pytest.raises(LeadershipLostError):
        with hold(round_lock(state, "dag/run-A"), "sync_shards", acquire=True, release=False) as leadership:
            take_over(state)
            leadership.lock.heartbeat()
    assert state.get(LEADER_KEY)["ownerName"] == "dag/run-B"


def test_a_call_that_keeps_failing_is_not_retried_once_the_lock_is_lost(state):
    from lease_core.retry import RetryPolicy

    calls = []

    def failing_write() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            take_over(state)  # the lock is taken over while the first attempt is out
            leadership.lock.heartbeat()
        raise ConnectionError("timed out")

    with pytest.raises(LeadershipLostError):
        with hold(round_lock(state, "dag/run-A"), "assign_leases", acquire=True, release=False) as leadership:
            policy = leadership.retry_policy(RetryPolicy(attempts=6, sleep=lambda seconds: None))
            policy.call(failing_write, lambda error: True)
    assert calls == [0], "no attempt is sent after the loss"
