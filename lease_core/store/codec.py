"""Lease <-> DynamoDB item, with KCL's attribute names and types (docs/protocol.md §1.1-1.3).

Items are in the low-level DynamoDB format (`{"S": ...}`, `{"N": ...}`, `{"SS": [...]}`, `{"B": ...}`),
which is what both the boto3 client and the in-memory store hold, so both stores share one codec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any, Literal, overload

from lease_core.errors import CorruptLeaseError, InvalidSequenceNumberError
from lease_core.model.lease import MAX_EPOCH_MILLIS, AgedOutRange, HashKeyRange, Lease, MeasurementBeforeClaim
from lease_core.model.sequence import ExtendedSequenceNumber

AttributeValue = dict[str, Any]
Item = dict[str, AttributeValue]

# KCL attribute names. Note the singular `parentShardId` and the capital B in `throughputKBps`.
LEASE_KEY = "leaseKey"
LEASE_OWNER = "leaseOwner"
LEASE_COUNTER = "leaseCounter"
CHECKPOINT = "checkpoint"
CHECKPOINT_SUB_SEQUENCE = "checkpointSubSequenceNumber"
PENDING_CHECKPOINT = "pendingCheckpoint"
PENDING_CHECKPOINT_SUB_SEQUENCE = "pendingCheckpointSubSequenceNumber"
PENDING_CHECKPOINT_STATE = "pendingCheckpointState"
OWNER_SWITCHES = "ownerSwitchesSinceCheckpoint"
PARENT_SHARD_IDS = "parentShardId"
CHILD_SHARD_IDS = "childShardIds"
STARTING_HASH_KEY = "startingHashKey"
ENDING_HASH_KEY = "endingHashKey"
THROUGHPUT_KBPS = "throughputKBps"
CHECKPOINT_OWNER = "checkpointOwner"
ENTITY_TYPE = "entityType"
STREAM_NAME = "streamName"
SHARD_ID = "shardId"
# Ours (kcl-compatibility.md): KCL neither reads nor writes them.
CLAIM_TOKEN = "claimToken"
# `Lease.committed_batch`, under the name it had when it held a file name: existing items keep theirs.
COMMITTED_BATCH = "committedBatchFile"
UNREPORTED_LOSSES = "unreportedRetentionLosses"
READ_THROUGH_MILLIS = "readThroughMillis"
MEASURED_BEFORE_CLAIM = "measuredBeforeClaim"
LATEST_START_MILLIS = "latestStartMillis"

LEASE_ENTITY_TYPE = "LEASE"
_THROUGHPUT_QUANTUM = Decimal("0.000001")


def string_value(value: str) -> AttributeValue:
    if not value:
        raise ValueError("DynamoDB rejects empty strings; absent values are omitted instead")
    return {"S": value}


def number_value(value: int | float | Decimal) -> AttributeValue:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"DynamoDB numbers must be finite, got {value}")
    return {"N": str(value)}


def string_set_value(values: frozenset[str] | set[str]) -> AttributeValue:
    if not values:
        raise ValueError("DynamoDB rejects empty sets; absent sets are omitted instead")
    return {"SS": sorted(values)}


def binary_value(value: bytes) -> AttributeValue:
    return {"B": bytes(value)}


def throughput_value(kbps: float) -> AttributeValue:
    """KCL rounds throughput half-up to 6 decimal places before storing it (§2.4)."""
    if not math.isfinite(kbps) or kbps < 0:
        raise ValueError(f"throughputKBps must be a finite, non-negative number, got {kbps}")
    # Enough digits for any finite double plus six decimals (the default context keeps only 28).
    context = Context(prec=400, rounding=ROUND_HALF_UP)
    return {"N": str(Decimal(repr(kbps)).quantize(_THROUGHPUT_QUANTUM, context=context))}


def lease_to_item(lease: Lease) -> Item:
    """The whole item KCL's create path writes (§1.1); pendingCheckpointState is always binary (§1.1)."""
    item: Item = {
        LEASE_KEY: string_value(lease.lease_key),
        LEASE_COUNTER: number_value(lease.lease_counter),
        OWNER_SWITCHES: number_value(lease.owner_switches_since_checkpoint),
        ENTITY_TYPE: string_value(LEASE_ENTITY_TYPE),
    }
    if lease.lease_owner is not None:
        item[LEASE_OWNER] = string_value(lease.lease_owner)
    item.update(checkpoint_attributes(lease))
    item.update(pending_checkpoint_attributes(lease))
    if lease.parent_shard_ids:
        item[PARENT_SHARD_IDS] = string_set_value(lease.parent_shard_ids)
    if lease.child_shard_ids:
        item[CHILD_SHARD_IDS] = string_set_value(lease.child_shard_ids)
    item.update(hash_key_range_attributes(lease))
    if lease.throughput_kbps is not None:
        item[THROUGHPUT_KBPS] = throughput_value(lease.throughput_kbps)
    if lease.checkpoint_owner is not None:
        item[CHECKPOINT_OWNER] = string_value(lease.checkpoint_owner)
    item.update(multi_stream_attributes(lease))
    if lease.claim_token is not None:
        item[CLAIM_TOKEN] = string_value(lease.claim_token)
    if lease.committed_batch is not None:
        item[COMMITTED_BATCH] = string_value(lease.committed_batch)
    if lease.unreported_losses:
        item[UNREPORTED_LOSSES] = aged_out_ranges_value(lease.unreported_losses)
    if lease.read_through_millis is not None:
        item[READ_THROUGH_MILLIS] = number_value(lease.read_through_millis)
    if lease.measured_before_claim is not None:
        item[MEASURED_BEFORE_CLAIM] = string_value(lease.measured_before_claim.encode())
    if lease.latest_start_millis is not None:
        item[LATEST_START_MILLIS] = number_value(lease.latest_start_millis)
    return item


def aged_out_ranges_value(ranges: frozenset[AgedOutRange] | set[AgedOutRange]) -> AttributeValue:
    return string_set_value({aged_out.encode() for aged_out in ranges})


def checkpoint_attributes(lease: Lease) -> Item:
    return {
        CHECKPOINT: string_value(lease.checkpoint.sequence_number),
        CHECKPOINT_SUB_SEQUENCE: number_value(lease.checkpoint.sub_sequence_number),
    }


def pending_checkpoint_attributes(lease: Lease) -> Item:
    """The pending pair and state; empty when nothing is prepared."""
    if lease.pending_checkpoint is None:
        return {}
    item = {
        PENDING_CHECKPOINT: string_value(lease.pending_checkpoint.sequence_number),
        PENDING_CHECKPOINT_SUB_SEQUENCE: number_value(lease.pending_checkpoint.sub_sequence_number),
    }
    if lease.pending_checkpoint_state is not None:
        item[PENDING_CHECKPOINT_STATE] = binary_value(lease.pending_checkpoint_state)
    return item


def hash_key_range_attributes(lease: Lease) -> Item:
    if lease.hash_key_range is None:
        return {}
    return {
        STARTING_HASH_KEY: string_value(str(lease.hash_key_range.starting_hash_key)),
        ENDING_HASH_KEY: string_value(str(lease.hash_key_range.ending_hash_key)),
    }


def multi_stream_attributes(lease: Lease) -> Item:
    if lease.stream_name is None or lease.shard_id is None:
        return {}
    return {STREAM_NAME: string_value(lease.stream_name), SHARD_ID: string_value(lease.shard_id)}


# KCL 3.5's entity types for the items of the lease table that are not leases.
WORKER_METRIC_STATS_ENTITY_TYPE = "WORKER_METRIC_STATS"
STREAM_ENTITY_TYPE = "STREAM"
LEADER_ENTITY_TYPE = "LEADER"
CLIENT_VERSION_MIGRATION_ENTITY_TYPE = "CLIENT_VERSION_MIGRATION"
TABLE_MIGRATION_ENTITY_TYPE = "TABLE_MIGRATION"
# Coordinator-state records written before KCL tagged them are known by their key.
LEGACY_COORDINATOR_STATE_KEYS: Mapping[str, str] = {
    "Leader": LEADER_ENTITY_TYPE,
    "Migration3.0": CLIENT_VERSION_MIGRATION_ENTITY_TYPE,
    "TableMigration3.5": TABLE_MIGRATION_ENTITY_TYPE,
}
# This project's coordinator-state records by key (docs/protocol.md §5.3; a unit test keeps the list in
# step with the modules that write them). In the lease table they are tagged LEADER; one that is not
# (KCL 3.5's table migration moves records it does not know without their tag) is still known by its
# key, as long as it has neither of a lease's own attributes.
PROJECT_COORDINATOR_STATE_KEYS = frozenset(
    {
        "LeaderObservation",
        "AssignmentRound",
        "RoundHistory",
        "LastRoundLeases",
        "ConsumedStream",
        "FormerStreams",
        "LoadProbes",
        "TableLayout",
    }
)
PROJECT_COORDINATOR_STATE_KEY_PREFIXES = ("ShardSyncAuditor:", "GarbageLeaseCleanup:", "StreamConsumer:")


def untagged_entity_type(key: str, has_lease_attributes: bool) -> str:
    """The entity type of a lease-table item without `entityType`: a well-known coordinator-state key's;
    this project's coordinator-state record when its key is one and it has no `leaseCounter` or
    `checkpoint`; else LEASE (KCL before 3.5 tags nothing)."""
    if key in LEGACY_COORDINATOR_STATE_KEYS:
        return LEGACY_COORDINATOR_STATE_KEYS[key]
    project_key = key in PROJECT_COORDINATOR_STATE_KEYS or key.startswith(PROJECT_COORDINATOR_STATE_KEY_PREFIXES)
    return LEADER_ENTITY_TYPE if project_key and not has_lease_attributes else LEASE_ENTITY_TYPE


def entity_type(item: Mapping[str, AttributeValue]) -> str:
    """The entity type of a lease-table item: its `entityType`, else `untagged_entity_type`."""
    tagged = item.get(ENTITY_TYPE)
    if tagged is not None:
        return str(tagged.get("S", ""))
    key = item.get(LEASE_KEY, {}).get("S")
    if not isinstance(key, str):
        return LEASE_ENTITY_TYPE
    return untagged_entity_type(key, LEASE_COUNTER in item or CHECKPOINT in item)


def is_lease_item(item: Mapping[str, AttributeValue]) -> bool:
    """KCL 3.5+: an item of another entity type is not a lease (§1.6), nor is an untagged
    coordinator-state record under its well-known key."""
    return entity_type(item) == LEASE_ENTITY_TYPE


def lease_from_item(item: Mapping[str, AttributeValue]) -> Lease:
    """Decode a lease item, raising CorruptLeaseError naming the key and the bad attribute."""
    key = _describe_key(item)
    reader = _ItemReader(key, item)
    stream_name, shard_id = reader.multi_stream()
    try:
        return Lease(
            lease_key=reader.string(LEASE_KEY, required=True),
            lease_owner=reader.string(LEASE_OWNER),
            lease_counter=reader.integer(LEASE_COUNTER, required=True),
            checkpoint=reader.sequence(CHECKPOINT, CHECKPOINT_SUB_SEQUENCE, required=True),
            pending_checkpoint=reader.sequence(PENDING_CHECKPOINT, PENDING_CHECKPOINT_SUB_SEQUENCE),
            pending_checkpoint_state=reader.binary(PENDING_CHECKPOINT_STATE) if PENDING_CHECKPOINT in item else None,
            owner_switches_since_checkpoint=reader.integer(OWNER_SWITCHES) or 0,
            parent_shard_ids=reader.string_set(PARENT_SHARD_IDS),
            child_shard_ids=reader.string_set(CHILD_SHARD_IDS),
            hash_key_range=reader.hash_key_range(),
            throughput_kbps=reader.floating(THROUGHPUT_KBPS),
            checkpoint_owner=reader.string(CHECKPOINT_OWNER),
            stream_name=stream_name,
            shard_id=shard_id,
            claim_token=reader.string(CLAIM_TOKEN),
            committed_batch=reader.string(COMMITTED_BATCH),
            unreported_losses=reader.aged_out_ranges(UNREPORTED_LOSSES),
            read_through_millis=reader.integer(READ_THROUGH_MILLIS),
            measured_before_claim=reader.measurement_before_claim(MEASURED_BEFORE_CLAIM),
            latest_start_millis=reader.epoch_millis(LATEST_START_MILLIS),
        )
    except ValueError as error:  # a value the model itself rejects, e.g. an inverted hash range
        raise CorruptLeaseError(key, str(error)) from error


# What a repair writes anew whatever the item held: no pending batch, a counter above the one read,
# and no owner (the next assignment places the lease). The checkpoint is the item's own when it reads,
# or the position the operator gives.
_REPLACED_BY_REPAIR = (
    CHECKPOINT,
    CHECKPOINT_SUB_SEQUENCE,
    PENDING_CHECKPOINT,
    PENDING_CHECKPOINT_SUB_SEQUENCE,
    PENDING_CHECKPOINT_STATE,
    LEASE_COUNTER,
    LEASE_OWNER,
    CHECKPOINT_OWNER,
    CLAIM_TOKEN,
    MEASURED_BEFORE_CLAIM,
    OWNER_SWITCHES,
)
# Never dropped: the item's identity, and its parents (without them a child is read before its
# parents end). A repair cannot guess them; they are fixed by hand from the stream's listing.
_KEPT_OR_REFUSED = (LEASE_KEY, STREAM_NAME, SHARD_ID, PARENT_SHARD_IDS)
# Every attribute the codec reads or writes; a repair removes only these, never another tool's.
LEASE_ATTRIBUTES = frozenset(
    {
        LEASE_KEY,
        LEASE_OWNER,
        LEASE_COUNTER,
        CHECKPOINT,
        CHECKPOINT_SUB_SEQUENCE,
        PENDING_CHECKPOINT,
        PENDING_CHECKPOINT_SUB_SEQUENCE,
        PENDING_CHECKPOINT_STATE,
        OWNER_SWITCHES,
        PARENT_SHARD_IDS,
        CHILD_SHARD_IDS,
        STARTING_HASH_KEY,
        ENDING_HASH_KEY,
        THROUGHPUT_KBPS,
        CHECKPOINT_OWNER,
        ENTITY_TYPE,
        STREAM_NAME,
        SHARD_ID,
        CLAIM_TOKEN,
        COMMITTED_BATCH,
        UNREPORTED_LOSSES,
        READ_THROUGH_MILLIS,
        MEASURED_BEFORE_CLAIM,
        LATEST_START_MILLIS,
    }
)


class RepairRefused(ValueError):
    """A repair that would need a guess: the checkpoint to give or keep, or an attribute it cannot drop."""


def repaired_lease(
    item: Mapping[str, AttributeValue], checkpoint: ExtendedSequenceNumber | None
) -> tuple[Lease, tuple[str, ...]]:
    """The lease a repair writes over an unreadable `item`, and the attributes it had to drop.

    The checkpoint is `checkpoint`, or the item's own when None (it must read then); an item at
    SHARD_END stays there (its children depend on it). No pending batch, no owner, the counter 2
    above a readable one (else 1), so any holder is fenced. Every other attribute that reads is kept;
    each one that does not is dropped (named), except the identity and the parents: RepairRefused.
    """
    key = _ItemReader("<no leaseKey>", item).string(LEASE_KEY, required=True)
    reader = _ItemReader(key, item)
    current = _or_none(lambda: reader.sequence(CHECKPOINT, CHECKPOINT_SUB_SEQUENCE))
    if current is not None and current.is_shard_end and checkpoint is not None:
        raise RepairRefused("its checkpoint is SHARD_END: a finished shard stays finished; repair it without --to")
    if checkpoint is None and current is None:
        raise RepairRefused("its checkpoint does not read: give the position its shard resumes at (--to)")
    known_counter = _or_none(lambda: reader.integer(LEASE_COUNTER))
    cleaned = {name: value for name, value in item.items() if name not in _REPLACED_BY_REPAIR}
    if checkpoint is not None:
        # A position the operator gives starts afresh: LATEST then means the next round's claim.
        cleaned.pop(LATEST_START_MILLIS, None)
    cleaned[LEASE_COUNTER] = number_value(1 if known_counter is None else known_counter + 2)
    cleaned.update(checkpoint_attributes(Lease(key, checkpoint=checkpoint or current)))
    dropped: list[str] = []
    while True:
        try:
            return lease_from_item(cleaned), tuple(dropped)
        except CorruptLeaseError as error:
            if error.attribute is None or error.attribute not in cleaned:
                raise RepairRefused(error.problem) from None
            if error.attribute in _KEPT_OR_REFUSED:
                raise RepairRefused(f"{error.problem}: a repair never drops it; correct it by hand") from None
            drop = (STARTING_HASH_KEY, ENDING_HASH_KEY) if error.attribute == STARTING_HASH_KEY else (error.attribute,)
            for name in drop:
                if cleaned.pop(name, None) is not None:
                    dropped.append(name)


def _or_none(read: Any) -> Any:
    try:
        return read()
    except CorruptLeaseError:
        return None


def _describe_key(item: Mapping[str, AttributeValue]) -> str:
    value = item.get(LEASE_KEY)
    return value["S"] if isinstance(value, dict) and isinstance(value.get("S"), str) else "<no leaseKey>"


class _ItemReader:
    """Typed access to one item's attributes; wrong types raise CorruptLeaseError naming the attribute."""

    def __init__(self, key: str, item: Mapping[str, AttributeValue]) -> None:
        self._key = key
        self._item = item

    def _raw(self, name: str, type_code: str, required: bool) -> Any:
        value = self._item.get(name)
        if value is None:
            if required:
                raise CorruptLeaseError(self._key, f"attribute {name!r} is missing", name)
            return None
        if not isinstance(value, dict) or type_code not in value:
            found = next(iter(value), "?") if isinstance(value, dict) else type(value).__name__
            raise CorruptLeaseError(self._key, f"attribute {name!r} must be of type {type_code}, found {found}", name)
        return value[type_code]

    @overload
    def string(self, name: str, required: Literal[True]) -> str: ...
    @overload
    def string(self, name: str, required: bool = False) -> str | None: ...
    def string(self, name: str, required: bool = False) -> str | None:
        value = self._raw(name, "S", required)
        if value == "" and required:
            raise CorruptLeaseError(self._key, f"attribute {name!r} is an empty string", name)
        # KCL never writes empty strings; treat an optional one written by other tooling as absent.
        return value or None

    @overload
    def integer(self, name: str, required: Literal[True]) -> int: ...
    @overload
    def integer(self, name: str, required: bool = False) -> int | None: ...
    def integer(self, name: str, required: bool = False) -> int | None:
        raw = self._raw(name, "N", required)
        if raw is None:
            return None
        try:
            number = Decimal(raw)
        except InvalidOperation:
            raise CorruptLeaseError(self._key, f"attribute {name!r} is not a number: {raw!r}", name) from None
        if not number.is_finite() or number != number.to_integral_value() or number < 0:
            raise CorruptLeaseError(self._key, f"attribute {name!r} must be a non-negative integer, got {raw!r}", name)
        return int(number)

    def epoch_millis(self, name: str) -> int | None:
        """A moment in epoch milliseconds that a date can hold (a value in micro- or nanoseconds is not)."""
        value = self.integer(name)
        if value is not None and value > MAX_EPOCH_MILLIS:
            raise CorruptLeaseError(
                self._key, f"attribute {name!r} must be a moment in epoch milliseconds, got {value}", name
            )
        return value

    def floating(self, name: str) -> float | None:
        raw = self._raw(name, "N", False)
        if raw is None:
            return None
        try:
            number = Decimal(raw)
        except InvalidOperation:
            raise CorruptLeaseError(self._key, f"attribute {name!r} is not a number: {raw!r}", name) from None
        if not number.is_finite() or number < 0:
            raise CorruptLeaseError(self._key, f"attribute {name!r} must be a finite number >= 0, got {raw!r}", name)
        return float(number)

    def binary(self, name: str) -> bytes | None:
        raw = self._raw(name, "B", False)
        return None if raw is None else bytes(raw)

    def string_set(self, name: str) -> frozenset[str]:
        raw = self._raw(name, "SS", False)
        return frozenset(raw or ())

    def measurement_before_claim(self, name: str) -> MeasurementBeforeClaim | None:
        text = self.string(name)
        try:
            return None if text is None else MeasurementBeforeClaim.decode(text)
        except ValueError as error:
            raise CorruptLeaseError(self._key, f"attribute {name!r}: {error}", name) from None

    def aged_out_ranges(self, name: str) -> frozenset[AgedOutRange]:
        try:
            return frozenset(AgedOutRange.decode(text) for text in self.string_set(name))
        except ValueError as error:
            raise CorruptLeaseError(self._key, f"attribute {name!r}: {error}", name) from None

    @overload
    def sequence(self, name: str, sub_name: str, required: Literal[True]) -> ExtendedSequenceNumber: ...
    @overload
    def sequence(self, name: str, sub_name: str, required: bool = False) -> ExtendedSequenceNumber | None: ...
    def sequence(self, name: str, sub_name: str, required: bool = False) -> ExtendedSequenceNumber | None:
        sequence_number = self.string(name, required)
        if sequence_number is None:
            return None
        sub = self.integer(sub_name) or 0
        try:
            return ExtendedSequenceNumber(sequence_number, sub)
        except InvalidSequenceNumberError as error:
            raise CorruptLeaseError(self._key, f"attribute {name!r}: {error}", name) from None

    def hash_key_range(self) -> HashKeyRange | None:
        start = self.string(STARTING_HASH_KEY)
        end = self.string(ENDING_HASH_KEY)
        if start is None or end is None:
            return None
        for name, value in ((STARTING_HASH_KEY, start), (ENDING_HASH_KEY, end)):
            if not (value.isdigit() and value.isascii()):
                raise CorruptLeaseError(self._key, f"attribute {name!r} must be a decimal string, got {value!r}", name)
        try:
            return HashKeyRange.from_strings(start, end)
        except ValueError as error:
            raise CorruptLeaseError(
                self._key, f"attributes {STARTING_HASH_KEY!r}/{ENDING_HASH_KEY!r}: {error}", STARTING_HASH_KEY
            ) from None

    def multi_stream(self) -> tuple[str | None, str | None]:
        stream_name, shard_id = self.string(STREAM_NAME), self.string(SHARD_ID)
        if (stream_name is None) != (shard_id is None):
            raise CorruptLeaseError(
                self._key, f"attributes {STREAM_NAME!r} and {SHARD_ID!r} must both be present or both absent"
            )
        return stream_name, shard_id
