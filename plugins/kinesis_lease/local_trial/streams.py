"""Streams on a local Kinesis emulator: create one and wait until it can be written and read.

Kinesis (and kinesis-mock) answer CreateStream at once and make the stream ACTIVE a moment later;
until then it refuses writes and reshards (ResourceInUseException).
"""

from __future__ import annotations

import time
from typing import Any

ACTIVE_TIMEOUT_SECONDS = 30.0


def wait_until_active(client: Any, stream: str, timeout_seconds: float = ACTIVE_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream!r} not ACTIVE within {timeout_seconds:.0f} s")
        time.sleep(0.01)


def create_stream(client: Any, name: str, shard_count: int) -> None:
    client.create_stream(StreamName=name, ShardCount=shard_count)
    wait_until_active(client, name)
