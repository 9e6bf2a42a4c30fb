"""A KCL 3.5 worker stand-in: one single-table application's worker and leader, as its lease table and
its stream see it (docs/protocol.md §1-§6 and §8).

Real KCL (Java) cannot run beside the tests, and a table handed over between KCL and this project is
only proven shared when something that behaves as KCL reads it back. So this stand-in is written from
KCL's specification, not from this project's code (it imports nothing of `lease_core`): it creates the
table and items KCL 3.5 creates for a new application, writes with KCL's legacy `Expected`
conditions (create if absent, assign on the owner, renew and checkpoint on the counter), reads every
item of the table the way KCL 3.5's deserializers do and refuses loudly what they could not read,
reads shards from their checkpoints with real Kinesis calls, and "processes" records into a list.

Its limits, each of which fails loudly rather than guessing: one worker (a leader that would hand
leases to another active worker is refused), no KPL de-aggregation, no AT_TIMESTAMP start.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from devtools.stream_records import StreamRecord

Item = dict[str, dict[str, Any]]

OWNER_INDEX = "LeaseOwnerToLeaseKeyIndex"
LEADER_KEY = "Leader"
CLIENT_VERSION_MIGRATION_KEY = "Migration3.0"
TABLE_MIGRATION_KEY = "TableMigration3.5"
# KCL 3.5's entity types (docs/protocol.md §1.6); its entity scan reads an item of any other tag as a lease.
ENTITY_TYPES = frozenset(
    {"LEASE", "STREAM", "LEADER", "CLIENT_VERSION_MIGRATION", "TABLE_MIGRATION", "WORKER_METRIC_STATS"}
)
# Coordinator-state records written before KCL tagged them, known by their key (docs/protocol.md §1.6).
LEGACY_COORDINATOR_KEYS = {
    LEADER_KEY: "LEADER",
    CLIENT_VERSION_MIGRATION_KEY: "CLIENT_VERSION_MIGRATION",
    TABLE_MIGRATION_KEY: "TABLE_MIGRATION",
}

SHARD_END = "SHARD_END"
# docs/protocol.md §8: every value but SHARD_END maps to an integer; sentinels sit below every sequence number.
SENTINEL_RANKS = {"AT_TIMESTAMP": -3, "TRIM_HORIZON": -2, "LATEST": -1}
# The iterator a fresh shard consumer opens for a checkpoint (docs/protocol.md §1.2): a sequence number is opened
# AT it and the records up to it are dropped, so that a read can resume inside a KPL aggregate.
SENTINEL_ITERATORS = {"TRIM_HORIZON": "TRIM_HORIZON", "LATEST": "LATEST"}

# The attributes KCL's lease serializer reads, with the only DynamoDB type it reads each as.
LEASE_ATTRIBUTE_TYPES = {
    "leaseKey": "S",
    "leaseOwner": "S",
    "leaseCounter": "N",
    "ownerSwitchesSinceCheckpoint": "N",
    "checkpoint": "S",
    "checkpointSubSequenceNumber": "N",
    "pendingCheckpoint": "S",
    "pendingCheckpointSubSequenceNumber": "N",
    "pendingCheckpointState": "B",
    "parentShardId": "SS",
    "childShardIds": "SS",
    "startingHashKey": "S",
    "endingHashKey": "S",
    "throughputKBps": "N",
    "checkpointOwner": "S",
    "entityType": "S",
}
# WorkerMetricStats' attributes (docs/protocol.md §5.1), read by the leader's load of worker metrics.
WORKER_METRIC_ATTRIBUTE_TYPES = {"lut": "N", "sts": "M", "opr": "M", "properties": "M", "sup": "N", "slu": "N"}
WORKER_METRICS_ACTIVE_SECONDS = 60  # 2 x workerMetricsReporterFreqInMillis (docs/protocol.md §5.2)
# A run's passes (assign, discover, consume) before it gives up: each reshard level needs one more.
MAX_PASSES = 10


class UnreadableByKcl(AssertionError):
    """An item KCL 3.5 could not read as what it is, or a state KCL would not accept: the table was not
    handed back as KCL can take it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"KCL 3.5 cannot read item {key!r}: {problem}")


def checkpoint_order(key: str, sequence_number: str, sub_sequence_number: int) -> tuple[int, int, int]:
    """The place of an extended sequence number in KCL's total order (docs/protocol.md §8); anything that is
    neither digits nor a sentinel name is refused, as KCL's comparator throws on it."""
    if sequence_number == SHARD_END:
        return (1, 0, 0)
    if sequence_number in SENTINEL_RANKS:
        return (0, SENTINEL_RANKS[sequence_number], sub_sequence_number)
    if sequence_number.isascii() and sequence_number.isdigit():
        return (0, int(sequence_number), sub_sequence_number)
    raise UnreadableByKcl(key, f"checkpoint {sequence_number!r} is neither a sequence number nor a sentinel")


@dataclass(frozen=True)
class KclLease:
    """A lease as KCL's deserializer leaves it in memory (docs/protocol.md §1.1, §1.3)."""

    lease_key: str
    lease_owner: str | None
    lease_counter: int
    checkpoint: str
    checkpoint_sub_sequence_number: int
    owner_switches_since_checkpoint: int
    parent_shard_ids: frozenset[str]
    child_shard_ids: frozenset[str]
    hash_key_range: tuple[int, int] | None
    checkpoint_owner: str | None

    @property
    def order(self) -> tuple[int, int, int]:
        return checkpoint_order(self.lease_key, self.checkpoint, self.checkpoint_sub_sequence_number)


def _typed(key: str, item: Mapping[str, Any], types: Mapping[str, str]) -> None:
    for name, expected in types.items():
        value = item.get(name)
        if value is not None and set(value) != {expected}:
            raise UnreadableByKcl(key, f"{name} is {sorted(value)}, KCL reads it as {expected}")


def _long(key: str, item: Mapping[str, Any], name: str) -> int:
    """DynamoUtils.safeGetLong: Long.parseLong of the number's text (a fraction or an exponent throws)."""
    if name not in item:
        raise UnreadableByKcl(key, f"{name} is missing")
    text = item[name]["N"]
    if not (text.lstrip("-").isdigit() and text.isascii()):
        raise UnreadableByKcl(key, f"{name} {text!r} is not a Java long")
    return int(text)


def read_lease(item: Mapping[str, Any]) -> KclLease:
    """An item KCL 3.5 takes for a lease, read as its lease deserializer reads it; what it could not
    read, or would read as something else than was meant, raises UnreadableByKcl.

    Beyond the deserializer, a `pendingCheckpoint` is refused too: KCL reads it, but hands it to the
    record processor as a prepared batch of ITS application, which a batch this project prepared is not.
    """
    key = item.get("leaseKey", {}).get("S") or "<no leaseKey>"
    _typed(key, item, LEASE_ATTRIBUTE_TYPES)
    if key == "<no leaseKey>":
        raise UnreadableByKcl(key, "leaseKey is missing or empty")
    if item.get("entityType", {"S": "LEASE"})["S"] != "LEASE":
        raise UnreadableByKcl(key, f"entityType {item['entityType']['S']!r} is not a lease")
    if "checkpoint" not in item or not item["checkpoint"]["S"]:
        raise UnreadableByKcl(key, "checkpoint is missing or empty")
    if "pendingCheckpoint" in item:
        raise UnreadableByKcl(key, f"pendingCheckpoint {item['pendingCheckpoint']['S']!r} was left behind")
    checkpoint = item["checkpoint"]["S"]
    sub_sequence = _long(key, item, "checkpointSubSequenceNumber")
    checkpoint_order(key, checkpoint, sub_sequence)
    hash_range = None
    starting, ending = item.get("startingHashKey", {}).get("S"), item.get("endingHashKey", {}).get("S")
    if starting or ending:
        if not (starting and ending and starting.isdigit() and ending.isdigit() and int(starting) < int(ending)):
            raise UnreadableByKcl(key, f"hash key range {starting!r}..{ending!r} is not a range KCL accepts")
        hash_range = (int(starting), int(ending))
    return KclLease(
        lease_key=key,
        lease_owner=item.get("leaseOwner", {}).get("S"),
        lease_counter=_long(key, item, "leaseCounter"),
        checkpoint=checkpoint,
        checkpoint_sub_sequence_number=sub_sequence,
        owner_switches_since_checkpoint=_long(key, item, "ownerSwitchesSinceCheckpoint"),
        parent_shard_ids=frozenset(item.get("parentShardId", {}).get("SS", ())),
        child_shard_ids=frozenset(item.get("childShardIds", {}).get("SS", ())),
        hash_key_range=hash_range,
        checkpoint_owner=item.get("checkpointOwner", {}).get("S"),
    )


def read_worker_metrics(item: Mapping[str, Any]) -> tuple[str, int, dict[str, list[float]]]:
    """A WorkerMetricStats item as KCL's leader loads it: worker id, `lut` and `sts`; wrong types raise."""
    key = item["leaseKey"]["S"]
    _typed(key, item, WORKER_METRIC_ATTRIBUTE_TYPES)
    if "lut" not in item:
        raise UnreadableByKcl(key, "worker metrics without lut")
    stats: dict[str, list[float]] = {}
    for attribute in ("sts", "opr"):
        for metric, values in item.get(attribute, {}).get("M", {}).items():
            if set(values) != {"L"} or any(set(value) != {"N"} for value in values["L"]):
                raise UnreadableByKcl(key, f"{attribute}.{metric} is not a list of numbers")
            if attribute == "sts":
                stats[metric] = [float(value["N"]) for value in values["L"]]
    return key, _long(key, item, "lut"), stats


def entity_type(item: Mapping[str, Any]) -> str:
    """The entity KCL 3.5 reads an item as: its tag when it knows it, a well-known coordinator-state key,
    else a lease (an unknown tag too: DynamoDBLeaseTableDao falls back to the lease deserializer)."""
    tag = item.get("entityType", {}).get("S")
    if tag in ENTITY_TYPES:
        return str(tag)
    if tag is None:
        return LEGACY_COORDINATOR_KEYS.get(item.get("leaseKey", {}).get("S"), "LEASE")
    return "LEASE"


@dataclass(frozen=True)
class LeaseTable:
    """Every item of a lease table, each read as KCL 3.5 reads its kind."""

    leases: dict[str, KclLease]
    worker_metrics: dict[str, tuple[int, dict[str, list[float]]]]
    coordinator_state: dict[str, Item]


def read_table(client: Any, table_name: str) -> LeaseTable:
    """The whole table, every page, read as KCL 3.5's entity scan reads it; the first item it could not
    read raises UnreadableByKcl."""
    leases: dict[str, KclLease] = {}
    metrics: dict[str, tuple[int, dict[str, list[float]]]] = {}
    state: dict[str, Item] = {}
    for item in _scan(client, table_name):
        kind = entity_type(item)
        if kind == "LEASE":
            lease = read_lease(item)
            leases[lease.lease_key] = lease
        elif kind == "WORKER_METRIC_STATS":
            worker, last_update, stats = read_worker_metrics(item)
            metrics[worker] = (last_update, stats)
        else:
            state[item["leaseKey"]["S"]] = item
    return LeaseTable(leases, metrics, state)


def _scan(client: Any, table_name: str) -> Iterator[Item]:
    arguments: dict[str, Any] = {"TableName": table_name, "ConsistentRead": True}
    while True:
        page = client.scan(**arguments)
        yield from page["Items"]
        if "LastEvaluatedKey" not in page:
            return
        arguments["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@dataclass
class KclWorker:
    """One KCL 3.5 worker of a single-stream application, its own leader, consuming from TRIM_HORIZON.

    `clock` is the wall clock its worker metrics are written and judged by (epoch seconds).
    `failover_millis` is its `failoverTimeMillis`: how long a lease's counter must stand still before
    its leader calls the lease expired.
    """

    dynamodb: Any
    kinesis: Any
    table_name: str
    stream: str
    worker_id: str
    failover_millis: int = 300
    clock: Callable[[], float] = time.time
    processed: list[StreamRecord] = field(default_factory=list)
    _held: dict[str, KclLease] = field(default_factory=dict)
    _leader_version: str | None = None

    # --- the application's tables, as KCL 3.5 creates them for a new application -----------------

    def create_lease_table(self) -> None:
        """The lease table with its owner index (docs/protocol.md §1.4), and the coordinator-state records a new
        3.x application writes: its client version, and its table migration (none to do: complete)."""
        self.dynamodb.create_table(
            TableName=self.table_name,
            KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
            AttributeDefinitions=[
                {"AttributeName": "leaseKey", "AttributeType": "S"},
                {"AttributeName": "leaseOwner", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
            GlobalSecondaryIndexes=[
                {
                    "IndexName": OWNER_INDEX,
                    "KeySchema": [
                        {"AttributeName": "leaseOwner", "KeyType": "HASH"},
                        {"AttributeName": "leaseKey", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            ],
        )
        self.dynamodb.get_waiter("table_exists").wait(TableName=self.table_name, WaiterConfig={"Delay": 0.1})
        now_millis = str(int(self.clock() * 1000))
        history = {
            "L": [{"M": {"cv": {"S": "CLIENT_VERSION_3X"}, "mb": {"S": self.worker_id}, "mts": {"N": now_millis}}}]
        }
        for record in (
            {
                "leaseKey": {"S": CLIENT_VERSION_MIGRATION_KEY},
                "cv": {"S": "CLIENT_VERSION_3X"},
                "mb": {"S": self.worker_id},
                "mts": {"N": now_millis},
                "h": history,
                "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
            },
            {
                "leaseKey": {"S": TABLE_MIGRATION_KEY},
                "tm": {"S": "TABLE_MIGRATION_STATUS_COMPLETE"},
                "mb": {"S": self.worker_id},
                "mts": {"N": now_millis},
                "entityType": {"S": "TABLE_MIGRATION"},
            },
        ):
            self.dynamodb.put_item(TableName=self.table_name, Item=record, Expected={"leaseKey": {"Exists": False}})

    # --- a run: start, consume, shut down gracefully ----------------------------------------------

    def run(self, records_per_lease: int | None = None) -> None:
        """Start, lead, consume every lease it can (at most `records_per_lease` records of each in
        this run, else to the tip or the shard's end), and shut down gracefully."""
        self._acquire_leadership()
        if not self._table().leases:
            self._sync_empty_table()
        consumed: dict[str, int] = {}
        for _ in range(MAX_PASSES):
            self._publish_worker_metrics()  # KCL's reporter writes every 30 s; a pass is shorter
            self._assign_expired_leases()
            self._discover_and_renew()
            progressed = False
            for lease_key in sorted(self._held):
                budget = None if records_per_lease is None else records_per_lease - consumed.get(lease_key, 0)
                if budget == 0 or not self._parents_have_finished(self._held[lease_key]):
                    continue
                count, moved = self._consume(lease_key, budget)
                consumed[lease_key] = consumed.get(lease_key, 0) + count
                progressed |= moved
            if not progressed:
                break
        else:
            raise AssertionError(f"{self.worker_id} still found work after {MAX_PASSES} passes over its leases")
        self._shut_down()

    def _shut_down(self) -> None:
        """Graceful shutdown: the record processors have checkpointed; the leases stay as they are,
        owned by this worker (KCL does not release them: its issue #845); the worker's
        metrics stay; the leader lock is released by a delete (docs/protocol.md §5.4)."""
        self._held.clear()
        self.dynamodb.delete_item(
            TableName=self.table_name,
            Key={"leaseKey": {"S": LEADER_KEY}},
            Expected={
                "ownerName": {"Value": {"S": self.worker_id}},
                "recordVersionNumber": {"Value": {"S": self._leader_version}},
            },
        )
        self._leader_version = None

    # --- leadership and worker metrics (docs/protocol.md §5) ----------------------------------------------------

    def _acquire_leadership(self) -> None:
        """The lock client's acquire of an absent lock: a put conditional on no `Leader` item."""
        current = self._get(LEADER_KEY)
        if current is not None:
            raise AssertionError(f"the leader lock is held by {current['ownerName']['S']}: KCL would wait")
        version = str(uuid.uuid4())
        self.dynamodb.put_item(
            TableName=self.table_name,
            Item={
                "leaseKey": {"S": LEADER_KEY},
                "ownerName": {"S": self.worker_id},
                "leaseDuration": {"S": "120000"},
                "recordVersionNumber": {"S": version},
                "entityType": {"S": "LEADER"},
            },
            Expected={"leaseKey": {"Exists": False}},
        )
        self._leader_version = version

    def _publish_worker_metrics(self) -> None:
        """The reporter's unconditional upsert of this worker's item (docs/protocol.md §5.2), CPU metric `C`."""
        now = str(int(self.clock()))
        self.dynamodb.update_item(
            TableName=self.table_name,
            Key={"leaseKey": {"S": self.worker_id}},
            AttributeUpdates={
                name: {"Value": value, "Action": "PUT"}
                for name, value in {
                    "lut": {"N": now},
                    "sts": {"M": {"C": {"L": [{"N": "23.5"}]}}},
                    "opr": {"M": {"C": {"L": [{"N": "100"}]}}},
                    "sup": {"N": "1"},
                    "slu": {"N": now},
                    "entityType": {"S": "WORKER_METRIC_STATS"},
                }.items()
            },
        )

    # --- shard sync of an empty table (docs/protocol.md §3.2, §3.4) --------------------------------------------

    def _sync_empty_table(self) -> None:
        shards = self.kinesis.list_shards(StreamName=self.stream, ShardFilter={"Type": "AT_TRIM_HORIZON"})["Shards"]
        for shard in shards:
            self._create_lease_if_not_exists(shard, "TRIM_HORIZON")

    def _create_lease_if_not_exists(self, shard: Mapping[str, Any], checkpoint: str) -> None:
        """createLeaseIfNotExists: the whole item (docs/protocol.md §1.1), conditional on the key being absent; a
        lost race is not an error."""
        parents = {shard.get("ParentShardId"), shard.get("AdjacentParentShardId")} - {None}
        item: Item = {
            "leaseKey": {"S": shard["ShardId"]},
            "leaseCounter": {"N": "0"},
            "ownerSwitchesSinceCheckpoint": {"N": "0"},
            "checkpoint": {"S": checkpoint},
            "checkpointSubSequenceNumber": {"N": "0"},
            "startingHashKey": {"S": shard["HashKeyRange"]["StartingHashKey"]},
            "endingHashKey": {"S": shard["HashKeyRange"]["EndingHashKey"]},
            "entityType": {"S": "LEASE"},
        }
        if parents:
            item["parentShardId"] = {"SS": sorted(parents)}
        with contextlib.suppress(self.dynamodb.exceptions.ConditionalCheckFailedException):
            self.dynamodb.put_item(TableName=self.table_name, Item=item, Expected={"leaseKey": {"Exists": False}})

    # --- the leader's assignment (docs/protocol.md §4.1) and the worker's discovery (§4.8) ----------------

    def _assign_expired_leases(self) -> None:
        """Two scans a lease duration apart: a lease without an owner, or whose counter stood still in
        between, is expired, and is assigned to the one active worker, this one, with `assignLease`."""
        first = self._table()
        self._refuse_other_active_workers(first)
        time.sleep(self.failover_millis / 1000 * 1.2)
        second = self._table()
        for key, lease in second.leases.items():
            if lease.lease_owner == self.worker_id and lease.checkpoint_owner is None:
                continue
            before = first.leases.get(key)
            unchanged = before is not None and before.lease_counter == lease.lease_counter
            if lease.lease_owner is None or unchanged:
                self._assign(lease)

    def _refuse_other_active_workers(self, table: LeaseTable) -> None:
        now = int(self.clock())
        active = {
            worker
            for worker, (last_update, stats) in table.worker_metrics.items()
            if now - last_update <= WORKER_METRICS_ACTIVE_SECONDS and not any(v and v[-1] == -1 for v in stats.values())
        }
        if active != {self.worker_id}:
            raise AssertionError(f"KCL's leader would share the leases among the active workers {sorted(active)}")

    def _assign(self, lease: KclLease) -> None:
        """assignLease: conditional on the owner and checkpointOwner read; owner set, checkpointOwner
        removed, counter ADD 1, owner switches ADD 1 when the owner changes (docs/protocol.md §2.1, §2.3)."""
        updates: dict[str, Any] = {
            "leaseOwner": {"Value": {"S": self.worker_id}, "Action": "PUT"},
            "checkpointOwner": {"Action": "DELETE"},
            "leaseCounter": {"Value": {"N": "1"}, "Action": "ADD"},
        }
        if lease.lease_owner is not None and lease.lease_owner != self.worker_id:
            updates["ownerSwitchesSinceCheckpoint"] = {"Value": {"N": "1"}, "Action": "ADD"}
        self.dynamodb.update_item(
            TableName=self.table_name,
            Key={"leaseKey": {"S": lease.lease_key}},
            AttributeUpdates=updates,
            Expected={
                "leaseKey": {"Value": {"S": lease.lease_key}},
                "leaseOwner": _expected_string(lease.lease_owner),
                "checkpointOwner": _expected_string(lease.checkpoint_owner),
            },
        )

    def _discover_and_renew(self) -> None:
        """The owner index queried for this worker's leases, each new one read and kept only when it
        names this worker and no checkpointOwner, then renewed on its counter (docs/protocol.md §4.8, §2.4)."""
        page = self.dynamodb.query(
            TableName=self.table_name,
            IndexName=OWNER_INDEX,
            KeyConditionExpression="leaseOwner = :owner",
            ExpressionAttributeValues={":owner": {"S": self.worker_id}},
        )
        for key in sorted(item["leaseKey"]["S"] for item in page["Items"]):
            if key in self._held:
                continue
            item = self._get(key)
            if item is None:
                continue
            lease = read_lease(item)
            if lease.lease_owner == self.worker_id and lease.checkpoint_owner is None:
                self._held[key] = self._renew(lease)

    def _renew(self, lease: KclLease) -> KclLease:
        self.dynamodb.update_item(
            TableName=self.table_name,
            Key={"leaseKey": {"S": lease.lease_key}},
            AttributeUpdates={"leaseCounter": {"Value": {"N": str(lease.lease_counter + 1)}, "Action": "PUT"}},
            Expected={
                "leaseCounter": {"Value": {"N": str(lease.lease_counter)}},
                "checkpointOwner": {"Exists": False},
            },
        )
        return _with(lease, lease_counter=lease.lease_counter + 1)

    # --- consuming a lease ---------------------------------------------------------------------------

    def _parents_have_finished(self, lease: KclLease) -> bool:
        """A child is blocked while a parent lease exists and is not at SHARD_END (docs/protocol.md §3.7)."""
        for parent in lease.parent_shard_ids:
            item = self._get(parent)
            if item is not None and read_lease(item).checkpoint != SHARD_END:
                return False
        return True

    def _consume(self, lease_key: str, budget: int | None) -> tuple[int, bool]:
        """Read the lease's shard from its checkpoint, process at most `budget` records, checkpoint
        after every batch; at the shard's end create the children and record SHARD_END (docs/protocol.md §3.8).
        The records processed, and whether the checkpoint moved."""
        lease = self._held[lease_key]
        if lease.checkpoint == SHARD_END:
            return 0, False
        if lease.checkpoint in SENTINEL_ITERATORS:
            start = {"ShardIteratorType": SENTINEL_ITERATORS[lease.checkpoint]}
        elif lease.checkpoint.isdigit() and lease.checkpoint_sub_sequence_number == 0:
            start = {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": lease.checkpoint}
        else:
            raise AssertionError(f"{lease_key}: the stand-in cannot start at {lease.checkpoint!r}")
        iterator = self.kinesis.get_shard_iterator(StreamName=self.stream, ShardId=lease_key, **start)["ShardIterator"]
        count, moved = 0, False
        while budget is None or count < budget:
            response = self._get_records(iterator)
            records = [
                record
                for record in response["Records"]
                if checkpoint_order(lease_key, record["SequenceNumber"], 0) > lease.order
            ]
            if budget is not None:
                records = records[: budget - count]
            for record in records:
                self.processed.append(StreamRecord(lease_key, record["SequenceNumber"], 0, record["Data"]))
            count += len(records)
            if records:
                lease = self._checkpoint(lease, records[-1]["SequenceNumber"])
                moved = True
            if response.get("NextShardIterator") is None and (budget is None or count < budget):
                self._end_shard(lease, response.get("ChildShards", []))
                return count, True
            if not records and response.get("MillisBehindLatest", 0) == 0:
                break
            iterator = response["NextShardIterator"]
        return count, moved

    def _get_records(self, iterator: str) -> dict[str, Any]:
        """GetRecords, backing off while the shard's read limit is exceeded, as KCL's fetcher does."""
        while True:
            try:
                return dict(self.kinesis.get_records(ShardIterator=iterator, Limit=100))
            except self.kinesis.exceptions.ProvisionedThroughputExceededException:
                time.sleep(0.2)

    def _end_shard(self, lease: KclLease, children: list[dict[str, Any]]) -> None:
        """The shutdown task at SHARD_END: each child's lease created at TRIM_HORIZON where absent, the
        child ids recorded on the parent, then the SHARD_END checkpoint (docs/protocol.md §3.8, §2.5)."""
        child_ids = frozenset(child["ShardId"] for child in children)
        if len(children) == 1 and len(children[0]["ParentShards"]) != 2:
            raise AssertionError(f"{lease.lease_key}: a merge's child must name two parents")
        for child in children:
            parents = child["ParentShards"]
            self._create_lease_if_not_exists(
                {
                    "ShardId": child["ShardId"],
                    "ParentShardId": parents[0],
                    "AdjacentParentShardId": parents[1] if len(parents) > 1 else None,
                    "HashKeyRange": child["HashKeyRange"],
                },
                "TRIM_HORIZON",
            )
        if child_ids:
            self.dynamodb.update_item(  # updateLeaseWithMetaInfo: on the key alone, counter unchanged
                TableName=self.table_name,
                Key={"leaseKey": {"S": lease.lease_key}},
                AttributeUpdates={"childShardIds": {"Value": {"SS": sorted(child_ids)}, "Action": "PUT"}},
                Expected={"leaseKey": {"Value": {"S": lease.lease_key}}},
            )
        self._checkpoint(_with(lease, child_shard_ids=lease.child_shard_ids | child_ids), SHARD_END)

    def _checkpoint(self, lease: KclLease, sequence_number: str) -> KclLease:
        """updateLease (docs/protocol.md §2.1, §2.5): never below the last checkpoint; conditional on the counter;
        the checkpoint pair set, the pending pair and state removed, owner switches 0, counter + 1."""
        if checkpoint_order(lease.lease_key, sequence_number, 0) < lease.order:
            raise AssertionError(f"{lease.lease_key}: checkpoint {sequence_number} is below {lease.checkpoint}")
        updates: dict[str, Any] = {
            "leaseCounter": {"Value": {"N": str(lease.lease_counter + 1)}, "Action": "PUT"},
            "checkpoint": {"Value": {"S": sequence_number}, "Action": "PUT"},
            "checkpointSubSequenceNumber": {"Value": {"N": "0"}, "Action": "PUT"},
            "ownerSwitchesSinceCheckpoint": {"Value": {"N": "0"}, "Action": "PUT"},
            "pendingCheckpoint": {"Action": "DELETE"},
            "pendingCheckpointSubSequenceNumber": {"Action": "DELETE"},
            "pendingCheckpointState": {"Action": "DELETE"},
        }
        if lease.child_shard_ids:
            updates["childShardIds"] = {"Value": {"SS": sorted(lease.child_shard_ids)}, "Action": "PUT"}
        if lease.hash_key_range is not None:
            updates["startingHashKey"] = {"Value": {"S": str(lease.hash_key_range[0])}, "Action": "PUT"}
            updates["endingHashKey"] = {"Value": {"S": str(lease.hash_key_range[1])}, "Action": "PUT"}
        self.dynamodb.update_item(
            TableName=self.table_name,
            Key={"leaseKey": {"S": lease.lease_key}},
            AttributeUpdates=updates,
            Expected={"leaseCounter": {"Value": {"N": str(lease.lease_counter)}}},
        )
        checkpointed = _with(
            lease,
            lease_counter=lease.lease_counter + 1,
            checkpoint=sequence_number,
            checkpoint_sub_sequence_number=0,
            owner_switches_since_checkpoint=0,
        )
        self._held[lease.lease_key] = checkpointed
        return checkpointed

    # --- reads ---------------------------------------------------------------------------------------

    def _table(self) -> LeaseTable:
        return read_table(self.dynamodb, self.table_name)

    def _get(self, key: str) -> Item | None:
        item = self.dynamodb.get_item(TableName=self.table_name, Key={"leaseKey": {"S": key}}, ConsistentRead=True)
        return item.get("Item")


def _expected_string(value: str | None) -> dict[str, Any]:
    """A legacy `Expected` entry: equal to `value`, or absent when None (as KCL's owner expectations)."""
    return {"Exists": False} if value is None else {"Value": {"S": value}}


def _with(lease: KclLease, **changes: Any) -> KclLease:
    return KclLease(**{**lease.__dict__, **changes})
