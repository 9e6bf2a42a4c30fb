"""Change records as Kinesis Data Streams for DynamoDB writes them to the stream, one JSON object each
(the DynamoDB developer guide, "Kinesis Data Streams for DynamoDB")."""

from __future__ import annotations

import json
from typing import Any


def change_record(
    event_name: str,
    keys: dict[str, Any],
    new_image: dict[str, Any] | None = None,
    old_image: dict[str, Any] | None = None,
    created_millis: int = 1764378000123,
    ttl_deletion: bool = False,
) -> bytes:
    change: dict[str, Any] = {"ApproximateCreationDateTime": created_millis, "Keys": keys, "SizeBytes": 42}
    if new_image is not None:
        change["NewImage"] = new_image
    if old_image is not None:
        change["OldImage"] = old_image
    record = {
        "awsRegion": "eu-west-1",
        "eventID": f"{event_name.lower()}-{json.dumps(keys, sort_keys=True)}",
        "eventName": event_name,
        "userIdentity": {"type": "Service", "principalId": "dynamodb.amazonaws.com"} if ttl_deletion else None,
        "recordFormat": "application/json",
        "tableName": "Orders",
        "dynamodb": change,
        "eventSource": "aws:dynamodb",
    }
    return json.dumps(record).encode()
