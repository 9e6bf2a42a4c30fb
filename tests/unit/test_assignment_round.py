"""The leader's assignment round over in-memory stores: who gets what, what is written, what is remembered."""

from __future__ import annotations

import pytest

from lease_core.assignment_round import ROUND_KEY, AssignmentCoordinator, slot_ids
from lease_core.config import ConsumerConfig
from lease_core.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.lease import Lease
from lease_core.lease_store import WriteResult
from lease_core.memory_store import InMemoryLeaseStore
from lease_core.worker_metrics import InMemoryWorkerMetricsStore, WorkerMetricStats

SLOTS = slot_ids("app", 2)


def coordinator(store, metrics=None, state=None, **settings) -> AssignmentCoordinator:
    config = ConsumerConfig(application_name="app", **settings)
    return AssignmentCoordinator(store, metrics or InMemoryWorkerMetricsStore(), state or InMemoryCoordinatorStateStore(), config, lambda: 1_000)


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


def test_the_round_number_and_lease_counters_are_remembered():
    store, state = InMemoryLeaseStore(), InMemoryCoordinatorStateStore()
    leases(store, 2)
    run = coordinator(store, state=state)
    assert [run.run(SLOTS).round_number for _ in range(3)] == [1, 2, 3]
    record = state.get(ROUND_KEY)
    assert record["round"] == {"N": "3"}
    assert record["leaseCounters"]["M"] == {key: {"N": "1"} for key in ("shardId-0", "shardId-1")}


def test_balancing_runs_every_variance_balancing_frequency_rounds():
    store = InMemoryLeaseStore()
    leases(store, 1)
    run = coordinator(store, variance_balancing_frequency=3)
    assert [run.run(SLOTS).balanced for _ in range(4)] == [True, False, False, True]


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
