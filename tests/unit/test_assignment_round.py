"""The leader's assignment round over in-memory stores: who gets what, what is written, what is remembered."""

from __future__ import annotations

import pytest

from lease_core.config.settings import ConsumerConfig
from lease_core.errors import AccessError
from lease_core.leader.assignment_round import ROUND_KEY, AssignmentCoordinator, RoundSnapshot, slot_ids
from lease_core.metrics.worker_metrics import InMemoryWorkerMetricsStore, WorkerMetricStats
from lease_core.model.lease import Lease
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.store.lease_store import WriteResult
from lease_core.store.load_probes import LOAD_PROBES_KEY, load_probes_of, record_load_probes
from lease_core.store.memory_store import InMemoryLeaseStore

SLOTS = slot_ids("app", 2)


def coordinator(store, metrics=None, state=None, **settings) -> AssignmentCoordinator:
    config = ConsumerConfig(application_name="app", **settings)
    return AssignmentCoordinator(
        store, metrics or InMemoryWorkerMetricsStore(), state or InMemoryCoordinatorStateStore(), config, lambda: 1_000
    )


def leases(store, count: int, owner: str | None = None, kbps: float | None = None) -> None:
    for n in range(count):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}", lease_owner=owner, throughput_kbps=kbps))


def owners(store) -> dict[str, str | None]:
    return {lease.lease_key: lease.lease_owner for lease in store.list_leases()}


@pytest.mark.parametrize("kbps", [10.0, None], ids=["measured", "never-measured"])
@pytest.mark.parametrize("strategy", ["variance", "count", "makespan"])
def test_unassigned_leases_are_spread_over_the_slots_and_stay_put_next_round(strategy, kbps):
    store = InMemoryLeaseStore()
    leases(store, 4, kbps=kbps)
    run = coordinator(store, lease_assignment_strategy=strategy)
    report = run.run(SLOTS)
    assert sorted(row.leases_after for row in report.workers) == [2, 2]
    assert all(move.write == "assign" and move.applied for move in report.moves)
    first = owners(store)
    assert run.run(SLOTS).moves == () and owners(store) == first


def test_leases_of_a_worker_that_is_not_a_slot_of_this_round_are_reassigned():
    store = InMemoryLeaseStore()
    leases(store, 3, owner="old-host-7", kbps=5.0)
    report = coordinator(store).run(SLOTS)
    assert set(owners(store).values()) <= set(SLOTS) and len(report.moves) == 3
    assert {move.from_owner for move in report.moves} == {"old-host-7"}


def test_a_slot_with_failing_metrics_is_excluded_and_loses_its_leases():
    store = InMemoryLeaseStore()
    leases(store, 2, owner=SLOTS[1], kbps=5.0)
    metrics = InMemoryWorkerMetricsStore()
    metrics.put(WorkerMetricStats(SLOTS[1], 1, {"C": (40.0, -1.0)}, {"C": (100.0,)}, round=1))
    report = coordinator(store, metrics).run(SLOTS)
    assert set(owners(store).values()) == {SLOTS[0]}
    assert SLOTS[1] in report.excluded_workers


DAY_MILLIS = 86_400_000


class SlotWritingAfterTheScan(InMemoryWorkerMetricsStore):
    """Worker metrics in which `writer` publishes again between the round's read and its deletes."""

    def __init__(self, writer: str) -> None:
        super().__init__()
        self.writer = writer

    def read_for_round(self, worker_ids, stale_before_epoch_seconds):
        read = super().read_for_round(worker_ids, stale_before_epoch_seconds)
        self.put(WorkerMetricStats(self.writer, 3 * DAY_MILLIS // 1000, {"C": (10.0,)}, {"C": (100.0,)}, round=9))
        return read


def test_worker_metrics_of_workers_outside_the_round_idle_for_the_cleanup_duration_are_deleted_unless_rewritten():
    metrics = SlotWritingAfterTheScan(writer="app-worker-4")
    now_seconds = 2 * DAY_MILLIS // 1000
    metrics.put(WorkerMetricStats(SLOTS[0], 1, {"C": (10.0,)}, {"C": (100.0,)}, round=1))  # this round's: kept
    metrics.put(WorkerMetricStats("app-worker-3", now_seconds - DAY_MILLIS // 1000 - 1, round=1))  # stale: deleted
    metrics.put(WorkerMetricStats("app-worker-4", 5, round=1))  # stale when read, then written again: kept
    metrics.put(WorkerMetricStats("app-worker-5", now_seconds - 60, round=1))  # a minute old: kept
    config = ConsumerConfig(application_name="app")
    run = AssignmentCoordinator(
        InMemoryLeaseStore(), metrics, InMemoryCoordinatorStateStore(), config, lambda: now_seconds * 1000
    )
    report = run.run(SLOTS)
    assert report.deleted_worker_metrics == ("app-worker-3",)
    assert sorted(stats.worker_id for stats in metrics.list_all()) == [SLOTS[0], "app-worker-4", "app-worker-5"]


class RefusingDeletes(InMemoryWorkerMetricsStore):
    """Worker metrics on a table whose role may not DeleteItem."""

    def delete_if_unchanged(self, worker_id, lut):
        raise AccessError("dynamodb", "DeleteItem", "AccessDeniedException: not authorized")


def test_a_refused_delete_of_stale_worker_metrics_is_logged_and_the_round_goes_on(caplog):
    metrics = RefusingDeletes()
    metrics.put(WorkerMetricStats("app-worker-3", 1, round=1))
    store = InMemoryLeaseStore()
    leases(store, 2)
    run = AssignmentCoordinator(
        store, metrics, InMemoryCoordinatorStateStore(), ConsumerConfig(application_name="app"), lambda: 2 * DAY_MILLIS
    )
    report = run.run(SLOTS)
    assert report.deleted_worker_metrics == () and len(report.moves) == 2
    assert metrics.get("app-worker-3") is not None
    assert "could not delete the stale worker metrics of app-worker-3" in caplog.text


def test_the_round_number_and_lease_counters_are_remembered():
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    leases(store, 2)
    run = coordinator(store, state=state)
    assert [run.run(SLOTS).round_number for _ in range(3)] == [1, 2, 3]
    record = state.get(ROUND_KEY)
    assert record["round"] == 3
    assert RoundSnapshot.from_item(record).lease_counters == dict.fromkeys(("shardId-0", "shardId-1"), 1)


@pytest.mark.parametrize(
    ("strategy", "balanced"),
    [
        pytest.param("variance", [True, False, False, True], id="variance-every-third-round-as-kcl"),
        pytest.param("count", [True, False, False, True], id="count-every-third-round-as-kcl"),
        pytest.param("makespan", [True, True, True, True], id="makespan-every-round"),
    ],
)
def test_balancing_runs_every_variance_balancing_frequency_rounds_except_makespan_which_balances_each_round(
    strategy, balanced
):
    store = InMemoryLeaseStore()
    leases(store, 1)
    run = coordinator(store, variance_balancing_frequency=3, lease_assignment_strategy=strategy)
    assert [run.run(SLOTS).balanced for _ in range(4)] == balanced


class StealingStore(InMemoryLeaseStore):
    """Another leader assigns each lease just before this one writes it."""

    def assign_lease(self, lease: Lease, new_owner: str) -> WriteResult:
        super().assign_lease(self.get_lease(lease.lease_key), "another-leader-slot")
        return super().assign_lease(lease, new_owner)


def test_lost_conditions_are_counted_not_raised():
    store = StealingStore()
    leases(store, 2)
    report = coordinator(store).run(SLOTS)
    assert report.lost_conditions == 2 and not any(move.applied for move in report.moves)
    assert set(owners(store).values()) == {"another-leader-slot"}


def test_a_running_owner_hands_its_lease_over_gracefully_and_an_idle_one_is_assigned():
    store = InMemoryLeaseStore()
    leases(store, 4, owner=SLOTS[0], kbps=10.0)
    report = coordinator(store, lease_assignment_strategy="count").run(SLOTS, running_workers=frozenset({SLOTS[0]}))
    assert report.moves and {move.write for move in report.moves} == {"handoff"}
    moved = store.get_lease(report.moves[0].lease_key)
    assert (moved.lease_owner, moved.checkpoint_owner) == (SLOTS[1], SLOTS[0])
    idle = InMemoryLeaseStore()
    leases(idle, 4, owner=SLOTS[0], kbps=10.0)
    assert {m.write for m in coordinator(idle, lease_assignment_strategy="count").run(SLOTS).moves} == {"assign"}


# --- handoffs finish, and the counter snapshot finds workers that stopped renewing --------------


class Clock:
    def __init__(self, now: int = 1_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def timed_coordinator(store, state, clock, **settings) -> AssignmentCoordinator:
    config = ConsumerConfig(application_name="app", lease_assignment_strategy="count", **settings)
    return AssignmentCoordinator(store, InMemoryWorkerMetricsStore(), state, config, clock)


def hand_over(store, key: str, from_slot: str, to_slot: str) -> None:
    lease = store.get_lease(key)
    assert store.initiate_graceful_handoff(lease, to_slot).applied
    assert store.get_lease(key).checkpoint_owner == from_slot


@pytest.mark.parametrize("strategy", ["variance", "count", "makespan"])
def test_a_handoff_left_by_an_earlier_round_is_finished_by_the_next_one_and_the_lease_is_owned_plainly(strategy):
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    leases(store, 4, owner=SLOTS[0], kbps=10.0)
    run = coordinator(store, state=state, lease_assignment_strategy=strategy)
    run.run(SLOTS, running_workers=frozenset({SLOTS[0]}))  # leaves handoffs from worker-0 to worker-1
    assert any(lease.is_in_handoff for lease in store.list_leases())
    report = run.run(SLOTS)  # between rounds nobody runs: every handoff is finished
    assert not any(lease.is_in_handoff for lease in store.list_leases())
    assert set(owners(store).values()) <= set(SLOTS)
    assert all(move.applied and move.write == "assign" for move in report.moves)


def test_a_handoff_from_a_slot_that_is_running_and_renewing_is_left_alone_until_the_timeout():
    store, state, clock = InMemoryLeaseStore(), InMemoryCoordinatorStateStore(), Clock()
    leases(store, 1, owner=SLOTS[0], kbps=10.0)
    hand_over(store, "shardId-0", SLOTS[0], SLOTS[1])
    run = timed_coordinator(
        store, state, clock, failover_time_millis=10_000, graceful_lease_handoff_timeout_millis=30_000
    )
    running = frozenset({SLOTS[0]})
    for _ in range(4):  # the old owner keeps renewing while it finishes its batch
        assert not any(move.lease_key == "shardId-0" for move in run.run(SLOTS, running_workers=running).moves)
        store.renew_lease(store.get_lease("shardId-0"))
        clock.now += 5_000
    assert store.get_lease("shardId-0").is_in_handoff
    clock.now += 30_000  # handed over for longer than the handoff timeout plus the failover time
    report = run.run(SLOTS, running_workers=running)
    assert [(move.lease_key, move.reason) for move in report.moves] == [("shardId-0", "handoff finished")]
    assert not store.get_lease("shardId-0").is_in_handoff


@pytest.mark.parametrize(
    ("silent_for", "finished"),
    [pytest.param(10_000, False, id="exactly-the-failover-time"), pytest.param(10_001, True, id="just-after")],
)
def test_a_handoff_whose_running_old_owner_stopped_renewing_is_finished_after_the_failover_time(silent_for, finished):
    store, state, clock = InMemoryLeaseStore(), InMemoryCoordinatorStateStore(), Clock()
    leases(store, 1, owner=SLOTS[0], kbps=10.0)
    hand_over(store, "shardId-0", SLOTS[0], SLOTS[1])
    run = timed_coordinator(store, state, clock, failover_time_millis=10_000)
    running = frozenset({SLOTS[0]})
    run.run(SLOTS, running_workers=running)  # the snapshot holds the lease's counter
    clock.now += silent_for
    report = run.run(SLOTS, running_workers=running)
    assert [(move.reason, move.write) for move in report.moves] == (
        [("handoff finished", "assign")] if finished else []
    )
    assert store.get_lease("shardId-0").is_in_handoff is not finished


def test_a_lease_of_a_running_slot_whose_counter_stopped_moving_is_expired_and_reassigned():
    store, state, clock = InMemoryLeaseStore(), InMemoryCoordinatorStateStore(), Clock()
    leases(store, 2, owner=SLOTS[0], kbps=10.0)
    store.create_lease_if_not_exists(Lease("shardId-9", lease_owner=SLOTS[1], throughput_kbps=10.0))
    run = timed_coordinator(store, state, clock, failover_time_millis=10_000)
    running = frozenset(SLOTS)
    run.run(SLOTS, running_workers=running)
    clock.now += 10_001
    store.renew_lease(store.get_lease("shardId-9"))  # worker-1 is alive; worker-0 died holding two leases
    report = run.run(SLOTS, running_workers=running)
    moved = {move.lease_key: move for move in report.moves}
    assert set(moved) <= {"shardId-0", "shardId-1"} and moved
    assert all(move.reason == "unassigned" and move.write == "assign" and move.applied for move in moved.values())


def test_a_retried_assignment_of_the_same_round_keeps_its_round_number():
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    leases(store, 2)
    run = coordinator(store, state=state)
    assert run.run(SLOTS, round_owner="dag/run-1").round_number == 1
    assert run.run(SLOTS, round_owner="dag/run-1").round_number == 1  # the retry
    assert run.run(SLOTS, round_owner="dag/run-2").round_number == 2
    assert run.run(SLOTS).round_number == 3  # an owner-less run (leasectl) is always a new round
    assert state.get(ROUND_KEY)["round"] == 3


def test_a_round_record_written_before_snapshots_were_versioned_is_read_and_replaced():
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    leases(store, 1)
    state.put(ROUND_KEY, {"round": 7, "assignedAt": 5, "leaseCounters": {}})
    assert coordinator(store, state=state).run(SLOTS).round_number == 8
    assert state.get(ROUND_KEY)["round"] == 8 and "version" in state.get(ROUND_KEY)


def test_an_older_rounds_snapshot_never_replaces_a_newer_one():
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    leases(store, 1)

    run = coordinator(store, state=state)
    original = run.store.scan_leases

    def scan_then_newer_round():  # another leader finishes round 5 while this one decides round 1
        result = original()
        state.put(ROUND_KEY, {"round": 5, "assignedAt": 9, "version": "other"})
        return result

    run.store.scan_leases = scan_then_newer_round
    assert run.run(SLOTS).round_number == 1
    assert state.get(ROUND_KEY)["round"] == 5


# Four new shards, one as busy as the other three together: by count, two slots get two leases each.
SKEWED_PROBES = {"shardId-0": 60.0, "shardId-1": 20.0, "shardId-2": 20.0, "shardId-3": 20.0}


@pytest.mark.parametrize(
    ("probes", "busiest_kbps"),
    [
        pytest.param(SKEWED_PROBES, 60.0, id="probed-hot-shard-gets-a-slot-of-its-own"),
        pytest.param({}, 80.0, id="no-probe-every-new-lease-weighs-the-same"),
        pytest.param({"shardId-0": 60.0}, 80.0, id="unprobed-leases-get-the-average-of-the-probed"),
    ],
)
def test_the_first_round_places_never_measured_leases_by_their_load_probes(probes, busiest_kbps):
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    leases(store, 4)
    record_load_probes(state, probes, 900)
    coordinator(store, state=state).run(SLOTS)
    load = {slot: sum(SKEWED_PROBES[key] for key, owner in owners(store).items() if owner == slot) for slot in SLOTS}
    assert max(load.values()) == busiest_kbps


def test_a_measured_throughput_wins_over_a_probe():
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    for key, kbps in (("shardId-0", 10.0), ("shardId-1", 10.0), ("shardId-2", 10.0)):
        store.create_lease_if_not_exists(Lease(key, throughput_kbps=kbps))
    record_load_probes(state, {"shardId-0": 1_000.0}, 900)
    report = coordinator(store, state=state).run(SLOTS)
    assert sorted(row.leases_after for row in report.workers) == [1, 2]


def test_probes_replace_the_last_rounds_and_none_over_none_costs_no_write():
    state = InMemoryCoordinatorStateStore()
    record_load_probes(state, {}, 900)
    assert state.get(LOAD_PROBES_KEY) is None
    record_load_probes(state, {"shardId-0": 5.0}, 900)
    record_load_probes(state, {"shardId-1": 7.5}, 1_900)
    assert load_probes_of(state.get(LOAD_PROBES_KEY)) == {"shardId-1": 7.5}
    record_load_probes(state, {}, 2_900)
    assert load_probes_of(state.get(LOAD_PROBES_KEY)) == {}
