"""A round's report: where it lives (beside the output, under a folder readers skip), and that what
`write_report` writes `read_report` rebuilds equal, on a local path and on S3 (moto on loopback)."""

from __future__ import annotations

import boto3
import pyarrow.fs as pafs
import pytest

from lease_core.application import LeaseApplication
from lease_core.errors import ConfigurationError
from sinks.parquet import ParquetSink
from sinks.table.iceberg import IcebergSink
from spark_jobs.round_report import RoundReport, read_report, report_uri_for, write_report
from tests.support.stores import fast_config

REPORT = RoundReport.build("orders", 7, ("orders",), "/lake", "2026-11-24T03:00:00+00:00", 1.5, [])

LOCATION_CASES = [
    pytest.param(
        "/lake",
        "scheduled__2026-11-24T03:00:00+00:00",
        "/lake/_rounds/scheduled__2026-11-24T03-00-00-00-00.json",
        id="scheduled-run",
    ),
    pytest.param(
        "s3://bucket/prefix/", "manual__x", "s3://bucket/prefix/_rounds/manual__x.json", id="s3-trailing-slash"
    ),
]


def report_uri_beside(output_uri: str, run_id: str) -> str:
    return report_uri_for(ParquetSink(output_uri, pafs.LocalFileSystem(), "/unused").reports_root(), run_id)


@pytest.mark.parametrize(("output_uri", "run_id", "expected"), LOCATION_CASES)
def test_a_rounds_report_lives_beside_its_output_named_for_its_run(output_uri, run_id, expected):
    assert report_uri_beside(output_uri, run_id) == expected


def test_a_rounds_report_lives_in_its_iceberg_tables_metadata_folder_created_with_the_table(
    iceberg_catalog, tmp_path, moto_endpoint
):
    sink = IcebergSink("iceberg://lake/kinesis.orders", "orders", catalog=iceberg_catalog)
    uri = report_uri_for(sink.reports_root(), "manual__3")
    assert uri == f"file://{tmp_path}/warehouse/kinesis/orders/metadata/kinesis-rounds/manual__3.json"
    assert sink.table() is not None
    write_report(uri, REPORT, application(moto_endpoint))
    assert read_report(uri, application(moto_endpoint)) == REPORT


def application(moto_endpoint: str) -> LeaseApplication:
    return LeaseApplication.from_config(
        fast_config("orders", aws_endpoint_url_s3=moto_endpoint, aws_region="us-east-1")
    )


def test_a_report_written_to_a_local_path_is_read_back_whole(tmp_path, moto_endpoint):
    uri = report_uri_beside(str(tmp_path / "lake"), "manual__1")
    write_report(uri, REPORT, application(moto_endpoint))
    assert read_report(uri, application(moto_endpoint)) == REPORT
    assert [path.name for path in (tmp_path / "lake" / "_rounds").iterdir()] == ["manual__1.json"]


def test_a_report_written_to_s3_is_read_back_whole(unique_name, moto_endpoint):
    bucket = unique_name.lower().replace("_", "-")[:40]
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    uri = report_uri_beside(f"s3://{bucket}/landing", "manual__2")
    write_report(uri, REPORT, application(moto_endpoint))
    assert read_report(uri, application(moto_endpoint)) == REPORT


@pytest.mark.parametrize("uri", ["s3://", "s3://bucket-only"])
def test_an_s3_report_uri_without_bucket_and_key_is_refused_naming_the_setting(uri, moto_endpoint):
    with pytest.raises(ConfigurationError, match="report_uri"):
        write_report(uri, REPORT, application(moto_endpoint))
