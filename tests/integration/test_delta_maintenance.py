"""Upkeep of a Delta table the sink writes (`sinks.table.delta_maintenance`), in a local folder and
on S3 (moto): orphans removed only when nothing will commit them, small files compacted, the files
commits removed vacuumed, the log checkpointed and trimmed, and after all of it every row once and
the next round's commit exactly where it belongs."""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from deltalake import DeltaTable

from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON
from lease_core.ops.landed_audit import audit_landed
from sinks.batch_sink import RoundIdentity, StagedBatch
from sinks.table.delta import DeltaLeaseRecord, DeltaReceipt, DeltaSink
from sinks.table.delta_maintenance import (
    checkpoint_log,
    compact_small_files,
    remove_orphan_files,
    vacuum_removed_files,
)
from sinks.table.lease_records import live_receipts
from tests.support.iceberg_tables import batch_of, position, rows
from tests.support.leasectl import run_leasectl
from tests.support.stores import dynamodb_store

APPLICATION = "orders-app"
IDENTITY = RoundIdentity(APPLICATION, 1, {"orders": ("arn:aws:kinesis:us-east-1:000000000000:stream/orders", 1)})
LEASE = "shardId-000000000001"
GRACE = timedelta(hours=72)
LATER = datetime.now(UTC) + GRACE + timedelta(hours=1)  # every file written by the test is past the grace


@pytest.fixture(params=["local", "s3"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return f"delta:{tmp_path / 'orders'}"
    endpoint = request.getfixturevalue("moto_endpoint")
    request.getfixturevalue("monkeypatch").setenv("AWS_ENDPOINT_URL_S3", endpoint)
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return f"delta:s3://{bucket}/orders"


def staged(sink: DeltaSink, first: int, count: int, attempt: str, start=None) -> tuple[str, DeltaReceipt]:
    start = start if start is not None else (TRIM_HORIZON if first == 1 else position(first - 1))
    token = sink.stage(batch_of(start, first, count), rows(first, count), attempt).token
    assert token is not None
    return token, sink.read_receipt(token)


def committed(sink: DeltaSink, record: str | None, token: str) -> str:
    receipt = sink.read_receipt(token)
    updated = sink.commit_record(record, StagedBatch(token, receipt.rows, 0))
    assert updated is not None
    return updated


def sequence_numbers(sink: DeltaSink) -> list[int]:
    landed = sink.visible_rows(["sequence_number"])
    return [] if landed is None else sorted(int(n) for n in landed.column("sequence_number").to_pylist())


def two_rounds_into_a_table_keeping_its_log_no_time(sink: DeltaSink) -> DeltaTable:
    """Rounds landing records 1-3 and 4-6 of the lease, in a table whose log entries expire at once."""
    for first in (1, 4):
        token, _ = staged(sink, first, 3, f"round-{first}")
        sink.publish_round({LEASE: committed(sink, None, token)}, IDENTITY)
    table = sink.table()
    assert table is not None
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 hours"})
    return table


def files_of(receipt: DeltaReceipt) -> set[str]:
    return {file["path"] for file in receipt.files}


def test_orphans_are_removed_and_what_a_lease_or_the_table_still_names_is_kept(uri):
    sink = DeltaSink(uri, APPLICATION)
    published_token, published = staged(sink, 1, 3, "round-1")
    sink.publish_round({LEASE: committed(sink, None, published_token)}, IDENTITY)
    _, abandoned = staged(sink, 4, 2, "fenced-attempt")  # its lease never committed it
    waiting_token, waiting = staged(sink, 4, 2, "redo")  # committed by the lease, not in the table yet
    record = committed(sink, None, waiting_token)
    in_flight_token, in_flight = staged(sink, 6, 2, "in-flight")  # a pending checkpoint names it
    live = live_receipts(DeltaLeaseRecord, [record], [in_flight_token])

    assert remove_orphan_files(sink, live, GRACE).removed == ()  # everything is younger than the grace
    removal = remove_orphan_files(sink, live, GRACE, now=LATER)

    assert set(removal.removed) == {
        sink.receipt_path(abandoned.receipt_id),
        *files_of(abandoned),
        sink.receipt_path(published.receipt_id),  # the table holds its batch; its files stay
    }
    for kept in (waiting, in_flight):
        assert sink.storage.exists(sink.receipt_path(kept.receipt_id))
        assert all(sink.storage.exists(path) for path in files_of(kept))
    assert all(sink.storage.exists(path) for path in files_of(published))
    assert DeltaSink(uri, APPLICATION).publish_round({LEASE: record}, IDENTITY).batches_published == 1
    assert sequence_numbers(sink) == [1, 2, 3, 4, 5]


def test_a_data_file_whose_receipt_never_came_is_removed_and_no_other_writers_file_is(uri):
    sink = DeltaSink(uri, APPLICATION)
    _, receipt = staged(sink, 1, 3, "a")
    sink.storage.put("arrival_day=2026-11-27/part-" + "ab" * 16 + "-0.parquet", b"died before its receipt")
    sink.storage.put("arrival_day=2026-11-27/part-00000-6f1c-c000.snappy.parquet", b"another writer's")
    other = DeltaSink(uri, "payments-app")
    _, others = staged(other, 1, 3, "b")

    removal = remove_orphan_files(sink, set(), GRACE, now=LATER)

    assert set(removal.removed) == {
        "arrival_day=2026-11-27/part-" + "ab" * 16 + "-0.parquet",
        sink.receipt_path(receipt.receipt_id),
        *files_of(receipt),
    }
    assert sink.storage.exists("arrival_day=2026-11-27/part-00000-6f1c-c000.snappy.parquet")
    assert other.storage.exists(other.receipt_path(others.receipt_id))
    assert all(other.storage.exists(path) for path in files_of(others))


def test_a_position_map_no_commit_names_is_removed_and_the_named_ones_stay_readable(uri):
    sink = DeltaSink(uri, APPLICATION)
    token, _ = staged(sink, 1, 3, "a")
    sink.publish_round({LEASE: committed(sink, None, token)}, IDENTITY)
    dead = sink.positions_path(2)  # a publisher that died between its map and its commit
    assert sink.storage.create(dead, b'{"half": ')

    removal = remove_orphan_files(sink, set(), GRACE, now=LATER)

    assert dead in removal.removed and sink.positions_path(1) not in removal.removed
    (batch,) = DeltaSink(uri, APPLICATION).landed_batches()
    assert (batch.lease_key, batch.end) == (LEASE, position(3))


def test_compaction_vacuum_and_checkpoints_keep_every_row_once_and_the_applications_place(uri):
    sink = DeltaSink(uri, APPLICATION)
    record = None
    for first in (1, 4, 7, 10):
        token, _ = staged(sink, first, 3, f"round-{first}")
        record = committed(sink, None, token)
        sink.publish_round({LEASE: record}, IDENTITY)
    table = sink.table()
    assert table is not None
    table.alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 0 hours", "delta.logRetentionDuration": "interval 0 hours"}
    )
    waiting_token, waiting = staged(sink, 13, 2, "waiting")  # committed by its lease, its round's commit failed
    waiting_record = committed(sink, record, waiting_token)
    files_before = len(table.file_uris())

    compaction = compact_small_files(sink)
    vacuumed = vacuum_removed_files(sink)
    version = checkpoint_log(sink)

    assert compaction.files_rewritten == files_before and compaction.files_written < files_before
    assert len(vacuumed) == compaction.files_rewritten  # the compacted files, and nothing staged
    assert all(sink.storage.exists(path) for path in files_of(waiting))
    assert sink.storage.exists(f"_delta_log/{version:020d}.checkpoint.parquet")
    assert sink.storage.exists("_delta_log/_last_checkpoint")
    assert sequence_numbers(sink) == list(range(1, 13))
    reopened = DeltaSink(uri, APPLICATION)
    assert reopened.positions_in(reopened.table())[LEASE].end == position(12)
    assert reopened.publish_round({LEASE: record}, IDENTITY).batches_published == 0  # held already
    assert reopened.publish_round({LEASE: waiting_record}, IDENTITY).batches_published == 1
    assert sequence_numbers(sink) == list(range(1, 15))


def test_a_round_s_commit_leaves_the_log_s_expired_entries_to_the_upkeep(uri):
    sink = DeltaSink(uri, APPLICATION)
    table = two_rounds_into_a_table_keeping_its_log_no_time(sink)
    table.create_checkpoint()  # as an earlier upkeep made one: the entries before it are past the retention
    log_before = log_entries(sink)
    token, _ = staged(sink, 7, 3, "round-7")

    assert DeltaSink(uri, APPLICATION).publish_round({LEASE: committed(sink, None, token)}, IDENTITY).commits == 1

    assert log_before < log_entries(sink), "the round's commit deleted none of the log"
    version = checkpoint_log(sink)
    assert log_entries(sink) == {f"{version:020d}.json", f"{version:020d}.checkpoint.parquet", "_last_checkpoint"}


def log_entries(sink: DeltaSink) -> set[str]:
    return {file.path.removeprefix("_delta_log/") for file in sink.storage.listing("_delta_log")}


def test_a_batch_whose_staged_files_a_full_vacuum_deleted_is_reported_lost_and_not_added(uri):
    sink = DeltaSink(uri, APPLICATION)
    token, receipt = staged(sink, 1, 3, "a")
    record = committed(sink, None, token)
    sink.storage.delete(sorted(files_of(receipt)))  # Spark's VACUUM past the retention: untracked files go

    published = DeltaSink(uri, APPLICATION).publish_round({LEASE: record}, IDENTITY)

    assert (published.batches_published, published.missing_batches) == (0, (f"{LEASE}: the batch up to 3",))
    assert sequence_numbers(sink) == [], "no file that is gone is added"
    # The loss is on record (a commit that adds no data), for verify to report however old it gets.
    assert (LEASE, position(3), True) in [(batch.lease_key, batch.end, batch.lost) for batch in sink.landed_batches()]


def test_leasectl_maintain_keeps_the_batches_a_lease_item_it_cannot_read_still_names(
    moto_endpoint, unique_name, tmp_path
):
    """A lease item that does not read as a lease (a console edit, another tool's write) still names
    its committed batches awaiting the table; `leasectl repair` makes it a lease again at its own
    checkpoint, past them. Until then nothing tells its receipts from orphans: maintain must not remove
    them, or the repaired lease's batches are lost."""
    store = dynamodb_store(moto_endpoint, unique_name)
    uri = f"delta:{tmp_path / 'orders'}"
    sink = DeltaSink(uri, unique_name)
    token, receipt = staged(sink, 1, 3, "round-1")
    store.create_lease_if_not_exists(Lease(LEASE, checkpoint=position(3), committed_batch=committed(sink, None, token)))
    boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1").update_item(
        TableName=unique_name,
        Key={"leaseKey": {"S": LEASE}},
        UpdateExpression="SET checkpoint = :n",
        ExpressionAttributeValues={":n": {"N": "7"}},
    )
    days_ago = time.time() - 4 * 86400  # past the grace
    for path in Path(sink.location).rglob("*"):
        os.utime(path, (days_ago, days_ago))

    result = run_leasectl("--app", unique_name, "maintain", "--output-uri", uri, "--yes", dynamodb=moto_endpoint)

    assert sink.storage.exists(sink.receipt_path(receipt.receipt_id)), result.stdout
    assert all(sink.storage.exists(path) for path in files_of(receipt))
    assert result.returncode == 1 and LEASE in result.stderr and "leasectl repair" in result.stderr


@pytest.mark.parametrize("later_commits", [0, 1], ids=["no-commit-left-in-the-log", "a-later-commit-of-another-lease"])
def test_a_lease_whose_commits_the_log_cleanup_dropped_still_verifies_and_restores_where_it_is(uri, later_commits):
    sink = DeltaSink(uri, APPLICATION)
    two_rounds_into_a_table_keeping_its_log_no_time(sink)
    checkpoint_log(sink)  # the log keeps none of the application's commits
    other = "shardId-000000000002"
    for _ in range(later_commits):
        receipt = sink.stage(batch_of(TRIM_HORIZON, 1, 2, shard=other), rows(1, 2), "other")
        DeltaSink(uri, APPLICATION).publish_round({other: sink.commit_record(None, receipt) or ""}, IDENTITY)

    landed = DeltaSink(uri, APPLICATION).landed_batches()
    leases = [Lease(LEASE, checkpoint=position(6))]
    if later_commits:
        leases.append(Lease(other, checkpoint=position(2)))

    assert audit_landed(leases, landed, {}) == []
    assert {batch.lease_key: batch.end for batch in landed} == {
        LEASE: position(6),
        **({other: position(2)} if later_commits else {}),
    }
