"""CloudWatch Logs subscription records as a subscription filter writes them to Kinesis: a gzip'd JSON
envelope per record (the format of the CloudWatch Logs user guide, "Subscription filters")."""

from __future__ import annotations

import gzip
import json

CONTROL_MESSAGE = {
    "messageType": "CONTROL_MESSAGE",
    "owner": "CloudwatchLogs",
    "logGroup": "",
    "logStream": "",
    "subscriptionFilters": [],
    "logEvents": [
        {
            "id": "",
            "timestamp": 1764378000000,
            "message": "CWL CONTROL MESSAGE: Checking health of destination Kinesis stream.",
        }
    ],
}


def log_events(group: str, first: int, count: int) -> list[dict[str, object]]:
    """`count` events with ids unique over `first`, as CloudWatch Logs numbers them (56 digits)."""
    return [
        {"id": f"{first + n:056d}", "timestamp": 1764378000000 + first + n, "message": f"{group} event {first + n}"}
        for n in range(count)
    ]


def data_message(group: str, stream: str, events: list[dict[str, object]]) -> bytes:
    envelope = {
        "messageType": "DATA_MESSAGE",
        "owner": "123456789012",
        "logGroup": group,
        "logStream": stream,
        "subscriptionFilters": ["to-kinesis"],
        "logEvents": events,
    }
    return gzip.compress(json.dumps(envelope).encode())


def control_message() -> bytes:
    return gzip.compress(json.dumps(CONTROL_MESSAGE).encode())
