"""Benchmark: a catch-up round by enhanced fan-out at Kinesis' 2 MiB/s per shard, and what a round in
each retrieval mode costs another consumer polling the same shards.

Method. The Kinesis stand-in (devtools/kinesis_standin.py, its own process) serves S shards with
Kinesis' own limits, not scaled: polling shares 5 GetRecords/s and 2 MiB/s per shard among every
polling reader (`Limits()`); each registered fan-out consumer gets its own 2 MiB/s per shard
(`FanOutLimits()`). Each shard holds --seconds of backlog at 2 MiB/s as --record-bytes records. moto
serves DynamoDB. Each case is full rounds (sync, assignment, the consume job's `run_round` on one
SparkSession) on a fresh application (own tables, own output, own consumer), until every lease has
caught up; every record must land exactly once, or the run fails.
1. "pipeline": polling with every limit and the reader's pacing off, twice (the first run also warms
   up the JVM and the Python workers; the faster counts), then fan-out on a stand-in of its own
   without a byte rate. Their rates are this machine's: the capped cases need S x 2 MiB/s of them.
2. A round alone, by fan-out, then by fan-out on a second stand-in whose subscriptions last
   --subscription-seconds instead of Kinesis' 5 minutes (the reader renews them as it would every
   5 minutes of a long catch-up), then by polling (paced at the cap, the default 2048 KB/s).
3. Another consumer alone (the baseline), then beside a polling round, then beside a fan-out round.
   It is a thread per shard with its own client: one GetRecords a second from TRIM_HORIZON, keeping
   to its own steady rate (--other-mib MiB/s: each call asks for what its schedule allows and it has
   not read yet, so a throttled call's records come with its next one). Its lag after each call is
   the records its schedule allowed but it has not got, in seconds of its rate (an IteratorAge in
   excess of its schedule; the stand-in writes nothing while it runs, so its MillisBehindLatest only
   grows with the wall clock and says nothing here). It starts --lead seconds before the round and
   runs for the same window as the baseline, or until a second after the round ends if that is later.
The per-shard rate is what the stand-in served a reader of the shard against what the shard could
serve while it was busy: bytes / (busy seconds x 2 MiB/s + the 1 s burst), busy from the first read
until the bytes served are paid off at 2 MiB/s (as bench/kinesis_limits.py counts). Both buckets start
full with 1 s of the rate, which the stand-in spends for a fan-out reader by pushing at once: so the
burst is counted as served capacity and the figure cannot exceed 1.0. A polling round beside the other
consumer shares the shard's bucket, so its own share cannot be told apart there. The round's bound
is bytes per shard / 2 MiB/s - the 1 s burst, as bench/catch_up_round.py counts it.

Run: /work/main/.venv/bin/python bench/fan_out.py [--shards 4] [--seconds 16] [--workers 2]
(about 2.5 minutes on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import botocore.exceptions  # noqa: E402

from bench.harness import Application, BenchmarkFailure, Position, prepare_environment, start_spark  # noqa: E402
from devtools.emulators import moto_server  # noqa: E402
from devtools.kinesis_standin import (  # noqa: E402
    MIB,
    THROTTLED,
    FanOutLimits,
    KinesisStandIn,
    Limits,
    StreamSpec,
    sequence_number,
    shard_id_of,
)
from lease_core.application import LeaseApplication  # noqa: E402
from spark_jobs.round_report import Outcome, RoundReport  # noqa: E402

STREAM = "bench-fan-out"
CAP = 2 * MIB  # Kinesis' read limit per shard: shared by polling readers, each fan-out consumer's own
BURST_SECONDS = 1.0  # both stand-in buckets start full with this much of the rate
MAX_ROUNDS = 5
UNPACED_KBPS = 1e6  # the reader's pacing out of the way of the pipeline case
MAX_GET_RECORDS = 10_000


@dataclass(frozen=True)
class Case:
    name: str
    retrieval: str | None  # None: no round, the other consumer alone
    limits: Limits
    other_consumer: bool
    fan_out: FanOutLimits | None = None  # a stand-in of its own with these fan-out limits (None: Kinesis')


@dataclass
class PollerTally:
    """What the other consumer saw, over its shards."""

    calls: int = 0
    throttled: int = 0
    records: int = 0
    scheduled: int = 0  # the records its schedule allowed by its last call
    max_lag_seconds: float = 0.0
    end_lag_seconds: float = 0.0
    seconds: float = 0.0
    at_tip: bool = False  # it reached the end of the backlog: its figures would be bound by that

    def add(self, other: PollerTally) -> None:
        self.calls += other.calls
        self.throttled += other.throttled
        self.records += other.records
        self.scheduled += other.scheduled
        self.max_lag_seconds = max(self.max_lag_seconds, other.max_lag_seconds)
        self.end_lag_seconds = max(self.end_lag_seconds, other.end_lag_seconds)
        self.seconds = max(self.seconds, other.seconds)
        self.at_tip = self.at_tip or other.at_tip


@dataclass(frozen=True)
class CaseResult:
    case: Case
    rounds: int
    consume_seconds: float
    reports: tuple[RoundReport, ...]
    stats: dict[str, Any]  # the stand-in's counters over the case
    consumer: str | None  # the fan-out consumer's name, for its counters
    machine_busy: float  # the whole machine's CPU share over the case (other engineers' work too)
    other: PollerTally | None = None

    @property
    def refused_read_calls(self) -> int:
        return sum(
            lease.refused_read_calls for report in self.reports for slot in report.slots for lease in slot.leases
        )

    @property
    def read_calls(self) -> str:
        """GetRecords or SubscribeToShard calls, and how many subscriptions were renewed."""
        leases = [lease for report in self.reports for slot in report.slots for lease in slot.leases]
        return f"{sum(lease.read_calls for lease in leases)} / {sum(lease.read_reopens for lease in leases)}"

    @property
    def slowest_lease_seconds(self) -> float:
        """One lease's work in the last round, from its claim to its last write."""
        return max(lease.seconds for slot in self.reports[-1].slots for lease in slot.leases)


class SteadyPoller:
    """Another consumer of the stream: a thread per shard, each with its own client, calling GetRecords
    once per `interval` from TRIM_HORIZON and asking for what its schedule of `records_per_second`
    allows and it has not read yet (module doc)."""

    def __init__(self, standin: KinesisStandIn, shards: int, records_per_second: float, interval: float = 1.0) -> None:
        self._standin = standin
        self._shards = shards
        self._records_per_second = records_per_second
        self._interval = interval
        self._stop = threading.Event()
        self._tallies: list[PollerTally] = []
        self._errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self._shards):
            tally = PollerTally()
            self._tallies.append(tally)
            thread = threading.Thread(target=self._guarded, args=(shard_id_of(index), tally), daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> PollerTally:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        if self._errors:
            raise BenchmarkFailure(f"the other consumer failed: {self._errors[0]!r}") from self._errors[0]
        total = PollerTally()
        for tally in self._tallies:
            total.add(tally)
        return total

    def _guarded(self, shard_id: str, tally: PollerTally) -> None:
        try:
            self._poll(shard_id, tally)
        except BaseException as error:  # reported by stop(), in the bench's thread
            self._errors.append(error)

    def _poll(self, shard_id: str, tally: PollerTally) -> None:
        client = self._standin.client()
        shard_iterator = client.get_shard_iterator(
            StreamName=STREAM, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        started = time.monotonic()
        calls = 0
        while not self._stop.wait(max(0.0, started + calls * self._interval - time.monotonic())):
            calls += 1
            tally.scheduled = int(calls * self._interval * self._records_per_second)
            limit = min(MAX_GET_RECORDS, tally.scheduled - tally.records)
            if limit > 0:
                tally.calls += 1
                try:
                    response = client.get_records(ShardIterator=shard_iterator, Limit=limit)
                except botocore.exceptions.ClientError as error:
                    if error.response["Error"]["Code"] != THROTTLED:
                        raise
                    tally.throttled += 1
                else:
                    shard_iterator = response["NextShardIterator"]
                    tally.records += len(response["Records"])
                    tally.at_tip = tally.at_tip or response["MillisBehindLatest"] == 0
            tally.end_lag_seconds = (tally.scheduled - tally.records) / self._records_per_second
            tally.max_lag_seconds = max(tally.max_lag_seconds, tally.end_lag_seconds)
        tally.seconds = time.monotonic() - started


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=16.0, help="backlog per shard, in seconds at 2 MiB/s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--record-bytes", type=int, default=1000)
    parser.add_argument("--other-mib", type=float, default=0.5, help="the other consumer's rate per shard, MiB/s")
    parser.add_argument(
        "--subscription-seconds", type=float, default=4.0, help="a subscription's lifetime in the renewal case"
    )
    parser.add_argument("--lead", type=float, default=2.0, help="seconds the other consumer polls before the round")
    return parser.parse_args(argv)


def records_per_shard(arguments: argparse.Namespace) -> int:
    # Kinesis' bytes of a record: its data and its partition key ("pk-<index>", about 8 bytes).
    return int(CAP * arguments.seconds / (arguments.record_bytes + 8))


def window_seconds(arguments: argparse.Namespace) -> float:
    """The other consumer's window: the lead, a polling round sharing the cap with it, and some slack."""
    return arguments.lead + arguments.seconds * CAP / (CAP - arguments.other_mib * MIB) + 4.0


def written_positions(arguments: argparse.Namespace) -> set[Position]:
    return {
        (shard_id_of(shard), str(sequence_number(shard, record)))
        for shard in range(arguments.shards)
        for record in range(records_per_shard(arguments))
    }


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def rounds_until_caught_up(spark: Any, application: Application, workers: int) -> tuple[float, list[RoundReport]]:
    """Rounds until every lease caught up (a throttled lease leaves the rest to the next round)."""
    seconds, reports = 0.0, list[RoundReport]()
    while True:
        times = application.round(spark, workers)
        seconds += times.consume
        reports.append(times.report)
        if set(times.report.totals.outcomes) == {Outcome.CAUGHT_UP}:
            return seconds, reports
        if len(reports) == MAX_ROUNDS:
            raise BenchmarkFailure(f"not caught up after {MAX_ROUNDS} rounds: {times.report.totals.outcomes}")


def run_case(spark: Any, standin: KinesisStandIn, moto: str, case: Case, arguments: argparse.Namespace) -> CaseResult:
    standin.set_limits(case.limits)
    standin.reset()
    application = None
    if case.retrieval is not None:
        label = "".join(character if character.isalnum() else "-" for character in case.name)
        paced = case.limits.read_bytes_per_second is not None
        application = Application(
            label,
            moto,
            standin.endpoint,
            tempfile.mkdtemp(prefix=f"bench-fan-out-{label}-"),
            stream=STREAM,
            retrieval=case.retrieval,
            shard_read_limit_kbps=CAP / 1024 if paced else UNPACED_KBPS,
        )
        if case.retrieval == "fan_out":
            # As the DAG's table step and `leasectl init --stream` do: registered, ACTIVE, recorded as ours.
            LeaseApplication(application.config).stream_consumers.ensure(STREAM)
    poller = None
    if case.other_consumer:
        poller = SteadyPoller(standin, arguments.shards, arguments.other_mib * MIB / (arguments.record_bytes + 8))
        poller.start()
    busy, total = machine_cpu()
    started = time.monotonic()
    seconds, reports = 0.0, list[RoundReport]()
    if poller is not None:
        time.sleep(arguments.lead)
    if application is not None:
        seconds, reports = rounds_until_caught_up(spark, application, arguments.workers)
        application.check_landed(written_positions(arguments))
    other = None
    if poller is not None:
        time.sleep(max(1.0, started + window_seconds(arguments) - time.monotonic()))
        other = poller.stop()
    busy_after, total_after = machine_cpu()
    consumer = None if application is None else application.config.stream_consumer_name
    machine_busy = (busy_after - busy) / max(1, total_after - total)
    return CaseResult(case, len(reports), seconds, tuple(reports), standin.stats(), consumer, machine_busy, other)


def served_over_cap(outcome: CaseResult) -> list[float]:
    """Per shard: the bytes the stand-in served the round's reader / what the shard could serve while
    busy (module doc); empty when another polling reader shared the shard's counters."""
    stats = outcome.stats
    if outcome.case.retrieval == "fan_out":
        readers = {
            key: entry
            for key, entry in stats["fan_out"]["consumer_shards"].items()
            if key.split("/")[1] == outcome.consumer
        }
    elif outcome.case.other_consumer:
        return []
    else:
        readers = stats["shards"]
    return [entry["bytes"] / (entry["busy_seconds"] * CAP + BURST_SECONDS * CAP) for entry in readers.values()]


def refusals(outcome: CaseResult) -> str:
    polling = sum(outcome.stats["violations"].values())
    fan_out = sum(outcome.stats["fan_out"]["violations"].values())
    return f"{polling} / {fan_out}"


def print_round_table(outcomes: list[CaseResult], arguments: argparse.Namespace) -> None:
    total_bytes = outcomes[0].stats["bytes"]
    per_shard = total_bytes / arguments.shards
    bound = per_shard / CAP - BURST_SECONDS
    print(
        f"\n{arguments.shards} shards x {records_per_shard(arguments):,} records of {arguments.record_bytes} B "
        f"({per_shard / MIB:.1f} MiB a shard, {arguments.seconds:g} s at 2 MiB/s), {arguments.workers} slots"
    )
    for pipeline in outcomes[:2]:
        print(
            f"{pipeline.case.name}: this machine's rate with every limit off is "
            f"{total_bytes / pipeline.consume_seconds / MIB:.1f} MiB/s ({pipeline.consume_seconds:.1f} s, machine "
            f"busy {pipeline.machine_busy:.0%}); a round at the cap needs {arguments.shards * CAP / MIB:.0f} MiB/s"
        )
    print(f"bound of a round at the cap: {per_shard / MIB:.1f} MiB / 2 MiB/s - 1 s burst = {bound:.1f} s")
    print(
        f"\n{'our round':<32}{'rounds':>7}{'round s':>9}{'/ bound':>9}{'served/cap min':>16}{'median':>8}"
        f"{'slowest lease s':>16}{'calls/renewals':>16}{'refused (report)':>18}"
        f"{'stand-in refusals poll/fan-out':>32}{'machine busy':>14}"
    )
    for outcome in outcomes[2:]:
        if outcome.case.retrieval is None:
            continue
        figures = served_over_cap(outcome)
        low = f"{min(figures):.3f}" if figures else "shared"
        median = f"{statistics.median(figures):.3f}" if figures else "-"
        print(
            f"{outcome.case.name:<32}{outcome.rounds:>7}{outcome.consume_seconds:>9.1f}"
            f"{outcome.consume_seconds / bound:>9.2f}{low:>16}{median:>8}{outcome.slowest_lease_seconds:>16.1f}"
            f"{outcome.read_calls:>16}{outcome.refused_read_calls:>18}"
            f"{refusals(outcome):>32}{outcome.machine_busy:>14.0%}"
        )
    print("(round s: the consume job's run_round, summed over the rounds it took to catch up)")


def print_other_table(outcomes: list[CaseResult], arguments: argparse.Namespace) -> None:
    others = [outcome for outcome in outcomes if outcome.other is not None]
    print(
        f"\nthe other consumer: 1 GetRecords a second per shard, {arguments.other_mib:g} MiB/s per shard, "
        f"from {arguments.lead:g} s before the round, for {window_seconds(arguments):.0f} s or until 1 s after it"
    )
    print(f"{'':<34}" + "".join(f"{outcome.case.name:>28}" for outcome in others))
    rows: list[tuple[str, Callable[[CaseResult], str]]] = [
        ("window s", lambda outcome: f"{tally(outcome).seconds:.1f}"),
        ("GetRecords calls", lambda outcome: f"{tally(outcome).calls}"),
        ("throttled calls", lambda outcome: f"{tally(outcome).throttled}"),
        ("records read / its schedule", lambda outcome: f"{tally(outcome).records / tally(outcome).scheduled:.3f}"),
        ("max lag s (behind its schedule)", lambda outcome: f"{tally(outcome).max_lag_seconds:.2f}"),
        ("lag at the end s", lambda outcome: f"{tally(outcome).end_lag_seconds:.2f}"),
        ("stand-in refusals poll/fan-out", refusals),
    ]
    for label, cell in rows:
        print(f"{label:<34}" + "".join(f"{cell(outcome):>28}" for outcome in others))
    if any(tally(outcome).at_tip for outcome in others):
        print("(the other consumer reached the end of the backlog: its figures are bound by that)")


def tally(outcome: CaseResult) -> PollerTally:
    assert outcome.other is not None
    return outcome.other


def run(arguments: argparse.Namespace, stack: ExitStack) -> None:
    prepare_environment()
    started = time.monotonic()
    moto = stack.enter_context(moto_server()).endpoint
    spec = StreamSpec(
        STREAM,
        shards=arguments.shards,
        records_per_shard=records_per_shard(arguments),
        record_bytes=arguments.record_bytes,
        backlog_seconds=arguments.seconds,
    )
    standin = stack.enter_context(KinesisStandIn([spec], Limits.off(), FanOutLimits()))
    spark = start_spark("bench-fan-out")
    stack.callback(spark.stop)

    def run_on_its_stand_in(case: Case) -> CaseResult:
        if case.fan_out is None:
            return run_case(spark, standin, moto, case, arguments)
        with KinesisStandIn([spec], case.limits, case.fan_out) as own:
            return run_case(spark, own, moto, case, arguments)

    kinesis = Limits()  # Kinesis' own: 5 calls/s, 2 MiB/s per shard, 10 MB and 10,000 records a call
    cases = [
        Case("pipeline, polling", "polling", Limits.off(), other_consumer=False),
        Case("pipeline, polling", "polling", Limits.off(), other_consumer=False),
        Case("pipeline, fan-out", "fan_out", Limits.off(), False, FanOutLimits(read_bytes_per_second=None)),
        Case("fan-out, alone", "fan_out", kinesis, other_consumer=False),
        Case(
            f"fan-out, {arguments.subscription_seconds:g} s subscriptions",
            "fan_out",
            kinesis,
            other_consumer=False,
            fan_out=FanOutLimits(subscription_seconds=arguments.subscription_seconds),
        ),
        Case("polling, alone", "polling", kinesis, other_consumer=False),
        Case("other consumer alone", None, kinesis, other_consumer=True),
        Case("beside a polling round", "polling", kinesis, other_consumer=True),
        Case("beside a fan-out round", "fan_out", kinesis, other_consumer=True),
    ]
    outcomes = [run_on_its_stand_in(case) for case in cases]
    # The first pipeline run also warms up the JVM and the Python workers: the faster one counts.
    outcomes = [min(outcomes[:2], key=lambda outcome: outcome.consume_seconds), *outcomes[2:]]
    print_round_table(outcomes, arguments)
    print_other_table(outcomes, arguments)
    print(f"\nwall time {time.monotonic() - started:.0f} s; every round landed every record exactly once")


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    with ExitStack() as stack:
        run(arguments, stack)


if __name__ == "__main__":
    main()
