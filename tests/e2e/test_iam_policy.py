"""docs/iam-policy.json is least privilege: it allows every AWS call a real run makes, and grants nothing else.

The real DAG (in-process `dag.test()`, the real operators, the real Spark job through spark-submit
with `local[2,4]`) and `leasectl teardown` run against the emulators through recording proxies
(devtools/fault_proxy.py): DynamoDB, S3 and CloudWatch (the rounds' metrics) -> proxy -> moto, Kinesis ->
proxy -> kinesis-mock.
The AWS connection's endpoints point at the proxies, and the operators hand them on to the Spark
driver and executors in the configuration, so every call of every process is seen. The run: a live
round on a 2-shard stream whose lease table is a KCL 2.x one (no owner index), a split, a live
round (SHARD_END, child leases, the children read), two idle rounds (the first cleans up the finished
parent), a backfill
round, the plugin's monitoring API reading both namespaces (the Airflow api-server runs it under the
same connection), then teardown of both namespaces. Tags and point-in-time recovery are configured so that the
table options' calls happen too. Every application decodes its records (a text decoder, with its schema) and sets
bad records aside (`bad_records=dead_letter`): each live round reads one record the decoder rejects among the
others, so that the dead letters beside the output (and beside the backfill's) are staged and made visible too.

A second application lands in an Iceberg table of AWS Glue with its files in S3 (Glue -> proxy -> moto,
configured as pyiceberg's catalogs are, in the environment of the Airflow tasks and spark-submit):
two live rounds (the first creates the table and its dead-letter table), a backfill round (its own two), then
`leasectl maintain` with the table's snapshots kept for a millisecond and the listings reporting its
files four days old, so that it expires the first round's snapshot and deletes what nothing names any
more (with what an attempt fenced after staging left), then `leasectl verify` and `restore`.

A third application lands in a Delta table on S3 (`delta:s3://...`, delta-rs given the connection's S3
endpoint): a live round (it creates the table and its dead-letter table, each a Delta table of its own;
a second round's calls would be the same on the same places), a checkpoint of the log after it (as an
earlier upkeep leaves one), a backfill round, then `leasectl maintain` with removed files kept for no
time, the log kept for as long as it has been since that checkpoint, and the listings reporting files
four days old: it compacts the round's files and vacuums them, deletes the log's entries before the
checkpoint, and removes what nothing will commit (what an attempt fenced after staging left, the
position map of a publisher that died before its commit); then `leasectl verify` and `restore`. Its
leasectl runs as a process: delta-rs holds the GIL while it reads a table's history, which a proxy in the
test's process must answer.

Every recorded call is then evaluated (tests/support/iam_policy.py) against the statements a
deployment on that sink attaches: every statement but the other sinks' (`Parquet*`, `Iceberg*`, `Delta*`)
and a decoder's these runs do not use (`DecodeGlueSchemaRegistry`).
Every action and resource each statement grants must have been needed by some call of one of the runs.
"""

from __future__ import annotations

import functools
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog

from devtools.airflow_env import load_dag_module, run_environment
from devtools.fault_proxy import FaultProxy, RecordedCall
from devtools.kinesis_streams import create_stream, kinesis_client, shards_of, split_shard
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON
from sinks import backfill_uri
from sinks.dead_lettering import dead_letter_uri
from sinks.parquet import ParquetSink, visible_path
from sinks.table.delta import DeltaSink
from sinks.table.delta_maintenance import STAGED_DATA_FILE
from sinks.table.iceberg import IcebergSink
from sinks.table.iceberg_maintenance import MAX_SNAPSHOT_AGE_PROPERTY
from spark_jobs import leasectl
from tests.support.airflow_dag import LOCAL_SPARK_CONNECTION, airflow_environment, consumed_cleanly, run_round
from tests.support.iam_policy import (
    Grant,
    IamRequest,
    Policy,
    PolicyError,
    as_named_in,
    evaluate,
    glob_matches,
    iam_requests,
    load_policy,
    parse_policy,
    substitute,
)
from tests.support.iceberg_tables import batch_of, catalog_environment, glue_catalog_properties, rows
from tests.support.leasectl import run_leasectl
from tests.support.spark_transforms import MALFORMED_MARK

REPOSITORY = Path(__file__).resolve().parents[2]
POLICY_FILE = REPOSITORY / "docs" / "iam-policy.json"
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
PREFIX = "lake/orders"
PLACEHOLDERS = ("Region", "Account", "Application", "Stream", "Bucket", "Prefix", "Database", "Table", "Registry")
# The statements only a deployment on that sink attaches, by their Sid's start; the rest every deployment does,
# but those only a pipeline with that decoder attaches.
SINK_STATEMENTS = {"parquet": "Parquet", "iceberg": "Iceberg", "delta": "Delta"}
DECODER_STATEMENTS = ("DecodeGlueSchemaRegistry",)
ICEBERG_CATALOG = "iamglue"
ICEBERG_TABLE = "orders"
WAREHOUSE = "warehouse"  # in the bucket: a Glue database without a location of its own is at <warehouse>/<name>.db
# Both applications decode their records and set the ones the decoder rejects aside.
DEAD_LETTERING = {"decode": "tests.support.spark_transforms:text_payload", "bad_records": "dead_letter"}

# Actions IAM authorizes on no resource (the policy's Resource is "*"), with the condition key that narrows each.
WITHOUT_RESOURCES = {"cloudwatch:PutMetricData": "cloudwatch:namespace"}

# Grants the runs cannot use, each with why the policy still needs it.
ABORTED_UPLOADS = (
    "pyarrow's S3 filesystem writes every file as a multipart upload and aborts it when a part or the "
    "completion fails, so a failed write leaves no billed parts behind; no upload fails in these runs"
)
FAN_OUT = (
    "these runs read by polling (the default retrieval); enhanced fan-out's consumer calls are run against the "
    "Kinesis stand-in and moto by tests/integration/test_stream_consumers.py, which no recording proxy sees"
)
FAN_OUT_GRANTS = {
    "FanOutConsumerLifecycle": (
        "kinesis:RegisterStreamConsumer",
        "kinesis:ListStreamConsumers",
        "kinesis:DescribeStreamConsumer",
        "kinesis:DeregisterStreamConsumer",
        "arn:aws:kinesis:${Region}:${Account}:stream/${Stream}",
    ),
    "FanOutConsumerReads": (
        "kinesis:DescribeStreamConsumer",
        "kinesis:DeregisterStreamConsumer",
        "kinesis:SubscribeToShard",
        "arn:aws:kinesis:${Region}:${Account}:stream/${Stream}/consumer/*",
    ),
}
TABLE_MIGRATION = (
    "phase 2 of KCL 3.5's table migration (migrate_all_entities_to_lease_table, docs/protocol.md §1.8) lists "
    "the coordinator-state records it moves and fences each move with the lock; these runs never turn it on, "
    "and tests/integration/test_table_migration.py runs it on moto"
)
TABLE_MIGRATION_GRANTS = (
    "dynamodb:Scan",
    "dynamodb:ConditionCheckItem",
    "arn:aws:dynamodb:${Region}:${Account}:table/${Application}-CoordinatorState",
    "arn:aws:dynamodb:${Region}:${Account}:table/${Application}-backfill-????????T??????*Z-????????T??????*Z-CoordinatorState",
)
GLUE_SCHEMA_REGISTRY = (
    "a pipeline with decode='glue_schema_registry' fetches each schema version once per executor; these runs "
    "decode with a function of their own, and tests/integration/test_consume_job_glue_schema_registry.py "
    "decodes against moto's Glue, which no recording proxy sees"
)
GLUE_SCHEMA_REGISTRY_GRANTS = (
    "glue:GetSchemaVersion",
    "arn:aws:glue:${Region}:${Account}:registry/${Registry}",
    "arn:aws:glue:${Region}:${Account}:schema/${Registry}/*",
)
NOT_EXERCISED = {
    **{
        Grant("DecodeGlueSchemaRegistry", "resource" if pattern.startswith("arn:") else "action", pattern): (
            GLUE_SCHEMA_REGISTRY
        )
        for pattern in GLUE_SCHEMA_REGISTRY_GRANTS
    },
    **{
        Grant("RoundTableMigration", "resource" if pattern.startswith("arn:") else "action", pattern): TABLE_MIGRATION
        for pattern in TABLE_MIGRATION_GRANTS
    },
    Grant("ParquetObjects", "action", "s3:AbortMultipartUpload"): ABORTED_UPLOADS,
    Grant("IcebergTableObjects", "action", "s3:AbortMultipartUpload"): ABORTED_UPLOADS,
    **{
        Grant(sid, "resource" if pattern.startswith("arn:") else "action", pattern): FAN_OUT
        for sid, patterns in FAN_OUT_GRANTS.items()
        for pattern in patterns
    },
}


# --- the recorded run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRun:
    application: str
    backfill_application: str
    stream: str
    bucket: str
    rounds: dict[str, dict[str, str]]  # round name -> task states
    round_calls: dict[str, list[RecordedCall]]  # round name -> the calls made while it ran
    monitored: list[dict[str, Any]]  # the monitoring API's overview and first page of leases of each namespace
    teardown_exit_codes: list[int]
    calls: list[RecordedCall]
    produced: list[bytes]
    landed: list[bytes]
    lease_checkpoints: list[str]
    malformed: list[bytes]  # the payloads the decoder rejects (not among `produced`)
    dead_letters: list[dict[str, Any]]  # the rows of the dead letters beside the output
    backfill_dead_letters: list[dict[str, Any]]  # and beside the backfill's
    dead_letter_prefixes: tuple[str, str]  # their places in the bucket: the output's, the backfill's
    stale_worker_metrics: dict[str, Any] | None  # a former slot's item, two days old before round 2, after the run
    table_migration: str | None  # the status of KCL 3.5's table migration after the run (the separate layout)

    @property
    def placeholders(self) -> dict[str, str]:
        return {
            "Region": REGION,
            "Account": ACCOUNT,
            "Application": self.application,
            "Stream": self.stream,
            "Bucket": self.bucket,
            "Prefix": PREFIX,
        }


@dataclass(frozen=True)
class TableRun:
    """The run of an application landing in a table (Iceberg or Delta): its rounds, then its upkeep."""

    placeholders: dict[str, str]
    backfill: str  # where the backfill landed: its Iceberg table's name, its Delta table's URI
    rounds: dict[str, dict[str, str]]
    leasectl_exit_codes: dict[str, int]  # command -> exit code
    calls: list[RecordedCall]
    maintain_calls: list[RecordedCall]
    produced: list[bytes]
    landed: list[bytes]
    backfilled: list[bytes]
    # What the fenced attempt staged: its data files, (Iceberg) manifest and receipt; (Delta) and a dead
    # publisher's position map.
    fenced_files: list[str]
    malformed: list[bytes]
    dead_letters: list[dict[str, Any]]
    backfill_dead_letters: list[dict[str, Any]]


@pytest.fixture(scope="module")
def proxies(moto_endpoint: str, kinesis_endpoint: str) -> Iterator[dict[str, FaultProxy]]:
    with (
        FaultProxy(moto_endpoint) as dynamodb,
        FaultProxy(moto_endpoint) as s3,
        FaultProxy(kinesis_endpoint) as kinesis,
        FaultProxy(moto_endpoint) as glue,
    ):
        yield {"dynamodb": dynamodb, "s3": s3, "kinesis": kinesis, "glue": glue}


def call_counts(proxies: Mapping[str, FaultProxy]) -> dict[str, int]:
    return {service: len(proxy.calls()) for service, proxy in proxies.items()}


def calls_since(proxies: Mapping[str, FaultProxy], counts: Mapping[str, int]) -> list[RecordedCall]:
    return [call for service, proxy in proxies.items() for call in proxy.calls()[counts[service] :]]


@dataclass
class DagRounds:
    """DAG runs of one application: each round's task states, and the calls made while it ran."""

    dag: Any
    proxies: Mapping[str, FaultProxy]
    conf: dict[str, Any]
    states: dict[str, dict[str, str]] = field(default_factory=dict)
    calls: dict[str, list[RecordedCall]] = field(default_factory=dict)

    def run(self, name: str, **conf: Any) -> None:
        counts = call_counts(self.proxies)
        self.states[name] = run_round(self.dag, {**self.conf, **conf})
        self.calls[name] = calls_since(self.proxies, counts)


def window_bound() -> datetime:
    """A backfill window's bound: kinesis-mock compares AT_TIMESTAMP in whole seconds, and a time before
    a stream existed lists every shard, a split's children included (which the hash-range check
    refuses), so a bound is a whole second after everything before it."""
    time.sleep(1.1)
    return datetime.now(UTC).replace(microsecond=0)


def window_name(start: datetime, end: datetime) -> str:
    return f"{start:%Y%m%dT%H%M%SZ}-{end:%Y%m%dT%H%M%SZ}"


def leasectl_main(application: str, proxies: Mapping[str, FaultProxy], *command: str) -> int:
    """The installed leasectl, in this process, on the application's tables and streams through the proxies."""
    settings = (
        *("--set", f"aws_endpoint_url_dynamodb={proxies['dynamodb'].endpoint}"),
        *("--set", f"aws_endpoint_url_kinesis={proxies['kinesis'].endpoint}"),
        *("--set", f"aws_region={REGION}"),
    )
    return leasectl.main(["--app", application, *settings, "--set", "table_status_poll_seconds=0.05", *command])


def leasectl_process(application: str, proxies: Mapping[str, FaultProxy], *command: str) -> int:
    """The installed leasectl as a process, on the application's tables and S3 through the proxies. (delta-rs
    holds the GIL while it reads a table's history, so a proxy in this process could not answer it.)"""
    done = run_leasectl(
        *("--app", application, "--set", f"aws_region={REGION}", *command),
        dynamodb=proxies["dynamodb"].endpoint,
        kinesis=proxies["kinesis"].endpoint,
        AWS_ENDPOINT_URL_S3=proxies["s3"].endpoint,
    )
    print(f"leasectl {' '.join(command)}:", done.stdout, done.stderr, sep="\n")
    return done.returncode


@pytest.fixture(scope="module")
def proxied_environment(proxies: dict[str, FaultProxy], airflow_metadata_db: None) -> Iterator[None]:
    """The AWS connection through the proxies, Spark, and the table options; every variable restored after."""
    variables = run_environment(
        proxies["kinesis"].endpoint,
        proxies["dynamodb"].endpoint,
        LOCAL_SPARK_CONNECTION,
        # Table options a deployment may set: their calls (TagResource, UpdateContinuousBackups) must be allowed.
        extra={
            "KINESIS_LEASE_TAGS": json.dumps({"team": "data", "cost-center": "lake"}),
            "KINESIS_LEASE_LEASE_TABLE_PITR_ENABLED": "true",
        },
        s3_endpoint=proxies["s3"].endpoint,
    )
    with airflow_environment(variables):
        yield


def create_kcl2_lease_table(client: Any, name: str) -> None:
    """A lease table as KCL 2.x leaves it: hash key leaseKey, no owner index."""
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def produce(client: Any, stream: str, count: int, serial: list[int], malformed: list[bytes]) -> list[bytes]:
    """`count` records of text (their payloads returned) and, in their middle, one more that the decoder
    rejects (its payload appended to `malformed`)."""
    payloads = []
    for _ in range(count):
        payloads.append(f"{stream}/record-{serial[0]:06d}".encode())
        serial[0] += 1
    key = f"{stream}/malformed-{len(malformed)}"
    malformed.append(MALFORMED_MARK + key.encode())
    keyed = [(data, data.decode()) for data in payloads]
    keyed.insert(count // 2, (malformed[-1], key))
    pending = [{"Data": data, "PartitionKey": key} for data, key in keyed]
    while pending:
        results = client.put_records(StreamName=stream, Records=pending)["Records"]
        pending = [entry for entry, result in zip(pending, results) if "ErrorCode" in result]
        time.sleep(0.05 if pending else 0)
    return payloads


@pytest.fixture(scope="module")
def recorded_run(
    proxied_environment: None, proxies: dict[str, FaultProxy], moto_endpoint: str, kinesis_endpoint: str
) -> RecordedRun:
    token = uuid.uuid4().hex[:8]
    application, stream, bucket = f"iam-app-{token}", f"iam-stream-{token}", f"iam-lake-{token}"
    output = f"s3://{bucket}/{PREFIX}"
    kinesis = kinesis_client(kinesis_endpoint)
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=REGION)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION).create_bucket(Bucket=bucket)
    create_stream(kinesis, stream, 2)
    create_kcl2_lease_table(dynamodb, application)
    counts = call_counts(proxies)
    # The Parquet run sets its applications up in KCL 3.0-3.4's separate layout, so that the grants on the
    # two separate tables are exercised, and asks for KCL 3.5's table migration, whose phase 1 its rounds
    # begin; the Iceberg and Delta runs keep the default, KCL 3.5's single table.
    layout = {
        "KINESIS_LEASE_LEASE_TABLE_LAYOUT": "separate",
        "KINESIS_LEASE_MIGRATE_ALL_ENTITIES_TO_LEASE_TABLE": "true",
    }
    with airflow_environment(layout):
        rounds = DagRounds(
            load_dag_module("kinesis_lease_pipeline_iam_policy").dag,
            proxies,
            {
                "streams": [stream],
                "application_name": application,
                "num_workers": 2,
                "initial_position": "TRIM_HORIZON",
                "output_uri": output,
                **DEAD_LETTERING,
            },
        )
        serial, malformed = [0], []
        window_start = window_bound()
        produced = produce(kinesis, stream, 120, serial, malformed)
        rounds.run("first")
        # A slot of a wider round, silent for two days: the next round's assignment deletes its item.
        stale = {"TableName": f"{application}-WorkerMetricStats", "Key": {"wid": {"S": f"{application}-worker-7"}}}
        two_days_ago = str(int(time.time()) - 2 * 86_400)
        dynamodb.put_item(TableName=stale["TableName"], Item={**stale["Key"], "lut": {"N": two_days_ago}})
        split_shard(kinesis, stream, sorted(shard.shard_id for shard in shards_of(kinesis, stream))[0])
        produced += produce(kinesis, stream, 80, serial, malformed)
        rounds.run("after-split")  # the parent to its end, and its children in the same round
        rounds.run(
            "cleanup"
        )  # nothing new to read: shard sync deletes the finished parent, the consume step is skipped
        rounds.run("idle")
        window_end = window_bound()
        rounds.run("backfill", mode="backfill", start=window_start.isoformat(), end=window_end.isoformat())
    backfill_application = f"{application}-backfill-{window_name(window_start, window_end)}"

    from kinesis_lease.aws_connection import aws_access
    from kinesis_lease.monitoring import LeaseQuery, application_document, leases_document, read_application
    from kinesis_lease.ui_app import AWS_CONN_ID

    # What the monitoring API reads for its overview and a page of leases, through the same connection.
    monitored = []
    for name in (application, backfill_application):
        reads = read_application(aws_access(AWS_CONN_ID, {"application_name": name}).app)
        monitored.append({**application_document(reads), "leases": leases_document(reads, LeaseQuery())["leases"]})
    checkpoints = [
        item["checkpoint"]["S"] for item in dynamodb.scan(TableName=application, ConsistentRead=True)["Items"]
    ]
    stale_after = dynamodb.get_item(**stale, ConsistentRead=True).get("Item")
    migration = dynamodb.get_item(
        TableName=f"{application}-CoordinatorState", Key={"key": {"S": "TableMigration3.5"}}, ConsistentRead=True
    ).get("Item")
    teardown = [leasectl_main(name, proxies, "teardown", "--yes") for name in (application, backfill_application)]

    def dataset(uri: str) -> pa.Table:
        return ParquetSink.from_uri(uri, s3_endpoint_url=moto_endpoint, region=REGION).read_dataset()

    table = dataset(output)
    live, backfill = (
        dead_letter_uri(uri) for uri in (output, backfill_uri(output, window_name(window_start, window_end)))
    )
    return RecordedRun(
        application,
        backfill_application,
        stream,
        bucket,
        rounds.states,
        rounds.calls,
        monitored,
        teardown,
        calls_since(proxies, counts),
        produced,
        table.column("data").to_pylist(),
        checkpoints,
        malformed,
        dataset(live).to_pylist(),
        dataset(backfill).to_pylist(),
        (f"{live.removeprefix(f's3://{bucket}/')}/", f"{backfill.removeprefix(f's3://{bucket}/')}/"),
        stale_after,
        None if migration is None else migration["tm"]["S"],
    )


FENCED_SHARD = "shardId-000000000000"


def stage_as_a_fenced_iceberg_attempt(sink: IcebergSink) -> list[str]:
    """Stage a batch that no lease commits, as an attempt fenced after staging leaves it; its data
    files, manifest and receipt."""
    staged = sink.stage(batch_of(TRIM_HORIZON, 1, 5, FENCED_SHARD), rows(1, 5), "fenced")
    receipt = sink.read_receipt(staged.token or "")
    table = sink.table()
    assert table is not None
    data_files = [data_file.file_path for data_file in sink.staged_data_files(table, receipt)]
    return [*data_files, str(receipt.manifest_path), sink.receipt_path(table, receipt.receipt_id)]


def stage_as_a_fenced_delta_attempt(sink: DeltaSink) -> list[str]:
    """The same in a Delta table: its data files and receipt."""
    staged = sink.stage(batch_of(TRIM_HORIZON, 1, 5, FENCED_SHARD), rows(1, 5), "fenced")
    receipt = sink.read_receipt(staged.token or "")
    paths = [*(file["path"] for file in receipt.files), sink.receipt_path(receipt.receipt_id)]
    return [f"{sink.location}/{path}" for path in paths]


def create_as_a_dead_publisher(sink: DeltaSink) -> str:
    """The position map of the next version of the application's transaction, as a publisher that died
    before its commit leaves it; its place."""
    table = sink.table()
    assert table is not None
    path = sink.positions_path(sink.transaction_version(table) + 1)
    assert sink.storage.create(path, b'{"format": "died before its commit"}')
    return f"{sink.location}/{path}"


@contextmanager
def listings_aged(proxy: FaultProxy, by: timedelta) -> Iterator[None]:
    proxy.age_listings(by)
    try:
        yield
    finally:
        proxy.age_listings(timedelta(0))


# How much older than they are the upkeep's listings report files: past the orphan age of 3 days.
LISTING_AGE = timedelta(days=4)


@dataclass(frozen=True)
class LiveRounds:
    produced: list[bytes]
    malformed: list[bytes]
    window_start: datetime  # of the window a backfill of what they read covers


LIVE_ROUNDS = {"first": 60, "second": 40}  # round -> records produced before it (and one the decoder rejects)


def live_rounds(rounds: DagRounds, kinesis: Any, stream: str, names: tuple[str, ...]) -> LiveRounds:
    """Live rounds (of `LIVE_ROUNDS`): the first creates the table and its dead-letter table, a second
    commits to them."""
    serial: list[int] = [0]
    malformed: list[bytes] = []
    produced: list[bytes] = []
    window_start = window_bound()
    for name in names:
        produced += produce(kinesis, stream, LIVE_ROUNDS[name], serial, malformed)
        rounds.run(name)
    return LiveRounds(produced, malformed, window_start)


def backfill_round(rounds: DagRounds, live: LiveRounds) -> str:
    """A backfill round of what the live rounds read; its window's name."""
    window_end = window_bound()
    rounds.run("backfill", mode="backfill", start=live.window_start.isoformat(), end=window_end.isoformat())
    return window_name(live.window_start, window_end)


def upkeep(
    output: str, proxies: Mapping[str, FaultProxy], leasectl_run: Callable[..., int]
) -> tuple[dict[str, int], list[RecordedCall]]:
    """`leasectl maintain` on aged listings, then `verify` and `restore` (each by `leasectl_run`): their
    exit codes, and the calls `maintain` made."""
    before_maintain = call_counts(proxies)
    with listings_aged(proxies["s3"], LISTING_AGE):
        exit_codes = {"maintain": leasectl_run("maintain", "--output-uri", output, "--yes")}
    maintain_calls = calls_since(proxies, before_maintain)
    exit_codes.update(
        verify=leasectl_run("verify", "--output-uri", output),
        restore=leasectl_run("restore", "--output-uri", output, "--yes"),
    )
    return exit_codes, maintain_calls


def table_placeholders(application: str, stream: str, bucket: str, prefix: str, **more: str) -> dict[str, str]:
    return {
        "Region": REGION,
        "Account": ACCOUNT,
        "Application": application,
        "Stream": stream,
        "Bucket": bucket,
        "Prefix": prefix,
        **more,
    }


def table_conf(application: str, stream: str, output: str) -> dict[str, Any]:
    return {
        "streams": [stream],
        "application_name": application,
        "num_workers": 2,
        "initial_position": "TRIM_HORIZON",
        "output_uri": output,
        **DEAD_LETTERING,
    }


@pytest.fixture(scope="module")
def iceberg_run(
    proxied_environment: None, proxies: dict[str, FaultProxy], moto_endpoint: str, kinesis_endpoint: str
) -> TableRun:
    token = uuid.uuid4().hex[:8]
    application, stream, bucket = f"iam-ice-{token}", f"iam-ice-stream-{token}", f"iam-warehouse-{token}"
    database = f"iam_db_{token}"
    output = f"iceberg://{ICEBERG_CATALOG}/{database}.{ICEBERG_TABLE}"
    warehouse = f"s3://{bucket}/{WAREHOUSE}"
    kinesis = kinesis_client(kinesis_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION).create_bucket(Bucket=bucket)
    boto3.client("glue", endpoint_url=moto_endpoint, region_name=REGION).create_database(
        DatabaseInput={"Name": database}
    )
    create_stream(kinesis, stream, 2)
    # The deployment's catalog goes through the proxies; the test's own look at the tables does not.
    proxied = glue_catalog_properties(proxies["glue"].endpoint, proxies["s3"].endpoint, warehouse)
    direct = load_catalog("direct", **glue_catalog_properties(moto_endpoint, moto_endpoint, warehouse))
    counts = call_counts(proxies)
    with airflow_environment(catalog_environment(ICEBERG_CATALOG, proxied)):
        rounds = DagRounds(
            load_dag_module("kinesis_lease_pipeline_iam_policy_iceberg").dag,
            proxies,
            table_conf(application, stream, output),
        )
        ran = live_rounds(rounds, kinesis, stream, ("first", "second"))
        backfill_table = backfill_uri(output, backfill_round(rounds, ran)).rpartition(".")[2]

        # A deployment keeping a millisecond of history, and what an attempt fenced after staging leaves.
        with direct.load_table((database, ICEBERG_TABLE)).transaction() as settings:
            settings.set_properties({MAX_SNAPSHOT_AGE_PROPERTY: "1"})
        fenced_files = stage_as_a_fenced_iceberg_attempt(IcebergSink(output, application, catalog=direct))
        exit_codes, maintain_calls = upkeep(output, proxies, functools.partial(leasectl_main, application, proxies))
    calls = calls_since(proxies, counts)

    def table_rows(table_name: str) -> pa.Table:
        return direct.load_table((database, table_name)).scan().to_arrow()

    def records(table_name: str) -> list[bytes]:
        return table_rows(table_name).column("data").to_pylist()

    def dead_letters(table_name: str) -> list[dict[str, Any]]:
        return table_rows(dead_letter_table(table_name)).to_pylist()

    return TableRun(
        table_placeholders(
            application, stream, bucket, f"{WAREHOUSE}/{database}.db", Database=database, Table=ICEBERG_TABLE
        ),
        backfill_table,
        rounds.states,
        exit_codes,
        calls,
        maintain_calls,
        ran.produced,
        records(ICEBERG_TABLE),
        records(backfill_table),
        fenced_files,
        ran.malformed,
        dead_letters(ICEBERG_TABLE),
        dead_letters(backfill_table),
    )


def dead_letter_table(table_name: str) -> str:
    """The table beside `table_name` (of any database) that its dead letters go to."""
    return dead_letter_uri(f"iceberg://{ICEBERG_CATALOG}/database.{table_name}").rpartition(".")[2]


@pytest.fixture(scope="module")
def delta_run(
    proxied_environment: None, proxies: dict[str, FaultProxy], moto_endpoint: str, kinesis_endpoint: str
) -> TableRun:
    token = uuid.uuid4().hex[:8]
    application, stream, bucket = f"iam-delta-{token}", f"iam-delta-stream-{token}", f"iam-delta-lake-{token}"
    output = f"delta:s3://{bucket}/{PREFIX}"
    kinesis = kinesis_client(kinesis_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name=REGION).create_bucket(Bucket=bucket)
    create_stream(kinesis, stream, 2)
    counts = call_counts(proxies)
    # The job and leasectl reach S3 through the proxy (the connection's endpoint); the test's own look does not.
    rounds = DagRounds(
        load_dag_module("kinesis_lease_pipeline_iam_policy_delta").dag, proxies, table_conf(application, stream, output)
    )
    # One live round: a second one's calls are the first one's on the same places (Glue's CreateTable and
    # UpdateTable differ; a Delta table's creation and commits are puts under its prefix alike).
    ran = live_rounds(rounds, kinesis, stream, ("first",))

    def direct(uri: str) -> DeltaSink:
        return DeltaSink(uri, application, s3_endpoint_url=moto_endpoint, region=REGION)

    def live_table() -> DeltaTable:
        table = direct(output).table()
        assert table is not None
        return table

    # A checkpoint of the log at the round's commit, as an earlier upkeep makes one.
    live_table().create_checkpoint()
    checkpointed = datetime.now(UTC)
    backfill = backfill_uri(output, backfill_round(rounds, ran))
    # A deployment keeping the files commits removed for no time, and its log for as long as it has been
    # since that checkpoint (on the clock of the aged listings): the upkeep deletes the files compaction
    # replaced, and the log's entries before the checkpoint (the table's creation; the round's commit
    # stays, and with it what the table says each lease landed); and what an attempt fenced after staging
    # leaves, and a publisher that died between its position map and its commit.
    kept = LISTING_AGE + (datetime.now(UTC) - checkpointed)
    live_table().alter.set_table_properties(
        {
            "delta.deletedFileRetentionDuration": "interval 0 hours",
            "delta.logRetentionDuration": f"interval {int(kept.total_seconds())} seconds",
        }
    )
    fenced_files = stage_as_a_fenced_delta_attempt(direct(output))
    fenced_files.append(create_as_a_dead_publisher(direct(output)))
    exit_codes, maintain_calls = upkeep(output, proxies, functools.partial(leasectl_process, application, proxies))

    def rows_of(uri: str) -> pa.Table:
        landed = direct(uri).visible_rows()
        assert landed is not None, uri
        return landed

    return TableRun(
        table_placeholders(application, stream, bucket, PREFIX),
        backfill,
        rounds.states,
        exit_codes,
        calls_since(proxies, counts),
        maintain_calls,
        ran.produced,
        rows_of(output).column("data").to_pylist(),
        rows_of(backfill).column("data").to_pylist(),
        fenced_files,
        ran.malformed,
        rows_of(dead_letter_uri(output)).to_pylist(),
        rows_of(dead_letter_uri(backfill)).to_pylist(),
    )


RUNS = {"parquet": "recorded_run", "iceberg": "iceberg_run", "delta": "delta_run"}
TABLE_RUNS = {sink: fixture for sink, fixture in RUNS.items() if sink != "parquet"}


def deployment_policy(sink: str, values: Mapping[str, str]) -> Policy:
    """The statements a deployment on `sink` attaches (all but the other sinks' and the Glue Schema Registry
    decoder's), with `values` for the placeholders."""
    document = json.loads(POLICY_FILE.read_text())
    others = (*(prefix for name, prefix in SINK_STATEMENTS.items() if name != sink), *DECODER_STATEMENTS)
    document["Statement"] = [entry for entry in document["Statement"] if not entry["Sid"].startswith(others)]
    return parse_policy(json.loads(substitute(json.dumps(document), values)))


def template_policy() -> Policy:
    """The whole policy with its placeholders kept, to name grants alike across runs."""
    return load_policy(POLICY_FILE, {name: f"${{{name}}}" for name in PLACEHOLDERS})


def requests_of(calls: list[RecordedCall]) -> list[IamRequest]:
    return [request for call in calls for request in iam_requests(call, REGION, ACCOUNT)]


# --- the run -------------------------------------------------------------------------------------


def test_the_proxied_run_consumes_every_record_once_skips_the_idle_round_and_tears_both_namespaces_down(recorded_run):
    rounds = recorded_run.rounds
    for name in ("first", "after-split", "backfill"):
        assert consumed_cleanly(rounds[name]), (name, rounds[name])
    for name in ("cleanup", "idle"):
        skipped = (rounds[name]["check_idle"], rounds[name]["assign_leases"], rounds[name]["consume"])
        assert skipped == ("skipped", "skipped", "skipped"), (name, rounds[name])
        assert rounds[name]["finalize_round"] == rounds[name]["release_leadership"] == "success"
    assert sorted(recorded_run.landed) == sorted(recorded_run.produced)
    assert recorded_run.lease_checkpoints.count(SHARD_END) == 0, "the finished parent's lease is cleaned up"
    assert len(recorded_run.lease_checkpoints) == 3  # the open parent and the two children
    monitored = [(overview["application"], bool(overview["leases"])) for overview in recorded_run.monitored]
    assert monitored == [(recorded_run.application, True), (recorded_run.backfill_application, True)]
    assert recorded_run.teardown_exit_codes == [0, 0]
    assert recorded_run.stale_worker_metrics is None, "the round after it deleted the former slot's stale item"
    # Every round's release step takes the next step of the table migration the application asked for: the
    # first one's slots all carried the support code, and no round came an hour later.
    assert recorded_run.table_migration == "TABLE_MIGRATION_STATUS_INIT"


STAGING_WRITES = ("PutObject", "CompleteMultipartUpload")


def test_the_parquet_run_stages_its_dead_letters_and_promotes_them_beside_the_output_and_beside_the_backfill_s(
    recorded_run,
):
    for prefix in recorded_run.dead_letter_prefixes:
        calls = [(call.operation, call.key) for call in recorded_run.calls if (call.key or "").startswith(prefix)]
        print(prefix, "calls:", json.dumps(calls, indent=1))
        staged = {key for operation, key in calls if "/_staged-" in key and operation in STAGING_WRITES}
        copied = {key for operation, key in calls if operation == "CopyObject"}
        deleted = {key for operation, key in calls if operation == "DeleteObject"}
        assert staged, prefix
        assert copied == {visible_path(key) for key in staged} and deleted == staged, (prefix, calls)


def test_an_idle_round_scans_the_lease_table_once_and_writes_only_the_lock_and_its_history(recorded_run):
    calls = recorded_run.round_calls["idle"]
    on_leases = Counter(call.operation for call in calls if recorded_run.application in call.tables)
    writes = Counter(
        (call.operation, call.tables) for call in calls if call.operation in ("PutItem", "UpdateItem", "DeleteItem")
    )
    print("idle round:", dict(on_leases), dict(writes))
    assert on_leases["Scan"] == 1 and on_leases["Query"] == 0
    assert not any(recorded_run.application in tables for _, tables in writes), writes
    assert sum(writes.values()) <= 8, writes  # the lock (take, heartbeats, release) and the round's history
    kinesis = Counter(call.operation for call in calls if call.service == "kinesis")
    assert kinesis["GetRecords"] <= 3, kinesis  # one per open lease, stopping at the first with work


def test_the_operators_the_spark_executors_and_leasectl_all_called_aws_through_the_proxies(recorded_run):
    operations = Counter((call.service, call.operation) for call in recorded_run.calls)
    print("calls per operation:", json.dumps({f"{s}:{o}": n for (s, o), n in sorted(operations.items())}, indent=1))
    executor_calls = {("dynamodb", "Query"), ("kinesis", "GetRecords"), ("s3", "CompleteMultipartUpload")}
    operator_calls = {
        ("dynamodb", "CreateTable"),
        ("kinesis", "ListShards"),
        ("s3", "GetObject"),
        ("cloudwatch", "PutMetricData"),  # the finalize step's metrics, to the connection's endpoint
    }
    assert executor_calls | operator_calls | {("dynamodb", "DeleteTable")} <= set(operations)
    assert all(call.stream == recorded_run.stream for call in recorded_run.calls if call.service == "kinesis")


@pytest.mark.parametrize("sink", list(TABLE_RUNS))
def test_a_table_run_lands_every_record_once_in_its_table_and_its_backfill_s_and_leasectl_succeeds(sink, request):
    run = request.getfixturevalue(TABLE_RUNS[sink])
    for name, states in run.rounds.items():
        assert consumed_cleanly(states), (name, states)
    assert sorted(run.landed) == sorted(run.produced)
    assert sorted(run.backfilled) == sorted(run.produced)
    assert run.leasectl_exit_codes == {"maintain": 0, "verify": 0, "restore": 0}


def test_the_iceberg_sink_asks_glue_for_its_database_and_to_get_create_and_update_its_four_tables(iceberg_run):
    glue = [call for call in iceberg_run.calls if call.service == "glue"]
    print("Glue calls:", dict(Counter((call.operation, call.status) for call in glue)))
    assert {call.operation for call in glue} == {"GetDatabase", "GetTable", "CreateTable", "UpdateTable"}
    assert {call.database for call in glue} == {iceberg_run.placeholders["Database"]}
    tables = (ICEBERG_TABLE, iceberg_run.backfill)
    assert {table for call in glue for table in call.tables} == {*tables, *map(dead_letter_table, tables)}
    for table in map(dead_letter_table, tables):  # created by the job, then committed to
        operations = {call.operation for call in glue if table in call.tables and call.status == 200}
        assert {"CreateTable", "UpdateTable"} <= operations, (table, operations)


def test_leasectl_maintain_deletes_the_fenced_attempt_s_files_and_the_expired_snapshot_s_list_and_position_map(
    iceberg_run,
):
    values = iceberg_run.placeholders
    metadata, application = f"{values['Prefix']}/{ICEBERG_TABLE}/metadata/", values["Application"]
    fenced = {path.removeprefix(f"s3://{values['Bucket']}/") for path in iceberg_run.fenced_files}
    deleted = deleted_keys(iceberg_run.maintain_calls)
    others = [key.removeprefix(metadata) for key in deleted if key not in fenced]
    print("maintain deleted:", json.dumps(deleted, indent=1))
    assert fenced <= set(deleted)
    assert all(key.startswith(metadata) for key in deleted if key not in fenced)
    assert len([name for name in others if name.startswith(f"kinesis-positions/{application}/")]) == 1
    assert len([name for name in others if name.startswith("snap-")]) == 1  # the first round's manifest list
    assert [name for name in others if name.startswith(f"kinesis-staged/{application}/")], "the first round's"
    own = (f"kinesis-staged/{application}/", f"kinesis-positions/{application}/", "snap-")
    assert [name for name in others if not name.startswith(own)] == []
    assert len(deleted_keys(iceberg_run.calls)) == len(deleted), "only the upkeep deletes"


def test_leasectl_maintain_deletes_the_orphans_the_files_compaction_replaced_and_the_log_before_its_checkpoint(
    delta_run,
):
    values = delta_run.placeholders
    table, application = f"{values['Prefix']}/", values["Application"]
    orphans = {path.removeprefix(f"s3://{values['Bucket']}/") for path in delta_run.fenced_files}
    deleted = deleted_keys(delta_run.maintain_calls)
    print("maintain deleted:", json.dumps(deleted, indent=1))
    assert orphans <= set(deleted)
    assert all(key.startswith(table) for key in deleted)
    others = [key.removeprefix(table) for key in deleted if key not in orphans]
    # The table's creation; the round's commit stays, with the checkpoint made at it.
    assert [name for name in others if name.startswith("_delta_log/")] == [f"_delta_log/{0:020d}.json"]
    data_files = {name for name in others if STAGED_DATA_FILE.fullmatch(name.rpartition("/")[2])}
    assert len(data_files) >= 2, "the files compaction replaced: one per shard at least"
    own = (f"_kinesis/staged/{application}/", "_delta_log/")  # (receipts of batches the table holds)
    assert [name for name in others if not name.startswith(own) and name not in data_files] == []
    assert len(deleted_keys(delta_run.calls)) == len(deleted), "only the upkeep deletes"


def test_the_delta_run_commits_each_log_entry_by_a_conditional_put_so_it_needs_no_lock_table(delta_run):
    log_entry = re.compile(r".*/_delta_log/\d{20}\.json")
    puts = [call for call in delta_run.calls if call.operation == "PutObject"]
    commits = [call for call in puts if log_entry.fullmatch(call.key or "")]
    tables = {(call.key or "").partition("/_delta_log/")[0] for call in commits}
    assert len(tables) == 4, "the table, the backfill's and their dead-letter tables"
    assert all(("if-none-match", "*") in call.conditions for call in commits), commits


def deleted_keys(calls: list[RecordedCall]) -> list[str]:
    """The keys the calls deleted: a DeleteObject's, and each of a DeleteObjects'."""
    deletes = [call for call in calls if call.operation in ("DeleteObject", "DeleteObjects")]
    return [key for call in deletes for key in (call.keys or (call.key or "",))]


@pytest.mark.parametrize("sink", list(RUNS))
def test_each_record_the_decoder_rejects_is_set_aside_once_beside_the_output_and_once_beside_the_backfill_s(
    sink, request
):
    run = request.getfixturevalue(RUNS[sink])
    live = 2 if sink == "parquet" else len(run.rounds) - 1  # a table run's rounds: its live ones and a backfill
    assert len(run.malformed) == live  # one in each live round
    for dead_letters in (run.dead_letters, run.backfill_dead_letters):
        assert sorted(row["data"] for row in dead_letters) == sorted(run.malformed)
        assert all("UnicodeDecodeError" in row["error"] for row in dead_letters), dead_letters
        assert {row["stream_name"] for row in dead_letters} == {run.placeholders["Stream"]}


# --- the policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sink", list(RUNS))
def test_every_call_of_the_run_is_allowed_by_the_statements_a_deployment_on_its_sink_attaches(sink, request):
    run = request.getfixturevalue(RUNS[sink])
    evaluation = evaluate(deployment_policy(sink, run.placeholders), requests_of(run.calls))
    print(f"IAM requests per action ({sink}):", json.dumps(evaluation.actions, indent=1))
    denied = sorted({str(request) for request in evaluation.denied})
    assert denied == [], "calls the policy does not allow:\n" + "\n".join(denied)


def test_every_action_and_resource_the_policy_grants_was_needed_by_one_of_the_runs(request):
    template = template_policy()
    used: set[Grant] = set()
    for sink, fixture in RUNS.items():
        run = request.getfixturevalue(fixture)
        policy = deployment_policy(sink, run.placeholders)
        used |= as_named_in(template, policy, evaluate(policy, requests_of(run.calls)).used)
    needless = sorted(map(str, template.grants() - used - set(NOT_EXERCISED)))
    assert needless == [], "granted but never needed by a run:\n" + "\n".join(needless)
    assert set(NOT_EXERCISED) <= template.grants(), "an exemption names a grant the policy no longer has"


def test_the_policy_names_every_action_and_resource_explicitly_with_exactly_its_nine_placeholders():
    text = POLICY_FILE.read_text()
    policy = load_policy(POLICY_FILE, dict.fromkeys(PLACEHOLDERS, "x"))  # refuses Deny and anything unmodelled
    assert set(re.findall(r"\$\{(\w+)\}", text)) == set(PLACEHOLDERS)
    assert not [action for statement in policy.statements for action in statement.actions if "*" in action]
    # "*" only for actions that have no resource of their own, narrowed by their condition key instead.
    unnamed = [statement for statement in policy.statements if "*" in statement.resources]
    assert all(
        set(statement.actions) <= set(WITHOUT_RESOURCES)
        and {WITHOUT_RESOURCES[action] for action in statement.actions}
        <= {key for keys in statement.conditions.values() for key in keys}
        for statement in unnamed
    ), [statement.sid for statement in unnamed]


def test_a_deployment_on_each_sink_attaches_the_shared_statements_and_none_of_the_other_sinks():
    values = dict.fromkeys(PLACEHOLDERS, "x")
    attached = {sink: {s.sid for s in deployment_policy(sink, values).statements} for sink in RUNS}
    own = {
        "parquet": {"ParquetObjects", "ParquetStagedObjects"},
        "iceberg": {"IcebergCatalog", "IcebergTableObjects", "IcebergUpkeepDeletes"},
        "delta": {"DeltaTableObjects", "DeltaUpkeepDeletes"},
    }
    shared = set.intersection(*attached.values())
    assert "SinkBucket" in shared
    assert {sink: sids - shared for sink, sids in attached.items()} == own


# --- the evaluator -------------------------------------------------------------------------------

SAMPLE = parse_policy(
    {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Items",
                "Effect": "Allow",
                "Action": ["dynamodb:GetItem", "dynamodb:Put*"],
                "Resource": "arn:aws:dynamodb:r:1:table/app-backfill-????Z",
            },
            {
                "Sid": "Index",
                "Effect": "Allow",
                "Action": "dynamodb:Query",
                "Resource": "arn:aws:dynamodb:r:1:table/app/index/*",
            },
            {
                "Sid": "List",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::b",
                "Condition": {"StringLike": {"s3:prefix": "lake/*"}},
            },
        ],
    }
)

EVALUATOR_CASES = [
    pytest.param(
        IamRequest("dynamodb:GetItem", "arn:aws:dynamodb:r:1:table/app-backfill-2026Z"),
        True,
        id="exact-action-question-marks",
    ),
    pytest.param(
        IamRequest("DynamoDB:putitem", "arn:aws:dynamodb:r:1:table/app-backfill-2026Z"), True, id="action-glob-any-case"
    ),
    pytest.param(
        IamRequest("dynamodb:GetItem", "arn:aws:dynamodb:r:1:table/app-backfill-2026Z-WorkerMetricStats"),
        False,
        id="question-marks-are-one-character",
    ),
    pytest.param(
        IamRequest("dynamodb:GetItem", "arn:aws:dynamodb:r:1:table/APP-backfill-2026Z"),
        False,
        id="arns-are-case-sensitive",
    ),
    pytest.param(
        IamRequest("dynamodb:DeleteItem", "arn:aws:dynamodb:r:1:table/app-backfill-2026Z"),
        False,
        id="action-not-granted",
    ),
    pytest.param(IamRequest("dynamodb:Query", "arn:aws:dynamodb:r:1:table/app/index/Owner"), True, id="index-arn"),
    pytest.param(
        IamRequest("dynamodb:Query", "arn:aws:dynamodb:r:1:table/app"), False, id="index-grant-is-not-the-table"
    ),
    pytest.param(
        IamRequest("dynamodb:Query", "arn:aws:dynamodb:r:1:table/app/index/a/b"), True, id="star-spans-slashes"
    ),
    pytest.param(IamRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "lake/x/"}), True, id="condition-holds"),
    pytest.param(IamRequest("s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "other/"}), False, id="condition-fails"),
    pytest.param(IamRequest("s3:ListBucket", "arn:aws:s3:::b"), False, id="condition-key-absent"),
]


@pytest.mark.parametrize(("request_", "allowed"), EVALUATOR_CASES)
def test_the_evaluator_matches_actions_resources_and_conditions_as_iam_does(request_, allowed):
    assert bool(SAMPLE.allowing(request_)) is allowed


def test_only_star_and_question_mark_are_wildcards_in_an_arn():
    assert (glob_matches("table/[ab]", "table/a"), glob_matches("table/[ab]", "table/[ab]")) == (False, True)


MAPPING_CASES = [
    pytest.param(
        RecordedCall("dynamodb", "Query", 200, tables=("t",), index="i"),
        [("dynamodb:Query", "arn:aws:dynamodb:r:1:table/t/index/i")],
        id="query-on-index",
    ),
    pytest.param(
        RecordedCall("dynamodb", "CreateTable", 200, tables=("t",), parameters=("TableName", "Tags")),
        [
            ("dynamodb:CreateTable", "arn:aws:dynamodb:r:1:table/t"),
            ("dynamodb:TagResource", "arn:aws:dynamodb:r:1:table/t"),
        ],
        id="create-table-with-tags",
    ),
    pytest.param(
        RecordedCall("dynamodb", "BatchGetItem", 200, tables=("a", "b")),
        [
            ("dynamodb:BatchGetItem", "arn:aws:dynamodb:r:1:table/a"),
            ("dynamodb:BatchGetItem", "arn:aws:dynamodb:r:1:table/b"),
        ],
        id="batch-per-table",
    ),
    pytest.param(
        RecordedCall(
            "dynamodb",
            "TransactWriteItems",
            200,
            tables=("t", "u"),
            transaction=(("Update", "t"), ("Put", "t"), ("Put", "t"), ("ConditionCheck", "u")),
        ),
        [
            ("dynamodb:UpdateItem", "arn:aws:dynamodb:r:1:table/t"),
            ("dynamodb:PutItem", "arn:aws:dynamodb:r:1:table/t"),
            ("dynamodb:ConditionCheckItem", "arn:aws:dynamodb:r:1:table/u"),
        ],
        id="transaction-item-by-item",
    ),
    pytest.param(
        RecordedCall("kinesis", "GetRecords", 200, stream="s"),
        [("kinesis:GetRecords", "arn:aws:kinesis:r:1:stream/s")],
        id="get-records-on-the-iterator-s-stream",
    ),
    pytest.param(
        RecordedCall("s3", "HeadObject", 200, method="HEAD", bucket="b", key="p/k"),
        [("s3:GetObject", "arn:aws:s3:::b/p/k")],
        id="head-object-is-get-object",
    ),
    pytest.param(
        RecordedCall("s3", "UploadPart", 200, method="PUT", bucket="b", key="p/k", query=(("partNumber", "1"),)),
        [("s3:PutObject", "arn:aws:s3:::b/p/k")],
        id="upload-part-is-put-object",
    ),
    pytest.param(
        RecordedCall("s3", "HeadBucket", 200, method="HEAD", bucket="b"),
        [("s3:ListBucket", "arn:aws:s3:::b")],
        id="head-bucket-is-list-bucket",
    ),
    pytest.param(
        RecordedCall("s3", "DeleteObjects", 200, method="POST", bucket="b", query=(("delete", ""),), keys=("p/k", "q")),
        [("s3:DeleteObject", "arn:aws:s3:::b/p/k"), ("s3:DeleteObject", "arn:aws:s3:::b/q")],
        id="delete-objects-key-by-key",
    ),
    pytest.param(
        RecordedCall("s3", "GetObject", 404, method="GET", bucket="b", key="p/k"),
        [("s3:GetObject", "arn:aws:s3:::b/p/k"), ("s3:ListBucket", "arn:aws:s3:::b")],
        id="a-missing-object-s-404-needs-list-bucket",
    ),
    pytest.param(
        RecordedCall("glue", "GetDatabase", 200, database="d", parameters=("Name",)),
        [("glue:GetDatabase", "arn:aws:glue:r:1:catalog"), ("glue:GetDatabase", "arn:aws:glue:r:1:database/d")],
        id="glue-database-call-on-catalog-and-database",
    ),
    pytest.param(
        RecordedCall("glue", "UpdateTable", 200, tables=("t",), database="d", parameters=("DatabaseName",)),
        [
            ("glue:UpdateTable", "arn:aws:glue:r:1:catalog"),
            ("glue:UpdateTable", "arn:aws:glue:r:1:database/d"),
            ("glue:UpdateTable", "arn:aws:glue:r:1:table/d/t"),
        ],
        id="glue-table-call-on-catalog-database-and-table",
    ),
    pytest.param(
        RecordedCall("glue", "GetTables", 200, database="d", parameters=("DatabaseName",)),
        [
            ("glue:GetTables", "arn:aws:glue:r:1:catalog"),
            ("glue:GetTables", "arn:aws:glue:r:1:database/d"),
            ("glue:GetTables", "arn:aws:glue:r:1:table/d/*"),
        ],
        id="glue-table-listing-on-every-table-of-the-database",
    ),
    pytest.param(
        RecordedCall("cloudwatch", "PutMetricData", 200, namespace="orders"),
        [("cloudwatch:PutMetricData", "*")],
        id="put-metric-data-on-no-resource",
    ),
    pytest.param(
        RecordedCall("glue", "GetDatabases", 200),
        [("glue:GetDatabases", "arn:aws:glue:r:1:catalog"), ("glue:GetDatabases", "arn:aws:glue:r:1:database/*")],
        id="glue-database-listing-on-every-database",
    ),
]


@pytest.mark.parametrize(("call", "expected"), MAPPING_CASES)
def test_a_recorded_call_maps_to_the_iam_actions_and_resources_aws_authorizes(call, expected):
    assert [(request.action, request.resource) for request in iam_requests(call, "r", "1")] == expected


def test_a_glue_call_naming_another_account_s_catalog_is_refused_not_mapped_to_this_account_s():
    call = RecordedCall("glue", "GetTable", 200, tables=("t",), database="d", parameters=("CatalogId", "Name"))
    with pytest.raises(ValueError, match="CatalogId"):
        iam_requests(call, "r", "1")


def test_grants_of_a_substituted_policy_are_named_as_the_policy_file_names_them():
    document = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "A",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": ["arn:aws:s3:::${B}/x", "arn:aws:s3:::${B}/y"],
            }
        ],
    }
    template = parse_policy(document)
    policy = parse_policy(json.loads(substitute(json.dumps(document), {"B": "bucket"})))
    used = {Grant("A", "action", "s3:GetObject"), Grant("A", "resource", "arn:aws:s3:::bucket/y")}
    assert as_named_in(template, policy, used) == {
        Grant("A", "action", "s3:GetObject"),
        Grant("A", "resource", "arn:aws:s3:::${B}/y"),
    }


def test_a_list_objects_call_carries_its_prefix_as_the_s3_prefix_condition_key():
    call = RecordedCall(
        "s3",
        "ListObjectsV2",
        200,
        method="GET",
        bucket="b",
        query=(("delimiter", "/"), ("list-type", "2"), ("prefix", "lake/x/")),
    )
    (request,) = iam_requests(call, "r", "1")
    assert request.context == {"s3:prefix": "lake/x/", "s3:delimiter": "/"}


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param({"Sid": "D", "Effect": "Deny", "Action": "s3:*", "Resource": "*"}, id="deny"),
        pytest.param({"Sid": "N", "Effect": "Allow", "NotAction": "s3:*", "Resource": "*"}, id="not-action"),
        pytest.param(
            {
                "Sid": "C",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": "*",
                "Condition": {"ArnLike": {"aws:SourceArn": "x"}},
            },
            id="unmodelled-condition",
        ),
        pytest.param({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}, id="no-sid"),
    ],
)
def test_a_policy_using_what_the_evaluator_does_not_model_is_refused(statement):
    with pytest.raises(PolicyError):
        parse_policy({"Version": "2012-10-17", "Statement": [statement]})


def test_an_unknown_placeholder_is_refused(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(
        json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "A",
                        "Effect": "Allow",
                        "Action": "s3:GetObject",
                        "Resource": "arn:aws:s3:::${Bucket}/${Nope}/*",
                    }
                ],
            }
        )
    )
    with pytest.raises(PolicyError, match="Nope"):
        load_policy(path, {"Bucket": "b"})
