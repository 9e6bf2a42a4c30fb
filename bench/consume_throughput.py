"""Benchmark: records/s of the consume job against a plain boto3 loop, on the local emulators.

Method. The run starts its own moto (DynamoDB) and kinesis-mock (Kinesis) on loopback, creates one
stream of S shards and puts N records of ~200 bytes on spread-out partition keys. The baseline is
the least a consumer can do: one thread, one shard after the other, GetShardIterator TRIM_HORIZON
then GetRecords (Limit 10000) until the shard's records are read, nothing written anywhere.
Then, for W = 1, 2, 4 slots, a fresh application (own tables) runs one full round as a DAG run
would: shard sync at TRIM_HORIZON, an assignment round over `<app>-worker-0..W-1`, and the consume
job's `run_round` on one shared SparkSession. Two times are kept: `run_round` alone (the Spark
part) and the full round (sync + assign + consume). The session and one untimed warm-up round (on
a throwaway application) come first, so JVM and Python-worker start-up are not charged to W=1.
Every W run must land exactly the N records written (same shard and sequence numbers); the run
fails loudly otherwise. The baseline and the W runs are repeated (interleaved, --repeats, default
3) and the best of each is reported, as the machine is shared and a neighbour's burst of CPU is
noise, not a property of the job. Last, the W=2 application of the last repeat, caught up, runs 3
more full rounds with no new records: the fixed cost of a round with nothing to do (median).

Reading the ratios. Both sides read from the same emulator, which is the bottleneck:
- kinesis-mock serves GetRecords at ~8,600 records/s (STACK.md) from one Node.js event loop, so
  more concurrent readers do not make it faster. The boto3 loop gets close to that figure; the job
  cannot beat it, whatever W is. A slot already reads its leases on 8 threads, so W=1 is not a
  serial reader either.
- The job does more per record: it deaggregates, builds an Arrow table and writes one Parquet file
  per batch (atomic rename), and per lease and batch it pays DynamoDB calls (claim, heartbeats,
  prepare, commit, throughput renewal, worker metrics) to moto, which handles ~300-430 conditional
  writes/s, serialised. Its reader also paces GetRecords at Kinesis' 5 calls/s per shard.
- Spark adds task scheduling and pickling of the spec and reports per round (fractions of a second
  once warm). `local[*]` on this 2-core machine runs 2 tasks at a time, so W=4 runs in two waves.
- The full round adds shard sync and assignment: a handful of ListShards and DynamoDB calls, which
  the idle-round table isolates.
So a ratio well below 1 measures the emulators and the round's fixed costs, not what the job would
do against real Kinesis (2 MB/s of reads per shard, DynamoDB in single-digit milliseconds).

Run: .venv/bin/python bench/consume_throughput.py [--records N] [--shards S] [--repeats R]
(defaults 20,000 records, 8 shards, 3 repeats: about 2 minutes on 2 cores, 20 s of it PutRecords).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import boto3  # noqa: E402
import botocore.exceptions  # noqa: E402

from devtools.emulators import KINESIS_MOCK_HOME, kinesis_mock, moto_server  # noqa: E402
from devtools.kinesis_streams import create_stream, put_entries  # noqa: E402
from devtools.local_spark import loopback_session  # noqa: E402
from devtools.stream_records import landed_records  # noqa: E402
from lease_core import aws  # noqa: E402
from lease_core.config.settings import ConsumerConfig  # noqa: E402
from lease_core.leader.assignment_round import AssignmentCoordinator, AssignmentReport, slot_ids  # noqa: E402
from lease_core.metrics.worker_metrics import DynamoDBWorkerMetricsStore  # noqa: E402
from lease_core.retrieval.shard_source import KinesisShardSource  # noqa: E402
from lease_core.store.coordinator_state import DynamoDBCoordinatorStateStore  # noqa: E402
from lease_core.store.dynamodb_store import DynamoDBLeaseStore  # noqa: E402
from lease_core.store.tables import TableAdministrator  # noqa: E402
from lease_core.sync.step import sync_streams  # noqa: E402
from spark_jobs.consume_job import run_round  # noqa: E402
from spark_jobs.consume_spec import ConsumeSpec  # noqa: E402
from spark_jobs.round_report import RoundReport  # noqa: E402

REGION = "us-east-1"
STREAM = "bench-consume"
PAYLOAD_BYTES = 200
GET_RECORDS_LIMIT = 10000
WORKER_COUNTS = (1, 2, 4)
IDLE_ROUNDS = 3
IDLE_WORKERS = 2
THROTTLE_PAUSE_SECONDS = 0.2

T = TypeVar("T")
Position = tuple[str, str]  # (shard id, sequence number): a record's identity in the stream


class BenchmarkFailure(RuntimeError):
    """The job did not land what was written: the numbers would mean nothing."""


def prepare_environment() -> None:
    """Dummy credentials and loopback Spark, set before any emulator, client or JVM starts.

    They are assigned, not defaulted, so no real credentials from the caller's shell are ever used.
    The JVM and its Python workers inherit the environment as it is when the session starts.
    """
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        PYSPARK_PYTHON=sys.executable,  # otherwise workers silently run the system Python (STACK.md)
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    # Executors and the moto child import this repository whatever the working directory is.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))


def timed(function: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


# --- the stream ----------------------------------------------------------------------------------


def payload(index: int) -> bytes:
    return f"record-{index:09d}-".encode().ljust(PAYLOAD_BYTES, b".")


def put_all(kinesis: Any, count: int) -> set[Position]:
    """Put `count` records; what was written."""
    entries = ({"Data": payload(index), "PartitionKey": f"key-{index}"} for index in range(count))
    return positions(put_entries(kinesis, STREAM, entries))


def positions(written: list[tuple[dict[str, Any], dict[str, Any]]]) -> set[Position]:
    """The positions of the written entries (`put_entries`' answer)."""
    return {(result["ShardId"], result["SequenceNumber"]) for _, result in written}


def per_shard(written: set[Position]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for shard_id, _ in written:
        counts[shard_id] = counts.get(shard_id, 0) + 1
    return counts


# --- the baseline ---------------------------------------------------------------------------------


def get_records(kinesis: Any, iterator: str) -> dict[str, Any]:
    """GetRecords, waiting out throttling (the baseline must read everything, not fail)."""
    while True:
        try:
            return kinesis.get_records(ShardIterator=iterator, Limit=GET_RECORDS_LIMIT)
        except botocore.exceptions.ClientError as error:
            if error.response["Error"]["Code"] != "ProvisionedThroughputExceededException":
                raise
            time.sleep(THROTTLE_PAUSE_SECONDS)


def read_shard(kinesis: Any, shard_id: str, expected: int) -> int:
    """Records read from the shard's trim horizon until its written records are all in.

    kinesis-mock answers MillisBehindLatest 0 on every response, so the tip is a response shorter
    than the Limit asked for, or the count the producer saw, whichever comes first.
    """
    iterator = kinesis.get_shard_iterator(StreamName=STREAM, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")[
        "ShardIterator"
    ]
    read = 0
    while iterator and read < expected:
        response = get_records(kinesis, iterator)
        read += len(response["Records"])
        if len(response["Records"]) < GET_RECORDS_LIMIT:
            break
        iterator = response.get("NextShardIterator")
    return read


def boto3_loop(kinesis: Any, expected: dict[str, int]) -> int:
    shard_ids = [shard["ShardId"] for shard in kinesis.list_shards(StreamName=STREAM)["Shards"]]
    return sum(read_shard(kinesis, shard_id, expected.get(shard_id, 0)) for shard_id in shard_ids)


# --- the job --------------------------------------------------------------------------------------


def start_spark() -> Any:
    # Spark's progress bars would garble the tables.
    return loopback_session("local[*]", "bench-consume-throughput", {"spark.ui.showConsoleProgress": "false"})


@dataclass(frozen=True)
class RoundTimes:
    sync: float
    assign: float
    consume: float
    report: RoundReport
    assignment: AssignmentReport

    @property
    def full(self) -> float:
        return self.sync + self.assign + self.consume


class Application:
    """One consumer application on the emulators: its tables, stores, and what a DAG run does."""

    def __init__(
        self,
        label: str,
        moto_endpoint: str,
        kinesis_endpoint: str,
        output_uri: str,
        stream: str = STREAM,
        **settings: Any,
    ) -> None:
        self.output_uri = output_uri
        self.stream = stream
        self.config = ConsumerConfig(
            application_name=f"bench-{label}-{uuid.uuid4().hex[:8]}",  # fresh tables every run
            aws_region=REGION,
            aws_endpoint_url_dynamodb=moto_endpoint,
            aws_endpoint_url_kinesis=kinesis_endpoint,
            initial_position_in_stream="TRIM_HORIZON",
            table_status_poll_seconds=0.05,  # moto creates tables ACTIVE: no need for KCL's 10 s polls
            **settings,
        )
        policy = aws.retry_policy(self.config)
        dynamodb = aws.client("dynamodb", self.config)
        TableAdministrator(dynamodb, self.config, retry_policy=policy).ensure_tables()
        self.store = DynamoDBLeaseStore(dynamodb, self.config.lease_table, retry_policy=policy)
        self.state = DynamoDBCoordinatorStateStore(dynamodb, self.config.coordinator_state_table, policy)
        self.metrics = DynamoDBWorkerMetricsStore(dynamodb, self.config.worker_metrics_table, retry_policy=policy)
        self.source = KinesisShardSource(aws.client("kinesis", self.config), retry_policy=policy)

    @property
    def name(self) -> str:
        return self.config.require_application_name()

    def round(self, spark: Any, workers: int) -> RoundTimes:
        """Shard sync, assignment and the consume step, each timed; a failed round stops the run."""
        sync_seconds, _ = timed(lambda: sync_streams((self.stream,), self.config, self.store, self.source, self.state))
        coordinator = AssignmentCoordinator(self.store, self.metrics, self.state, self.config)
        assign_seconds, assignment = timed(lambda: coordinator.run(slot_ids(self.name, workers)))
        spec = ConsumeSpec(
            streams=(self.stream,),
            num_workers=workers,
            output_uri=self.output_uri,
            round_number=assignment.round_number,
            settings=self.config.to_dict(),
        )
        consume_seconds, report = timed(lambda: run_round(spark, spec))
        if not report.succeeded:
            raise BenchmarkFailure(f"round {assignment.round_number} of {self.name} failed:\n{report.summary()}")
        return RoundTimes(sync_seconds, assign_seconds, consume_seconds, report, assignment)

    def check_landed(self, written: set[Position]) -> None:
        """Exactly the written records are in the sink: none missing, none twice, none foreign."""
        landed = [(record.shard_id, record.sequence_number) for record in landed_records(self.output_uri)]
        if len(landed) != len(written) or set(landed) != written:
            missing, extra = len(written - set(landed)), len(set(landed) - written)
            raise BenchmarkFailure(
                f"{self.name}: {len(landed)} rows landed for {len(written)} written "
                f"({missing} missing, {extra} not written, {len(landed) - len(set(landed))} duplicated)"
            )


# --- reporting ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    case: str
    records: int
    seconds: float


def print_throughput(rows: list[Row]) -> None:
    baseline = rows[0].records / rows[0].seconds
    print("| case | records | seconds | records/s | ratio vs boto3 loop |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        rate = row.records / row.seconds
        print(f"| {row.case} | {row.records:,} | {row.seconds:.2f} | {rate:,.0f} | {rate / baseline:.2f} |")


def print_idle(rounds: list[RoundTimes]) -> None:
    print(f"| idle round (W={IDLE_WORKERS}, caught up, no new records) | median seconds of {len(rounds)} |")
    print("|---|---:|")
    steps: list[tuple[str, Callable[[RoundTimes], float]]] = [
        ("full round (sync + assign + consume)", lambda r: r.full),
        ("shard sync", lambda r: r.sync),
        ("assignment", lambda r: r.assign),
        ("consume (`run_round`)", lambda r: r.consume),
    ]
    for name, step in steps:
        print(f"| {name} | {statistics.median(step(r) for r in rounds):.2f} |")


def machine_facts() -> str:
    mock = json.loads((KINESIS_MOCK_HOME / "package.json").read_text()).get("version", "?")
    return (
        f"machine: {os.cpu_count()} cores; Python {sys.version.split()[0]}, pyspark {version('pyspark')} "
        f"(local[*]); emulators: kinesis-mock {mock} (Kinesis), moto {version('moto')} (DynamoDB)"
    )


# --- the run --------------------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="records to put (default 20,000)")
    parser.add_argument("--shards", type=int, default=8, help="shards of the stream (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each case, best reported (default 3)")
    arguments = parser.parse_args(argv)
    if min(arguments.records, arguments.shards, arguments.repeats) < 1:
        parser.error("--records, --shards and --repeats must be at least 1")
    return arguments


@dataclass
class Measurements:
    """Seconds of every repeat, by case; the table reports the best of each (the least disturbed)."""

    seconds: dict[str, list[float]]

    def add(self, case: str, seconds: float) -> None:
        self.seconds.setdefault(case, []).append(seconds)

    def rows(self, records: int) -> list[Row]:
        return [Row(case, records, min(values)) for case, values in self.seconds.items()]


def measure_baseline(kinesis: Any, written: set[Position], measurements: Measurements) -> None:
    seconds, read = timed(lambda: boto3_loop(kinesis, per_shard(written)))
    if read != len(written):
        raise BenchmarkFailure(f"the boto3 loop read {read} records, {len(written)} were written")
    measurements.add("boto3 loop, 1 thread (baseline)", seconds)


def measure_job(
    spark: Any,
    endpoints: tuple[str, str],
    output: Path,
    workers: int,
    written: set[Position],
    measurements: Measurements,
) -> Application:
    """A fresh application with W slots, one full round, checked against what was written."""
    application = Application(f"w{workers}", *endpoints, str(output))
    times = application.round(spark, workers)
    application.check_landed(written)
    measurements.add(f"job W={workers}, consume (`run_round`)", times.consume)
    measurements.add(f"job W={workers}, full round (sync + assign + consume)", times.full)
    return application


def measure_idle(spark: Any, application: Application, written: set[Position]) -> list[RoundTimes]:
    """Full rounds of a caught-up application: they must land nothing and leave the sink as it was."""
    rounds = [application.round(spark, IDLE_WORKERS) for _ in range(IDLE_ROUNDS)]
    if any(times.report.totals.records for times in rounds):
        raise BenchmarkFailure("an idle round landed records although none were written")
    application.check_landed(written)
    return rounds


def run(arguments: argparse.Namespace, stack: ExitStack) -> None:
    started = time.perf_counter()
    moto = stack.enter_context(moto_server())
    mock = stack.enter_context(kinesis_mock())
    scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-consume-")))
    kinesis = boto3.client("kinesis", endpoint_url=mock.endpoint, region_name=REGION)
    create_stream(kinesis, STREAM, arguments.shards)
    put_seconds, written = timed(lambda: put_all(kinesis, arguments.records))
    print(
        f"stream {STREAM}: {arguments.shards} shards, {len(written):,} records of {PAYLOAD_BYTES} B "
        f"put in {put_seconds:.1f} s ({len(written) / put_seconds:,.0f} records/s)"
    )

    endpoints = (moto.endpoint, mock.endpoint)
    spark = start_spark()
    stack.callback(spark.stop)
    warm_up = Application("warmup", *endpoints, str(scratch / "warmup"))
    warm_seconds, _ = timed(lambda: warm_up.round(spark, max(WORKER_COUNTS)))
    print(f"SparkSession ready; untimed warm-up round (W={max(WORKER_COUNTS)}) took {warm_seconds:.1f} s")

    # Repeats interleave the cases, so that a burst of load from elsewhere on the machine spoils
    # one repeat of several cases rather than every repeat of one case. The baseline also runs
    # after the warm-up: both sides read from an emulator that has already served reads.
    measurements = Measurements({})
    applications: dict[int, Application] = {}
    for repeat in range(arguments.repeats):
        measure_baseline(kinesis, written, measurements)
        for workers in WORKER_COUNTS:
            output = scratch / f"r{repeat}-w{workers}"
            applications[workers] = measure_job(spark, endpoints, output, workers, written, measurements)
    idle = measure_idle(spark, applications[IDLE_WORKERS], written)

    print(f"\nbest of {arguments.repeats} repeats; every job run landed exactly the {len(written):,} records written\n")
    print_throughput(measurements.rows(len(written)))
    print()
    print_idle(idle)
    print()
    print(machine_facts())
    print(f"whole run: {time.perf_counter() - started:.0f} s")


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    prepare_environment()
    with ExitStack() as stack:  # unwinds Spark, the scratch directory, then the emulators (by PID)
        run(arguments, stack)


if __name__ == "__main__":
    main()
