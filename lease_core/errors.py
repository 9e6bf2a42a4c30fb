"""The error hierarchy of lease_core.

Every error says whether retrying the same call later can succeed (`retryable`). Errors raised in
Spark executors travel back to the driver by pickling, so every class here keeps its constructor
arguments in `args` and pickles by value.
"""

from __future__ import annotations


class LeaseCoreError(Exception):
    """Base class of every error raised by lease_core."""

    retryable: bool = False


class ConfigurationError(LeaseCoreError, ValueError):
    """A configuration value is missing, unknown or invalid; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(key, problem)
        self.key = key
        self.problem = problem

    def __str__(self) -> str:
        return f"configuration key {self.key!r}: {self.problem}"


class TableNotFoundError(LeaseCoreError):
    """A DynamoDB table the operation needs does not exist."""

    def __init__(self, table_name: str, hint: str = "run `leasectl init` to create the tables") -> None:
        super().__init__(table_name, hint)
        self.table_name = table_name
        self.hint = hint

    def __str__(self) -> str:
        return f"DynamoDB table {self.table_name!r} does not exist; {self.hint}"


class TableNotReadyError(LeaseCoreError):
    """A table (or its index) did not become ACTIVE within the allowed time."""

    retryable = True

    def __init__(self, table_name: str, status: str, waited_seconds: float) -> None:
        super().__init__(table_name, status, waited_seconds)
        self.table_name = table_name
        self.status = status
        self.waited_seconds = waited_seconds

    def __str__(self) -> str:
        return f"DynamoDB table {self.table_name!r} is still {self.status} after {self.waited_seconds:.0f} s of waiting"


class TableProtectedError(LeaseCoreError):
    """A table cannot be deleted because deletion protection is on."""

    def __init__(self, table_name: str) -> None:
        super().__init__(table_name)
        self.table_name = table_name

    def __str__(self) -> str:
        return (
            f"DynamoDB table {self.table_name!r} has deletion protection enabled; disable it "
            "(UpdateTable DeletionProtectionEnabled=false) before tearing the application down"
        )


class DependencyError(LeaseCoreError):
    """An AWS call failed for a reason that may go away: transport errors, 5xx answers."""

    retryable = True

    def __init__(self, service: str, operation: str, detail: str, attempts: int) -> None:
        super().__init__(service, operation, detail, attempts)
        self.service = service
        self.operation = operation
        self.detail = detail
        self.attempts = attempts

    def __str__(self) -> str:
        return f"{self.service} {self.operation} failed after {self.attempts} attempt(s): {self.detail}"


class ThrottledError(DependencyError):
    """AWS kept throttling a call after every retry allowed by the retry policy."""


class AccessError(LeaseCoreError):
    """AWS refused a call for a reason retrying will not fix (credentials, permissions, validation)."""

    def __init__(self, service: str, operation: str, detail: str) -> None:
        super().__init__(service, operation, detail)
        self.service = service
        self.operation = operation
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.service} {self.operation} was refused: {self.detail}"


class CorruptLeaseError(LeaseCoreError):
    """A lease-table item cannot be read as a lease; the message names the item and the attribute."""

    def __init__(self, lease_key: str, problem: str) -> None:
        super().__init__(lease_key, problem)
        self.lease_key = lease_key
        self.problem = problem

    def __str__(self) -> str:
        return f"lease item {self.lease_key!r} is not a valid KCL lease: {self.problem}"


class InvalidSequenceNumberError(LeaseCoreError, ValueError):
    """A checkpoint value is neither a sentinel name nor a decimal sequence number."""

    def __init__(self, value: object, problem: str) -> None:
        super().__init__(value, problem)
        self.value = value
        self.problem = problem

    def __str__(self) -> str:
        return f"invalid sequence number {self.value!r}: {self.problem}"


class CheckpointOrderError(LeaseCoreError, ValueError):
    """A checkpoint would move a lease's checkpoint backwards."""

    def __init__(self, lease_key: str, current: str, requested: str) -> None:
        super().__init__(lease_key, current, requested)
        self.lease_key = lease_key
        self.current = current
        self.requested = requested

    def __str__(self) -> str:
        return (
            f"lease {self.lease_key!r}: checkpoint {self.requested} is below the current "
            f"checkpoint {self.current}; checkpoints never move backwards"
        )


class IndexNotFoundError(LeaseCoreError):
    """The lease table lacks the owner index KCL 3.x workers query."""

    def __init__(self, table_name: str, index_name: str) -> None:
        super().__init__(table_name, index_name)
        self.table_name = table_name
        self.index_name = index_name

    def __str__(self) -> str:
        return (
            f"DynamoDB table {self.table_name!r} has no index {self.index_name!r}; run `leasectl init` "
            "to add it (KCL 2.x tables do not have it)"
        )


class StreamNotFoundError(LeaseCoreError):
    """The Kinesis stream does not exist (or is being deleted)."""

    def __init__(self, stream_name: str) -> None:
        super().__init__(stream_name)
        self.stream_name = stream_name

    def __str__(self) -> str:
        return f"Kinesis stream {self.stream_name!r} does not exist"


class StreamNotActiveError(LeaseCoreError):
    """The stream exists but cannot be listed yet (CREATING) or any more (DELETING)."""

    retryable = True

    def __init__(self, stream_name: str, status: str) -> None:
        super().__init__(stream_name, status)
        self.stream_name = stream_name
        self.status = status

    def __str__(self) -> str:
        return f"Kinesis stream {self.stream_name!r} is {self.status}, not ACTIVE or UPDATING"


class IncompleteShardListError(LeaseCoreError):
    """A filtered shard listing did not cover the whole hash key space after every attempt (§3.2)."""

    retryable = True

    def __init__(self, stream_name: str, detail: str) -> None:
        super().__init__(stream_name, detail)
        self.stream_name = stream_name
        self.detail = detail

    def __str__(self) -> str:
        return f"shard listing of stream {self.stream_name!r} does not cover the hash key space: {self.detail}"


class InconsistentShardsError(LeaseCoreError):
    """Child shards of still-open parents were found (§3.3); the sync refuses to run."""

    def __init__(self, stream_name: str, shard_ids: tuple[str, ...]) -> None:
        super().__init__(stream_name, shard_ids)
        self.stream_name = stream_name
        self.shard_ids = shard_ids

    def __str__(self) -> str:
        return (
            f"stream {self.stream_name!r} lists child shards of parents that are still open: "
            f"{', '.join(self.shard_ids)}; set ignore_unexpected_child_shards = true to sync without them"
        )


class InvalidShardLineageError(LeaseCoreError):
    """The child shards reported at SHARD_END contradict Kinesis' resharding rules (§3.8).

    Not retryable: the same child records come back on every attempt, so the lease needs an operator.
    """

    def __init__(self, lease_key: str, problem: str) -> None:
        super().__init__(lease_key, problem)
        self.lease_key = lease_key
        self.problem = problem

    def __str__(self) -> str:
        return f"lease {self.lease_key!r} reached SHARD_END with invalid child shards: {self.problem}"


class StreamMismatchError(LeaseCoreError):
    """A single-stream application was asked to sync a stream other than the one it consumes.

    `remembered` and `requested` describe the streams (name, ARN, creation time). Not retryable:
    the leases track the shards of the remembered stream; syncing another stream, or a stream
    re-created under the same name, would mix its shards with them.
    """

    def __init__(self, table_name: str, remembered: str, requested: str, recreated: bool) -> None:
        super().__init__(table_name, remembered, requested, recreated)
        self.table_name = table_name
        self.remembered = remembered
        self.requested = requested
        self.recreated = recreated

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


class CoordinatorStateConflictError(LeaseCoreError):
    """A coordinator-state record kept changing under every read-modify-write attempt."""

    retryable = True

    def __init__(self, table_name: str, key: str, attempts: int) -> None:
        super().__init__(table_name, key, attempts)
        self.table_name = table_name
        self.key = key
        self.attempts = attempts

    def __str__(self) -> str:
        return (
            f"record {self.key!r} of table {self.table_name!r} changed under each of {self.attempts} attempts to "
            "update it; another writer is updating it at the same time"
        )


class LeadershipUnavailableError(LeaseCoreError):
    """Another process holds the application's leader lock; only one round may run at a time."""

    retryable = True

    def __init__(self, holder: str, detail: str = "") -> None:
        super().__init__(holder, detail)
        self.holder = holder
        self.detail = detail

    def __str__(self) -> str:
        text = f"the leader lock is held by {self.holder!r}; only one round of an application runs at a time"
        return f"{text}; {self.detail}" if self.detail else text


class LeadershipLostError(LeaseCoreError):
    """The leader lock was lost while a control-plane step was writing; the step stopped before its next write.

    Retryable: a retry resumes the lock if it is still held under the same owner name, and fails
    naming the new holder if another round took it over.
    """

    retryable = True

    def __init__(self, owner_name: str, step: str) -> None:
        super().__init__(owner_name, step)
        self.owner_name = owner_name
        self.step = step

    def __str__(self) -> str:
        return (
            f"the leader lock of {self.owner_name!r} was lost during {self.step}; it stopped writing "
            "(another round may have taken over)"
        )


class SinkError(LeaseCoreError):
    """The output dataset cannot be written where the job was told to write it.

    Retryable when the storage answered with a failure that may go away (a 5xx, a dropped
    connection); not retryable for a missing bucket, a path that is not a directory, or a refusal.
    """

    def __init__(self, uri: str, problem: str, retryable: bool = False) -> None:
        super().__init__(uri, problem, retryable)
        self.uri = uri
        self.problem = problem
        self.retryable = retryable

    def __str__(self) -> str:
        return f"sink {self.uri!r}: {self.problem}"


class TransformError(LeaseCoreError):
    """The user transform could not be loaded, raised, or returned something other than a table."""

    def __init__(self, spec: str, problem: str) -> None:
        super().__init__(spec, problem)
        self.spec = spec
        self.problem = problem

    def __str__(self) -> str:
        return f"transform {self.spec!r}: {self.problem}"


class LeaseLostError(LeaseCoreError):
    """This worker no longer holds the lease: a renew or checkpoint condition failed, or it expired.

    Not retryable by the holder: someone else (the leader's assignment, another attempt of the same
    slot) owns the lease's next write. The holder stops reading it and never commits it.
    """

    def __init__(self, lease_key: str, reason: str) -> None:
        super().__init__(lease_key, reason)
        self.lease_key = lease_key
        self.reason = reason

    def __str__(self) -> str:
        return f"lease {self.lease_key!r} was lost: {self.reason}"


class RecordsLostError(LeaseCoreError):
    """A round landed everything it could, but some records can never be landed.

    Records aged out of the stream's retention before they were read, or a lease was deleted after
    its shard vanished before reaching SHARD_END. Not retryable: the records are gone from Kinesis.
    Raised after the round's figures are saved, so the loss is both recorded and alerted on.
    """

    def __init__(self, losses: tuple[str, ...]) -> None:
        super().__init__(losses)
        self.losses = losses

    def __str__(self) -> str:
        return f"{len(self.losses)} loss(es) of records that can no longer be landed: " + "; ".join(self.losses)
