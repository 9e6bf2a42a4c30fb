"""The fault campaign's verdict (bench/chaos/verdict.py) on a table read twice: a record DuckDB reads
another number of times than the table's own library is a violation that names it, and the summary
gives both row counts."""

from __future__ import annotations

from bench.chaos.producer import ProducedRecord
from bench.chaos.verdict import check_records

SHARD = "shardId-000000000000"
PRODUCED = [ProducedRecord(SHARD, str(number), f"record-{number}".encode(), 0.0) for number in (1, 2, 3)]
LANDED = [((record.shard_id, record.sequence_number, 0), record.payload) for record in PRODUCED]


def test_a_table_duckdb_reads_as_its_library_does_is_clean_and_both_counts_are_in_the_summary():
    verdict = check_records(PRODUCED, set(), LANDED, {}, [], analyst=[key for key, _ in LANDED])

    assert verdict.clean, verdict.violations()
    assert "landed 3 rows (DuckDB: 3), duplicated 0, lost 0," in verdict.summary()


def test_a_record_duckdb_reads_twice_or_not_at_all_is_a_violation_naming_it():
    keys = [key for key, _ in LANDED]

    verdict = check_records(PRODUCED, set(), LANDED, {}, [], analyst=[keys[0], keys[0], keys[2]])

    assert not verdict.clean
    assert verdict.read_otherwise == [(keys[0], 1, 2), (keys[1], 1, 0)]
    (line,) = verdict.violations()
    assert line.startswith(
        "2 record(s) DuckDB reads another number of times than the table's library (3 rows against 3)"
    )
    assert f"{SHARD}/1 x1 / DuckDB x2" in line and f"{SHARD}/2 x1 / DuckDB x0" in line


def test_a_parquet_dataset_is_read_once_and_its_summary_names_no_duckdb_count():
    verdict = check_records(PRODUCED, set(), LANDED, {}, [])

    assert verdict.clean and verdict.analyst_rows is None
    assert "landed 3 rows, duplicated 0," in verdict.summary()
