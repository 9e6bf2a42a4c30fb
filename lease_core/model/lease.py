"""The KCL lease: every attribute KCL persists in the lease table (docs/protocol.md §1.1).

`Lease` is an immutable value holding exactly what is stored. What KCL keeps only in memory
(concurrency token, last counter-increment time, steal marks) belongs to whoever holds the lease,
not to this value.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lease_core.errors import CheckpointOrderError
from lease_core.model.sequence import LATEST, TRIM_HORIZON, ExtendedSequenceNumber

MAX_HASH_KEY = 2**128 - 1
# The last millisecond of year 9999, the latest moment a datetime holds.
MAX_EPOCH_MILLIS = 253_402_300_799_999


@dataclass(frozen=True)
class HashKeyRange:
    """The inclusive range of 128-bit hash keys a shard covers; start is strictly below end."""

    starting_hash_key: int
    ending_hash_key: int

    def __post_init__(self) -> None:
        if not 0 <= self.starting_hash_key < self.ending_hash_key <= MAX_HASH_KEY:
            raise ValueError(
                f"hash key range needs 0 <= start < end <= 2^128-1, got "
                f"[{self.starting_hash_key}, {self.ending_hash_key}]"
            )

    @classmethod
    def from_strings(cls, starting: str, ending: str) -> HashKeyRange:
        return cls(int(starting), int(ending))


@dataclass(frozen=True)
class StreamIdentifier:
    """A multi-stream identifier, serialized `<accountId>:<streamName>:<creationEpoch>` (docs/protocol.md §7)."""

    account_id: str
    stream_name: str
    creation_epoch: int

    def __post_init__(self) -> None:
        if not (self.account_id.isdigit() and self.account_id.isascii()):
            raise ValueError(f"account id must be digits, got {self.account_id!r}")
        if not self.stream_name or ":" in self.stream_name:
            raise ValueError(f"stream name must be non-empty and free of ':', got {self.stream_name!r}")
        if self.creation_epoch < 0:
            raise ValueError(f"creation epoch must be >= 0, got {self.creation_epoch}")

    def serialize(self) -> str:
        return f"{self.account_id}:{self.stream_name}:{self.creation_epoch}"

    @classmethod
    def parse(cls, serialized: str) -> StreamIdentifier:
        parts = serialized.split(":")
        if len(parts) != 3 or not (parts[2].isdigit() and parts[2].isascii()):
            raise ValueError(
                f"multi-stream identifier must be <accountId>:<streamName>:<creationEpoch>, got {serialized!r}"
            )
        return cls(parts[0], parts[1], int(parts[2]))

    def lease_key(self, shard_id: str) -> str:
        return f"{self.serialize()}:{shard_id}"


def split_multi_stream_lease_key(lease_key: str) -> tuple[StreamIdentifier, str]:
    """Recover (stream identifier, shard id) from a multi-stream lease key: the first three fields."""
    parts = lease_key.split(":", 3)
    if len(parts) != 4 or not parts[3]:
        raise ValueError(f"multi-stream lease key must be <account>:<stream>:<epoch>:<shardId>, got {lease_key!r}")
    return StreamIdentifier.parse(":".join(parts[:3])), parts[3]


def _json_value(text: str, what: str) -> Any:
    """`text` parsed as JSON; ValueError naming `what` it should have been otherwise."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} {text!r} is not JSON: {error}") from None


@dataclass(frozen=True)
class MeasurementBeforeClaim:
    """The lease's own throughput measurement, kept while a slot's claim in `round` stands in for it.

    A claim stores, ahead of its read, what a round that reads nothing would measure
    (`lease_core.metrics.throughput.claimed_measurement`), so that a lease with nothing new costs the
    round one write. Until the round's own measurement settles it, any other attempt of that round
    (a retry, a newer attempt beside a zombie) measures from this, not from the stand-in.
    """

    round: int
    throughput_kbps: float
    read_through_millis: int

    def encode(self) -> str:
        """Compact JSON under KCL-style names, readable in the DynamoDB console."""
        fields = {
            "round": self.round,
            "throughputKBps": self.throughput_kbps,
            "readThroughMillis": self.read_through_millis,
        }
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> MeasurementBeforeClaim:
        """The value `encode` wrote; ValueError naming what is wrong otherwise."""
        fields = _json_value(text, "a kept measurement")
        names = {"round", "throughputKBps", "readThroughMillis"}
        if not isinstance(fields, dict) or set(fields) != names:
            raise ValueError(f"a kept measurement {text!r} needs exactly {sorted(names)}")
        round_, throughput, read_through = fields["round"], fields["throughputKBps"], fields["readThroughMillis"]
        if not all(
            isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in (round_, read_through)
        ):
            raise ValueError(f"a kept measurement {text!r}: round and readThroughMillis must be integers >= 0")
        if (
            isinstance(throughput, bool)
            or not isinstance(throughput, int | float)
            or not 0 <= throughput < float("inf")
        ):
            raise ValueError(f"a kept measurement {text!r}: throughputKBps must be a finite number >= 0")
        return cls(round_, float(throughput), read_through)


@dataclass(frozen=True)
class AgedOutRange:
    """Records of a lease after `after` and before `first_available` aged out before they were read.

    `first_available` is None when nothing was left in the shard; `first_available_arrival` is that
    record's arrival time (ISO 8601). Positions are written as the lease's checkpoints are.
    """

    after: str
    first_available: str | None = None
    first_available_arrival: str | None = None

    def __post_init__(self) -> None:
        if not self.after:
            raise ValueError("an aged-out range needs the position it starts after")

    def encode(self) -> str:
        """The range as one string of a DynamoDB string set: compact JSON with sorted keys, so the
        same range always encodes alike (set ADD and DELETE match it exactly)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> AgedOutRange:
        """The range `encode` wrote; ValueError naming what is wrong otherwise."""
        fields = _json_value(text, "aged-out range")
        names = {field_.name for field_ in dataclasses.fields(cls)}
        if not isinstance(fields, dict) or not set(fields) <= names or "after" not in fields:
            raise ValueError(f"aged-out range {text!r} needs 'after' and at most {sorted(names)}")
        if not all(value is None or isinstance(value, str) for value in fields.values()):
            raise ValueError(f"aged-out range {text!r}: every field is a string or null")
        return cls(**fields)


@dataclass(frozen=True)
class Lease:
    """One item of the lease table, as a value. Field names are the KCL names in snake_case."""

    lease_key: str
    checkpoint: ExtendedSequenceNumber = TRIM_HORIZON
    lease_owner: str | None = None
    lease_counter: int = 0
    pending_checkpoint: ExtendedSequenceNumber | None = None
    pending_checkpoint_state: bytes | None = None
    owner_switches_since_checkpoint: int = 0
    parent_shard_ids: frozenset[str] = field(default_factory=frozenset)
    child_shard_ids: frozenset[str] = field(default_factory=frozenset)
    hash_key_range: HashKeyRange | None = None
    throughput_kbps: float | None = None
    checkpoint_owner: str | None = None
    # Multi-stream leases only: `stream_name` holds the serialized stream identifier (KCL's naming).
    stream_name: str | None = None
    shard_id: str | None = None
    # Ours, not KCL's (KCL readers ignore them): the token of the attempt that claimed the lease last,
    # which every write of that attempt is conditional on; and the sink's record of the committed
    # batches readers may not see yet (a sink makes a batch visible only after its commit). The lease
    # keeps the record for the sink and never looks inside it (`sinks.batch_sink`).
    claim_token: str | None = None
    committed_batch: str | None = None
    # Also ours: retention losses met while reading this lease that no kept round report has named
    # yet. A holder adds them with the write that moves past them (set ADD); the step that keeps the
    # round's report removes exactly the ones it named (set DELETE), so a report lost with its
    # driver is made again by a later round.
    unreported_losses: frozenset[AgedOutRange] = field(default_factory=frozenset)
    # And: the data time (epoch millis of arrival) through which the lease has been read, where the
    # next round's throughput window starts (`lease_core.metrics.throughput`).
    read_through_millis: int | None = None
    # And: while a slot's claim stands in for the measurement above, the measurement it replaced.
    measured_before_claim: MeasurementBeforeClaim | None = None
    # And, for a lease at LATEST: the moment (epoch millis) LATEST stands for. KCL's worker opens
    # LATEST once and keeps its iterator; a round opens the shard anew each time, so an unpinned
    # LATEST would skip whatever arrived between two rounds that read nothing. The sync pins a lease
    # it creates at LATEST, a claim pins one that is not pinned yet, and every read opens
    # AT_TIMESTAMP of the pin until a checkpoint moves the lease off LATEST (`with_checkpoint`).
    latest_start_millis: int | None = None

    def __post_init__(self) -> None:
        if not self.lease_key:
            raise ValueError("lease_key must be a non-empty string")
        if "" in (self.lease_owner, self.checkpoint_owner, self.claim_token, self.committed_batch):
            raise ValueError(
                f"lease {self.lease_key!r}: owners, tokens and batch records are absent (None), never empty strings"
            )
        if self.lease_counter < 0:
            raise ValueError(f"lease {self.lease_key!r}: lease_counter must be >= 0")
        if self.latest_start_millis is not None and not 0 <= self.latest_start_millis <= MAX_EPOCH_MILLIS:
            raise ValueError(f"lease {self.lease_key!r}: latest_start_millis must be a moment in epoch milliseconds")
        if self.pending_checkpoint_state is not None and self.pending_checkpoint is None:
            raise ValueError(f"lease {self.lease_key!r}: pending_checkpoint_state needs a pending_checkpoint")
        if (self.stream_name is None) != (self.shard_id is None):
            raise ValueError(f"lease {self.lease_key!r}: stream_name and shard_id go together")
        # Sets are normalised so that equal leases compare equal whatever iterable was given.
        object.__setattr__(self, "parent_shard_ids", frozenset(self.parent_shard_ids))
        object.__setattr__(self, "child_shard_ids", frozenset(self.child_shard_ids))
        object.__setattr__(self, "unreported_losses", frozenset(self.unreported_losses))

    @classmethod
    def for_stream(cls, stream: StreamIdentifier, shard_id: str, **fields: Any) -> Lease:
        """A multi-stream lease: key `<stream id>:<shardId>` plus the `streamName`/`shardId` attributes."""
        return cls(lease_key=stream.lease_key(shard_id), stream_name=stream.serialize(), shard_id=shard_id, **fields)

    @property
    def is_multi_stream(self) -> bool:
        return self.stream_name is not None

    @property
    def actual_owner(self) -> str | None:
        """Who may checkpoint now: the checkpoint owner during a graceful handoff, else the lease owner."""
        return self.checkpoint_owner if self.checkpoint_owner is not None else self.lease_owner

    @property
    def is_in_handoff(self) -> bool:
        return self.checkpoint_owner is not None

    @property
    def is_at_shard_end(self) -> bool:
        return self.checkpoint.is_shard_end

    @property
    def latest_since(self) -> datetime | None:
        """The moment a lease at LATEST reads from; None when it is not at LATEST or not pinned yet.
        A pin left beside another checkpoint (by a tool that does not know it) means nothing."""
        if self.checkpoint != LATEST or self.latest_start_millis is None:
            return None
        return datetime.fromtimestamp(self.latest_start_millis / 1000, UTC)

    def pinned_at_latest(self, now_millis: int) -> Lease:
        """The lease as a claim at `now_millis` writes its pin: a lease at LATEST with no pin, or with
        one after `now_millis` (a host whose clock runs ahead pinned it), is pinned at `now_millis`;
        a pin beside another checkpoint (left by a writer that does not know it) is dropped, so that
        it cannot come back if that writer sets LATEST again. A pin only ever moves earlier: reading
        from earlier includes everything after the later moment, and nothing after LATEST was landed."""
        if self.checkpoint != LATEST:
            return self if self.latest_start_millis is None else self.replace(latest_start_millis=None)
        if self.latest_start_millis is not None and self.latest_start_millis <= now_millis:
            return self
        return self.replace(latest_start_millis=now_millis)

    def replace(self, **changes: Any) -> Lease:
        return dataclasses.replace(self, **changes)

    def with_checkpoint(self, value: ExtendedSequenceNumber, record: str | None = None) -> Lease:
        """The lease after a real checkpoint: pending fields cleared and owner switches zeroed (§2.5).

        `record`: the sink's record of the committed batches (`committed_batch`), None when it keeps none.
        """
        self._require_not_backwards(value)
        return self.replace(
            checkpoint=value,
            pending_checkpoint=None,
            pending_checkpoint_state=None,
            owner_switches_since_checkpoint=0,
            committed_batch=record,
            latest_start_millis=None,
        )

    def with_pending_checkpoint(self, value: ExtendedSequenceNumber, state: bytes | None = None) -> Lease:
        """The lease after preparing a checkpoint: only the pending fields change (§2.6)."""
        self._require_not_backwards(value)
        return self.replace(pending_checkpoint=value, pending_checkpoint_state=state)

    def with_child_shard_ids(self, child_shard_ids: frozenset[str] | set[str]) -> Lease:
        """Setting child ids adds to the known set; it never clears (§1.1)."""
        return self.replace(child_shard_ids=self.child_shard_ids | frozenset(child_shard_ids))

    def _require_not_backwards(self, value: ExtendedSequenceNumber) -> None:
        if value < self.checkpoint:
            raise CheckpointOrderError(self.lease_key, str(self.checkpoint), str(value))
