"""The lease distribution report: how leases, checkpoints and throughput spread over owners.

This is the report KCL users script by hand against their lease table; it is pure over a scan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.lease_store import LeaseScan
from lease_core.sync import consumed_stream

UNASSIGNED = "(unassigned)"


@dataclass(frozen=True)
class LeaseRow:
    lease_key: str
    owner: str | None
    checkpoint_owner: str | None
    lease_counter: int
    checkpoint: str
    pending_checkpoint: str | None
    throughput_kbps: float | None
    parent_shard_ids: tuple[str, ...]
    child_shard_ids: tuple[str, ...]
    unreported_losses: tuple[str, ...]  # "records after A aged out (first still available: B)"

    @classmethod
    def of(cls, lease: Lease) -> LeaseRow:
        return cls(
            lease_key=lease.lease_key,
            owner=lease.lease_owner,
            checkpoint_owner=lease.checkpoint_owner,
            lease_counter=lease.lease_counter,
            checkpoint=str(lease.checkpoint),
            pending_checkpoint=None if lease.pending_checkpoint is None else str(lease.pending_checkpoint),
            throughput_kbps=lease.throughput_kbps,
            parent_shard_ids=tuple(sorted(lease.parent_shard_ids)),
            child_shard_ids=tuple(sorted(lease.child_shard_ids)),
            unreported_losses=tuple(
                f"records after {loss.after} aged out unread (first still available: {loss.first_available or 'none'})"
                for loss in sorted(lease.unreported_losses, key=lambda loss: (len(loss.after), loss.after))
            ),
        )


@dataclass(frozen=True)
class OwnerRow:
    owner: str
    leases: int
    throughput_kbps: float
    lease_share: float
    throughput_share: float


@dataclass(frozen=True)
class StatusReport:
    table_name: str
    lease_count: int
    owners: tuple[OwnerRow, ...]
    leases: tuple[LeaseRow, ...]
    in_handoff: int
    at_shard_end: int
    pending_checkpoints: int
    corrupt_items: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def status_report(table_name: str, scan: LeaseScan) -> StatusReport:
    leases = sorted(scan.leases, key=lambda lease: lease.lease_key)
    counts: dict[str, int] = defaultdict(int)
    throughput: dict[str, float] = defaultdict(float)
    for lease in leases:
        owner = lease.lease_owner or UNASSIGNED
        counts[owner] += 1
        throughput[owner] += lease.throughput_kbps or 0.0
    total_throughput = sum(throughput.values())
    owners = tuple(
        OwnerRow(
            owner=owner,
            leases=counts[owner],
            throughput_kbps=round(throughput[owner], 6),
            lease_share=counts[owner] / len(leases),
            throughput_share=throughput[owner] / total_throughput if total_throughput else 0.0,
        )
        for owner in sorted(counts, key=lambda name: (name == UNASSIGNED, name))
    )
    return StatusReport(
        table_name=table_name,
        lease_count=len(leases),
        owners=owners,
        leases=tuple(LeaseRow.of(lease) for lease in leases),
        in_handoff=sum(lease.is_in_handoff for lease in leases),
        at_shard_end=sum(lease.is_at_shard_end for lease in leases),
        pending_checkpoints=sum(lease.pending_checkpoint is not None for lease in leases),
        corrupt_items=tuple(str(error) for error in scan.corrupt),
    )


def render_status(report: StatusReport) -> str:
    lines = [
        f"Lease table {report.table_name!r}: {report.lease_count} lease(s), "
        f"{sum(1 for row in report.owners if row.owner != UNASSIGNED)} owner(s), "
        f"{report.in_handoff} in handoff, {report.at_shard_end} at SHARD_END, "
        f"{report.pending_checkpoints} with a prepared checkpoint",
        "",
    ]
    lines += _table(
        ("OWNER", "LEASES", "SHARE", "KB/S", "KB/S SHARE"),
        [
            (
                row.owner,
                str(row.leases),
                f"{row.lease_share:.1%}",
                f"{row.throughput_kbps:.3f}",
                f"{row.throughput_share:.1%}",
            )
            for row in report.owners
        ],
    )
    if report.leases:
        lines.append("")
        lines += _table(
            ("LEASE", "OWNER", "COUNTER", "CHECKPOINT", "PENDING", "KB/S", "PARENTS"),
            [
                (
                    row.lease_key,
                    row.owner or "-" if row.checkpoint_owner is None else f"{row.checkpoint_owner}->{row.owner}",
                    str(row.lease_counter),
                    row.checkpoint,
                    row.pending_checkpoint or "-",
                    "-" if row.throughput_kbps is None else f"{row.throughput_kbps:.3f}",
                    ",".join(row.parent_shard_ids) or "-",
                )
                for row in report.leases
            ],
        )
    for row in report.leases:
        lines += [
            f"UNREPORTED LOSS: lease {row.lease_key}: {loss} (the next round reports it)"
            for loss in row.unreported_losses
        ]
    for problem in report.corrupt_items:
        lines.append(f"WARNING: {problem}")
    return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in (header, *rows)]


def consumed_stream_names(leases: Iterable[Lease], state: CoordinatorStateStore) -> list[str]:
    """The streams the application consumes, as far as its tables say: the stream a single-stream
    application remembers (`ConsumedStream`, one GetItem) and the streams of multi-stream leases."""
    remembered = consumed_stream.from_item(state.get(consumed_stream.RECORD_KEY))
    names = {StreamIdentifier.parse(lease.stream_name).stream_name for lease in leases if lease.stream_name}
    return sorted(names | ({remembered.stream_name} if remembered is not None else set()))
