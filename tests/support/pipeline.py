"""A consumer application on the emulators, run round by round, with the records it must land.

`ConsumerPipeline` does what a DAG run does (shard sync, assignment, the Spark consume step) with
the real lease_core coordinators and the real consume job, and keeps the ledger a test checks:
every record produced (shard, sequence number, payload) against every record landed in the sink.
The control plane (sync, assignment) talks to the emulators directly; the data plane (the slots)
can be pointed at a fault-injecting proxy instead.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3

from devtools.analyst_reads import AnalystTable
from devtools.kinesis_streams import create_stream, kinesis_client, put_entries
from devtools.stream_records import StreamRecord, analyst_table, landed_records
from lease_core.application import LeaseApplication
from lease_core.leader.assignment_round import AssignmentCoordinator, AssignmentReport, slot_ids
from lease_core.lifecycle.lease_lifecycle import forget_reported_losses
from lease_core.metrics.worker_metrics import WorkerMetricsStore
from lease_core.model.lease import Lease
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.tables import TableAdministrator
from lease_core.sync.step import ShardSyncReport, sync_streams
from spark_jobs.consume_job import run_round
from spark_jobs.consume_spec import ConsumeSpec
from spark_jobs.lease_consumer import LeaseBudget
from spark_jobs.record_processing import RecordProcessing
from spark_jobs.round_report import RoundReport
from tests.support.stores import FAST_RETRIES, fast_config


@dataclass
class ConsumerPipeline:
    application_name: str
    streams: tuple[str, ...]
    kinesis_endpoint: str
    dynamodb_endpoint: str
    output_uri: str
    settings: dict[str, Any] = field(default_factory=dict)
    data_plane_kinesis: str | None = None
    data_plane_dynamodb: str | None = None
    produced: list[StreamRecord] = field(default_factory=list)
    reports: list[RoundReport] = field(default_factory=list)
    _serial: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.config = fast_config(
            self.application_name,
            aws_region="us-east-1",
            aws_endpoint_url_dynamodb=self.dynamodb_endpoint,
            aws_endpoint_url_kinesis=self.kinesis_endpoint,
            aws_endpoint_url_s3=self.dynamodb_endpoint,  # moto serves S3 as well
            dependency_retry_base_millis=10,
            dependency_retry_max_millis=200,
            **self.settings,
        )
        self.dynamodb = boto3.client("dynamodb", endpoint_url=self.dynamodb_endpoint, region_name="us-east-1")
        self.kinesis = kinesis_client(self.kinesis_endpoint)
        administrator = TableAdministrator(self.dynamodb, self.config, retry_policy=FAST_RETRIES)
        administrator.ensure_tables()
        self.store = DynamoDBLeaseStore(self.dynamodb, self.config.lease_table, retry_policy=FAST_RETRIES)
        # In whichever layout the tables have, as the application's own processes read them.
        application = LeaseApplication(self.config)
        self.state: CoordinatorStateStore = application.state_store_with(FAST_RETRIES)
        self.metrics: WorkerMetricsStore = application.worker_metrics

    # --- producing -----------------------------------------------------------------------------

    def produce(self, count: int, stream: str | None = None, hot_keys: int = 0) -> list[StreamRecord]:
        """Put `count` records with unique payloads; with `hot_keys`, half of them share that few keys (skew)."""
        stream = stream or self.streams[0]
        entries = []
        for _ in range(count):
            serial = next(self._serial)
            key = f"hot-{serial % hot_keys}" if hot_keys and serial % 2 == 0 else f"key-{serial}"
            entries.append({"Data": f"{stream}/record-{serial:07d}".encode(), "PartitionKey": key})
        written = [
            StreamRecord.acknowledged(entry, result) for entry, result in put_entries(self.kinesis, stream, entries)
        ]
        self.produced.extend(written)
        return written

    # --- one round -----------------------------------------------------------------------------

    def sync(self) -> ShardSyncReport:
        source = KinesisShardSource(self.kinesis, retry_policy=FAST_RETRIES)
        return sync_streams(self.streams, self.config, self.store, source, self.state)

    def assign(self, workers: int) -> AssignmentReport:
        coordinator = AssignmentCoordinator(self.store, self.metrics, self.state, self.config)
        return coordinator.run(slot_ids(self.application_name, workers))

    def spec(
        self,
        workers: int,
        round_number: int,
        budget: LeaseBudget | None = None,
        transform: str | None = None,
        processing: RecordProcessing | None = None,
    ) -> ConsumeSpec:
        """The round's spec; `processing` (its record processing) or just a `transform`."""
        settings = self.config.with_overrides(
            aws_endpoint_url_kinesis=self.data_plane_kinesis or self.kinesis_endpoint,
            aws_endpoint_url_dynamodb=self.data_plane_dynamodb or self.dynamodb_endpoint,
        ).to_dict()
        return ConsumeSpec(
            streams=self.streams,
            num_workers=workers,
            output_uri=self.output_uri,
            round_number=round_number,
            budget=budget or LeaseBudget(),
            processing=processing or RecordProcessing(transform=transform),
            settings=settings,
        )

    def consume(self, spark: Any, workers: int, round_number: int, **options: Any) -> RoundReport:
        report = run_round(spark, self.spec(workers, round_number, **options))
        self.reports.append(report)
        return report

    def round(self, spark: Any, workers: int, **options: Any) -> RoundReport:
        """Sync, assign, consume, and keep the report as the DAG's finalize step does."""
        self.sync()
        assignment = self.assign(workers)
        report = self.consume(spark, workers, assignment.round_number, **options)
        forget_reported_losses(self.store, report.reported_losses())
        return report

    # --- checking ------------------------------------------------------------------------------

    def leases(self) -> dict[str, Lease]:
        return {lease.lease_key: lease for lease in self.store.list_leases()}

    def landed(self) -> list[StreamRecord]:
        return landed_records(self.output_uri, s3_endpoint_url=self.dynamodb_endpoint)  # moto serves S3 as well

    def analyst_table(self) -> AnalystTable | None:
        """The Iceberg or Delta table landed in, as DuckDB reads it; None: a Parquet dataset, or no table yet."""
        return analyst_table(self.output_uri, s3_endpoint_url=self.dynamodb_endpoint)


def pipeline_on_new_stream(
    name: str, shards: int, kinesis_endpoint: str, moto_endpoint: str, folder: Path, **settings: Any
) -> ConsumerPipeline:
    """The application `name` on a new stream of the same name with `shards` shards, landing in
    `folder`/lake; `settings` are its consumer settings."""
    create_stream(kinesis_client(kinesis_endpoint), name, shards)
    return ConsumerPipeline(name, (name,), kinesis_endpoint, moto_endpoint, str(folder / "lake"), settings=settings)


def duplicates(records: list[StreamRecord]) -> list[StreamRecord]:
    return [record for record, count in Counter(records).items() if count > 1]


def by_shard(records: list[StreamRecord]) -> dict[str, list[StreamRecord]]:
    shards: dict[str, list[StreamRecord]] = defaultdict(list)
    for record in records:
        shards[record.shard_id].append(record)
    return {
        shard: sorted(items, key=lambda r: (int(r.sequence_number), r.sub_sequence_number))
        for shard, items in shards.items()
    }


def file_order(output_dir: Path) -> dict[str, tuple[float, float]]:
    """Per shard: when its first and last files were published (local sink), to check parents before children."""
    times: dict[str, list[float]] = defaultdict(list)
    for path in output_dir.rglob("*.parquet"):
        if not path.name.startswith("_"):
            times[path.parent.name.removeprefix("shard_id=")].append(path.stat().st_mtime)
    return {shard: (min(values), max(values)) for shard, values in times.items()}
