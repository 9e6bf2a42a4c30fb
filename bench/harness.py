"""What the benchmarks share: their environment, a SparkSession, and consumer applications on the emulators.

`prepare_environment` (dummy credentials, loopback Spark) comes first, before any emulator, client or
JVM starts. `Application` is one consumer application (fresh tables, stores) on a moto endpoint and a
Kinesis endpoint (kinesis-mock or the Kinesis stand-in) whose `round` runs what a DAG run does: shard
sync, an assignment round and the consume job's `run_round`, each timed. A script run as
`bench/<name>.py` puts the repository on `sys.path` before importing this module.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

from devtools.emulators import KINESIS_MOCK_HOME
from devtools.local_spark import loopback_session
from devtools.stream_records import landed_records
from lease_core import aws
from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.leader.assignment_round import AssignmentCoordinator, AssignmentReport, slot_ids
from lease_core.retrieval.pending_work import find_pending_work
from lease_core.retrieval.polling.polling_retrieval import idle_check_retrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.tables import TableAdministrator
from lease_core.sync.step import probe_load, sync_streams
from spark_jobs.consume_job import run_round
from spark_jobs.consume_spec import ConsumeSpec
from spark_jobs.round_report import RoundReport

REPOSITORY = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
PAYLOAD_BYTES = 200

T = TypeVar("T")
Position = tuple[str, str]  # (shard id, sequence number): a record's identity in the stream

# Settings that would point the clients or the consumer elsewhere than the run's emulators.
_OVERRIDE_VARIABLES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_KINESIS",
    "AWS_ENDPOINT_URL_S3",
)
_CONSUMER_PREFIX = "KINESIS_LEASE_"


class BenchmarkFailure(RuntimeError):
    """The job did not land what was written: the numbers would mean nothing."""


def prepare_environment(clear_overrides: bool = False) -> None:
    """Dummy credentials and loopback Spark, set before any emulator, client or JVM starts.

    They are assigned, not defaulted, so no real credentials from the caller's shell are ever used.
    The JVM and its Python workers inherit the environment as it is when the session starts.
    `clear_overrides` also removes the caller's AWS endpoint variables and consumer settings
    (`KINESIS_LEASE_*`): for runs whose processes (spark-submit, leasectl) load their
    configuration from the environment.
    """
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_EC2_METADATA_DISABLED="true",
        PYSPARK_PYTHON=sys.executable,  # otherwise Spark's workers silently run the system Python
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    if clear_overrides:
        for name in _OVERRIDE_VARIABLES:
            os.environ.pop(name, None)
        for name in [name for name in os.environ if name.startswith(_CONSUMER_PREFIX)]:
            os.environ.pop(name)
    # Executors and the moto child import this repository whatever the working directory is.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))


def timed(function: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def start_spark(app_name: str = "bench-consume-throughput", master: str = "local[*]") -> Any:
    # Spark's progress bars would garble the tables.
    return loopback_session(master, app_name, {"spark.ui.showConsoleProgress": "false"})


def positions(written: list[tuple[dict[str, Any], dict[str, Any]]]) -> set[Position]:
    """The positions of the written entries (`put_entries`' answer)."""
    return {(result["ShardId"], result["SequenceNumber"]) for _, result in written}


def machine_facts() -> str:
    mock = json.loads((KINESIS_MOCK_HOME / "package.json").read_text()).get("version", "?")
    return (
        f"machine: {os.cpu_count()} cores; Python {sys.version.split()[0]}, pyspark {version('pyspark')} "
        f"(local[*]); emulators: kinesis-mock {mock} (Kinesis), moto {version('moto')} (DynamoDB)"
    )


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
    """One consumer application on the emulators: its tables, stores, and what a DAG run does.

    `settings` are further `ConsumerConfig` fields (a read limit, an assignment strategy...).
    """

    def __init__(
        self,
        label: str,
        moto_endpoint: str,
        kinesis_endpoint: str,
        output_uri: str,
        stream: str,
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
        application = LeaseApplication(self.config)  # state and metrics in whichever table layout it has
        self.state = application.state_store_with(policy)
        self.metrics = application.worker_metrics
        self.source = KinesisShardSource(aws.client("kinesis", self.config), retry_policy=policy)
        self.idle_check_retrieval = idle_check_retrieval(aws.client("kinesis", self.config), policy)

    @property
    def name(self) -> str:
        return self.config.require_application_name()

    def sync_and_look(self) -> None:
        """The DAG's sync step: shard sync, the idle check over its leases and, with work, the load probe."""
        sync_streams((self.stream,), self.config, self.store, self.source, self.state)
        leases, streams = self.store.list_leases(), (self.stream,)
        if not find_pending_work(leases, streams, self.idle_check_retrieval, self.config).idle:
            probe_load(leases, streams, self.idle_check_retrieval, self.config, self.state)

    def round(self, spark: Any, workers: int) -> RoundTimes:
        """Shard sync, assignment and the consume step, each timed; a failed round stops the run."""
        sync_seconds, _ = timed(self.sync_and_look)
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
