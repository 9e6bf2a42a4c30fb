"""Encoding of AWS event-stream messages (`application/vnd.amazon.eventstream`), the framing of
SubscribeToShard's answer, for the Kinesis stand-in; botocore's `botocore.eventstream` decodes them.

A message is a prelude (total length, headers length, both big-endian uint32, and the CRC32 of those
8 bytes), the headers, the payload and the CRC32 of everything before it. A header is its name
(1-byte length, UTF-8), a value type byte and the value; only strings (type 7, 2-byte length) are
written here, which is all an answer of the JSON protocol carries. (smithy-aws-event-stream encodes
the format too but needs Python 3.12; awscrt's event stream is an RPC client, not an encoder.)
"""

from __future__ import annotations

import select
import socket
import struct
import zlib
from collections.abc import Mapping

STRING_HEADER = 7
JSON = "application/json"
MAX_PAYLOAD_BYTES = 24 * 1024 * 1024  # botocore's decoder refuses larger payloads
# The exceptions SubscribeToShard's event stream models (botocore raises them with their name).
SUBSCRIPTION_ERRORS = (
    "ResourceNotFoundException",
    "ResourceInUseException",
    "KMSDisabledException",
    "KMSInvalidStateException",
    "KMSAccessDeniedException",
    "KMSNotFoundException",
    "KMSOptInRequired",
    "KMSThrottlingException",
    "InternalFailureException",
)


def client_gone(connection: socket.socket) -> bool:
    """Whether a subscriber closed its connection (it sends nothing while it reads a stream)."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One message: prelude, string headers, payload and message CRC."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"an event-stream payload holds at most {MAX_PAYLOAD_BYTES} bytes, not {len(payload)}")
    encoded_headers = b"".join(_header(name, value) for name, value in headers.items())
    total = 12 + len(encoded_headers) + len(payload) + 4
    lengths = struct.pack("!II", total, len(encoded_headers))
    head = lengths + struct.pack("!I", zlib.crc32(lengths)) + encoded_headers
    crc = zlib.crc32(payload, zlib.crc32(head))
    return head + payload + struct.pack("!I", crc)


def event(event_type: str, payload: bytes) -> bytes:
    """An event message: `:event-type` names the member of the operation's event stream it fills."""
    return encode_message({":message-type": "event", ":event-type": event_type, ":content-type": JSON}, payload)


def exception(exception_type: str, payload: bytes) -> bytes:
    """A modelled error inside the stream: botocore raises it as an EventStreamError with this code."""
    headers = {":message-type": "exception", ":exception-type": exception_type, ":content-type": JSON}
    return encode_message(headers, payload)


def _header(name: str, value: str) -> bytes:
    encoded_name, encoded_value = name.encode(), value.encode()
    if len(encoded_name) > 255 or len(encoded_value) > 65535:
        raise ValueError(f"event-stream header {name!r} is too long")
    return (
        struct.pack("!B", len(encoded_name))
        + encoded_name
        + struct.pack("!BH", STRING_HEADER, len(encoded_value))
        + encoded_value
    )
