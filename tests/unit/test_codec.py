"""Behaviour of the lease codec: KCL's attribute names and types, in both directions (docs/protocol.md §1.1)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lease_core.errors import CorruptLeaseError
from lease_core.model.lease import (
    MAX_EPOCH_MILLIS,
    MAX_HASH_KEY,
    AgedOutRange,
    HashKeyRange,
    Lease,
    MeasurementBeforeClaim,
    StreamIdentifier,
)
from lease_core.model.sequence import LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber, Sentinel
from lease_core.store.codec import Item, is_lease_item, lease_from_item, lease_to_item, throughput_value

STREAM = StreamIdentifier("123456789012", "stream", 1)
SEQ = "49590338271490256608559692538361571095921575989136588898"

# --- (a) round trip lease -> item -> lease -------------------------------------------------------------

ROUND_TRIP = [
    pytest.param(Lease("shardId-000000000000"), id="new-unowned-at-trim-horizon"),
    pytest.param(Lease("shardId-1", lease_owner="worker-a", lease_counter=42), id="owner-and-counter"),
    pytest.param(Lease("shardId-1", checkpoint=ExtendedSequenceNumber(SEQ, 3)), id="numeric-checkpoint-with-sub"),
    pytest.param(Lease("shardId-1", checkpoint=SHARD_END), id="shard-end"),
    pytest.param(
        Lease("shardId-1", checkpoint=ExtendedSequenceNumber("10"), pending_checkpoint=ExtendedSequenceNumber("20", 1)),
        id="pending-without-state",
    ),
    pytest.param(
        Lease(
            "shardId-1",
            checkpoint=ExtendedSequenceNumber("10"),
            pending_checkpoint=ExtendedSequenceNumber("20"),
            pending_checkpoint_state=b"\x00\xffstate",
        ),
        id="pending-with-state",
    ),
    pytest.param(Lease("shardId-1", lease_owner="w", owner_switches_since_checkpoint=3), id="owner-switches"),
    pytest.param(Lease("shardId-8", parent_shard_ids={"shardId-6", "shardId-7"}), id="two-parents"),
    pytest.param(Lease("shardId-6", child_shard_ids={"shardId-8"}, checkpoint=SHARD_END), id="children"),
    pytest.param(Lease("shardId-1", hash_key_range=HashKeyRange(0, MAX_HASH_KEY)), id="full-hash-range"),
    pytest.param(Lease("shardId-1", hash_key_range=HashKeyRange(2**127, 2**127 + 1)), id="narrow-hash-range"),
    pytest.param(Lease("shardId-1", lease_owner="w", throughput_kbps=12.345678), id="throughput"),
    pytest.param(Lease("shardId-1", lease_owner="w", throughput_kbps=0.0), id="zero-throughput"),
    pytest.param(Lease("shardId-1", lease_owner="new", checkpoint_owner="old"), id="checkpoint-owner"),
    pytest.param(Lease.for_stream(STREAM, "shardId-4"), id="multi-stream"),
    pytest.param(Lease("shardId-1", throughput_kbps=3.5, read_through_millis=1_763_900_000_123), id="read-through"),
    pytest.param(
        Lease(
            "shardId-1",
            throughput_kbps=1.75,
            read_through_millis=1_763_900_060_000,
            measured_before_claim=MeasurementBeforeClaim(12, 3.5, 1_763_900_000_123),
        ),
        id="a-claims-stand-in-and-the-measurement-it-keeps-aside",
    ),
    pytest.param(
        Lease("shardId-1", unreported_losses={AgedOutRange("5", "9", "2026-11-23T10:00:00+00:00"), AgedOutRange("20")}),
        id="unreported-retention-losses",
    ),
    pytest.param(
        Lease.for_stream(
            STREAM,
            "shardId-4",
            lease_owner="worker-b",
            lease_counter=7,
            checkpoint=ExtendedSequenceNumber("5", 2),
            pending_checkpoint=ExtendedSequenceNumber("9"),
            pending_checkpoint_state=b"s",
            owner_switches_since_checkpoint=1,
            parent_shard_ids={"shardId-1"},
            child_shard_ids={"shardId-9", "shardId-10"},
            hash_key_range=HashKeyRange(1, 399),
            throughput_kbps=1.5,
            checkpoint_owner="worker-a",
        ),
        id="multi-stream-every-field",
    ),
]


@pytest.mark.parametrize("lease", ROUND_TRIP)
def test_a_lease_survives_encoding_and_decoding(lease: Lease) -> None:
    assert lease_from_item(lease_to_item(lease)) == lease


owners = st.one_of(st.none(), st.text(min_size=1, max_size=20))
shard_ids = st.text(min_size=1, max_size=20)
extended_sequence_numbers = st.builds(
    ExtendedSequenceNumber,
    st.one_of(st.sampled_from([s.value for s in Sentinel]), st.integers(0, 10**60).map(str)),
    st.integers(0, 2**63),
)


@st.composite
def hash_key_ranges(draw: st.DrawFn) -> HashKeyRange:
    start = draw(st.integers(0, MAX_HASH_KEY - 1))
    return HashKeyRange(start, draw(st.integers(start + 1, MAX_HASH_KEY)))


@st.composite
def leases(draw: st.DrawFn) -> Lease:
    pending = draw(st.one_of(st.none(), extended_sequence_numbers))
    fields: dict[str, Any] = {
        "checkpoint": draw(extended_sequence_numbers),
        "lease_owner": draw(owners),
        "lease_counter": draw(st.integers(0, 2**63)),
        "pending_checkpoint": pending,
        "pending_checkpoint_state": None if pending is None else draw(st.one_of(st.none(), st.binary(max_size=64))),
        "owner_switches_since_checkpoint": draw(st.integers(0, 1000)),
        "parent_shard_ids": draw(st.frozensets(shard_ids, max_size=2)),
        "child_shard_ids": draw(st.frozensets(shard_ids, max_size=3)),
        "hash_key_range": draw(st.one_of(st.none(), hash_key_ranges())),
        # Stored values have at most 6 decimals, so generate exactly those.
        "throughput_kbps": draw(st.one_of(st.none(), st.integers(0, 10**15).map(lambda n: n / 10**6))),
        "checkpoint_owner": draw(owners),
        "read_through_millis": draw(st.one_of(st.none(), st.integers(0, 2**50))),
        "latest_start_millis": draw(st.one_of(st.none(), st.integers(0, MAX_EPOCH_MILLIS))),
        "measured_before_claim": draw(
            st.one_of(
                st.none(),
                st.builds(
                    MeasurementBeforeClaim,
                    st.integers(0, 2**40),
                    st.integers(0, 10**15).map(lambda n: n / 10**6),
                    st.integers(0, 2**50),
                ),
            )
        ),
        "unreported_losses": draw(
            st.frozensets(
                st.builds(
                    AgedOutRange, st.integers(0, 10**60).map(str), st.one_of(st.none(), st.integers(0, 10**60).map(str))
                ),
                max_size=2,
            )
        ),
    }
    if draw(st.booleans()):
        stream = StreamIdentifier(
            draw(st.from_regex(r"[0-9]{12}", fullmatch=True)),
            draw(st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)),
            draw(st.integers(0, 2**40)),
        )
        return Lease.for_stream(stream, draw(shard_ids), **fields)
    return Lease(draw(shard_ids), **fields)


@given(leases())
def test_every_generated_lease_survives_encoding_and_decoding(lease: Lease) -> None:
    assert lease_from_item(lease_to_item(lease)) == lease


@given(leases())
def test_an_encoded_lease_never_holds_empty_strings_or_sets(lease: Lease) -> None:
    item = lease_to_item(lease)
    assert all(value.get("S", "x") != "" and value.get("SS", ["x"]) != [] for value in item.values())


# --- (b) decoding items exactly as KCL writes them (§1.1) ----------------------------------------------


def test_a_kcl_2x_item_without_entity_type_or_throughput_decodes() -> None:
    item = {
        "leaseKey": {"S": "shardId-000000000008"},
        "leaseOwner": {"S": "worker-2x"},
        "leaseCounter": {"N": "17"},
        "ownerSwitchesSinceCheckpoint": {"N": "2"},
        "checkpoint": {"S": "LATEST"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "parentShardId": {"SS": ["shardId-000000000006", "shardId-000000000007"]},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": "399"},
    }
    lease = lease_from_item(item)
    assert lease.lease_key == "shardId-000000000008"
    assert lease.lease_owner == "worker-2x"
    assert lease.lease_counter == 17
    assert lease.owner_switches_since_checkpoint == 2
    assert lease.checkpoint == LATEST
    assert lease.pending_checkpoint is None and lease.pending_checkpoint_state is None
    assert lease.parent_shard_ids == {"shardId-000000000006", "shardId-000000000007"}
    assert lease.child_shard_ids == frozenset()
    assert lease.hash_key_range == HashKeyRange(0, 399)
    assert lease.throughput_kbps is None and lease.checkpoint_owner is None
    assert lease.stream_name is None and lease.shard_id is None


def test_a_very_old_kcl_item_without_hash_keys_or_owner_switches_decodes() -> None:
    item = {
        "leaseKey": {"S": "shardId-000000000001"},
        "leaseCounter": {"N": "3"},
        "checkpoint": {"S": "TRIM_HORIZON"},
        "checkpointSubSequenceNumber": {"N": "0"},
    }
    lease = lease_from_item(item)
    assert (lease.lease_owner, lease.checkpoint, lease.hash_key_range, lease.owner_switches_since_checkpoint) == (
        None,
        TRIM_HORIZON,
        None,
        0,
    )


def test_a_kcl_3x_item_during_a_handoff_with_throughput_decodes() -> None:
    item = {
        "leaseKey": {"S": "shardId-000000000008"},
        "leaseOwner": {"S": "worker-b"},
        "leaseCounter": {"N": "1234"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": SEQ},
        "checkpointSubSequenceNumber": {"N": "5"},
        "pendingCheckpoint": {"S": SEQ + "0"},
        "pendingCheckpointSubSequenceNumber": {"N": "0"},
        "pendingCheckpointState": {"B": b"app-state"},
        "childShardIds": {"SS": ["shardId-000000000010"]},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": str(MAX_HASH_KEY)},
        "throughputKBps": {"N": "12.345678"},
        "checkpointOwner": {"S": "worker-a"},
    }
    lease = lease_from_item(item)
    assert lease.lease_owner == "worker-b"
    assert lease.lease_counter == 1234
    assert lease.checkpoint == ExtendedSequenceNumber(SEQ, 5)
    assert lease.pending_checkpoint == ExtendedSequenceNumber(SEQ + "0", 0)
    assert lease.pending_checkpoint_state == b"app-state"
    assert lease.child_shard_ids == {"shardId-000000000010"}
    assert lease.hash_key_range == HashKeyRange(0, MAX_HASH_KEY)
    assert lease.throughput_kbps == 12.345678
    assert lease.checkpoint_owner == "worker-a"
    assert lease.actual_owner == "worker-a"


def test_a_multi_stream_item_decodes_with_its_stream_attributes() -> None:
    item = {
        "leaseKey": {"S": "123456789012:stream:1:shardId-4"},
        "streamName": {"S": "123456789012:stream:1"},
        "shardId": {"S": "shardId-4"},
        "leaseCounter": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": "TRIM_HORIZON"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "parentShardId": {"SS": ["shardId-2"]},
    }
    lease = lease_from_item(item)
    assert lease == Lease.for_stream(STREAM, "shardId-4", parent_shard_ids={"shardId-2"})
    assert lease.is_multi_stream
    assert (lease.stream_name, lease.shard_id) == ("123456789012:stream:1", "shardId-4")


def test_a_kcl_35_item_with_entity_type_lease_decodes() -> None:
    item = {
        "leaseKey": {"S": "shardId-000000000008"},
        "leaseCounter": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": "LATEST"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "parentShardId": {"SS": ["shardId-000000000006", "shardId-000000000007"]},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": "399"},
        "entityType": {"S": "LEASE"},
    }
    assert lease_from_item(item) == Lease(
        "shardId-000000000008",
        checkpoint=LATEST,
        parent_shard_ids={"shardId-000000000006", "shardId-000000000007"},
        hash_key_range=HashKeyRange(0, 399),
    )


def test_an_empty_pending_checkpoint_string_means_none_is_prepared() -> None:
    item = {
        "leaseKey": {"S": "k"},
        "leaseCounter": {"N": "0"},
        "checkpoint": {"S": "5"},
        "pendingCheckpoint": {"S": ""},
    }
    assert lease_from_item(item).pending_checkpoint is None


def test_a_hash_range_with_only_one_end_is_ignored() -> None:
    item = {"leaseKey": {"S": "k"}, "leaseCounter": {"N": "0"}, "checkpoint": {"S": "5"}, "startingHashKey": {"S": "0"}}
    assert lease_from_item(item).hash_key_range is None


# --- (c) which items are leases ----------------------------------------------------------------------

ENTITY_TYPES = [
    pytest.param(None, True, id="missing"),
    pytest.param("LEASE", True, id="LEASE"),
    pytest.param("WORKER_METRIC_STATS", False, id="WORKER_METRIC_STATS"),
    pytest.param("LEADER", False, id="LEADER"),
    pytest.param("CLIENT_VERSION_MIGRATION", False, id="CLIENT_VERSION_MIGRATION"),
    pytest.param("TABLE_MIGRATION", False, id="TABLE_MIGRATION"),
    pytest.param("STREAM", False, id="STREAM"),
    pytest.param("lease", False, id="lowercase-lease"),
]


@pytest.mark.parametrize(("entity_type", "is_lease"), ENTITY_TYPES)
def test_only_items_without_entity_type_or_with_lease_are_leases(entity_type: str | None, is_lease: bool) -> None:
    item: Item = {"leaseKey": {"S": "k"}}
    if entity_type is not None:
        item["entityType"] = {"S": entity_type}
    assert is_lease_item(item) is is_lease


@pytest.mark.parametrize("key", ["Leader", "Migration3.0", "TableMigration3.5"])
def test_an_untagged_coordinator_state_record_under_its_well_known_key_is_not_a_lease(key: str) -> None:
    assert not is_lease_item({"leaseKey": {"S": key}, "ownerName": {"S": "worker-1"}})


# --- (d) corrupt items ---------------------------------------------------------------------------------

GOOD_ITEM: Item = {
    "leaseKey": {"S": "shardId-000000000001"},
    "leaseCounter": {"N": "3"},
    "ownerSwitchesSinceCheckpoint": {"N": "0"},
    "checkpoint": {"S": "LATEST"},
    "checkpointSubSequenceNumber": {"N": "0"},
    "startingHashKey": {"S": "0"},
    "endingHashKey": {"S": "399"},
}
MISSING = object()
HASH_KEYS = ("startingHashKey", "endingHashKey")

CORRUPT = [
    # (attribute to change, new value or MISSING, attributes of which the message must name one)
    pytest.param("leaseKey", MISSING, ("leaseKey",), id="missing-leaseKey"),
    pytest.param("checkpoint", MISSING, ("checkpoint",), id="missing-checkpoint"),
    pytest.param("leaseCounter", MISSING, ("leaseCounter",), id="missing-leaseCounter"),
    pytest.param("leaseCounter", {"S": "3"}, ("leaseCounter",), id="leaseCounter-of-type-S"),
    pytest.param("leaseCounter", {"N": "1.5"}, ("leaseCounter",), id="leaseCounter-not-integer"),
    pytest.param("leaseCounter", {"N": "three"}, ("leaseCounter",), id="leaseCounter-not-a-number"),
    pytest.param("leaseCounter", {"N": "NaN"}, ("leaseCounter",), id="leaseCounter-NaN"),
    pytest.param("leaseCounter", {"N": "Infinity"}, ("leaseCounter",), id="leaseCounter-Infinity"),
    pytest.param("leaseCounter", {"N": "-1"}, ("leaseCounter",), id="leaseCounter-negative"),
    pytest.param("leaseOwner", "worker-a", ("leaseOwner",), id="leaseOwner-not-an-attribute-value"),
    pytest.param("checkpoint", {"S": "abc"}, ("checkpoint",), id="checkpoint-abc"),
    pytest.param("checkpoint", {"S": ""}, ("checkpoint",), id="checkpoint-empty-string"),
    pytest.param(
        "checkpointSubSequenceNumber",
        {"N": "-1"},
        ("checkpointSubSequenceNumber", "checkpoint"),
        id="negative-sub-sequence",
    ),
    pytest.param("pendingCheckpoint", {"S": "later"}, ("pendingCheckpoint",), id="pendingCheckpoint-not-a-number"),
    pytest.param("pendingCheckpointState", {"N": "0"}, ("pendingCheckpointState",), id="pending-state-of-type-N"),
    pytest.param("parentShardId", {"S": "shardId-0"}, ("parentShardId",), id="parentShardId-S-not-SS"),
    pytest.param("childShardIds", {"L": []}, ("childShardIds",), id="childShardIds-L-not-SS"),
    pytest.param("throughputKBps", {"N": "fast"}, ("throughputKBps",), id="throughput-not-a-number"),
    pytest.param("checkpointOwner", {"N": "1"}, ("checkpointOwner",), id="checkpointOwner-of-type-N"),
    pytest.param("startingHashKey", {"S": "0x10"}, ("startingHashKey",), id="startingHashKey-hex"),
    pytest.param("endingHashKey", {"S": "lots"}, ("endingHashKey",), id="endingHashKey-letters"),
    pytest.param("startingHashKey", {"S": "400"}, HASH_KEYS, id="hash-start-above-end"),
    pytest.param("startingHashKey", {"S": "399"}, HASH_KEYS, id="hash-start-equals-end"),
    pytest.param("endingHashKey", {"S": str(MAX_HASH_KEY + 1)}, ("endingHashKey",), id="hash-end-above-2^128-1"),
    pytest.param("streamName", {"S": "123456789012:stream:1"}, ("shardId",), id="streamName-without-shardId"),
    pytest.param("readThroughMillis", {"N": "-5"}, ("readThroughMillis",), id="readThroughMillis-negative"),
    pytest.param("latestStartMillis", {"N": "-5"}, ("latestStartMillis",), id="latestStartMillis-negative"),
    pytest.param("latestStartMillis", {"S": "now"}, ("latestStartMillis",), id="latestStartMillis-of-type-S"),
    pytest.param(
        "latestStartMillis", {"N": "1700000000000000"}, ("latestStartMillis",), id="latestStartMillis-in-microseconds"
    ),
    pytest.param("unreportedRetentionLosses", {"SS": ["{}"]}, ("unreportedRetentionLosses",), id="loss-without-after"),
    pytest.param(
        "unreportedRetentionLosses", {"SS": ['{"after":5}']}, ("unreportedRetentionLosses",), id="loss-with-a-number"
    ),
    pytest.param("unreportedRetentionLosses", {"S": "x"}, ("unreportedRetentionLosses",), id="losses-S-not-SS"),
    pytest.param("measuredBeforeClaim", {"S": "{}"}, ("measuredBeforeClaim",), id="kept-measurement-empty"),
    pytest.param(
        "measuredBeforeClaim",
        {"S": '{"readThroughMillis":5,"round":-1,"throughputKBps":2.0}'},
        ("measuredBeforeClaim",),
        id="kept-measurement-negative-round",
    ),
    pytest.param("measuredBeforeClaim", {"N": "1"}, ("measuredBeforeClaim",), id="kept-measurement-of-type-N"),
]


def names_attribute(message: str, attribute: str) -> bool:
    """True if `attribute` appears as a word of its own (`shardId-0001` does not name `shardId`)."""
    return re.search(rf"(?<![\w-]){re.escape(attribute)}(?![\w-])", message) is not None


@pytest.mark.parametrize(("attribute", "value", "named"), CORRUPT)
def test_a_corrupt_item_raises_an_error_naming_the_key_and_the_attribute(
    attribute: str, value: object, named: tuple[str, ...]
) -> None:
    item: dict[str, Any] = dict(GOOD_ITEM)
    if value is MISSING:
        del item[attribute]
    else:
        item[attribute] = value
    if attribute == "pendingCheckpointState":
        item["pendingCheckpoint"] = {"S": "5"}
    with pytest.raises(CorruptLeaseError) as caught:
        lease_from_item(item)
    if attribute != "leaseKey":
        assert caught.value.lease_key == "shardId-000000000001"
        assert "shardId-000000000001" in str(caught.value)
    assert any(names_attribute(caught.value.problem, name) for name in named), caught.value.problem


def test_the_untouched_corrupt_item_template_is_itself_a_valid_lease() -> None:
    assert lease_from_item(GOOD_ITEM) == Lease(
        "shardId-000000000001", checkpoint=LATEST, lease_counter=3, hash_key_range=HashKeyRange(0, 399)
    )


# --- (e) encoding rules -----------------------------------------------------------------------------


def test_a_new_lease_encodes_exactly_as_the_spec_example() -> None:
    lease = Lease(
        "shardId-000000000008",
        checkpoint=LATEST,
        parent_shard_ids={"shardId-000000000007", "shardId-000000000006"},
        hash_key_range=HashKeyRange(0, 399),
    )
    assert lease_to_item(lease) == {
        "leaseKey": {"S": "shardId-000000000008"},
        "leaseCounter": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": "LATEST"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "parentShardId": {"SS": ["shardId-000000000006", "shardId-000000000007"]},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": "399"},
        "entityType": {"S": "LEASE"},
    }


def test_a_lease_with_every_field_encodes_to_exactly_the_kcl_attributes() -> None:
    lease = Lease.for_stream(
        STREAM,
        "shardId-4",
        lease_owner="worker-b",
        lease_counter=7,
        checkpoint=ExtendedSequenceNumber("5", 2),
        pending_checkpoint=ExtendedSequenceNumber("9", 1),
        pending_checkpoint_state=b"state",
        owner_switches_since_checkpoint=1,
        parent_shard_ids={"shardId-1", "shardId-2"},
        child_shard_ids={"shardId-9"},
        hash_key_range=HashKeyRange(1, 399),
        throughput_kbps=12.3456785,
        checkpoint_owner="worker-a",
    )
    assert lease_to_item(lease) == {
        "leaseKey": {"S": "123456789012:stream:1:shardId-4"},
        "leaseOwner": {"S": "worker-b"},
        "leaseCounter": {"N": "7"},
        "ownerSwitchesSinceCheckpoint": {"N": "1"},
        "checkpoint": {"S": "5"},
        "checkpointSubSequenceNumber": {"N": "2"},
        "pendingCheckpoint": {"S": "9"},
        "pendingCheckpointSubSequenceNumber": {"N": "1"},
        "pendingCheckpointState": {"B": b"state"},
        "parentShardId": {"SS": ["shardId-1", "shardId-2"]},
        "childShardIds": {"SS": ["shardId-9"]},
        "startingHashKey": {"S": "1"},
        "endingHashKey": {"S": "399"},
        "throughputKBps": {"N": "12.345679"},
        "checkpointOwner": {"S": "worker-a"},
        "entityType": {"S": "LEASE"},
        "streamName": {"S": "123456789012:stream:1"},
        "shardId": {"S": "shardId-4"},
    }


def test_absent_owners_sets_and_pending_fields_are_not_written() -> None:
    assert set(lease_to_item(Lease("shardId-1"))) == {
        "leaseKey",
        "leaseCounter",
        "ownerSwitchesSinceCheckpoint",
        "checkpoint",
        "checkpointSubSequenceNumber",
        "entityType",
    }


def test_a_pending_checkpoint_without_state_writes_no_state_attribute() -> None:
    item = lease_to_item(Lease("k", pending_checkpoint=ExtendedSequenceNumber("5")))
    assert "pendingCheckpointState" not in item and item["pendingCheckpoint"] == {"S": "5"}


@pytest.mark.parametrize("state", [b"", b"\x00", b"7", b"\xff" * 100], ids=["empty", "zero-byte", "digit", "long"])
def test_pending_checkpoint_state_is_always_binary_never_a_number(state: bytes) -> None:
    lease = Lease("k", pending_checkpoint=ExtendedSequenceNumber("5", 3), pending_checkpoint_state=state)
    assert lease_to_item(lease)["pendingCheckpointState"] == {"B": state}


def test_an_empty_stream_name_is_refused_rather_than_written() -> None:
    with pytest.raises(ValueError):
        lease_to_item(Lease("k", stream_name="", shard_id=""))


THROUGHPUT_ROUNDING = [
    pytest.param(12.3456785, "12.345679", id="half-up-at-7th-decimal"),
    pytest.param(12.3456784, "12.345678", id="down-below-half"),
    pytest.param(0.0000004, "0.000000", id="tiny-rounds-to-zero"),
    pytest.param(0.0000005, "0.000001", id="tiny-half-rounds-up"),
    pytest.param(1, "1.000000", id="integer"),
    pytest.param(0.0, "0.000000", id="zero"),
    pytest.param(12.345678, "12.345678", id="already-6-decimals"),
    pytest.param(17476266.666666668, "17476266.666667", id="spec-1000-GiB-samples"),
]


@pytest.mark.parametrize(("kbps", "stored"), THROUGHPUT_ROUNDING)
def test_throughput_is_rounded_half_up_to_6_decimals(kbps: float, stored: str) -> None:
    assert throughput_value(kbps) == {"N": stored}


@pytest.mark.parametrize("kbps", [math.nan, math.inf, -math.inf, -0.5], ids=["nan", "inf", "-inf", "negative"])
def test_non_finite_or_negative_throughput_is_rejected(kbps: float) -> None:
    with pytest.raises(ValueError):
        throughput_value(kbps)


def test_a_huge_but_finite_throughput_is_still_written() -> None:
    assert throughput_value(1e22) == {"N": "10000000000000000000000.000000"}


@pytest.mark.parametrize(
    ("item", "is_lease"),
    [
        pytest.param({"leaseKey": {"S": "AssignmentRound"}, "round": {"N": "4"}}, False, id="project-record"),
        pytest.param({"leaseKey": {"S": "ShardSyncAuditor:orders"}, "holes": {"N": "0"}}, False, id="project-prefix"),
        pytest.param({"leaseKey": {"S": "Leader"}, "ownerName": {"S": "w"}}, False, id="kcl-record"),
        pytest.param(
            {"leaseKey": {"S": "AssignmentRound"}, "leaseCounter": {"N": "1"}, "checkpoint": {"S": "LATEST"}},
            True,
            id="a-lease-of-that-name",
        ),
        pytest.param({"leaseKey": {"S": "shardId-000000000001"}}, True, id="an-untagged-lease"),
    ],
)
def test_an_untagged_item_at_one_of_this_project_s_record_keys_without_lease_attributes_is_not_a_lease(
    item: Item, is_lease: bool
) -> None:
    """KCL 3.5's table migration moves coordinator-state records it does not know without their tag."""
    assert is_lease_item(item) is is_lease
