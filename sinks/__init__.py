"""Where a consume job's batches land: the sink its output URI names (`registry`), behind one protocol
(`batch_sink`). The sinks need no Spark: the consume job's slots and driver, `leasectl` and the
Airflow operators use them alike.

- A local path, an absolute file:///path or s3://bucket[/prefix]: a hive-partitioned Parquet dataset
  (`parquet`).
- delta:PATH or delta:s3://bucket/prefix: a Delta Lake table through delta-rs (`table/delta`).
- iceberg://CATALOG/NAMESPACE.TABLE: an Apache Iceberg table (`table/iceberg`), its catalog configured
  as pyiceberg's are.

A table format is imported only for a URI of its scheme, so that the Parquet sink never loads
pyiceberg or delta-rs. Both tables commit through one protocol, `table/committer`.
"""

from __future__ import annotations

from collections.abc import Mapping

import boto3

from lease_core.config.settings import ConsumerConfig
from sinks.batch_sink import BatchSink, StreamIncarnations
from sinks.dead_lettering import DeadLetteringSink, dead_letter_uri
from sinks.errors import SinkError
from sinks.registry import SinkOpening, format_of, uri_forms


def check_sink_uri(uri: str) -> str:
    """Pure: `uri` without trailing slashes when it has the form of a sink's URI; `SinkError` naming the
    forms otherwise. Whether the storage is there and writable is `BatchSink.check_writable`'s question."""
    uri = uri.rstrip("/")
    declared = format_of(uri)
    try:
        declared.check_uri(uri)
    except SinkError as error:
        if declared.name != "parquet":
            raise
        raise SinkError(uri, f"is not {uri_forms()}") from error
    return uri


def sink_configuration(uri: str) -> dict[str, str]:
    """What a sink needs to be opened elsewhere, resolved here: an Iceberg catalog's properties from
    pyiceberg's configuration of this machine (`.pyiceberg.yaml`, `PYICEBERG_CATALOG__*`), so that
    executors on other machines open the same catalog (they travel in the job's tasks, like its
    settings); nothing for the other formats."""
    return format_of(uri).configuration(uri)


def open_sink(
    uri: str,
    *,
    config: ConsumerConfig,
    session: boto3.Session | None = None,
    configuration: Mapping[str, str] | None = None,
    streams: StreamIncarnations | None = None,
) -> BatchSink:
    """The sink `uri` names (`sinks.registry`). Its storage's endpoint and region come from `config`
    (`aws_endpoint_url_s3`, `aws_region`), its credentials from `session` (an Airflow connection's),
    else boto3's default chain; `configuration` is `sink_configuration`'s, resolved where the job
    started (None: this machine's own); `streams` the round's streams as they are now, for a table
    sink to tell a re-created stream from the one it replaced."""
    return format_of(uri).open(uri, SinkOpening(config, session, configuration, streams))


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
    lands, apart from the live output and from every other window's (each format's own naming)."""
    return format_of(uri).backfill_uri(uri, window)
