"""Behaviour of the lease value: checkpoint moves, child ids, owners, validation, stream identifiers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from lease_core.errors import CheckpointOrderError
from lease_core.model.lease import (
    MAX_HASH_KEY,
    HashKeyRange,
    Lease,
    StreamIdentifier,
    split_multi_stream_lease_key,
)
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber

PREPARED = Lease(
    "shardId-1",
    lease_owner="worker-a",
    lease_counter=9,
    checkpoint=ExtendedSequenceNumber("100"),
    pending_checkpoint=ExtendedSequenceNumber("200"),
    pending_checkpoint_state=b"state",
    owner_switches_since_checkpoint=4,
    parent_shard_ids={"shardId-0"},
    child_shard_ids={"shardId-2"},
)

# --- checkpoints ----------------------------------------------------------------------------------


def test_a_checkpoint_clears_the_pending_fields_and_zeroes_owner_switches() -> None:
    after = PREPARED.with_checkpoint(ExtendedSequenceNumber("150", 2))
    assert after == PREPARED.replace(
        checkpoint=ExtendedSequenceNumber("150", 2),
        pending_checkpoint=None,
        pending_checkpoint_state=None,
        owner_switches_since_checkpoint=0,
    )


def test_a_checkpoint_keeps_key_owner_and_counter() -> None:
    after = PREPARED.with_checkpoint(SHARD_END)
    assert (after.lease_key, after.lease_owner, after.lease_counter) == ("shardId-1", "worker-a", 9)


def test_preparing_a_checkpoint_changes_only_the_pending_fields() -> None:
    after = PREPARED.with_pending_checkpoint(ExtendedSequenceNumber("300"), b"new")
    assert after == PREPARED.replace(pending_checkpoint=ExtendedSequenceNumber("300"), pending_checkpoint_state=b"new")


FORWARD = [
    pytest.param(TRIM_HORIZON, ExtendedSequenceNumber("0"), id="trim-horizon-to-0"),
    pytest.param(LATEST, ExtendedSequenceNumber("5"), id="latest-to-number"),
    pytest.param(AT_TIMESTAMP, TRIM_HORIZON, id="at-timestamp-to-trim-horizon"),
    pytest.param(ExtendedSequenceNumber("5"), ExtendedSequenceNumber("5"), id="same-value"),
    pytest.param(ExtendedSequenceNumber("5"), ExtendedSequenceNumber("5", 1), id="next-sub-sequence"),
    pytest.param(ExtendedSequenceNumber("9"), ExtendedSequenceNumber("10"), id="9-to-10-numerically"),
    pytest.param(ExtendedSequenceNumber("5"), SHARD_END, id="number-to-shard-end"),
    pytest.param(SHARD_END, SHARD_END, id="shard-end-to-shard-end"),
]


@pytest.mark.parametrize(("current", "requested"), FORWARD)
def test_a_checkpoint_may_stay_or_move_forward(
    current: ExtendedSequenceNumber, requested: ExtendedSequenceNumber
) -> None:
    assert Lease("k", checkpoint=current).with_checkpoint(requested).checkpoint == requested


BACKWARDS = [
    pytest.param(SHARD_END, ExtendedSequenceNumber("9" * 60), id="shard-end-to-number"),
    pytest.param(SHARD_END, TRIM_HORIZON, id="shard-end-to-trim-horizon"),
    pytest.param(SHARD_END, LATEST, id="shard-end-to-latest"),
    pytest.param(ExtendedSequenceNumber("5"), LATEST, id="number-to-latest"),
    pytest.param(ExtendedSequenceNumber("0"), TRIM_HORIZON, id="0-to-trim-horizon"),
    pytest.param(LATEST, TRIM_HORIZON, id="latest-to-trim-horizon"),
    pytest.param(TRIM_HORIZON, AT_TIMESTAMP, id="trim-horizon-to-at-timestamp"),
    pytest.param(ExtendedSequenceNumber("10"), ExtendedSequenceNumber("9"), id="10-to-9"),
    pytest.param(ExtendedSequenceNumber("5", 2), ExtendedSequenceNumber("5", 1), id="lower-sub-sequence"),
]


@pytest.mark.parametrize(("current", "requested"), BACKWARDS)
def test_a_checkpoint_never_moves_backwards(current: ExtendedSequenceNumber, requested: ExtendedSequenceNumber) -> None:
    with pytest.raises(CheckpointOrderError) as caught:
        Lease("shardId-7", checkpoint=current).with_checkpoint(requested)
    assert (caught.value.lease_key, caught.value.current, caught.value.requested) == (
        "shardId-7",
        str(current),
        str(requested),
    )


@pytest.mark.parametrize(("current", "requested"), BACKWARDS)
def test_a_prepared_checkpoint_never_lies_below_the_checkpoint(
    current: ExtendedSequenceNumber, requested: ExtendedSequenceNumber
) -> None:
    with pytest.raises(CheckpointOrderError):
        Lease("shardId-7", checkpoint=current).with_pending_checkpoint(requested)


# --- child shard ids, owners ---------------------------------------------------------------------


def test_setting_child_shard_ids_adds_to_the_known_ones() -> None:
    assert PREPARED.with_child_shard_ids({"shardId-3"}).child_shard_ids == {"shardId-2", "shardId-3"}


def test_setting_no_child_shard_ids_clears_nothing() -> None:
    assert PREPARED.with_child_shard_ids(set()).child_shard_ids == {"shardId-2"}


ACTUAL_OWNERS = [
    pytest.param(None, None, None, id="unowned"),
    pytest.param("worker-a", None, "worker-a", id="owned"),
    pytest.param("worker-b", "worker-a", "worker-a", id="in-handoff-checkpoint-owner-wins"),
]


@pytest.mark.parametrize(("owner", "checkpoint_owner", "actual"), ACTUAL_OWNERS)
def test_the_actual_owner_is_the_checkpoint_owner_during_a_handoff(
    owner: str | None, checkpoint_owner: str | None, actual: str | None
) -> None:
    lease = Lease("k", lease_owner=owner, checkpoint_owner=checkpoint_owner)
    assert (lease.actual_owner, lease.is_in_handoff) == (actual, checkpoint_owner is not None)


def test_shard_id_sets_compare_equal_whatever_iterable_built_them() -> None:
    assert Lease("k", parent_shard_ids=["a", "b"]) == Lease("k", parent_shard_ids=frozenset({"b", "a"}))


# --- validation ----------------------------------------------------------------------------------

INVALID_LEASES = [
    pytest.param({"lease_key": ""}, id="empty-key"),
    pytest.param({"lease_key": "k", "lease_owner": ""}, id="empty-owner"),
    pytest.param({"lease_key": "k", "checkpoint_owner": ""}, id="empty-checkpoint-owner"),
    pytest.param({"lease_key": "k", "lease_counter": -1}, id="negative-counter"),
    pytest.param({"lease_key": "k", "pending_checkpoint_state": b"s"}, id="state-without-pending"),
    pytest.param({"lease_key": "k", "stream_name": "123456789012:stream:1"}, id="stream-name-without-shard-id"),
    pytest.param({"lease_key": "k", "shard_id": "shardId-4"}, id="shard-id-without-stream-name"),
]


@pytest.mark.parametrize("fields", INVALID_LEASES)
def test_invalid_leases_are_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Lease(**fields)


# --- hash key ranges -----------------------------------------------------------------------------

VALID_RANGES = [
    pytest.param(0, 1, id="smallest"),
    pytest.param(0, MAX_HASH_KEY, id="whole-space"),
    pytest.param(MAX_HASH_KEY - 1, MAX_HASH_KEY, id="top"),
]


@pytest.mark.parametrize(("start", "end"), VALID_RANGES)
def test_a_range_with_start_below_end_inside_128_bits_is_accepted(start: int, end: int) -> None:
    assert HashKeyRange.from_strings(str(start), str(end)) == HashKeyRange(start, end)


INVALID_RANGES = [
    pytest.param(5, 5, id="empty"),
    pytest.param(6, 5, id="inverted"),
    pytest.param(-1, 5, id="negative-start"),
    pytest.param(0, MAX_HASH_KEY + 1, id="end-beyond-128-bits"),
]


@pytest.mark.parametrize(("start", "end"), INVALID_RANGES)
def test_a_range_outside_the_rules_is_rejected(start: int, end: int) -> None:
    with pytest.raises(ValueError):
        HashKeyRange(start, end)


# --- stream identifiers --------------------------------------------------------------------------

STREAM = StreamIdentifier("123456789012", "stream", 1)


def test_a_stream_identifier_serializes_as_account_name_epoch() -> None:
    assert STREAM.serialize() == "123456789012:stream:1"


@pytest.mark.parametrize(
    "serialized",
    ["123456789012:stream:1", "000000000000:my-stream_1.x:0", "1:s:1700000000"],
    ids=["spec-example", "leading-zero-account", "real-epoch"],
)
def test_parsing_and_serializing_a_stream_identifier_round_trips(serialized: str) -> None:
    assert StreamIdentifier.parse(serialized).serialize() == serialized


BAD_STREAM_IDENTIFIERS = [
    pytest.param("stream", id="bare-name"),
    pytest.param("123:stream", id="two-fields"),
    pytest.param("123:stream:1:extra", id="four-fields"),
    pytest.param("acct:stream:1", id="non-digit-account"),
    pytest.param(":stream:1", id="empty-account"),
    pytest.param("123::1", id="empty-name"),
    pytest.param("123:stream:", id="empty-epoch"),
    pytest.param("123:stream:x", id="non-digit-epoch"),
    pytest.param("123:stream:-1", id="negative-epoch"),
    pytest.param("١٢٣:stream:1", id="non-ascii-account"),
    pytest.param("123:stream:١", id="non-ascii-epoch"),
]


@pytest.mark.parametrize("serialized", BAD_STREAM_IDENTIFIERS)
def test_a_malformed_stream_identifier_is_rejected(serialized: str) -> None:
    with pytest.raises(ValueError):
        StreamIdentifier.parse(serialized)


def test_a_negative_creation_epoch_is_rejected() -> None:
    with pytest.raises(ValueError):
        StreamIdentifier("123", "stream", -1)


SPLITS = [
    pytest.param("123456789012:stream:1:shardId-4", (STREAM, "shardId-4"), id="spec-example"),
    pytest.param("1:s:2:shardId-000000000009", (StreamIdentifier("1", "s", 2), "shardId-000000000009"), id="short"),
    pytest.param("1:s:2:odd:shard", (StreamIdentifier("1", "s", 2), "odd:shard"), id="colon-in-shard-id"),
]


@pytest.mark.parametrize(("lease_key", "expected"), SPLITS)
def test_a_multi_stream_key_splits_into_stream_and_shard(
    lease_key: str, expected: tuple[StreamIdentifier, str]
) -> None:
    assert split_multi_stream_lease_key(lease_key) == expected


def test_splitting_inverts_building_a_lease_key() -> None:
    assert split_multi_stream_lease_key(STREAM.lease_key("shardId-4")) == (STREAM, "shardId-4")


BAD_KEYS = [
    pytest.param("shardId-000000000004", id="single-stream-key"),
    pytest.param("123456789012:stream:1", id="stream-without-shard"),
    pytest.param("123456789012:stream:1:", id="empty-shard-id"),
    pytest.param("acct:stream:1:shardId-4", id="non-digit-account"),
    pytest.param("123456789012:stream:x:shardId-4", id="non-digit-epoch"),
    pytest.param("123456789012:stream:١:shardId-4", id="non-ascii-epoch"),
]


@pytest.mark.parametrize("lease_key", BAD_KEYS)
def test_a_key_that_is_not_multi_stream_cannot_be_split(lease_key: str) -> None:
    with pytest.raises(ValueError):
        split_multi_stream_lease_key(lease_key)


def test_a_multi_stream_lease_carries_its_stream_and_shard() -> None:
    lease = Lease.for_stream(STREAM, "shardId-4", lease_owner="w")
    assert (lease.lease_key, lease.stream_name, lease.shard_id, lease.is_multi_stream, lease.lease_owner) == (
        "123456789012:stream:1:shardId-4",
        "123456789012:stream:1",
        "shardId-4",
        True,
        "w",
    )


def test_a_single_stream_lease_is_not_multi_stream() -> None:
    assert not Lease("shardId-4").is_multi_stream


def test_a_lease_at_latest_is_pinned_once_and_reads_from_its_pin_until_a_checkpoint_moves_it() -> None:
    at_latest = Lease("shardId-1", checkpoint=LATEST)
    assert at_latest.latest_since is None
    pinned = at_latest.pinned_at_latest(1_700_000_000_000)
    assert pinned.latest_since == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert pinned.pinned_at_latest(1_800_000_000_000) == pinned, "a pin never moves"
    assert pinned.with_pending_checkpoint(ExtendedSequenceNumber("5")).latest_since == pinned.latest_since
    assert pinned.with_checkpoint(ExtendedSequenceNumber("5")).latest_start_millis is None


@pytest.mark.parametrize("checkpoint", [TRIM_HORIZON, ExtendedSequenceNumber("5")], ids=str)
def test_a_lease_off_latest_is_never_pinned_and_a_stray_pin_means_nothing(checkpoint: ExtendedSequenceNumber) -> None:
    lease = Lease("shardId-1", checkpoint=checkpoint)
    assert lease.pinned_at_latest(1_700_000_000_000) == lease
    assert lease.replace(latest_start_millis=1_700_000_000_000).latest_since is None
