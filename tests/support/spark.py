"""One local SparkSession for the test session, bound to loopback, with task retries.

`local[2,4]` runs two task threads and lets a failed task be tried up to 4 times: plain `local[2]`
never retries a task, and the crash tests need Spark's retry. Executors run this venv's Python
(otherwise Spark's workers silently use the system Python) with the repository on their path,
so test transforms in `tests.support` import there too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.local_spark import loopback_session

REPOSITORY = Path(__file__).resolve().parents[2]
CONTROL_DIR_VARIABLE = "KINESIS_TEST_CONTROL_DIR"


@pytest.fixture(scope="session")
def spark_control_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory test transforms running in executors read their instructions from."""
    return tmp_path_factory.mktemp("spark-control")


@pytest.fixture(scope="session")
def spark(spark_control_dir: Path) -> Iterator[object]:
    # The JVM and its Python workers inherit the environment as it is when the session starts.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ[CONTROL_DIR_VARIABLE] = str(spark_control_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = loopback_session("local[2,4]", "kinesis-lease-tests", {"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
