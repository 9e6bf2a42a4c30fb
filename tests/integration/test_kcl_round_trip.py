"""A KCL 3.5 single-table application hands its lease table to this project and takes it back, with
records (issue 46): every record is processed exactly once across the three.

KCL itself cannot run here, so its side is `tests.support.kcl_worker.KclWorker`, written from KCL's
specification: it creates the table and items KCL 3.5 creates, consumes from kinesis-mock with KCL's
conditional writes, and reads the table back as KCL's deserializers do, refusing what they could not
read. Between the two, a round of this project runs for real (shard sync, assignment, the consume job
on a local SparkSession), configured with the KCL application's lease table; then KCL takes it back,
and a round takes it once more. A split before each of the first two handovers puts a parent and its
children across it, both ways.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import boto3

from devtools.kinesis_streams import create_stream, kinesis_client, put_entries, split_shard
from devtools.stream_records import StreamRecord
from lease_core.leader.assignment_round import slot_ids
from tests.support.kcl_worker import (
    CLIENT_VERSION_MIGRATION_KEY,
    ENTITY_TYPES,
    LEADER_KEY,
    SHARD_END,
    TABLE_MIGRATION_KEY,
    WORKER_METRICS_ACTIVE_SECONDS,
    KclWorker,
    LeaseTable,
    read_table,
)
from tests.support.pipeline import ConsumerPipeline, duplicates
from tests.support.stores import table_names

KCL_WORKER = "kcl-host-1"
RECORDS = 150  # per production, spread over the stream's open shards
KCL_RECORDS_PER_LEASE = 30  # KCL stops part of the way: the round resumes inside every shard


@dataclass
class Producer:
    """Puts records with unique payloads and keeps each as Kinesis acknowledged it."""

    kinesis: Any
    stream: str
    produced: list[StreamRecord] = field(default_factory=list)
    _serial: itertools.count = field(default_factory=itertools.count)

    def produce(self, count: int) -> None:
        entries = [
            {"Data": f"record-{serial:06d}".encode(), "PartitionKey": f"key-{serial}"}
            for serial in itertools.islice(self._serial, count)
        ]
        self.produced += [
            StreamRecord.acknowledged(entry, result)
            for entry, result in put_entries(self.kinesis, self.stream, entries)
        ]


def identity(record: StreamRecord) -> tuple[str, int, int, bytes]:
    return (record.shard_id, int(record.sequence_number), record.sub_sequence_number, record.data)


def checkpoints(table: LeaseTable) -> dict[str, tuple[int, int, int]]:
    return {key: lease.order for key, lease in table.leases.items()}


def kcl_own_items(client: Any, table_name: str) -> dict[str, dict]:
    """The items of KCL's that no round may change: its worker's metrics and its migration records."""
    return {
        key: client.get_item(TableName=table_name, Key={"leaseKey": {"S": key}}, ConsistentRead=True)["Item"]
        for key in (KCL_WORKER, CLIENT_VERSION_MIGRATION_KEY, TABLE_MIGRATION_KEY)
    }


def test_a_kcl_3_5_table_goes_to_a_round_back_to_kcl_and_to_a_round_again_processing_every_record_once(
    spark, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, unique_name, 2)
    producer = Producer(kinesis, unique_name)

    # KCL 3.5 starts the application: its table, its leases at TRIM_HORIZON, part of every shard read.
    kcl = KclWorker(dynamodb, kinesis, unique_name, unique_name, KCL_WORKER)
    kcl.create_lease_table()
    producer.produce(RECORDS)
    kcl.run(records_per_lease=KCL_RECORDS_PER_LEASE)
    handed_over = read_table(dynamodb, unique_name)
    first_shards = sorted(handed_over.leases)
    assert len(first_shards) == 2
    assert len(kcl.processed) == 2 * KCL_RECORDS_PER_LEASE
    assert {lease.lease_owner for lease in handed_over.leases.values()} == {KCL_WORKER}
    assert all(lease.checkpoint.isdigit() for lease in handed_over.leases.values())
    assert LEADER_KEY not in handed_over.coordinator_state
    kcl_items = kcl_own_items(dynamodb, unique_name)

    # The first shard splits while KCL is stopped: the round ends the parent KCL was reading, reads its children.
    split_parent = first_shards[0]
    split_children = split_shard(kinesis, unique_name, split_parent)
    producer.produce(RECORDS)
    pipeline = ConsumerPipeline(
        f"rounds-{unique_name}"[:60],
        (unique_name,),
        kinesis_endpoint,
        moto_endpoint,
        str(tmp_path / "lake"),
        settings={"lease_table_name": unique_name, "initial_position_in_stream": "TRIM_HORIZON"},
    )
    report = pipeline.round(spark, workers=2)
    assert report.succeeded, report.summary()
    landed = pipeline.landed()
    handed_back = read_table(dynamodb, unique_name)  # as KCL reads it: raises on what it could not read
    assert handed_back.leases[split_parent].checkpoint == SHARD_END
    assert set(split_children) <= set(handed_back.leases)
    assert {record.shard_id for record in landed} == {*first_shards, *split_children}
    assert [name for name in table_names(dynamodb) if unique_name in name] == [unique_name]
    assert LEADER_KEY not in handed_back.coordinator_state
    assert kcl_own_items(dynamodb, unique_name) == kcl_items

    # While the rounds are paused, records arrive and the other first shard splits: KCL reads it on from
    # the round's checkpoint to its end, then its children. KCL starts more than a minute after the
    # round, once the slots' worker metrics look inactive to its leader (a leader started sooner would
    # hand leases to the slots for that minute, docs/protocol.md §4.5).
    other_parent = first_shards[1]
    assert handed_back.leases[other_parent].checkpoint.isdigit()
    producer.produce(RECORDS)
    other_children = split_shard(kinesis, unique_name, other_parent)
    producer.produce(RECORDS)
    kcl_again = KclWorker(
        dynamodb,
        kinesis,
        unique_name,
        unique_name,
        KCL_WORKER,
        clock=lambda: time.time() + 2 * WORKER_METRICS_ACTIVE_SECONDS,
    )
    kcl_again.run()
    taken_back = read_table(dynamodb, unique_name)

    processed = kcl.processed + landed + kcl_again.processed
    assert duplicates(processed) == []
    assert sorted(map(identity, processed)) == sorted(map(identity, producer.produced))
    assert {record.shard_id for record in kcl_again.processed} >= {other_parent, *other_children}
    assert taken_back.leases[other_parent].checkpoint == SHARD_END
    assert {lease.lease_owner for lease in taken_back.leases.values()} == {KCL_WORKER}
    kcl_items = kcl_own_items(dynamodb, unique_name)

    # And to the rounds once more: the attributes of ours KCL left on its leases (an old claim token,
    # committed batch, read-through time) stand in the way of nothing.
    producer.produce(RECORDS)
    report = pipeline.round(spark, workers=2)
    assert report.succeeded, report.summary()
    landed_by_rounds = pipeline.landed()
    handed_back_again = read_table(dynamodb, unique_name)
    assert kcl_own_items(dynamodb, unique_name) == kcl_items
    assert {lease.lease_owner for lease in handed_back_again.leases.values()} <= set(
        slot_ids(pipeline.application_name, 2)
    )

    processed = kcl.processed + kcl_again.processed + landed_by_rounds
    assert duplicates(processed) == []
    assert sorted(map(identity, processed)) == sorted(map(identity, producer.produced))
    assert {record.shard_id for record in set(landed_by_rounds) - set(landed)} == {*split_children, *other_children}
    for before, after in ((handed_over, handed_back), (handed_back, taken_back), (taken_back, handed_back_again)):
        moved_from, moved_to = checkpoints(before), checkpoints(after)
        for key in moved_from.keys() & moved_to.keys():
            assert moved_from[key] <= moved_to[key], f"{key}'s checkpoint went back"
    for item in dynamodb.scan(TableName=unique_name, ConsistentRead=True)["Items"]:
        assert item.get("entityType", {}).get("S", "LEASE") in ENTITY_TYPES, item["leaseKey"]
