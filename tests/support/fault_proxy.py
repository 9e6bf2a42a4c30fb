"""A fault-injecting HTTP proxy in front of the AWS emulators, for fault tests of code we cannot wrap.

Spark executors build their own boto3 clients from endpoint URLs, so a fault-injecting client wrapper
(tests/support/faults.py) cannot reach them; pointing `AWS_ENDPOINT_URL_KINESIS` or
`AWS_ENDPOINT_URL_DYNAMODB` at a `FaultProxy` can. The proxy runs in a thread of the test process,
forwards every request to its upstream emulator, and lets a test replace answers with the failures
Kinesis and DynamoDB really produce:

- "throttle": HTTP 400 ProvisionedThroughputExceededException in the service's own error shape;
- "server_error": HTTP 500 InternalFailure (Kinesis) or InternalServerError (DynamoDB);
- "drop_request": the client connection closes and nothing reaches the emulator;
- "drop_response": the emulator applies the request, then the client connection closes unanswered,
  so the client cannot tell whether its write happened.

Faults apply only to requests whose X-Amz-Target names Kinesis or DynamoDB; the operation is the part
after the dot. Rule draws come from a seeded `random.Random`, so a sequential test sees the same
faults on every run.

`trim()` simulates retention, which kinesis-mock never applies. It rewrites or rejects
GetShardIterator requests only, so it applies to iterators obtained after `trim()`: iterators
obtained before keep reading the "aged out" records. `before` should be the sequence number of a
record the shard holds (the first record to keep), because rewritten requests ask kinesis-mock for
AT_SEQUENCE_NUMBER `before`.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from lease_core.emulators import LOOPBACK

FAULT_KINDS = frozenset({"throttle", "server_error", "drop_response", "drop_request"})
TRIM_MODES = frozenset({"reject", "skip"})
UPSTREAM_TIMEOUT_SECONDS = 60.0
# An idle keep-alive connection holds a handler thread until then; urllib3 notices the close and
# reconnects instead of sending on the dead connection.
IDLE_CONNECTION_SECONDS = 60.0
# Hop-by-hop headers describe one connection, so they are never relayed; Host and lengths are rewritten.
NOT_RELAYED = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
     "content-length", "host"}
)

Headers = list[tuple[str, str]]


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
    """How one JSON-protocol service spells its errors."""

    content_type: str
    throttle_type: str
    server_error_type: str


KINESIS = ServiceShape("application/x-amz-json-1.1", "ProvisionedThroughputExceededException", "InternalFailure")
DYNAMODB = ServiceShape(
    "application/x-amz-json-1.0",
    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
    "com.amazonaws.dynamodb.v20120810#InternalServerError",
)
SERVICES_BY_TARGET_PREFIX = {"Kinesis_20131202": KINESIS, "DynamoDB_20120810": DYNAMODB}


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


def fault_response(kind: str, service: ServiceShape, request: dict[str, Any]) -> HttpResponse:
    if kind == "server_error":
        return error_response(500, service, service.server_error_type, "Internal service error (injected)")
    if service is KINESIS:
        message = (f"Rate exceeded for shard {request.get('ShardId', '(from iterator)')} in stream "
                   f"{stream_name_of(request) or '(from iterator)'} (injected).")
    else:
        message = ("The level of configured provisioned throughput for the table was exceeded. "
                   "Consider increasing your provisioning level with the UpdateTable API. (injected)")
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
    message = (f"StartingSequenceNumber {starting} used in GetShardIterator on shard {request.get('ShardId')} in "
               f"stream {stream_name_of(request)} is no longer available (older than the trim horizon)")
    return error_response(400, KINESIS, "InvalidArgumentException", message)


class FaultProxy:
    """An HTTP proxy on a loopback port that forwards to `upstream` and injects the configured faults.

    The port is bound on construction, so `endpoint` is valid at once; `start()` begins serving.
    `stats()` counts "forwarded" (requests sent upstream, drop_response included), one
    "<kind>:<operation>" entry per injected fault, and "trim_rewrite:GetShardIterator" /
    "trim_reject:GetShardIterator" for the retention simulation.
    """

    def __init__(self, upstream: str, *, seed: int = 0) -> None:
        parts = urlsplit(upstream)
        self._upstream_host = parts.hostname or LOOPBACK
        self._upstream_port = parts.port or 80
        self._upstream_netloc = parts.netloc
        self._random = random.Random(seed)
        self._rules: tuple[FaultRule, ...] = ()
        self._trims: dict[tuple[str, str], Trim] = {}
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server = _ProxyServer(self)
        self.endpoint = f"http://{LOOPBACK}:{self._server.server_address[1]}"
        self._thread: threading.Thread | None = None

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fault-proxy {self.endpoint}",
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

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def respond(self, request: HttpRequest) -> HttpResponse | None:
        """The response for one client request, or None to close the connection without answering."""
        target = parse_target(dict((name.lower(), value) for name, value in request.headers).get("x-amz-target"))
        if target is None:
            return self._forward(request)
        service, operation = target
        fault = self._draw_fault(operation)
        if fault == "drop_request":
            return None
        if fault == "drop_response":
            self._forward(request)
            return None
        if fault is not None:
            return fault_response(fault, service, json.loads(request.body or b"{}"))
        if service is KINESIS and operation == "GetShardIterator":
            return self._get_shard_iterator(request)
        return self._forward(request)

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

    def _forward(self, request: HttpRequest) -> HttpResponse:
        """Send one request upstream on a fresh connection, so no stale keep-alive can swallow it."""
        self._count("forwarded")
        upstream = http.client.HTTPConnection(
            self._upstream_host, self._upstream_port, timeout=UPSTREAM_TIMEOUT_SECONDS
        )
        try:
            upstream.putrequest(request.method, request.path, skip_host=True, skip_accept_encoding=True)
            for name, value in [*request.headers, ("Host", self._upstream_netloc),
                                ("Content-Length", str(len(request.body)))]:
                upstream.putheader(name, value)
            upstream.endheaders(request.body)
            response = upstream.getresponse()
            headers = [(name, value) for name, value in response.getheaders() if name.lower() not in NOT_RELAYED]
            return HttpResponse(response.status, headers, response.read(), response.reason)
        except OSError as error:
            return HttpResponse(502, [("Content-Type", "text/plain")], f"upstream failed: {error}".encode())
        finally:
            upstream.close()


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

    def track(self, connection: socket.socket, is_open: bool) -> None:
        with self._open_lock:
            (self._open.add if is_open else self._open.discard)(connection)

    def close_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the client or the handler closed it first


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
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = [(name, value) for name, value in self.headers.items() if name.lower() not in NOT_RELAYED]
        response = self.server.proxy.respond(HttpRequest(self.command, self.path, headers, body))
        if response is None:
            self.close_connection = True
            return
        self.send_response_only(response.status, response.reason)
        for name, value in [*response.headers, ("Content-Length", str(len(response.body)))]:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)

    # No HEAD: its answer has a length but no body, which this relay does not model.
    do_GET = do_PUT = do_DELETE = do_PATCH = do_POST
