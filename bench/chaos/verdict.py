"""The final check, once the faults have stopped and clean rounds have drained the stream.

- Duplicated: a record (shard, sequence number, sub-sequence number) that appears more than once in
  the sink as its readers see it (`read_landed`: a Parquet dataset's visible files, an Iceberg table's
  snapshot, a Delta table's current version).
- Read otherwise: a table's rows as an analyst reads them, with DuckDB (`read_by_duckdb`), must be
  the rows the table's own library reads, each as often; a record counted differently is a violation.
- Lost: a record the producer got acknowledged that is not in the dataset. It is a retention loss,
  and allowed, only when the campaign trimmed it away (its shard's trim horizon is above it) and a
  round report named it (a retention loss of its lease whose range holds it). Trimmed but never
  reported is a silent loss; not trimmed is a plain loss. Both are violations.
- Unexpected: a landed record the producer never wrote (allowed only for a payload whose PutRecords
  answer was lost, which may or may not have been written), or one whose payload differs.
- Stuck: the leader lock still held; a lease with a prepared batch, in a handoff, or owned by a slot
  that is not one of the last round's; a closed shard's lease not at SHARD_END; an open shard's lease
  behind the newest record written to it, or an open shard without a lease.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.chaos.producer import ProducedRecord
from devtools.stream_records import analyst_table, landed_records
from lease_core.model.lease import Lease
from lease_core.model.shards import Shard
from spark_jobs.round_report import RoundReport

Key = tuple[str, str, int]  # shard id, sequence number, sub-sequence number
SHOWN = 20


@dataclass(frozen=True)
class ReportedLoss:
    lease_key: str
    after: str
    first_available: str | None

    def holds(self, sequence_number: str) -> bool:
        after_ok = not self.after.isdigit() or int(self.after) < int(sequence_number)
        return after_ok and (self.first_available is None or int(sequence_number) < int(self.first_available))


@dataclass
class Verdict:
    produced: int = 0
    landed_rows: int = 0
    analyst_rows: int | None = None  # the table's rows as DuckDB reads them; None: not a table
    duplicated: list[tuple[Key, int]] = field(default_factory=list)
    read_otherwise: list[tuple[Key, int, int]] = field(default_factory=list)  # times landed, times DuckDB reads it
    lost: list[ProducedRecord] = field(default_factory=list)
    silently_aged_out: list[ProducedRecord] = field(default_factory=list)
    aged_out: list[ProducedRecord] = field(default_factory=list)
    unexpected: list[Key] = field(default_factory=list)
    changed: list[Key] = field(default_factory=list)
    uncertain_landed: int = 0
    unfounded_losses: list[ReportedLoss] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    loss_bounds: set[str] = field(default_factory=set)  # the `after` of every reported loss

    @property
    def clean(self) -> bool:
        return not (
            self.duplicated
            or self.read_otherwise
            or self.lost
            or self.silently_aged_out
            or self.unexpected
            or self.changed
            or self.unfounded_losses
            or self.stuck
        )

    def violations(self) -> list[str]:
        lines = []
        if self.duplicated:
            lines.append(
                f"{len(self.duplicated)} record(s) duplicated: "
                + ", ".join(f"{_key(key)} x{count}" for key, count in self.duplicated[:SHOWN])
            )
        if self.read_otherwise:
            lines.append(
                f"{len(self.read_otherwise)} record(s) DuckDB reads another number of times than the table's "
                f"library ({self.analyst_rows} rows against {self.landed_rows}): "
                + ", ".join(
                    f"{_key(key)} x{landed} / DuckDB x{read}" for key, landed, read in self.read_otherwise[:SHOWN]
                )
            )
        if self.lost:
            lines.append(f"{len(self.lost)} record(s) lost (never trimmed): " + _records(self.lost))
        if self.silently_aged_out:
            edge = [record for record in self.silently_aged_out if record.sequence_number in self.loss_bounds]
            lines.append(
                f"{len(self.silently_aged_out)} record(s) aged out without a round report naming the loss "
                f"({len(edge)} of them the `after` record of a reported loss, which the loss does not cover; "
                f"{len(self.silently_aged_out) - len(edge)} in no reported loss at all): "
                + _records(self.silently_aged_out)
            )
        if self.unexpected:
            lines.append(
                f"{len(self.unexpected)} landed record(s) never produced: "
                + ", ".join(map(_key, self.unexpected[:SHOWN]))
            )
        if self.changed:
            lines.append(
                f"{len(self.changed)} landed record(s) with another payload than produced: "
                + ", ".join(map(_key, self.changed[:SHOWN]))
            )
        if self.unfounded_losses:
            lines.append(
                f"{len(self.unfounded_losses)} retention loss(es) reported where none was injected: "
                + ", ".join(f"{loss.lease_key} after {loss.after}" for loss in self.unfounded_losses[:SHOWN])
            )
        lines += [f"stuck: {item}" for item in self.stuck]
        return lines

    def summary(self) -> str:
        return (
            f"produced {self.produced}, landed {self.landed_rows} rows"
            + ("" if self.analyst_rows is None else f" (DuckDB: {self.analyst_rows})")
            + f", duplicated {len(self.duplicated)}, "
            f"lost {len(self.lost) + len(self.silently_aged_out)}, retention losses injected and reported "
            f"{len(self.aged_out)}, unexpected {len(self.unexpected) + len(self.changed)}, "
            f"stuck {len(self.stuck)}"
        )


def read_landed(output_uri: str) -> list[tuple[Key, bytes]]:
    """Every row readers see in the sink (the Parquet dataset's visible files, the Iceberg table's snapshot,
    the Delta table's current version's files, read with pyarrow: `landed_records`)."""
    return [
        ((record.shard_id, record.sequence_number, record.sub_sequence_number), record.data)
        for record in landed_records(output_uri)
    ]


def read_by_duckdb(output_uri: str) -> list[Key] | None:
    """Every row of the table at `output_uri` as an analyst reads it, with DuckDB (`analyst_table`);
    None: a Parquet dataset, or no table yet."""
    table = analyst_table(output_uri)
    return None if table is None else [(shard, sequence, sub) for _, shard, sequence, sub in table.identities()]


def check_records(
    produced: Sequence[ProducedRecord],
    uncertain: set[bytes],
    landed: Sequence[tuple[Key, bytes]],
    trims: Mapping[str, str],
    reported: Iterable[ReportedLoss],
    analyst: Sequence[Key] | None = None,
) -> Verdict:
    """`analyst`: the table's rows as DuckDB reads them (`read_by_duckdb`), to be the same as `landed`."""
    verdict = Verdict(produced=len(produced), landed_rows=len(landed))
    counts = Counter(key for key, _ in landed)
    verdict.duplicated = sorted((key, count) for key, count in counts.items() if count > 1)
    if analyst is not None:
        verdict.analyst_rows = len(analyst)
        read = Counter(analyst)
        verdict.read_otherwise = sorted(
            (key, counts[key], read[key]) for key in counts | read if counts[key] != read[key]
        )
    written = {(record.shard_id, record.sequence_number, 0): record for record in produced}
    payloads = dict(landed)
    for key, data in payloads.items():
        record = written.get(key)
        if record is None:
            if data in uncertain:
                verdict.uncertain_landed += 1
            else:
                verdict.unexpected.append(key)
        elif record.payload != data:
            verdict.changed.append(key)
    losses = defaultdict(list)
    for loss in reported:
        losses[loss.lease_key].append(loss)
        verdict.loss_bounds.add(loss.after)
    explained: set[ReportedLoss] = set()
    for key, record in sorted(written.items(), key=lambda item: (item[0][0], int(item[0][1]))):
        if key in payloads:
            continue
        trim = trims.get(record.shard_id)
        if trim is None or int(record.sequence_number) >= int(trim):
            verdict.lost.append(record)
            continue
        naming = [loss for loss in losses[record.shard_id] if loss.holds(record.sequence_number)]
        (verdict.aged_out if naming else verdict.silently_aged_out).append(record)
        explained.update(naming)
    verdict.unfounded_losses = sorted(
        (
            loss
            for loss in {loss for items in losses.values() for loss in items}
            if loss.lease_key not in trims and loss not in explained
        ),
        key=lambda loss: (loss.lease_key, loss.after),
    )
    return verdict


def stuck_leases(
    leases: Sequence[Lease],
    shards: Sequence[Shard],
    produced: Mapping[str, Sequence[ProducedRecord]],
    slots: set[str],
    leader: str | None,
) -> list[str]:
    """What keeps the application from being settled; empty when every lease is caught up or finished."""
    stuck = [] if leader is None else [f"the leader lock is still held by {leader}"]
    open_shards = {shard.shard_id for shard in shards if shard.is_open}
    leased = {lease.lease_key for lease in leases}
    stuck += [f"open shard {shard} has no lease" for shard in sorted(open_shards - leased)]
    for lease in sorted(leases, key=lambda lease: lease.lease_key):
        name = f"lease {lease.lease_key} (owner {lease.lease_owner}, checkpoint {lease.checkpoint})"
        if lease.pending_checkpoint is not None:
            stuck.append(f"{name} keeps a prepared batch up to {lease.pending_checkpoint}")
        if lease.is_in_handoff:
            stuck.append(f"{name} is in a handoff from {lease.checkpoint_owner}")
        if lease.lease_owner not in slots:
            stuck.append(f"{name} is owned by a slot outside the last round ({sorted(slots)})")
        if lease.is_at_shard_end:
            continue
        if lease.lease_key not in open_shards:
            stuck.append(f"{name}: its shard is closed but the lease is not at SHARD_END")
            continue
        newest = produced.get(lease.lease_key)
        if newest and (
            lease.checkpoint.is_sentinel or int(lease.checkpoint.sequence_number) < int(newest[-1].sequence_number)
        ):
            stuck.append(f"{name} is behind the newest record of its shard ({newest[-1].sequence_number})")
    return stuck


def reported_losses(reports: Iterable[RoundReport]) -> list[ReportedLoss]:
    return [
        ReportedLoss(loss.lease_key, loss.after, loss.first_available)
        for report in reports
        for loss in report.totals.retention_losses
    ]


def _key(key: Key) -> str:
    shard, sequence, sub = key
    return f"{shard}/{sequence}" + (f":{sub}" if sub else "")


def _records(records: Sequence[ProducedRecord]) -> str:
    shown = ", ".join(
        f"{record.shard_id}/{record.sequence_number} ({record.payload.decode()})" for record in records[:SHOWN]
    )
    return shown + (f", ... ({len(records) - SHOWN} more)" if len(records) > SHOWN else "")
