"""The environment that points boto3, Airflow's `aws_default` connection and Spark at local emulators."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass

REGION = "us-east-1"
# Dummy credentials: the emulators sign nothing, but boto3 refuses to call without any.
CREDENTIALS = "testing"
# Two slots at once, and Spark retries a failed slot task (plain local[N] never does).
SPARK_MASTER = "local[2,4]"


@dataclass(frozen=True)
class Endpoints:
    dynamodb: str
    kinesis: str
    s3: str


def aws_connection(endpoints: Endpoints, credentials: str = CREDENTIALS, region: str = REGION) -> str:
    """`aws_default` as Airflow reads it from `AIRFLOW_CONN_AWS_DEFAULT`: DynamoDB's endpoint for every
    service, and Kinesis' and S3's own under `service_config` (the operators read all three)."""
    service_config = {"kinesis": {"endpoint_url": endpoints.kinesis}}
    if endpoints.s3 != endpoints.dynamodb:
        service_config["s3"] = {"endpoint_url": endpoints.s3}
    extra = {"region_name": region, "endpoint_url": endpoints.dynamodb, "service_config": service_config}
    return json.dumps({"conn_type": "aws", "login": credentials, "password": credentials, "extra": extra})


def spark_connection(master: str = SPARK_MASTER) -> str:
    """`spark_default` as Airflow reads it from `AIRFLOW_CONN_SPARK_DEFAULT`."""
    return json.dumps({"conn_type": "spark", "host": master})


def trial_environment(endpoints: Endpoints, spark_master: str = SPARK_MASTER) -> dict[str, str]:
    """Every variable a shell needs for boto3, `leasectl`, `airflow dags test` and spark-submit on the trial."""
    return {
        "AWS_ENDPOINT_URL_DYNAMODB": endpoints.dynamodb,
        "AWS_ENDPOINT_URL_KINESIS": endpoints.kinesis,
        "AWS_ENDPOINT_URL_S3": endpoints.s3,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": CREDENTIALS,
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS,
        "AIRFLOW_CONN_AWS_DEFAULT": aws_connection(endpoints),
        "AIRFLOW_CONN_SPARK_DEFAULT": spark_connection(spark_master),
        # Spark's Python workers run this Python (the one with the package), not the system's.
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def export_lines(variables: Mapping[str, str]) -> list[str]:
    """`export NAME=value` lines a POSIX shell can `eval`."""
    return [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]
