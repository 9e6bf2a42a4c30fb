"""Behaviour of the conditional writes of the lease protocol (docs/protocol.md §2.1-2.3) and their rendering."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from lease_core.model.lease import AgedOutRange, HashKeyRange, Lease, MeasurementBeforeClaim, StreamIdentifier
from lease_core.model.sequence import LATEST, ExtendedSequenceNumber
from lease_core.store import lease_writes
from lease_core.store.dynamodb_store import render_delete, render_update
from lease_core.store.lease_writes import (
    AttributeAbsent,
    AttributeEquals,
    AttributeExists,
    LeaseUpdate,
    MetaField,
)

EXISTS = "exists"
ABSENT = "absent"
PENDING = ("pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState")
# An update removes the committed batch's file name unless it writes one (a no-op where it is absent).
FILE = "committedBatchFile"
PIN = "latestStartMillis"  # removed by every checkpoint write off LATEST
STREAM = StreamIdentifier("123456789012", "stream", 1)
LOSSES = "unreportedRetentionLosses"
AGED_OUT = AgedOutRange("4", "7", "2026-11-23T10:00:00+00:00")
EARLIER_AGED_OUT = AgedOutRange("1", None, None)


@dataclass(frozen=True)
class Write:
    """A LeaseUpdate without ordering: conditions by attribute (a value, EXISTS or ABSENT), actions by kind."""

    conditions: dict[str, Any]
    set: dict[str, Any] = field(default_factory=dict)
    remove: frozenset[str] = frozenset()
    add: dict[str, int] = field(default_factory=dict)
    add_to_sets: dict[str, Any] = field(default_factory=dict)
    delete_from_sets: dict[str, Any] = field(default_factory=dict)


def described(update: LeaseUpdate) -> Write:
    conditions: dict[str, Any] = {}
    for condition in update.conditions:
        assert condition.name not in conditions, f"two conditions on {condition.name}"
        if isinstance(condition, AttributeEquals):
            conditions[condition.name] = condition.value
        elif isinstance(condition, AttributeExists):
            conditions[condition.name] = EXISTS
        else:
            assert isinstance(condition, AttributeAbsent)
            conditions[condition.name] = ABSENT
    return Write(
        conditions,
        dict(update.set_attributes),
        frozenset(update.remove_attributes),
        dict(update.add_numbers),
        dict(update.add_to_sets),
        dict(update.delete_from_sets),
    )


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def s(value: str) -> dict[str, str]:
    return {"S": value}


OWNED = Lease("shardId-1", lease_owner="worker-a", lease_counter=3)
IN_HANDOFF = Lease("shardId-1", lease_owner="worker-b", checkpoint_owner="worker-a", lease_counter=3)
UNOWNED = Lease("shardId-1", lease_counter=3)
CLAIMED = OWNED.replace(claim_token="attempt-1")
HANDOFF_TO_SELF = Lease("shardId-1", lease_owner="worker-a", checkpoint_owner="worker-a", lease_counter=3)

Make = Callable[[], LeaseUpdate]

WRITES = [
    # --- renew: counter-conditional +1; no handoff may have started unless the holder knows of it ---
    pytest.param(
        lambda: lease_writes.renew(OWNED),
        Write({"leaseCounter": n(3), "checkpointOwner": ABSENT}, {"leaseCounter": n(4)}),
        id="renew-without-local-checkpoint-owner",
    ),
    pytest.param(
        lambda: lease_writes.renew(IN_HANDOFF),
        Write({"leaseCounter": n(3)}, {"leaseCounter": n(4)}),
        id="renew-with-local-checkpoint-owner",
    ),
    pytest.param(
        lambda: lease_writes.renew(OWNED.replace(throughput_kbps=12.3456785)),
        Write(
            {"leaseCounter": n(3), "checkpointOwner": ABSENT},
            {"leaseCounter": n(4), "throughputKBps": {"N": "12.345679"}},
            remove=frozenset({"measuredBeforeClaim"}),
        ),
        id="renew-with-throughput",
    ),
    pytest.param(
        lambda: lease_writes.renew(OWNED.replace(throughput_kbps=2.0, read_through_millis=1_763_900_000_000)),
        Write(
            {"leaseCounter": n(3), "checkpointOwner": ABSENT},
            {"leaseCounter": n(4), "throughputKBps": {"N": "2.000000"}, "readThroughMillis": n(1_763_900_000_000)},
            remove=frozenset({"measuredBeforeClaim"}),
        ),
        id="renew-with-a-measurement-of-its-own-settles-any-stand-in",
    ),
    pytest.param(
        lambda: lease_writes.claim(
            OWNED.replace(
                throughput_kbps=1.0,
                read_through_millis=1_763_900_060_000,
                measured_before_claim=MeasurementBeforeClaim(7, 2.0, 1_763_900_000_000),
            ),
            "attempt-1",
        ),
        Write(
            {"leaseCounter": n(3), "checkpointOwner": ABSENT},
            {
                "leaseCounter": n(4),
                "throughputKBps": {"N": "1.000000"},
                "readThroughMillis": n(1_763_900_060_000),
                "measuredBeforeClaim": s('{"readThroughMillis":1763900000000,"round":7,"throughputKBps":2.0}'),
                "claimToken": s("attempt-1"),
            },
            frozenset({PIN}),
        ),
        id="claim-with-a-stand-in-measurement-keeps-the-one-it-replaces",
    ),
    pytest.param(
        lambda: lease_writes.renew(CLAIMED),
        Write({"leaseCounter": n(3), "checkpointOwner": ABSENT, "claimToken": s("attempt-1")}, {"leaseCounter": n(4)}),
        id="renew-of-a-claimed-lease-requires-its-token",
    ),
    # --- claim: a renewal that stores a new attempt's token, whatever token was there ---
    pytest.param(
        lambda: lease_writes.claim(CLAIMED, "attempt-2"),
        Write(
            {"leaseCounter": n(3), "checkpointOwner": ABSENT},
            {"leaseCounter": n(4), "claimToken": s("attempt-2")},
            frozenset({PIN}),  # a pin another writer left beside a checkpoint off LATEST goes
        ),
        id="claim-stores-the-new-token-without-requiring-the-old-one",
    ),
    pytest.param(
        lambda: lease_writes.claim(CLAIMED.replace(checkpoint=LATEST).pinned_at_latest(1_700_000_000_000), "attempt-2"),
        Write(
            {"leaseCounter": n(3), "checkpointOwner": ABSENT},
            {"leaseCounter": n(4), "claimToken": s("attempt-2"), PIN: n(1_700_000_000_000)},
        ),
        id="claim-of-a-lease-at-latest-stores-its-pin",
    ),
    pytest.param(
        lambda: lease_writes.claim(CLAIMED.replace(latest_start_millis=1_700_000_000_000), "attempt-2"),
        Write(
            {"leaseCounter": n(3), "checkpointOwner": ABSENT},
            {"leaseCounter": n(4), "claimToken": s("attempt-2")},
        ),
        id="claim-off-latest-never-writes-a-pin",
    ),
    # --- take: counter-conditional owner change that cancels a handoff ---
    pytest.param(
        lambda: lease_writes.take(OWNED, "worker-b"),
        Write(
            {"leaseCounter": n(3)},
            {"leaseCounter": n(4), "leaseOwner": s("worker-b")},
            frozenset({"checkpointOwner"}),
            {"ownerSwitchesSinceCheckpoint": 1},
        ),
        id="take-owner-change-counts-a-switch",
    ),
    pytest.param(
        lambda: lease_writes.take(OWNED, "worker-a"),
        Write(
            {"leaseCounter": n(3)},
            {"leaseCounter": n(4), "leaseOwner": s("worker-a")},
            frozenset({"checkpointOwner"}),
        ),
        id="take-same-owner-counts-no-switch",
    ),
    pytest.param(
        lambda: lease_writes.take(UNOWNED, "worker-b"),
        Write(
            {"leaseCounter": n(3)},
            {"leaseCounter": n(4), "leaseOwner": s("worker-b")},
            frozenset({"checkpointOwner"}),
        ),
        id="take-unowned-counts-no-switch",
    ),
    pytest.param(
        lambda: lease_writes.take(IN_HANDOFF, "worker-a"),
        Write(
            {"leaseCounter": n(3)},
            {"leaseCounter": n(4), "leaseOwner": s("worker-a")},
            frozenset({"checkpointOwner"}),
            {"ownerSwitchesSinceCheckpoint": 1},
        ),
        id="take-back-to-checkpoint-owner-counts-a-switch",
    ),
    pytest.param(
        lambda: lease_writes.take(HANDOFF_TO_SELF, "worker-a"),
        Write(
            {"leaseCounter": n(3)},
            {"leaseCounter": n(4), "leaseOwner": s("worker-a")},
            frozenset({"checkpointOwner"}),
            {"ownerSwitchesSinceCheckpoint": 1},
        ),
        id="take-to-checkpoint-owner-who-is-also-owner-counts-a-switch",
    ),
    # --- evict: owner-conditional, fences by ADD 1 ---
    pytest.param(
        lambda: lease_writes.evict(OWNED),
        Write(
            {"leaseOwner": s("worker-a"), "checkpointOwner": ABSENT, "leaseKey": EXISTS},
            remove=frozenset({"leaseOwner", "checkpointOwner"}),
            add={"leaseCounter": 1},
        ),
        id="evict-without-checkpoint-owner-drops-the-owner",
    ),
    pytest.param(
        lambda: lease_writes.evict(IN_HANDOFF),
        Write(
            {"leaseOwner": s("worker-b"), "checkpointOwner": s("worker-a"), "leaseKey": EXISTS},
            remove=frozenset({"checkpointOwner"}),
            add={"leaseCounter": 1},
        ),
        id="evict-with-checkpoint-owner-drops-only-the-checkpoint-owner",
    ),
    pytest.param(
        lambda: lease_writes.evict(UNOWNED),
        Write(
            {"leaseOwner": ABSENT, "checkpointOwner": ABSENT, "leaseKey": EXISTS},
            remove=frozenset({"leaseOwner", "checkpointOwner"}),
            add={"leaseCounter": 1},
        ),
        id="evict-unowned-expects-no-owner",
    ),
    # --- assign: owner-conditional (no counter check), fences by ADD 1 ---
    pytest.param(
        lambda: lease_writes.assign(UNOWNED, "worker-b"),
        Write(
            {"leaseOwner": ABSENT, "checkpointOwner": ABSENT, "leaseKey": EXISTS},
            {"leaseOwner": s("worker-b")},
            frozenset({"checkpointOwner"}),
            {"leaseCounter": 1},
        ),
        id="assign-unowned",
    ),
    pytest.param(
        lambda: lease_writes.assign(OWNED, "worker-b"),
        Write(
            {"leaseOwner": s("worker-a"), "checkpointOwner": ABSENT, "leaseKey": EXISTS},
            {"leaseOwner": s("worker-b")},
            frozenset({"checkpointOwner"}),
            {"leaseCounter": 1, "ownerSwitchesSinceCheckpoint": 1},
        ),
        id="assign-owner-change-counts-a-switch",
    ),
    pytest.param(
        lambda: lease_writes.assign(OWNED, "worker-a"),
        Write(
            {"leaseOwner": s("worker-a"), "checkpointOwner": ABSENT, "leaseKey": EXISTS},
            {"leaseOwner": s("worker-a")},
            frozenset({"checkpointOwner"}),
            {"leaseCounter": 1},
        ),
        id="assign-same-owner-counts-no-switch",
    ),
    pytest.param(
        lambda: lease_writes.assign(IN_HANDOFF, "worker-b"),
        Write(
            {"leaseOwner": s("worker-b"), "checkpointOwner": s("worker-a"), "leaseKey": EXISTS},
            {"leaseOwner": s("worker-b")},
            frozenset({"checkpointOwner"}),
            {"leaseCounter": 1},
        ),
        id="assign-completing-a-handoff-counts-no-switch",
    ),
    pytest.param(
        lambda: lease_writes.assign(IN_HANDOFF, "worker-a"),
        Write(
            {"leaseOwner": s("worker-b"), "checkpointOwner": s("worker-a"), "leaseKey": EXISTS},
            {"leaseOwner": s("worker-a")},
            frozenset({"checkpointOwner"}),
            {"leaseCounter": 1, "ownerSwitchesSinceCheckpoint": 1},
        ),
        id="assign-back-to-checkpoint-owner-counts-a-switch",
    ),
    # --- graceful handoff: counter unchanged ---
    pytest.param(
        lambda: lease_writes.initiate_graceful_handoff(OWNED, "worker-b"),
        Write(
            {"leaseOwner": s("worker-a"), "checkpointOwner": ABSENT, "leaseKey": EXISTS},
            {"leaseOwner": s("worker-b"), "checkpointOwner": s("worker-a")},
        ),
        id="initiate-graceful-handoff",
    ),
    # --- update: counter-conditional rewrite of the checkpoint fields ---
    pytest.param(
        lambda: lease_writes.update(OWNED.replace(checkpoint=ExtendedSequenceNumber("5", 2))),
        Write(
            {"leaseCounter": n(3)},
            {
                "leaseCounter": n(4),
                "checkpoint": s("5"),
                "checkpointSubSequenceNumber": n(2),
                "ownerSwitchesSinceCheckpoint": n(0),
            },
            frozenset(PENDING) | {FILE, PIN},
        ),
        id="update-without-pending-removes-the-three-pending-attributes",
    ),
    pytest.param(
        lambda: lease_writes.update(
            OWNED.replace(
                owner_switches_since_checkpoint=2,
                pending_checkpoint=ExtendedSequenceNumber("9", 1),
                pending_checkpoint_state=b"state",
            )
        ),
        Write(
            {"leaseCounter": n(3)},
            {
                "leaseCounter": n(4),
                "checkpoint": s("TRIM_HORIZON"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(2),
                "pendingCheckpoint": s("9"),
                "pendingCheckpointSubSequenceNumber": n(1),
                "pendingCheckpointState": {"B": b"state"},
            },
            frozenset({FILE, PIN}),
        ),
        id="update-with-pending-and-state",
    ),
    pytest.param(
        lambda: lease_writes.update(OWNED.replace(pending_checkpoint=ExtendedSequenceNumber("9"))),
        Write(
            {"leaseCounter": n(3)},
            {
                "leaseCounter": n(4),
                "checkpoint": s("TRIM_HORIZON"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(0),
                "pendingCheckpoint": s("9"),
                "pendingCheckpointSubSequenceNumber": n(0),
            },
            frozenset({"pendingCheckpointState", FILE, PIN}),
        ),
        id="update-with-pending-without-state-removes-the-state",
    ),
    pytest.param(
        lambda: lease_writes.update(
            OWNED.replace(
                checkpoint=ExtendedSequenceNumber("SHARD_END"),
                child_shard_ids={"shardId-3", "shardId-2"},
                parent_shard_ids={"shardId-0"},
                hash_key_range=HashKeyRange(0, 399),
                throughput_kbps=1.0,
            )
        ),
        Write(
            {"leaseCounter": n(3)},
            {
                "leaseCounter": n(4),
                "checkpoint": s("SHARD_END"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(0),
                "childShardIds": {"SS": ["shardId-2", "shardId-3"]},
                "startingHashKey": s("0"),
                "endingHashKey": s("399"),
            },
            frozenset(PENDING) | {FILE, PIN},
        ),
        id="update-with-children-and-hash-range-never-writes-parents-or-throughput",
    ),
    pytest.param(
        lambda: lease_writes.update(Lease.for_stream(STREAM, "shardId-4", lease_owner="w", lease_counter=7)),
        Write(
            {"leaseCounter": n(7)},
            {
                "leaseCounter": n(8),
                "checkpoint": s("TRIM_HORIZON"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(0),
                "streamName": s("123456789012:stream:1"),
                "shardId": s("shardId-4"),
            },
            frozenset(PENDING) | {FILE, PIN},
        ),
        id="update-multi-stream-writes-stream-and-shard",
    ),
    pytest.param(
        lambda: lease_writes.update(CLAIMED.with_checkpoint(ExtendedSequenceNumber("9"), "s=x/8-0_9-0.parquet")),
        Write(
            {"leaseCounter": n(3), "claimToken": s("attempt-1")},
            {
                "leaseCounter": n(4),
                "checkpoint": s("9"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(0),
                FILE: s("s=x/8-0_9-0.parquet"),
            },
            frozenset(PENDING) | {PIN},
        ),
        id="update-of-a-claimed-lease-requires-its-token-and-names-the-committed-file",
    ),
    pytest.param(
        lambda: lease_writes.update(
            CLAIMED.replace(checkpoint=LATEST, latest_start_millis=1_700_000_000_000).with_pending_checkpoint(
                ExtendedSequenceNumber("9")
            )
        ),
        Write(
            {"leaseCounter": n(3), "claimToken": s("attempt-1")},
            {
                "leaseCounter": n(4),
                "checkpoint": s("LATEST"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(0),
                "pendingCheckpoint": s("9"),
                "pendingCheckpointSubSequenceNumber": n(0),
                PIN: n(1_700_000_000_000),
            },
            frozenset({"pendingCheckpointState", FILE}),
        ),
        id="prepare-at-a-pinned-latest-keeps-the-pin",
    ),
    pytest.param(
        lambda: lease_writes.update(
            CLAIMED.replace(checkpoint=LATEST, latest_start_millis=1_700_000_000_000).with_checkpoint(
                ExtendedSequenceNumber("9")
            )
        ),
        Write(
            {"leaseCounter": n(3), "claimToken": s("attempt-1")},
            {
                "leaseCounter": n(4),
                "checkpoint": s("9"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(0),
            },
            frozenset(PENDING) | {FILE, PIN},
        ),
        id="a-checkpoint-off-latest-removes-the-pin",
    ),
    pytest.param(
        lambda: lease_writes.update(
            CLAIMED.replace(unreported_losses={EARLIER_AGED_OUT}).with_checkpoint(ExtendedSequenceNumber("9")),
            frozenset({AGED_OUT}),
        ),
        Write(
            {"leaseCounter": n(3), "claimToken": s("attempt-1")},
            {
                "leaseCounter": n(4),
                "checkpoint": s("9"),
                "checkpointSubSequenceNumber": n(0),
                "ownerSwitchesSinceCheckpoint": n(0),
            },
            frozenset(PENDING) | {FILE, PIN},
            add_to_sets={LOSSES: {"SS": [AGED_OUT.encode()]}},
        ),
        id="update-past-a-retention-gap-adds-only-the-new-loss-to-the-unreported-ones",
    ),
    # --- forget_reported_losses: exactly the named ranges, any holder, counter untouched ---
    pytest.param(
        lambda: lease_writes.forget_reported_losses("shardId-1", frozenset({AGED_OUT, EARLIER_AGED_OUT})),
        Write(
            {"leaseKey": EXISTS},
            delete_from_sets={LOSSES: {"SS": sorted([AGED_OUT.encode(), EARLIER_AGED_OUT.encode()])}},
        ),
        id="forget-reported-losses-deletes-exactly-them-from-the-set",
    ),
    # --- update_meta: any existing item, counter untouched ---
    pytest.param(
        lambda: lease_writes.update_meta(OWNED.replace(child_shard_ids={"shardId-9"}), MetaField.CHILD_SHARDS),
        Write({"leaseKey": EXISTS}, {"childShardIds": {"SS": ["shardId-9"]}}),
        id="update-meta-child-shards",
    ),
    pytest.param(
        lambda: lease_writes.update_meta(
            OWNED.replace(hash_key_range=HashKeyRange(400, 799), child_shard_ids={"shardId-9"}),
            MetaField.HASH_KEY_RANGE,
        ),
        Write({"leaseKey": EXISTS}, {"startingHashKey": s("400"), "endingHashKey": s("799")}),
        id="update-meta-hash-key-range",
    ),
]


@pytest.mark.parametrize(("make", "expected"), WRITES)
def test_each_write_has_exactly_the_protocol_conditions_and_actions(make: Make, expected: Write) -> None:
    update = make()
    assert update.lease_key in ("shardId-1", "123456789012:stream:1:shardId-4")
    assert described(update) == expected


@pytest.mark.parametrize(("make", "_expected"), WRITES)
def test_a_write_touches_each_attribute_with_at_most_one_action(make: Make, _expected: Write) -> None:
    update = make()
    touched = [name for name, _ in update.set_attributes] + list(update.remove_attributes)
    touched += [name for name, _ in update.add_numbers]
    assert len(touched) == len(set(touched))


REFUSED = [
    pytest.param(lambda: lease_writes.initiate_graceful_handoff(UNOWNED, "worker-b"), id="handoff-without-owner"),
    pytest.param(lambda: lease_writes.initiate_graceful_handoff(IN_HANDOFF, "worker-c"), id="handoff-already-in-one"),
    pytest.param(lambda: lease_writes.update_meta(OWNED, MetaField.CHILD_SHARDS), id="meta-without-child-ids"),
    pytest.param(lambda: lease_writes.update_meta(OWNED, MetaField.HASH_KEY_RANGE), id="meta-without-hash-range"),
]


@pytest.mark.parametrize("make", REFUSED)
def test_writes_with_nothing_meaningful_to_do_are_refused(make: Make) -> None:
    with pytest.raises(ValueError, match="shardId-1"):
        make()


# --- rendering as UpdateItem arguments ------------------------------------------------------------

KEYWORDS = {
    "SET",
    "REMOVE",
    "ADD",
    "DELETE",
    "AND",
    "OR",
    "attribute_exists",
    "attribute_not_exists",
    "=",
    ",",
    "(",
    ")",
}
# Every lease update and delete ends with the lease guard (`lease_writes.IS_LEASE`).
GUARD = "(attribute_not_exists(#n{0}) OR #n{0} = :v{1})"


def placeholders(expression: str, prefix: str) -> set[str]:
    return set(re.findall(rf"{prefix}\w+", expression))


@pytest.mark.parametrize(("make", "_expected"), WRITES)
def test_expressions_hold_only_placeholders_and_keywords(make: Make, _expected: Write) -> None:
    arguments = render_update(make())
    for expression in (arguments["UpdateExpression"], arguments["ConditionExpression"]):
        tokens = re.findall(r"[#:]?\w+|[^\s\w]", expression)
        assert [t for t in tokens if t not in KEYWORDS and not re.fullmatch(r"#n\d+|:v\d+", t)] == []


@pytest.mark.parametrize(("make", "_expected"), WRITES)
def test_every_placeholder_used_is_defined_and_every_defined_one_is_used(make: Make, _expected: Write) -> None:
    arguments = render_update(make())
    text = arguments["UpdateExpression"] + " " + arguments["ConditionExpression"]
    assert placeholders(text, "#") == set(arguments["ExpressionAttributeNames"])
    assert placeholders(text, ":") == set(arguments.get("ExpressionAttributeValues", {}))


def test_a_complex_update_renders_its_names_and_values_through_placeholders() -> None:
    lease = Lease.for_stream(
        STREAM,
        "shardId-4",
        lease_owner="w",
        lease_counter=7,
        pending_checkpoint=ExtendedSequenceNumber("9", 1),
        child_shard_ids={"shardId-5"},
        hash_key_range=HashKeyRange(0, 399),
    )
    update = lease_writes.update(lease)
    arguments = render_update(update)
    text = arguments["UpdateExpression"] + " " + arguments["ConditionExpression"]
    names, values = arguments["ExpressionAttributeNames"], arguments["ExpressionAttributeValues"]
    assert placeholders(text, "#") == set(names) and placeholders(text, ":") == set(values)
    assert set(names.values()) == {"leaseCounter", "pendingCheckpointState", FILE, PIN, "entityType"} | {
        a for a, _ in update.set_attributes
    }
    assert {"S": "123456789012:stream:1"} in values.values() and {"N": "7"} in values.values()
    assert arguments["Key"] == {"leaseKey": {"S": "123456789012:stream:1:shardId-4"}}
    for attribute in names.values():
        assert attribute not in text
    assert "123456789012" not in text


def test_a_renew_renders_to_exactly_these_update_item_arguments() -> None:
    assert render_update(lease_writes.renew(OWNED)) == {
        "Key": {"leaseKey": {"S": "shardId-1"}},
        "UpdateExpression": "SET #n3 = :v2",
        "ConditionExpression": "#n0 = :v0 AND attribute_not_exists(#n1) AND " + GUARD.format(2, 1),
        "ExpressionAttributeNames": {
            "#n0": "leaseCounter",
            "#n1": "checkpointOwner",
            "#n2": "entityType",
            "#n3": "leaseCounter",
        },
        "ExpressionAttributeValues": {":v0": {"N": "3"}, ":v1": {"S": "LEASE"}, ":v2": {"N": "4"}},
    }


def test_an_update_without_values_of_its_own_carries_only_the_lease_guards() -> None:
    update = LeaseUpdate("shardId-1", (AttributeExists("leaseKey"),), remove_attributes=("checkpointOwner",))
    arguments = render_update(update)
    assert arguments["ConditionExpression"] == "attribute_exists(#n0) AND " + GUARD.format(1, 0)
    assert arguments["ExpressionAttributeValues"] == {":v0": {"S": "LEASE"}}


def test_an_update_with_every_action_kind_renders_set_remove_and_add_clauses() -> None:
    expression = render_update(lease_writes.take(OWNED, "worker-b"))["UpdateExpression"]
    assert re.fullmatch(r"SET .+ REMOVE .+ ADD .+", expression)


def test_set_additions_join_the_add_clause_and_set_deletions_render_a_delete_clause() -> None:
    added = render_update(lease_writes.update(CLAIMED, frozenset({AGED_OUT})))
    assert re.fullmatch(r"SET .+ REMOVE .+ ADD #n\d+ :v\d+", added["UpdateExpression"])
    forgotten = render_update(lease_writes.forget_reported_losses("shardId-1", frozenset({AGED_OUT})))
    assert forgotten["UpdateExpression"] == "DELETE #n2 :v1"
    assert forgotten["ExpressionAttributeValues"] == {":v0": {"S": "LEASE"}, ":v1": {"SS": [AGED_OUT.encode()]}}


# --- cleanup's conditional delete -----------------------------------------------------------------

SHARD_END_LEASE = Lease("shardId-1", checkpoint=ExtendedSequenceNumber("SHARD_END"), lease_counter=7)


@pytest.mark.parametrize(
    ("lease", "conditions"),
    [
        pytest.param(OWNED, {"leaseCounter": n(3), LOSSES: ABSENT}, id="a-lease-judged-gone-must-keep-its-counter"),
        pytest.param(
            SHARD_END_LEASE,
            {"leaseCounter": n(7), LOSSES: ABSENT, "checkpoint": {"S": "SHARD_END"}},
            id="a-lease-judged-finished-must-also-still-be-at-shard-end",
        ),
    ],
)
def test_a_cleanup_delete_holds_only_while_the_lease_is_as_the_snapshot_saw_it(lease: Lease, conditions: dict) -> None:
    delete = lease_writes.delete_if_unchanged(lease)
    assert delete.lease_key == lease.lease_key
    assert described(LeaseUpdate(delete.lease_key, delete.conditions)).conditions == conditions


def test_a_cleanup_delete_renders_to_exactly_these_delete_item_arguments() -> None:
    assert render_delete(lease_writes.delete_if_unchanged(SHARD_END_LEASE)) == {
        "Key": {"leaseKey": {"S": "shardId-1"}},
        "ConditionExpression": "#n0 = :v0 AND attribute_not_exists(#n1) AND #n2 = :v1 AND " + GUARD.format(3, 2),
        "ExpressionAttributeNames": {"#n0": "leaseCounter", "#n1": LOSSES, "#n2": "checkpoint", "#n3": "entityType"},
        "ExpressionAttributeValues": {":v0": {"N": "7"}, ":v1": {"S": "SHARD_END"}, ":v2": {"S": "LEASE"}},
    }


def test_child_creation_is_one_transaction_fenced_by_the_parents_holder_that_leaves_its_counter() -> None:
    parent = CLAIMED.replace(child_shard_ids={"shardId-2"})
    child = Lease("shardId-3", parent_shard_ids={"shardId-1"})
    transaction = lease_writes.create_children(parent, frozenset({"shardId-3"}), (child,))
    (update,) = transaction.updates
    assert described(update) == Write(
        {"leaseCounter": n(3), "claimToken": s("attempt-1"), "leaseOwner": s("worker-a")},
        {"childShardIds": {"SS": ["shardId-2", "shardId-3"]}},
    )
    assert transaction.creates == (lease_writes.LeaseCreate(child),)
    assert transaction.lease_keys == ("shardId-1", "shardId-3")


@pytest.mark.parametrize(
    ("parent", "child_ids", "problem"),
    [
        pytest.param(UNOWNED, frozenset({"shardId-3"}), "has no owner", id="unowned-parent"),
        pytest.param(CLAIMED, frozenset(), "without children", id="no-children"),
    ],
)
def test_child_creation_is_refused_without_a_holder_or_without_children(parent, child_ids, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        lease_writes.create_children(parent, child_ids, ())
