"""The leader lock: acquire, heartbeat, observed expiry and takeover, release (docs/protocol.md §5.4)."""

from __future__ import annotations

import itertools
import time

import pytest

from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock, LeadershipFailures, LockHeartbeat, LockHolder
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.store.record_table import to_attribute_values

LEASE = 1000
HEARTBEAT = 250


class FakeClock:
    """Monotonic milliseconds that move only when a test says so."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, millis: int) -> None:
        self.now += millis


# The wall clock every process shares; tests that move it say so (FakeClock otherwise stands still).
WALL = FakeClock(1_700_000_000_000)


class Contender:
    """A lock with its own monotonic clock, as each process has; its versions read `<prefix>-v<n>`."""

    def __init__(
        self,
        state: InMemoryCoordinatorStateStore,
        name: str,
        lease: int = LEASE,
        prefix: str | None = None,
        wall: FakeClock = WALL,
    ) -> None:
        prefix = prefix or name
        self.clock = FakeClock()
        versions = itertools.count()
        self.lock = LeaderLock(
            state,
            name,
            lease_duration_millis=lease,
            heartbeat_period_millis=lease // 4,
            monotonic_millis=self.clock,
            new_version=lambda: f"{prefix}-v{next(versions)}",
            wall_clock_millis=wall,
        )


@pytest.fixture
def state() -> InMemoryCoordinatorStateStore:
    return InMemoryCoordinatorStateStore()


def contenders(state: InMemoryCoordinatorStateStore, *names: str) -> list[Contender]:
    return [Contender(state, name) for name in names]


def advance_all(millis: int, *parties: Contender) -> None:
    for party in parties:
        party.clock.advance(millis)


def stored_owner(state: InMemoryCoordinatorStateStore) -> str | None:
    item = state.get(LEADER_KEY)
    return item["ownerName"] if item else None


# --- acquire -------------------------------------------------------------------------------------


def test_acquire_on_an_empty_table_writes_the_lock_client_attributes_and_our_heartbeat_time(state):
    (a,) = contenders(state, "a")
    assert a.lock.try_acquire()
    assert a.lock.is_held
    assert state.get(LEADER_KEY) == {
        "key": "Leader",
        "ownerName": "a",
        "leaseDuration": "1000",
        "recordVersionNumber": "a-v0",
        "heartbeatAt": WALL.now,
    }
    # The lock client's types in DynamoDB: every attribute a string, the duration a decimal string;
    # our own `heartbeatAt` a number.
    assert to_attribute_values(state.get(LEADER_KEY)) == {
        "key": {"S": "Leader"},
        "ownerName": {"S": "a"},
        "leaseDuration": {"S": "1000"},
        "recordVersionNumber": {"S": "a-v0"},
        "heartbeatAt": {"N": str(WALL.now)},
    }
    assert a.lock.holder() == LockHolder("a", "a-v0", 1000, heartbeat_at_millis=WALL.now)


def test_acquiring_a_lock_already_held_refreshes_it_with_a_new_version(state):
    (a,) = contenders(state, "a")
    a.lock.try_acquire()
    assert a.lock.try_acquire()
    assert a.lock.holder().record_version_number == "a-v1"


def test_a_live_holder_is_never_displaced_even_after_many_lease_durations(state):
    a, b = contenders(state, "a", "b")
    assert a.lock.try_acquire()
    for _ in range(40):
        advance_all(HEARTBEAT, a, b)
        assert a.lock.heartbeat()
        assert not b.lock.try_acquire()
    assert a.lock.is_held and stored_owner(state) == "a"


TAKEOVER_CASES = [
    pytest.param(0, False, id="first-read-only-observes"),
    pytest.param(LEASE - 1, False, id="just-under-the-lease"),
    pytest.param(LEASE, False, id="exactly-the-lease-is-not-expired"),
    pytest.param(LEASE + 1, True, id="just-after-the-lease-takes-over"),
    pytest.param(5 * LEASE, True, id="long-after-the-lease-takes-over"),
]


@pytest.mark.parametrize(("observed_for", "takes_over"), TAKEOVER_CASES)
def test_a_dead_holder_is_replaced_only_once_its_version_was_seen_unchanged_longer_than_the_lease(
    state, observed_for, takes_over
):
    a, b = contenders(state, "a", "b")
    a.lock.try_acquire()
    assert not b.lock.try_acquire()  # first observation of a-v0
    b.clock.advance(observed_for)
    assert b.lock.try_acquire() is takes_over
    assert stored_owner(state) == ("b" if takes_over else "a")


def test_a_first_time_observer_cannot_take_over_on_its_first_read_however_old_the_item(state):
    a, b = contenders(state, "a", "b")
    a.lock.try_acquire()
    b.clock.advance(1_000 * LEASE)  # b starts long after a died: its clock says nothing about the item's age
    assert not b.lock.try_acquire()
    b.clock.advance(LEASE + 1)
    assert b.lock.try_acquire()


def test_a_heartbeat_seen_between_reads_restarts_the_observation(state):
    a, b = contenders(state, "a", "b")
    a.lock.try_acquire()
    b.lock.try_acquire()
    advance_all(LEASE - 1, a, b)
    a.lock.heartbeat()
    b.lock.try_acquire()  # sees a-v1 for the first time
    b.clock.advance(LEASE)
    assert not b.lock.try_acquire()
    b.clock.advance(1)
    assert b.lock.try_acquire()


def test_the_takeover_uses_the_duration_stored_in_the_item_not_the_observers(state):
    long_holder = Contender(state, "a", lease=3 * LEASE)
    (b,) = contenders(state, "b")
    long_holder.lock.try_acquire()
    b.lock.try_acquire()
    b.clock.advance(LEASE + 1)
    assert not b.lock.try_acquire()
    b.clock.advance(2 * LEASE)
    assert b.lock.try_acquire()


def test_only_one_of_two_observers_of_the_same_expired_version_wins(state):
    a, b, c = contenders(state, "a", "b", "c")
    a.lock.try_acquire()
    b.lock.try_acquire()
    c.lock.try_acquire()
    advance_all(LEASE + 1, b, c)
    assert b.lock.try_acquire()
    assert not c.lock.try_acquire()  # c sees b's new version: a fresh observation
    assert stored_owner(state) == "b"


# --- takeover across processes: every Airflow try and leasectl command is a new process ------------

MINUTE = 60_000
ROUND_LEASE = 120_000  # the default leader lease duration


def new_process(state, name: str, wall: FakeClock, started_at: int = 0) -> LeaderLock:
    """A lock as a fresh process builds it: a monotonic clock with an arbitrary origin, the shared wall clock."""
    return LeaderLock(
        state,
        name,
        lease_duration_millis=ROUND_LEASE,
        heartbeat_period_millis=ROUND_LEASE // 4,
        monotonic_millis=FakeClock(started_at),
        wall_clock_millis=wall,
    )


def test_a_dead_rounds_lock_is_taken_over_by_the_first_try_made_a_lease_after_the_first_sighting(state):
    wall = FakeClock(1_700_000_000_000)
    assert new_process(state, "dag/run-A", wall).try_acquire()  # run A acquires, then dies holding it
    outcomes = {}
    for minute in (34, 41, 91, 1_471):
        wall.now = 1_700_000_000_000 + minute * MINUTE
        outcomes[minute] = new_process(state, "dag/run-B", wall, started_at=minute).try_acquire()
        if outcomes[minute]:
            break
    assert outcomes == {34: False, 41: True}
    assert stored_owner(state) == "dag/run-B"


@pytest.mark.parametrize(
    ("seen_after", "takes_over"),
    [pytest.param(ROUND_LEASE, False, id="exactly-the-lease"), pytest.param(ROUND_LEASE + 1, True, id="just-after")],
)
def test_the_shared_sighting_counts_from_its_first_observer_for_every_later_process(state, seen_after, takes_over):
    wall = FakeClock(0)
    assert new_process(state, "dag/run-A", wall).try_acquire()
    assert not new_process(state, "leasectl-host-1", wall).try_acquire()  # the first sighting, at 0
    wall.now = 10_000
    assert not new_process(state, "dag/run-B", wall).try_acquire()  # a later sighting does not restart it
    wall.now = seen_after
    assert new_process(state, "dag/run-B", wall).try_acquire() is takes_over


def test_a_heartbeat_between_sightings_restarts_the_shared_observation(state):
    wall = FakeClock(0)
    holder = new_process(state, "dag/run-A", wall)
    assert holder.try_acquire()
    assert not new_process(state, "dag/run-B", wall).try_acquire()
    wall.now = ROUND_LEASE // 2
    assert holder.heartbeat()  # alive: a new version
    wall.now = ROUND_LEASE + 1
    assert not new_process(state, "dag/run-B", wall).try_acquire()  # first sighting of the new version
    assert stored_owner(state) == "dag/run-A"


def test_a_live_holder_heartbeating_on_time_is_never_taken_over_by_processes_trying_every_minute(state):
    wall = FakeClock(0)
    holder_clock = FakeClock(0)
    holder = LeaderLock(
        state, "dag/run-A", ROUND_LEASE, ROUND_LEASE // 4, monotonic_millis=holder_clock, wall_clock_millis=wall
    )
    assert holder.try_acquire()
    for minute in range(1, 60):
        wall.now += MINUTE // 2
        holder_clock.advance(MINUTE // 2)
        assert holder.heartbeat()
        wall.now += MINUTE // 2
        holder_clock.advance(MINUTE // 2)
        assert not new_process(state, f"dag/run-{minute}", wall).try_acquire()
    assert holder.is_held and stored_owner(state) == "dag/run-A"


def test_clocks_skewed_by_less_than_the_margin_never_see_a_held_lock_as_expired(state):
    """The observer's clock runs ahead of the first observer's by just under the margin: by the time
    the lock looks expired to it, the holder has stopped counting itself the holder."""
    skew = ROUND_LEASE // 10 - 1
    holder_clock = FakeClock(0)
    holder = LeaderLock(state, "dag/run-A", ROUND_LEASE, ROUND_LEASE // 4, monotonic_millis=holder_clock)
    assert holder.try_acquire()
    assert not new_process(state, "observer", FakeClock(0)).try_acquire()  # first sighting, on a slow clock
    for elapsed in range(0, ROUND_LEASE + 2, 1_000):
        holder_clock.now = elapsed
        taken = new_process(state, "dag/run-B", FakeClock(elapsed + skew)).try_acquire()
        assert not (taken and holder.is_held), f"two holders at {elapsed} ms"
        if taken:
            break
    assert stored_owner(state) == "dag/run-B"


def test_a_sighting_from_a_clock_running_an_hour_fast_does_not_hold_off_the_takeover(state):
    wall = FakeClock(0)
    assert new_process(state, "dag/run-A", wall).try_acquire()  # then dies
    assert not new_process(state, "laptop", FakeClock(60 * MINUTE)).try_acquire()  # a clock an hour fast
    assert not new_process(state, "dag/run-B", wall).try_acquire()  # its own sighting replaces the future one
    wall.now = ROUND_LEASE + 1
    assert new_process(state, "dag/run-B", wall).try_acquire()


def test_a_try_whose_acquire_landed_before_it_died_is_recognised_by_the_next_try_of_the_same_round(state):
    wall = FakeClock(0)
    assert new_process(state, "dag/run-A", wall).try_acquire()  # try 1 wrote the lock and then died
    retry = new_process(state, "dag/run-A", wall, started_at=30_000)
    assert retry.try_acquire()
    assert retry.is_held and stored_owner(state) == "dag/run-A"
    assert state.get(LEADER_KEY)["recordVersionNumber"] == retry.record_version_number


class AnswerLostState(InMemoryCoordinatorStateStore):
    """Every conditional put and delete lands, then reports False: the retry of a write whose answer
    was lost fails its condition against the write itself."""

    def put(self, key, attributes, expected=None):
        super().put(key, attributes, expected)
        return False

    def delete(self, key, expected=None):
        super().delete(key, expected)
        return False


def test_an_acquire_whose_answer_was_lost_is_recognised_as_held_by_its_version():
    state = AnswerLostState()
    (a,) = contenders(state, "a")
    assert a.lock.try_acquire() and a.lock.is_held
    assert a.lock.heartbeat()
    assert state.get(LEADER_KEY)["recordVersionNumber"] == a.lock.record_version_number


def test_a_release_whose_answer_was_lost_reports_the_lock_released():
    state = AnswerLostState()
    (a,) = contenders(state, "a")
    a.lock.try_acquire()
    assert a.lock.release()
    assert state.get(LEADER_KEY) is None


def test_the_unavailable_error_names_the_holder_and_when_a_dead_holder_can_be_taken_over(state):
    wall = FakeClock(1_700_000_000_000)  # 2023-11-14 22:13:20 UTC
    assert new_process(state, "dag/run-A", wall).try_acquire()
    contender = new_process(state, "dag/run-B", wall)
    assert not contender.try_acquire()
    message = str(contender.unavailable())
    assert "'dag/run-A'" in message
    assert "not changed since 2023-11-14 22:13:20 UTC" in message and "after 2023-11-14 22:15:20 UTC" in message


def test_an_unreadable_shared_observation_is_replaced_at_the_next_sighting(state):
    wall = FakeClock(0)
    assert new_process(state, "dag/run-A", wall).try_acquire()
    state.put("LeaderObservation", {"observedVersion": "x", "firstSeenAt": "not a number"})
    assert not new_process(state, "dag/run-B", wall).try_acquire()
    wall.now = ROUND_LEASE + 1
    assert new_process(state, "dag/run-B", wall).try_acquire()


# --- heartbeat and loss --------------------------------------------------------------------------


def test_a_displaced_leaders_heartbeat_fails_and_it_no_longer_holds_the_lock(state):
    a, b = contenders(state, "a", "b")
    a.lock.try_acquire()
    b.lock.try_acquire()
    advance_all(LEASE + 1, a, b)
    assert b.lock.try_acquire()
    assert not a.lock.heartbeat()
    assert not a.lock.is_held and a.lock.record_version_number is None
    assert stored_owner(state) == "b" and b.lock.is_held


def test_the_holder_stops_holding_by_its_own_clock_a_tenth_of_the_lease_before_it_expires(state):
    (a,) = contenders(state, "a")
    a.lock.try_acquire()
    a.clock.advance(LEASE * 9 // 10 - 1)
    assert a.lock.is_held
    a.clock.advance(1)
    assert not a.lock.is_held


def test_a_lock_never_acquired_cannot_heartbeat_or_release(state):
    (a,) = contenders(state, "a")
    assert not a.lock.heartbeat()
    assert not a.lock.release()


def test_a_later_step_resumes_the_lock_from_its_handed_over_version(state):
    first, later = (
        Contender(state, "round-1", prefix="acquire-step"),
        Contender(state, "round-1", prefix="consume-step"),
    )
    first.lock.try_acquire()
    assert later.lock.resume(first.lock.record_version_number)
    assert later.lock.is_held
    assert not first.lock.heartbeat()  # the hand-over leaves one heartbeating copy


def test_resuming_a_replaced_version_fails(state):
    (a,) = contenders(state, "a")
    a.lock.try_acquire()
    stale = a.lock.record_version_number
    a.lock.heartbeat()
    assert not Contender(state, "a").lock.resume(stale)


# --- release -------------------------------------------------------------------------------------


def test_a_later_step_resumes_by_owner_name_after_the_version_moved_on(state):
    first = Contender(state, "dag/run-1")
    assert first.lock.try_acquire()
    assert first.lock.heartbeat()  # an earlier step kept beating: its last version is unknown to later steps
    later = Contender(state, "dag/run-1", prefix="later")
    assert later.lock.resume_as_owner()
    assert stored_owner(state) == "dag/run-1" and later.lock.is_held


@pytest.mark.parametrize("holder", [None, "dag/run-2"], ids=["nobody", "another-round"])
def test_resuming_by_owner_name_fails_when_the_lock_is_not_ours(state, holder):
    if holder is not None:
        assert Contender(state, holder).lock.try_acquire()
    assert not Contender(state, "dag/run-1").lock.resume_as_owner()
    assert stored_owner(state) == holder


def test_release_deletes_the_lock_and_another_acquires_immediately(state):
    a, b = contenders(state, "a", "b")
    a.lock.try_acquire()
    b.lock.try_acquire()
    assert a.lock.release()
    assert not a.lock.is_held and state.get(LEADER_KEY) is None
    assert b.lock.try_acquire()
    assert stored_owner(state) == "b"


def test_a_displaced_leader_cannot_release_the_new_leaders_lock(state):
    a, b = contenders(state, "a", "b")
    a.lock.try_acquire()
    b.lock.try_acquire()
    advance_all(LEASE + 1, a, b)
    b.lock.try_acquire()
    assert not a.lock.release()
    assert stored_owner(state) == "b"


RELEASED_ITEMS = [
    pytest.param({"recordVersionNumber": "old"}, id="released-with-version"),
    pytest.param({}, id="released-without-version"),
]


@pytest.mark.parametrize("extra", RELEASED_ITEMS)
def test_a_lock_marked_released_is_acquired_at_once(state, extra):
    state.put(
        LEADER_KEY,
        {"ownerName": "kcl-worker", "leaseDuration": "120000", "isReleased": "1", **extra},
    )
    (b,) = contenders(state, "b")
    assert b.lock.holder().is_released
    assert b.lock.try_acquire()
    assert state.get(LEADER_KEY)["ownerName"] == "b" and "isReleased" not in state.get(LEADER_KEY)


def test_a_foreign_item_without_a_duration_expires_after_the_observers_duration(state):
    state.put(LEADER_KEY, {"ownerName": "someone", "recordVersionNumber": "v"})
    (b,) = contenders(state, "b")
    assert not b.lock.try_acquire()
    b.clock.advance(LEASE + 1)
    assert b.lock.try_acquire()


def test_an_invalid_heartbeat_period_is_refused(state):
    with pytest.raises(ValueError, match="heartbeat period"):
        LeaderLock(state, "a", lease_duration_millis=100, heartbeat_period_millis=100)


# --- consecutive failures ------------------------------------------------------------------------

FAILURE_SEQUENCES = [
    pytest.param("FF", False, id="two-failures-keep-the-lock"),
    pytest.param("FFF", True, id="three-in-a-row-release"),
    pytest.param("FFSFF", False, id="a-success-resets-the-count"),
    pytest.param("FFSFFF", True, id="three-after-a-reset-release"),
    pytest.param("FFFF", True, id="past-the-limit-still-release"),
]


@pytest.mark.parametrize(("outcomes", "release"), FAILURE_SEQUENCES)
def test_leadership_is_released_after_three_consecutive_failures(outcomes, release):
    failures = LeadershipFailures()
    answer = False
    for outcome in outcomes:
        if outcome == "F":
            answer = failures.record_failure()
        else:
            failures.record_success()
            answer = False
    assert answer is release


# --- background heartbeat (real time, short periods) ---------------------------------------------


def real_time_lock(state: InMemoryCoordinatorStateStore, name: str) -> LeaderLock:
    # Heartbeats 10x per lease duration: a loaded 2-core CI machine may delay a few of them.
    return LeaderLock(state, name, lease_duration_millis=1000, heartbeat_period_millis=100)


def test_the_background_heartbeat_keeps_the_lock_alive_past_several_lease_durations(state):
    lock = real_time_lock(state, "driver")
    assert lock.try_acquire()
    first_version = lock.record_version_number
    with LockHeartbeat(lock) as heartbeat:
        time.sleep(2.5)
        assert lock.is_held and not heartbeat.lost.is_set()
    assert lock.record_version_number != first_version
    assert not heartbeat._thread.is_alive()


def test_the_background_heartbeat_sets_lost_when_another_process_steals_the_lock(state):
    lock = real_time_lock(state, "driver")
    lock.try_acquire()
    with LockHeartbeat(lock) as heartbeat:
        state.delete(LEADER_KEY)  # e.g. an operator deletes the item by hand, and another leader starts
        assert real_time_lock(state, "intruder").try_acquire()
        assert heartbeat.lost.wait(timeout=2)
    assert not lock.is_held and stored_owner(state) == "intruder"


def test_a_heartbeat_for_a_lock_not_held_is_lost_from_the_start(state):
    with LockHeartbeat(real_time_lock(state, "driver")) as heartbeat:
        assert heartbeat.lost.is_set()
