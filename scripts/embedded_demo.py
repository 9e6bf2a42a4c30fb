"""The embedded default, as far as the project goes today: the lease tables on a local DynamoDB.

Starts moto on loopback, creates an application's three KCL tables with `leasectl init`, shows
their layout and the (empty) lease distribution with `leasectl status`, tears them down, and stops
moto. The full main job (shard sync, assignment, the Spark consumer, the Airflow DAG) replaces this
as those parts land.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3

from lease_core.emulators import moto_server

APPLICATION = "embedded-demo"
LEASECTL = str(Path(sys.executable).with_name("leasectl"))


def leasectl(*arguments: str, env: dict[str, str]) -> None:
    print(f"\n$ leasectl --app {APPLICATION} {' '.join(arguments)}", flush=True)
    subprocess.run([LEASECTL, "--app", APPLICATION, *arguments], env=env, check=True)


def main() -> int:
    with moto_server() as dynamodb:
        print(f"moto (DynamoDB) serving on {dynamodb.endpoint}, pid {dynamodb.pid}")
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb.endpoint,
            "AWS_ACCESS_KEY_ID": "embedded",
            "AWS_SECRET_ACCESS_KEY": "embedded",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        leasectl("init", env=env)
        client = boto3.client(
            "dynamodb", endpoint_url=dynamodb.endpoint, region_name="us-east-1",
            aws_access_key_id="embedded", aws_secret_access_key="embedded",
        )
        for name in (APPLICATION, f"{APPLICATION}-WorkerMetricStats", f"{APPLICATION}-CoordinatorState"):
            table = client.describe_table(TableName=name)["Table"]
            keys = ", ".join(f"{k['AttributeName']} {k['KeyType']}" for k in table["KeySchema"])
            indexes = [i["IndexName"] for i in table.get("GlobalSecondaryIndexes") or []]
            print(f"  {name}: key [{keys}], billing {table['BillingModeSummary']['BillingMode']}, indexes {indexes}")
        leasectl("status", env=env)
        leasectl("teardown", "--yes", env=env)
    print("\nmoto stopped. The Kinesis consumer itself is not built yet: see README.md.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
