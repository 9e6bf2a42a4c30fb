"""The KCL 3.5 stand-in's reading of a lease table (tests/support/kcl_worker.py) refuses what KCL's
deserializers could not read, so that a table it reads back is one KCL can take."""

from __future__ import annotations

import pytest

from tests.support.kcl_tables import LEADER_LOCK, LEASE, TABLE_MIGRATION, WORKER_METRIC_STATS
from tests.support.kcl_worker import UnreadableByKcl, entity_type, read_lease, read_worker_metrics


def test_a_lease_written_as_kcl_3_5_writes_it_reads_with_its_checkpoint_parents_and_range():
    lease = read_lease(LEASE)
    assert (lease.lease_key, lease.lease_owner, lease.lease_counter) == ("shardId-000000000008", None, 0)
    assert (lease.checkpoint, lease.checkpoint_sub_sequence_number) == ("LATEST", 0)
    assert lease.parent_shard_ids == {"shardId-000000000006", "shardId-000000000007"}
    assert lease.hash_key_range == (0, 399)


def test_kcl_3_5_s_other_items_are_read_as_their_entities_and_an_unknown_tag_as_a_lease():
    assert [entity_type(item) for item in (LEASE, WORKER_METRIC_STATS, LEADER_LOCK, TABLE_MIGRATION)] == [
        "LEASE",
        "WORKER_METRIC_STATS",
        "LEADER",
        "TABLE_MIGRATION",
    ]
    assert entity_type({"leaseKey": {"S": "Leader"}}) == "LEADER"
    assert entity_type({**LEASE, "entityType": {"S": "ROUND_RECORD"}}) == "LEASE"
    assert read_worker_metrics(WORKER_METRIC_STATS) == ("worker-1", 1700000000, {"C": [12.5, -1.0]})


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        pytest.param({"leaseCounter": {"S": "3"}}, "leaseCounter is \\['S'\\]", id="counter-as-string"),
        pytest.param({"leaseCounter": {"N": "3.5"}}, "not a Java long", id="counter-fraction"),
        pytest.param({"checkpoint": {"N": "12"}}, "checkpoint is \\['N'\\]", id="checkpoint-as-number"),
        pytest.param({"checkpoint": {"S": "12abc"}}, "neither a sequence number nor a sentinel", id="checkpoint-text"),
        pytest.param({"pendingCheckpoint": {"S": "12"}}, "pendingCheckpoint '12' was left behind", id="pending"),
        pytest.param({"parentShardId": {"S": "shardId-1"}}, "parentShardId is \\['S'\\]", id="parents-as-string"),
        pytest.param({"endingHashKey": {"S": "0"}}, "not a range KCL accepts", id="inverted-range"),
        pytest.param({"entityType": {"S": "ROUND_RECORD"}}, "entityType 'ROUND_RECORD'", id="unknown-tag"),
    ],
)
def test_a_lease_item_kcl_could_not_read_as_meant_is_refused_naming_the_attribute(changes, problem):
    with pytest.raises(UnreadableByKcl, match=problem):
        read_lease({**LEASE, **changes})


def test_a_lease_without_a_counter_or_checkpoint_is_refused():
    for missing in ("leaseCounter", "checkpoint"):
        with pytest.raises(UnreadableByKcl, match=missing):
            read_lease({name: value for name, value in LEASE.items() if name != missing})


def test_worker_metrics_of_the_wrong_types_are_refused():
    with pytest.raises(UnreadableByKcl, match="lut is"):
        read_worker_metrics({**WORKER_METRIC_STATS, "lut": {"S": "1700000000"}})
    with pytest.raises(UnreadableByKcl, match=r"sts\.C is not a list of numbers"):
        read_worker_metrics({**WORKER_METRIC_STATS, "sts": {"M": {"C": {"L": [{"S": "12"}]}}}})
