"""Interleaved operations by several workers and a leader on one lease, for both stores.

Hypothesis draws the interleaving; an independent oracle (the conditions of docs/protocol.md §2.1,
written out here) says which writes must apply. After every step: the stored lease is exactly
what an applied write returned (no lost update), the counter never decreases and moves by exactly
one per applied fencing write, the checkpoint never moves backwards, and a failed write changed
nothing. A threaded test then races real concurrent writers against moto.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.store.lease_store import ConditionalLeaseStore
from lease_core.store.memory_store import InMemoryLeaseStore
from tests.support.stores import dynamodb_store

WORKERS = ("worker-0", "worker-1", "worker-2")
ACTORS = (*WORKERS, "leader")
_keys = itertools.count()

step = st.tuples(
    st.sampled_from(ACTORS),
    st.sampled_from(["refresh", "renew", "checkpoint", "prepare", "take", "assign", "handoff", "evict"]),
    st.sampled_from(WORKERS),
    st.integers(min_value=0, max_value=3),
)


def numeric(value: ExtendedSequenceNumber) -> int:
    return -1 if value.is_sentinel else int(value.sequence_number)


def expected_to_apply(operation: str, local: Lease, stored: Lease) -> bool:
    same_counter = local.lease_counter == stored.lease_counter
    same_owners = (local.lease_owner, local.checkpoint_owner) == (stored.lease_owner, stored.checkpoint_owner)
    if operation == "renew":
        return same_counter and (local.checkpoint_owner is not None or stored.checkpoint_owner is None)
    if operation in {"checkpoint", "prepare", "take"}:
        return same_counter
    if operation in {"assign", "evict"}:
        return same_owners
    if operation == "handoff":
        return local.lease_owner == stored.lease_owner and stored.checkpoint_owner is None
    raise AssertionError(operation)


def perform(store: ConditionalLeaseStore, operation: str, local: Lease, target: str, delta: int):
    position = ExtendedSequenceNumber(str(max(numeric(local.checkpoint), 0) + delta))
    if operation == "renew":
        return store.renew_lease(local)
    if operation == "checkpoint":
        return store.checkpoint(local, position)
    if operation == "prepare":
        return store.prepare_checkpoint(local, position, bytes([delta]))
    if operation == "take":
        return store.take_lease(local, target)
    if operation == "assign":
        return store.assign_lease(local, target)
    if operation == "evict":
        return store.evict_lease(local)
    return store.initiate_graceful_handoff(local, target)


def run_interleaving(store: ConditionalLeaseStore, steps) -> None:
    key = f"shardId-{next(_keys):012d}"
    assert store.create_lease_if_not_exists(Lease(key, checkpoint=TRIM_HORIZON))
    stored = store.get_lease(key, consistent=True)
    local = dict.fromkeys(ACTORS, stored)
    applied_fencing_writes = 0
    for actor, operation, target, delta in steps:
        before = store.get_lease(key, consistent=True)
        if operation == "refresh":
            local[actor] = before
            continue
        if operation == "handoff" and (local[actor].lease_owner is None or local[actor].checkpoint_owner is not None):
            continue  # refused locally: nothing to hand off, or a handoff is already known
        result = perform(store, operation, local[actor], target, delta)
        after = store.get_lease(key, consistent=True)
        assert result.applied == expected_to_apply(operation, local[actor], before), (operation, local[actor], before)
        if result.applied:
            assert result.lease == after, "an applied write's result is what the table holds"
            increment = 0 if operation == "handoff" else 1
            assert after.lease_counter == before.lease_counter + increment
            applied_fencing_writes += increment
            local[actor] = after
        else:
            assert after == before, "a write whose condition failed changed nothing"
            assert result.lease == before
        assert after.checkpoint >= before.checkpoint
    final = store.get_lease(key, consistent=True)
    assert final.lease_counter == applied_fencing_writes


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=40))
def test_interleavings_on_the_in_memory_store_lose_no_update(steps):
    run_interleaving(InMemoryLeaseStore(), steps)


@pytest.fixture(scope="module")
def shared_dynamodb_store(moto_endpoint):
    return dynamodb_store(moto_endpoint, "interleavings")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=25))
def test_interleavings_on_dynamodb_lose_no_update(shared_dynamodb_store, steps):
    run_interleaving(shared_dynamodb_store, steps)


def test_concurrent_checkpointers_on_dynamodb_each_win_exactly_their_counted_writes(shared_dynamodb_store):
    store = shared_dynamodb_store
    key = f"shardId-race-{next(_keys)}"
    store.create_lease_if_not_exists(Lease(key, checkpoint=ExtendedSequenceNumber("0")))
    wins = [0] * 4
    observed: list[list[int]] = [[] for _ in wins]
    stop = threading.Event()

    def contend(index: int) -> None:
        for _ in range(25):
            local = store.get_lease(key, consistent=True)
            observed[index].append(int(local.checkpoint.sequence_number))
            result = store.checkpoint(local, ExtendedSequenceNumber(str(int(local.checkpoint.sequence_number) + 1)))
            wins[index] += result.applied
            if stop.is_set():
                return

    with ThreadPoolExecutor(max_workers=len(wins)) as pool:
        list(pool.map(contend, range(len(wins))))
    final = store.get_lease(key, consistent=True)
    assert final.lease_counter == sum(wins)
    assert int(final.checkpoint.sequence_number) == sum(wins), "every win advanced the checkpoint by one"
    assert all(seen == sorted(seen) for seen in observed), "no reader saw the checkpoint move backwards"


def test_two_writers_with_the_same_counter_never_both_win(shared_dynamodb_store):
    store = shared_dynamodb_store
    for _ in range(20):
        key = f"shardId-pair-{next(_keys)}"
        store.create_lease_if_not_exists(Lease(key))
        local = store.get_lease(key, consistent=True)
        barrier = threading.Barrier(2)

        def write(position: str, barrier: threading.Barrier = barrier, local: Lease | None = local) -> bool:
            barrier.wait()
            assert local is not None
            return store.checkpoint(local, ExtendedSequenceNumber(position)).applied

        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = list(pool.map(write, ["10", "20"]))
        assert outcomes.count(True) == 1
