"""Resetting one lease's checkpoint by hand (`leasectl reset`): replay a shard from an earlier point, or skip ahead.

Operators move a checkpoint with this instead of editing lease items, so that the move is a lease
write like any other: conditional, fencing, and reported. The rules:

- Which lease. A single-stream table keys leases by shard id: `--shard` is the lease key and
  `--stream` is refused (the item names no stream to check it against). A multi-stream table keys
  them `<account>:<stream>:<epoch>:<shardId>`: `--stream` is required and the lease is the one whose
  `shardId` is the shard and whose `streamName` has that stream name (or equals it, when given in
  full as `<account>:<stream>:<epoch>`, which tells apart streams of one name in two accounts or
  epochs). Wrong mode or an ambiguous stream is a usage error; no such lease is "not found".
- Targets. `TRIM_HORIZON` (replay every record still in the stream), `LATEST` (skip to the newest
  record at the time the next round claims the lease, not at the time of the reset), or a sequence
  number, `<digits>[:<sub-sequence number>]` (`/` is accepted for `:`, as `leasectl status` prints
  it). A checkpoint is the last position already landed, so the next batch starts right *after* the
  target: to land record R again, give the sequence number of the record before R. The number must
  be written as Kinesis writes it (`0|[1-9][0-9]{0,128}`) and be a record of this shard. It is not
  checked against Kinesis here: if Kinesis refuses it for the shard, the lease's next read fails
  saying so, and a record older than the stream's retention is reported by that read as aged out.
  A sub-sequence number k > 0 resumes inside a KPL aggregate after its sub-record k.
  `AT_TIMESTAMP` is not offered: a lease stores only the sentinel, and the consume job reads such a
  lease from the application's configured `initial_position_timestamp` (one time for every such
  lease, whatever the job is configured with when it reads), so a time given here could not be
  kept; to replay from a time, reset to the sequence number of the last record before it, or run a
  backfill. `SHARD_END` is never a target: only the consume job writes it, after creating the
  child leases.
- Refused. A lease at SHARD_END: the shard is finished and its children depend on that (they read
  only once their parents have ended); replaying a finished shard is what a backfill is for.
- Exclusion. The application's leader lock is held for the whole reset (a round holds it for its
  whole run), so no round runs meanwhile; held by anyone else, the reset fails naming the holder
  (and when a dead holder's lock can be taken over). The write is made only while the lock is ours
  (`lease_core.leader.leadership`). The lock is released at the end, whatever happened.
- The write. `lease_writes.reset_checkpoint`: the lease as read, with the target as checkpoint, no
  pending checkpoint and owner switches zeroed, as KCL's checkpointer writes a checkpoint; conditional
  on the counter read; sets `checkpoint`/`checkpointSubSequenceNumber`; removes `pendingCheckpoint`,
  `pendingCheckpointSubSequenceNumber`, `pendingCheckpointState`; raises the counter by 2, so a
  worker still holding the lease (a zombie of an earlier round) is fenced: its next renewal or
  checkpoint fails (by 1, it would take the change for its own renewal whose response was lost).
  Owner, checkpoint owner, parents, children, hash range and throughput are kept (assignment is
  sticky). A lost condition re-reads, decides again and writes again, up to `ATTEMPTS` times; then
  the reset fails naming the lease, having written nothing. A write whose response was lost and
  whose retry then lost the condition against it is recognised as applied.
- Reported. The checkpoint before and after, the counter, the direction with what it costs
  (backward: records already landed land again, duplicates by request; forward: records in between
  are never landed, loss by request), and a discarded prepared batch: its range and the sink's name
  for it. It is never made visible: the consume job makes a batch visible only after its commit,
  which the reset fences (whatever the batch staged stays invisible to readers).
"""

from __future__ import annotations

import enum
import logging
import re
from dataclasses import dataclass
from typing import Any

from lease_core.errors import CorruptLeaseError, LeaseCoreError
from lease_core.leader.leader_lock import LeaderLock
from lease_core.leader.leadership import hold
from lease_core.model.lease import Lease
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, TRIM_HORIZON, ExtendedSequenceNumber, Sentinel
from lease_core.store import lease_writes
from lease_core.store.lease_store import LeaseScan, LeaseStore, WriteResult
from lease_core.store.lease_writes import LeaseUpdate

log = logging.getLogger(__name__)

# Read-decide-write attempts before a reset gives up on a lease whose counter keeps changing.
ATTEMPTS = 3
# Kinesis' own pattern for a sequence number (GetShardIterator's StartingSequenceNumber).
_SEQUENCE_NUMBER = re.compile(r"0|[1-9][0-9]{0,128}")
_SUB_SEQUENCE_NUMBER = re.compile(r"[0-9]{1,19}")
TARGET_FORMS = "TRIM_HORIZON, LATEST, or <sequence number>[:<sub-sequence number>]"


class ResetUsageError(LeaseCoreError, ValueError):
    """The reset's arguments are wrong: a target that is not one, or a lease named the wrong way."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem

    def __str__(self) -> str:
        return self.problem


class LeaseNotFoundError(LeaseCoreError):
    """The lease table holds no lease for the shard (and stream) asked for."""

    def __init__(self, table_name: str, wanted: str, detail: str = "") -> None:
        super().__init__(table_name, wanted, detail)
        self.table_name = table_name
        self.wanted = wanted
        self.detail = detail

    def __str__(self) -> str:
        return f"lease table {self.table_name!r} has no lease for {self.wanted}{self.detail}"


class CheckpointResetError(LeaseCoreError):
    """The reset of a lease was refused or could not be written; nothing was written."""

    def __init__(self, lease_key: str, problem: str, retryable: bool = False) -> None:
        super().__init__(lease_key, problem, retryable)
        self.lease_key = lease_key
        self.problem = problem
        self.retryable = retryable

    def __str__(self) -> str:
        return f"lease {self.lease_key!r} was not reset: {self.problem}"


# --- what to reset, and to where --------------------------------------------------------------


@dataclass(frozen=True)
class LeaseSelector:
    """The lease to reset: a shard id, plus the stream in a multi-stream table."""

    shard_id: str
    stream: str | None = None

    def __post_init__(self) -> None:
        if not self.shard_id:
            raise ResetUsageError("--shard must name a shard id")
        if self.stream is not None and (not self.stream or len(self.stream.split(":")) not in (1, 3)):
            raise ResetUsageError(f"--stream must be a stream name or <account>:<stream>:<epoch>, not {self.stream!r}")

    def __str__(self) -> str:
        return f"shard {self.shard_id!r}" + ("" if self.stream is None else f" of stream {self.stream!r}")

    def matches(self, lease: Lease) -> bool:
        """A multi-stream lease of this shard whose stream is `stream` (by name, or in full)."""
        if self.stream is None or lease.stream_name is None or lease.shard_id != self.shard_id:
            return False
        if ":" in self.stream:
            return lease.stream_name == self.stream
        parts = lease.stream_name.split(":")
        return len(parts) == 3 and parts[1] == self.stream


def parse_target(text: str) -> ExtendedSequenceNumber:
    """The checkpoint a reset writes, from `--to`; `ResetUsageError` says what is wrong and what is allowed."""
    text = text.strip()
    if text in (Sentinel.TRIM_HORIZON.value, Sentinel.LATEST.value):
        return ExtendedSequenceNumber(text)
    if text == Sentinel.AT_TIMESTAMP.value:
        raise ResetUsageError(
            "AT_TIMESTAMP is not a reset target: a lease stores only the sentinel, and the consume job reads "
            "it from the application's configured initial_position_timestamp (one time for every such lease), "
            "so a time chosen here could not be kept. Reset to the sequence number of the last record before "
            "that time instead, or replay the time window with a backfill."
        )
    if text == Sentinel.SHARD_END.value:
        raise ResetUsageError(
            "SHARD_END is not a reset target: only the consume job marks a shard finished, after it has read "
            "it to its end and created the child leases."
        )
    sequence, separator, sub = text.replace("/", ":").partition(":")
    if not _SEQUENCE_NUMBER.fullmatch(sequence):
        raise ResetUsageError(
            f"--to {text!r}: {sequence!r} is not a sequence number (decimal digits without leading zeros, "
            f"as Kinesis writes it); the target is {TARGET_FORMS}"
        )
    if separator and not _SUB_SEQUENCE_NUMBER.fullmatch(sub):
        raise ResetUsageError(f"--to {text!r}: the sub-sequence number after ':' must be decimal digits, not {sub!r}")
    return ExtendedSequenceNumber(sequence, int(sub) if separator else 0)


def render_position(position: ExtendedSequenceNumber) -> str:
    """A position in `--to` syntax, so a report can be copied back into a reset."""
    if position.sub_sequence_number:
        return f"{position.sequence_number}:{position.sub_sequence_number}"
    return position.sequence_number


def select_lease(scan: LeaseScan, selector: LeaseSelector, table_name: str) -> Lease:
    """The one lease of the scan that `selector` names, or the error that says why there is none."""
    leases = scan.leases
    multi_stream = any(lease.is_multi_stream for lease in leases)
    if selector.stream is None:
        found = [lease for lease in leases if not lease.is_multi_stream and lease.lease_key == selector.shard_id]
        if found:
            return found[0]
        unreadable = [error for error in scan.corrupt if error.lease_key == selector.shard_id]
        if unreadable:
            raise unreadable[0]
        if multi_stream:
            raise ResetUsageError(
                f"lease table {table_name!r} is multi-stream (keys <account>:<stream>:<epoch>:<shardId>): "
                "--stream is required"
            )
        raise LeaseNotFoundError(table_name, str(selector), _unreadable_note(scan))
    found = [lease for lease in leases if selector.matches(lease)]
    if len(found) == 1:
        return found[0]
    if found:
        keys = ", ".join(sorted(lease.lease_key for lease in found))
        raise ResetUsageError(
            f"{selector} matches {len(found)} leases of table {table_name!r} ({keys}); "
            "give --stream in full as <account>:<stream>:<epoch>"
        )
    if leases and not multi_stream:
        raise ResetUsageError(
            f"lease table {table_name!r} is single-stream (leases are keyed by shard id): leave out --stream"
        )
    raise LeaseNotFoundError(table_name, str(selector), _unreadable_note(scan))


def _unreadable_note(scan: LeaseScan) -> str:
    if not scan.corrupt:
        return ""
    return f" ({len(scan.corrupt)} item(s) of the table could not be read as leases; see `leasectl status`)"


# --- the decision -------------------------------------------------------------------------------


class Direction(str, enum.Enum):
    BACKWARD = "backward"  # records after the target already landed will land again
    FORWARD = "forward"  # records between the checkpoint and the target will never land
    UNCHANGED = "unchanged"  # same checkpoint: the reset only discards a prepared batch and fences
    UNKNOWN = "unknown"  # AT_TIMESTAMP against a sequence number: where the configured time falls is not known


def compare_positions(a: ExtendedSequenceNumber, b: ExtendedSequenceNumber) -> int | None:
    """-1, 0, 1 as `a` reads from before, at, after `b`; None when that cannot be known here.

    Unlike the checkpoint order of `sequence`, LATEST is the tip: after every sequence number. An
    AT_TIMESTAMP start lies between the trim horizon and the tip, but where among sequence numbers
    depends on the configured time.
    """
    if a == b:
        return 0
    if AT_TIMESTAMP in (a, b) and not (a.is_sentinel and b.is_sentinel):
        return None
    return -1 if _reading_order(a) < _reading_order(b) else 1


def _reading_order(position: ExtendedSequenceNumber) -> tuple[int, int, int]:
    ranks = {Sentinel.TRIM_HORIZON: 0, Sentinel.AT_TIMESTAMP: 1, Sentinel.LATEST: 3, Sentinel.SHARD_END: 4}
    sentinel = position.sentinel
    if sentinel is not None:
        return (ranks[sentinel], 0, 0)
    return (2, int(position.sequence_number), position.sub_sequence_number)


def describe_position(position: ExtendedSequenceNumber) -> str:
    if position == TRIM_HORIZON:
        return "TRIM_HORIZON (the oldest record still in the stream)"
    if position == LATEST:
        return "LATEST (the newest record when the next round claims the lease)"
    if position == AT_TIMESTAMP:
        return "AT_TIMESTAMP (the configured initial_position_timestamp)"
    return render_position(position)


@dataclass(frozen=True)
class DiscardedBatch:
    """The prepared checkpoint a reset removes, with what is known of the batch's output."""

    pending_checkpoint: ExtendedSequenceNumber
    batch: PendingBatch | None  # described by our consume job (range, records, name)
    unreadable: str | None = None  # our description, but unreadable

    @classmethod
    def of(cls, lease: Lease) -> DiscardedBatch | None:
        if lease.pending_checkpoint is None:
            return None
        try:
            return cls(lease.pending_checkpoint, PendingBatch.decode(lease))
        except CorruptLeaseError as error:
            return cls(lease.pending_checkpoint, None, error.problem)

    def notes(self, checkpoint: ExtendedSequenceNumber, target: ExtendedSequenceNumber) -> tuple[str, ...]:
        """What discarding the batch means after a reset of `checkpoint` to `target`."""
        pending = describe_position(self.pending_checkpoint)
        if self.batch is None:
            why = (
                f"its description is unreadable ({self.unreadable})"
                if self.unreadable
                else ("it carries no batch description of ours (another application's state, or none)")
            )
            return (
                f"the prepared batch up to {pending} is discarded; {why}, so its name in the sink, if any, "
                "is not known",
            )
        if self.batch.name is None:
            return ("the batch staged nothing (it had no rows to write)",)
        # The consume job makes a batch visible only after committing it, which this reset fences.
        notes = [f"the batch {self.batch.name} is never made visible: at most it was staged, invisible to readers"]
        after_target = compare_positions(target, self.pending_checkpoint)
        if after_target is None or after_target < 0:
            notes.append(f"its records after {render_position(target)} will be read and landed again, once")
        if (compare_positions(target, checkpoint) or 0) > 0:
            kept = (
                "all of its records"
                if after_target is not None and after_target >= 0
                else (f"its records up to {render_position(target)}")
            )
            notes.append(f"{kept} will not be read again and are not in the sink: they are lost, by request")
        return tuple(notes)


@dataclass(frozen=True)
class ResetPlan:
    """What a reset of `before` to `target` writes and what it means; pure."""

    before: Lease
    target: ExtendedSequenceNumber
    direction: Direction
    discarded: DiscardedBatch | None

    @property
    def write(self) -> LeaseUpdate:
        return lease_writes.reset_checkpoint(self.before, self.target)

    def warnings(self) -> tuple[str, ...]:
        current, target = describe_position(self.before.checkpoint), describe_position(self.target)
        if self.direction is Direction.BACKWARD:
            return (
                f"moving backwards from {current} to {target}: records after the new checkpoint that were "
                "already landed will be landed again (duplicates in the sink, as requested)",
            )
        if self.direction is Direction.FORWARD:
            return (
                f"moving forward from {current} to {target}: records after the old checkpoint up to the new "
                "one will never be landed (loss, as requested)",
            )
        if self.direction is Direction.UNKNOWN:
            return (
                f"whether {target} is before or after {current} is not known here: records may be landed "
                "twice (if it is before) or never (if it is after)",
            )
        return ()

    def batch_notes(self) -> tuple[str, ...]:
        return () if self.discarded is None else self.discarded.notes(self.before.checkpoint, self.target)


def plan_reset(lease: Lease, target: ExtendedSequenceNumber) -> ResetPlan:
    """The reset of `lease` to `target`; refuses a finished lease and targets no reset may write."""
    if lease.is_at_shard_end:
        raise CheckpointResetError(
            lease.lease_key,
            "its checkpoint is SHARD_END: the shard is finished and its child shards' leases depend on it "
            "staying finished (they are read only once their parents have ended). To land its records "
            "again, run a backfill of the time window instead.",
        )
    if target.is_shard_end or target == AT_TIMESTAMP:
        raise ResetUsageError(f"{target} is not a reset target; the target is {TARGET_FORMS}")
    comparison = compare_positions(target, lease.checkpoint)
    direction = (
        Direction.UNKNOWN
        if comparison is None
        else Direction.UNCHANGED
        if comparison == 0
        else Direction.BACKWARD
        if comparison < 0
        else Direction.FORWARD
    )
    return ResetPlan(lease, target, direction, DiscardedBatch.of(lease))


# --- the coordinator ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ResetReport:
    table_name: str
    plan: ResetPlan
    after: Lease
    attempts: int

    def to_dict(self) -> dict[str, Any]:
        before, discarded = self.plan.before, self.plan.discarded
        batch = None
        if discarded is not None:
            described = discarded.batch
            batch = {
                "start": None if described is None else _position(described.start),
                "end": _position(discarded.pending_checkpoint),
                "records": None if described is None else described.records,
                "path": None if described is None else described.name,
                "notes": list(self.plan.batch_notes()),
            }
        return {
            "table": self.table_name,
            "lease_key": before.lease_key,
            "stream_name": before.stream_name,
            "shard_id": before.shard_id or before.lease_key,
            "lease_owner": self.after.lease_owner,
            "checkpoint_owner": self.after.checkpoint_owner,
            "before": _lease_state(before),
            "after": _lease_state(self.after),
            "direction": self.plan.direction.value,
            "attempts": self.attempts,
            "discarded_batch": batch,
            "warnings": list(self.plan.warnings()),
        }


def _position(position: ExtendedSequenceNumber) -> dict[str, Any]:
    return {"sequence_number": position.sequence_number, "sub_sequence_number": position.sub_sequence_number}


def _lease_state(lease: Lease) -> dict[str, Any]:
    pending = lease.pending_checkpoint
    return {
        "checkpoint": _position(lease.checkpoint),
        "pending_checkpoint": None if pending is None else _position(pending),
        "lease_counter": lease.lease_counter,
    }


class CheckpointReset:
    """Applies a reset under the application's leader lock: find, read, decide, write, retry."""

    def __init__(self, store: LeaseStore, lock: LeaderLock, attempts: int = ATTEMPTS) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self.store = store
        self.lock = lock
        self.attempts = attempts

    def run(self, selector: LeaseSelector, target: ExtendedSequenceNumber) -> ResetReport:
        with hold(self.lock, "leasectl reset", acquire=True, release=True) as leadership:
            return self._reset(leadership.lease_store(self.store), selector, target)

    def _reset(self, store: LeaseStore, selector: LeaseSelector, target: ExtendedSequenceNumber) -> ResetReport:
        table = store.table_name
        key = select_lease(store.scan_leases(), selector, table).lease_key
        for attempt in range(1, self.attempts + 1):
            lease = store.get_lease(key, consistent=True)
            if lease is None:
                raise LeaseNotFoundError(table, str(selector), " (it was deleted during the reset)")
            plan = plan_reset(lease, target)
            result = store.reset_checkpoint(plan.before, plan.target)
            if result.lease is None:
                raise LeaseNotFoundError(table, str(selector), " (it was deleted during the reset)")
            if result.applied or _is_our_write(plan, result):
                return ResetReport(table, plan, result.lease, attempt)
            log.info(
                "lease %s changed under the reset (counter %d, now %d); reading it again",
                key,
                lease.lease_counter,
                result.lease.lease_counter,
            )
        raise CheckpointResetError(
            key,
            f"its counter changed before each of {self.attempts} attempts to write it (a worker is still "
            "writing it); retry once it has stopped",
            retryable=True,
        )


def _is_our_write(plan: ResetPlan, result: WriteResult) -> bool:
    """A write whose response was lost and whose retry then lost the condition against it."""
    stored, before = result.lease, plan.before
    return (
        result.retried
        and stored is not None
        and stored.lease_counter == before.lease_counter + 2
        and stored.lease_owner == before.lease_owner
        and stored.checkpoint == plan.target
        and stored.pending_checkpoint is None
    )
