"""The campaign's world: emulators, fault proxies, the stream, the tables, and the settings every process gets.

moto (DynamoDB) and kinesis-mock (Kinesis) run as processes of their own on loopback. Two
`FaultProxy`s (devtools/fault_proxy.py) sit in front of them, in this process: the consume
job's driver and slots reach AWS only through them (the data plane), so throttling, 5xx, dropped
requests, lost answers and retention trims reach the job. The campaign's own leader steps, the
producer, `leasectl` and the final check talk to the emulators directly (the control plane).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import boto3

from bench.chaos.commit_faults import LAUNCHER_NAME, launcher
from bench.chaos.processes import RUN_MARKER
from bench.harness import REGION
from devtools.emulators import kinesis_mock, moto_server
from devtools.fault_proxy import FaultProxy
from devtools.kinesis_streams import create_stream
from devtools.subscription_bridge import SubscriptionBridge
from lease_core import aws
from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig, load_config
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.tables import TableAdministrator
from sinks.table.iceberg import load_configured_catalog

INITIAL_SHARDS = 4
CONTROL_DIR_VARIABLE = "KINESIS_CHAOS_CONTROL_DIR"
SINKS = ("parquet", "iceberg", "delta")
CATALOG = "chaos"

# Short durations so that the campaign sees failovers and takeovers within seconds. The leader
# lock's lease must outlast the gap between the leader's last heartbeat and the consume job's
# driver resuming the lock (a spark-submit start-up on a busy two-core machine), or any contender
# in that gap would rightly take over a round that is only starting.
SETTINGS: dict[str, str] = {
    "initial_position_in_stream": "TRIM_HORIZON",
    "failover_time_millis": "6000",
    "leader_lease_duration_millis": "15000",
    "leader_heartbeat_period_millis": "500",
    "dependency_retry_base_millis": "20",
    "dependency_retry_max_millis": "400",
    "table_status_poll_seconds": "0.05",
    "aws_region": REGION,
}


class Stack:
    """Started with `with`; everything it started is stopped on leaving, whatever happened."""

    def __init__(
        self,
        workdir: Path,
        run_id: str,
        application: str,
        stream: str,
        sink: str = "parquet",
        retrieval: str = "polling",
    ) -> None:
        self.workdir = workdir
        self.retrieval = retrieval
        self.run_id = run_id
        self.application = application
        self.stream = stream
        self.sink = sink
        self.output_uri = output_uri(workdir, sink)
        self.control_dir = workdir / "control"
        self._exit = ExitStack()
        self.dynamodb_endpoint = ""
        self.kinesis_endpoint = ""
        self.kinesis_proxy: FaultProxy | None = None
        self.dynamodb_proxy: FaultProxy | None = None

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._exit.close()

    def _start(self) -> None:
        self.control_dir.mkdir(parents=True, exist_ok=True)
        # The marker lets `stop_leftovers` find the emulators too.
        self.dynamodb_endpoint = self._exit.enter_context(moto_server(extra_env={RUN_MARKER: self.run_id})).endpoint
        self.kinesis_endpoint = self._exit.enter_context(kinesis_mock(extra_env={RUN_MARKER: self.run_id})).endpoint
        self.kinesis_proxy = self._exit.enter_context(FaultProxy(self.kinesis_endpoint, seed=1))
        if self.retrieval == "fan_out":
            self.kinesis_proxy.serve_subscriptions()
        self.dynamodb_proxy = self._exit.enter_context(FaultProxy(self.dynamodb_endpoint, seed=2))
        create_stream(self.kinesis(), self.stream, INITIAL_SHARDS)
        if self.sink == "iceberg":
            os.environ.update(self.catalog_environment())
            load_configured_catalog(self.output_uri, CATALOG).create_namespace("kinesis")
        TableAdministrator(
            self.dynamodb(), self.control_config(), retry_policy=aws.retry_policy(self.control_config())
        ).ensure_tables()
        if self.retrieval == "fan_out":
            # As `leasectl --set retrieval=fan_out init` does: the consumer exists before any round, even
            # one that switches to polling.
            LeaseApplication(self.control_config()).stream_consumers.ensure(self.stream)

    # --- clients and settings of the control plane (straight to the emulators) -------------------

    def control_settings(self) -> dict[str, str]:
        return {
            **SETTINGS,
            "retrieval": self.retrieval,
            "application_name": self.application,
            "aws_endpoint_url_dynamodb": self.dynamodb_endpoint,
            "aws_endpoint_url_kinesis": self.kinesis_endpoint,
        }

    def control_config(self) -> ConsumerConfig:
        return load_config(environ={}, overrides=self.control_settings())

    def data_plane_settings(self) -> dict[str, str]:
        """The consume job's settings: every AWS call through the fault proxies."""
        assert self.kinesis_proxy is not None and self.dynamodb_proxy is not None
        return {
            **self.control_settings(),
            "aws_endpoint_url_dynamodb": self.dynamodb_proxy.endpoint,
            "aws_endpoint_url_kinesis": self.kinesis_proxy.endpoint,
        }

    def subscription_bridge(self) -> SubscriptionBridge:
        """The Kinesis proxy's SubscribeToShard (a fan-out campaign's), for the subscription faults."""
        bridge = None if self.kinesis_proxy is None else self.kinesis_proxy.subscriptions()
        if bridge is None:
            raise RuntimeError("subscription faults need a campaign that reads by fan-out (--retrieval fan_out)")
        return bridge

    def kinesis_proxy_endpoint(self) -> str:
        assert self.kinesis_proxy is not None
        return self.kinesis_proxy.endpoint

    def dynamodb(self) -> Any:
        return boto3.client("dynamodb", endpoint_url=self.dynamodb_endpoint, region_name=REGION)

    def kinesis(self) -> Any:
        return boto3.client("kinesis", endpoint_url=self.kinesis_endpoint, region_name=REGION)

    def lease_store(self) -> DynamoDBLeaseStore:
        config = self.control_config()
        return DynamoDBLeaseStore(
            self.dynamodb(), config.lease_table, retry_policy=aws.retry_policy(config), consistent_reads=True
        )

    def state_store(self) -> CoordinatorStateStore:
        """The coordinator-state records, in whichever table layout the application has."""
        return LeaseApplication(self.control_config()).state_store

    def catalog_environment(self) -> dict[str, str]:
        """The Iceberg catalog's configuration, as pyiceberg reads it from the environment (none for Parquet)."""
        if self.sink != "iceberg":
            return {}
        prefix = f"PYICEBERG_CATALOG__{CATALOG.upper()}__"
        return {
            f"{prefix}TYPE": "sql",
            f"{prefix}URI": f"sqlite:///{self.workdir}/catalog.db",
            f"{prefix}WAREHOUSE": f"file://{self.workdir}/warehouse",
        }

    def driver_launcher(self) -> Path:
        """The Python driver a try starts with to meet a table commit's fault (`commit_faults`)."""
        path = self.control_dir / LAUNCHER_NAME
        return path if path.exists() else launcher(self.control_dir)

    def process_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of every process the campaign starts (marked, loopback, this venv's Python)."""
        return {
            **os.environ,
            **self.catalog_environment(),
            RUN_MARKER: self.run_id,
            CONTROL_DIR_VARIABLE: str(self.control_dir),
            **(extra or {}),
        }


def output_uri(workdir: Path, sink: str) -> str:
    """Where the rounds land: a Parquet dataset or a Delta table in the working directory, or an Iceberg
    table in pyiceberg's SQL catalog on a SQLite file, which every process of the campaign opens
    through the same PYICEBERG_CATALOG__* variables (`Stack.catalog_environment`)."""
    if sink == "iceberg":
        return f"iceberg://{CATALOG}/kinesis.orders"
    if sink == "delta":
        return f"delta:{workdir / 'lake'}"
    return str(workdir / "lake")


def set_arguments(settings: Mapping[str, str]) -> list[str]:
    arguments: list[str] = []
    for key, value in settings.items():
        if key != "application_name":
            arguments += ["--set", f"{key}={value}"]
    return arguments
