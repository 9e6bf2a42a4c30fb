"""A seeded, randomized campaign of what other tools do to the table between and during the rounds,
on Iceberg (pyiceberg's SQL catalog on SQLite) and Delta (delta-rs in a folder).

    .venv/bin/python bench/table_operations.py [--seed N] [--operations N] [--format iceberg|delta|both]

Method. An application lands the two shards of one stream (`devtools/table_rounds.py`: the real lease
consumer per lease, Kinesis and the lease table in memory, then the driver's publication) into a
table. Before each operation the stream gets 0-4 new records per shard. The operation
(`devtools/table_operations.py`, drawn at random) runs either between two rounds or during one:
inside the driver's publication, after every slot staged and committed its batches and before the
commit that publishes them. Besides the table's own operations: the stream deleted and created again
(a new incarnation whose sequence numbers start over, a new lease table), the lease table lost and
restored from the table (`leasectl restore`'s plan and writes), and, in 15 % of the rounds, a driver
that dies before its publication (the next round publishes). An orphan removal that does not leave
the sink's own folders alone stops the sink (it names the position map it cannot read): that table's
episode ends there, and the campaign goes on with a new table.

Judged, record by record, against what the stream produced: every record a lease committed must be
in the table once, as the writing library reads it and as DuckDB reads it (`devtools/analyst_reads.py`,
the same rows each as often). A record the table lacks is *lost on purpose and named* when a round's
publication named its range (the round fails: `publish_committed_batches`' losses), else *lost
silently*. After every round that published, `leasectl verify`'s check (`audit_landed` over the
table's `landed_batches` and the leases' `awaiting_from`) must not agree (no fault) while a record a
lease committed is missing from the table: that is a *false agreement*. Each figure is charged to the
operation that took the records from the table (a rollback, a delete), else to the last operation
before the round that named them. A user's delete of the application's rows, a rollback that
takes out records of a stream's former incarnation (the stream was re-created since, and the
application has no lease of it left), and committed batches that were still waiting for a round's
publication when the lease table was lost or torn down, are neither named by a round nor seen by
verify (docs/operating.md, "Other tools on the table"): their losses are counted apart (*lost,
documented*). Exit status 1 on a duplicate, a silent loss, a false agreement, two reads that differ,
or a round that failed unexpectedly.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from devtools.analyst_reads import Identity  # noqa: E402
from devtools.table_operations import Done, TableAtHand, library_identities, table_at_hand  # noqa: E402
from devtools.table_rounds import (  # noqa: E402
    BASE_STEP,
    FIRST_BASE,
    SHARDS,
    STREAM,
    RoundResult,
    TableRounds,
    base_of,
)
from lease_core.errors import LeaseCoreError  # noqa: E402

DRIVER_DIES = "driver dies before publishing"
RECREATED = "stream re-created"
RESTORED = "lease table lost and restored"
STOPS_THE_SINK = "orphan removal (no exclusions)"
DURING_SHARE = 0.4
DRIVER_DEATH_SHARE = 0.15
# Drawn less often: each one ends its table's episode.
RARE = {STOPS_THE_SINK: 0.25}
# Losses no round can name and verify cannot see (docs/operating.md, "Other tools on the table"): shown
# apart, as documented, and not a violation.
PAST_INCARNATION = "(taken from a re-created stream's former incarnation)"
LEASE_TABLE_GONE = "(unpublished when the lease table went)"
DOCUMENTED = {"user deletes our rows", PAST_INCARNATION, LEASE_TABLE_GONE}
DRAIN_ROUNDS = 3
# A named loss: "<lease>: ... after <position> ... up to <position>", "through <held>, but its next batch
# starts after <start>" (the records between), or "none of the lease's records, but ... after <start>".
UP_TO = re.compile(r"^(?P<lease>[^:]+): the batch (?:after (?P<after>\S+) )?up to (?P<end>\S+)")
GAP = re.compile(r"^(?P<lease>[^:]+): the table holds the lease through (?P<after>\S+), .* starts after (?P<end>\S+):")
COMMITTED = re.compile(
    r"^(?P<lease>[^:]+): the table holds the lease through (?P<after>\S+), but it is committed through (?P<end>\S+) "
)
NONE_HELD = re.compile(r"^(?P<lease>[^:]+): the table holds none of the lease's records, .* starts after (?P<end>\S+):")


@dataclass
class Figures:
    run: int = 0
    during: int = 0
    not_applicable: int = 0
    lost_named: int = 0
    duplicated: int = 0
    lost_silently: int = 0
    false_agreements: int = 0
    lost_documented: int = 0  # lost silently, or agreed over, as docs/operating.md says it is


@dataclass(frozen=True)
class NamedLoss:
    """A range a failed round named: the records of `shard` of the stream's `incarnation` after
    `after` (None: from its first) through `end`."""

    incarnation: int
    shard: str
    after: int | None
    end: int

    def covers(self, incarnation: int, shard: str, number: int) -> bool:
        return (
            (incarnation, shard) == (self.incarnation, self.shard)
            and (self.after is None or number > self.after)
            and number <= self.end
        )


def incarnation_of(number: int) -> int:
    """The stream incarnation whose records are numbered from `base_of(incarnation)` on."""
    return (FIRST_BASE - number) // BASE_STEP + 1 if number <= FIRST_BASE else 0


def named_losses(lines: tuple[str, ...], incarnation: int) -> list[NamedLoss]:
    ranges = []
    for line in lines:
        match = UP_TO.match(line) or GAP.match(line) or COMMITTED.match(line) or NONE_HELD.match(line)
        if match is None:
            raise AssertionError(f"a named loss the campaign cannot read: {line!r}")
        after = match.groupdict().get("after")
        ranges.append(
            NamedLoss(incarnation, match["lease"], int(after) if after and after.isdigit() else None, int(match["end"]))
        )
    return ranges


@dataclass
class Episode:
    """One table and the application landing into it, with what the campaign knows of its records."""

    at_hand: TableAtHand
    rounds: TableRounds
    # (incarnation, shard) -> the highest record number a lease committed
    committed: dict[tuple[int, str], int] = field(default_factory=dict)
    named: list[NamedLoss] = field(default_factory=list)
    named_by: dict[NamedLoss, str] = field(default_factory=dict)
    taken_by: dict[Identity, str] = field(default_factory=dict)  # records an operation took from the table
    duplicates_seen: Counter[Identity] = field(default_factory=Counter)
    stopped: bool = False

    def identity(self, incarnation: int, shard: str, number: int) -> Identity:
        return (STREAM, shard, str(number), 0)

    def owed(self) -> list[tuple[int, str, int]]:
        """Every record a lease committed: (incarnation, shard, number)."""
        return [
            (incarnation, shard, number)
            for (incarnation, shard), last in sorted(self.committed.items())
            for number in range(base_of(incarnation) + 1, last + 1)
        ]

    def note_checkpoints(self) -> None:
        for shard in SHARDS:
            checkpoint = self.rounds.checkpoint(shard)
            if not checkpoint.is_sentinel:
                key = (self.rounds.incarnation, shard)
                self.committed[key] = max(self.committed.get(key, 0), int(checkpoint.sequence_number))


class Campaign:
    def __init__(
        self, family: str, folder: Path, seed: int, operations: int, say: Callable[[str], None], verbose: bool = False
    ) -> None:
        self.family, self.folder, self.operations, self.say = family, folder, operations, say
        self.verbose: Callable[[str], None] = say if verbose else lambda line: None
        self.rng = random.Random(f"{seed}-{family}")
        self.figures: dict[str, Figures] = defaultdict(Figures)
        self.violations: list[str] = []
        self.episodes = 0
        self.last_kind = "(start)"
        self.episode = self._new_episode()

    def _new_episode(self) -> Episode:
        self.episodes += 1
        at_hand = table_at_hand(self.family, self.folder / f"episode-{self.episodes}")
        return Episode(at_hand, TableRounds(at_hand.open_sink))

    # --- the campaign ---------------------------------------------------------------------------

    def run(self) -> None:
        for number in range(1, self.operations + 1):
            self._produce()
            kind = self._draw()
            self.last_kind = kind
            figures = self.figures[kind]
            figures.run += 1
            try:
                self._step(kind, figures)
            except Exception as error:  # the campaign goes on with a new table, and the run fails
                self.violations.append(f"{self.family} operation {number} ({kind}): {type(error).__name__}: {error}")
                self.say(f"  {self.family} operation {number} ({kind}) failed: {type(error).__name__}: {error}")
                self.episode.stopped = True
            if self.episode.stopped:
                self._close_episode()
                self.episode = self._new_episode()
            if number % 50 == 0:
                self.say(f"  {self.family}: {number} operations, episode {self.episodes}")
        self._drain()
        self._close_episode()

    def _step(self, kind: str, figures: Figures) -> None:
        if kind == RECREATED:
            self._between(kind, self._recreate)
        elif kind == RESTORED:
            self._between(kind, lambda rng: self._restore())
        else:
            operation = self.episode.at_hand.operations()[kind]
            if kind == STOPS_THE_SINK:
                self._operate(kind, operation)
                self._stop_the_sink()
            elif self.rng.random() < DURING_SHARE:
                figures.during += 1
                self._round(during=lambda: self._operate(kind, operation))
            else:
                self._between(kind, operation)

    def _produce(self) -> None:
        for shard in SHARDS:
            self.episode.rounds.produce(shard, self.rng.randint(0, 4))

    def _draw(self) -> str:
        kinds = [*self.episode.at_hand.operations(), RECREATED, RESTORED]
        weights = [RARE.get(kind, 1.0) for kind in kinds]
        return self.rng.choices(kinds, weights)[0]

    def _between(self, kind: str, operation: Callable[[random.Random], Done | None]) -> None:
        self._operate(kind, operation)
        self._round(publish=self.rng.random() >= DRIVER_DEATH_SHARE)

    def _operate(self, kind: str, operation: Callable[[random.Random], Done | None]) -> None:
        """Run the operation, charging it with the application's records it took from the table."""
        episode = self.episode
        before = set(self._identities())
        done = operation(self.rng)
        self.verbose(f"    {kind}: {'nothing to do' if done is None else done.detail}")
        if done is None:
            self.figures[kind].not_applicable += 1
            return
        for identity in before - set(self._identities()):
            # Records of a stream incarnation the application no longer has leases of (the stream was
            # re-created since): no round can name them and verify has no lease to judge them by.
            earlier = incarnation_of(int(identity[2])) < episode.rounds.incarnation
            episode.taken_by[identity] = PAST_INCARNATION if earlier else kind  # (the last to take it)

    def _identities(self) -> list[Identity]:
        return library_identities(self.episode.at_hand.open_sink({}))

    def _recreate(self, rng: random.Random) -> Done:
        self._unpublished_with_the_lease_table()
        self.episode.rounds.recreate_stream()
        return Done("the stream deleted and created again")

    def _restore(self) -> Done:
        self._unpublished_with_the_lease_table()
        restores = self.episode.rounds.restore_lost_lease_table()
        return Done(f"restored {len(restores)} lease(s)")

    def _unpublished_with_the_lease_table(self) -> None:
        """The lease table is about to go (lost, or torn down with its stream): the committed records the
        table does not hold (a driver died before its publication) go with the leases' records of them."""
        episode, rounds = self.episode, self.episode.rounds
        present = set(self._identities())
        episode.note_checkpoints()
        for shard in SHARDS:
            checkpoint = rounds.checkpoint(shard)
            if checkpoint.is_sentinel:
                continue
            for number in range(rounds.base + 1, int(checkpoint.sequence_number) + 1):
                identity = episode.identity(rounds.incarnation, shard, number)
                if identity not in present and not any(
                    loss.covers(rounds.incarnation, shard, number) for loss in episode.named
                ):
                    episode.taken_by[identity] = LEASE_TABLE_GONE

    def _round(self, *, publish: bool = True, during: Callable[[], object] | None = None) -> RoundResult:
        episode = self.episode
        if not publish:
            self.figures[DRIVER_DIES].run += 1
        result = episode.rounds.run(publish=publish, during=during)
        self.verbose(
            f"    round {episode.rounds.number}: {'published' if result.published else 'the driver died'}"
            f"{'' if result.error is None else ', error: ' + result.error}"
            f"{''.join(f'; LOSS {line}' for line in result.named_losses)}"
        )
        episode.note_checkpoints()
        failed = [f"{report.lease_key}: {report.detail}" for report in result.reports if report.detail]
        if failed:
            self.violations.append(f"{self.family} round {episode.rounds.number} after {self.last_kind}: {failed}")
        if result.error is not None:
            self.violations.append(f"{self.family} round {episode.rounds.number} publication: {result.error}")
        for loss in named_losses(result.named_losses, episode.rounds.incarnation):
            episode.named.append(loss)
            episode.named_by[loss] = self.last_kind
        if result.published and result.error is None:
            self._check_verify()
        self._check_duplicates()
        return result

    def _check_verify(self) -> None:
        """Verify must find a fault while a record a lease of the current stream committed is missing."""
        episode, rounds = self.episode, self.episode.rounds
        present = set(self._identities())
        missing = [
            identity
            for shard in SHARDS
            if not (checkpoint := rounds.checkpoint(shard)).is_sentinel
            for number in range(rounds.base + 1, int(checkpoint.sequence_number) + 1)
            if (identity := episode.identity(rounds.incarnation, shard, number)) not in present
        ]
        if missing and not any(finding.finding.is_fault for finding in rounds.verify()):
            kinds = {episode.taken_by.get(identity, self.last_kind) for identity in missing}
            if kinds <= DOCUMENTED:
                return
            kind = sorted(kinds - DOCUMENTED)[0]
            self.figures[kind].false_agreements += 1
            self.say(f"  FALSE AGREEMENT after {kind}: {len(missing)} record(s) missing, e.g. {missing[0]}")

    def _check_duplicates(self) -> None:
        counts = Counter(self._identities())
        for identity, count in counts.items():
            if count > 1 and count - 1 > self.episode.duplicates_seen[identity]:
                self.figures[self.last_kind].duplicated += count - 1 - self.episode.duplicates_seen[identity]
                self.episode.duplicates_seen[identity] = count - 1

    def _stop_the_sink(self) -> None:
        """After an orphan removal that took the sink's own files: the next round's publication must
        fail naming what it cannot read, and verify must not agree; the table's episode ends."""
        rounds = self.episode.rounds
        result = rounds.run()
        self.episode.note_checkpoints()
        if result.error is None:
            self._check_verify()
            return  # nothing of the application's was there to remove: the sink goes on
        try:
            faults = [finding for finding in rounds.verify() if finding.finding.is_fault]
        except LeaseCoreError:
            faults = ["verify stopped with an error"]  # type: ignore[list-item]
        if not faults:
            self.figures[STOPS_THE_SINK].false_agreements += 1
        self.say(f"  {self.family}: the sink stopped: {result.error}")
        self.episode.stopped = True

    def _drain(self) -> None:
        self.last_kind = "(drain)"
        for _ in range(DRAIN_ROUNDS):
            self._round()

    def _close_episode(self) -> None:
        """Judge every record a lease committed in this episode's table."""
        episode = self.episode
        episode.note_checkpoints()
        library = Counter(self._identities())
        analyst = episode.at_hand.analyst()
        duckdb = Counter(analyst.identities()) if analyst is not None else Counter()
        if library != duckdb:
            self.violations.append(
                f"{self.family} episode {self.episodes}: DuckDB and the library read different rows "
                f"({sum(duckdb.values())} against {sum(library.values())})"
            )
        for incarnation, shard, number in episode.owed():
            identity = episode.identity(incarnation, shard, number)
            if library[identity]:
                continue
            naming = next((loss for loss in episode.named if loss.covers(incarnation, shard, number)), None)
            if episode.stopped and naming is None:
                self.figures[STOPS_THE_SINK].lost_named += 1  # named by the error the sink stopped with
            elif naming is not None:
                self.figures[episode.taken_by.get(identity, episode.named_by[naming])].lost_named += 1
            elif (kind := episode.taken_by.get(identity, "(unattributed)")) in DOCUMENTED:
                self.figures[kind].lost_documented += 1
            else:
                self.figures[kind].lost_silently += 1


def print_table(family: str, figures: dict[str, Figures], say: Callable[[str], None]) -> None:
    say(f"\n{family}")
    header = (
        "operation",
        "run",
        "during",
        "n/a",
        "lost, named",
        "lost, documented",
        "duplicated",
        "lost silently",
        "false agreements",
    )
    counts = [
        (
            f.run,
            f.during,
            f.not_applicable,
            f.lost_named,
            f.lost_documented,
            f.duplicated,
            f.lost_silently,
            f.false_agreements,
        )
        for f in figures.values()
    ]
    rows: list[tuple[object, ...]] = [(kind, *count) for kind, count in sorted(zip(figures, counts))]
    rows.append(("total", *(sum(column) for column in zip(*counts))))
    widths = [max(len(str(row[index])) for row in [header, *rows]) for index in range(len(header))]
    for row in [header, *rows]:
        say(
            "  "
            + "  ".join(
                str(cell).ljust(width) if index == 0 else str(cell).rjust(width)
                for index, (cell, width) in enumerate(zip(row, widths))
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--operations", type=int, default=200, help="operations per format")
    parser.add_argument("--format", choices=("iceberg", "delta", "both"), default="both")
    parser.add_argument("--verbose", action="store_true", help="print every operation and round")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    families = ("iceberg", "delta") if arguments.format == "both" else (arguments.format,)
    failed = False
    for family in families:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"table-operations-{family}-") as folder:
            campaign = Campaign(family, Path(folder), arguments.seed, arguments.operations, print, arguments.verbose)
            campaign.run()
        print_table(family, campaign.figures, print)
        totals = Figures()
        for figures in campaign.figures.values():
            totals.duplicated += figures.duplicated
            totals.lost_silently += figures.lost_silently
            totals.false_agreements += figures.false_agreements
        seconds = time.monotonic() - started
        print(
            f"  {family}: seed {arguments.seed}, {arguments.operations} operations, {campaign.episodes} table(s), "
            f"{seconds:.1f} s; duplicated {totals.duplicated}, lost silently {totals.lost_silently}, "
            f"false agreements {totals.false_agreements}, other violations {len(campaign.violations)}"
        )
        for violation in campaign.violations:
            print(f"  VIOLATION {violation}")
        failed |= bool(totals.duplicated or totals.lost_silently or totals.false_agreements or campaign.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
