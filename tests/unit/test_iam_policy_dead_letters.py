"""The documented IAM policy (docs/iam-policy.json) against what a round that sets bad records
aside writes: its dead-letter destination beside the output (`spark_jobs.sinks.dead_lettering`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.sinks.dead_lettering import dead_letter_uri
from tests.support.iam_policy import IamRequest, Policy, evaluate, load_policy

POLICY_FILE = Path(__file__).resolve().parents[2] / "docs" / "iam-policy.json"
VALUES = {
    "Region": "us-east-1",
    "Account": "123456789012",
    "Application": "orders-app",
    "Stream": "orders",
    "Bucket": "lake",
    "Prefix": "warehouse/orders",
    "Database": "kinesis",
    "Table": "orders",
}
GLUE = "arn:aws:glue:us-east-1:123456789012"


def dead_letter_table() -> str:
    return dead_letter_uri(f"iceberg://glue/{VALUES['Database']}.{VALUES['Table']}").rsplit(".", 1)[1]


def dead_letter_prefix() -> str:
    return dead_letter_uri(f"s3://{VALUES['Bucket']}/{VALUES['Prefix']}").removeprefix(f"s3://{VALUES['Bucket']}/")


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(
            IamRequest(
                "s3:PutObject",
                f"arn:aws:s3:::lake/{dead_letter_prefix()}/stream_name=orders/shard_id=shardId-0/_staged-0.x.parquet",
            ),
            id="parquet-stage",
        ),
        pytest.param(
            IamRequest("s3:PutObject", f"arn:aws:s3:::lake/{dead_letter_prefix()}/_write_check"), id="parquet-check"
        ),
        pytest.param(
            IamRequest(
                "s3:DeleteObject", f"arn:aws:s3:::lake/{dead_letter_prefix()}/stream_name=o/shard_id=s/_staged-0.x"
            ),
            id="parquet-promote",
        ),
        pytest.param(IamRequest("glue:CreateTable", f"{GLUE}:table/kinesis/{dead_letter_table()}"), id="glue-create"),
        pytest.param(IamRequest("glue:UpdateTable", f"{GLUE}:table/kinesis/{dead_letter_table()}"), id="glue-commit"),
        pytest.param(
            IamRequest("s3:PutObject", f"arn:aws:s3:::lake/warehouse/orders/{dead_letter_table()}/metadata/x.json"),
            id="iceberg-stage",
        ),
    ],
)
def test_the_documented_policy_lets_a_round_write_its_dead_letters(request_: IamRequest):
    """With the policy as documented, a pipeline with bad_records = dead_letter on AWS fails every
    round's first check (the dead-letter destination is not writable): its leases never move. (A
    deployment attaches its own sink's statements only: `tests/e2e/test_iam_policy.py`.)"""
    other = "Iceberg" if request_.resource.startswith("arn:aws:s3:::lake/" + dead_letter_prefix()) else "Parquet"
    policy = load_policy(POLICY_FILE, VALUES)
    deployment = Policy(tuple(statement for statement in policy.statements if not statement.sid.startswith(other)))
    evaluation = evaluate(deployment, [request_])

    assert evaluation.denied == [], f"denied: {request_}"
