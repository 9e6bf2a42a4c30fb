"""The composition root: one application's parts, built from its configuration once, in one place.

The command line, the Airflow operators, the consume job's driver, its slot tasks and the monitoring
API all start from a `LeaseApplication`: the lease store, the coordinator-state and worker-metrics
stores, the shard source, the retrieval its slots and its idle check read shards with, the
application's enhanced fan-out consumers, the table administrator, the leader lock and the current
round, each built the same way everywhere (the configuration's table names, retry policy and read
settings) and cached for the life of the object.
A boto3 session may be given (Airflow's connection builds one); otherwise the process's shared
default session is used.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import boto3

from lease_core import aws
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import LayoutConflictError, TableMigrationChangedError
from lease_core.leader.assignment_round import current_round
from lease_core.leader.leader_lock import LeaderLock, wall_clock_millis
from lease_core.leader.leadership import Leadership
from lease_core.leader.table_migration_run import MigrationTables, TableMigrationRun
from lease_core.metrics.worker_metrics import DynamoDBWorkerMetricsStore, WorkerMetricsStore
from lease_core.retrieval.fanout.fanout_retrieval import FanOutRetrieval
from lease_core.retrieval.fanout.stream_consumers import StreamConsumers
from lease_core.retrieval.polling.polling_retrieval import PollingRetrieval, idle_check_retrieval
from lease_core.retrieval.record_source import Retrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.retry import RetryPolicy
from lease_core.store.codec import LEASE_KEY
from lease_core.store.coordinator_state import CoordinatorStateStore, DynamoDBCoordinatorStateStore
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.lease_table_records import coordinator_state_records, worker_metrics_records
from lease_core.store.migrating_records import MigratingRecords
from lease_core.store.record_table import DynamoDBRecordTable
from lease_core.store.table_layout import (
    SINGLE,
    LayoutDecision,
    conflict_document,
    layout_document,
    table_migration_status,
)
from lease_core.store.table_migration import (
    COMPLETE,
    METRICS_ORDER,
    PENDING,
    STATUS,
    STAYS_IN_SEPARATE_TABLE,
    TABLE_MIGRATION_KEY,
    local_status,
    reads_both_tables,
)
from lease_core.store.tables import TableAdministrator


class LeaseApplication:
    def __init__(self, config: ConsumerConfig, session: boto3.Session | None = None) -> None:
        self.config = config
        self._session = session
        self._clients: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: ConsumerConfig, session: boto3.Session | None = None) -> LeaseApplication:
        return cls(config, session)

    @property
    def name(self) -> str:
        return self.config.require_application_name()

    def client(self, service: str) -> Any:
        """The boto3 client of `service` (one per application: clients are thread-safe)."""
        if service not in self._clients:
            self._clients[service] = aws.client(service, self.config, self._session)
        return self._clients[service]

    @functools.cached_property
    def retry_policy(self) -> RetryPolicy:
        return aws.retry_policy(self.config)

    @functools.cached_property
    def lease_store(self) -> DynamoDBLeaseStore:
        return self.lease_store_with(self.retry_policy)

    def lease_store_with(self, retry_policy: RetryPolicy) -> DynamoDBLeaseStore:
        """The lease store under another retry policy (a leader's, which checks its lock before each try)."""
        return DynamoDBLeaseStore(
            self.client("dynamodb"),
            self.config.lease_table,
            retry_policy=retry_policy,
            consistent_reads=self.config.consistent_reads,
            scan_total_segments=self.config.lease_table_scan_total_segments,
        )

    @functools.cached_property
    def table_layout(self) -> LayoutDecision:
        """The application's table layout, read from its tables once (docs/protocol.md §1.7)."""
        return self.tables.layout()

    def layout_document(self) -> dict[str, Any]:
        """The layout as `leasectl status` and the monitoring page show it. Tables that hold both layouts
        are shown as a conflict (`table_layout.conflict_document`), not raised: an operator must see
        them to act, while every round still refuses to run (`table_layout` raises)."""
        try:
            decision = self.table_layout
        except LayoutConflictError as conflict:
            return conflict_document(conflict)
        return layout_document(decision, table_migration_status(self.state_store))

    @functools.cached_property
    def state_store(self) -> CoordinatorStateStore:
        return self.state_store_with(self.retry_policy)

    def state_store_with(self, retry_policy: RetryPolicy) -> CoordinatorStateStore:
        """The coordinator-state records: `<app>-CoordinatorState`, the lease table's in the single layout,
        or both while a table migration is under way (`migrating_records`)."""
        in_lease_table = coordinator_state_records(self._lease_table_records(retry_policy))
        if self.table_layout.layout == SINGLE:
            return in_lease_table
        separate = DynamoDBCoordinatorStateStore(
            self.client("dynamodb"), self.config.coordinator_state_table, retry_policy=retry_policy
        )
        if not self._reads_both_tables:
            return separate
        return MigratingRecords(
            separate,
            in_lease_table,
            writes_to_lease_table=self._writes_to_lease_table,
            pinned=STAYS_IN_SEPARATE_TABLE,
        )

    @functools.cached_property
    def worker_metrics(self) -> WorkerMetricsStore:
        """The worker metrics: `<app>-WorkerMetricStats`, the lease table's in the single layout, or both
        while a table migration is under way (each worker's newest item counts, `migrating_records`)."""
        in_lease_table = worker_metrics_records(self._lease_table_records(self.retry_policy))
        if self.table_layout.layout == SINGLE:
            return WorkerMetricsStore(in_lease_table)
        separate = DynamoDBWorkerMetricsStore(
            self.client("dynamodb"), self.config.worker_metrics_table, retry_policy=self.retry_policy
        )
        if not self._reads_both_tables:
            return separate
        return WorkerMetricsStore(
            MigratingRecords(
                separate.table,
                in_lease_table,
                writes_to_lease_table=self._writes_to_lease_table,
                newest_by=METRICS_ORDER,
            )
        )

    def _lease_table_records(self, retry_policy: RetryPolicy) -> DynamoDBRecordTable:
        return DynamoDBRecordTable(self.client("dynamodb"), self.config.lease_table, LEASE_KEY, retry_policy)

    @property
    def _writes_to_lease_table(self) -> bool:
        """A table migration's status as this process works by it (`table_migration.local_status`) writes
        worker metrics and new coordinator state to the lease table."""
        recorded = self.table_layout.table_migration
        return local_status(recorded, self.config.migrate_all_entities_to_lease_table) in (PENDING, COMPLETE)

    @property
    def _reads_both_tables(self) -> bool:
        """Records may be in either table (`table_migration.reads_both_tables`)."""
        return reads_both_tables(self.table_layout.table_migration)

    @functools.cached_property
    def shard_source(self) -> KinesisShardSource:
        return KinesisShardSource(self.client("kinesis"), retry_policy=self.retry_policy)

    @functools.cached_property
    def retrieval(self) -> Retrieval:
        """How the consume job's slots read their leases' shards, as `retrieval` says: polling, each
        reader paced to `shard_read_limit_kbps` and to 5 calls a second; or enhanced fan-out, by
        subscription through the application's consumer of each stream (`consumer_name`)."""
        if self.config.retrieval == "fan_out":
            return FanOutRetrieval(self.client("kinesis"), self.stream_consumers, self.retry_policy)
        return PollingRetrieval(
            self.client("kinesis"), self.retry_policy, read_bytes_per_second=self.config.shard_read_limit_kbps * 1024
        )

    @functools.cached_property
    def idle_check_retrieval(self) -> Retrieval:
        """How the leader's idle check looks for a lease's next record (`retrieval.pending_work`):
        polling in either mode, one short GetRecords per open lease (that module says why)."""
        return idle_check_retrieval(self.client("kinesis"), self.retry_policy)

    @functools.cached_property
    def stream_consumers(self) -> StreamConsumers:
        """The application's enhanced fan-out consumer on each stream (`retrieval = fan_out`): registered
        by the table step and `leasectl init`, looked up by the slots, deregistered by teardown."""
        return StreamConsumers(
            self.client("kinesis"),
            self.state_store,
            self.config.stream_consumer_name,
            lambda stream_name: self.shard_source.describe_stream(stream_name).stream_arn,
            retry_policy=self.retry_policy,
            activation_timeout_seconds=self.config.consumer_activation_timeout_millis / 1000,
        )

    @functools.cached_property
    def tables(self) -> TableAdministrator:
        return TableAdministrator(self.client("dynamodb"), self.config, retry_policy=self.retry_policy)

    def leader_lock(self, owner: str) -> LeaderLock:
        """The application's leader lock as `owner` would take, renew or release it."""
        return LeaderLock(
            self.state_store,
            owner,
            self.config.leader_lease_duration_millis,
            self.config.leader_heartbeat_period_millis,
            guard=None if self.table_layout.layout == SINGLE else self._migration_as_read,
        )

    def _migration_as_read(self) -> None:
        """A process that took the lock in `<app>-CoordinatorState` works by the table migration's status
        it read with the layout; if the status moved on since so that records are read or written
        elsewhere now (above all COMPLETE, which puts the lock in the lease table: KCL's leader checks
        the same), it must not lead."""
        table = self.config.coordinator_state_table
        record = DynamoDBCoordinatorStateStore(self.client("dynamodb"), table, retry_policy=self.retry_policy).get(
            TABLE_MIGRATION_KEY
        )
        read, current = self.table_layout.table_migration, None if record is None else record.get(STATUS)
        setting = self.config.migrate_all_entities_to_lease_table
        if (reads_both_tables(read), local_status(read, setting)) != (
            reads_both_tables(current),
            local_status(current, setting),
        ):
            raise TableMigrationChangedError(table, read, None if current is None else str(current))

    def table_migration(
        self,
        owner: str,
        clock_millis: Callable[[], int] = wall_clock_millis,
        leadership: Leadership | None = None,
    ) -> TableMigrationRun | None:
        """The leader's step of KCL 3.5's table migration (`table_migration_run`) for `owner`, who holds
        the lock (`leadership`: its writes and retries check it first); None for an application in the
        single layout, which has nothing to migrate."""
        if self.table_layout.layout == SINGLE:
            return None
        client = self.client("dynamodb")
        policy = self.retry_policy if leadership is None else leadership.retry_policy(self.retry_policy)
        state = DynamoDBCoordinatorStateStore(client, self.config.coordinator_state_table, retry_policy=policy)
        lease_table = self._lease_table_records(policy)
        tables = MigrationTables(
            self.config.lease_table,
            self.config.coordinator_state_table,
            state if leadership is None else leadership.state_store(state),
            DynamoDBWorkerMetricsStore(client, self.config.worker_metrics_table, retry_policy=policy).table,
            worker_metrics_records(lease_table),
        )
        return TableMigrationRun(
            client,
            tables,
            owner,
            migrate_all=self.config.migrate_all_entities_to_lease_table,
            complete_bake_seconds=self.config.table_migration_complete_bake_time_seconds,
            current_round=self.current_round,
            retry_policy=policy,
            clock_millis=clock_millis,
        )

    def current_round(self) -> int:
        """The round the last assignment wrote (0 before the first assignment)."""
        return current_round(self.state_store)
