"""Which sink an output URI names: one entry per URI scheme, each a module that declares its
`SINK_FORMAT` (`SinkFormat`), imported only when a URI of its scheme is used (pyiceberg and delta-rs
are heavy to load). A URI without a registered scheme is a Parquet dataset (a local path, file://,
s3://). A new format is one module with its `SINK_FORMAT` and one line in `SCHEMES`."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

import boto3

from lease_core.config.settings import ConsumerConfig
from lease_core.model.lease import Lease
from sinks.batch_sink import BatchSink, StreamIncarnations

# scheme -> the module declaring its SINK_FORMAT
SCHEMES: Mapping[str, str] = {
    "iceberg": "sinks.table.iceberg",
    "delta": "sinks.table.delta",
}
DATASET_MODULE = "sinks.parquet"


@dataclass(frozen=True)
class SinkOpening:
    """What opening a sink takes besides its URI: the settings (application, S3 endpoint and region),
    the credentials' session (an Airflow connection's; None: boto3's default chain), the sink's
    configuration resolved where the job started (None: this machine's), and the round's streams as
    they are now (a table sink tells a re-created stream from the one it replaced)."""

    config: ConsumerConfig
    session: boto3.Session | None = None
    configuration: Mapping[str, str] | None = None
    streams: StreamIncarnations | None = None


# What a format's upkeep does (`leasectl maintain`): given the open sink, the lease table's leases, the
# age past which an unreferenced file is an orphan and the target file size; a line per thing done.
Upkeep = Callable[[object, Sequence[Lease], timedelta, int], list[str]]


@dataclass(frozen=True)
class SinkFormat:
    """One kind of sink, as the registry knows it."""

    name: str
    uri_forms: str  # how its URIs look, for errors
    check_uri: Callable[[str], object]  # raises `SinkError` naming what is wrong with a URI of this form
    open: Callable[[str, SinkOpening], BatchSink]
    backfill_uri: Callable[[str, str], str]  # (live URI, window) -> where that window's backfill lands
    configuration: Callable[[str], dict[str, str]] = field(default=lambda uri: {})
    upkeep: Upkeep | None = None  # None: nothing to keep up (and no record of what landed)


def format_of(uri: str) -> SinkFormat:
    """The format `uri`'s scheme names (a Parquet dataset when no registered scheme)."""
    module = SCHEMES.get(urlsplit(uri).scheme, DATASET_MODULE)
    declared: SinkFormat = importlib.import_module(module).SINK_FORMAT
    return declared


def uri_forms() -> str:
    """Every registered form of URI, for an error naming what is accepted."""
    forms = [format_of("").uri_forms, *(format_of(f"{scheme}:x").uri_forms for scheme in SCHEMES)]
    return f"{', '.join(forms[:-1])}, or {forms[-1]}"
