"""Records by their identity, to check what landed in a sink (a Parquet dataset, an Iceberg or a Delta
table) against what a producer wrote: as the sink's own library reads it (`landed_records`), and a
table as an analyst reads it, with DuckDB (`analyst_table`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devtools.analyst_reads import AnalystTable
from sinks.parquet import ParquetSink
from sinks.table.delta import DeltaSink
from sinks.table.iceberg import IcebergSink


@dataclass(frozen=True)
class StreamRecord:
    """A record as the producer put it and as the sink must hold it: its identity is all four fields."""

    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    data: bytes

    @classmethod
    def acknowledged(cls, entry: dict[str, Any], result: dict[str, Any]) -> StreamRecord:
        """A PutRecords entry with the result Kinesis gave it; a plain put record has sub-sequence number 0."""
        return cls(result["ShardId"], result["SequenceNumber"], 0, entry["Data"])


IDENTITY_COLUMNS = ("shard_id", "sequence_number", "sub_sequence_number", "data")


def landed_records(output_uri: str, s3_endpoint_url: str | None = None) -> list[StreamRecord]:
    """Every record the sink at `output_uri` shows its readers, duplicates included: the Parquet
    dataset's files, the Iceberg table's current snapshot as pyiceberg reads it (its catalog
    configured as pyiceberg's are), or the Delta table's current version's files."""
    if output_uri.startswith("iceberg://"):
        table = IcebergSink(output_uri, "landed-records").table(refresh=True)
        if table is None:
            return []
        landed = table.scan(selected_fields=IDENTITY_COLUMNS).to_arrow()
    elif output_uri.startswith("delta:"):
        delta_rows = DeltaSink(output_uri, "landed-records", s3_endpoint_url=s3_endpoint_url).visible_rows(
            IDENTITY_COLUMNS
        )
        if delta_rows is None:
            return []
        landed = delta_rows
    else:
        landed = ParquetSink.from_uri(output_uri, s3_endpoint_url=s3_endpoint_url).read_dataset()
    columns = landed.select(list(IDENTITY_COLUMNS)).to_pydict()
    return [
        StreamRecord(*row)
        for row in zip(columns["shard_id"], columns["sequence_number"], columns["sub_sequence_number"], columns["data"])
    ]


def analyst_table(output_uri: str, s3_endpoint_url: str | None = None) -> AnalystTable | None:
    """The Iceberg or Delta table at `output_uri` as DuckDB scans it: the Iceberg table's current
    metadata file (found through its catalog, configured as pyiceberg's are), the Delta table's folder
    or S3 prefix. None: a Parquet dataset, or no table yet."""
    if output_uri.startswith("iceberg://"):
        table = IcebergSink(output_uri, "landed-records").table(refresh=True)
        return None if table is None else AnalystTable.iceberg(table.metadata_location)
    if output_uri.startswith("delta:"):
        sink = DeltaSink(output_uri, "landed-records", s3_endpoint_url=s3_endpoint_url)
        return None if sink.table() is None else AnalystTable.delta(sink.location, s3_endpoint_url)
    return None
