"""Upkeep of the Iceberg sink's table on a real SQL catalog: orphan files go, and nothing a lease, a
commit in flight or a snapshot still names is ever removed; old snapshots expire, the application's
newest one stays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from lease_core.model.sequence import TRIM_HORIZON
from sinks.table.iceberg import LeaseRecord
from sinks.table.iceberg_maintenance import (
    compact_small_files,
    expire_snapshots,
    remove_orphan_files,
)
from sinks.table.lease_records import live_receipts
from tests.support.iceberg_tables import (
    APPLICATION,
    IDENTITY,
    FaultyCatalog,
    batch_of,
    land,
    position,
    rows,
    sink_on,
    table_sequence_numbers,
    users_rows,
)

LEASE = "shardId-000000000001"
LATER = datetime.now(UTC) + timedelta(days=4)  # every file written by the test is past the 3-day grace


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*") if path.is_file()}


def test_only_what_nothing_names_is_removed(iceberg_catalog: FaultyCatalog, tmp_path: Path):
    sink = sink_on(iceberg_catalog)
    published = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({LEASE: published}, IDENTITY)
    awaiting = land(sink, published, position(10), 11, 5)  # committed on the lease, not yet in the table
    in_flight = sink.stage(batch_of(position(15), 16, 5), rows(16, 5), "slot-1/attempt-0")  # prepared, not committed
    warehouse = tmp_path / "warehouse"
    before_zombie = files_under(warehouse)
    sink.stage(batch_of(position(15), 16, 5), rows(16, 5), "zombie")  # fenced: nobody will commit it
    zombie_files = files_under(warehouse) - before_zombie
    assert {path.suffix for path in zombie_files} == {".parquet", ".avro", ".json"}

    removal = remove_orphan_files(sink, live_receipts(LeaseRecord, [awaiting], [in_flight.token]), now=LATER)

    # And the published batch's receipt and manifest: the table holds its data files, no lease names it.
    (published_receipt,) = LeaseRecord.decode(published).entries
    staging = warehouse / "kinesis" / "orders" / "metadata" / "kinesis-staged" / APPLICATION
    done_with = {staging / f"{published_receipt.receipt}.json", staging / f"{published_receipt.receipt}-m0.avro"}
    assert {Path(path) for path in removal.removed} == zombie_files | done_with
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 11)]
    result = sink.publish_round({LEASE: awaiting}, IDENTITY)
    assert result.batches_published == 1 and not result.missing_batches
    record = sink.commit_record(awaiting, in_flight)
    assert sink.publish_round({LEASE: record}, IDENTITY).batches_published == 1
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 21)]


def test_unreferenced_files_younger_than_the_grace_period_stay(iceberg_catalog: FaultyCatalog, tmp_path: Path):
    sink = sink_on(iceberg_catalog)
    land(sink, None, TRIM_HORIZON, 1, 10, attempt="zombie")

    removal = remove_orphan_files(sink, live=set())

    assert removal.removed == ()
    assert removal.kept_too_young == 2  # its manifest and receipt (its data files would go with its receipt)


def test_the_metadata_of_a_commit_that_lost_a_race_is_removed(iceberg_catalog: FaultyCatalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    other = sink_on(iceberg_catalog)
    iceberg_catalog.before_commit = lambda: other.publish_round({LEASE: record}, IDENTITY)
    sink.publish_round({LEASE: record}, IDENTITY)  # its own commit failed: its manifest and list are orphans

    removal = remove_orphan_files(sink, live_receipts(LeaseRecord, [record], []), now=LATER)

    assert sorted(Path(path).suffix for path in removal.removed) == [".avro", ".avro", ".json"]  # + position map
    assert len(table_sequence_numbers(sink)) == 10


def test_old_snapshots_expire_and_the_applications_newest_stays(iceberg_catalog: FaultyCatalog):
    sink = sink_on(iceberg_catalog)
    record = None
    start = TRIM_HORIZON
    for round_number in range(3):
        first = 10 * round_number + 1
        record = land(sink, record, start, first, 10)
        sink.publish_round({LEASE: record}, IDENTITY)
        start = position(first + 9)
    table = sink.table(refresh=True)
    table.append(users_rows(table, 500, 2))  # another writer's snapshot on top
    ours = sink.table(refresh=True).current_snapshot().parent_snapshot_id

    expired = expire_snapshots(sink, now=datetime.now(UTC) + timedelta(days=6)).snapshot_ids

    table = sink.table(refresh=True)
    assert len(expired) == 2
    assert {snapshot.snapshot_id for snapshot in table.snapshots()} == {ours, table.current_snapshot().snapshot_id}
    assert sink_on(iceberg_catalog).awaiting_visibility(record) == ()
    assert len(table_sequence_numbers(sink)) == 32


def test_expiry_keeps_main_whole_down_to_an_idle_applications_newest_snapshot(iceberg_catalog: FaultyCatalog):
    """Expiring the old snapshots between an idle application's snapshot and `main`'s head would cut
    `main`'s history above it: the application would find no position map and publish again."""
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({LEASE: record}, IDENTITY)
    for first in (500, 600):
        table = sink.table(refresh=True)
        table.append(users_rows(table, first, 2))

    assert expire_snapshots(sink, now=datetime.now(UTC) + timedelta(days=6)).snapshot_ids == ()

    assert sink_on(iceberg_catalog).publish_round({LEASE: record}, IDENTITY).batches_published == 0
    assert len(table_sequence_numbers(sink)) == 14


def test_expiry_keeps_tagged_snapshots_and_does_not_fail_on_them(iceberg_catalog: FaultyCatalog):
    sink = sink_on(iceberg_catalog)
    record = None
    start = TRIM_HORIZON
    for first in (1, 11, 21):
        record = land(sink, record, start, first, 10)
        sink.publish_round({LEASE: record}, IDENTITY)
        start = position(first + 9)
    table = sink.table(refresh=True)
    oldest = min(table.snapshots(), key=lambda snapshot: snapshot.timestamp_ms).snapshot_id
    table.manage_snapshots().create_tag(oldest, "audited").commit()

    expired = expire_snapshots(sink, now=datetime.now(UTC) + timedelta(days=6)).snapshot_ids

    assert len(expired) == 1 and oldest not in expired
    assert oldest in {snapshot.snapshot_id for snapshot in sink.table(refresh=True).snapshots()}


def rounds_of_small_files(sink, rounds: int) -> str:
    """`rounds` rounds of one 10-record batch each: a small data file per round. The lease's record."""
    record, start = None, TRIM_HORIZON
    for round_number in range(rounds):
        first = 10 * round_number + 1
        record = land(sink, record, start, first, 10)
        sink.publish_round({LEASE: record}, IDENTITY)
        start = position(first + 9)
    assert record is not None
    return record


def data_files(sink) -> list[str]:
    return [task.file.file_path for task in sink.table(refresh=True).scan().plan_files()]


def partitions(sink) -> set[str]:
    return {repr(task.file.partition) for task in sink.table(refresh=True).scan().plan_files()}


def test_small_files_are_rewritten_into_one_per_partition_and_the_rows_and_positions_stay(
    iceberg_catalog: FaultyCatalog,
):
    sink = sink_on(iceberg_catalog)
    record = rounds_of_small_files(sink, 5)
    before = sorted(sink.table(refresh=True).scan().to_arrow().to_pylist(), key=lambda row: int(row["sequence_number"]))
    # Each batch's records arrive either side of midnight: a file in each of two days' partitions.
    assert (len(data_files(sink)), len(partitions(sink))) == (10, 2)

    compaction = compact_small_files(sink)

    assert (compaction.files_rewritten, compaction.files_written, compaction.partitions) == (10, 2, 2)
    table = sink.table(refresh=True)
    assert table.current_snapshot().snapshot_id == compaction.snapshot_id
    assert len(data_files(sink)) == 2
    after = sorted(table.scan().to_arrow().to_pylist(), key=lambda row: int(row["sequence_number"]))
    assert after == before, "readers see the same rows"
    again = sink_on(iceberg_catalog)
    assert again.awaiting_visibility(record) == (), "the application still finds what the table holds"
    assert again.publish_round({LEASE: record}, IDENTITY).batches_published == 0
    assert compact_small_files(sink).snapshot_id is None, "one file per partition: nothing to do"


def test_a_round_committing_during_a_compaction_keeps_its_rows_and_the_compaction_is_planned_again(
    iceberg_catalog: FaultyCatalog,
):
    """The compaction's overwrite is never rebased past the round's append (that could drop its files)."""
    sink = sink_on(iceberg_catalog)
    record = rounds_of_small_files(sink, 3)
    publisher = sink_on(iceberg_catalog)
    later = land(publisher, record, position(30), 31, 10)
    iceberg_catalog.before_commit = lambda: publisher.publish_round({LEASE: later}, IDENTITY)

    compaction = compact_small_files(sink)

    assert compaction.files_rewritten == 8, "planned again on the new head, with the round's two files"
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 41)]


def test_rows_a_user_deleted_before_a_compaction_stay_deleted(iceberg_catalog: FaultyCatalog):
    sink = sink_on(iceberg_catalog)
    rounds_of_small_files(sink, 3)
    sink.table(refresh=True).delete("sequence_number = '5'")  # a user's delete (copy-on-write in pyiceberg)

    compaction = compact_small_files(sink)

    assert compaction.files_written == len(partitions(sink))
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 31) if n != 5]


def test_files_only_expired_snapshots_referenced_are_removed_with_them(iceberg_catalog: FaultyCatalog):
    """A compaction's replaced files go once the snapshots that still read them expire."""
    sink = sink_on(iceberg_catalog)
    record = rounds_of_small_files(sink, 3)
    replaced = set(data_files(sink))
    compact_small_files(sink)
    compacted = set(data_files(sink))
    # The application's newest snapshot is kept (its position map); a next round's makes the one
    # below the compaction, which still reads the replaced files, expirable.
    sink.publish_round({LEASE: land(sink, record, position(30), 31, 10)}, IDENTITY)

    expiry = expire_snapshots(sink, now=datetime.now(UTC) + timedelta(days=6))

    removed = set(expiry.files_removed)
    assert {path.removeprefix("file://") for path in replaced} <= removed
    assert not any(Path(path.removeprefix("file://")).exists() for path in replaced)
    assert all(Path(path.removeprefix("file://")).exists() for path in compacted)
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 41)]


def test_a_compaction_that_loses_the_race_leaves_none_of_its_files_behind(iceberg_catalog: FaultyCatalog, tmp_path):
    sink = sink_on(iceberg_catalog)
    record = rounds_of_small_files(sink, 3)
    publisher = sink_on(iceberg_catalog)
    iceberg_catalog.before_commit = lambda: publisher.publish_round(
        {LEASE: land(publisher, record, position(30), 31, 10)}, IDENTITY
    )

    compact_small_files(sink)

    table = sink.table(refresh=True)
    referenced = {
        entry.data_file.file_path.removeprefix("file://")
        for snapshot in table.snapshots()
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
    }
    on_disk = {str(path) for path in (tmp_path / "warehouse").rglob("data/**/*.parquet")}
    assert on_disk == referenced, f"files no snapshot references: {sorted(on_disk - referenced)}"


def test_upkeep_runs_again_after_expiry_removed_the_data_files_of_a_receipt_still_on_disk(
    iceberg_catalog: FaultyCatalog,
):
    """Expiry deleted a compacted batch's data files while its receipt stays (named by a lease for
    longer than the snapshots lived): the orphan removal that meets them gone goes on."""
    sink = sink_on(iceberg_catalog)
    record = rounds_of_small_files(sink, 3)
    compact_small_files(sink)
    sink.publish_round({LEASE: land(sink, record, position(30), 31, 10)}, IDENTITY)
    expire_snapshots(sink, now=datetime.now(UTC) + timedelta(days=6))

    for _ in range(2):
        removal = remove_orphan_files(sink, live=set(), now=LATER)
        assert removal.kept_too_young == 0
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 41)]
