"""What one consume round did: per lease, per slot, totals and losses; JSON for machines, text for people.

The slot tasks build `LeaseReport`s and a `SlotReport` on the executors and return them to the
driver (they pickle: plain frozen dataclasses of strings and numbers). The driver folds them into a
`RoundReport`, writes it as JSON where the caller asks, and prints the summary.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lease_core import aws
from lease_core.application import LeaseApplication
from lease_core.errors import ConfigurationError
from lease_core.model.lease import AgedOutRange


class Outcome:
    """How a lease's work in this round ended."""

    CAUGHT_UP = "caught_up"  # read up to the stream tip
    LIMIT = "limit"  # a per-lease record, byte or time limit stopped it; the rest is next round's
    SHARD_END = "shard_end"  # the closed shard was read to its end, SHARD_END committed
    WINDOW_END = "window_end"  # a backfill reached the end of its time window
    THROTTLED = "throttled"  # Kinesis kept throttling; what was read is committed
    FINISHED = "finished"  # already at SHARD_END before the round; nothing to do
    WAITING_FOR_PARENTS = "waiting_for_parents"  # a parent shard is not at SHARD_END yet
    MERGE_DEFERRED = "merge_deferred"  # at SHARD_END, but the merged child waits for its other parent's lease
    IN_HANDOFF = "in_handoff"  # the leader is handing the lease over; not touched
    LOST = "lost"  # a renew or checkpoint condition failed, or the lease expired; nothing more committed
    FAILED = "failed"  # an error stopped it; committed batches stay committed, the rest is retried

    PROBLEMS = frozenset({LOST, FAILED})


@dataclass(frozen=True)
class RetentionLoss:
    """Records after `after` and before `first_available` aged out before they were read."""

    lease_key: str
    after: str
    first_available: str | None
    first_available_arrival: str | None

    @classmethod
    def of(cls, lease_key: str, aged_out: AgedOutRange) -> RetentionLoss:
        return cls(lease_key, aged_out.after, aged_out.first_available, aged_out.first_available_arrival)

    @property
    def aged_out(self) -> AgedOutRange:
        """The range as the lease stores it until a kept report names it."""
        return AgedOutRange(self.after, self.first_available, self.first_available_arrival)


@dataclass(frozen=True)
class LeaseReport:
    lease_key: str
    stream_name: str
    shard_id: str
    worker_id: str
    outcome: str
    start: str
    end: str
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    files: int = 0
    replayed_batches: int = 0
    millis_behind_latest: int | None = None
    throughput_kbps: float | None = None
    covered_seconds: float | None = None  # the data time the throughput was measured over
    children_created: tuple[str, ...] = ()
    retention_losses: tuple[RetentionLoss, ...] = ()
    get_records_calls: int = 0
    throttled_calls: int = 0
    expired_iterators: int = 0
    detail: str | None = None
    retryable: bool | None = None


@dataclass(frozen=True)
class SlotReport:
    worker_id: str
    attempt: int
    seconds: float
    cpu_percent: float  # the slot's utilization for the round (`slot_utilization_percent`); -1: none
    leases: tuple[LeaseReport, ...]

    @property
    def records(self) -> int:
        return sum(lease.records for lease in self.leases)

    @property
    def bytes(self) -> int:
        return sum(lease.bytes for lease in self.leases)


@dataclass(frozen=True)
class RoundReport:
    application_name: str
    round_number: int
    streams: tuple[str, ...]
    output_uri: str
    started_at: str
    seconds: float
    slots: tuple[SlotReport, ...]
    slot_failures: tuple[str, ...] = ()
    leadership_lost: bool = False
    leader_record_version: str | None = None
    totals: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        application_name: str,
        round_number: int,
        streams: Sequence[str],
        output_uri: str,
        started_at: str,
        seconds: float,
        slots: Sequence[SlotReport],
        slot_failures: Sequence[str] = (),
        leadership_lost: bool = False,
        leader_record_version: str | None = None,
        recorded_losses: Sequence[RetentionLoss] = (),
    ) -> RoundReport:
        """`recorded_losses`: the retention losses the lease table still carries at the end of the
        round, earlier rounds' whose report was never kept included; with the slots' own, each once."""
        leases = [lease for slot in slots for lease in slot.leases]
        losses = list(
            dict.fromkeys([loss for lease in leases for loss in lease.retention_losses] + list(recorded_losses))
        )
        totals = {
            "leases": len(leases),
            "records": sum(lease.records for lease in leases),
            "bytes": sum(lease.bytes for lease in leases),
            "files": sum(lease.files for lease in leases),
            "outcomes": dict(sorted(Counter(lease.outcome for lease in leases).items())),
            "lost_leases": sorted(lease.lease_key for lease in leases if lease.outcome == Outcome.LOST),
            "failed_leases": sorted(lease.lease_key for lease in leases if lease.outcome == Outcome.FAILED),
            "retention_losses": [dataclasses.asdict(loss) for loss in losses],
            "max_millis_behind_latest": max(
                (lease.millis_behind_latest for lease in leases if lease.millis_behind_latest is not None),
                default=None,
            ),
            "busiest_over_bound": _rounded(
                busiest_over_bound([slot.bytes for slot in slots], [lease.bytes for lease in leases])
            ),
        }
        return cls(
            application_name,
            round_number,
            tuple(streams),
            output_uri,
            started_at,
            seconds,
            tuple(sorted(slots, key=lambda slot: _slot_order(slot.worker_id))),
            tuple(slot_failures),
            leadership_lost,
            leader_record_version,
            totals,
        )

    @property
    def succeeded(self) -> bool:
        """No slot failed, no lease failed and the leader lock held throughout; lost leases and
        retention losses are reported, not failures."""
        return not self.slot_failures and not self.totals["failed_leases"] and not self.leadership_lost

    def reported_losses(self) -> list[tuple[str, AgedOutRange]]:
        """The retention losses this report names, as (lease key, range)."""
        return reported_losses(self.totals)

    def to_dict(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["succeeded"] = self.succeeded
        return document

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def summary(self) -> str:
        """The round in a few lines: one per slot, one per lease with something to say, totals."""
        lines = [
            f"round {self.round_number} of {self.application_name!r}: {len(self.slots)} slot(s), "
            f"{self.totals['leases']} lease(s), {self.totals['records']} record(s) / "
            f"{_size(self.totals['bytes'])} landed in {self.totals['files']} file(s), {self.seconds:.1f} s",
            f"  {'slot':<28} {'leases':>6} {'records':>9} {'bytes':>10} {'seconds':>8} {'cpu %':>6}",
        ]
        for slot in self.slots:
            lines.append(
                f"  {slot.worker_id:<28} {len(slot.leases):>6} {slot.records:>9} {_size(slot.bytes):>10} "
                f"{slot.seconds:>8.1f} {_cpu(slot.cpu_percent):>6}"
            )
        lines.append(f"  {'lease':<40} {'outcome':<20} {'records':>8} {'behind ms':>10}  checkpoint")
        for lease in sorted((lease for slot in self.slots for lease in slot.leases), key=lambda lease: lease.lease_key):
            behind = "-" if lease.millis_behind_latest is None else str(lease.millis_behind_latest)
            lines.append(
                f"  {lease.lease_key:<40} {lease.outcome:<20} {lease.records:>8} {behind:>10}  "
                f"{_short(lease.start)} -> {_short(lease.end)}"
            )
            if lease.detail:
                lines.append(f"      {lease.detail}")
        outcomes = ", ".join(f"{name} {count}" for name, count in self.totals["outcomes"].items()) or "none"
        lines.append(f"  outcomes: {outcomes}")
        if self.totals.get("busiest_over_bound") is not None:
            lines.append(
                f"  balance: the busiest slot landed {self.totals['busiest_over_bound']:.2f}x the lower bound "
                "max(total / slots, largest lease)"
            )
        for loss in self.totals["retention_losses"]:
            lines.append(
                f"  LOSS: {loss['lease_key']}: records after {loss['after']} aged out of the stream before they "
                f"were read (first still available: {loss['first_available'] or 'none'})"
            )
        for failure in self.slot_failures:
            lines.append(f"  SLOT FAILED: {failure}")
        if self.leadership_lost:
            lines.append("  WARNING: the leader lock was lost during the round")
        return "\n".join(lines)


def busiest_over_bound(slot_bytes: Sequence[int], lease_bytes: Sequence[int]) -> float | None:
    """How far the round's busiest slot is from perfect balance: the bytes it landed over the lower
    bound max(total / W, the largest lease's bytes), which no assignment can beat. None when nothing
    landed."""
    bound = max(sum(slot_bytes) / len(slot_bytes), max(lease_bytes, default=0)) if slot_bytes else 0
    return max(slot_bytes) / bound if bound else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def reported_losses(totals: Mapping[str, Any]) -> list[tuple[str, AgedOutRange]]:
    """The retention losses named by a report's totals (its JSON form), as (lease key, range)."""
    return [
        (
            loss["lease_key"],
            AgedOutRange(loss["after"], loss.get("first_available"), loss.get("first_available_arrival")),
        )
        for loss in totals.get("retention_losses", [])
    ]


def _slot_order(worker_id: str) -> tuple[int, str]:
    suffix = worker_id.rsplit("-", 1)[-1]
    return (int(suffix) if suffix.isdigit() else -1, worker_id)


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _cpu(value: float) -> str:
    return "n/a" if value < 0 else f"{value:.1f}"


def _short(position: str) -> str:
    """Long sequence numbers shortened to their last digits, which is where neighbours differ."""
    return position if len(position) <= 16 else "…" + position[-12:]


# --- where a round's report lives, and how it is written and read ---------------------------------

# Beside the output, under a name Parquet readers skip (it starts with `_`).
REPORTS_FOLDER = "_rounds"


def report_uri_for(output_uri: str, run_id: str) -> str:
    """The report of the round run `run_id` writes to `output_uri`: `<output>/_rounds/<run id>.json`
    (the run id's `:` and `+` made `-`, which object stores and file systems both take)."""
    name = run_id.replace(":", "-").replace("+", "-")
    return f"{output_uri.rstrip('/')}/{REPORTS_FOLDER}/{name}.json"


def write_report(uri: str, report: RoundReport, app: LeaseApplication) -> None:
    """The JSON report at a local path (written atomically) or an s3:// URI."""
    document = report.to_json().encode()
    if uri.startswith("s3://"):
        bucket, key = _s3_location(uri)
        client = app.client("s3")
        aws.AwsCaller("s3", app.retry_policy).call(
            "PutObject",
            lambda: client.put_object(Bucket=bucket, Key=key, Body=document, ContentType="application/json"),
        )
        return
    path = Path(uri.removeprefix("file://"))
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"_{path.name}.tmp")
    staging.write_bytes(document)
    staging.replace(path)


def read_report(uri: str, app: LeaseApplication) -> dict[str, Any]:
    """A report `write_report` wrote, as its JSON document."""
    if uri.startswith("s3://"):
        bucket, key = _s3_location(uri)
        client = app.client("s3")

        def fetch() -> bytes:  # the body is read inside the retried call: a dropped stream is retried too
            body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body

        document: dict[str, Any] = json.loads(aws.AwsCaller("s3", app.retry_policy).call("GetObject", fetch))
        return document
    document = json.loads(Path(uri.removeprefix("file://")).read_text())
    return document


def _s3_location(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not key:
        raise ConfigurationError("report_uri", f"an S3 report URI needs a bucket and a key, got {uri!r}")
    return bucket, key
