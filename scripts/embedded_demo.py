"""The main job on the embedded default (README.md): the real DAG, operators and Spark job on loopback.

Starts moto (DynamoDB, S3) and kinesis-mock (Kinesis), points Airflow (in-process, SQLite, a
throwaway AIRFLOW_HOME) and Spark (`local[3,4]`, every slot at once; spark-submit) at them, creates
a 4-shard stream and
then, with a producer whose partition keys are skewed (a few hot keys carry most records):

    produce, round 1, split the hottest shard, produce, round 2,
    merge the two coldest adjacent shards, produce, round 3, round 4, round 5

Each round is one `dag.test()` run of `kinesis_lease_pipeline`. After each round it prints the task
states, per worker the leases and projected load of the assignment and what each lease consumed,
the records landed and the lag. The records land in an Apache Iceberg table of pyiceberg's SQL
catalog on a SQLite file (the catalog configured as a user configures pyiceberg, by environment
variables), one table commit per round. At the end it reads the whole table with pyiceberg and again
as an analyst would, with DuckDB, checks that every produced record landed exactly once in both
reads, shows the table's commits as any Iceberg client
shows them, and runs `leasectl verify` against the lease table (exit status 1 if anything fails).
The demo runs in a child of a small supervisor that stops every process it started on the way out,
on error, Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
from pyiceberg.catalog.sql import SqlCatalog

from devtools.airflow_env import REGION, home_environment, load_dag_module, migrate_metadata_db, run_environment
from devtools.analyst_reads import AnalystReadError, AnalystTable
from devtools.emulators import EmulatorProcess, kinesis_mock, moto_server
from devtools.kinesis_streams import create_stream, kinesis_client, merge_shards, open_shards, put_entries, split_shard
from devtools.stream_records import StreamRecord, analyst_table, landed_records
from sinks.table.committer import SUMMARY_RANGES, SUMMARY_ROUND
from sinks.table.iceberg import IcebergSink
from spark_jobs.leasectl import main as leasectl_main
from spark_jobs.round_report import RoundFigures

APPLICATION = "embedded-demo"
CATALOG = "demo"
TABLE_URI = f"iceberg://{CATALOG}/kinesis.orders"
STREAM = "embedded-demo-orders"
SHARDS = 4
WORKERS = 3
# The DAG's default: it equalises the slots' measured load from the second round on (bench/balance_pipeline.py).
STRATEGY = "makespan"
# Every slot at once, as a fleet of W workers runs (with fewer task slots they run in waves);
# ",4": Spark retries a failed slot task (plain local[N] never does).
SPARK_MASTER = f"local[{WORKERS},4]"
BATCHES = (4000, 3000, 3000)
# The hot keys and their share of the records; every other record gets a key of its own. On 4
# uniform shards customer-3 and customer-5 hash into the top shard, one in each half of its range
# (so splitting it at the midpoint separates them) and customer-1 into the third: shard 3 carries
# about two thirds of the traffic, shards 0 and 1 only the evenly spread rest.
HOT_KEYS = {"customer-3": 0.35, "customer-5": 0.30, "customer-1": 0.15}
PAYLOAD_PADDING = "x" * 160  # ~200-byte records, so the per-lease KB/s figures are not all zero
FAILED_STATES = {"failed", "upstream_failed"}


@dataclass(frozen=True)
class RoundResult:
    number: int
    run_id: str
    seconds: float
    states: dict[str, str]
    assignment: dict[str, Any] | None
    consumed: dict[str, Any] | None

    @property
    def succeeded(self) -> bool:
        return self.states.get("finalize_round") == "success" and not FAILED_STATES & set(self.states.values())


# --- processes and output --------------------------------------------------------------------------


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through `supervise`, which stops the demo's processes


def stop_tree(pid: int) -> None:
    """Stop process `pid` and every process under it, by PID: the demo first (so it starts nothing
    more), then the emulators and any spark-submit it left, which get a moment to exit cleanly."""
    try:
        root = psutil.Process(pid)
        descendants = root.children(recursive=True)
        root.kill()
    except psutil.NoSuchProcess:
        return  # it ended on its own, after stopping what it started
    for process in descendants:
        with suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(descendants, timeout=5)
    for process in alive:
        with suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs([root, *alive], timeout=5)


@contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send file descriptors 1 and 2 to `log`: Airflow's task logs and spark-submit's output are
    written there by this process and its children, which `contextlib.redirect_stdout` would miss."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for descriptor, original in zip((1, 2), saved):
                os.dup2(original, descriptor)
                os.close(original)


def short(shard_id: str) -> str:
    """`shardId-000000000004` as `4`: kinesis-mock numbers shards in order, so the number is enough."""
    return shard_id.removeprefix("shardId-").lstrip("0") or "0"


# --- Kinesis: the producer and the reshards --------------------------------------------------------


class SkewedProducer:
    """Puts records with unique payloads and skewed partition keys and keeps the ledger of what it put."""

    def __init__(self, kinesis: Any, stream: str, seed: int = 7) -> None:
        self.kinesis = kinesis
        self.stream = stream
        self.random = random.Random(seed)
        self.serials = itertools.count()
        self.ledger: list[StreamRecord] = []

    def produce(self, count: int) -> Counter[str]:
        """Put `count` records; how many went to each shard."""
        # The hot shard refuses entries beyond its write limit: a longer pause lets it catch up.
        written = put_entries(self.kinesis, self.stream, [self._entry() for _ in range(count)], retry_pause_seconds=0.2)
        records = [StreamRecord.acknowledged(entry, result) for entry, result in written]
        self.ledger += records
        return Counter(record.shard_id for record in records)

    def _entry(self) -> dict[str, Any]:
        serial = next(self.serials)
        key = self._key(serial)
        payload = {"order": serial, "customer": key, "padding": PAYLOAD_PADDING}
        return {"Data": json.dumps(payload).encode(), "PartitionKey": key}

    def _key(self, serial: int) -> str:
        draw = self.random.random()
        for key, share in HOT_KEYS.items():
            if draw < share:
                return key
            draw -= share
        return hashlib.sha1(str(serial).encode()).hexdigest()[:12]


def split_hottest(kinesis: Any, stream: str, load: Counter[str]) -> None:
    """Split the open shard that took the most records of the last batch at its hash-range midpoint."""
    shard_id = max(open_shards(kinesis, stream), key=lambda shard: load[shard.shard_id]).shard_id
    children = ", ".join(short(child) for child in split_shard(kinesis, stream, shard_id))
    print(
        f"\n>> split the hottest shard {short(shard_id)} ({load[shard_id]} records of the last batch) into {children}"
    )


def merge_coldest(kinesis: Any, stream: str, load: Counter[str]) -> None:
    """Merge the two adjacent open shards that together took the fewest records of the last batch."""
    pairs = itertools.pairwise(shard.shard_id for shard in open_shards(kinesis, stream))
    lower, upper = min(pairs, key=lambda pair: load[pair[0]] + load[pair[1]])
    child = merge_shards(kinesis, stream, lower, upper)
    print(
        f"\n>> merged the coldest adjacent shards {short(lower)} + {short(upper)} "
        f"({load[lower]} + {load[upper]} records of the last batch) into {short(child)}"
    )


def print_batch(count: int, load: Counter[str]) -> None:
    spread = ", ".join(f"{short(shard)}: {records}" for shard, records in sorted(load.items()))
    print(
        f"\n>> produced {count} records (~{sum(HOT_KEYS.values()):.0%} on {len(HOT_KEYS)} hot keys); per shard {spread}"
    )


# --- Airflow ---------------------------------------------------------------------------------------


def airflow_environment(home: Path, moto: str, kinesis: str) -> dict[str, str]:
    """What Airflow must see before it is first imported, and what spark-submit and boto3 need."""
    spark = {"conn_type": "spark", "host": SPARK_MASTER}
    return {
        **home_environment(home),
        **run_environment(kinesis, moto, spark, credentials="embedded"),
        # Dummy credentials: the embedded default must never reach a real AWS account.
        "AWS_ACCESS_KEY_ID": "embedded",
        "AWS_SECRET_ACCESS_KEY": "embedded",
        "AWS_DEFAULT_REGION": REGION,
    }


def prepare_airflow(home: Path, moto: str, kinesis: str) -> None:
    for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        os.environ.pop(variable, None)
    os.environ.update(airflow_environment(home, moto, kinesis))
    migrate_metadata_db()


def run_round(dag: Any, conf: Mapping[str, Any], number: int, log: Path) -> RoundResult:
    started = time.monotonic()
    with output_to(log):
        run = dag.test(run_conf=dict(conf))
    instances = {ti.task_id: ti for ti in run.get_task_instances()}
    return RoundResult(
        number=number,
        run_id=run.run_id,
        seconds=time.monotonic() - started,
        states={task_id: str(ti.state) for task_id, ti in instances.items()},
        assignment=return_value(instances["assign_leases"]),
        consumed=return_value(instances["consume"]),
    )


def return_value(ti: Any) -> Any:
    """A task's XCom as the task returned it: pulled from the metadata DB outside a task, the value
    still carries Airflow's encoding of nested tuples, which `deserialize` undoes."""
    from airflow.sdk.serde import deserialize  # not at the top: Airflow reads its settings on first import

    value = ti.xcom_pull(task_ids=ti.task_id)
    return None if value is None else deserialize(value)


# --- what a round did ------------------------------------------------------------------------------


def print_round(result: RoundResult, landed_so_far: int, produced_so_far: int) -> None:
    verdict = "succeeded" if result.succeeded else "FAILED"
    print(f"\n== round {result.number}: DAG run {result.run_id} {verdict} in {result.seconds:.1f} s")
    print(f"   tasks: {task_states(result.states)}")
    if result.assignment is not None:
        print_assignment(result.assignment, result.consumed)
    print_consumed(result.consumed, landed_so_far, produced_so_far)


def task_states(states: Mapping[str, str]) -> str:
    by_state: dict[str, list[str]] = {}
    for task_id, state in states.items():
        by_state.setdefault(state, []).append(task_id)
    return "; ".join(
        f"{state} {len(tasks)}" + ("" if state == "success" else f" ({', '.join(tasks)})")
        for state, tasks in by_state.items()
    )


def print_assignment(assignment: Mapping[str, Any], consumed: Mapping[str, Any] | None) -> None:
    moves = Counter(move["reason"] for move in assignment["moves"] if move["applied"])
    moved = ", ".join(f"{count} {reason}" for reason, count in moves.items()) or "none"
    print(f"   assignment round {assignment['round_number']} ({assignment['strategy']}): moves {moved}")
    print(f"   {'worker':<24}{'leases':>10}{'projected KB/s':>18}   consumed this round (records, outcome)")
    rows = (consumed or {}).get("leases", [])
    for worker in assignment["workers"]:
        leases = (
            ", ".join(
                f"{short(row['shard_id'])}: {row['records']} {row['outcome']}"
                for row in sorted(rows, key=lambda row: row["shard_id"])
                if row["worker_id"] == worker["worker_id"]
            )
            or "-"
        )
        counts = f"{worker['leases_before']} -> {worker['leases_after']}"
        load = f"{worker['load_before_kbps']:.1f} -> {worker['load_after_kbps']:.1f}"
        note = f"  [{worker['note']}]" if worker["note"] else ""
        print(f"   {worker['worker_id']:<24}{counts:>10}{load:>18}   {leases}{note}")


def print_consumed(consumed: Mapping[str, Any] | None, landed_so_far: int, produced_so_far: int) -> None:
    backlog = f"backlog {produced_so_far - landed_so_far} of {produced_so_far} produced records not landed yet"
    if consumed is None:
        print(f"   consume skipped: no lease had new records; {backlog}")
        return
    figures = RoundFigures.from_dict(consumed, "the consume step's XCom")
    totals, lag = figures.totals, figures.totals.max_millis_behind_latest
    print(f"   landed {totals.records} records in {totals.files} batch(es), {figures.seconds:.1f} s in Spark")
    publication = figures.publication
    if publication is not None and publication.error:
        print(f"   NOT VISIBLE YET: the round's table commit failed: {publication.error}")
    elif publication is not None and publication.commits:
        print(
            f"   table commit: {publication.batches_published} batch(es) visible in snapshot {publication.snapshot_id}"
        )
    ratio = totals.busiest_over_bound
    if ratio is not None:
        print(f"   balance: the busiest slot landed {ratio:.2f}x the lower bound max(total / W, largest lease)")
    print(f"   lag: max MillisBehindLatest {lag} ms (kinesis-mock always reports 0); {backlog}")


# --- the whole demo --------------------------------------------------------------------------------


def exactly_once(
    produced: list[StreamRecord], landed: list[StreamRecord], analyst: AnalystTable | None, rounds: list[RoundResult]
) -> bool:
    """Every produced record once in the table as pyiceberg reads it (`landed`), and as DuckDB reads it."""
    duplicated, missing, unexpected = tally(produced, landed)
    failed = [result.number for result in rounds if not result.succeeded]
    print(f"\n== exactly-once check over the whole table {TABLE_URI}")
    print(
        f"   read with pyiceberg: produced {len(produced)}, landed {len(landed)}, duplicated {duplicated}, "
        f"missing {missing}, unexpected {unexpected}, failed rounds {failed or 'none'}"
    )
    passed = duplicated == missing == unexpected == 0 and not failed
    passed = read_by_duckdb(produced, analyst) and passed
    print(
        "   PASS: every produced record landed exactly once"
        if passed
        else "   FAIL: the table does not hold every produced record exactly once, or a round failed"
    )
    return passed


def read_by_duckdb(produced: list[StreamRecord], analyst: AnalystTable | None) -> bool:
    """The table read again as an analyst reads it, with DuckDB (None: no table): every produced record once."""
    try:
        read = [] if analyst is None else analyst.identities()
        rows = 0 if analyst is None else analyst.count()
    except AnalystReadError as error:
        print(f"   read with DuckDB: {error}")
        return False
    identities = [(record.shard_id, record.sequence_number, record.sub_sequence_number) for record in produced]
    duplicated, missing, unexpected = tally(identities, [(shard, sequence, sub) for _, shard, sequence, sub in read])
    print(
        f"   read with DuckDB's iceberg_scan: {rows} rows, duplicated {duplicated}, missing {missing}, "
        f"unexpected {unexpected}"
    )
    return duplicated == missing == unexpected == 0 and rows == len(produced)


def tally(produced: Sequence[Hashable], landed: Sequence[Hashable]) -> tuple[int, int, int]:
    """The landed records' extra copies, the produced records not landed, the landed ones not produced."""
    counts = Counter(landed)
    duplicated = sum(count - 1 for count in counts.values() if count > 1)
    return duplicated, len(set(produced) - set(counts)), len(set(counts) - set(produced))


class EmbeddedDemo:
    def __init__(self, dag: Any, kinesis: Any, workdir: Path, endpoints: tuple[str, str]) -> None:
        self.dag = dag
        self.endpoints = endpoints  # moto's and kinesis-mock's
        self.kinesis = kinesis
        self.output_uri = TABLE_URI
        self.log = workdir / "rounds.log"
        self.producer = SkewedProducer(kinesis, STREAM)
        self.rounds: list[RoundResult] = []
        self.conf = {
            "streams": [STREAM],
            "application_name": APPLICATION,
            "num_workers": WORKERS,
            "initial_position": "TRIM_HORIZON",
            "output_uri": self.output_uri,
            "lease_assignment_strategy": STRATEGY,
        }

    def run(self) -> bool:
        create_stream(self.kinesis, STREAM, SHARDS)
        print(f"stream {STREAM}: {SHARDS} shards; application {APPLICATION}: {WORKERS} workers, {STRATEGY} assignment")
        first, second, third = BATCHES
        load = self.produce(first)
        self.round()
        split_hottest(self.kinesis, STREAM, load)
        load = self.produce(second)
        self.round()
        merge_coldest(self.kinesis, STREAM, load)
        self.produce(third)
        self.round()
        # Round 3 finishes the merge's parents, round 4 leases and reads their child, round 5 finds
        # nothing new and skips the consume step.
        self.round()
        self.round()
        landed = landed_records(self.output_uri)
        passed = exactly_once(self.producer.ledger, landed, analyst_table(self.output_uri), self.rounds)
        print_table_commits(self.output_uri)
        return verify_against_the_lease_table(self.output_uri, *self.endpoints) and passed

    def produce(self, count: int) -> Counter[str]:
        load = self.producer.produce(count)
        print_batch(count, load)
        return load

    def round(self) -> None:
        result = run_round(self.dag, self.conf, len(self.rounds) + 1, self.log)
        self.rounds.append(result)
        print_round(result, len(landed_records(self.output_uri)), len(self.producer.ledger))


def print_table_commits(uri: str) -> None:
    """The table's snapshots as Athena's or Trino's `$snapshots` table shows them: what each commit added."""
    table = IcebergSink(uri, APPLICATION).table(refresh=True)
    print(f"\n== the table's commits ({uri}, at {table.metadata.location if table else '?'})")
    for snapshot in table.snapshots() if table else ():
        summary = snapshot.summary
        if summary is None or summary.get(SUMMARY_ROUND) is None:
            continue
        ranges = summary.get(SUMMARY_RANGES, "").split("; ")
        print(
            f"   snapshot {snapshot.snapshot_id}: round {summary[SUMMARY_ROUND]}, "
            f"{summary.get('added-records', '?')} records in {len(ranges)} batch(es), e.g. {ranges[0]}"
        )


def verify_against_the_lease_table(uri: str, moto: str, kinesis: str) -> bool:
    print("\n== leasectl verify: the table's record of what landed against the lease checkpoints")
    endpoints = [f"aws_endpoint_url_dynamodb={moto}", f"aws_endpoint_url_kinesis={kinesis}", f"aws_region={REGION}"]
    settings = [argument for setting in endpoints for argument in ("--set", setting)]
    return leasectl_main(["--app", APPLICATION, *settings, "verify", "--output-uri", uri]) == 0


def configure_catalog(workdir: Path) -> None:
    """pyiceberg's SQL catalog on a SQLite file, configured by environment variables (as a user would,
    or in .pyiceberg.yaml), with the table's namespace."""
    properties = {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db", "warehouse": f"file://{workdir}/warehouse"}
    for key, value in properties.items():
        os.environ[f"PYICEBERG_CATALOG__{CATALOG.upper()}__{key.upper()}"] = value
    SqlCatalog(CATALOG, **properties).create_namespace("kinesis")


def run_demo(workdir: Path) -> bool:
    with moto_server() as moto, kinesis_mock() as kinesis:
        print_emulators(moto, kinesis)
        started = time.monotonic()
        configure_catalog(workdir)
        prepare_airflow(workdir / "airflow", moto.endpoint, kinesis.endpoint)
        with output_to(workdir / "rounds.log"):
            dag = load_dag_module("kinesis_lease_pipeline").dag
        print(
            f"Airflow: metadata DB (SQLite) migrated and DAG {dag.dag_id} loaded in "
            f"{time.monotonic() - started:.1f} s; "
            f"Spark master {SPARK_MASTER}"
        )
        return EmbeddedDemo(dag, kinesis_client(kinesis.endpoint), workdir, (moto.endpoint, kinesis.endpoint)).run()


def print_emulators(moto: EmulatorProcess, kinesis: EmulatorProcess) -> None:
    print(f"moto (DynamoDB, S3) on {moto.endpoint}, pid {moto.pid}")
    print(f"kinesis-mock (Kinesis) on {kinesis.endpoint}, pid {kinesis.pid}")


def supervise() -> int:
    """Run the demo in a child process, and stop it and everything it started however this one ends.

    The process running the DAG cannot be relied on to stop itself: inside a round, Airflow's
    in-process task runner owns SIGTERM (it only calls the operator's on_kill) and turns Ctrl-C into
    a failed try that it retries after a delay.
    """
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="embedded-demo-"))
    demo = subprocess.Popen([sys.executable, __file__, str(workdir)])
    status = 1
    try:
        status = demo.wait()
    except KeyboardInterrupt:
        status = 130
        print("\ninterrupted", flush=True)
    finally:
        stop_tree(demo.pid)
        if status == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"\nkept {workdir} for a look: rounds.log (Airflow and Spark output), warehouse/ (the table)")
        print(f"\nevery process the demo started is stopped; {time.monotonic() - started:.0f} s in all", flush=True)
    return status


def main(argv: list[str]) -> int:
    if argv:  # the child `supervise` starts, given its work directory
        return 0 if run_demo(Path(argv[0])) else 1
    return supervise()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
