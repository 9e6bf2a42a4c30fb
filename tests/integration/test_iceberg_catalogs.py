"""The Iceberg sink on the catalogs a deployment uses, each a real server on loopback: pyiceberg's SQL
catalog on PostgreSQL (concurrent committers conflict there as on any SQL catalog), and AWS Glue with
an S3 warehouse on moto (whose Glue ignores VersionId, so conflicts are tested on the SQL catalogs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import boto3
import pytest

from lease_core.model.sequence import TRIM_HORIZON
from sinks.record_columns import RECORD_SCHEMA
from sinks.table.committer import SUMMARY_RANGES
from sinks.table.iceberg import IcebergSink
from tests.support.iceberg_tables import (
    APPLICATION,
    IDENTITY,
    batch_of,
    catalog_environment,
    glue_catalog_properties,
    rows,
    table_sequence_numbers,
)
from tests.support.postgres_server import PostgresServer, postgres_server

SHARDS = [f"shardId-00000000000{index}" for index in range(4)]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server("iceberg") as server:
        yield server


def configure(monkeypatch: pytest.MonkeyPatch, catalog: str, properties: dict[str, str]) -> None:
    for name, value in catalog_environment(catalog, properties).items():
        monkeypatch.setenv(name, value)


def land_every_shard(sink: IcebergSink) -> dict[str, str]:
    """One staged and committed batch per shard: the lease records a round's slots leave."""
    records = {}
    for index, shard in enumerate(SHARDS):
        first = 1000 * (index + 1)
        batch = batch_of(TRIM_HORIZON, first, 25, shard)
        record = sink.commit_record(None, sink.stage(batch, rows(first, 25), f"attempt-{shard}"))
        assert record is not None
        records[shard] = record
    return records


def test_concurrent_publishers_on_postgres_land_every_batch_once(monkeypatch, postgres, tmp_path):
    """Four drivers of overlapping jobs publish the same records at once: one commits, the others
    find the batches in the table when their commit conflicts, and no row lands twice."""
    configure(
        monkeypatch,
        "pglake",
        {"type": "sql", "uri": postgres.sqlalchemy_url(), "warehouse": f"file://{tmp_path}/warehouse"},
    )
    sink = IcebergSink("iceberg://pglake/kinesis.orders", APPLICATION)
    sink.catalog.create_namespace("kinesis")
    sink.check_writable(RECORD_SCHEMA)
    records = land_every_shard(sink)
    publishers = [IcebergSink(sink.uri, APPLICATION) for _ in range(4)]
    results: list[object] = []
    start = threading.Barrier(len(publishers))

    def publish(publisher: IcebergSink) -> None:
        start.wait()
        results.append(publisher.publish_round(records, IDENTITY))

    threads = [threading.Thread(target=publish, args=(publisher,)) for publisher in publishers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert sorted(result.batches_published for result in results) == [0, 0, 0, 4]  # type: ignore[attr-defined]
    assert len(table_sequence_numbers(sink)) == 4 * 25
    assert all(value == 1 for value in (result.commits for result in results) if value)  # type: ignore[attr-defined]


def test_glue_with_an_s3_warehouse_on_moto(monkeypatch, moto_endpoint, unique_name):
    bucket = unique_name.lower().replace("_", "-")[:50]
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    configure(
        monkeypatch, "gluelake", glue_catalog_properties(moto_endpoint, moto_endpoint, f"s3://{bucket}/warehouse")
    )
    sink = IcebergSink("iceberg://gluelake/kinesis_db.orders", APPLICATION)
    sink.catalog.create_namespace("kinesis_db", {"location": f"s3://{bucket}/warehouse/kinesis_db"})
    sink.check_writable(RECORD_SCHEMA)
    records = land_every_shard(sink)

    published = sink.publish_round(records, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 4)
    assert len(table_sequence_numbers(sink)) == 4 * 25
    table = sink.table(refresh=True)
    assert table.metadata.location.startswith(f"s3://{bucket}/")
    assert table.current_snapshot().summary[SUMMARY_RANGES].count("shardId-") == 4
    assert IcebergSink(sink.uri, APPLICATION).publish_round(records, IDENTITY).batches_already_visible == 4
