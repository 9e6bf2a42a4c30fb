"""boto3 clients and the translation of AWS failures into lease_core errors.

Endpoints are never hard-coded: a configured `aws_endpoint_url_<service>` wins, otherwise boto3's
own resolution applies (`AWS_ENDPOINT_URL_<SERVICE>`, `AWS_ENDPOINT_URL`, then AWS).

Clients of the process's own session decode Kinesis GetRecords responses on a fast path: botocore's
JSON parser walks every record through the model and builds each arrival time with a fresh local
time zone, which made decoding most of a slot's CPU (bench/pipeline_cpu.py). So are the records of
SubscribeToShard's events (enhanced fan-out), which are the same records. The fast path decodes
the body with msgspec (JSON and base64 in one C pass, no Python code per record) into columns
(`KinesisRecordColumns`), which are still a sequence of what botocore returns (the same keys, bytes
for Data, time-zone aware datetimes for the same instants, in UTC). A body msgspec does not take as
Kinesis documents it (an arrival time as a string, a null data) is decoded record by record as
before. Everything else is botocore's: errors, retries, signing, credentials and every other response.
"""

from __future__ import annotations

import binascii
import functools
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions
import botocore.model
import botocore.parsers
import botocore.session
import msgspec
import pyarrow as pa

from lease_core.config.settings import ConsumerConfig
from lease_core.errors import AccessError, DependencyError, TableNotFoundError, ThrottledError
from lease_core.model.kinesis_record_columns import RAW_SCHEMA, KinesisRecordColumns, epoch_micros
from lease_core.retry import RetryPolicy

T = TypeVar("T")

THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "TooManyRequestsException",
        "SlowDown",
    }
)
# TransactionInProgressException: a transaction retried with its ClientRequestToken while its first
# try is still being applied; AWS says to retry it.
TRANSIENT_CODES = frozenset(
    {
        "InternalServerError",
        "InternalFailure",
        "InternalFailureException",  # Kinesis' exception event in a SubscribeToShard stream
        "ServiceUnavailable",
        "InternalError",
        "TransactionInProgressException",
    }
)
TRANSPORT_ERRORS = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ProxyConnectionError,
)


def error_code(error: BaseException) -> str | None:
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code")
        return None if code is None else str(code)
    return None


def is_retryable(error: Exception) -> bool:
    if isinstance(error, TRANSPORT_ERRORS):
        return True
    code = error_code(error)
    if code is None:
        return False
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)  # type: ignore[attr-defined]
    return code in THROTTLING_CODES or code in TRANSIENT_CODES or status >= 500


def may_have_been_applied(error: Exception) -> bool:
    """Whether a failed request may still have been carried out: its answer was lost or it failed
    server-side. Never for a request that was refused (throttled, invalid) or never sent."""
    if isinstance(error, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)):
        return False
    if isinstance(error, TRANSPORT_ERRORS):
        return True
    code = error_code(error)
    return code is not None and code not in THROTTLING_CODES and is_retryable(error)


def retry_policy(config: ConsumerConfig) -> RetryPolicy:
    return RetryPolicy(
        attempts=config.dependency_retry_attempts,
        base_millis=config.dependency_retry_base_millis,
        max_millis=config.dependency_retry_max_millis,
    )


_SESSION_LOCK = threading.Lock()


# Kinesis' Record shape, member by member: the fast path decodes exactly these.
_KINESIS_RECORD_MEMBERS = {
    "SequenceNumber": "string",
    "ApproximateArrivalTimestamp": "timestamp",
    "Data": "blob",
    "PartitionKey": "string",
    "EncryptionType": "string",
}


def _is_kinesis_get_records(shape: botocore.model.Shape | None) -> bool:
    if not isinstance(shape, botocore.model.StructureShape) or shape.name != "GetRecordsOutput":
        return False
    records = shape.members.get("Records")
    record = getattr(records, "member", None)
    return (
        isinstance(record, botocore.model.StructureShape)
        and {name: member.type_name for name, member in record.members.items()} == _KINESIS_RECORD_MEMBERS
        and set(shape.members) == _GET_RECORDS_MEMBERS
    )


# A member left out, or null: msgspec takes `Raw | None` for null alone, so an absent one is raw null.
_NO_RAW = msgspec.Raw(b"null")


class _Record(msgspec.Struct, gc=False):
    """A record as Kinesis sends it (unknown members are skipped, as botocore skips them)."""

    SequenceNumber: str
    Data: bytes  # base64 in JSON: msgspec decodes it
    ApproximateArrivalTimestamp: float | None = None  # epoch seconds
    PartitionKey: str | None = None
    EncryptionType: str | None = None


class _Body(msgspec.Struct, gc=False):
    Records: list[_Record] | None = None
    NextShardIterator: str | None = None
    MillisBehindLatest: int | None = None
    ChildShards: msgspec.Raw = _NO_RAW  # rare and small: botocore parses it


_BODY_DECODER = msgspec.json.Decoder(_Body)
_GET_RECORDS_MEMBERS = {"Records", "NextShardIterator", "MillisBehindLatest", "ChildShards"}


def _columns(records: list[_Record]) -> KinesisRecordColumns:
    """The records as columns: each column gathered in C (`map` over an `attrgetter`), typed by Arrow."""

    def column(name: str) -> list[Any]:
        return list(map(attrgetter(name), records))

    arrivals = epoch_micros(pa.array(column("ApproximateArrivalTimestamp"), pa.float64()))
    arrays = [column("SequenceNumber"), arrivals, column("Data"), column("PartitionKey"), column("EncryptionType")]
    return KinesisRecordColumns(pa.Table.from_arrays(arrays, schema=RAW_SCHEMA))


class _Event(msgspec.Struct, gc=False):
    Records: list[_Record] | None = None
    ContinuationSequenceNumber: str | None = None
    MillisBehindLatest: int | None = None
    ChildShards: msgspec.Raw = _NO_RAW


_EVENT_DECODER = msgspec.json.Decoder(_Event)
_SUBSCRIBE_TO_SHARD_EVENT_MEMBERS = {"Records", "ContinuationSequenceNumber", "MillisBehindLatest", "ChildShards"}


def _is_subscribe_to_shard_event(shape: botocore.model.Shape) -> bool:
    """Kinesis' SubscribeToShardEvent, whose records are GetRecords' records."""
    if shape.name != "SubscribeToShardEvent" or set(shape.members) != _SUBSCRIBE_TO_SHARD_EVENT_MEMBERS:
        return False
    record = getattr(shape.members["Records"], "member", None)
    return (
        isinstance(record, botocore.model.StructureShape)
        and {name: member.type_name for name, member in record.members.items()} == _KINESIS_RECORD_MEMBERS
    )


class _SubscribeToShardEventFastParser(botocore.parsers.EventStreamJSONParser):  # type: ignore[misc]
    """botocore's parser of the events of a "json" protocol event stream, with the records of Kinesis'
    SubscribeToShardEvents decoded as GetRecords' are (an event's payload holds the same records)."""

    def _parse_payload(
        self, response: Mapping[str, Any], shape: botocore.model.Shape, member_shapes: Any, final_parsed: dict[str, Any]
    ) -> None:
        if not _is_subscribe_to_shard_event(shape):
            super()._parse_payload(response, shape, member_shapes, final_parsed)
            return
        try:
            decoded = _EVENT_DECODER.decode(response["body"])
        except msgspec.MsgspecError:
            super()._parse_payload(response, shape, member_shapes, final_parsed)
            return
        rest = {
            "ContinuationSequenceNumber": decoded.ContinuationSequenceNumber,
            "MillisBehindLatest": decoded.MillisBehindLatest,
        }
        child_shards = msgspec.json.decode(decoded.ChildShards)
        if child_shards is not None:
            rest["ChildShards"] = child_shards
        final_parsed.update(
            self._parse_shape(shape, {name: value for name, value in rest.items() if value is not None})
        )
        if decoded.Records is not None:
            final_parsed["Records"] = _columns(decoded.Records)


class _GetRecordsFastParser(botocore.parsers.JSONParser):  # type: ignore[misc]  # botocore is untyped
    """botocore's parser for the "json" protocol, with Kinesis GetRecords' records decoded directly (and
    SubscribeToShard's, in its events)."""

    EVENT_STREAM_PARSER_CLS = _SubscribeToShardEventFastParser

    def _handle_json_body(self, raw_body: bytes, shape: botocore.model.Shape | None) -> Any:
        if not _is_kinesis_get_records(shape):
            return super()._handle_json_body(raw_body, shape)
        try:
            decoded = _BODY_DECODER.decode(raw_body)
        except msgspec.MsgspecError:
            return self._record_by_record(raw_body, shape)
        rest = {"NextShardIterator": decoded.NextShardIterator, "MillisBehindLatest": decoded.MillisBehindLatest}
        child_shards = msgspec.json.decode(decoded.ChildShards)
        if child_shards is not None:
            rest["ChildShards"] = child_shards
        parsed = self._parse_shape(shape, {name: value for name, value in rest.items() if value is not None})
        if decoded.Records is not None:
            parsed["Records"] = _columns(decoded.Records)
        return parsed

    def _record_by_record(self, raw_body: bytes, shape: botocore.model.Shape) -> Any:
        body = self._parse_body_as_json(raw_body)
        records = body.pop("Records", None) if isinstance(body, dict) else None
        parsed = self._parse_shape(shape, body)
        if records is not None:
            parsed["Records"] = [self._record(entry) for entry in records]
        return parsed

    def _record(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        # botocore leaves out members that are absent or null: so does this.
        record = {name: value for name, value in entry.items() if name in _KINESIS_RECORD_MEMBERS and value is not None}
        if "Data" in record:
            record["Data"] = binascii.a2b_base64(record["Data"])
        arrival = record.get("ApproximateArrivalTimestamp")
        if isinstance(arrival, int | float):  # Kinesis sends epoch seconds
            record["ApproximateArrivalTimestamp"] = datetime.fromtimestamp(arrival, UTC)
        elif arrival is not None:
            record["ApproximateArrivalTimestamp"] = self._timestamp_parser(arrival)
        return record


class FastGetRecordsParsers(botocore.parsers.ResponseParserFactory):  # type: ignore[misc]  # botocore is untyped
    """botocore's response parsers, with `_GetRecordsFastParser` for the "json" protocol."""

    def create_parser(self, protocol_name: str) -> botocore.parsers.ResponseParser:
        if protocol_name == "json":
            return _GetRecordsFastParser(**self._defaults)
        return super().create_parser(protocol_name)


@functools.cache
def _shared_session() -> boto3.Session:
    """One default session per process: creating one costs 50-200 ms (measured), a slot needs three clients."""
    return fast_parsing_session()


def fast_parsing_session() -> boto3.Session:
    """A boto3 session whose Kinesis clients decode GetRecords on the fast path."""
    core = botocore.session.get_session()
    core.register_component("response_parser_factory", FastGetRecordsParsers())
    return boto3.Session(botocore_session=core)


def client(service: str, config: ConsumerConfig, session: boto3.Session | None = None) -> Any:
    """A boto3 client whose retries are ours (botocore's own retrying is switched off)."""
    endpoint = getattr(config, f"aws_endpoint_url_{service}", None)
    botocore_config = botocore.config.Config(
        # `total_max_attempts`: botocore reads `max_attempts` here as retries after the first request.
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=10,
        read_timeout=60,
        max_pool_connections=64,
    )
    # Sessions are not thread-safe: clients are created from them one at a time.
    with _SESSION_LOCK:
        session = session or _shared_session()
        return session.client(service, region_name=config.aws_region, endpoint_url=endpoint, config=botocore_config)


class AwsCaller:
    """Calls one service with the retry policy and turns failures into lease_core errors."""

    def __init__(self, service: str, policy: RetryPolicy) -> None:
        self.service = service
        self.policy = policy

    def call(self, operation: str, function: Callable[[], T], table_name: str | None = None) -> T:
        attempts = 0

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            return function()

        try:
            return self.policy.call(attempt, is_retryable)
        except botocore.exceptions.ClientError as error:
            raise self.translate(operation, error, attempts, table_name) from error
        except TRANSPORT_ERRORS as error:
            raise DependencyError(self.service, operation, str(error), attempts) from error

    def translate(
        self, operation: str, error: botocore.exceptions.ClientError, attempts: int = 1, table_name: str | None = None
    ) -> Exception:
        """The lease_core error a failed call becomes (also for errors met outside `call`, such as an
        exception event in a stream)."""
        code = error_code(error) or "Unknown"
        message = error.response.get("Error", {}).get("Message", "")
        detail = f"{code}: {message}" if message else code
        if code == "ResourceNotFoundException" and table_name is not None:
            return TableNotFoundError(table_name)
        if code in THROTTLING_CODES:
            return ThrottledError(self.service, operation, detail, attempts)
        if is_retryable(error):
            return DependencyError(self.service, operation, detail, attempts)
        return AccessError(self.service, operation, detail)
