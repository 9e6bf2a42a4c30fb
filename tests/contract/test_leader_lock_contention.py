"""Contenders race for the leader lock on DynamoDB (moto): exactly one wins each race (docs/protocol.md §5.4)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock
from lease_core.store.coordinator_state import CoordinatorStateStore
from tests.support.stores import dynamodb_state_store, dynamodb_store

CONTENDERS = 8
ROUNDS = 10
LEASE = 1000


def STILL_WALL_CLOCK() -> int:
    """The shared wall clock stands still: takeovers here come from each contender's own observation."""
    return 1_700_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def state(moto_endpoint, unique_name) -> CoordinatorStateStore:
    dynamodb_store(moto_endpoint, unique_name)  # creates the application's tables
    return dynamodb_state_store(moto_endpoint, unique_name)


def contenders(state: CoordinatorStateStore, race: int) -> list[tuple[LeaderLock, FakeClock]]:
    clocks = [FakeClock() for _ in range(CONTENDERS)]
    return [
        (
            LeaderLock(
                state,
                f"race{race}-worker-{n}",
                lease_duration_millis=LEASE,
                heartbeat_period_millis=LEASE // 4,
                monotonic_millis=clock,
                wall_clock_millis=STILL_WALL_CLOCK,
            ),
            clock,
        )
        for n, clock in enumerate(clocks)
    ]


def race(locks: list[LeaderLock]) -> list[LeaderLock]:
    """All locks call try_acquire at once (released together by a barrier); the winners."""
    barrier = threading.Barrier(len(locks))

    def attempt(lock: LeaderLock) -> bool:
        barrier.wait()
        return lock.try_acquire()

    with ThreadPoolExecutor(max_workers=len(locks)) as pool:
        results = list(pool.map(attempt, locks))
    return [lock for lock, won in zip(locks, results, strict=True) if won]


@pytest.mark.parametrize("race_number", range(ROUNDS), ids=lambda n: f"race-{n}")
def test_exactly_one_of_eight_contenders_acquires_an_empty_table(state, race_number):
    locks = [lock for lock, _ in contenders(state, race_number)]
    (winner,) = race(locks)
    assert state.get(LEADER_KEY)["ownerName"] == winner.owner_name
    assert [lock for lock in locks if lock.is_held] == [winner]


@pytest.mark.parametrize("race_number", range(ROUNDS), ids=lambda n: f"race-{n}")
def test_exactly_one_of_eight_observers_takes_over_a_dead_holders_lock(state, race_number):
    dead = LeaderLock(
        state,
        f"race{race_number}-dead-leader",
        lease_duration_millis=LEASE,
        heartbeat_period_millis=LEASE // 4,
        wall_clock_millis=STILL_WALL_CLOCK,
    )
    assert dead.try_acquire()
    dead_version = dead.record_version_number
    observers = contenders(state, race_number)
    for lock, clock in observers:
        assert not lock.try_acquire()  # each observes the dead leader's version for the first time
        clock.now += LEASE + 1
    locks = [lock for lock, _ in observers]
    (winner,) = race(locks)
    stored = state.get(LEADER_KEY)
    assert stored["ownerName"] == winner.owner_name
    assert stored["recordVersionNumber"] == winner.record_version_number != dead_version
    assert [lock for lock in locks if lock.is_held] == [winner]
    assert not dead.heartbeat()


@pytest.mark.parametrize("race_number", range(ROUNDS), ids=lambda n: f"race-{n}")
def test_exactly_one_of_eight_fresh_processes_takes_over_on_the_shared_sighting_alone(state, race_number):
    """Each contender is a new process that reads once: only the shared sighting says the lock is expired."""
    wall = FakeClock()
    dead = LeaderLock(
        state,
        f"race{race_number}-dead-round",
        lease_duration_millis=LEASE,
        heartbeat_period_millis=LEASE // 4,
        wall_clock_millis=wall,
    )
    assert dead.try_acquire()
    sighting = LeaderLock(
        state,
        f"race{race_number}-observer",
        lease_duration_millis=LEASE,
        heartbeat_period_millis=LEASE // 4,
        wall_clock_millis=wall,
    )
    assert not sighting.try_acquire()
    wall.now = LEASE + 1
    locks = [
        LeaderLock(
            state,
            f"race{race_number}-round-{n}",
            lease_duration_millis=LEASE,
            heartbeat_period_millis=LEASE // 4,
            monotonic_millis=FakeClock(),
            wall_clock_millis=wall,
        )
        for n in range(CONTENDERS)
    ]
    (winner,) = race(locks)
    assert state.get(LEADER_KEY)["ownerName"] == winner.owner_name
    assert [lock for lock in locks if lock.is_held] == [winner]
