"""The audit of what a sink holds against the checkpoints (`leasectl verify`), and the restore plan: a
lease's landed batches must chain without gaps or overlaps and end at its checkpoint or where its
waiting batches begin."""

from __future__ import annotations

import pytest

from lease_core.model.lease import Lease
from lease_core.model.sequence import LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.ops.landed_audit import Finding, LandedBatch, audit_landed, plan_restore

KEY = "shardId-000000000001"


def at(number: int, sub: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(number), sub)


def batch(start: ExtendedSequenceNumber, end: ExtendedSequenceNumber, round_number: int = 1) -> LandedBatch:
    return LandedBatch(KEY, start, end, round_number, 100 + round_number)


CHAIN = [batch(TRIM_HORIZON, at(10), 1), batch(at(10), at(20), 2)]


@pytest.mark.parametrize(
    ("checkpoint", "landed", "awaiting", "expected"),
    [
        pytest.param(at(20), CHAIN, None, [], id="agree"),
        pytest.param(SHARD_END, CHAIN, None, [], id="finished"),
        pytest.param(TRIM_HORIZON, [], None, [], id="nothing-yet"),
        pytest.param(at(30), CHAIN, at(20), [Finding.AWAITING], id="awaiting-the-next-commit"),
        pytest.param(at(30), [], TRIM_HORIZON, [Finding.AWAITING], id="awaiting-the-first-commit"),
        pytest.param(at(30), CHAIN, at(25), [Finding.GAP], id="waiting-batches-leave-a-gap"),
        pytest.param(at(30), CHAIN, None, [Finding.CHECKPOINT_AHEAD], id="committed-but-nowhere"),
        pytest.param(at(15), CHAIN, None, [Finding.SINK_AHEAD], id="checkpoint-moved-back"),
        pytest.param(LATEST, CHAIN, None, [Finding.SINK_AHEAD], id="lease-table-made-again"),
        pytest.param(
            at(30), [*CHAIN, batch(at(25), at(30), 3)], None, [Finding.GAP], id="a-batch-missing-between-commits"
        ),
        pytest.param(
            at(30), [*CHAIN, batch(at(15), at(30), 3)], None, [Finding.OVERLAP], id="a-batch-landed-twice-in-part"
        ),
    ],
)
def test_a_leases_landed_batches_against_its_checkpoint(checkpoint, landed, awaiting, expected):
    lease = Lease(KEY, checkpoint=checkpoint)
    findings = audit_landed([lease], landed, {} if awaiting is None else {KEY: awaiting})
    assert [finding.finding for finding in findings] == expected
    assert all(KEY in finding.render() for finding in findings)


def test_only_awaiting_publication_is_not_a_fault():
    assert [finding for finding in Finding if not finding.is_fault] == [Finding.AWAITING]


def test_restore_moves_leases_behind_the_sink_forward_and_names_the_ones_the_table_lacks():
    leases = [
        Lease(KEY, checkpoint=TRIM_HORIZON),
        Lease("shardId-000000000002", checkpoint=at(50)),
        Lease("shardId-000000000003", checkpoint=at(5)),
    ]
    landed = [
        *CHAIN,
        LandedBatch("shardId-000000000002", TRIM_HORIZON, at(40), 1, 1),
        LandedBatch("shardId-000000000003", TRIM_HORIZON, at(9), 1, 1),
        LandedBatch("shardId-000000000009", TRIM_HORIZON, at(7), 1, 1),
    ]

    restores, missing = plan_restore(leases, landed)

    assert [(restore.lease.lease_key, restore.target) for restore in restores] == [
        (KEY, at(20)),
        ("shardId-000000000003", at(9)),
    ]
    assert missing == ["shardId-000000000009"]


LOST = LandedBatch(KEY, at(20), at(25), 3, 0, lost=True)


@pytest.mark.parametrize(
    "landed",
    [
        pytest.param([*CHAIN, batch(at(25), at(30), 3), LOST], id="the-gap-in-the-chain-too"),
        pytest.param([batch(at(30), at(30), 3), LOST], id="the-history-of-the-gap-expired"),
    ],
)
def test_a_range_the_sink_records_as_named_lost_is_one_gap_and_never_a_restore_target(landed):
    findings = audit_landed([Lease(KEY, checkpoint=at(30))], landed, {})
    assert [(finding.finding, finding.detail) for finding in findings] == [
        (Finding.GAP, "round 3 named the records after 20 through 25 lost: the sink does not hold them")
    ]
    restores, _ = plan_restore([Lease(KEY, checkpoint=TRIM_HORIZON)], landed)
    assert [restore.target for restore in restores] == [at(30)]
