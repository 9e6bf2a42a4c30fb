"""A local SparkSession bound to loopback, for the tests and the benchmarks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def loopback_session(master: str, app_name: str, config: Mapping[str, str] | None = None) -> Any:
    """A session on `master` (`local[...]`) with no UI, reachable on 127.0.0.1 only; `config` on top."""
    from pyspark.sql import SparkSession  # not at the top: importing pyspark is slow, and most users need no Spark

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.speculation", "false")  # the job forces it off too: a copy would race its twin
    )
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
