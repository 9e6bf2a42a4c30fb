"""Benchmark: the CPU a slot spends per megabyte it lands, against a bare boto3 loop, and how slots scale.

Method. The Kinesis stand-in (devtools/kinesis_standin.py, limits off) serves two streams of S shards
x N records of --record-bytes: one of plain records, one of KPL aggregates of --aggregate user records
each. moto serves DynamoDB. Both run in processes of their own, so this process's CPU time
(getrusage, every thread) is the reader's alone.
1. Baseline, per stream: the least a consumer can do with boto3: one thread, one shard after the
   other, GetShardIterator TRIM_HORIZON, then GetRecords (Limit 10000) to the end of the shard, with
   a client as boto3 makes it (botocore's own response parser). Nothing is written anywhere.
2. The slot pipeline, per stream: a fresh application (own tables, own output), synced at
   TRIM_HORIZON and assigned to one slot, then `run_slot(spec, 0)`: what a Spark Python worker runs
   for slot 0. It claims the leases, reads them all at once (GetRecords, decoding, deaggregation),
   builds Arrow tables, writes Parquet with zstd, stages and publishes the files, prepares and commits
   checkpoints in DynamoDB, heartbeats, and reports throughput and its worker metrics. Every record
   must land once. The same slot again with an Iceberg table as the sink (pyiceberg's SQL catalog on
   a SQLite file): it writes the batches' data files, manifests and receipts; the round's one table
   commit is the driver's, after the slot, and not counted. The table is there before the slot, as the
   consume operator creates it before it submits a round (the round report's place), with the columns
   of the batches, as every round after a table's first finds it: neither its creation nor the first
   batch's schema change is counted. Then again with a Delta table as the sink (`delta:<local folder>`,
   through delta-rs): it writes the batches' data files and receipts; the round's one table commit is
   again the driver's and not counted, and what landed is read from the files the table's version
   names, with pyarrow. Every slot is given the streams' incarnations, as the driver gives them. The
   ratios Iceberg / Parquet slot and Delta / Parquet slot are the sinks' own figures (goal >= 0.9 each).
3. The floor, per stream: the essential work on the same bytes, in this process, with the libraries the
   pipeline uses, on the GetRecords bodies the stand-in serves (captured raw, unparsed, before the
   runs): `json.loads` of each body, base64 decoding of every record's data (`binascii.a2b_base64`,
   what botocore and the standard library do), building the batch's Arrow table (the sinks' record
   columns), writing it as Parquet with zstd (the Parquet sink's options), and, on KPL aggregates,
   the MD5 digest of every aggregate's message (KCL's check). Nothing else: no iterator calls, no
   deaggregation, no checkpoints. The same floor is also printed with msgspec's decoder (the JSON
   parse and the base64 in one C pass, what the slot's reader uses) in place of `json.loads` and
   `binascii`. Goals: the plain slot >= 2x the boto3 loop and >= 0.6 of the floor; on KPL aggregates
   >= 1.5x the boto3 loop that deaggregates.
This process's glibc holds freed memory for its next blocks, as a slot's process does
(spark_jobs.slot_memory): the slot, the loop and the floor alike (the loop costs the same without).
The runs are interleaved --repeats times and the least CPU of each is kept (a neighbour's burst is
noise). MB/s per core = payload MiB / CPU seconds. The ratio pipeline / baseline is the figure (goal
>= 0.8): the pipeline does everything the baseline does and writes the data too. On KPL aggregates
the baseline also deaggregates every response with aws_kinesis_agg, as a hand-written consumer would.
The stand-in's limits are off, and so is the readers' pacing by bytes (`shard_read_limit_kbps`).
4. Scaling (unless --no-scaling): one SparkSession on local[2], and a round of the plain stream (fresh application) run
   with 1 slot, then with 2: `run_round`'s wall time, best of --repeats. The goal is 2 slots >= 1.8x
   one. The stand-in and moto share the machine's 2 cores with the slots: their CPU seconds during each
   round are printed, since a core they use is not the slots', and so is how many of the machine's
   cores were busy: a slot alone already uses more than one (its threads release the interpreter in
   socket reads, zstd, MD5), which bounds what a second slot can add on a 2-core machine.

5. Memory (only with --peak-rss, which runs nothing else): one slot on a catch-up of --rss-shards shards
   (64), each holding --rss-mib MiB (8) of backlog, plain records and KPL aggregates, limits and pacing
   off (everything arrives as fast as the slot can take it: the most a slot ever holds). `run_slot` runs
   in a fresh process of its own (spawned: nothing of this one's), with `slot_buffer_bytes` at each of
   --slot-buffer-mib (256, the default, and 64), after a slot on a small stream (what a slot loads once),
   with ARROW_DEFAULT_MEMORY_POOL in its environment as the consume job gives its executors (system),
   unless the command line sets it (mimalloc: pyarrow's default, as before 2026-11-27).
   The process reports its RSS when the slot starts and its peak RSS (VmHWM, reset then) while it runs;
   what the slot added is the figure, against `slot_buffer_bytes`.

Run: .venv/bin/python bench/pipeline_cpu.py [--shards 8] [--records 16000] [--record-bytes 750] [--no-scaling]
(about 1.5 minutes on 2 cores with the defaults); .venv/bin/python bench/pipeline_cpu.py --peak-rss
(about 2 minutes).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
# The slots here run in this process: Arrow's allocator as the consume job gives its executors
# (spark_jobs.slot_memory), read by pyarrow when it is first imported. Set it to measure another.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

import boto3  # noqa: E402
import botocore.config  # noqa: E402
import msgspec  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
from aws_kinesis_agg import DIGEST_SIZE as KPL_DIGEST_SIZE  # noqa: E402
from aws_kinesis_agg import MAGIC as KPL_MAGIC  # noqa: E402
from aws_kinesis_agg.deaggregator import iter_deaggregate_records  # noqa: E402
from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

from bench.harness import REGION, Application, BenchmarkFailure, prepare_environment, start_spark  # noqa: E402
from devtools.emulators import moto_server  # noqa: E402
from devtools.kinesis_standin import MIB, KinesisStandIn, Limits, StreamSpec  # noqa: E402
from devtools.stream_records import landed_records  # noqa: E402
from lease_core.application import LeaseApplication  # noqa: E402
from lease_core.leader.assignment_round import AssignmentCoordinator, slot_ids  # noqa: E402
from lease_core.sync.step import sync_streams  # noqa: E402
from sinks import open_sink  # noqa: E402
from sinks.parquet import _parquet_bytes  # noqa: E402
from sinks.record_columns import RECORD_SCHEMA, with_stream_and_shard  # noqa: E402
from sinks.table.iceberg import load_configured_catalog, parse_table_uri  # noqa: E402
from spark_jobs.consume_job import publish, run_round, scanned_leases  # noqa: E402
from spark_jobs.consume_spec import ConsumeSpec  # noqa: E402
from spark_jobs.round_publication import stream_incarnations  # noqa: E402
from spark_jobs.round_report import Outcome  # noqa: E402
from spark_jobs.slot_memory import POOL_SETTING, SLOT_POOL, hold_freed_memory  # noqa: E402
from spark_jobs.slot_task import run_slot  # noqa: E402

PARQUET, ICEBERG, DELTA = "parquet", "iceberg", "delta"
SINKS = (PARQUET, ICEBERG, DELTA)  # the slot's runs per stream, in this order
TABLE_SINKS = (ICEBERG, DELTA)  # a round's batches become visible in the driver's one table commit
CATALOG = "benchcpu"
PLAIN = "bench-cpu-plain"
AGGREGATED = "bench-cpu-kpl"
WARM_UP = "bench-cpu-warm-up"
GET_RECORDS_LIMIT = 10_000
# The stand-in's limits are off, and so is the readers' pacing by bytes (Kinesis' 2 MiB/s per shard):
# CPU, not a cap, is what this benchmark measures.
UNPACED_KBPS = 1e9


@dataclass(frozen=True)
class Cost:
    cpu_seconds: float
    wall_seconds: float
    payload_bytes: int

    @property
    def mib_per_core_second(self) -> float:
        return self.payload_bytes / MIB / self.cpu_seconds


def least_cpu(first: Cost, second: Cost) -> Cost:
    return min(first, second, key=lambda cost: cost.cpu_seconds)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def metered() -> Iterator[Callable[[int], Cost]]:
    """Yields a function that, given the payload bytes handled, returns the cost since entry."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    yield lambda payload: Cost(cpu_seconds() - cpu, time.perf_counter() - wall, payload)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--records", type=int, default=16_000, help="user records per shard")
    parser.add_argument("--record-bytes", type=int, default=750)
    parser.add_argument("--aggregate", type=int, default=10, help="user records per KPL aggregate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-scaling", action="store_true", help="skip part 4, the Spark rounds on 1 and 2 slots")
    parser.add_argument("--peak-rss", action="store_true", help="run part 5 alone: a slot's peak RSS on a catch-up")
    parser.add_argument("--rss-shards", type=int, default=64)
    parser.add_argument("--rss-mib", type=float, default=8.0, help="backlog per shard, MiB, for --peak-rss")
    parser.add_argument("--slot-buffer-mib", type=int, nargs="+", default=[256, 64])
    return parser.parse_args(argv)


# --- the baseline ---------------------------------------------------------------------------------


def bare_client(endpoint: str) -> Any:
    """A Kinesis client as boto3 makes it, retries off (the stand-in's limits are off too)."""
    config = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": 1})
    return boto3.client("kinesis", region_name=REGION, endpoint_url=endpoint, config=config)


def bare_loop(kinesis: Any, stream: str, deaggregate: bool) -> int:
    """Read every shard from its trim horizon to its end, one after the other; the payload bytes read.

    With `deaggregate`, every response goes through aws_kinesis_agg's deaggregator, as a hand-written
    consumer of KPL records would do."""
    payload = 0
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            response = kinesis.get_records(ShardIterator=iterator, Limit=GET_RECORDS_LIMIT)
            if deaggregate:
                user_records = (entry["kinesis"] for entry in iter_deaggregate_records(response["Records"], "Boto3"))
                # aws_kinesis_agg hands a sub-record's data over base64-encoded, a plain record's as it came.
                payload += sum(
                    len(base64.b64decode(record["data"]) if record.get("aggregated") else record["data"])
                    for record in user_records
                )
            else:
                payload += sum(len(record["Data"]) for record in response["Records"])
            if response.get("MillisBehindLatest") == 0 and len(response["Records"]) < GET_RECORDS_LIMIT:
                break
            iterator = response.get("NextShardIterator")
    return payload


# --- the floor ------------------------------------------------------------------------------------


def captured_bodies(endpoint: str, stream: str) -> list[bytes]:
    """Every GetRecords body of `stream`, raw as the stand-in sent it (read as `bare_loop` reads)."""
    kinesis = bare_client(endpoint)
    bodies: list[bytes] = []

    def capture(response_dict: dict[str, Any], **_: Any) -> None:
        bodies.append(response_dict["body"])

    kinesis.meta.events.register("before-parse.kinesis.GetRecords", capture)
    bare_loop(kinesis, stream, deaggregate=False)
    return bodies


class _FloorRecord(msgspec.Struct, gc=False):
    SequenceNumber: str
    ApproximateArrivalTimestamp: float
    Data: bytes  # msgspec decodes base64 itself
    PartitionKey: str


class _FloorBody(msgspec.Struct, gc=False):
    Records: list[_FloorRecord]


_FLOOR_DECODER = msgspec.json.Decoder(_FloorBody)


def floor_steps(bodies: list[bytes], aggregated: bool, msgspec_decoding: bool = False) -> dict[str, float]:
    """CPU seconds of each essential step over `bodies` (module doc, 3): one table and one Parquet
    file per body, as a slot lands a batch per response at these sizes."""
    seconds = dict.fromkeys(("json", "base64", "md5", "arrow", "parquet"), 0.0)

    def step(name: str, work: Callable[[], Any]) -> Any:
        started = cpu_seconds()
        result = work()
        seconds[name] += cpu_seconds() - started
        return result

    for body in bodies:
        if msgspec_decoding:
            records: list[_FloorRecord] = step("json", partial(_FLOOR_DECODER.decode, body)).Records
            sequence_numbers = [record.SequenceNumber for record in records]
            keys = [record.PartitionKey for record in records]
            arrivals = [record.ApproximateArrivalTimestamp for record in records]
            data = [record.Data for record in records]
        else:
            parsed = step("json", partial(json.loads, body))["Records"]
            sequence_numbers = [record["SequenceNumber"] for record in parsed]
            keys = [record["PartitionKey"] for record in parsed]
            arrivals = [record["ApproximateArrivalTimestamp"] for record in parsed]
            encoded = [record["Data"] for record in parsed]
            data = step("base64", partial(list, map(binascii.a2b_base64, encoded)))
        if aggregated:
            step("md5", partial(kpl_digests, data))
        columns = (sequence_numbers, keys, arrivals, data)
        table = step("arrow", partial(floor_table, *columns))
        step("parquet", partial(_parquet_bytes, table))
    return seconds


def kpl_digests(data: list[bytes]) -> list[bytes]:
    """KCL's check of every aggregate: the MD5 digest of its message."""
    return [hashlib.md5(value[len(KPL_MAGIC) : -KPL_DIGEST_SIZE]).digest() for value in data]


def floor_table(sequence_numbers: list[str], keys: list[str], arrivals: list[float], data: list[bytes]) -> pa.Table:
    """The sinks' record columns from a response's values, vectorised where Arrow can."""
    millis = pa.compute.multiply(pa.array(arrivals, pa.float64()), 1000).cast(pa.int64(), safe=False)
    return pa.table(
        {
            "sequence_number": pa.array(sequence_numbers, pa.string()),
            "sub_sequence_number": pa.nulls(len(data), pa.int64()).fill_null(0),
            "partition_key": pa.array(keys, pa.string()),
            "approximate_arrival_timestamp": millis.cast(pa.timestamp("ms", tz="UTC")),
            "data": pa.array(data, pa.binary()),
            "explicit_hash_key": pa.nulls(len(data), pa.string()),
        },
        schema=RECORD_SCHEMA,
    )


def floor_cost(bodies: list[bytes], payload_bytes: int, aggregated: bool, msgspec_decoding: bool = False) -> Cost:
    steps = floor_steps(bodies, aggregated, msgspec_decoding)
    return Cost(sum(steps.values()), 0.0, payload_bytes)


def print_floor_steps(bodies: list[bytes], payload_bytes: int) -> None:
    """Each step's MiB/s per core on the plain stream, as the issue lists them (best of 3)."""
    best: dict[str, float] = {}
    for _ in range(3):
        for name, seconds in floor_steps(bodies, aggregated=True).items():  # md5 measured on plain data too
            best[name] = min(best.get(name, math.inf), seconds)
    print(
        "floor steps on the plain stream, MiB/s per core: "
        + ", ".join(f"{name} {payload_bytes / MIB / seconds:.0f}" for name, seconds in best.items())
    )


# --- the pipeline ---------------------------------------------------------------------------------


def fresh_round(
    moto: str, standin: KinesisStandIn, stream: str, workers: int, sink: str = PARQUET
) -> tuple[Application, ConsumeSpec]:
    """A new application on `stream`, synced and assigned to `workers` slots: a round ready to consume,
    into a new Parquet dataset, Iceberg table or Delta table."""
    folder = tempfile.mkdtemp(prefix=f"bench-cpu-{stream}-")
    outputs = {
        PARQUET: folder,
        ICEBERG: f"iceberg://{CATALOG}/bench.{Path(folder).name.replace('-', '_')}",
        DELTA: f"delta:{folder}",
    }
    output = outputs[sink]
    application = Application(
        f"{stream}-{sink}", moto, standin.endpoint, output, stream=stream, shard_read_limit_kbps=UNPACED_KBPS
    )
    sync_streams((stream,), application.config, application.store, application.source, application.state)
    assignment = AssignmentCoordinator(application.store, application.metrics, application.state, application.config)
    round_number = assignment.run(slot_ids(application.name, workers)).round_number
    spec = ConsumeSpec(
        streams=(stream,),
        num_workers=workers,
        output_uri=output,
        round_number=round_number,
        settings=application.config.to_dict(),
    )
    # The streams' incarnations, as the round's driver gives its slots (`with_round_start`): a table
    # sink's publication records them with the positions it writes.
    incarnations = stream_incarnations(LeaseApplication.from_config(spec.config), spec.streams)
    # The round report's place, as the consume operator asks for it before it submits the round: an
    # Iceberg table is created then, before any slot, with the batches' position columns. Then the
    # columns a first batch adds: the slot lands into the table as every round after the first finds it.
    open_sink(output, config=spec.config).reports_root()
    if sink == ICEBERG:
        table = load_configured_catalog(output, CATALOG).load_table(parse_table_uri(output).identifier)
        batch_columns = with_stream_and_shard(RECORD_SCHEMA.empty_table(), "", "").schema
        with table.update_schema() as update:
            update.union_by_name(pa.schema([field.with_nullable(True) for field in batch_columns]))
    return application, dataclasses.replace(spec, stream_incarnations=incarnations)


def check_landed(spec: ConsumeSpec, expected_records: int) -> None:
    landed = [
        (record.shard_id, record.sequence_number, record.sub_sequence_number)
        for record in landed_records(spec.output_uri)
    ]
    if len(landed) != expected_records or len(set(landed)) != expected_records:
        raise BenchmarkFailure(
            f"{spec.streams[0]}: {len(landed)} rows ({len(set(landed))} distinct) landed for {expected_records} served"
        )


def slot_pipeline(moto: str, standin: KinesisStandIn, stream: str, expected_records: int, sink: str = PARQUET) -> Cost:
    _, spec = fresh_round(moto, standin, stream, workers=1, sink=sink)
    with metered() as cost:
        report = run_slot(spec, 0)
    if any(lease.outcome != Outcome.CAUGHT_UP for lease in report.leases):
        raise BenchmarkFailure(f"{stream}: a lease did not catch up: {report}")
    measured = cost(report.bytes)
    if sink in TABLE_SINKS:  # the round's table commit, by the driver: after the slot, not counted
        app = LeaseApplication.from_config(spec.config)
        publication, _ = publish(app, spec, scanned_leases(app))
        if publication.error or publication.commits != 1:
            raise BenchmarkFailure(f"{stream}: the round's table commit did not happen: {publication}")
    check_landed(spec, expected_records)
    return measured


def configure_catalog() -> None:
    """pyiceberg's SQL catalog on a SQLite file, for the Iceberg runs, with its namespace."""
    folder = tempfile.mkdtemp(prefix="bench-cpu-catalog-")
    properties = {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}/warehouse"}
    for key, value in properties.items():
        os.environ[f"PYICEBERG_CATALOG__{CATALOG.upper()}__{key.upper()}"] = value
    SqlCatalog(CATALOG, **properties).create_namespace("bench")


# --- scaling --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalingRun:
    workers: int
    seconds: float
    payload_bytes: int
    server_cpu: dict[str, float]
    machine_busy_seconds: float  # CPU seconds of every process on the machine, across its cores

    @property
    def cores_busy(self) -> float:
        return self.machine_busy_seconds / self.seconds


def machine_busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def server_cpu(processes: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: sum(process.cpu_times()[:2]) for name, process in processes.items()}


def scaling_run(
    spark: Any, moto: str, standin: KinesisStandIn, workers: int, expected: int, servers: dict[str, psutil.Process]
) -> ScalingRun:
    _, spec = fresh_round(moto, standin, PLAIN, workers)
    before, busy = server_cpu(servers), machine_busy_seconds()
    started = time.perf_counter()
    report = run_round(spark, spec)
    seconds = time.perf_counter() - started
    after, busy = server_cpu(servers), machine_busy_seconds() - busy
    if not report.succeeded:
        raise BenchmarkFailure(f"the round with {workers} slot(s) failed:\n{report.summary()}")
    check_landed(spec, expected)
    servers_used = {name: after[name] - before[name] for name in after}
    return ScalingRun(workers, seconds, report.totals.bytes, servers_used, busy)


# --- memory -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeakRss:
    stream: str
    slot_buffer_bytes: int
    before_bytes: int  # the slot process's RSS when the slot started (interpreter, libraries, clients)
    peak_bytes: int  # its peak RSS while the slot ran

    @property
    def slot_bytes(self) -> int:
        return self.peak_bytes - self.before_bytes


def memory_status(name: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, in bytes (Linux' /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1]) * 1024  # kB
    raise BenchmarkFailure(f"/proc/self/status has no {name}")


def slot_peak_rss(warm_up: ConsumeSpec, spec: ConsumeSpec) -> tuple[int, int, int]:
    """In a fresh process: (RSS when `run_slot` starts, peak RSS while it runs, payload bytes it landed).
    A slot on a small stream runs first, so that what a slot loads once (libraries, clients) is in the
    first figure. getrusage's ru_maxrss is not used: it keeps the parent's peak across fork and exec."""
    run_slot(warm_up, 0)
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
    before = memory_status("VmRSS")
    report = run_slot(spec, 0)
    if any(lease.outcome != Outcome.CAUGHT_UP for lease in report.leases):
        raise BenchmarkFailure(f"a lease did not catch up: {report}")
    return before, memory_status("VmHWM"), report.bytes


def peak_rss_runs(arguments: argparse.Namespace, stack: ExitStack) -> list[PeakRss]:
    moto = stack.enter_context(moto_server())
    record_bytes, shards = arguments.record_bytes, arguments.rss_shards
    per_shard = math.ceil(arguments.rss_mib * MIB / record_bytes)
    aggregates = math.ceil(per_shard / arguments.aggregate)
    streams = [
        StreamSpec(PLAIN, shards=shards, records_per_shard=per_shard, record_bytes=record_bytes),
        StreamSpec(AGGREGATED, shards, aggregates, record_bytes, aggregate_size=arguments.aggregate),
        StreamSpec(WARM_UP, shards=2, records_per_shard=100, record_bytes=record_bytes),
    ]
    standin = stack.enter_context(KinesisStandIn(streams, Limits.off()))
    expected = {PLAIN: shards * per_shard, AGGREGATED: shards * aggregates * arguments.aggregate}
    # The slots' processes get Arrow's allocator as the consume job's executors do (spark.executorEnv),
    # unless the command line chose one (ARROW_DEFAULT_MEMORY_POOL=mimalloc: pyarrow's default).
    os.environ.setdefault(POOL_SETTING, SLOT_POOL)
    runs = []
    for stream in (PLAIN, AGGREGATED):
        for buffer_mib in arguments.slot_buffer_mib:
            _, warm_up = fresh_round(moto.endpoint, standin, WARM_UP, workers=1)
            _, spec = fresh_round(moto.endpoint, standin, stream, workers=1)
            spec = dataclasses.replace(spec, slot_buffer_bytes=buffer_mib * MIB)
            # A fresh process for each slot: a peak RSS is the process's whole life's.
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                before, peak, landed = pool.apply(slot_peak_rss, (warm_up, spec))
            if landed != expected[stream] * record_bytes:
                raise BenchmarkFailure(f"{stream}: {landed} bytes landed for {expected[stream] * record_bytes}")
            check_landed(spec, expected[stream])
            runs.append(PeakRss(stream, spec.slot_buffer_bytes, before, peak))
    return runs


def print_peak_rss(runs: list[PeakRss], arguments: argparse.Namespace) -> None:
    print(
        f"one slot on {arguments.rss_shards} shards x {arguments.rss_mib:g} MiB of backlog "
        f"({arguments.rss_shards * arguments.rss_mib:g} MiB), limits and pacing off, in a process of its own "
        f"(Arrow's pool: {os.environ[POOL_SETTING]})"
    )
    print(
        f"{'stream':<18}{'slot_buffer MiB':>16}{'RSS before MiB':>16}{'peak RSS MiB':>14}"
        f"{'slot added MiB':>16}{'/ buffer':>10}"
    )
    for run in runs:
        print(
            f"{run.stream:<18}{run.slot_buffer_bytes / MIB:>16.0f}{run.before_bytes / MIB:>16.0f}"
            f"{run.peak_bytes / MIB:>14.0f}{run.slot_bytes / MIB:>16.0f}{run.slot_bytes / run.slot_buffer_bytes:>10.2f}"
        )


# --- the run --------------------------------------------------------------------------------------


def print_costs(costs: dict[str, tuple[Cost, ...]]) -> None:
    print(
        f"\n{'stream':<22}{'boto3 loop MiB/s/core':>22}{'slot, Parquet':>15}{'ratio':>7}"
        f"{'slot, Iceberg':>15}{'ratio':>7}{'Iceberg / Parquet':>19}{'slot, Delta':>13}{'Delta / Parquet':>17}"
    )
    for name, (bare, parquet, iceberg, delta) in costs.items():
        print(
            f"{name:<22}{bare.mib_per_core_second:>22.1f}{parquet.mib_per_core_second:>15.1f}"
            f"{parquet.mib_per_core_second / bare.mib_per_core_second:>7.2f}{iceberg.mib_per_core_second:>15.1f}"
            f"{iceberg.mib_per_core_second / bare.mib_per_core_second:>7.2f}"
            f"{iceberg.mib_per_core_second / parquet.mib_per_core_second:>19.2f}"
            f"{delta.mib_per_core_second:>13.1f}{delta.mib_per_core_second / parquet.mib_per_core_second:>17.2f}"
        )
    print(
        "(MiB/s/core: payload MiB per CPU second of this process; 'ratio' is against the boto3 loop, "
        "'X / Parquet' against the Parquet slot)"
    )


def print_against_floor(costs: dict[str, tuple[Cost, ...]]) -> None:
    print(
        f"\n{'stream':<22}{'slot MiB/s/core':>16}{'boto3 loop':>12}{'floor':>8}{'floor, msgspec':>16}"
        f"{'slot / loop':>13}{'slot / floor':>14}{'slot / floor, msgspec':>23}"
    )
    for name, (bare, parquet, _, _, floor, floor_msgspec) in costs.items():
        slot = parquet.mib_per_core_second
        print(
            f"{name:<22}{slot:>16.1f}{bare.mib_per_core_second:>12.1f}{floor.mib_per_core_second:>8.1f}"
            f"{floor_msgspec.mib_per_core_second:>16.1f}{slot / bare.mib_per_core_second:>13.2f}"
            f"{slot / floor.mib_per_core_second:>14.2f}{slot / floor_msgspec.mib_per_core_second:>23.2f}"
        )
    print(
        "(slot: the Parquet slot; floor: json.loads, binascii base64, Arrow table, Parquet zstd, and MD5 of KPL "
        "aggregates, on the same bodies; 'floor, msgspec': msgspec's JSON and base64 instead. "
        "Goals: plain slot / loop >= 2, slot / floor >= 0.6; KPL slot / loop >= 1.5)"
    )


def print_scaling(runs: list[ScalingRun]) -> None:
    one = runs[0]
    print(
        f"\n{'slots':<7}{'round s':>9}{'MiB/s':>8}{'x 1 slot':>10}{'cores busy':>12}{'MiB/busy core s':>17}"
        f"{'stand-in CPU s':>16}{'moto CPU s':>12}"
    )
    for run in runs:
        print(
            f"{run.workers:<7}{run.seconds:>9.2f}{run.payload_bytes / MIB / run.seconds:>8.1f}"
            f"{one.seconds / run.seconds:>10.2f}{run.cores_busy:>12.2f}"
            f"{run.payload_bytes / MIB / run.machine_busy_seconds:>17.1f}"
            f"{run.server_cpu['stand-in']:>16.2f}{run.server_cpu['moto']:>12.2f}"
        )
    print(
        f"(the machine has {psutil.cpu_count()} cores; 'cores busy' counts every process on it: slots, driver, servers)"
    )


def run(arguments: argparse.Namespace, stack: ExitStack) -> None:
    prepare_environment()
    # glibc holds freed memory here as in a slot's process (run_slot does the same), for the boto3 loop
    # and the floor too: measured, the loop costs the same either way.
    hold_freed_memory()
    if arguments.peak_rss:
        print_peak_rss(peak_rss_runs(arguments, stack), arguments)
        return
    moto_process = stack.enter_context(moto_server())
    per_shard = arguments.records
    aggregates = math.ceil(per_shard / arguments.aggregate)
    streams = [
        StreamSpec(PLAIN, shards=arguments.shards, records_per_shard=per_shard, record_bytes=arguments.record_bytes),
        StreamSpec(
            AGGREGATED,
            shards=arguments.shards,
            records_per_shard=aggregates,
            record_bytes=arguments.record_bytes,
            aggregate_size=arguments.aggregate,
        ),
    ]
    standin = stack.enter_context(KinesisStandIn(streams, Limits.off()))
    expected = {PLAIN: arguments.shards * per_shard, AGGREGATED: arguments.shards * aggregates * arguments.aggregate}
    labels = {PLAIN: "plain records", AGGREGATED: f"KPL, {arguments.aggregate} per record"}
    print(
        f"{arguments.shards} shards x {per_shard:,} user records of {arguments.record_bytes} B per stream "
        f"({expected[PLAIN] * arguments.record_bytes / MIB:.0f} MiB); best of {arguments.repeats}"
    )
    kinesis = bare_client(standin.endpoint)
    configure_catalog()
    bodies = {stream: captured_bodies(standin.endpoint, stream) for stream in (PLAIN, AGGREGATED)}
    payload = {stream: expected[stream] * arguments.record_bytes for stream in (PLAIN, AGGREGATED)}
    best: dict[str, tuple[Cost, ...]] = {}  # per stream: the boto3 loop's, the slot's per sink, the floors
    for _ in range(arguments.repeats):
        for stream in (PLAIN, AGGREGATED):
            with metered() as cost:
                bare = cost(bare_loop(kinesis, stream, deaggregate=stream == AGGREGATED))
            measured = (
                bare,
                *(slot_pipeline(moto_process.endpoint, standin, stream, expected[stream], sink) for sink in SINKS),
                *(
                    floor_cost(bodies[stream], payload[stream], stream == AGGREGATED, msgspec_decoding)
                    for msgspec_decoding in (False, True)
                ),
            )
            best[stream] = tuple(map(least_cpu, best.get(stream, measured), measured))
    print_costs({labels[stream]: costs[:4] for stream, costs in best.items()})
    print_against_floor({labels[stream]: costs for stream, costs in best.items()})
    print_floor_steps(bodies[PLAIN], payload[PLAIN])
    if arguments.no_scaling:
        return

    spark = start_spark()
    stack.callback(spark.stop)
    servers = {"stand-in": psutil.Process(standin.pid), "moto": psutil.Process(moto_process.pid)}
    scaling_run(spark, moto_process.endpoint, standin, 2, expected[PLAIN], servers)  # warms the JVM and workers up
    runs = [
        min(
            (
                scaling_run(spark, moto_process.endpoint, standin, workers, expected[PLAIN], servers)
                for _ in range(arguments.repeats)
            ),
            key=lambda run: run.seconds,
        )
        for workers in (1, 2)
    ]
    print_scaling(runs)


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    with ExitStack() as stack:
        run(arguments, stack)


if __name__ == "__main__":
    main()
