"""docs/iam-policy.json is least privilege: it allows every AWS call a real run makes, and grants nothing else.

The real DAG (in-process `dag.test()`, the real operators, the real Spark job through spark-submit
with `local[2,4]`) and `leasectl teardown` run against the emulators through recording proxies
(devtools/fault_proxy.py): DynamoDB and S3 -> proxy -> moto, Kinesis -> proxy -> kinesis-mock.
The AWS connection's endpoints point at the proxies, and the operators hand them on to the Spark
driver and executors in the configuration, so every call of every process is seen. The run: a live
round on a 2-shard stream whose lease table is a KCL 2.x one (no owner index), a split, a live
round (SHARD_END, child leases, the children read), two idle rounds (the first cleans up the finished
parent), a backfill
round, the plugin's monitoring API reading both namespaces (the Airflow api-server runs it under the
same connection), then teardown of both namespaces. Tags and point-in-time recovery are configured so that the
table options' calls happen too. Every recorded call is then evaluated against the policy
(tests/support/iam_policy.py), and every action and resource each statement grants must have been
needed by some call.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from devtools.airflow_env import load_dag_module, run_environment
from devtools.fault_proxy import FaultProxy, RecordedCall
from devtools.kinesis_streams import create_stream, kinesis_client, shards_of, split_shard
from lease_core.model.sequence import SHARD_END
from lease_core.ops import cli
from spark_jobs.sinks.parquet import ParquetSink
from tests.support.airflow_dag import LOCAL_SPARK_CONNECTION, airflow_environment, consumed_cleanly, run_round
from tests.support.iam_policy import (
    Grant,
    IamRequest,
    Policy,
    PolicyError,
    evaluate,
    glob_matches,
    iam_requests,
    load_policy,
    parse_policy,
)

REPOSITORY = Path(__file__).resolve().parents[2]
POLICY_FILE = REPOSITORY / "docs" / "iam-policy.json"
REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
PREFIX = "lake/orders"
PLACEHOLDERS = ("Region", "Account", "Application", "Stream", "Bucket", "Prefix")

# Grants the run cannot use, each with why the policy still needs it.
NOT_EXERCISED = {
    Grant("SinkObjects", "action", "s3:AbortMultipartUpload"): (
        "pyarrow's S3 filesystem writes every file as a multipart upload and aborts it when a part or the "
        "completion fails, so a failed write leaves no billed parts behind; no upload fails in this run"
    ),
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


@pytest.fixture(scope="module")
def proxies(moto_endpoint: str, kinesis_endpoint: str) -> Iterator[dict[str, FaultProxy]]:
    with (
        FaultProxy(moto_endpoint) as dynamodb,
        FaultProxy(moto_endpoint) as s3,
        FaultProxy(kinesis_endpoint) as kinesis,
    ):
        yield {"dynamodb": dynamodb, "s3": s3, "kinesis": kinesis}


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


def produce(client: Any, stream: str, count: int, serial: list[int]) -> list[bytes]:
    payloads = []
    for _ in range(count):
        payloads.append(f"{stream}/record-{serial[0]:06d}".encode())
        serial[0] += 1
    pending = [{"Data": data, "PartitionKey": data.decode()} for data in payloads]
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
    dag = load_dag_module("kinesis_lease_pipeline_iam_policy").dag

    def run(name: str, **conf: Any) -> None:
        before = {service: len(proxy.calls()) for service, proxy in proxies.items()}
        rounds[name] = run_round(
            dag,
            {
                "streams": [stream],
                "application_name": application,
                "num_workers": 2,
                "initial_position": "TRIM_HORIZON",
                "output_uri": output,
                **conf,
            },
        )
        round_calls[name] = [call for service, proxy in proxies.items() for call in proxy.calls()[before[service] :]]

    rounds: dict[str, dict[str, str]] = {}
    round_calls: dict[str, list[RecordedCall]] = {}
    serial = [0]
    # kinesis-mock compares AT_TIMESTAMP in whole seconds, and a time before the stream existed lists
    # every shard, the split's children included (which the hash-range check refuses): the window
    # starts on a whole second after the stream's creation.
    time.sleep(1.1)
    window_start = datetime.now(UTC).replace(microsecond=0)
    produced = produce(kinesis, stream, 120, serial)
    run("first")
    split_shard(kinesis, stream, sorted(shard.shard_id for shard in shards_of(kinesis, stream))[0])
    produced += produce(kinesis, stream, 80, serial)
    run("after-split")  # the parent to its end, and its children in the same round
    run("cleanup")  # nothing new to read: shard sync deletes the finished parent, the consume step is skipped
    run("idle")
    time.sleep(1.1)
    window_end = datetime.now(UTC).replace(microsecond=0)
    run("backfill", mode="backfill", start=window_start.isoformat(), end=window_end.isoformat())
    backfill_application = f"{application}-backfill-{window_start:%Y%m%dT%H%M%SZ}-{window_end:%Y%m%dT%H%M%SZ}"

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
    teardown = [
        cli.main(
            [
                "--app",
                name,
                "--set",
                f"aws_endpoint_url_dynamodb={proxies['dynamodb'].endpoint}",
                "--set",
                f"aws_region={REGION}",
                "--set",
                "table_status_poll_seconds=0.05",
                "teardown",
                "--yes",
            ]
        )
        for name in (application, backfill_application)
    ]
    table = ParquetSink.from_uri(output, s3_endpoint_url=moto_endpoint, region=REGION).read_dataset()
    calls = [call for proxy in proxies.values() for call in proxy.calls()]
    return RecordedRun(
        application,
        backfill_application,
        stream,
        bucket,
        rounds,
        round_calls,
        monitored,
        teardown,
        calls,
        produced,
        table.column("data").to_pylist(),
        checkpoints,
    )


def policy_for(run: RecordedRun) -> Policy:
    return load_policy(
        POLICY_FILE,
        {
            "Region": REGION,
            "Account": ACCOUNT,
            "Application": run.application,
            "Stream": run.stream,
            "Bucket": run.bucket,
            "Prefix": PREFIX,
        },
    )


def requests_of(run: RecordedRun) -> list[IamRequest]:
    return [request for call in run.calls for request in iam_requests(call, REGION, ACCOUNT)]


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
    operator_calls = {("dynamodb", "CreateTable"), ("kinesis", "ListShards"), ("s3", "GetObject")}
    assert executor_calls | operator_calls | {("dynamodb", "DeleteTable")} <= set(operations)
    assert all(call.stream == recorded_run.stream for call in recorded_run.calls if call.service == "kinesis")


# --- the policy ----------------------------------------------------------------------------------


def test_every_call_of_the_run_is_allowed_by_the_policy(recorded_run):
    evaluation = evaluate(policy_for(recorded_run), requests_of(recorded_run))
    print("IAM requests per action:", json.dumps(evaluation.actions, indent=1))
    denied = sorted({str(request) for request in evaluation.denied})
    assert denied == [], "calls the policy does not allow:\n" + "\n".join(denied)


def test_every_action_and_resource_the_policy_grants_was_needed_by_the_run(recorded_run):
    policy = policy_for(recorded_run)
    unused = evaluate(policy, requests_of(recorded_run)).unused(policy)
    needless = sorted(map(str, unused - set(NOT_EXERCISED)))
    assert needless == [], "granted but never needed by the run:\n" + "\n".join(needless)
    assert set(NOT_EXERCISED) <= policy.grants(), "an exemption names a grant the policy no longer has"


def test_the_policy_names_every_action_and_resource_explicitly_with_exactly_the_six_placeholders():
    text = POLICY_FILE.read_text()
    policy = load_policy(POLICY_FILE, dict.fromkeys(PLACEHOLDERS, "x"))  # refuses Deny and anything unmodelled
    assert set(re.findall(r"\$\{(\w+)\}", text)) == set(PLACEHOLDERS)
    assert not [action for statement in policy.statements for action in statement.actions if "*" in action]
    assert not [resource for statement in policy.statements for resource in statement.resources if resource == "*"]


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
        RecordedCall("s3", "HeadObject", 404, method="HEAD", bucket="b", key="p/k"),
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
]


@pytest.mark.parametrize(("call", "expected"), MAPPING_CASES)
def test_a_recorded_call_maps_to_the_iam_actions_and_resources_aws_authorizes(call, expected):
    assert [(request.action, request.resource) for request in iam_requests(call, "r", "1")] == expected


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
