from __future__ import annotations

import itertools
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from devtools.airflow_env import home_environment
from devtools.emulators import kinesis_mock, moto_server
from tests.support.shard_ends import SHARD_END_BEHAVIOURS, KinesisShardEnds, kinesis_ending_shards

# Tests never reach real AWS: fixed dummy credentials and region for every client they build.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
    os.environ.pop(variable, None)

# Airflow reads its home and settings when first imported: a throwaway home with SQLite, no example
# DAGs, this repository's DAGs and an empty plugins folder, before any test module imports Airflow.
os.environ.update(home_environment(tempfile.mkdtemp(prefix="airflow-home-")))
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
# plugins/kinesis_lease is the installed package `kinesis_lease`: the editable install puts plugins/ on
# sys.path for it. The tests put this checkout's plugins/ first, here and in every process they start,
# so a worktree tests its own copy even when the venv's editable install points at another checkout.
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
sys.path.insert(0, str(PLUGINS))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PLUGINS), os.environ.get("PYTHONPATH"))))

_names = itertools.count()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as server:
        yield server.endpoint


@pytest.fixture(scope="session")
def kinesis_endpoint() -> Iterator[str]:
    """One kinesis-mock for the session (~0.5 GB RSS, so never one per module); streams get unique names."""
    with kinesis_mock() as server:
        yield server.endpoint


@pytest.fixture(params=SHARD_END_BEHAVIOURS)
def shard_ends(request: pytest.FixtureRequest, kinesis_endpoint: str) -> Iterator[KinesisShardEnds]:
    """kinesis-mock ending closed shards with their last records, then behind a proxy ending them one
    call later (tests/support/shard_ends.py): a reshard test that takes it runs against both."""
    with kinesis_ending_shards(request.param, kinesis_endpoint) as ends:
        yield ends


@pytest.fixture
def dynamodb_client(moto_endpoint: str):
    return boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A table/application name no other test in this session uses."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"t{next(_names)}-{request.node.name}")[:60]


# Spark and sink fixtures live with their support code; pytest finds them through these imports.
from tests.support.iceberg_tables import iceberg_catalog, table_pipeline  # noqa: E402,F401
from tests.support.sinks_under_test import sink_under_test  # noqa: E402,F401
from tests.support.spark import spark, spark_control_dir  # noqa: E402,F401
