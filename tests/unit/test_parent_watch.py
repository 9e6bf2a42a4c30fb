"""An idle slot waits for closing parents other slots of its round read, and no longer than they are read."""

from __future__ import annotations

import pytest

from lease_core.lifecycle.parent_watch import ParentWatch, closing_lease_keys
from lease_core.model.lease import Lease
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.store.memory_store import InMemoryLeaseStore

SLOTS = ("app-worker-0", "app-worker-1", "app-worker-2")
ME, OTHER = SLOTS[1], SLOTS[0]
READING = ExtendedSequenceNumber("1500")
STALE_AFTER = 6.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def parent(key: str = "shardId-0", owner: str | None = OTHER, checkpoint: ExtendedSequenceNumber = READING) -> Lease:
    return Lease(key, lease_owner=owner, checkpoint=checkpoint, child_shard_ids=frozenset({"shardId-1"}))


def watching(*leases: Lease) -> tuple[ParentWatch, InMemoryLeaseStore, FakeClock]:
    store, clock = InMemoryLeaseStore(), FakeClock()
    for lease in leases:
        assert store.create_lease_if_not_exists(lease)
    watch = ParentWatch(ME, SLOTS, stale_after_seconds=STALE_AFTER, clock=clock)
    watch.watch(lease.lease_key for lease in leases)
    return watch, store, clock


def renewed(store: InMemoryLeaseStore, key: str) -> None:
    lease = store.get_lease(key)
    assert lease is not None and store.renew_lease(lease).applied


CLOSING_CASES = [
    pytest.param(parent(), True, id="closed-shard-held-by-a-slot-of-the-round"),
    pytest.param(parent(key="shardId-7"), False, id="open-shard"),
    pytest.param(parent(checkpoint=SHARD_END), False, id="already-at-shard-end"),
    pytest.param(parent(owner=None), False, id="held-by-nobody"),
    pytest.param(parent(owner="app-worker-9"), False, id="held-by-a-slot-of-another-parallelism"),
]


@pytest.mark.parametrize(("lease", "closing"), CLOSING_CASES)
def test_the_driver_names_the_leases_of_closed_shards_the_rounds_slots_hold(lease, closing):
    assert closing_lease_keys([lease], {"shardId-0"}, SLOTS) == ((lease.lease_key,) if closing else ())


def test_a_parent_whose_counter_keeps_moving_is_watched_until_it_ends_and_is_returned_once():
    watch, store, clock = watching(parent())
    for _ in range(5):
        assert watch.poll(store) == [] and watch.in_flight
        clock.now += STALE_AFTER - 1
        renewed(store, "shardId-0")
    lease = store.get_lease("shardId-0")
    assert lease is not None and store.checkpoint(lease, SHARD_END).applied
    ended = watch.poll(store)
    assert [lease.lease_key for lease in ended] == ["shardId-0"] and ended[0].child_shard_ids == {"shardId-1"}
    assert not watch.in_flight and watch.poll(store) == []


def test_a_parent_whose_counter_stood_still_for_two_renewals_is_no_longer_waited_for():
    watch, store, clock = watching(parent())
    assert watch.poll(store) == [] and watch.in_flight
    clock.now += STALE_AFTER - 0.5
    assert watch.poll(store) == [] and watch.in_flight
    clock.now += 1
    assert watch.poll(store) == [] and not watch.in_flight


@pytest.mark.parametrize(
    "lease",
    [
        pytest.param(parent(owner=ME), id="held-by-the-watcher-itself"),
        pytest.param(parent(owner=None), id="held-by-nobody"),
        pytest.param(parent(owner="someone-else"), id="held-outside-the-round"),
    ],
)
def test_a_parent_nobody_else_in_the_round_reads_is_not_waited_for(lease):
    watch, store, _ = watching(lease)
    assert watch.poll(store) == [] and not watch.in_flight


def test_a_deleted_parent_is_not_waited_for_and_a_key_watched_twice_is_read_once():
    watch, store, _ = watching(parent())
    watch.watch(["shardId-0", "shardId-0"])
    store.delete_lease("shardId-0")
    assert watch.poll(store) == [] and not watch.in_flight


def test_a_parent_let_go_is_never_watched_again_so_the_wait_ends():
    watch, store, clock = watching(parent())
    watch.poll(store)
    clock.now += STALE_AFTER
    assert watch.poll(store) == [] and not watch.in_flight
    renewed(store, "shardId-0")  # moving again, but this slot already stopped waiting for it
    watch.watch(["shardId-0"])
    assert not watch.in_flight


def test_a_parent_that_itself_waits_on_its_parents_is_renewed_not_read_and_is_not_waited_for():
    grandparent = Lease("shardId-8", lease_owner=SLOTS[2], checkpoint=READING)
    waiting = parent().replace(parent_shard_ids=frozenset({"shardId-8"}))
    watch, store, _ = watching(waiting)
    assert store.create_lease_if_not_exists(grandparent)
    assert watch.poll(store) == [] and not watch.in_flight


def test_a_parent_whose_own_parents_have_finished_is_waited_for():
    finished = Lease("shardId-8", checkpoint=SHARD_END)
    child_of_finished = parent().replace(parent_shard_ids=frozenset({"shardId-8", "shardId-9"}))
    watch, store, _ = watching(child_of_finished)
    assert store.create_lease_if_not_exists(finished)
    assert watch.poll(store) == [] and watch.in_flight


def test_stop_lets_go_of_every_parent():
    watch, store, _ = watching(parent(), parent(key="shardId-3"))
    watch.stop()
    watch.watch(["shardId-0"])
    assert not watch.in_flight and watch.poll(store) == []


def test_a_parent_already_at_shard_end_is_returned_at_the_first_poll():
    watch, store, _ = watching(parent(checkpoint=SHARD_END), Lease("shardId-5", checkpoint=TRIM_HORIZON))
    assert [lease.lease_key for lease in watch.poll(store)] == ["shardId-0"]
    assert not watch.in_flight
