"""Rounds of one application into a table sink, with Kinesis and the lease table in memory: the real
lease consumer per lease, then the driver's publication (`spark_jobs.round_publication`), as
`tests/contract/test_exactly_once_faults.py` drives them, and the table's record read as `leasectl
verify` and `leasectl restore` read it. For the table-operations campaign (`bench/table_operations.py`)
and its deterministic tests: another tool may act on the table between rounds or inside one (between
the slots' stages and the publication), the driver may die before publishing, the stream may be
deleted and created again, and the lease table may be lost and restored from the table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from devtools.memory_shard import InMemoryShard
from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.ops.landed_audit import AuditFinding, Restore, audit_landed, plan_restore
from lease_core.retrieval.polling.polling_retrieval import PollingRetrieval
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.retry import RetryPolicy
from lease_core.store.memory_store import InMemoryLeaseStore
from sinks.batch_sink import RoundIdentity, RoundPublication, StreamIncarnations
from sinks.table.delta import DeltaSink
from sinks.table.iceberg import IcebergSink
from spark_jobs.lease_consumer import LeaseBudget, LeaseConsumer, LeaseContext
from spark_jobs.round_publication import publish_committed_batches
from spark_jobs.round_report import LeaseReport

APPLICATION = "app"
STREAM = "stream"
SHARDS = ("shardId-000000000000", "shardId-000000000001")
SLOT = "app-worker-0"
ACCOUNT_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream"
FIRST_CREATED = 1_764_000_000
# Each incarnation of the stream numbers its records from a base below the one before: a re-created
# stream's sequence numbers start over, so a position of the earlier stream would hide the new one's
# records if it were taken for theirs, and every record still has an identity of its own.
FIRST_BASE = 10**9
BASE_STEP = 10**7
FAST_RETRIES = RetryPolicy(attempts=4, base_millis=1, max_millis=5)

TableSink = IcebergSink | DeltaSink
OpenSink = Callable[[StreamIncarnations], TableSink]
Hook = Callable[[], object]


def incarnation_of(number: int) -> StreamIncarnations:
    """The stream's ARN and creation time in its `number`th incarnation (0: the first)."""
    return {STREAM: (f"{ACCOUNT_ARN}/{STREAM}", FIRST_CREATED + 3600 * number)}


def base_of(number: int) -> int:
    """The sequence number before the first record of the stream's `number`th incarnation."""
    return FIRST_BASE - BASE_STEP * number


@dataclass(frozen=True)
class RoundResult:
    """One round: each lease's report, and its publication's outcome (None: the driver died before it)."""

    reports: tuple[LeaseReport, ...]
    published: bool
    named_losses: tuple[str, ...] = ()
    error: str | None = None


class HookedSink:
    """The sink of the round's publication, running `before_publication` first: another tool's operation
    between the slots' stages and the commit that publishes them (the driver's view of the table is
    read after it, as it is when the tool's commit lands while the driver is working)."""

    def __init__(self, sink: TableSink, before_publication: Hook) -> None:
        self._sink = sink
        self._before = before_publication

    @property
    def uri(self) -> str:
        return self._sink.uri

    def publish_round(self, records: Mapping[str, str], identity: RoundIdentity) -> RoundPublication:
        self._before()
        return self._sink.publish_round(records, identity)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def new_lease_table() -> InMemoryLeaseStore:
    """A lease table with a lease per shard at TRIM_HORIZON, assigned to the round's slot."""
    store = InMemoryLeaseStore()
    for shard in SHARDS:
        assert store.create_lease_if_not_exists(Lease(shard, checkpoint=TRIM_HORIZON))
        lease = store.get_lease(shard, consistent=True)
        assert lease is not None and store.assign_lease(lease, SLOT).applied
    return store


@dataclass
class TableRounds:
    """One application landing the stream's shards (`SHARDS`) into the table `open_sink` opens. Each
    round reads every lease to its shard's tip (`produce` adds records)."""

    open_sink: OpenSink
    incarnation: int = 0
    store: InMemoryLeaseStore = field(default_factory=new_lease_table)
    produced: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SHARDS, 0))
    number: int = 0

    @property
    def streams(self) -> StreamIncarnations:
        return incarnation_of(self.incarnation)

    @property
    def base(self) -> int:
        return base_of(self.incarnation)

    def sink(self) -> TableSink:
        return self.open_sink(self.streams)

    def produce(self, shard: str, records: int) -> None:
        self.produced[shard] += records

    def shard(self, shard: str) -> InMemoryShard:
        return InMemoryShard(range(self.base + 1, self.base + 1 + self.produced[shard]))

    def run(self, *, publish: bool = True, during: Hook | None = None) -> RoundResult:
        """One round: each lease's consumer, then (unless the driver dies first, `publish` False) the
        driver's publication, with `during` run inside it before its commit."""
        self.number += 1
        reports = tuple(self._consume(shard) for shard in SHARDS)
        if not publish:
            return RoundResult(reports, False)
        sink: Any = self.sink() if during is None else HookedSink(self.sink(), during)
        identity = RoundIdentity(APPLICATION, self.number, self.streams)
        publication, gone = publish_committed_batches(sink, identity, self.store.list_leases())
        return RoundResult(reports, True, tuple(gone), publication.error)

    def _consume(self, shard_id: str) -> LeaseReport:
        lease = self.store.get_lease(shard_id, consistent=True)
        assert lease is not None
        held = HeldLease(self.store, lease, 10_000, claim_token=f"{SLOT}/round-{self.number}")
        assert held.claim()
        shard = self.shard(shard_id)
        context = LeaseContext(
            store=self.store,
            retrieval=PollingRetrieval(shard, FAST_RETRIES, read_bytes_per_second=None),
            shards=KinesisShardSource(shard, retry_policy=FAST_RETRIES),
            sink=self.sink(),
            transform_spec=None,
            transform=None,
            at_timestamp=None,
            budget=LeaseBudget(),
            closed_shards={},
        )
        return LeaseConsumer(held, STREAM, shard_id, LeaseKeyScheme(), SLOT, context).run()

    def checkpoint(self, shard: str) -> ExtendedSequenceNumber:
        lease = self.store.get_lease(shard, consistent=True)
        assert lease is not None
        return lease.checkpoint

    def verify(self) -> list[AuditFinding]:
        """`leasectl verify`'s findings: the table's record against the lease table."""
        sink = self.sink()
        leases = self.store.list_leases()
        awaiting = {lease.lease_key: start for lease in leases if (start := sink.awaiting_from(lease)) is not None}
        return audit_landed(leases, sink.landed_batches(), awaiting)

    def recreate_stream(self) -> None:
        """The stream deleted and created again under its name: a new ARN and creation time, sequence
        numbers that start over, and the application's lease table made anew (`leasectl teardown`, then
        `init` and a sync at TRIM_HORIZON)."""
        self.incarnation += 1
        self.produced = dict.fromkeys(SHARDS, 0)
        self.store = new_lease_table()

    def restore_lost_lease_table(self) -> list[Restore]:
        """The lease table lost and made again (every lease at TRIM_HORIZON), then `leasectl restore`:
        each lease behind the table moved to the last position the table holds of it."""
        self.store = new_lease_table()
        restores, _ = plan_restore(self.store.list_leases(), self.sink().landed_batches())
        for restore in restores:
            lease = self.store.get_lease(restore.lease.lease_key, consistent=True)
            assert lease is not None and self.store.reset_checkpoint(lease, restore.target).applied
        return restores
