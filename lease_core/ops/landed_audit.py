"""What a sink says it holds, against what the lease table says is committed (`leasectl verify`), and
the checkpoints a lost lease table gets back from the sink (`leasectl restore`). Pure: the sink's
record of its batches and the leases come in, findings and a plan go out.

A sink that records what landed (an Iceberg table: every commit names the batches it adds, each as
the checkpoint it starts after and its last record) gives, per lease, a chain of batches. The chain
must be unbroken (each batch starts where the one before ended) and must end where the lease's
checkpoint is, or where the batches the lease's record still waits to publish begin.
"""

from __future__ import annotations

import enum
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from lease_core.config.settings import ConsumerConfig
from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber


@dataclass(frozen=True)
class LandedBatch:
    """One batch in the sink: the records of `lease_key` after `start` through `end`, added by a commit;
    or, `lost`, records the sink lacks for good, which the publication of the round `round_number`
    named lost (a rollback, staged files deleted): the sink keeps the loss on record after the history
    that shows the gap is gone (expired, cleaned up)."""

    lease_key: str
    start: ExtendedSequenceNumber
    end: ExtendedSequenceNumber
    round_number: int
    commit: int  # the sink's own id of the commit (an Iceberg snapshot id)
    lost: bool = False


class LandedRecords(Protocol):
    """A sink's record of what landed, as `leasectl verify` and `restore` read it."""

    def landed_batches(self) -> list[LandedBatch]:
        """Every batch the sink holds, each lease's in the order they landed."""

    def awaiting_from(self, lease: Lease) -> ExtendedSequenceNumber | None:
        """Where the batches the lease's record waits to publish begin (the first one's start), or None."""

    def maintain(self, leases: Sequence[Lease], orphan_age: timedelta, target_file_bytes: int) -> list[str]:
        """The sink's upkeep (small files compacted towards `target_file_bytes`, expired snapshots,
        orphan files no lease names and older than `orphan_age`); a line per thing done."""


# A stream's incarnation as it is now, (ARN, creation time in epoch seconds); None: no such stream.
StreamLookup = Callable[[str], tuple[str, int] | None]
# Opens a sink's record of what landed (the output URI, the settings), judged against the streams as
# they are now (a stream deleted and created again under its name starts its positions over).
OpenLanded = Callable[[str, ConsumerConfig, StreamLookup], LandedRecords]


class Finding(str, enum.Enum):
    GAP = "gap"  # a lease's batches skip records: the sink lacks committed records
    OVERLAP = "overlap"  # a lease's batches overlap: the sink holds records twice
    CHECKPOINT_AHEAD = "checkpoint ahead of the sink"  # committed, not in the sink, not waiting either
    SINK_AHEAD = "sink ahead of the checkpoint"  # the next round would land records the sink holds
    AWAITING = "awaiting publication"  # committed, and the next round's commit publishes it: not a fault

    @property
    def is_fault(self) -> bool:
        return self is not Finding.AWAITING


@dataclass(frozen=True)
class AuditFinding:
    lease_key: str
    finding: Finding
    detail: str

    def render(self) -> str:
        return f"{self.lease_key}: {self.finding.value}: {self.detail}"


def audit_landed(
    leases: Iterable[Lease],
    landed: Sequence[LandedBatch],
    awaiting_from: Mapping[str, ExtendedSequenceNumber],
) -> list[AuditFinding]:
    """Findings per lease, in lease-key order. `awaiting_from`: per lease whose record names batches
    the sink does not hold yet, the position the first of them starts after."""
    chains = _chains(landed)
    lost = [batch for batch in landed if batch.lost]
    named = {(batch.lease_key, batch.start, batch.end) for batch in lost}
    findings = [finding for key in sorted(chains) for finding in _chain_findings(key, chains[key], named)]
    findings.extend(
        AuditFinding(
            batch.lease_key,
            Finding.GAP,
            f"round {batch.round_number} named the records after {batch.start} through {batch.end} lost: the sink "
            "does not hold them",
        )
        for batch in sorted(lost, key=lambda batch: (batch.lease_key, batch.end))
    )
    for lease in sorted(leases, key=lambda lease: lease.lease_key):
        held = chains[lease.lease_key][-1].end if chains.get(lease.lease_key) else None
        findings.extend(_checkpoint_findings(lease, held, awaiting_from.get(lease.lease_key)))
    return findings


def _chains(landed: Sequence[LandedBatch]) -> dict[str, list[LandedBatch]]:
    """Each lease's batches in the sink, in the order they landed (the ranges named lost left out)."""
    chains: dict[str, list[LandedBatch]] = defaultdict(list)
    for batch in landed:
        if not batch.lost:
            chains[batch.lease_key].append(batch)
    return chains


def _chain_findings(
    lease_key: str,
    chain: Sequence[LandedBatch],
    named: set[tuple[str, ExtendedSequenceNumber, ExtendedSequenceNumber]],
) -> list[AuditFinding]:
    """The chain's gaps and overlaps; a gap the sink records as named lost (`named`) is reported with it."""
    findings = []
    for before, after in itertools.pairwise(chain):
        if after.start == before.end or (lease_key, before.end, after.start) in named:
            continue
        kind = Finding.OVERLAP if after.start < before.end else Finding.GAP
        findings.append(
            AuditFinding(
                lease_key,
                kind,
                f"round {before.round_number} landed through {before.end}, round {after.round_number} landed "
                f"from after {after.start}",
            )
        )
    return findings


def _checkpoint_findings(
    lease: Lease, held: ExtendedSequenceNumber | None, awaiting_from: ExtendedSequenceNumber | None
) -> list[AuditFinding]:
    """The lease's checkpoint against the end of its chain (`held`) and its waiting batches."""
    key, checkpoint = lease.lease_key, lease.checkpoint
    in_sink = "nothing" if held is None else f"through {held}"
    if checkpoint.is_sentinel and not checkpoint.is_shard_end:  # nothing committed yet
        if held is None:
            return []
        return [
            AuditFinding(key, Finding.SINK_AHEAD, f"the sink holds records {in_sink}, the lease is at {checkpoint}")
        ]
    if awaiting_from is not None:
        if held is not None and awaiting_from > held:
            detail = f"the sink holds {in_sink}, the batches waiting for publication start after {awaiting_from}"
            return [AuditFinding(key, Finding.GAP, detail)]
        return [AuditFinding(key, Finding.AWAITING, f"committed through {checkpoint}, in the sink {in_sink}")]
    if checkpoint.is_shard_end or checkpoint == held:
        return []
    if held is not None and held > checkpoint:
        detail = f"the sink holds records {in_sink}, the checkpoint is {checkpoint}: they would land again"
        return [AuditFinding(key, Finding.SINK_AHEAD, detail)]
    detail = f"committed through {checkpoint}, but the sink holds {in_sink} and no batch waits for publication"
    return [AuditFinding(key, Finding.CHECKPOINT_AHEAD, detail)]


@dataclass(frozen=True)
class Restore:
    """A lease whose checkpoint the sink is ahead of: it is moved to `target`, the sink's last position."""

    lease: Lease
    target: ExtendedSequenceNumber


def plan_restore(leases: Iterable[Lease], landed: Sequence[LandedBatch]) -> tuple[list[Restore], list[str]]:
    """The leases to move forward to what the sink holds (a lease table lost and made again starts
    every lease at its initial position), and the leases the sink knows that the table lacks (the
    shard sync creates them; restore again after it)."""
    chains = _chains(landed)
    by_key = {lease.lease_key: lease for lease in leases}
    restores = []
    for key, chain in sorted(chains.items()):
        lease = by_key.get(key)
        if lease is None:
            continue
        held = chain[-1].end
        checkpoint = lease.checkpoint
        behind = (checkpoint.is_sentinel and not checkpoint.is_shard_end) or (
            not checkpoint.is_sentinel and checkpoint < held
        )
        if behind:
            restores.append(Restore(lease, held))
    missing = sorted(key for key in chains if key not in by_key)
    return restores, missing
