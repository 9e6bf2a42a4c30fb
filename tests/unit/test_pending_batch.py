"""The prepared batch's description in pendingCheckpointState: what a redo reads back."""

from __future__ import annotations

import pytest

from lease_core.errors import CorruptLeaseError
from lease_core.model.lease import HashKeyRange, Lease
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import LATEST, SHARD_END, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard

ESN = ExtendedSequenceNumber
CHILDREN = (
    ChildShard("shardId-000000000002", frozenset({"shardId-000000000000"}), HashKeyRange(0, 2**127)),
    ChildShard("shardId-000000000003", frozenset({"shardId-000000000000"}), HashKeyRange(2**127 + 1, 2**128 - 1)),
)


def pending_lease(batch: PendingBatch) -> Lease:
    return Lease(
        "shardId-000000000000",
        checkpoint=batch.start,
        lease_owner="app-worker-0",
        pending_checkpoint=batch.end,
        pending_checkpoint_state=batch.encode(),
    )


@pytest.mark.parametrize(
    "batch",
    [
        pytest.param(PendingBatch(ESN("100"), ESN("250", 3), ESN("101"), "s/p/f.parquet", 40), id="numbers"),
        pytest.param(PendingBatch(LATEST, ESN("7"), ESN("5", 1), "s/p/g.parquet", 3), id="from-latest"),
        pytest.param(PendingBatch(ESN("9"), SHARD_END, ESN("10"), None, 0, CHILDREN), id="shard-end-children"),
    ],
)
def test_a_batch_reads_back_exactly_as_it_was_prepared(batch):
    assert PendingBatch.decode(pending_lease(batch)) == batch


def test_the_encoding_is_deterministic():
    batch = PendingBatch(ESN("9"), SHARD_END, None, None, 0, CHILDREN)
    assert batch.encode() == PendingBatch(ESN("9"), SHARD_END, None, None, 0, CHILDREN[::-1]).encode()


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(b"\x00\x01binary", id="binary"),
        pytest.param(b'{"some":"kcl app state"}', id="foreign-json"),
        pytest.param(b"[1, 2]", id="json-list"),
    ],
)
def test_state_written_by_someone_else_is_not_ours(state):
    lease = Lease("shardId-1", checkpoint=ESN("1"), pending_checkpoint=ESN("2"), pending_checkpoint_state=state)
    assert PendingBatch.decode(lease) is None


def test_a_description_of_other_checkpoints_is_ignored():
    batch = PendingBatch(ESN("100"), ESN("200"), ESN("101"), "x.parquet", 5)
    lease = pending_lease(batch).replace(checkpoint=ESN("150"))
    assert PendingBatch.decode(lease) is None


def test_a_lease_without_a_pending_checkpoint_has_no_batch():
    assert PendingBatch.decode(Lease("shardId-1", checkpoint=ESN("1"))) is None


def test_our_state_that_cannot_be_read_is_a_corrupt_lease():
    state = b'{"format":"kinesis-lease-batch/1","start":["1",0],"end":"oops"}'
    lease = Lease("shardId-1", checkpoint=ESN("1"), pending_checkpoint=ESN("2"), pending_checkpoint_state=state)
    with pytest.raises(CorruptLeaseError, match="pendingCheckpointState"):
        PendingBatch.decode(lease)
