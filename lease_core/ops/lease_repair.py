"""Repairing a lease item that cannot be read as a lease (`leasectl repair`).

A round skips such an item: its shard is not read, and the round fails after landing the rest,
naming the item and its attribute (`CorruptLeasesSkippedError`). A repair makes it a lease again:

- Which item: `--lease`, the lease key as the alert and `leasectl status` print it (in a
  multi-stream table, `<account>:<stream>:<epoch>:<shardId>`). Only an unreadable item: a readable
  lease is refused (`leasectl reset` moves its checkpoint); no item is "not found".
- Where it resumes: the item's own checkpoint when it reads, or `--to`, as for `leasectl reset`
  (TRIM_HORIZON, LATEST, or the sequence number of the last record to count as landed), which is
  required when the checkpoint is what does not read. An item at SHARD_END stays there (`--to` is
  refused): its children depend on it being finished.
- What is written (`LeaseStore.repair_lease`): the item's attributes that read are kept (parents,
  children, hash range, throughput, ...), each one that does not is dropped and named in the
  report, the checkpoint as above with no prepared batch, no owner (the next assignment places the
  lease) and the counter 2 above a readable one (else 1). Attributes the codec does not know are
  left as they are. The identity (key, stream, shard) and the parents are never dropped: a repair
  that would need to is refused, and they are corrected by hand from the stream's listing. The
  write is conditional on the whole item as it was read: a change meanwhile leaves it as it is
  and the repair fails, writing nothing.
- Exclusion: the application's leader lock is held for the repair, as for a reset, so no round runs
  meanwhile; released at the end whatever happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from lease_core.errors import CorruptLeaseError, LeaseCoreError
from lease_core.leader.leader_lock import LeaderLock
from lease_core.leader.leadership import hold
from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.store.codec import RepairRefused
from lease_core.store.lease_store import LeaseStore


class LeaseRepairError(LeaseCoreError):
    """The repair of a lease item was refused or lost its condition; nothing was written."""

    def __init__(self, lease_key: str, problem: str) -> None:
        super().__init__(lease_key, problem)
        self.lease_key = lease_key
        self.problem = problem

    def __str__(self) -> str:
        return f"lease item {self.lease_key!r} was not repaired: {self.problem}"


@dataclass(frozen=True)
class RepairReport:
    table_name: str
    problem: CorruptLeaseError  # why the item could not be read
    lease: Lease  # as written
    dropped: tuple[str, ...]  # attributes that did not read, gone

    def to_dict(self) -> dict[str, object]:
        return {
            "table": self.table_name,
            "lease_key": self.lease.lease_key,
            "problem": self.problem.problem,
            "checkpoint": str(self.lease.checkpoint),
            "lease_counter": self.lease.lease_counter,
            "dropped_attributes": list(self.dropped),
        }

    def render(self) -> str:
        lines = [
            f"repaired lease item {self.lease.lease_key} of table {self.table_name} ({self.problem.problem}):",
            f"  checkpoint {self.lease.checkpoint}, no owner (the next assignment places it), lease counter "
            f"{self.lease.lease_counter}",
        ]
        if self.dropped:
            lines.append(f"  dropped attributes that did not read: {', '.join(self.dropped)}")
        return "\n".join(lines)


class LeaseRepair:
    """Applies a repair under the application's leader lock."""

    def __init__(self, store: LeaseStore, lock: LeaderLock) -> None:
        self.store = store
        self.lock = lock

    def run(self, lease_key: str, target: ExtendedSequenceNumber | None) -> RepairReport:
        """Repair `lease_key` at `target`, or at its own checkpoint when None."""
        with hold(self.lock, "leasectl repair", acquire=True, release=True) as leadership:
            store = leadership.lease_store(self.store)
            try:
                result = store.repair_lease(lease_key, target)
            except RepairRefused as refusal:
                raise LeaseRepairError(lease_key, str(refusal)) from None
        if result is None:
            raise LeaseRepairError(lease_key, f"table {self.store.table_name!r} has no lease item with this key")
        if result.problem is None:
            raise LeaseRepairError(lease_key, "it reads as a lease; move its checkpoint with `leasectl reset` instead")
        if result.write is None or not result.write.applied or result.write.lease is None:
            raise LeaseRepairError(lease_key, "the item changed after it was read; nothing was written, try again")
        return RepairReport(self.store.table_name, result.problem, result.write.lease, result.dropped)
