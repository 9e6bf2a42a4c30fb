"""The documented IAM policy (docs/iam-policy.json) against what a round that sets bad records
aside writes: its dead-letter destination beside the output (`sinks.dead_lettering`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.dead_lettering import dead_letter_uri
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
    "Registry": "orders-registry",
}
GLUE = "arn:aws:glue:us-east-1:123456789012"
SINK_STATEMENTS = ("Parquet", "Iceberg", "Delta")  # the Sids' starts of the statements of one sink only


def dead_letter_table() -> str:
    return dead_letter_uri(f"iceberg://glue/{VALUES['Database']}.{VALUES['Table']}").rsplit(".", 1)[1]


def dead_letter_prefix() -> str:
    return dead_letter_uri(f"s3://{VALUES['Bucket']}/{VALUES['Prefix']}").removeprefix(f"s3://{VALUES['Bucket']}/")


def delta_dead_letter_prefix() -> str:
    uri = dead_letter_uri(f"delta:s3://{VALUES['Bucket']}/{VALUES['Prefix']}")
    return uri.removeprefix(f"delta:s3://{VALUES['Bucket']}/")


@pytest.mark.parametrize(
    ("sink", "request_"),
    [
        pytest.param(
            "Parquet",
            IamRequest(
                "s3:PutObject",
                f"arn:aws:s3:::lake/{dead_letter_prefix()}/stream_name=orders/shard_id=shardId-0/_staged-0.x.parquet",
            ),
            id="parquet-stage",
        ),
        pytest.param(
            "Parquet",
            IamRequest("s3:PutObject", f"arn:aws:s3:::lake/{dead_letter_prefix()}/_write_check"),
            id="parquet-check",
        ),
        pytest.param(
            "Parquet",
            IamRequest(
                "s3:DeleteObject", f"arn:aws:s3:::lake/{dead_letter_prefix()}/stream_name=o/shard_id=s/_staged-0.x"
            ),
            id="parquet-promote",
        ),
        pytest.param(
            "Iceberg", IamRequest("glue:CreateTable", f"{GLUE}:table/kinesis/{dead_letter_table()}"), id="glue-create"
        ),
        pytest.param(
            "Iceberg", IamRequest("glue:UpdateTable", f"{GLUE}:table/kinesis/{dead_letter_table()}"), id="glue-commit"
        ),
        pytest.param(
            "Iceberg",
            IamRequest("s3:PutObject", f"arn:aws:s3:::lake/warehouse/orders/{dead_letter_table()}/metadata/x.json"),
            id="iceberg-stage",
        ),
        pytest.param(
            "Delta",
            IamRequest(
                "s3:PutObject",
                f"arn:aws:s3:::lake/{delta_dead_letter_prefix()}/arrival_day=2026-11-27/part-{'ab' * 16}-0.parquet",
            ),
            id="delta-stage",
        ),
        pytest.param(
            "Delta",
            IamRequest("s3:PutObject", f"arn:aws:s3:::lake/{delta_dead_letter_prefix()}/_delta_log/{1:020d}.json"),
            id="delta-commit",
        ),
    ],
)
def test_the_documented_policy_lets_a_round_write_its_dead_letters(sink: str, request_: IamRequest):
    """With the policy as documented, a pipeline with bad_records = dead_letter on AWS fails every
    round's first check (the dead-letter destination is not writable): its leases never move. (A
    deployment attaches its own sink's statements only: `tests/e2e/test_iam_policy.py`.)"""
    others = tuple(prefix for prefix in SINK_STATEMENTS if prefix != sink)
    policy = load_policy(POLICY_FILE, VALUES)
    deployment = Policy(tuple(statement for statement in policy.statements if not statement.sid.startswith(others)))
    evaluation = evaluate(deployment, [request_])

    assert evaluation.denied == [], f"denied: {request_}"
