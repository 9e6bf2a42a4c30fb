"""A staged batch's Iceberg data files: the files pyiceberg writes for it, with the table's page row limit
given to Arrow as a page's row limit, and no copy of the batch.

The writer settings. pyiceberg 0.12 hands Arrow the table's `write.parquet.page-row-limit` (20,000 unless
the table says otherwise) as `write_batch_size`: how many values Arrow encodes before it looks at a
page's and the dictionary's size. Arrow starts every column with a dictionary, so at 20,000 values a
step a batch's whole `data` column (16,000 distinct records of 750 B) went into the dictionary before
Arrow found it too large and wrote the column plain; at Arrow's own step of 1,024 it gives up after
about 2 MiB (`write.parquet.dict-size-bytes`). That was a third of the Iceberg sink's CPU per batch
(13.9-14.7 ms of encoding a 12 MiB batch, 9.5-9.7 ms at 1,024). The property is the most rows a data
page holds (Iceberg's Java writer, parquet-java's page row count limit), which Arrow has as
`max_rows_per_page` since 21: this module gives it there, with Arrow's default step, and every other
setting as pyiceberg derives it from the table's properties (codec, level, page size, dictionary size,
row group limit). Nothing is set on the table: a table's properties stay its owner's, and every table
is written this way. The files are otherwise pyiceberg's: the same tasks, names, partition values, Arrow
schema with the table's field ids (`PARQUET:field_id`), and statistics, computed by pyiceberg's own
functions from the file's footer; tests/integration/test_iceberg_staging.py compares them with what
pyiceberg's writer given these settings writes (byte for byte for a batch in one chunk), and reads them
back with pyiceberg and DuckDB. A table whose files are not Parquet (`write.format.default`) is written
by pyiceberg itself.

The tasks. pyiceberg's `_dataframe_to_data_files` splits a table by partition before it writes: it adds
a column of each partition field's values, groups the rows by them, and for every partition filters the
whole table (a copy of every row it keeps) and combines the result's chunks (another, so that its
threads write from buffers of their own). A batch is one shard's records in arrival order and is almost
always of one day, one partition, so the grouping and the filter gave back the rows as they were: 4-6 ms
of CPU of the 25-30 ms a 12 MiB batch took to stage; and in a slot, whose batches come in a chunk per
GetRecords answer, the batch was still copied into one chunk. When every row of a batch has the same
partition values, the batch is that one partition here, in the chunks it came in (pages may end where a
chunk ends, as in the Parquet sink's files); any other batch is split by pyiceberg's
`_determine_partitions`. Either way the partitions are bin-packed into tasks as pyiceberg does
(`bin_pack_arrow_table`, `WriteTask`, the same task ids), and the files are written one after the other
in the calling thread (a batch is one file unless it spans days or exceeds `write.target-file-size-
bytes`), as the Parquet sink writes its batches, not handed to pyiceberg's thread pool. What the files'
schema, statistics, locations and settings are is worked out once per version of the table's metadata
(`DataFileWriter`), not once per file."""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Iterator
from typing import IO, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    ParquetFormatModel,
    _dataframe_to_data_files,
    _determine_partitions,
    _get_field_from_arrow_table,
    _get_parquet_writer_kwargs,
    _to_requested_schema,
    bin_pack_arrow_table,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.table import DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE, TableProperties, WriteTask
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Properties, Record
from pyiceberg.utils.config import Config
from pyiceberg.utils.properties import property_as_int

_PARQUET = ParquetFormatModel()  # how pyiceberg names a Parquet file and marks its columns' field ids


class DataFileWriter:
    """Writes data files into a table as its metadata `metadata` (one version of it) has the table:
    what the files' schema, statistics, locations and writer settings are is worked out once here for
    every batch staged into that version, where pyiceberg works it out again for every file (about
    1.5 ms of Python a batch, a tenth of writing it). Shared by threads: nothing changes after
    `__init__` but a cache of the batches' own schemas."""

    def __init__(self, metadata: TableMetadata, metadata_location: str | None = None) -> None:
        self.metadata = metadata
        self.metadata_location = metadata_location  # the metadata file `metadata` was read from
        properties = metadata.properties
        file_format = properties.get(TableProperties.WRITE_FILE_FORMAT, TableProperties.WRITE_FILE_FORMAT_DEFAULT)
        self.parquet = FileFormat(file_format) == FileFormat.PARQUET
        table_schema = metadata.schema()
        sanitized_schema = sanitize_column_names(table_schema)
        self.file_schema = sanitized_schema if sanitized_schema != table_schema else table_schema
        self.arrow_schema = table_schema.as_arrow()  # the columns' Arrow types (`with_types`)
        self.statistics_plan = compute_statistics_plan(self.file_schema, properties)
        self.column_ids = parquet_path_to_id_mapping(self.file_schema)
        self.locations = load_location_provider(table_location=metadata.location, table_properties=properties)
        self.options = parquet_writer_options(properties)
        row_group_limit = property_as_int(
            properties, TableProperties.PARQUET_ROW_GROUP_LIMIT, TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT
        )
        target_file_size = property_as_int(
            properties,
            TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
            TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
        )
        assert row_group_limit is not None and target_file_size is not None  # defaults are given
        self.row_group_limit = row_group_limit
        self.target_file_size = target_file_size
        self._task_schemas: dict[tuple[pa.Schema, bool], Schema] = {}

    def write(self, rows: pa.Table, io: FileIO, write_uuid: uuid.UUID) -> list[DataFile]:
        """The data files of `rows` (typed as the table's columns, `with_types`), as
        `_dataframe_to_data_files(metadata, rows, io, write_uuid)` writes them but for the page row
        limit's setting (module doc)."""
        if not self.parquet:
            return list(_dataframe_to_data_files(self.metadata, rows, io, write_uuid=write_uuid))
        return [self.write_file(io, task) for task in self.tasks(rows, write_uuid)]

    def with_types(self, rows: pa.Table) -> pa.Table:
        """`rows` with each column cast to the table's Arrow type for it (`with_types`)."""
        return with_types(rows, self.arrow_schema)

    def tasks(self, rows: pa.Table, write_uuid: uuid.UUID) -> Iterator[WriteTask]:
        """The tasks `_dataframe_to_data_files` makes of `rows`: each partition's rows bin-packed into
        files of about `write.target-file-size-bytes`, numbered from 0 in that order."""
        task_schema = self._task_schema(rows.schema)
        spec = self.metadata.spec()
        partitions: list[tuple[PartitionKey | None, pa.Table]]
        if spec.is_unpartitioned():
            partitions = [(None, rows)]
        elif (partition_key := single_partition_key(self.metadata, rows)) is not None:
            partitions = [(partition_key, rows)]  # in the chunks it came in (module doc)
        else:
            partitions = [
                (partition.partition_key, partition.arrow_table_partition)
                for partition in _determine_partitions(spec=spec, schema=self.metadata.schema(), arrow_table=rows)
            ]
        task_ids = itertools.count(0)
        for key, partition_rows in partitions:
            for batches in bin_pack_arrow_table(partition_rows, self.target_file_size):
                yield WriteTask(
                    write_uuid=write_uuid,
                    task_id=next(task_ids),
                    record_batches=batches,
                    partition_key=key,
                    schema=task_schema,
                )

    def write_file(self, io: FileIO, task: WriteTask) -> DataFile:
        """One task's Parquet file and its DataFile, as pyiceberg's `write_file` writes it, with
        `parquet_writer_options`."""
        downcast_ns_timestamp_to_us = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
        batches = [
            _to_requested_schema(
                requested_schema=self.file_schema,
                file_schema=task.schema,
                batch=batch,
                downcast_ns_timestamp_to_us=downcast_ns_timestamp_to_us,
                include_field_ids=True,
                format_model=_PARQUET,
            )
            for batch in task.record_batches
        ]
        arrow_table = pa.Table.from_batches(batches)
        file_path = self.locations.new_data_location(
            data_file_name=task.generate_data_file_filename(_PARQUET.file_extension()),
            partition_key=task.partition_key,
        )
        output_file = io.new_output(file_path)
        with output_file.create(overwrite=True) as stream:
            writer = pq.ParquetWriter(
                cast(IO[Any], stream), schema=arrow_table.schema, store_decimal_as_integer=True, **self.options
            )
            with writer:
                writer.write(arrow_table, row_group_size=self.row_group_limit)
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=writer.writer.metadata,
            stats_columns=self.statistics_plan,
            parquet_column_mapping=self.column_ids,
        )
        return DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=file_path,
            file_format=FileFormat.PARQUET,
            partition=task.partition_key.partition if task.partition_key else Record(),
            file_size_in_bytes=len(output_file),
            sort_order_id=None,
            spec_id=self.metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )

    def _task_schema(self, arrow_schema: pa.Schema) -> Schema:
        """The batch's schema with the table's field ids, by name (pyiceberg's `pyarrow_to_schema`)."""
        downcast_ns_timestamp_to_us = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
        key = (arrow_schema, downcast_ns_timestamp_to_us)
        schema = self._task_schemas.get(key)
        if schema is None:
            schema = pyarrow_to_schema(
                arrow_schema,
                name_mapping=self.metadata.schema().name_mapping,
                downcast_ns_timestamp_to_us=downcast_ns_timestamp_to_us,
                format_version=self.metadata.format_version,
            )
            self._task_schemas[key] = schema
        return schema


def write_data_files(metadata: TableMetadata, rows: pa.Table, io: FileIO, write_uuid: uuid.UUID) -> list[DataFile]:
    """The data files of `rows` (typed as the table's columns) in the table's current schema and
    partition spec (`DataFileWriter.write`)."""
    return DataFileWriter(metadata).write(rows, io, write_uuid)


def parquet_writer_options(properties: Properties) -> dict[str, Any]:
    """Arrow's writer settings for the table's `properties`: pyiceberg's, but for the page row limit
    (`write.parquet.page-row-limit`), which is the most rows a page holds (`max_rows_per_page`), not the
    number of values Arrow encodes at a time (`write_batch_size`, left at Arrow's default)."""
    options = _get_parquet_writer_kwargs(properties)
    options["max_rows_per_page"] = options.pop("write_batch_size")
    return options


def with_types(rows: pa.Table, wanted: pa.Schema) -> pa.Table:
    """`rows` with each column that `wanted` has cast to its type there (millisecond arrival times to
    Iceberg's microseconds, an int to a long): partition transforms and writers take the table's types."""
    fields = [
        field.with_type(wanted.field(field.name).type) if field.name in wanted.names else field for field in rows.schema
    ]
    target = pa.schema(fields, metadata=rows.schema.metadata)
    return rows if target.equals(rows.schema) else rows.cast(target)


def single_partition_key(metadata: TableMetadata, rows: pa.Table) -> PartitionKey | None:
    """The partition every one of `rows` is in, computed as pyiceberg's `_determine_partitions` does;
    None when the table is not partitioned, when the rows are in more than one partition, or when a
    partition value is NaN (pyiceberg's filter would match none of its rows)."""
    spec = metadata.spec()
    if spec.is_unpartitioned():
        return None
    schema = metadata.schema()
    values = []
    for field in spec.fields:
        column = schema.find_column_name(field.source_id)
        if column is None:
            return None  # pyiceberg's own path says why it cannot write
        transform = field.transform.pyarrow_transform(schema.find_field(field.source_id).field_type)
        partition_values = transform(_get_field_from_arrow_table(rows, column))
        if pc.count_distinct(partition_values, mode="all").as_py() != 1:
            return None
        value = partition_values[0].as_py()
        if isinstance(value, float) and math.isnan(value):
            return None
        values.append(PartitionFieldValue(field=field, value=value))
    return PartitionKey(field_values=values, partition_spec=spec, schema=schema)
