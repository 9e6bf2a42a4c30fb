"""Where a consume job's batches land: the sink its output URI names, behind one protocol (`batch_sink`).

- A local path, an absolute file:///path or s3://bucket[/prefix]: a hive-partitioned Parquet dataset
  (`parquet`).
- delta:PATH or delta:s3://bucket/prefix: a Delta Lake table through delta-rs (`delta`, imported only
  for such a URI).
- iceberg://CATALOG/NAMESPACE.TABLE: an Apache Iceberg table (`iceberg`, imported only for such a
  URI, so that the Parquet sink never loads pyiceberg), its catalog configured as pyiceberg's are.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

import boto3

from lease_core.config.settings import ConsumerConfig
from sinks.batch_sink import BatchSink, StreamIncarnations
from sinks.dead_lettering import DeadLetteringSink, dead_letter_uri
from sinks.errors import SinkError
from sinks.parquet import URI_FORMS as PARQUET_URI_FORMS
from sinks.parquet import ParquetSink, sink_root

ICEBERG_SCHEME = "iceberg"
DELTA_SCHEME = "delta"
SINK_URI_FORMS = (
    f"{PARQUET_URI_FORMS} (a Parquet dataset), iceberg://CATALOG/NAMESPACE.TABLE (an Iceberg table), or "
    "delta:PATH or delta:s3://bucket/prefix (a Delta table)"
)


def check_sink_uri(uri: str) -> str:
    """Pure: `uri` without trailing slashes when it has the form of a sink's URI; `SinkError` naming the
    forms otherwise. Whether the storage is there and writable is `BatchSink.check_writable`'s question."""
    uri = uri.rstrip("/")
    if urlsplit(uri).scheme == ICEBERG_SCHEME:
        from sinks.table.iceberg import parse_table_uri

        parse_table_uri(uri)
        return uri
    if urlsplit(uri).scheme == DELTA_SCHEME:
        from sinks.table.delta import parse_delta_uri

        parse_delta_uri(uri)
        return uri
    try:
        sink_root(uri)
    except SinkError:
        raise SinkError(uri, f"is not {SINK_URI_FORMS}") from None
    return uri


def sink_configuration(uri: str) -> dict[str, str]:
    """What a sink needs to be opened elsewhere, resolved here: an Iceberg catalog's properties from
    pyiceberg's configuration of this machine (`.pyiceberg.yaml`, `PYICEBERG_CATALOG__*`), so that
    executors on other machines open the same catalog (they travel in the job's tasks, like its
    settings); nothing for a Parquet dataset."""
    if urlsplit(uri).scheme == ICEBERG_SCHEME:
        from sinks.table.iceberg import catalog_properties, parse_table_uri

        return catalog_properties(uri, parse_table_uri(uri).catalog)
    return {}


def open_sink(
    uri: str,
    *,
    config: ConsumerConfig,
    session: boto3.Session | None = None,
    configuration: Mapping[str, str] | None = None,
    streams: StreamIncarnations | None = None,
) -> BatchSink:
    """The sink `uri` names. Its storage's endpoint and region come from `config`
    (`aws_endpoint_url_s3`, `aws_region`), its credentials from `session` (an Airflow connection's),
    else boto3's default chain; `configuration` is `sink_configuration`'s, resolved where the job
    started (None: this machine's own); `streams` the round's streams as they are now, for a table
    sink to tell a re-created stream from the one it replaced."""
    if urlsplit(uri).scheme == ICEBERG_SCHEME:
        from sinks.table.iceberg import IcebergSink

        return IcebergSink(uri, config.require_application_name(), catalog_configuration=configuration, streams=streams)
    if urlsplit(uri).scheme == DELTA_SCHEME:
        from sinks.table.delta import DeltaSink

        return DeltaSink(
            uri,
            config.require_application_name(),
            streams=streams,
            s3_endpoint_url=config.aws_endpoint_url_s3,
            region=config.aws_region,
            session=session,
        )
    return ParquetSink.from_uri(
        uri, s3_endpoint_url=config.aws_endpoint_url_s3, region=config.aws_region, session=session
    )


def open_round_sink(
    uri: str,
    *,
    config: ConsumerConfig,
    dead_letters: bool,
    session: boto3.Session | None = None,
    configuration: Mapping[str, str] | None = None,
    streams: StreamIncarnations | None = None,
) -> DeadLetteringSink:
    """The sink a round drives (`open_sink`'s, with its dead-letter destination beside it, opened only
    when needed); `dead_letters`: whether the round sets bad records aside. A pipeline that does not
    still finishes, through it, the dead letters an earlier round left to make visible."""
    output = open_sink(uri, config=config, session=session, configuration=configuration, streams=streams)
    dead_uri = dead_letter_uri(uri) if dead_letters else _dead_letter_uri_or_none(uri)

    def open_dead_letters() -> BatchSink:
        if dead_uri is None:
            raise SinkError(uri, "a lease record names dead letters, but none can go beside this output")
        # An Iceberg table's catalog is the output's: the same configuration opens it.
        return open_sink(dead_uri, config=config, session=session, configuration=configuration, streams=streams)

    return DeadLetteringSink(output, dead_uri or "", open_dead_letters, enabled=dead_letters)


def _dead_letter_uri_or_none(uri: str) -> str | None:
    try:
        return dead_letter_uri(uri)
    except SinkError:
        return None


def backfill_uri(uri: str, window: str) -> str:
    """Pure: where a backfill of `window` (`<start>-<end>`, ISO 8601 basic format) of the sink at `uri`
    lands, apart from the live output and from every other window's: `<uri>-backfill/<window>` for a
    Parquet dataset, a table `<table>_backfill_<window>` beside an Iceberg table (lower case, `.` as
    `p` and `-` as `_`: the names Glue keeps, and still one per window). `SinkError` for a dataset at
    a bucket's root, whose backfill prefix would be another bucket."""
    if urlsplit(uri).scheme == ICEBERG_SCHEME:
        from sinks.table.iceberg import parse_table_uri

        address = parse_table_uri(uri)
        suffix = window.lower().replace(".", "p").replace("-", "_")
        return f"iceberg://{address.catalog}/{'.'.join(address.namespace)}.{address.table}_backfill_{suffix}"
    if urlsplit(uri).scheme == DELTA_SCHEME:
        return f"{uri}-backfill/{window}"
    parts = urlsplit(uri)
    if parts.scheme == "s3" and not parts.path.strip("/"):
        raise SinkError(uri, "a backfill needs a prefix in the bucket (s3://bucket/prefix)")
    return f"{uri}-backfill/{window}"
