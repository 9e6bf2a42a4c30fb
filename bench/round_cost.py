"""Benchmark: what one round's control plane costs in AWS requests and wall time, at 100 and 1,000 leases.

Method. The run starts its own moto (DynamoDB) and kinesis-mock (Kinesis) on loopback and puts a
recording `FaultProxy` (no fault rules) in front of each. For every size it creates S streams of N
shards (S > 1 selects multi-stream mode), a fresh application with its tables, and runs the
round's control-plane steps as a DAG run does, with the measured processes pointed at the proxies:
- `sync`: `leasectl sync --stream ...` as a process (the same `sync_streams` the sync operator calls);
- `assign`: `leasectl assign --workers W` as a process (the same `AssignmentCoordinator`), W = leases / 10;
- `sync (in)`, `assign (in)` (idle round only): the same two calls in this process, after the
  leasectl ones: the steps' own time, without a process start-up or the leader lock;
- `DAG sync`: the DAG's own steps of a round up to its idle decision, in this process, as its
  operators run them: take_leadership, sync_shards (sync, audit, and the idle check over the sync's
  scan: one GetShardIterator and one GetRecords per lease until the first lease with work),
  release_leadership (check_idle makes no call). "skip" means the assignment and the consume step are skipped: it
  is the whole of an idle round but for the DAG's finalize step (one history write).
Both leasectl commands hold the leader lock for their step (take, heartbeat, release), as they
would in a round. Rounds: "first" (sync at TRIM_HORIZON creating every lease, assign spreading them:
timed and counted, not steady state), "idle" (nothing new anywhere), "data" (after one record was
put on every shard) and "one shard" (one new record in the whole stream: what a round costs the
leases with nothing new). With --consume-up-to N, sizes up to N leases also run the consume job
(`run_round` on one local[2] session, its executors pointed at the proxies) in the last two rounds;
otherwise the consume job is not run.

Columns: wall seconds of the step (a leasectl process includes its ~0.7 s of interpreter and
boto3 start-up), DynamoDB writes (PutItem, UpdateItem, DeleteItem, BatchWriteItem, TransactWriteItems)
and reads (GetItem, Query, Scan, BatchGetItem, DescribeTable), Kinesis calls, then each operation
with its count. The lease item size printed last is the mean of the lease table's items (DynamoDB's
size rule: attribute names plus values), which turns scans into read units. Each size ends with a
month of such rounds on a 5-minute schedule next to an always-on KCL 3.x fleet (its documented
intervals, docs/protocol.md §9), in DynamoDB request units and on-demand dollars: docs/cost.md explains the model.

Run: .venv/bin/python bench/round_cost.py [--shards 100,1000] [--streams 1] [--consume-up-to N] [--no-idle-check]
(about 2 minutes on 2 cores with the defaults, 5 with --consume-up-to 1000; `--streams 10 --shards 1000
--no-idle-check` is 10,000 leases in multi-stream mode, about 6 minutes).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from devtools.airflow_env import home_environment  # noqa: E402

# The idle check is the plugin's operator: Airflow reads its home when first imported.
os.environ.update(home_environment(tempfile.mkdtemp(prefix="round-cost-airflow-")))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
sys.path.insert(0, str(REPOSITORY / "plugins"))  # the package kinesis_lease, as the editable install maps it


import boto3  # noqa: E402

from devtools.emulators import kinesis_mock, moto_server  # noqa: E402
from devtools.fault_proxy import FaultProxy, RecordedCall  # noqa: E402
from devtools.kinesis_streams import create_stream, kinesis_client, put_entries, shards_of  # noqa: E402

REGION = "us-east-1"
LEASECTL = Path(sys.executable).with_name("leasectl")
DYNAMODB_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
DYNAMODB_READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem", "DescribeTable"})


@dataclass(frozen=True)
class StepCost:
    case: str
    step: str
    seconds: float
    calls: tuple[RecordedCall, ...]
    outcome: str = ""

    def count(self, service: str, operations: frozenset[str] | None = None) -> int:
        return sum(
            call.service == service and (operations is None or call.operation in operations) for call in self.calls
        )

    def by_operation(self) -> str:
        counts = Counter(f"{call.operation}" for call in self.calls)
        return ", ".join(f"{operation} {count}" for operation, count in sorted(counts.items()))


class Recorder:
    """Slices of the proxies' call logs, one per measured step."""

    def __init__(self, proxies: Sequence[FaultProxy]) -> None:
        self.proxies = proxies

    @contextmanager
    def step(self, case: str, name: str, costs: list[StepCost]) -> Iterator[dict[str, str]]:
        marks = [len(proxy.calls()) for proxy in self.proxies]
        outcome: dict[str, str] = {}
        started = time.perf_counter()
        yield outcome
        seconds = time.perf_counter() - started
        calls = tuple(call for proxy, mark in zip(self.proxies, marks) for call in proxy.calls()[mark:])
        costs.append(StepCost(case, name, seconds, calls, outcome.get("outcome", "")))


def leasectl(app: str, arguments: Sequence[str], dynamodb: str, kinesis: str) -> str:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("AWS_ENDPOINT_URL", "KINESIS_LEASE_"))
    }
    env.update(
        AWS_ENDPOINT_URL_DYNAMODB=dynamodb,
        AWS_ENDPOINT_URL_KINESIS=kinesis,
        AWS_DEFAULT_REGION=REGION,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
    )
    command = [str(LEASECTL), "--app", app, "--set", "initial_position_in_stream=TRIM_HORIZON", *arguments]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def app_config(app: str, streams: Sequence[str], dynamodb: str, kinesis: str) -> Any:
    """The application's configuration, its endpoints the proxies."""
    from lease_core.config.settings import ConsumerConfig

    return ConsumerConfig(
        application_name=app,
        aws_region=REGION,
        aws_endpoint_url_dynamodb=dynamodb,
        aws_endpoint_url_kinesis=kinesis,
        initial_position_in_stream="TRIM_HORIZON",
        multi_stream=len(streams) > 1,
    )


def in_process_steps(
    app: str, streams: Sequence[str], workers: int, dynamodb: str, kinesis: str
) -> list[tuple[str, Callable[[], str]]]:
    """The same sync and assignment as leasectl's, called in this process: the steps' own time, without
    a process start-up (nor the leader lock, which leasectl takes and releases around them)."""
    from lease_core.application import LeaseApplication
    from lease_core.leader.assignment_round import AssignmentCoordinator, slot_ids
    from lease_core.sync.step import sync_streams

    parts = LeaseApplication.from_config(app_config(app, streams, dynamodb, kinesis))

    def sync() -> str:
        sync_streams(streams, parts.config, parts.lease_store, parts.shard_source, parts.state_store)
        return ""

    def assign() -> str:
        AssignmentCoordinator(parts.lease_store, parts.worker_metrics, parts.state_store, parts.config).run(
            slot_ids(app, workers)
        )
        return ""

    return [("sync (in)", sync), ("assign (in)", assign)]


def dag_sync_step(app: str, streams: Sequence[str], dynamodb: str, kinesis: str) -> str:
    """The DAG's take_leadership, sync_shards, check_idle and release_leadership, as its operators run
    them in a round (the sync's idle check included): "skip" or why the round must consume."""
    from kinesis_lease.aws_connection import AwsAccess
    from kinesis_lease.operators import ReleaseLeadershipOperator, ShardSyncOperator, TakeLeadershipOperator

    from lease_core.retrieval.pending_work import PendingWork

    config = app_config(app, streams, dynamodb, kinesis)
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)
    access = AwsAccess(session, config)
    owner: dict[str, Any] = {"settings": {}, "leader_owner": f"round-cost/{uuid.uuid4().hex[:8]}"}
    TakeLeadershipOperator(task_id="take_leadership", **owner).run(access, None)
    try:
        sync = ShardSyncOperator(task_id="sync_shards", streams=list(streams), **owner).run(access, None)
    finally:
        ReleaseLeadershipOperator(task_id="release_leadership", **owner).run(access, None)
    # check_idle makes no call: it skips the rest of the round on the sync's answer.
    work = PendingWork.from_dict(sync["pending_work"], "the sync step's summary")
    return "skip" if work.idle else f"consume ({work.reason})"


def put_one_record_per_shard(client: Any, stream: str) -> None:
    entries = [
        {
            "Data": b"x" * 200,
            "PartitionKey": shard.shard_id,
            "ExplicitHashKey": str(shard.hash_key_range.starting_hash_key),
        }
        for shard in shards_of(client, stream)
        if shard.is_open
    ]
    put_entries(client, stream, entries)


def mean_lease_item_bytes(moto_endpoint: str, table: str) -> float:
    """DynamoDB's item size: UTF-8 lengths of attribute names and string values, numbers as ~their digits."""
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    sizes = []
    for page in client.get_paginator("scan").paginate(TableName=table):
        for item in page["Items"]:
            sizes.append(sum(len(name) + _value_bytes(value) for name, value in item.items()))
    return sum(sizes) / max(1, len(sizes))


def _value_bytes(value: dict[str, Any]) -> int:
    ((kind, content),) = value.items()
    if kind in ("SS", "NS", "L"):
        return sum(len(str(part)) for part in content)
    if kind == "M":
        return sum(len(name) + _value_bytes(part) for name, part in content.items())
    return len(str(content).encode())


def measure_size(
    shards: int,
    stream_count: int,
    recorder: Recorder,
    endpoints: dict[str, str],
    kinesis: Any,
    spark: Any,
    with_idle_check: bool = True,
) -> tuple[list[StepCost], float, str]:
    app = f"cost-{uuid.uuid4().hex[:8]}"
    streams = [f"{app}-s{index}" for index in range(stream_count)]
    for stream in streams:
        create_stream(kinesis, stream, shards)
    leasectl(app, ["init"], endpoints["moto"], endpoints["kinesis"])
    workers = str(max(1, shards * stream_count // 10))
    stream_arguments = [part for stream in streams for part in ("--stream", stream)]
    dynamodb, kinesis_proxy = endpoints["dynamodb_proxy"], endpoints["kinesis_proxy"]
    costs: list[StepCost] = []
    steps: list[tuple[str, Callable[[], str]]] = [
        ("sync", lambda: leasectl(app, ["sync", *stream_arguments], dynamodb, kinesis_proxy) and ""),
        ("assign", lambda: leasectl(app, ["assign", "--workers", workers], dynamodb, kinesis_proxy) and ""),
        ("DAG sync", lambda: dag_sync_step(app, streams, dynamodb, kinesis_proxy)),
    ][: 3 if with_idle_check else 2]
    consume = _consume_step(app, streams, int(workers), dynamodb, kinesis_proxy, spark)
    in_process = in_process_steps(app, streams, int(workers), dynamodb, kinesis_proxy)
    for case in ("first", "idle", "data", "one shard"):
        if case == "data":
            for stream in streams:
                put_one_record_per_shard(kinesis, stream)
        if case == "one shard":
            put_entries(kinesis, streams[0], [{"Data": b"x" * 200, "PartitionKey": "one"}])
        extra = in_process if case == "idle" else []
        if consume and case in ("data", "one shard"):
            extra = [("consume", consume)]
        for name, run in [*steps, *extra]:
            with recorder.step(case, name, costs) as outcome:
                outcome["outcome"] = run()
    return costs, mean_lease_item_bytes(endpoints["moto"], app), app


def _consume_step(
    app: str, streams: Sequence[str], workers: int, dynamodb: str, kinesis: str, spark: Any
) -> Callable[[], str] | None:
    """The consume job's `run_round` on the shared session, its executors pointed at the proxies."""
    if spark is None:
        return None
    from lease_core.application import LeaseApplication
    from lease_core.leader.assignment_round import current_round
    from spark_jobs.consume_job import run_round
    from spark_jobs.consume_spec import ConsumeSpec

    config = app_config(app, streams, dynamodb, kinesis)
    output = tempfile.mkdtemp(prefix="round-cost-sink-")

    def run() -> str:
        state = LeaseApplication(config).state_store
        spec = ConsumeSpec(
            streams=tuple(streams),
            num_workers=workers,
            output_uri=output,
            round_number=current_round(state),
            settings=config.to_dict(),
        )
        report = run_round(spark, spec)
        return f"{report.totals.records} record(s) landed" if report.succeeded else "FAILED: " + report.summary()

    return run


def print_table(leases: int, costs: Sequence[StepCost], item_bytes: float) -> None:
    print(f"\n{leases} leases (lease item ~{item_bytes:.0f} bytes)")
    header = f"{'round':<6} {'step':<11} {'wall s':>7} {'DDB W':>6} {'DDB R':>6} {'Kin':>6}  operations"
    print(header)
    print("-" * len(header))
    for cost in costs:
        print(
            f"{cost.case:<6} {cost.step:<11} {cost.seconds:>7.2f} {cost.count('dynamodb', DYNAMODB_WRITES):>6} "
            f"{cost.count('dynamodb', DYNAMODB_READS):>6} {cost.count('kinesis'):>6}  {cost.by_operation()}"
            + (f"  -> {cost.outcome}" if cost.outcome else "")
        )


# --- a month of rounds against a month of KCL (docs/cost.md) --------------------------------------

MONTH_SECONDS = 30 * 86_400
ROUNDS_PER_MONTH = MONTH_SECONDS // 300  # a 5-minute schedule: 288 rounds a day
# DynamoDB on-demand list prices, us-east-1 (re-check: aws.amazon.com/dynamodb/pricing/on-demand/).
DOLLARS_PER_WRITE_UNIT = 0.625 / 1e6
DOLLARS_PER_READ_UNIT = 0.125 / 1e6
# KCL 3.x defaults (docs/protocol.md §9): seconds between runs.
KCL_RENEWAL = 3.308  # per held lease: failover_time / 3 - epsilon
KCL_ASSIGNMENT = 20.0  # leader: one scan of the lease table
KCL_DISCOVERY = 9.975  # per worker: one owner-index query
KCL_WORKER_METRICS = 30.0  # per worker: one UpdateItem
KCL_LOCK = 30.0  # leader heartbeat (a write), other workers' leadership check (a read)
KCL_AUDITOR = 120.0  # leader: one scan per stream
KCL_IDLE_GET_RECORDS = 1.0  # per shard with nothing new: idle_time_between_reads
KCL_CHECKPOINT = 60.0  # an assumption: the application checkpoints each shard once a minute while data flows
ROUND_SNAPSHOT_BYTES_PER_LEASE = 6.5  # AssignmentRound's compressed counters (tests/unit/test_round_cost.py)


@dataclass(frozen=True)
class Month:
    write_units: float
    read_units: float
    kinesis_calls: float

    @property
    def dollars(self) -> float:
        return self.write_units * DOLLARS_PER_WRITE_UNIT + self.read_units * DOLLARS_PER_READ_UNIT


def scan_read_units(leases: int, item_bytes: float) -> float:
    """An eventually consistent scan: half a unit per 4 KB of items read."""
    return max(1, math.ceil(leases * item_bytes / 4096)) * 0.5


def our_month(costs: Sequence[StepCost], case: str, steps: set[str], leases: int, item_bytes: float, app: str) -> Month:
    """The measured requests of one round (the `steps` of `case` a DAG run makes), times the rounds of a
    month. A lease write is 1 unit per KB of item; the assignment round's record grows with the leases;
    every other read is counted as 1 unit."""
    calls = [call for cost in costs if cost.case == case and cost.step in steps for call in cost.calls]
    writes = sum(call.operation in DYNAMODB_WRITES for call in calls) * math.ceil(item_bytes / 1024)
    if "assign" in steps:  # the AssignmentRound record's counters: one unit a KB
        writes += math.ceil(leases * ROUND_SNAPSHOT_BYTES_PER_LEASE / 1024) - 1
    lease_scans = sum(call.operation == "Scan" and call.tables == (app,) for call in calls)
    other_reads = sum(call.operation in DYNAMODB_READS for call in calls) - lease_scans
    reads = lease_scans * scan_read_units(leases, item_bytes) + other_reads
    kinesis = sum(call.service == "kinesis" for call in calls)
    return Month(writes * ROUNDS_PER_MONTH, reads * ROUNDS_PER_MONTH, kinesis * ROUNDS_PER_MONTH)


def kcl_month(leases: int, workers: int, item_bytes: float, with_data: bool) -> Month:
    """An always-on KCL 3.x fleet on the same shards, from its documented intervals (one stream)."""
    per_lease_write = math.ceil(item_bytes / 1024)
    writes = leases * MONTH_SECONDS / KCL_RENEWAL * per_lease_write
    writes += workers * MONTH_SECONDS / KCL_WORKER_METRICS + MONTH_SECONDS / KCL_LOCK
    if with_data:
        writes += leases * MONTH_SECONDS / KCL_CHECKPOINT * per_lease_write
    scans = MONTH_SECONDS / KCL_ASSIGNMENT + MONTH_SECONDS / KCL_AUDITOR
    reads = scans * scan_read_units(leases, item_bytes)
    reads += workers * MONTH_SECONDS / KCL_DISCOVERY * 0.5 + (workers - 1) * MONTH_SECONDS / KCL_LOCK
    # At least one GetRecords a second per shard, data or not (more while data flows).
    return Month(writes, reads, leases * MONTH_SECONDS / KCL_IDLE_GET_RECORDS)


def print_monthly(leases: int, costs: Sequence[StepCost], item_bytes: float, app: str) -> None:
    workers = max(1, leases // 10)
    # An idle round is the DAG's sync step alone (the assignment is skipped with the consume step); a
    # round with data adds the assignment (leasectl's, the same coordinator) and the consume job.
    rows = [("this project, idle rounds", our_month(costs, "idle", {"DAG sync"}, leases, item_bytes, app))]
    if any(cost.step == "consume" for cost in costs):
        data = our_month(costs, "data", {"DAG sync", "assign", "consume"}, leases, item_bytes, app)
        rows.append(("this project, data on every shard", data))
    rows += [
        (f"KCL 3.x, {workers} workers, idle", kcl_month(leases, workers, item_bytes, with_data=False)),
        (f"KCL 3.x, {workers} workers, data", kcl_month(leases, workers, item_bytes, with_data=True)),
    ]
    print(f"\na 30-day month at {leases} leases: DynamoDB on-demand, us-east-1 list prices")
    print(f"{'':<36} {'write units':>14} {'read units':>13} {'US$':>9} {'Kinesis calls':>14}")
    for label, month in rows:
        print(
            f"{label:<36} {month.write_units:>14,.0f} {month.read_units:>13,.0f} {month.dollars:>9.2f} "
            f"{month.kinesis_calls:>14,.0f}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="100,1000", help="shards per stream, comma separated sizes")
    parser.add_argument("--streams", type=int, default=1, help="streams per size (more than 1: multi-stream mode)")
    parser.add_argument(
        "--no-idle-check",
        action="store_true",
        help="leave the DAG's sync step out (its idle check is slow at 10,000 leases)",
    )
    parser.add_argument(
        "--consume-up-to",
        type=int,
        default=0,
        help="also run the consume job (local[2]) at sizes up to this many leases",
    )
    arguments = parser.parse_args(argv)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=REGION)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # otherwise Spark's workers silently run the system Python
    with ExitStack() as stack:
        moto = stack.enter_context(moto_server())
        mock = stack.enter_context(kinesis_mock(shard_limit=20_000))
        dynamodb_proxy = stack.enter_context(FaultProxy(moto.endpoint))
        kinesis_proxy = stack.enter_context(FaultProxy(mock.endpoint))
        endpoints = {
            "moto": moto.endpoint,
            "kinesis": mock.endpoint,
            "dynamodb_proxy": dynamodb_proxy.endpoint,
            "kinesis_proxy": kinesis_proxy.endpoint,
        }
        recorder = Recorder([dynamodb_proxy, kinesis_proxy])
        client = kinesis_client(mock.endpoint)
        spark = None
        if arguments.consume_up_to:
            from devtools.local_spark import loopback_session

            spark = loopback_session("local[2]", "bench-round-cost", {"spark.ui.showConsoleProgress": "false"})
            stack.callback(spark.stop)
        for shards in (int(size) for size in arguments.shards.split(",")):
            leases = shards * arguments.streams
            session = spark if leases <= arguments.consume_up_to else None
            costs, item_bytes, app = measure_size(
                shards, arguments.streams, recorder, endpoints, client, session, not arguments.no_idle_check
            )
            print_table(leases, costs, item_bytes)
            print_monthly(leases, costs, item_bytes, app)


if __name__ == "__main__":
    main()
