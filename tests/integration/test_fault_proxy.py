"""The fault-injecting, recording proxy in front of moto (DynamoDB, S3, Glue) and kinesis-mock (Kinesis), via boto3.

Clients here make exactly one attempt per call (no botocore retries), so each injected fault
surfaces as the exception a consumer's retry logic would see first.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from devtools.fault_proxy import FaultProxy, FaultRule
from devtools.kinesis_streams import create_stream, kinesis_client, put_records
from lease_core import aws
from lease_core.config.settings import ConsumerConfig

ONE_ATTEMPT = Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=30)
SHARD = "shardId-000000000000"
TRIM_POINT = 2  # index of the first record that survives the trim


def dynamodb(endpoint: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1", config=ONE_ATTEMPT)


def kinesis(endpoint: str) -> Any:
    return boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1", config=ONE_ATTEMPT)


def create_table(client: Any, name: str) -> None:
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def item(key: str) -> dict[str, Any]:
    return {"key": {"S": key}, "value": {"N": "1"}}


def stored(client: Any, table: str, key: str) -> dict[str, Any] | None:
    return client.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True).get("Item")


def error_of(call: Any) -> tuple[str, int]:
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        call()
    response = raised.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def records_from(client: Any, stream: str, **position: str) -> list[dict[str, Any]]:
    iterator = client.get_shard_iterator(StreamName=stream, ShardId=SHARD, **position)["ShardIterator"]
    return client.get_records(ShardIterator=iterator)["Records"]


def first_sequence_number(client: Any, stream: str, **position: str) -> str | None:
    records = records_from(client, stream, **position)
    return records[0]["SequenceNumber"] if records else None


@pytest.fixture
def dynamodb_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, seed=7) as proxy:
        yield proxy


@pytest.fixture
def kinesis_proxy(kinesis_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(kinesis_endpoint, seed=7) as proxy:
        yield proxy


@pytest.fixture
def table(moto_endpoint: str, unique_name: str) -> str:
    create_table(dynamodb(moto_endpoint), unique_name)
    return unique_name


@pytest.fixture
def stream(kinesis_endpoint: str, unique_name: str) -> tuple[str, list[str]]:
    """A one-shard stream holding five records; its name and their sequence numbers."""
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, unique_name, shard_count=1)
    return unique_name, put_records(client, unique_name, 5)[SHARD]


def test_a_dynamodb_table_created_written_and_read_through_the_proxy_matches_the_direct_view(
    dynamodb_proxy: FaultProxy, moto_endpoint: str, unique_name: str
) -> None:
    proxied = dynamodb(dynamodb_proxy.endpoint)
    create_table(proxied, unique_name)
    proxied.put_item(TableName=unique_name, Item=item("a"))

    assert stored(proxied, unique_name, "a") == stored(dynamodb(moto_endpoint), unique_name, "a") == item("a")
    assert dynamodb_proxy.stats() == {"forwarded": 3}


def test_kinesis_records_put_and_read_through_the_proxy_match_the_direct_view(
    kinesis_proxy: FaultProxy, kinesis_endpoint: str, unique_name: str
) -> None:
    proxied = kinesis(kinesis_proxy.endpoint)
    create_stream(proxied, unique_name, shard_count=1)
    written = put_records(proxied, unique_name, 3)[SHARD]

    def read(client: Any) -> list[tuple[str, bytes]]:
        records = records_from(client, unique_name, ShardIteratorType="TRIM_HORIZON")
        return [(record["SequenceNumber"], record["Data"]) for record in records]

    assert read(proxied) == read(kinesis(kinesis_endpoint))
    assert [sequence for sequence, _ in read(proxied)] == written


def test_throttling_putitem_gives_botocore_the_dynamodb_throttling_code_while_getitem_passes(
    dynamodb_proxy: FaultProxy, table: str
) -> None:
    client = dynamodb(dynamodb_proxy.endpoint)
    dynamodb_proxy.set_faults([FaultRule("throttle", 1.0, "PutItem")])

    assert error_of(lambda: client.put_item(TableName=table, Item=item("a"))) == (
        "ProvisionedThroughputExceededException",
        400,
    )
    assert stored(client, table, "a") is None


def test_throttling_getrecords_gives_botocore_the_kinesis_throttling_code_while_getsharditerator_passes(
    kinesis_proxy: FaultProxy, stream: tuple[str, list[str]]
) -> None:
    client = kinesis(kinesis_proxy.endpoint)
    kinesis_proxy.set_faults([FaultRule("throttle", 1.0, "GetRecords")])
    iterator = client.get_shard_iterator(StreamName=stream[0], ShardId=SHARD, ShardIteratorType="TRIM_HORIZON")

    assert error_of(lambda: client.get_records(ShardIterator=iterator["ShardIterator"])) == (
        "ProvisionedThroughputExceededException",
        400,
    )


@pytest.mark.parametrize(
    ("service", "code"),
    [("dynamodb", "InternalServerError"), ("kinesis", "InternalFailure")],
    ids=["dynamodb", "kinesis"],
)
def test_a_server_error_is_a_500_with_the_service_s_own_code(
    service: str, code: str, dynamodb_proxy: FaultProxy, kinesis_proxy: FaultProxy
) -> None:
    proxy = dynamodb_proxy if service == "dynamodb" else kinesis_proxy
    proxy.set_faults([FaultRule("server_error", 1.0)])
    client = dynamodb(proxy.endpoint) if service == "dynamodb" else kinesis(proxy.endpoint)
    call = client.list_tables if service == "dynamodb" else client.list_streams

    assert error_of(call) == (code, 500)


def test_a_share_of_0_3_faults_between_40_and_80_of_200_calls_and_the_same_seed_picks_the_same_calls(
    moto_endpoint: str, table: str
) -> None:
    def failed_calls() -> list[int]:
        with FaultProxy(moto_endpoint, seed=11) as proxy:
            proxy.set_faults([FaultRule("throttle", 0.3, "GetItem")])
            client = dynamodb(proxy.endpoint)
            failed = []
            for call in range(200):
                try:
                    client.get_item(TableName=table, Key={"key": {"S": "a"}})
                except client.exceptions.ProvisionedThroughputExceededException:
                    failed.append(call)
            assert proxy.stats() == {"forwarded": 200 - len(failed), "throttle:GetItem": len(failed)}
            return failed

    first = failed_calls()
    assert 40 <= len(first) <= 80
    assert failed_calls() == first


def test_a_dropped_dynamodb_response_is_a_prompt_connection_error_after_the_write_was_applied(
    dynamodb_proxy: FaultProxy, moto_endpoint: str, table: str
) -> None:
    dynamodb_proxy.set_faults([FaultRule("drop_response", 1.0, "PutItem")])
    started = time.monotonic()
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        dynamodb(dynamodb_proxy.endpoint).put_item(TableName=table, Item=item("a"))

    assert time.monotonic() - started < 2.0
    assert stored(dynamodb(moto_endpoint), table, "a") == item("a")


def test_a_dropped_dynamodb_request_is_a_connection_error_and_the_write_never_happens(
    dynamodb_proxy: FaultProxy, moto_endpoint: str, table: str
) -> None:
    dynamodb_proxy.set_faults([FaultRule("drop_request", 1.0, "PutItem")])
    with pytest.raises(botocore.exceptions.ConnectionClosedError):
        dynamodb(dynamodb_proxy.endpoint).put_item(TableName=table, Item=item("a"))

    assert stored(dynamodb(moto_endpoint), table, "a") is None
    assert dynamodb_proxy.stats() == {"drop_request:PutItem": 1}


def test_stats_count_forwarded_requests_and_each_injected_fault_by_kind_and_operation(
    dynamodb_proxy: FaultProxy, table: str
) -> None:
    client = dynamodb(dynamodb_proxy.endpoint)
    dynamodb_proxy.set_faults([FaultRule("throttle", 1.0, "GetItem"), FaultRule("drop_request", 1.0, "PutItem")])
    for call in (
        lambda: stored(client, table, "a"),
        lambda: stored(client, table, "b"),
        lambda: client.put_item(TableName=table, Item=item("a")),
    ):
        with pytest.raises((botocore.exceptions.ClientError, botocore.exceptions.ConnectionClosedError)):
            call()
    dynamodb_proxy.set_faults([])
    client.describe_table(TableName=table)

    assert dynamodb_proxy.stats() == {"throttle:GetItem": 2, "drop_request:PutItem": 1, "forwarded": 1}


@pytest.mark.parametrize("mode", ["reject", "skip"])
def test_after_a_trim_trim_horizon_starts_at_the_trim_point(
    mode: str, kinesis_proxy: FaultProxy, stream: tuple[str, list[str]]
) -> None:
    name, sequences = stream
    kinesis_proxy.trim(name, SHARD, sequences[TRIM_POINT], mode)

    assert (
        first_sequence_number(kinesis(kinesis_proxy.endpoint), name, ShardIteratorType="TRIM_HORIZON")
        == (sequences[TRIM_POINT])
    )
    assert kinesis_proxy.stats()["trim_rewrite:GetShardIterator"] == 1


@pytest.mark.parametrize(
    ("mode", "iterator_type", "start", "first"),
    [
        ("skip", "AT_SEQUENCE_NUMBER", 0, TRIM_POINT),
        ("skip", "AFTER_SEQUENCE_NUMBER", 0, TRIM_POINT),
        ("skip", "AT_SEQUENCE_NUMBER", 3, 3),
        ("reject", "AT_SEQUENCE_NUMBER", TRIM_POINT, TRIM_POINT),
        ("reject", "AFTER_SEQUENCE_NUMBER", TRIM_POINT, 3),
    ],
    ids=["skip-at-aged-out", "skip-after-aged-out", "skip-at-kept", "reject-at-trim-point", "reject-after-trim-point"],
)
def test_a_sequence_number_iterator_after_a_trim_starts_where_the_retained_records_allow(
    mode: str, iterator_type: str, start: int, first: int, kinesis_proxy: FaultProxy, stream: tuple[str, list[str]]
) -> None:
    name, sequences = stream
    kinesis_proxy.trim(name, SHARD, sequences[TRIM_POINT], mode)
    client = kinesis(kinesis_proxy.endpoint)

    assert (
        first_sequence_number(client, name, ShardIteratorType=iterator_type, StartingSequenceNumber=sequences[start])
        == sequences[first]
    )


@pytest.mark.parametrize("iterator_type", ["AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"])
def test_reject_mode_refuses_an_aged_out_sequence_number_even_when_the_stream_is_named_by_arn(
    iterator_type: str, kinesis_proxy: FaultProxy, kinesis_endpoint: str, stream: tuple[str, list[str]]
) -> None:
    name, sequences = stream
    arn = kinesis(kinesis_endpoint).describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamARN"]
    kinesis_proxy.trim(name, SHARD, sequences[TRIM_POINT])
    client = kinesis(kinesis_proxy.endpoint)

    assert error_of(
        lambda: client.get_shard_iterator(
            StreamARN=arn, ShardId=SHARD, ShardIteratorType=iterator_type, StartingSequenceNumber=sequences[1]
        )
    ) == ("InvalidArgumentException", 400)
    assert kinesis_proxy.stats() == {"trim_reject:GetShardIterator": 1}


def test_an_iterator_obtained_before_the_trim_still_reads_the_aged_out_records(
    kinesis_proxy: FaultProxy, stream: tuple[str, list[str]]
) -> None:
    name, sequences = stream
    client = kinesis(kinesis_proxy.endpoint)
    iterator = client.get_shard_iterator(StreamName=name, ShardId=SHARD, ShardIteratorType="TRIM_HORIZON")
    kinesis_proxy.trim(name, SHARD, sequences[TRIM_POINT])

    records = client.get_records(ShardIterator=iterator["ShardIterator"])["Records"]
    assert [record["SequenceNumber"] for record in records] == sequences


def test_stop_frees_the_port_and_refuses_new_connections(moto_endpoint: str) -> None:
    proxy = FaultProxy(moto_endpoint).start()
    dynamodb(proxy.endpoint).list_tables()  # leaves a kept-alive connection for stop() to end
    proxy.stop()
    host, port = proxy.endpoint.removeprefix("http://").split(":")

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2).close()
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as every HTTP server binds
        listener.bind((host, int(port)))


@pytest.mark.parametrize(
    "make",
    [lambda: FaultRule("timeout", 0.5), lambda: FaultRule("throttle", 1.5), lambda: FaultRule("throttle", -0.1)],
    ids=["unknown-kind", "share-above-one", "negative-share"],
)
def test_a_rule_outside_the_known_kinds_or_the_unit_interval_is_refused(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


# --- recording -------------------------------------------------------------------------------------


def s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=ONE_ATTEMPT)


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def glue_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def bucket(moto_endpoint: str, unique_name: str) -> str:
    name = unique_name.lower().replace("_", "-")[:50].strip("-.")
    s3(moto_endpoint).create_bucket(Bucket=name)
    return name


def recorded(proxy: FaultProxy, *fields: str) -> list[tuple[Any, ...]]:
    return [tuple(getattr(call, name) for name in ("operation", *fields)) for call in proxy.calls()]


def test_dynamodb_calls_are_recorded_with_their_tables_index_and_parameters(
    dynamodb_proxy: FaultProxy, moto_endpoint: str, unique_name: str
) -> None:
    client = dynamodb(dynamodb_proxy.endpoint)
    client.create_table(
        TableName=unique_name,
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "key", "AttributeType": "S"},
            {"AttributeName": "owner", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "owners",
                "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
        Tags=[{"Key": "team", "Value": "data"}],
    )
    create_table(dynamodb(moto_endpoint), f"{unique_name}-other")
    client.query(
        TableName=unique_name,
        IndexName="owners",
        KeyConditionExpression="#o = :o",
        ExpressionAttributeNames={"#o": "owner"},
        ExpressionAttributeValues={":o": {"S": "w"}},
    )
    client.batch_get_item(
        RequestItems={name: {"Keys": [{"key": {"S": "a"}}]} for name in (unique_name, f"{unique_name}-other")}
    )
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.describe_table(TableName=f"{unique_name}-missing")

    assert recorded(dynamodb_proxy, "service", "tables", "index", "status") == [
        ("CreateTable", "dynamodb", (unique_name,), None, 200),
        ("Query", "dynamodb", (unique_name,), "owners", 200),
        ("BatchGetItem", "dynamodb", (unique_name, f"{unique_name}-other"), None, 200),
        ("DescribeTable", "dynamodb", (f"{unique_name}-missing",), None, 400),
    ]
    assert "Tags" in dynamodb_proxy.calls()[0].parameters


def test_get_records_and_paged_list_shards_are_recorded_with_the_stream_their_iterator_or_token_came_from(
    kinesis_proxy: FaultProxy, kinesis_endpoint: str, unique_name: str
) -> None:
    create_stream(kinesis_client(kinesis_endpoint), unique_name, shard_count=2)
    put_records(kinesis_client(kinesis_endpoint), unique_name, 4)
    client = kinesis(kinesis_proxy.endpoint)
    arn = client.describe_stream_summary(StreamName=unique_name)["StreamDescriptionSummary"]["StreamARN"]
    page = client.list_shards(StreamARN=arn, MaxResults=1)
    client.list_shards(NextToken=page["NextToken"], MaxResults=1)
    iterator = client.get_shard_iterator(StreamName=unique_name, ShardId=SHARD, ShardIteratorType="TRIM_HORIZON")
    first = client.get_records(ShardIterator=iterator["ShardIterator"], Limit=1)
    client.get_records(ShardIterator=first["NextShardIterator"])

    assert recorded(kinesis_proxy, "service", "stream", "status") == [
        ("DescribeStreamSummary", "kinesis", unique_name, 200),
        ("ListShards", "kinesis", unique_name, 200),
        ("ListShards", "kinesis", unique_name, 200),
        ("GetShardIterator", "kinesis", unique_name, 200),
        ("GetRecords", "kinesis", unique_name, 200),
        ("GetRecords", "kinesis", unique_name, 200),
    ]


def test_s3_rest_calls_are_recorded_as_the_s3_operations_their_method_key_and_query_make(
    s3_proxy: FaultProxy, bucket: str
) -> None:
    client = s3(s3_proxy.endpoint)
    client.head_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="lake/a b.json", Body=b"{}")
    client.get_object(Bucket=bucket, Key="lake/a b.json")["Body"].read()
    client.list_objects_v2(Bucket=bucket, Prefix="lake/", Delimiter="/")
    upload = client.create_multipart_upload(Bucket=bucket, Key="lake/big")["UploadId"]
    part = client.upload_part(Bucket=bucket, Key="lake/big", UploadId=upload, PartNumber=1, Body=b"x")
    client.complete_multipart_upload(
        Bucket=bucket,
        Key="lake/big",
        UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
    )
    aborted = client.create_multipart_upload(Bucket=bucket, Key="lake/gone")["UploadId"]
    client.abort_multipart_upload(Bucket=bucket, Key="lake/gone", UploadId=aborted)
    client.delete_object(Bucket=bucket, Key="lake/big")

    assert recorded(s3_proxy, "service", "method", "bucket", "key") == [
        ("HeadBucket", "s3", "HEAD", bucket, None),
        ("PutObject", "s3", "PUT", bucket, "lake/a b.json"),
        ("GetObject", "s3", "GET", bucket, "lake/a b.json"),
        ("ListObjectsV2", "s3", "GET", bucket, None),
        ("CreateMultipartUpload", "s3", "POST", bucket, "lake/big"),
        ("UploadPart", "s3", "PUT", bucket, "lake/big"),
        ("CompleteMultipartUpload", "s3", "POST", bucket, "lake/big"),
        ("CreateMultipartUpload", "s3", "POST", bucket, "lake/gone"),
        ("AbortMultipartUpload", "s3", "DELETE", bucket, "lake/gone"),
        ("DeleteObject", "s3", "DELETE", bucket, "lake/big"),
    ]
    assert {"prefix": "lake/", "delimiter": "/", "list-type": "2"}.items() <= dict(s3_proxy.calls()[3].query).items()


def test_a_delete_objects_call_is_recorded_with_the_keys_its_body_names(s3_proxy: FaultProxy, bucket: str) -> None:
    client = s3(s3_proxy.endpoint)
    keys = ["lake/a b.json", "lake/x=1/part-0.parquet", "lake/<&>"]
    for key in keys:
        client.put_object(Bucket=bucket, Key=key, Body=b"x")

    client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in keys], "Quiet": True})

    (call,) = [call for call in s3_proxy.calls() if call.operation == "DeleteObjects"]
    assert (call.method, call.bucket, call.key, call.keys) == ("POST", bucket, None, tuple(keys))
    assert client.list_objects_v2(Bucket=bucket, Prefix="lake/").get("Contents") is None


def test_glue_calls_are_recorded_with_their_database_and_table(glue_proxy: FaultProxy, unique_name: str) -> None:
    client = boto3.client("glue", endpoint_url=glue_proxy.endpoint, region_name="us-east-1", config=ONE_ATTEMPT)
    database = unique_name.lower().replace("-", "_").replace(".", "_")
    client.create_database(DatabaseInput={"Name": database})
    client.get_database(Name=database)
    with pytest.raises(client.exceptions.EntityNotFoundException):
        client.get_table(DatabaseName=database, Name="orders")
    client.create_table(DatabaseName=database, TableInput={"Name": "orders"})
    client.update_table(DatabaseName=database, TableInput={"Name": "orders", "Description": "d"})

    assert recorded(glue_proxy, "service", "database", "tables", "status") == [
        ("CreateDatabase", "glue", database, (), 200),
        ("GetDatabase", "glue", database, (), 200),
        ("GetTable", "glue", database, ("orders",), 400),
        ("CreateTable", "glue", database, ("orders",), 200),
        ("UpdateTable", "glue", database, ("orders",), 200),
    ]


def test_aged_listings_report_objects_written_that_much_earlier_and_nothing_else_changes(
    s3_proxy: FaultProxy, bucket: str
) -> None:
    client = s3(s3_proxy.endpoint)
    client.put_object(Bucket=bucket, Key="lake/old", Body=b"x")
    written = client.head_object(Bucket=bucket, Key="lake/old")["LastModified"]
    s3_proxy.age_listings(timedelta(days=4))

    listed = client.list_objects_v2(Bucket=bucket, Prefix="lake/")["Contents"]

    assert [(entry["Key"], written - entry["LastModified"]) for entry in listed] == [("lake/old", timedelta(days=4))]
    assert client.head_object(Bucket=bucket, Key="lake/old")["LastModified"] == written
    s3_proxy.age_listings(timedelta(0))
    assert client.list_objects_v2(Bucket=bucket, Prefix="lake/")["Contents"][0]["LastModified"] == written


def test_head_is_relayed_with_the_object_s_length_and_no_body_so_pyarrow_can_stat_through_the_proxy(
    s3_proxy: FaultProxy, moto_endpoint: str, bucket: str
) -> None:
    import pyarrow.fs as pafs

    s3(moto_endpoint).put_object(Bucket=bucket, Key="lake/file", Body=b"12345")
    head = s3(s3_proxy.endpoint).head_object(Bucket=bucket, Key="lake/file")
    host = s3_proxy.endpoint.removeprefix("http://")
    filesystem = pafs.S3FileSystem(
        access_key="testing", secret_key="testing", region="us-east-1", scheme="http", endpoint_override=host
    )

    assert head["ContentLength"] == 5
    assert filesystem.get_file_info(f"{bucket}/lake/file").size == 5
    assert (
        s3(s3_proxy.endpoint).get_object(Bucket=bucket, Key="lake/file")["Body"].read() == b"12345"
    )  # connection still in step
    assert [call.operation for call in s3_proxy.calls()] == ["HeadObject", "HeadObject", "GetObject"]


def test_a_chunked_request_body_reaches_the_upstream_whole(
    s3_proxy: FaultProxy, moto_endpoint: str, bucket: str
) -> None:
    host, port = s3_proxy.endpoint.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request(
        "PUT",
        f"/{bucket}/chunked",
        body=iter([b"hello ", b"chunked ", b"world"]),
        headers={"Transfer-Encoding": "chunked"},
        encode_chunked=True,
    )
    assert connection.getresponse().status == 200
    connection.close()

    assert s3(moto_endpoint).get_object(Bucket=bucket, Key="chunked")["Body"].read() == b"hello chunked world"


def test_injected_faults_are_recorded_with_the_status_the_client_got_or_none_when_dropped(
    dynamodb_proxy: FaultProxy, table: str
) -> None:
    client = dynamodb(dynamodb_proxy.endpoint)
    dynamodb_proxy.set_faults([FaultRule("throttle", 1.0, "GetItem"), FaultRule("drop_request", 1.0, "PutItem")])
    for call in (lambda: stored(client, table, "a"), lambda: client.put_item(TableName=table, Item=item("a"))):
        with pytest.raises((botocore.exceptions.ClientError, botocore.exceptions.ConnectionClosedError)):
            call()

    assert recorded(dynamodb_proxy, "tables", "status") == [("GetItem", (table,), 400), ("PutItem", (table,), None)]


def test_a_client_of_lease_core_sends_a_throttled_request_once_and_leaves_retrying_to_its_caller(
    dynamodb_proxy: FaultProxy, table: str, unique_name: str
) -> None:
    # botocore reads `max_attempts` in a client config as retries after the first request; lease_core
    # retries with its own policy (AwsCaller), so botocore must send each request exactly once.
    config = ConsumerConfig(application_name=unique_name, aws_endpoint_url_dynamodb=dynamodb_proxy.endpoint)
    client = aws.client("dynamodb", config)
    dynamodb_proxy.set_faults([FaultRule("throttle", 1.0, "PutItem")])

    assert (
        error_of(lambda: client.put_item(TableName=table, Item=item("a")))[0]
        == "ProvisionedThroughputExceededException"
    )
    assert [call.operation for call in dynamodb_proxy.calls() if call.operation == "PutItem"] == ["PutItem"]
