"""The event-stream encoder of the Kinesis stand-in (devtools/event_stream.py), read back by
botocore's own decoder, the one boto3 reads SubscribeToShard with."""

from __future__ import annotations

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from devtools.event_stream import encode_message, event, exception


def decoded(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(message.headers, message.payload) for message in buffer]


@pytest.mark.parametrize(
    ("message", "headers", "payload"),
    [
        pytest.param(
            event("initial-response", b"{}"),
            {":message-type": "event", ":event-type": "initial-response", ":content-type": "application/json"},
            b"{}",
            id="event",
        ),
        pytest.param(
            exception("ResourceInUseException", b'{"message":"taken over"}'),
            {
                ":message-type": "exception",
                ":exception-type": "ResourceInUseException",
                ":content-type": "application/json",
            },
            b'{"message":"taken over"}',
            id="exception",
        ),
        pytest.param(encode_message({}, b""), {}, b"", id="empty"),
        pytest.param(
            encode_message({"ü": "é" * 300}, b"x" * 3_000_000), {"ü": "é" * 300}, b"x" * 3_000_000, id="large"
        ),
    ],
)
def test_botocore_decodes_what_the_encoder_writes(message, headers, payload):
    assert decoded(message) == [(headers, payload)]


def test_messages_split_anywhere_are_decoded_once_whole():
    stream = event("SubscribeToShardEvent", b'{"Records":[]}') * 3
    buffer = EventStreamBuffer()
    messages = []
    for start in range(0, len(stream), 7):
        buffer.add_data(stream[start : start + 7])
        messages.extend(buffer)
    assert [message.payload for message in messages] == [b'{"Records":[]}'] * 3


@pytest.mark.parametrize("offset", [pytest.param(5, id="prelude"), pytest.param(-6, id="payload")])
def test_a_corrupted_byte_fails_a_checksum(offset):
    message = bytearray(event("SubscribeToShardEvent", b'{"Records":[]}'))
    message[offset] ^= 0x01
    with pytest.raises(ChecksumMismatch):
        decoded(bytes(message))
