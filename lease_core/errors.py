"""The error hierarchy of lease_core.

Every error says whether retrying the same call later can succeed (`retryable`). Each class is a
dataclass of the facts its message names, plus `__str__`. Errors raised in Spark executors travel
back to the driver by pickling: the base class keeps the fields in `args`, in order, so that an
error pickles by value and is rebuilt with its own constructor.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Each error class is `@dataclass(eq=False, repr=False)`: identity equality and Exception's repr, as
# for any exception (spelled out on each class: type checkers see an aliased decorator as a plain call).


class LeaseCoreError(Exception):
    """Base class of every error raised by lease_core."""

    retryable = False  # a class attribute (spark_jobs' SinkError makes it a field: it depends on the failure)

    @property
    def kind(self) -> str:
        """The error's name in messages: its class's (an error reported by another process keeps its own)."""
        return type(self).__name__

    def __post_init__(self) -> None:
        # The dataclass __init__ does not call Exception's: `args` gets the fields here, in order.
        self.args = tuple(getattr(self, field.name) for field in dataclasses.fields(self))  # type: ignore[arg-type]


@dataclass(eq=False, repr=False)
class ConfigurationError(LeaseCoreError, ValueError):
    """A configuration value is missing, unknown or invalid; the message names the key."""

    key: str
    problem: str

    def __str__(self) -> str:
        return f"configuration key {self.key!r}: {self.problem}"


@dataclass(eq=False, repr=False)
class TableNotFoundError(LeaseCoreError):
    """A DynamoDB table the operation needs does not exist."""

    table_name: str
    hint: str = "run `leasectl init` to create the tables"

    def __str__(self) -> str:
        return f"DynamoDB table {self.table_name!r} does not exist; {self.hint}"


@dataclass(eq=False, repr=False)
class TableNotReadyError(LeaseCoreError):
    """A table (or its index) did not become ACTIVE within the allowed time."""

    retryable = True

    table_name: str
    status: str
    waited_seconds: float

    def __str__(self) -> str:
        return f"DynamoDB table {self.table_name!r} is still {self.status} after {self.waited_seconds:.0f} s of waiting"


@dataclass(eq=False, repr=False)
class TableProtectedError(LeaseCoreError):
    """A table cannot be deleted because deletion protection is on."""

    table_name: str

    def __str__(self) -> str:
        return (
            f"DynamoDB table {self.table_name!r} has deletion protection enabled; disable it "
            "(UpdateTable DeletionProtectionEnabled=false) before tearing the application down"
        )


@dataclass(eq=False, repr=False)
class ForeignTableError(LeaseCoreError):
    """A table under one of the application's table names is not the application's own.

    Its key schema, attribute types or items are not those of the role it would play (`role`:
    "lease table", ...); `mismatch` says what differs. Not retryable: the name collides with
    another application's table or an unrelated one, and `operation` (table setup, teardown) was
    refused before it created, changed or deleted any table.
    """

    table_name: str
    role: str
    mismatch: str
    operation: str

    def __str__(self) -> str:
        return (
            f"DynamoDB table {self.table_name!r} is not this application's {self.role}: {self.mismatch}; "
            f"{self.operation} refused, no table was created, changed or deleted "
            "(check application_name and lease_table_name)"
        )


@dataclass(eq=False, repr=False)
class LayoutConflictError(LeaseCoreError):
    """The application's tables hold both table layouts at once (docs/protocol.md §1.7): its lease
    table holds KCL 3.5 single-table items while the separate worker-metrics or coordinator-state
    table exists too. Not retryable: which layout is the application's cannot be told.
    """

    lease_table: str
    separate_tables: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"lease table {self.lease_table!r} holds KCL 3.5 single-table items (worker metrics or coordinator "
            f"state) while the separate table(s) {', '.join(repr(name) for name in self.separate_tables)} exist "
            "too; an application uses one layout at a time: delete the tables of the layout it no longer uses"
        )


@dataclass(eq=False, repr=False)
class TableMigrationChangedError(LeaseCoreError):
    """KCL 3.5's table migration moved on after this process read the application's layout
    (docs/protocol.md §1.8), so that where it reads or writes records is not where they are now (at
    COMPLETE, the lock it took in the coordinator-state table is not the application's any more).
    Retryable: a new process reads the layout again."""

    retryable = True

    coordinator_state_table: str
    read_status: str | None
    current_status: str | None

    def __str__(self) -> str:
        return (
            f"the table migration recorded in {self.coordinator_state_table!r} went from "
            f"{self.read_status or 'none'} to {self.current_status or 'none'} after this process read it, "
            "and the lock it took was released; run the step again"
        )


@dataclass(eq=False, repr=False)
class DependencyError(LeaseCoreError):
    """An AWS call failed for a reason that may go away: transport errors, 5xx answers."""

    retryable = True

    service: str
    operation: str
    detail: str
    attempts: int

    def __str__(self) -> str:
        return f"{self.service} {self.operation} failed after {self.attempts} attempt(s): {self.detail}"


class ThrottledError(DependencyError):
    """AWS kept throttling a call after every retry allowed by the retry policy."""


@dataclass(eq=False, repr=False)
class AccessError(LeaseCoreError):
    """AWS refused a call for a reason retrying will not fix (credentials, permissions, validation)."""

    service: str
    operation: str
    detail: str

    def __str__(self) -> str:
        return f"{self.service} {self.operation} was refused: {self.detail}"


@dataclass(eq=False, repr=False)
class CorruptLeaseError(LeaseCoreError):
    """A lease-table item cannot be read as a lease; the message names the item and the attribute."""

    lease_key: str
    problem: str
    attribute: str | None = None  # the attribute at fault, when one is (a repair replaces or drops it)

    def __str__(self) -> str:
        return f"lease item {self.lease_key!r} is not a valid KCL lease: {self.problem}"


@dataclass(eq=False, repr=False)
class InvalidSequenceNumberError(LeaseCoreError, ValueError):
    """A checkpoint value is neither a sentinel name nor a decimal sequence number."""

    value: object
    problem: str

    def __str__(self) -> str:
        return f"invalid sequence number {self.value!r}: {self.problem}"


@dataclass(eq=False, repr=False)
class CheckpointOrderError(LeaseCoreError, ValueError):
    """A checkpoint would move a lease's checkpoint backwards."""

    lease_key: str
    current: str
    requested: str

    def __str__(self) -> str:
        return (
            f"lease {self.lease_key!r}: checkpoint {self.requested} is below the current "
            f"checkpoint {self.current}; checkpoints never move backwards"
        )


@dataclass(eq=False, repr=False)
class IndexNotFoundError(LeaseCoreError):
    """The lease table lacks the owner index KCL 3.x workers query."""

    table_name: str
    index_name: str

    def __str__(self) -> str:
        return (
            f"DynamoDB table {self.table_name!r} has no index {self.index_name!r}; run `leasectl init` "
            "to add it (KCL 2.x tables do not have it)"
        )


@dataclass(eq=False, repr=False)
class StreamNotFoundError(LeaseCoreError):
    """The Kinesis stream does not exist (or is being deleted)."""

    stream_name: str

    def __str__(self) -> str:
        return f"Kinesis stream {self.stream_name!r} does not exist"


@dataclass(eq=False, repr=False)
class StreamNotActiveError(LeaseCoreError):
    """The stream exists but cannot be listed yet (CREATING) or any more (DELETING)."""

    retryable = True

    stream_name: str
    status: str

    def __str__(self) -> str:
        return f"Kinesis stream {self.stream_name!r} is {self.status}, not ACTIVE or UPDATING"


@dataclass(eq=False, repr=False)
class StreamConsumerError(LeaseCoreError):
    """The application's enhanced fan-out consumer on a stream cannot be used, registered or kept.

    `problem` says why (a consumer of that name the application did not register, the stream's limit
    of consumers, a consumer missing or renamed since it was registered) and what to do. Not retryable:
    the same answer comes back until an operator acts. Raised before any lease moves.
    """

    stream_name: str
    consumer_name: str
    problem: str

    def __str__(self) -> str:
        return (
            f"enhanced fan-out consumer {self.consumer_name!r} of Kinesis stream {self.stream_name!r}: {self.problem}"
        )


@dataclass(eq=False, repr=False)
class ForeignStreamConsumerError(StreamConsumerError):
    """A consumer under the application's consumer name is not the one its record names: another
    application's (or one re-created by hand). It is never used and never deregistered."""


@dataclass(eq=False, repr=False)
class StreamConsumerNotReadyError(StreamConsumerError):
    """The consumer is not ACTIVE yet (still CREATING, being deleted), or the stream has as many
    consumers in CREATING as Kinesis allows at once. Retryable: these states pass."""

    retryable = True


@dataclass(eq=False, repr=False)
class IncompleteShardListError(LeaseCoreError):
    """A filtered shard listing did not cover the whole hash key space after every attempt (§3.2)."""

    retryable = True

    stream_name: str
    detail: str

    def __str__(self) -> str:
        return f"shard listing of stream {self.stream_name!r} does not cover the hash key space: {self.detail}"


@dataclass(eq=False, repr=False)
class InconsistentShardsError(LeaseCoreError):
    """Child shards of still-open parents were found (§3.3); the sync refuses to run."""

    stream_name: str
    shard_ids: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"stream {self.stream_name!r} lists child shards of parents that are still open: "
            f"{', '.join(self.shard_ids)}; set ignore_unexpected_child_shards = true to sync without them"
        )


@dataclass(eq=False, repr=False)
class InvalidShardLineageError(LeaseCoreError):
    """The child shards reported at SHARD_END contradict Kinesis' resharding rules (§3.8).

    Not retryable: the same child records come back on every attempt, so the lease needs an operator.
    """

    lease_key: str
    problem: str

    def __str__(self) -> str:
        return f"lease {self.lease_key!r} reached SHARD_END with invalid child shards: {self.problem}"


@dataclass(eq=False, repr=False)
class StreamMismatchError(LeaseCoreError):
    """A single-stream application was asked to sync a stream other than the one it consumes.

    `remembered` and `requested` describe the streams (name, ARN, creation time). Not retryable:
    the leases track the shards of the remembered stream; syncing another stream, or a stream
    re-created under the same name, would mix its shards with them.
    """

    table_name: str
    remembered: str
    requested: str
    recreated: bool

    def __str__(self) -> str:
        remembered = (
            f"the coordinator-state table {self.table_name!r} records stream {self.remembered} as the stream "
            "this application consumes"
        )
        if self.recreated:
            return (
                f"{remembered}, but the stream of that name now is {self.requested}: it was deleted and "
                "created again, and the leases track the shards of the old one. Sync refused; to consume "
                "the new stream, use a new application name or tear this application down (`leasectl teardown`)"
            )
        return (
            f"{remembered}; refusing to sync stream {self.requested} with its leases. Use another "
            "application name for another stream (or multi-stream mode for several)"
        )


@dataclass(eq=False, repr=False)
class CoordinatorStateConflictError(LeaseCoreError):
    """A coordinator-state record kept changing under every read-modify-write attempt."""

    retryable = True

    table_name: str
    key: str
    attempts: int

    def __str__(self) -> str:
        return (
            f"record {self.key!r} of table {self.table_name!r} changed under each of {self.attempts} attempts to "
            "update it; another writer is updating it at the same time"
        )


@dataclass(eq=False, repr=False)
class LeadershipUnavailableError(LeaseCoreError):
    """Another process holds the application's leader lock; only one round may run at a time."""

    retryable = True

    holder: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"the leader lock is held by {self.holder!r}; only one round of an application runs at a time"
        return f"{text}; {self.detail}" if self.detail else text


@dataclass(eq=False, repr=False)
class LeadershipLostError(LeaseCoreError):
    """The leader lock was lost while a control-plane step was writing; the step stopped before its next write.

    Retryable: a retry resumes the lock if it is still held under the same owner name, and fails
    naming the new holder if another round took it over.
    """

    retryable = True

    owner_name: str
    step: str

    def __str__(self) -> str:
        return (
            f"the leader lock of {self.owner_name!r} was lost during {self.step}; it stopped writing "
            "(another round may have taken over)"
        )


@dataclass(eq=False, repr=False)
class LeaseLostError(LeaseCoreError):
    """This worker no longer holds the lease: a renew or checkpoint condition failed, or it expired.

    Not retryable by the holder: someone else (the leader's assignment, another attempt of the same
    slot) owns the lease's next write. The holder stops reading it and never commits it.
    """

    lease_key: str
    reason: str

    def __str__(self) -> str:
        return f"lease {self.lease_key!r} was lost: {self.reason}"


@dataclass(eq=False, repr=False)
class RecordsLostError(LeaseCoreError):
    """A round landed everything it could, but some records can never be landed.

    Records aged out of the stream's retention before they were read, or a lease was deleted after
    its shard vanished before reaching SHARD_END. Not retryable: the records are gone from Kinesis.
    Raised after the round's figures are saved, so the loss is both recorded and alerted on.
    """

    losses: tuple[str, ...]

    def __str__(self) -> str:
        return f"{len(self.losses)} loss(es) of records that can no longer be landed: " + "; ".join(self.losses)


@dataclass(eq=False, repr=False)
class CorruptLeasesSkippedError(LeaseCoreError):
    """A round did everything it could, but lease-table items it cannot read as leases were skipped.

    Their shards are not read until each item is repaired (`leasectl repair`), so a round that skips
    one fails after landing the rest, like a loss: `problems` name each item and its bad attribute;
    `losses` are the round's record losses, if it had any too. Not retryable: the items stay as
    they are until someone repairs them.
    """

    problems: tuple[str, ...]
    losses: tuple[str, ...] = ()

    def __str__(self) -> str:
        skipped = (
            f"{len(self.problems)} lease item(s) skipped, their shards are not read until repaired "
            f"(`leasectl repair --lease KEY [--to POSITION]`, docs/operating.md): " + "; ".join(self.problems)
        )
        if not self.losses:
            return skipped
        return f"{skipped}. And {len(self.losses)} loss(es) of records: " + "; ".join(self.losses)
