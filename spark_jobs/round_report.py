"""What one consume round did: per lease, per slot, totals and losses; JSON for machines, text for people.

The slot tasks build `LeaseReport`s and a `SlotReport` on the executors and return them to the
driver (they pickle: plain frozen dataclasses of strings and numbers). The driver folds them into a
`RoundReport`, writes it as JSON where the caller asks, and prints the summary.

This module owns the report's schema: the JSON is the dataclasses' fields under their own names
(`to_dict`), and `RoundReport.from_dict` / `from_json` rebuild the dataclasses from it, checking
every field; a field renamed since an earlier release also reads under its former name, so that
the reports that release wrote still read. `RoundFigures` is the report's part that fits XCom (the
consume step's result, which the finalize step keeps in the round history), with the same schema
rules.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import unquote, urlsplit

import pydantic

from lease_core import aws
from lease_core.application import LeaseApplication
from lease_core.errors import AccessError, ConfigurationError, LeaseCoreError
from lease_core.metrics.freshness import Freshness
from lease_core.metrics.round_metrics import LeaseObservation, RoundObservation, SlotObservation
from lease_core.model.lease import AgedOutRange

Schema = TypeVar("Schema")


def _formerly(name: str, former_name: str) -> Any:
    """A field of the report `name`d anew: a report written before reads back, its value under `former_name`."""
    return pydantic.Field(validation_alias=pydantic.AliasChoices(name, former_name))


@dataclass(eq=False, repr=False)
class MalformedReportError(LeaseCoreError, ValueError):
    """A round report (a file or the consume step's XCom) is not JSON of the report's schema: a
    foreign or damaged file, or one a newer version wrote; the message names the field."""

    source: str
    problem: str

    def __str__(self) -> str:
        return f"round report {self.source!r} cannot be read: {self.problem}"


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
    ENDED = frozenset({SHARD_END, FINISHED})  # nothing of the shard is left to land


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

    @property
    def description(self) -> str:
        return (
            f"{self.lease_key}: records after {self.after} aged out of the stream before they were read "
            f"(first still available: {self.first_available or 'none'})"
        )


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
    # The reads' counters, whatever the retrieval (`lease_core.retrieval.record_source.ReadBatch`):
    # calls for records sent, those refused for a limit, and re-opens where the read stood. Reports
    # of earlier releases named them for polling, and read back under these names.
    read_calls: Annotated[int, _formerly("read_calls", "get_records_calls")] = 0
    refused_read_calls: Annotated[int, _formerly("refused_read_calls", "throttled_calls")] = 0
    read_reopens: Annotated[int, _formerly("read_reopens", "expired_iterators")] = 0
    detail: str | None = None
    retryable: bool | None = None
    # The lease's last committed batch file (visible name) when it is not visible at the end of the
    # lease's round: left staged by a failed promotion (the next round makes it visible), or deleted
    # before it was visible (its records are not in the sink).
    unpromoted_batch: str | None = None
    missing_batches: tuple[str, ...] = ()
    dead_lettered: int = 0  # records its processing rejected, set aside in the dead-letter destination
    # Records its decoder left out on purpose: no row, not rejected (a CloudWatch Logs control message,
    # a decoder's None); counted in `records`.
    left_out: int = 0
    # Freshness (docs/metrics.md): every record of the shard that arrived before `landed_through_millis`
    # (epoch milliseconds) is landed: the moment a caught-up read reached the tip or saw the shard's end,
    # the arrival of the first record read but not landed, else of the last landed, else the lease's
    # measurement from before the round (None: never measured). `newest_arrival_millis`: the arrival of
    # the newest record the round landed on the lease (None: none).
    landed_through_millis: int | None = None
    newest_arrival_millis: int | None = None


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
class RoundTotals:
    """The round's sums over every lease of every slot, and the losses it names."""

    leases: int
    records: int
    bytes: int
    files: int
    outcomes: dict[str, int]  # the number of leases per outcome, by outcome name
    lost_leases: tuple[str, ...]
    failed_leases: tuple[str, ...]
    retention_losses: tuple[RetentionLoss, ...]
    max_millis_behind_latest: int | None
    busiest_over_bound: float | None  # see `busiest_over_bound`; None when nothing landed
    # Committed batches not visible at the end of the round, as "lease key: file" (`LeaseReport`).
    unpromoted_batches: tuple[str, ...] = ()
    missing_batches: tuple[str, ...] = ()
    dead_lettered: int = 0
    left_out: int = 0

    @classmethod
    def of(cls, slots: Sequence[SlotReport], recorded_losses: Sequence[RetentionLoss] = ()) -> RoundTotals:
        """`recorded_losses`: the retention losses the lease table still carries at the end of the
        round, earlier rounds' whose report was never kept included; with the slots' own, each once."""
        leases = [lease for slot in slots for lease in slot.leases]
        losses = dict.fromkeys([loss for lease in leases for loss in lease.retention_losses] + list(recorded_losses))
        return cls(
            leases=len(leases),
            records=sum(lease.records for lease in leases),
            bytes=sum(lease.bytes for lease in leases),
            files=sum(lease.files for lease in leases),
            outcomes=dict(sorted(Counter(lease.outcome for lease in leases).items())),
            lost_leases=tuple(sorted(lease.lease_key for lease in leases if lease.outcome == Outcome.LOST)),
            failed_leases=tuple(sorted(lease.lease_key for lease in leases if lease.outcome == Outcome.FAILED)),
            retention_losses=tuple(losses),
            max_millis_behind_latest=max(
                (lease.millis_behind_latest for lease in leases if lease.millis_behind_latest is not None),
                default=None,
            ),
            busiest_over_bound=_rounded(
                busiest_over_bound([slot.bytes for slot in slots], [lease.bytes for lease in leases])
            ),
            unpromoted_batches=tuple(
                sorted(f"{lease.lease_key}: {lease.unpromoted_batch}" for lease in leases if lease.unpromoted_batch)
            ),
            missing_batches=tuple(
                sorted(f"{lease.lease_key}: {batch}" for lease in leases for batch in lease.missing_batches)
            ),
            dead_lettered=sum(lease.dead_lettered for lease in leases),
            left_out=sum(lease.left_out for lease in leases),
        )

    def reported_losses(self) -> list[tuple[str, AgedOutRange]]:
        """The retention losses these totals name, as (lease key, range)."""
        return [(loss.lease_key, loss.aged_out) for loss in self.retention_losses]


@dataclass(frozen=True)
class Publication:
    """The round's last step on the driver: the committed batches made visible at once, for a sink
    that publishes a round in one commit (an Iceberg table). `error` says why they were not."""

    commits: int
    batches_published: int
    batches_already_visible: int
    snapshot_id: int | None = None
    error: str | None = None

    @classmethod
    def failed(cls, error: str) -> Publication:
        return cls(0, 0, 0, error=error)


@dataclass(frozen=True)
class RoundReport:
    application_name: str
    round_number: int
    streams: tuple[str, ...]
    output_uri: str
    started_at: str
    seconds: float
    slots: tuple[SlotReport, ...]
    totals: RoundTotals
    slot_failures: tuple[str, ...] = ()
    leadership_lost: bool = False
    leader_record_version: str | None = None
    publication: Publication | None = None

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
        publication: Publication | None = None,
        unpublishable_batches: Sequence[str] = (),
    ) -> RoundReport:
        """`recorded_losses`: see `RoundTotals.of`. `unpublishable_batches`: committed batches the
        round's publication found gone ("lease key: batch"), losses like the slots' missing batches."""
        totals = RoundTotals.of(slots, recorded_losses)
        totals = dataclasses.replace(
            totals, missing_batches=tuple(sorted({*totals.missing_batches, *unpublishable_batches}))
        )
        return cls(
            application_name=application_name,
            round_number=round_number,
            streams=tuple(streams),
            output_uri=output_uri,
            started_at=started_at,
            seconds=seconds,
            slots=tuple(sorted(slots, key=lambda slot: _slot_order(slot.worker_id))),
            totals=totals,
            slot_failures=tuple(slot_failures),
            leadership_lost=leadership_lost,
            leader_record_version=leader_record_version,
            publication=publication,
        )

    @classmethod
    def from_dict(cls, document: object, source: str) -> RoundReport:
        """The report `to_dict` made; `MalformedReportError` naming `source` and the field otherwise.
        Keys the schema does not have are ignored (`succeeded` is computed again)."""
        return _from_document(cls, document, source)

    @classmethod
    def from_json(cls, text: str | bytes, source: str) -> RoundReport:
        try:
            document = json.loads(text)
        except ValueError as error:
            raise MalformedReportError(source, f"not JSON ({error})") from None
        return cls.from_dict(document, source)

    @property
    def succeeded(self) -> bool:
        """No slot failed, no lease failed, the round's batches were published (where the sink
        publishes per round) and the leader lock held throughout; lost leases and retention losses
        are reported, not failures."""
        unpublished = self.publication is not None and self.publication.error is not None
        return not (self.slot_failures or self.totals.failed_leases or self.leadership_lost or unpublished)

    def reported_losses(self) -> list[tuple[str, AgedOutRange]]:
        """The retention losses this report names, as (lease key, range)."""
        return self.totals.reported_losses()

    def figures(self) -> RoundFigures:
        """The report without its long texts: what fits XCom."""
        return RoundFigures(
            application_name=self.application_name,
            round_number=self.round_number,
            seconds=self.seconds,
            succeeded=self.succeeded,
            totals=self.totals,
            slot_failures=self.slot_failures,
            slots=tuple(SlotFigures.of(slot) for slot in self.slots),
            leases=tuple(LeaseFigures.of(lease) for slot in self.slots for lease in slot.leases),
            publication=self.publication,
            output_uri=self.output_uri,
        )

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = _plain(self)
        document["succeeded"] = self.succeeded  # for readers of the file; `from_dict` computes it again
        return document

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def _dead_lettered_share(self) -> str:
        """A round's records count every record it took from Kinesis, into the output or its dead letters."""
        dead = self.totals.dead_lettered
        return f" ({dead} of the records into the dead letters)" if dead else ""

    def summary(self) -> str:
        """The round in a few lines: one per slot, one per lease with something to say, totals."""
        lines = [
            f"round {self.round_number} of {self.application_name!r}: {len(self.slots)} slot(s), "
            f"{self.totals.leases} lease(s), {self.totals.records} record(s) / "
            f"{_size(self.totals.bytes)} landed in {self.totals.files} file(s){self._dead_lettered_share()}, "
            f"{self.seconds:.1f} s",
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
        outcomes = ", ".join(f"{name} {count}" for name, count in self.totals.outcomes.items()) or "none"
        lines.append(f"  outcomes: {outcomes}")
        if self.totals.busiest_over_bound is not None:
            lines.append(
                f"  balance: the busiest slot landed {self.totals.busiest_over_bound:.2f}x the lower bound "
                "max(total / slots, largest lease)"
            )
        for loss in self.totals.retention_losses:
            lines.append(f"  LOSS: {loss.description}")
        for batch in self.totals.missing_batches:
            lines.append(f"  LOSS: {missing_batch_loss(batch)}")
        for lease in sorted((lease for slot in self.slots for lease in slot.leases), key=lambda lease: lease.lease_key):
            if lease.dead_lettered:
                lines.append(
                    f"  DEAD-LETTERED: {lease.lease_key}: {lease.dead_lettered} record(s) its processing rejected"
                )
            if lease.left_out:
                lines.append(
                    f"  LEFT OUT: {lease.lease_key}: {lease.left_out} record(s) its decoder left out on purpose"
                )
        for batch in self.totals.unpromoted_batches:
            lines.append(f"  NOT VISIBLE YET: {batch}: committed and staged; the next round makes it visible")
        lines.extend(_publication_lines(self.publication))
        for failure in self.slot_failures:
            lines.append(f"  SLOT FAILED: {failure}")
        if self.leadership_lost:
            lines.append("  WARNING: the leader lock was lost during the round")
        return "\n".join(lines)


@dataclass(frozen=True)
class SlotFigures:
    """A slot's load in the round."""

    worker_id: str
    leases: int
    attempt: int
    records: int
    bytes: int
    seconds: float
    cpu_percent: float

    @classmethod
    def of(cls, slot: SlotReport) -> SlotFigures:
        return cls(
            slot.worker_id, len(slot.leases), slot.attempt, slot.records, slot.bytes, slot.seconds, slot.cpu_percent
        )


@dataclass(frozen=True)
class LeaseFigures:
    """A lease's row: its `LeaseReport` without the long texts and the details of its reads."""

    lease_key: str
    stream_name: str
    shard_id: str
    worker_id: str
    outcome: str
    records: int
    bytes: int
    seconds: float
    start: str
    end: str
    millis_behind_latest: int | None
    throughput_kbps: float | None
    # What stopped a failed or lost lease, cut to `ERROR_CHARACTERS`: a lease that fails every round
    # (a record its processing cannot handle) shows why on the monitoring page.
    error: str | None = None
    retryable: bool | None = None  # of a failed lease: whether its error says a retry can succeed
    dead_lettered: int = 0
    left_out: int = 0
    read_calls: int = 0
    refused_read_calls: int = 0
    landed_through_millis: int | None = None
    newest_arrival_millis: int | None = None

    @classmethod
    def of(cls, lease: LeaseReport) -> LeaseFigures:
        copied = {field.name: getattr(lease, field.name) for field in dataclasses.fields(cls) if field.name != "error"}
        problem = lease.outcome in Outcome.PROBLEMS and lease.detail
        return cls(**copied, error=shortened(lease.detail) if problem else None)


# A failure's text as the round history keeps it (a lease row's `error`, a round's `failures`).
ERROR_CHARACTERS = 300
# The failed leases a round's history entry names with their errors (it counts them all).
FAILURES_KEPT = 5


def shortened(text: str | None, limit: int = ERROR_CHARACTERS) -> str | None:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


# What a round's history entry keeps of the error that stopped the round: the errors the job and the
# steps raise say what is wrong in a line or two; 100 rounds of this many still fit the history's budget.
ROUND_ERROR_CHARACTERS = 2000


def abridged(text: str | None, limit: int = ROUND_ERROR_CHARACTERS) -> str | None:
    """`text` in at most `limit` characters: whole when it fits; otherwise its beginning (an error's
    name and cause come first) and its end (a process's last words), the middle left out."""
    if text is None or len(text) <= limit:
        return text
    marker = " […] "
    head = (limit - len(marker)) * 3 // 4
    tail = limit - len(marker) - head
    return text[:head] + marker + text[-tail:]


@dataclass(frozen=True)
class RoundFigures:
    """The report's figures that fit XCom: totals, per-slot load, per-lease rows (no long texts)."""

    application_name: str
    round_number: int
    seconds: float
    succeeded: bool
    totals: RoundTotals
    slot_failures: tuple[str, ...]
    slots: tuple[SlotFigures, ...]
    leases: tuple[LeaseFigures, ...]
    publication: Publication | None = None
    output_uri: str | None = None  # None: a report written by a release that did not keep it here

    @classmethod
    def from_dict(cls, document: object, source: str) -> RoundFigures:
        """The figures `to_dict` made; `MalformedReportError` naming `source` and the field otherwise."""
        return _from_document(cls, document, source)

    def to_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = _plain(self)
        return document

    def failed_for_good(self) -> tuple[str, ...]:
        """The failed leases ("lease key: error") when they alone failed the round and each one's error
        says that retrying cannot help (a transform that raises on a record, a refusal): running the
        round again now would fail the same way. Empty otherwise."""
        failed = [lease for lease in self.leases if lease.outcome == Outcome.FAILED]
        published = self.publication is None or self.publication.error is None
        if not failed or self.slot_failures or not published or any(lease.retryable is not False for lease in failed):
            return ()
        return tuple(f"{lease.lease_key}: {lease.error}" for lease in failed)

    def lease_rows(self) -> list[Mapping[str, Any]]:
        """The per-lease rows as the round history keeps them."""
        return [_plain(lease) for lease in self.leases]


# The columns of a history entry's per-slot rows (`history_figures`); `slot` is the slot's index when
# its worker id is `<application>-worker-<index>` (every slot of a round), else the worker id.
SLOT_COLUMNS = ("slot", "leases", "records", "bytes", "seconds", "cpu_percent")


def history_figures(figures: RoundFigures | None) -> dict[str, Any]:
    """What a round's history entry keeps of its figures. A round without figures (its consume step
    skipped: nothing to read) has the figures of a round that read nothing.

    `leases_behind` is the round's backlog: the leases it left behind their shard's tip, by Kinesis's
    own `MillisBehindLatest` of the last read (> 0); `max_millis_behind_latest` is the largest of
    those lags. `slots` is compact, one row per slot under `SLOT_COLUMNS` (`cpu_percent` null when
    the slot measured none), as 100 rounds of 100 slots must fit one item; `outcomes` counts leases
    by outcome.
    """
    totals = figures.totals if figures else RoundTotals.of(())
    publication = figures.publication if figures else None
    return {
        "records": totals.records,
        "bytes": totals.bytes,
        "files": totals.files,
        "seconds": figures.seconds if figures else 0.0,
        "leases": totals.leases,
        "leases_behind": sum(bool(lease.millis_behind_latest) for lease in figures.leases) if figures else 0,
        "max_millis_behind_latest": totals.max_millis_behind_latest,
        "outcomes": totals.outcomes,
        "lost_leases": len(totals.lost_leases),
        "failed_leases": len(totals.failed_leases),
        "retention_losses": len(totals.retention_losses),
        "dead_lettered": totals.dead_lettered,
        "busiest_over_bound": totals.busiest_over_bound,
        "slots": {"columns": list(SLOT_COLUMNS), "rows": _slot_rows(figures)} if figures else None,
        # As text: an Iceberg snapshot id is a 64-bit number, which JavaScript's numbers cannot hold.
        "snapshot_id": str(publication.snapshot_id) if publication and publication.snapshot_id is not None else None,
        "table_commits": publication.commits if publication else None,
        "output": figures.output_uri if figures else None,
        "failures": [
            f"{lease.lease_key}: {lease.error}" for lease in figures.leases if lease.outcome == Outcome.FAILED
        ][:FAILURES_KEPT]
        if figures
        else [],
    }


def round_observation(
    application: str,
    summary: Mapping[str, Any],
    figures: RoundFigures | None,
    lease_rows: Sequence[Mapping[str, Any]],
    assignment: Mapping[str, Any],
) -> RoundObservation:
    """What the round's metrics are computed from (`lease_core.metrics.round_metrics`): its history entry
    `summary` (with `succeeded` and the round's freshness), the report's `figures` (None: not read),
    the per-lease `lease_rows` with their freshness, and the assignment step's result (empty: it did not run)."""
    freshness = {row["lease_key"]: Freshness.of_row(row) for row in lease_rows}
    leases = tuple(
        LeaseObservation(
            lease.lease_key,
            lease.shard_id,
            lease.worker_id,
            lease.records,
            lease.bytes,
            lease.seconds,
            lease.millis_behind_latest,
            lease.read_calls,
            lease.refused_read_calls,
            lease.dead_lettered,
            failed=lease.outcome == Outcome.FAILED,
            lost=lease.outcome == Outcome.LOST,
            freshness=freshness.get(lease.lease_key, Freshness()),
        )
        for lease in (figures.leases if figures else ())
    )
    workers = assignment.get("workers")
    return RoundObservation(
        application=application,
        finished_at_millis=summary["finished_at"],
        idle=not summary["consumed"] and summary.get("error") is None,
        succeeded=summary["succeeded"],
        consumed=summary["consumed"],
        seconds=summary["seconds"],
        records=summary["records"],
        bytes=summary["bytes"],
        dead_lettered=summary["dead_lettered"],
        lost_leases=summary["lost_leases"],
        retention_losses=summary["retention_losses"],
        freshness=Freshness.of_row(summary),
        total_leases=None
        if workers is None
        else sum(row["leases_after"] for row in workers) + len(assignment.get("spillover", [])),
        workers=None if workers is None else len(workers),
        moves=None if workers is None else len(assignment.get("moves", [])),
        leases=leases,
        slots=tuple(SlotObservation(slot.worker_id, slot.seconds) for slot in figures.slots) if figures else (),
    )


def _publication_lines(publication: Publication | None) -> list[str]:
    if publication is None:
        return []
    if publication.error is not None:
        return [f"  NOT VISIBLE YET: the round's committed batches were not published: {publication.error}"]
    if not publication.commits and not publication.batches_published:
        return []  # nothing waited for the round's end (every batch of a Parquet dataset is visible at once)
    return [
        f"  published: {publication.batches_published} batch(es) in {publication.commits} table commit(s), "
        f"snapshot {publication.snapshot_id}"
    ]


def _slot_rows(figures: RoundFigures) -> list[list[Any]]:
    prefix = f"{figures.application_name}-worker-"
    return [
        [
            _slot_name(slot.worker_id, prefix),
            slot.leases,
            slot.records,
            slot.bytes,
            slot.seconds,
            None if slot.cpu_percent < 0 else slot.cpu_percent,
        ]
        for slot in figures.slots
    ]


def _slot_name(worker_id: str, prefix: str) -> int | str:
    index = worker_id.removeprefix(prefix)
    return int(index) if worker_id.startswith(prefix) and index.isdigit() else worker_id


def busiest_over_bound(slot_bytes: Sequence[int], lease_bytes: Sequence[int]) -> float | None:
    """How far the round's busiest slot is from perfect balance: the bytes it landed over the lower
    bound max(total / W, the largest lease's bytes), which no assignment can beat. None when nothing
    landed."""
    bound = max(sum(slot_bytes) / len(slot_bytes), max(lease_bytes, default=0)) if slot_bytes else 0
    return max(slot_bytes) / bound if bound else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# --- the JSON form: every dataclass above as an object of its fields, tuples as lists ------------


def _plain(value: Any) -> Any:
    """`value` as JSON holds it: a dataclass as an object of its fields, a tuple as a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


_ADAPTERS: dict[type, pydantic.TypeAdapter[Any]] = {}


def _adapter(schema: type[Schema]) -> pydantic.TypeAdapter[Schema]:
    """One validator per schema, built on first use (building one walks every nested dataclass)."""
    if schema not in _ADAPTERS:
        _ADAPTERS[schema] = pydantic.TypeAdapter(schema)
    return _ADAPTERS[schema]


def _from_document(schema: type[Schema], document: object, source: str) -> Schema:
    """The `schema` dataclass `_plain` made `document` of, checked field by field against the types.

    Validated as JSON in strict mode: no text is read as a number, no boolean as an integer, while an
    integer is a float (a -1 "no sample" is written as one) and a list a tuple, as JSON has no tuples.
    """
    try:
        return _adapter(schema).validate_json(json.dumps(document), strict=True)
    except pydantic.ValidationError as error:
        raise MalformedReportError(source, _first_problem(error)) from None


def _first_problem(error: pydantic.ValidationError) -> str:
    problem = error.errors(include_url=False)[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in problem["loc"]).lstrip(".")
    if problem["type"] == "missing":
        return f"{where} is missing"
    says = problem["msg"].removeprefix("Input ")
    return f"{where or 'the document'} {says}, not {problem['input']!r}"


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


def report_uri_for(reports_root: str, run_id: str) -> str:
    """The report of the round run `run_id` under `reports_root` (`BatchSink.reports_root`):
    `<root>/<run id>.json`, the run id's `:` and `+` made `-`, which object stores and file systems
    both take."""
    name = run_id.replace(":", "-").replace("+", "-")
    return f"{reports_root.rstrip('/')}/{name}.json"


REPORT_URI_FORMS = "a local path, an absolute file:///path or an s3://bucket/key URI"


def report_location(uri: str) -> Path | tuple[str, str]:
    """Pure: the local file, or the S3 bucket and key, that `uri` names; `ConfigurationError` for a
    URI the report cannot be written to (another scheme, an S3 URI without bucket or key, nothing)."""
    parts = urlsplit(uri)
    if parts.scheme == "s3":
        return _s3_location(uri)
    if parts.scheme == "" and uri.strip():
        return Path(uri)
    if parts.scheme == "file" and parts.netloc == "" and parts.path:
        return Path(unquote(parts.path))
    raise ConfigurationError("report_uri", f"must be {REPORT_URI_FORMS}, got {uri!r}")


def check_report_location(uri: str, app: LeaseApplication) -> None:
    """Fail before a round reads anything if its report could not be written at `uri`: a local
    directory that cannot be created or written, a bucket that does not exist (`ConfigurationError`),
    or S3 refusing to say (`AccessError`, `DependencyError`). Creates the local directory."""
    location = report_location(uri)
    if isinstance(location, Path):
        _check_local_directory(uri, location)
        return
    bucket, _ = location
    client = app.client("s3")
    try:
        aws.AwsCaller("s3", app.retry_policy).call("HeadBucket", lambda: client.head_bucket(Bucket=bucket))
    except AccessError as error:
        if error.detail.split(":")[0] not in ("404", "NoSuchBucket"):
            raise
        raise ConfigurationError("report_uri", f"bucket {bucket!r} of {uri!r} does not exist") from None


def _check_local_directory(uri: str, path: Path) -> None:
    if path.is_dir():
        raise ConfigurationError("report_uri", f"{uri!r} is a directory; expected a file path such as .../round.json")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix="_report-check-"):
            pass
    except OSError as error:
        raise ConfigurationError(
            "report_uri", f"directory {str(path.parent)!r} cannot be created or written: {error.strerror or error}"
        ) from None


def write_report(uri: str, report: RoundReport, app: LeaseApplication) -> None:
    """The JSON report at a local path (written atomically) or an s3:// URI."""
    document = report.to_json().encode()
    location = report_location(uri)
    if not isinstance(location, Path):
        bucket, key = location
        client = app.client("s3")
        aws.AwsCaller("s3", app.retry_policy).call(
            "PutObject",
            lambda: client.put_object(Bucket=bucket, Key=key, Body=document, ContentType="application/json"),
        )
        return
    path = location
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"_{path.name}.tmp")
    staging.write_bytes(document)
    staging.replace(path)


def read_report(uri: str, app: LeaseApplication) -> RoundReport:
    """The report `write_report` wrote; `MalformedReportError` naming `uri` for anything else."""
    return RoundReport.from_json(_report_bytes(uri, app), uri)


def _report_bytes(uri: str, app: LeaseApplication) -> bytes:
    location = report_location(uri)
    if not isinstance(location, Path):
        bucket, key = location
        client = app.client("s3")

        def fetch() -> bytes:  # the body is read inside the retried call: a dropped stream is retried too
            body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body

        document: bytes = aws.AwsCaller("s3", app.retry_policy).call("GetObject", fetch)
        return document
    return location.read_bytes()


def _s3_location(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not key:
        raise ConfigurationError("report_uri", f"an S3 report URI needs a bucket and a key, got {uri!r}")
    return bucket, key


def missing_batch_loss(batch: str) -> str:
    """A committed batch the sink names lost, as the report and the round's alert say it. An entry is
    `<lease key>: <batch>` when its staged file was deleted before it was visible (the slots' and the
    sinks' own word for that); a table sink that finds records lost otherwise (a rollback, a skip) says
    why after a second `: `, and is shown as it is."""
    if batch.count(": ") > 1:
        return batch
    return f"{batch}: committed, but its file was deleted before it was visible in the sink"
