"""A fault-injecting HTTP proxy in front of the AWS emulators, for fault tests (and the fault campaign,
bench/chaos) of code we cannot wrap.

Spark executors build their own boto3 clients from endpoint URLs, so a fault-injecting client wrapper
(tests/support/faults.py) cannot reach them; pointing `AWS_ENDPOINT_URL_KINESIS` or
`AWS_ENDPOINT_URL_DYNAMODB` at a `FaultProxy` can. The proxy runs in a thread of the calling process,
forwards every request to its upstream emulator, and lets a test replace answers with the failures
Kinesis and DynamoDB really produce:

- "throttle": HTTP 400 ProvisionedThroughputExceededException in the service's own error shape;
- "server_error": HTTP 500 InternalFailure (Kinesis) or InternalServerError (DynamoDB);
- "drop_request": the client connection closes and nothing reaches the emulator;
- "drop_response": the emulator applies the request, then the client connection closes unanswered,
  so the client cannot tell whether its write happened.

Faults apply only to requests whose X-Amz-Target names Kinesis, DynamoDB, Glue or CloudWatch; the
operation is the part after the dot. Rule draws come from a seeded `random.Random`, so a sequential
test sees the same faults on every run.

Every call is recorded (`calls()`): for Kinesis, DynamoDB, Glue and CloudWatch the operation and the
resources its body names (tables, index, stream, database, metrics namespace; a GetRecords or a
paged ListShards names its stream through the iterator or token an earlier answer handed out), for
S3 (REST, no X-Amz-Target) the operation that the method, bucket, key and query make (and a
DeleteObjects' keys, from its body). tests/support/iam_policy.py turns them into IAM requests.

`end_shards_after_last_records()` makes closed shards end as the GetRecords documentation describes
real Kinesis, which kinesis-mock does not: kinesis-mock answers a closed shard's last records with
the null NextShardIterator and the ChildShards; through the proxy, that answer carries a next
iterator of the proxy's own (and MillisBehindLatest 0) instead, and only the call with it answers no
records, the null iterator and the ChildShards. Reshard tests run against both behaviours this way.

`serve_subscriptions()` answers SubscribeToShard itself (devtools/subscription_bridge.py), from
kinesis-mock's GetShardIterator and GetRecords through this proxy's own rewrites (trims, late shard
ends): kinesis-mock's answer cannot be read by boto3. `subscriptions()` is the bridge, for its faults.

`age_listings()` makes S3 listings report every object as written that much earlier: moto has no
clock to move, and upkeep that removes only old files (an Iceberg table's orphans) lists them.

`trim()` simulates retention, which kinesis-mock never applies. It rewrites or rejects
GetShardIterator requests only, so it applies to iterators obtained after `trim()`: iterators
obtained before keep reading the "aged out" records. `before` should be the sequence number of a
record the shard holds (the first record to keep), because rewritten requests ask kinesis-mock for
AT_SEQUENCE_NUMBER `before`.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import random
import re
import socket
import struct
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit
from xml.etree import ElementTree

from devtools import event_stream
from devtools.emulators import LOOPBACK
from devtools.subscription_bridge import SubscriptionBridge, SubscriptionRefused, SubscriptionReset

FAULT_KINDS = frozenset({"throttle", "server_error", "drop_response", "drop_request"})
TRIM_MODES = frozenset({"reject", "skip"})
# The shard iterators the proxy hands out for the call that answers a closed shard's end.
SHARD_END_ITERATOR_PREFIX = "fault-proxy-shard-end:"
# The `stats()` entry counting the closed shards' ends the proxy answered one call late.
LATE_SHARD_END_STAT = "late_shard_end:GetRecords"
UPSTREAM_TIMEOUT_SECONDS = 60.0
# An idle keep-alive connection holds a handler thread until then; urllib3 notices the close and
# reconnects instead of sending on the dead connection.
IDLE_CONNECTION_SECONDS = 60.0
# Hop-by-hop headers describe one connection, so they are never relayed; Host and lengths are rewritten.
# Expect: 100-continue is answered by this proxy's own server; the body is relayed whole.
NOT_RELAYED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
        "expect",
    }
)

Headers = list[tuple[str, str]]
# The headers a subscriber's request lends to the bridge's own calls (kinesis-mock requires a signature).
SIGNING = frozenset({"authorization", "x-amz-date", "x-amz-security-token"})


@dataclass(frozen=True)
class FaultRule:
    """Give `kind` to a share of the requests for `operation` (an X-Amz-Target operation; None = any)."""

    kind: str
    share: float
    operation: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {sorted(FAULT_KINDS)}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {self.share}")

    def matches(self, operation: str) -> bool:
        return self.operation is None or self.operation == operation


@dataclass(frozen=True)
class ServiceShape:
    """How one JSON-protocol service spells its errors, and its name in IAM."""

    content_type: str
    throttle_type: str
    server_error_type: str
    name: str = ""


KINESIS = ServiceShape(
    "application/x-amz-json-1.1", "ProvisionedThroughputExceededException", "InternalFailure", "kinesis"
)
DYNAMODB = ServiceShape(
    "application/x-amz-json-1.0",
    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
    "com.amazonaws.dynamodb.v20120810#InternalServerError",
    "dynamodb",
)
GLUE = ServiceShape("application/x-amz-json-1.1", "ThrottlingException", "InternalServiceException", "glue")
# CloudWatch as botocore calls it: its JSON 1.0 protocol (the service also takes CBOR and query).
CLOUDWATCH = ServiceShape("application/x-amz-json-1.0", "ThrottlingException", "InternalServiceFault", "cloudwatch")
SERVICES_BY_TARGET_PREFIX = {
    "Kinesis_20131202": KINESIS,
    "DynamoDB_20120810": DYNAMODB,
    "AWSGlue": GLUE,
    "GraniteServiceVersion20100801": CLOUDWATCH,
}
# The S3 listings `age_listings` rewrites, and how they spell an object's time.
S3_LISTINGS = frozenset({"ListObjects", "ListObjectsV2"})
_LAST_MODIFIED = re.compile(rb"<LastModified>([^<]+)</LastModified>")


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: Headers  # without hop-by-hop headers, Host and Content-Length
    body: bytes


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Headers  # without hop-by-hop headers and Content-Length
    body: bytes
    reason: str | None = None
    # What Content-Length announces when it is not the body's length: a HEAD answer has none.
    content_length: int | None = None
    # An event stream's messages instead of a body (sent chunked), given a test of whether the client left.
    events: Callable[[Callable[[], bool]], Iterator[bytes]] | None = None


@dataclass(frozen=True)
class RecordedCall:
    """One call a client made through the proxy, with the resources it names.

    `status` is the HTTP status the client got (None: the connection was closed unanswered).
    JSON services: `tables` (TableName, or the tables of a batch or transaction; a ResourceArn's
    table; a Glue call's table), `index` (IndexName), `stream` (StreamName/StreamARN, or the stream
    of the iterator or NextToken; None when the proxy never saw it handed out), `database` (a Glue
    call's database), `namespace` (a CloudWatch call's Namespace), `parameters` (the body's top-
    level names), `transaction` (a TransactWriteItems' parts as (kind, table): Put, Update, Delete,
    ConditionCheck). S3: `method`, `bucket`, `key` and `query` (name/value pairs, sorted),
    `conditions` (its If-None-Match and If-Match headers: how a writer asks S3 to refuse a put that
    would replace what another wrote), `keys` (the objects a DeleteObjects names in its body: S3
    authorizes the deletion of each).
    """

    service: str
    operation: str
    status: int | None
    tables: tuple[str, ...] = ()
    index: str | None = None
    stream: str | None = None
    parameters: tuple[str, ...] = ()
    transaction: tuple[tuple[str, str], ...] = ()
    database: str | None = None
    method: str | None = None
    bucket: str | None = None
    key: str | None = None
    query: tuple[tuple[str, str], ...] = ()
    conditions: tuple[tuple[str, str], ...] = ()
    keys: tuple[str, ...] = ()
    namespace: str | None = None


@dataclass(frozen=True)
class Trim:
    before: int
    mode: str


def error_response(status: int, service: ServiceShape, error_type: str, message: str) -> HttpResponse:
    headers = [("Content-Type", service.content_type), ("x-amzn-RequestId", str(uuid.uuid4()))]
    return HttpResponse(status, headers, json.dumps({"__type": error_type, "message": message}).encode())


def parse_target(target: str | None) -> tuple[ServiceShape, str] | None:
    """The service and operation an X-Amz-Target header names, or None for anything else."""
    prefix, _, operation = (target or "").partition(".")
    service = SERVICES_BY_TARGET_PREFIX.get(prefix)
    return None if service is None or not operation else (service, operation)


def stream_name_of(request: dict[str, Any]) -> str | None:
    """The stream a Kinesis request names, by StreamName or by StreamARN (`...:stream/NAME`)."""
    if "StreamName" in request:
        return request["StreamName"]
    arn = request.get("StreamARN")
    return arn.rpartition("stream/")[2] if arn else None


def tables_named(request: dict[str, Any]) -> tuple[str, ...]:
    """The tables a DynamoDB request names: TableName, a batch's RequestItems, a transaction's items, a ResourceArn."""
    names: list[str] = []
    if isinstance(request.get("TableName"), str):
        names.append(request["TableName"])
    if isinstance(request.get("RequestItems"), dict):
        names.extend(request["RequestItems"])
    for entry in request.get("TransactItems") or ():
        names.extend(part["TableName"] for part in entry.values() if isinstance(part, dict) and "TableName" in part)
    arn = request.get("ResourceArn")
    if isinstance(arn, str) and ":table/" in arn:
        names.append(arn.split(":table/", 1)[1].split("/", 1)[0])
    return tuple(dict.fromkeys(names))


def glue_names(request: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """The database and the tables a Glue request names: a table call names its database by
    DatabaseName and its table by Name, TableName or TableInput.Name; a database call (GetDatabase,
    CreateDatabase) names its database by Name or DatabaseInput.Name."""
    if isinstance(request.get("DatabaseName"), str):
        table = request.get("Name") or request.get("TableName") or _input_name(request.get("TableInput"))
        return request["DatabaseName"], (table,) if isinstance(table, str) else ()
    database = request.get("Name") or _input_name(request.get("DatabaseInput"))
    return (database if isinstance(database, str) else None), ()


def _text(request: dict[str, Any], name: str) -> str | None:
    value = request.get(name)
    return value if isinstance(value, str) else None


def _input_name(value: Any) -> Any:
    """The Name of a Glue TableInput or DatabaseInput; None for anything else."""
    return value.get("Name") if isinstance(value, dict) else None


def s3_operation(method: str, key: str | None, query: dict[str, str], headers: dict[str, str]) -> str:
    """The S3 API operation a REST request is (path-style: /bucket/key), by method, key and query."""
    if key is None:
        bucket_operations = {
            "HEAD": "HeadBucket",
            "PUT": "CreateBucket",
            "DELETE": "DeleteBucket",
            "POST": "DeleteObjects" if "delete" in query else "PostBucket",
        }
        if method == "GET":
            for name, operation in (
                ("location", "GetBucketLocation"),
                ("uploads", "ListMultipartUploads"),
                ("versions", "ListObjectVersions"),
                ("list-type", "ListObjectsV2"),
            ):
                if name in query:
                    return operation
            return "ListObjects"
        return bucket_operations.get(method, f"{method}Bucket")
    if method == "HEAD":
        return "HeadObject"
    if method == "GET":
        return "ListParts" if "uploadId" in query else "GetObjectTagging" if "tagging" in query else "GetObject"
    if method == "PUT":
        if "uploadId" in query:
            return "UploadPartCopy" if "x-amz-copy-source" in headers else "UploadPart"
        if "tagging" in query:
            return "PutObjectTagging"
        return "CopyObject" if "x-amz-copy-source" in headers else "PutObject"
    if method == "POST":
        return (
            "CreateMultipartUpload"
            if "uploads" in query
            else "CompleteMultipartUpload"
            if "uploadId" in query
            else "PostObject"
        )
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    return f"{method}Object"


def deleted_keys(body: bytes) -> tuple[str, ...]:
    """The object keys a DeleteObjects request body (`<Delete><Object><Key>...`) names; () when it is no such XML."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return ()
    return tuple(element.text or "" for element in root.iter() if element.tag.rpartition("}")[2] == "Key")


def fault_response(kind: str, service: ServiceShape, request: dict[str, Any]) -> HttpResponse:
    if kind == "server_error":
        return error_response(500, service, service.server_error_type, "Internal service error (injected)")
    if service in (GLUE, CLOUDWATCH):
        return error_response(400, service, service.throttle_type, "Rate exceeded (injected)")
    if service is KINESIS:
        message = (
            f"Rate exceeded for shard {request.get('ShardId', '(from iterator)')} in stream "
            f"{stream_name_of(request) or '(from iterator)'} (injected)."
        )
    else:
        message = (
            "The level of configured provisioned throughput for the table was exceeded. "
            "Consider increasing your provisioning level with the UpdateTable API. (injected)"
        )
    return error_response(400, service, service.throttle_type, message)


def apply_trim(request: dict[str, Any], trim: Trim) -> dict[str, Any] | HttpResponse:
    """A GetShardIterator request as the trimmed shard would serve it, or the rejection it earns."""
    kind = request.get("ShardIteratorType")
    at_trim_point = {**request, "ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": str(trim.before)}
    if kind == "TRIM_HORIZON":
        return at_trim_point
    starting = request.get("StartingSequenceNumber")
    if kind not in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER") or starting is None or int(starting) >= trim.before:
        return request
    if trim.mode == "skip":
        return at_trim_point
    message = (
        f"StartingSequenceNumber {starting} used in GetShardIterator on shard {request.get('ShardId')} in "
        f"stream {stream_name_of(request)} is no longer available (older than the trim horizon)"
    )
    return error_response(400, KINESIS, "InvalidArgumentException", message)


class FaultProxy:
    """An HTTP proxy on a loopback port that forwards to `upstream` and injects the configured faults.

    The port is bound on construction, so `endpoint` is valid at once; `start()` begins serving.
    `stats()` counts "forwarded" (requests sent upstream, drop_response included), one
    "<kind>:<operation>" entry per injected fault, and "trim_rewrite:GetShardIterator" /
    "trim_reject:GetShardIterator" for the retention simulation. `calls()` lists every request a
    client made, answered or not, as a `RecordedCall`, in the order the answers were decided.
    """

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        parts = urlsplit(upstream)
        self._upstream_host = parts.hostname or LOOPBACK
        self._upstream_port = parts.port or 80
        self._upstream_netloc = parts.netloc
        self._random = random.Random(seed)
        self._rules: tuple[FaultRule, ...] = ()
        self._trims: dict[tuple[str, str], Trim] = {}
        self._late_shard_ends = False
        self._listing_age = timedelta(0)
        self._shard_ends: dict[str, list[Any]] = {}  # an iterator of ours -> the ChildShards its call answers
        self._counts: Counter[str] = Counter()
        self._calls: list[RecordedCall] = []
        # Which stream handed out a shard iterator or a ListShards NextToken: their later calls name no stream.
        self._stream_of_token: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server = _ProxyServer(self)
        self.endpoint = f"http://{LOOPBACK}:{self._server.server_address[1]}"
        self._thread: threading.Thread | None = None
        self._bridge: SubscriptionBridge | None = None

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fault-proxy {self.endpoint}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, free the port, and end the open client connections so no handler thread lingers."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
        self._server.close_connections()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def set_faults(self, rules: Sequence[FaultRule]) -> None:
        """Replace the rules; the first matching rule whose draw hits decides a request. [] passes all."""
        with self._lock:
            self._rules = tuple(rules)

    def trim(self, stream_name: str, shard_id: str, before_sequence_number: str, mode: str = "reject") -> None:
        """Age out the shard's records below `before_sequence_number` for iterators obtained from now on.

        TRIM_HORIZON starts at `before_sequence_number`; AT_/AFTER_SEQUENCE_NUMBER below it is
        rejected with InvalidArgumentException ("reject") or moved up to it ("skip").
        """
        if mode not in TRIM_MODES:
            raise ValueError(f"unknown trim mode {mode!r}; expected one of {sorted(TRIM_MODES)}")
        with self._lock:
            self._trims[(stream_name, shard_id)] = Trim(int(before_sequence_number), mode)

    def end_shards_after_last_records(self, enabled: bool = True) -> None:
        """Answer a closed shard's end one call after its last records, as real Kinesis may (module doc)."""
        with self._lock:
            self._late_shard_ends = enabled

    def serve_subscriptions(self, **options: Any) -> SubscriptionBridge:
        """Answer SubscribeToShard from the upstream's polling API (module doc); `options` are the bridge's."""
        self._bridge = SubscriptionBridge(self._internal_kinesis_call, **options)
        return self._bridge

    def subscriptions(self) -> SubscriptionBridge | None:
        return self._bridge

    def age_listings(self, by: timedelta) -> None:
        """S3 listings from now on report every object's LastModified `by` earlier (module doc)."""
        with self._lock:
            self._listing_age = by

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def calls(self) -> list[RecordedCall]:
        with self._lock:
            return list(self._calls)

    def respond(self, request: HttpRequest) -> HttpResponse | None:
        """The response for one client request, or None to close the connection without answering."""
        headers = {name.lower(): value for name, value in request.headers}
        target = parse_target(headers.get("x-amz-target"))
        if target is None:
            forwarded = self._forward(request)
            call = self._rest_call(request, headers, forwarded)
            self._record(call)
            return self._aged(forwarded) if call.operation in S3_LISTINGS else forwarded
        service, operation = target
        response = self._respond_json(request, service, operation)
        self._record(self._json_call(request, service, operation, response))
        return response

    def _respond_json(self, request: HttpRequest, service: ServiceShape, operation: str) -> HttpResponse | None:
        fault = self._draw_fault(operation)
        if fault == "drop_request":
            return None
        if fault == "drop_response":
            self._forward(request)
            return None
        if fault is not None:
            return fault_response(fault, service, _request_object(request))
        if service is KINESIS and operation == "GetShardIterator":
            return self._get_shard_iterator(request)
        if service is KINESIS and operation == "GetRecords":
            return self._get_records(request)
        if service is KINESIS and operation == "SubscribeToShard" and self._bridge is not None:
            return self._subscribe(request, self._bridge)
        return self._forward(request)

    def _subscribe(self, request: HttpRequest, bridge: SubscriptionBridge) -> HttpResponse:
        try:
            authorization = tuple((name, value) for name, value in request.headers if name.lower() in SIGNING)
            events = bridge.subscribe(_json_object(request.body), authorization)
        except SubscriptionRefused as refused:
            return error_response(400, KINESIS, refused.error_type, refused.message)
        headers = [("Content-Type", "application/vnd.amazon.eventstream"), ("x-amzn-RequestId", uuid.uuid4().hex)]
        return HttpResponse(200, headers, b"", events=events)

    def _internal_kinesis_call(
        self, operation: str, body: dict[str, Any], signing: Sequence[tuple[str, str]]
    ) -> tuple[int, dict[str, Any]]:
        """A Kinesis call of the bridge's, through the proxy's rewrites but none of its drawn faults."""
        headers = [
            ("X-Amz-Target", f"Kinesis_20131202.{operation}"),
            ("Content-Type", KINESIS.content_type),
            *signing,
        ]
        request = HttpRequest("POST", "/", headers, json.dumps(body).encode())
        if operation == "GetShardIterator":
            response = self._get_shard_iterator(request)
        elif operation == "GetRecords":
            response = self._get_records(request)
        else:
            response = self._forward(request)
        return response.status, _json_object(response.body)

    def _get_records(self, request: HttpRequest) -> HttpResponse:
        iterator = str(_json_object(request.body).get("ShardIterator", ""))
        if iterator.startswith(SHARD_END_ITERATOR_PREFIX):
            with self._lock:
                children = self._shard_ends.get(iterator)
            if children is None:
                return error_response(400, KINESIS, "ExpiredIteratorException", "Iterator expired (fault proxy).")
            self._count(LATE_SHARD_END_STAT)
            body = {"Records": [], "MillisBehindLatest": 0, "ChildShards": children}
            return HttpResponse(200, [("Content-Type", KINESIS.content_type)], json.dumps(body).encode())
        response = self._forward(request)
        with self._lock:
            late = self._late_shard_ends
        answer = _json_object(response.body) if late and response.status == 200 else {}
        if not answer.get("Records") or answer.get("NextShardIterator") is not None:
            return response
        # The shard's last records, with its end: the end waits for the next call.
        token = f"{SHARD_END_ITERATOR_PREFIX}{uuid.uuid4().hex}"
        with self._lock:
            self._shard_ends[token] = list(answer.pop("ChildShards", None) or [])
        answer.update(NextShardIterator=token, MillisBehindLatest=0)
        headers = [(name, value) for name, value in response.headers if name.lower() != "x-amz-crc32"]
        return replace(response, headers=headers, body=json.dumps(answer).encode())

    def _get_shard_iterator(self, request: HttpRequest) -> HttpResponse:
        asked = json.loads(request.body)
        with self._lock:
            trim = self._trims.get((stream_name_of(asked) or "", asked.get("ShardId", "")))
        served = asked if trim is None else apply_trim(asked, trim)
        if isinstance(served, HttpResponse):
            self._count("trim_reject:GetShardIterator")
            return served
        if served is asked:
            return self._forward(request)
        self._count("trim_rewrite:GetShardIterator")
        return self._forward(replace(request, body=json.dumps(served).encode()))

    def _aged(self, listing: HttpResponse) -> HttpResponse:
        with self._lock:
            age = self._listing_age
        if not age or listing.status != 200:
            return listing

        def earlier(match: re.Match[bytes]) -> bytes:
            written = datetime.fromisoformat(match[1].decode()) - age
            return b"<LastModified>%sZ</LastModified>" % written.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3].encode()

        return replace(listing, body=_LAST_MODIFIED.sub(earlier, listing.body))

    def _draw_fault(self, operation: str) -> str | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(operation) and self._random.random() < rule.share:
                    self._counts[f"{rule.kind}:{operation}"] += 1
                    return rule.kind
        return None

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def _record(self, call: RecordedCall) -> None:
        with self._lock:
            self._calls.append(call)

    def _json_call(
        self, request: HttpRequest, service: ServiceShape, operation: str, response: HttpResponse | None
    ) -> RecordedCall:
        body = _request_object(request)
        stream = self._stream_of(body, response) if service is KINESIS else None
        database, glue_tables = glue_names(body) if service is GLUE else (None, ())
        return RecordedCall(
            service=service.name,
            operation=operation,
            status=None if response is None else response.status,
            tables=tables_named(body) if service is DYNAMODB else glue_tables,
            index=body.get("IndexName") if isinstance(body.get("IndexName"), str) else None,
            stream=stream,
            parameters=tuple(sorted(body)),
            transaction=tuple(
                (kind, part["TableName"])
                for entry in body.get("TransactItems") or ()
                for kind, part in entry.items()
                if isinstance(part, dict) and "TableName" in part
            ),
            database=database,
            namespace=body.get("Namespace")
            if service is CLOUDWATCH and isinstance(body.get("Namespace"), str)
            else None,
        )

    def _stream_of(self, body: dict[str, Any], response: HttpResponse | None) -> str | None:
        """The stream a Kinesis call is about; remembers the iterators and tokens its answer hands out."""
        stream = stream_name_of(body)
        with self._lock:
            token = body.get("ShardIterator") or body.get("NextToken")
            if stream is None and isinstance(token, str):
                stream = self._stream_of_token.get(token)
            if stream is not None and response is not None and response.status == 200:
                answer = _json_object(response.body)
                for name in ("ShardIterator", "NextShardIterator", "NextToken"):
                    if isinstance(answer.get(name), str):
                        self._stream_of_token[answer[name]] = stream
        return stream

    @staticmethod
    def _rest_call(request: HttpRequest, headers: dict[str, str], response: HttpResponse) -> RecordedCall:
        parts = urlsplit(request.path)
        bucket, _, key = parts.path.lstrip("/").partition("/")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        object_key = unquote(key) if key else None
        operation = s3_operation(request.method, object_key if bucket else None, query, headers)
        return RecordedCall(
            service="s3",
            operation=operation,
            status=response.status,
            method=request.method,
            bucket=unquote(bucket) or None,
            key=object_key,
            query=tuple(sorted(query.items())),
            conditions=tuple((name, headers[name]) for name in ("if-match", "if-none-match") if name in headers),
            keys=deleted_keys(request.body) if operation == "DeleteObjects" else (),
        )

    def _forward(self, request: HttpRequest) -> HttpResponse:
        """Send one request upstream on a fresh connection, so no stale keep-alive can swallow it."""
        self._count("forwarded")
        upstream = http.client.HTTPConnection(
            self._upstream_host, self._upstream_port, timeout=UPSTREAM_TIMEOUT_SECONDS
        )
        try:
            upstream.putrequest(request.method, request.path, skip_host=True, skip_accept_encoding=True)
            for name, value in [
                *request.headers,
                ("Host", self._upstream_netloc),
                ("Content-Length", str(len(request.body))),
            ]:
                upstream.putheader(name, value)
            upstream.endheaders(request.body)
            response = upstream.getresponse()
            headers = [(name, value) for name, value in response.getheaders() if name.lower() not in NOT_RELAYED]
            announced = response.getheader("Content-Length") if request.method == "HEAD" else None
            return HttpResponse(
                response.status,
                headers,
                response.read(),
                response.reason,
                content_length=None if announced is None else int(announced),
            )
        except OSError as error:
            return HttpResponse(502, [("Content-Type", "text/plain")], f"upstream failed: {error}".encode())
        finally:
            upstream.close()


def _request_object(request: HttpRequest) -> dict[str, Any]:
    """A JSON request's body as a dict (`_json_object`), unzipped when the client compressed it (botocore
    gzips a large CloudWatch PutMetricData)."""
    encoding = next((value for name, value in request.headers if name.lower() == "content-encoding"), "")
    if encoding.strip().lower() != "gzip":
        return _json_object(request.body)
    try:
        return _json_object(gzip.decompress(request.body))
    except (OSError, EOFError):
        return {}


def _json_object(body: bytes) -> dict[str, Any]:
    """A JSON request or answer body as a dict; anything else (empty, not JSON, not an object) as {}."""
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _ProxyServer(ThreadingHTTPServer):
    """One thread per client connection; remembers the open connections so `stop()` can end them."""

    daemon_threads = True
    # Spark executors open many pooled connections at once; the default backlog of 5 drops SYNs.
    request_queue_size = 128

    def __init__(self, proxy: FaultProxy) -> None:
        super().__init__((LOOPBACK, 0), _ProxyHandler)
        self.proxy = proxy
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away (a killed process, a reset connection) is no error of the proxy's.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def track(self, connection: socket.socket, is_open: bool) -> None:
        with self._open_lock:
            (self._open.add if is_open else self._open.discard)(connection)

    def close_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):  # the client or the handler closed it first
                connection.shutdown(socket.SHUT_RDWR)


class _ProxyHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps boto3's pooled connections alive between requests.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the client's delayed ACK adds ~40 ms to each answer.
    disable_nagle_algorithm = True
    timeout = IDLE_CONNECTION_SECONDS
    server: _ProxyServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, is_open=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, is_open=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per request on stderr would drown the test output

    def do_POST(self) -> None:
        headers = [(name, value) for name, value in self.headers.items() if name.lower() not in NOT_RELAYED]
        response = self.server.proxy.respond(HttpRequest(self.command, self.path, headers, self._read_body()))
        if response is None:
            self.close_connection = True
            return
        if response.events is not None:
            self._stream_events(response)
            return
        length = len(response.body) if response.content_length is None else response.content_length
        self.send_response_only(response.status, response.reason)
        for name, value in [*response.headers, ("Content-Length", str(length))]:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":  # a HEAD answer announces the object's length and sends no body
            self.wfile.write(response.body)

    def _stream_events(self, response: HttpResponse) -> None:
        """An event stream's answer: HTTP/1.1 chunks, one message each, as they come; a reset fault closes
        the connection with a TCP reset instead of the body's end."""
        assert response.events is not None
        self.send_response_only(response.status, response.reason)
        for name, value in [*response.headers, ("Transfer-Encoding", "chunked")]:
            self.send_header(name, value)
        self.end_headers()
        try:
            for message in response.events(lambda: event_stream.client_gone(self.connection)):
                self.wfile.write(b"%x\r\n%b\r\n" % (len(message), message))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except SubscriptionReset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
        except OSError:  # the subscriber went away
            self.close_connection = True

    def _read_body(self) -> bytes:
        """The request body, whole: by Content-Length, or decoded from chunked transfer encoding."""
        if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after the chunk
        while self.rfile.readline().strip():
            pass  # trailer lines, up to the empty line that ends the body
        return b"".join(chunks)

    do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_POST
