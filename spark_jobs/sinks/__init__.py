"""Where a consume job's batches land: the sink its output URI names, behind one protocol (`batch_sink`).

- A local path, an absolute file:///path or s3://bucket[/prefix]: a hive-partitioned Parquet dataset
  (`parquet`).
- iceberg://CATALOG/NAMESPACE.TABLE: an Apache Iceberg table (`iceberg`, imported only for such a
  URI, so that the Parquet sink never loads pyiceberg). Not available yet.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import boto3

from lease_core.config.settings import ConsumerConfig
from spark_jobs.errors import SinkError
from spark_jobs.sinks.batch_sink import BatchSink
from spark_jobs.sinks.parquet import ParquetSink, sink_root

ICEBERG_SCHEME = "iceberg"


def check_sink_uri(uri: str) -> str:
    """Pure: `uri` without trailing slashes when it has the form of a sink's URI; `SinkError` naming the
    forms otherwise. Whether the storage is there and writable is `BatchSink.check_writable`'s question."""
    uri = uri.rstrip("/")
    if urlsplit(uri).scheme == ICEBERG_SCHEME:
        raise _iceberg_unavailable(uri)
    sink_root(uri)
    return uri


def open_sink(uri: str, *, config: ConsumerConfig, session: boto3.Session | None = None) -> BatchSink:
    """The sink `uri` names. Its storage's endpoint and region come from `config`
    (`aws_endpoint_url_s3`, `aws_region`), its credentials from `session` (an Airflow connection's),
    else boto3's default chain."""
    if urlsplit(uri).scheme == ICEBERG_SCHEME:
        raise _iceberg_unavailable(uri)
    return ParquetSink.from_uri(
        uri, s3_endpoint_url=config.aws_endpoint_url_s3, region=config.aws_region, session=session
    )


def _iceberg_unavailable(uri: str) -> SinkError:
    return SinkError(uri, "iceberg sinks are not available yet")
