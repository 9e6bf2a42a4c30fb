"""Choosing a sink by its URI: the round plan's pure check of the form, and `open_sink`."""

from __future__ import annotations

import pytest
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from lease_core.config.settings import ConsumerConfig
from sinks import check_sink_uri, open_sink
from sinks.errors import SinkError
from sinks.parquet import ParquetSink
from sinks.table.iceberg import IcebergSink, widens_to

PARQUET_URIS = [
    pytest.param("/lake", "/lake", id="absolute-path"),
    pytest.param("relative/lake/", "relative/lake", id="relative-path"),
    pytest.param("file:///lake", "file:///lake", id="file-uri"),
    pytest.param("s3://bucket/lake/", "s3://bucket/lake", id="s3-prefix"),
    pytest.param("s3://bucket", "s3://bucket", id="s3-bucket"),
]


@pytest.mark.parametrize(("uri", "checked"), PARQUET_URIS)
def test_a_parquet_uri_passes_the_check_without_its_trailing_slashes(uri: str, checked: str) -> None:
    assert check_sink_uri(uri) == checked


@pytest.mark.parametrize("uri", ["hdfs://namenode/lake", "s3:///lake", "file://host/lake", ""])
def test_a_uri_no_sink_writes_to_is_refused_naming_the_forms(uri: str) -> None:
    forms = (
        r"is not a local path, an absolute file:///path or an s3://bucket\[/prefix\] URI \(a Parquet dataset\), "
        r"iceberg://.* or delta:PATH"
    )
    with pytest.raises(SinkError, match=forms):
        check_sink_uri(uri)


def test_an_iceberg_uri_passes_the_check_and_opens_an_iceberg_sink_for_the_application() -> None:
    assert check_sink_uri("iceberg://glue/lake.orders/") == "iceberg://glue/lake.orders"
    sink = open_sink("iceberg://glue/lake.orders", config=ConsumerConfig(application_name="orders-app"))
    assert isinstance(sink, IcebergSink) and sink.application == "orders-app"
    assert (sink.address.catalog, sink.address.namespace, sink.address.table) == ("glue", ("lake",), "orders")


def test_a_malformed_iceberg_uri_is_refused_naming_its_form() -> None:
    with pytest.raises(SinkError, match=r"is not of the form iceberg://CATALOG/NAMESPACE.TABLE"):
        check_sink_uri("iceberg://glue/orders")


def test_a_local_path_opens_a_parquet_dataset_there(tmp_path) -> None:
    sink = open_sink(str(tmp_path / "lake"), config=ConsumerConfig())
    assert isinstance(sink, ParquetSink) and sink.root == str(tmp_path / "lake")


def _struct(first_id: int = 1, **fields: IcebergType) -> StructType:
    return StructType(
        *(NestedField(first_id + index, name, field_type) for index, (name, field_type) in enumerate(fields.items()))
    )


@pytest.mark.parametrize(
    ("batch_type", "table_type", "held"),
    [
        (StringType(), StringType(), True),
        (IntegerType(), LongType(), True),
        (FloatType(), DoubleType(), True),
        (DecimalType(9, 2), DecimalType(18, 2), True),
        (LongType(), IntegerType(), False),
        (DecimalType(9, 2), DecimalType(18, 3), False),
        (BinaryType(), StringType(), False),
        (StringType(), LongType(), False),
        (ListType(1, IntegerType()), ListType(7, LongType()), True),
        (ListType(1, StringType()), ListType(7, LongType()), False),
        (MapType(1, StringType(), 2, FloatType()), MapType(8, StringType(), 9, DoubleType()), True),
        (_struct(a=IntegerType(), b=StringType()), _struct(10, b=StringType(), a=LongType()), True),
        (_struct(a=IntegerType(), c=StringType()), _struct(10, a=IntegerType()), False),
        (_struct(a=IntegerType()), _struct(10, a=IntegerType(), b=StringType()), False),
        (ListType(1, IntegerType()), StringType(), False),
    ],
    ids=[
        "same",
        "int to long",
        "float to double",
        "wider decimal",
        "long to int",
        "decimal of another scale",
        "binary to string (not every byte string is text)",
        "string to long",
        "a list whose elements widen (field ids aside)",
        "a list of other elements",
        "a map whose keys and values widen",
        "a struct with the table's fields by name, each widening",
        "a struct with a field the table's lacks",
        "a struct without a field of the table's",
        "a list as a string",
    ],
)
def test_a_table_column_holds_a_batch_column_only_of_its_own_type_or_a_lossless_widening(batch_type, table_type, held):
    assert widens_to(batch_type, table_type) is held
