"""An Iceberg or Delta table read as an analyst reads it: with DuckDB and its iceberg and delta
extensions, not with the library that wrote it (pyiceberg, delta-rs), so that a duplicate or a loss
cannot hide behind a fault the writer and its own reader share.

DuckDB 1.4.4's extensions come from the `duckdb-ext-*` wheels of the dev dependencies (pyproject.toml):
they are loaded from the folder those wheels install, and DuckDB is told never to install or autoload
an extension, so nothing is downloaded at run time. An Iceberg table is scanned from its current
metadata file (a SQL catalog on SQLite is not one DuckDB can ask), a Delta table from its folder or
its S3 prefix, on an S3-compatible endpoint (moto) through a DuckDB S3 secret."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import boto3
import duckdb
import pyarrow as pa

# What tells one landed record from another, as the exactly-once checks compare them.
IDENTITY_COLUMNS = ("stream_name", "shard_id", "sequence_number", "sub_sequence_number")
Identity = tuple[str, str, str, int]

# The extensions the scans need, by the wheel that carries each: iceberg reads its manifests with avro,
# httpfs reads S3.
EXTENSION_PACKAGES = {
    "avro": "duckdb-ext-avro",
    "iceberg": "duckdb-ext-iceberg",
    "delta": "duckdb-ext-delta",
    "httpfs": "duckdb-ext-httpfs",
}


class AnalystReadError(RuntimeError):
    """DuckDB could not read the table, or cannot be set up to: the message says which and why."""


@dataclass(frozen=True)
class S3Endpoint:
    """An S3-compatible endpoint other than AWS's (moto), as a DuckDB S3 secret names it, with boto3's
    default credentials and region."""

    url: str

    def create_secret(self, connection: duckdb.DuckDBPyConnection, scope: str) -> None:
        """The secret DuckDB reads the objects under `scope` (an `s3://` prefix) with, made anew."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise AnalystReadError(f"S3 endpoint {self.url!r} is not an http:// or https:// URL")
        session = boto3.Session()
        credentials = session.get_credentials()
        if credentials is None:
            raise AnalystReadError(f"no AWS credentials for S3 at {self.url}: boto3's default chain found none")
        frozen = credentials.get_frozen_credentials()
        options: dict[str, Any] = {
            "SCOPE": scope,
            "KEY_ID": frozen.access_key,
            "SECRET": frozen.secret_key,
            "REGION": session.region_name or "us-east-1",
            "ENDPOINT": parts.netloc,
            "URL_STYLE": "path",
            "USE_SSL": parts.scheme == "https",
        }
        if frozen.token:
            options["SESSION_TOKEN"] = frozen.token
        # Secrets belong to the database, which every read shares: one per prefix, the endpoint of its last read.
        name = "s3_" + hashlib.sha256(scope.encode()).hexdigest()[:16]
        listed = ", ".join(f"{option} ?" for option in options)
        connection.execute(f"CREATE OR REPLACE SECRET {name} (TYPE s3, {listed})", list(options.values()))


@dataclass(frozen=True)
class AnalystTable:
    """A landed table as DuckDB scans it: `iceberg_scan` of its current metadata file, or `delta_scan`
    of its folder or S3 prefix (`s3` the endpoint, when not AWS's own)."""

    scan: Literal["iceberg_scan", "delta_scan"]
    location: str
    s3: S3Endpoint | None = None

    @classmethod
    def iceberg(cls, metadata_location: str) -> AnalystTable:
        """The Iceberg table whose current metadata file is `metadata_location` (pyiceberg's
        `Table.metadata_location`)."""
        return cls("iceberg_scan", metadata_location)

    @classmethod
    def delta(cls, location: str, s3_endpoint_url: str | None = None) -> AnalystTable:
        """The Delta table in the folder or under the `s3://bucket/prefix` `location`; S3's endpoint
        `s3_endpoint_url`, else the AWS SDKs' variables for it (else AWS's own)."""
        if not location.startswith("s3://"):
            return cls("delta_scan", location)
        endpoint = s3_endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return cls("delta_scan", location, S3Endpoint(endpoint) if endpoint else None)

    def rows(self, columns: Sequence[str] = IDENTITY_COLUMNS) -> pa.Table:
        """The rows readers of the table see now, of `columns`, in the scan's order."""
        selected = ", ".join(f'"{column}"' for column in columns)
        with self._scanning() as connection:
            query = connection.execute(f"SELECT {selected} FROM {self.scan}(?)", [self.location])
            return query.fetch_record_batch().read_all()

    def count(self) -> int:
        """How many rows readers of the table see now, as DuckDB counts them (it may answer from the
        table's metadata, without reading the rows)."""
        with self._scanning() as connection:
            row = connection.execute(f"SELECT count(*) FROM {self.scan}(?)", [self.location]).fetchone()
            return 0 if row is None else int(row[0])

    def identities(self) -> list[Identity]:
        """Every row's (stream name, shard id, sequence number, sub-sequence number), duplicates
        included, ordered by stream, shard and then by number."""
        columns = self.rows().to_pydict()
        identities = zip(*(columns[name] for name in IDENTITY_COLUMNS))
        return sorted(identities, key=lambda row: (row[0], row[1], int(row[2]), row[3]))

    @contextmanager
    def _scanning(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection to the process's DuckDB (with the endpoint's secret for an S3 table); DuckDB's
        errors raised as `AnalystReadError` naming the table."""
        with analyst_database().cursor() as connection:
            try:
                if self.s3 is not None:
                    self.s3.create_secret(connection, self.location.rstrip("/") + "/")
                yield connection
            except duckdb.Error as error:
                raise AnalystReadError(f"DuckDB cannot read {self.location} with {self.scan}: {error}") from error


@functools.cache
def analyst_database() -> duckdb.DuckDBPyConnection:
    """This process's DuckDB, in memory, every extension loaded once (a LOAD checks the signature of a
    binary of 10-80 MB: a tenth of a second or more each); reads take a cursor of it each."""
    return connect(tuple(EXTENSION_PACKAGES))


def connect(extensions: Sequence[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with `extensions` loaded from the wheels that carry them; it may neither
    install nor autoload any other."""
    folder = extension_directory(extensions)
    connection = duckdb.connect(
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "extension_directory": str(folder),
        }
    )
    try:
        for extension in extensions:
            connection.execute(f"LOAD {extension}")
    except duckdb.Error as error:
        connection.close()
        raise AnalystReadError(f"DuckDB {duckdb.__version__} cannot load from {folder}: {error}") from error
    return connection


def extension_directory(extensions: Sequence[str]) -> Path:
    """The extension folder the wheels of `extensions` share (its `v<duckdb version>/<platform>/`
    subfolders hold the binaries), checked to hold each one for this DuckDB."""
    binaries = [_extension_binary(extension) for extension in extensions]
    folder = binaries[0].parents[2]
    for binary in binaries:
        version = binary.parent.parent.name
        if version != f"v{duckdb.__version__}":
            raise AnalystReadError(
                f"{binary} is built for DuckDB {version}, but DuckDB {duckdb.__version__} is installed: "
                f"lock {EXTENSION_PACKAGES[binary.name.split('.')[0]]} and duckdb to the same version"
            )
        if binary.parents[2] != folder:
            raise AnalystReadError(f"DuckDB's extensions are in two folders: {folder} and {binary.parents[2]}")
    return folder


def _extension_binary(extension: str) -> Path:
    package = EXTENSION_PACKAGES[extension]
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise AnalystReadError(
            f"DuckDB's {extension} extension is missing: install the dev dependencies (scripts/bootstrap.sh), "
            f"which bring {package}"
        ) from None
    names = [file for file in distribution.files or () if file.name == f"{extension}.duckdb_extension"]
    if len(names) != 1:
        raise AnalystReadError(f"{package} {distribution.version} holds no single {extension}.duckdb_extension")
    return Path(str(distribution.locate_file(names[0])))
