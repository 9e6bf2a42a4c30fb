"""Benchmark: a round's Iceberg commit at 1,000 leases: its time, the commits per round, and how the
table's metadata grows round after round.

Method. pyiceberg's SQL catalog on a SQLite file and a local warehouse (this machine's disk). Each
round, every one of --leases leases stages one batch of --rows records with the sink, as a slot does
(data file, manifest, receipt), and commits it on its lease record; then the driver's
`publish_round` makes them visible. Timed: the publication alone (it reads every receipt and
manifest, checks the application's position map, writes the new one and makes one fast append).
Baseline, measured in the same run on a second table: a bare pyiceberg fast append of the same
number of data files, already in memory, with no check and no position map: the least a round's
commit can cost. The ratio publication / bare append is the exactly-once bookkeeping's price.
Per round it prints the commit seconds (ours, the baseline, the ratio), the commits the round made
(the goal: one), and the table's metadata: the current metadata file, the summary's `kinesis.ranges`,
the position map, and everything under metadata/ (manifests, lists, receipts, maps). A round that
lands nothing new makes no commit: publishing the same records again is measured too.

Run: .venv/bin/python bench/iceberg_commits.py [--leases 1000] [--rounds 5] [--rows 10]
(about 3 minutes on 2 cores with the defaults; bounded by staging 1,000 batches a round in one process).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import pyarrow as pa  # noqa: E402
from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402
from pyiceberg.io.pyarrow import _dataframe_to_data_files  # noqa: E402

from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber  # noqa: E402
from sinks.batch_sink import BatchRange, RoundIdentity  # noqa: E402
from sinks.record_columns import RECORD_SCHEMA  # noqa: E402
from sinks.table.committer import SUMMARY_POSITIONS, SUMMARY_RANGES  # noqa: E402
from sinks.table.iceberg import IcebergSink, as_table_types  # noqa: E402

APPLICATION = "bench-commits"
STREAM = "bench-commits"
ARRIVAL = datetime(2026, 11, 26, 12, tzinfo=UTC)


@dataclass(frozen=True)
class RoundFigures:
    number: int
    publish_seconds: float
    bare_append_seconds: float
    commits: int
    metadata_file_bytes: int
    ranges_bytes: int
    positions_bytes: int
    metadata_folder_bytes: int
    metadata_folder_files: int


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10, help="records per lease per round")
    return parser.parse_args(argv)


def batch_rows(first: int, count: int) -> pa.Table:
    return pa.table(
        {
            "sequence_number": [str(n) for n in range(first, first + count)],
            "sub_sequence_number": [0] * count,
            "partition_key": [f"key-{n}" for n in range(first, first + count)],
            "approximate_arrival_timestamp": [ARRIVAL + timedelta(milliseconds=n) for n in range(count)],
            "data": [b"x" * 200] * count,
            "explicit_hash_key": [None] * count,
        },
        schema=RECORD_SCHEMA,
    )


def stage_round(sink: IcebergSink, records: dict[str, str | None], ends: dict[str, int], rows: int) -> None:
    """Every lease stages and commits one batch of `rows` records, as its slot would."""
    for lease_key in records:
        start = ends[lease_key]
        batch = BatchRange(
            lease_key,
            STREAM,
            lease_key,
            TRIM_HORIZON if start == 0 else ExtendedSequenceNumber(str(start)),
            ExtendedSequenceNumber(str(start + 1)),
            ExtendedSequenceNumber(str(start + rows)),
        )
        staged = sink.stage(batch, batch_rows(start + 1, rows), "bench-attempt")
        records[lease_key] = sink.commit_record(records[lease_key], staged)
        ends[lease_key] = start + rows


def bare_append(catalog: SqlCatalog, identifier: str, files: int, rows: int) -> float:
    """The baseline: one fast append of `files` data files already written, no check, no position map."""
    table = catalog.load_table(identifier)
    rows_table = as_table_types(batch_rows(1, rows), table.schema())
    data_files = [
        data_file
        for _ in range(files)
        for data_file in _dataframe_to_data_files(table.metadata, rows_table, table.io, write_uuid=uuid.uuid4())
    ]
    started = time.perf_counter()
    with table.transaction() as transaction:
        with transaction.update_snapshot().fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
    return time.perf_counter() - started


def folder_figures(location: str) -> tuple[int, int, int]:
    """The current metadata file's bytes, and all of metadata/'s bytes and files."""
    metadata = Path(location.removeprefix("file://")) / "metadata"
    files = [path for path in metadata.rglob("*") if path.is_file()]
    current = max((path for path in files if path.name.endswith(".metadata.json")), key=lambda p: p.stat().st_mtime)
    return current.stat().st_size, sum(path.stat().st_size for path in files), len(files)


def run(arguments: argparse.Namespace) -> list[RoundFigures]:
    folder = Path(tempfile.mkdtemp(prefix="bench-iceberg-commits-"))
    catalog = SqlCatalog("bench", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}/warehouse")
    catalog.create_namespace("bench")
    sink = IcebergSink("iceberg://bench/bench.landed", APPLICATION, catalog=catalog)
    baseline = IcebergSink("iceberg://bench/bench.baseline", APPLICATION, catalog=catalog)
    baseline.reports_root()  # creates the baseline table with the same schema and partitioning
    keys = [f"shardId-{index:012d}" for index in range(arguments.leases)]
    records: dict[str, str | None] = dict.fromkeys(keys)
    ends = dict.fromkeys(keys, 0)
    figures = []
    for number in range(1, arguments.rounds + 1):
        stage_round(sink, records, ends, arguments.rows)
        pending = {key: record for key, record in records.items() if record}
        identity = RoundIdentity(APPLICATION, number, {STREAM: (f"arn:aws:kinesis:::stream/{STREAM}", 0)})
        started = time.perf_counter()
        publication = sink.publish_round(pending, identity)
        publish_seconds = time.perf_counter() - started
        bare_seconds = bare_append(catalog, "bench.baseline", arguments.leases, arguments.rows)
        table = sink.table(refresh=True)
        snapshot = None if table is None else table.current_snapshot()
        assert table is not None and snapshot is not None and snapshot.summary is not None
        summary = snapshot.summary
        positions = Path(str(summary[SUMMARY_POSITIONS]).removeprefix("file://")).stat().st_size
        current, folder_bytes, folder_files = folder_figures(table.metadata.location)
        figures.append(
            RoundFigures(
                number,
                publish_seconds,
                bare_seconds,
                publication.commits,
                current,
                len(str(summary[SUMMARY_RANGES]).encode()),
                positions,
                folder_bytes,
                folder_files,
            )
        )
    again = sink.publish_round({key: record for key, record in records.items() if record}, identity)
    visible = again.batches_already_visible
    print(f"publishing the last round's records again: {again.commits} commit(s), {visible} batch(es) already visible")
    return figures


def print_figures(arguments: argparse.Namespace, figures: list[RoundFigures]) -> None:
    print(f"{arguments.leases} leases x {arguments.rows} records per round; SQLite SQL catalog, local warehouse")
    print(
        f"\n{'round':<7}{'publish s':>10}{'bare append s':>15}{'ratio':>7}{'commits':>9}{'metadata.json KiB':>19}"
        f"{'ranges KiB':>12}{'positions KiB':>15}{'metadata/ MiB':>15}{'files':>7}"
    )
    for row in figures:
        print(
            f"{row.number:<7}{row.publish_seconds:>10.2f}{row.bare_append_seconds:>15.2f}"
            f"{row.publish_seconds / row.bare_append_seconds:>7.2f}{row.commits:>9}"
            f"{row.metadata_file_bytes / 1024:>19.1f}{row.ranges_bytes / 1024:>12.1f}"
            f"{row.positions_bytes / 1024:>15.1f}"
            f"{row.metadata_folder_bytes / 2**20:>15.2f}{row.metadata_folder_files:>7}"
        )


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    print_figures(arguments, run(arguments))


if __name__ == "__main__":
    main()
