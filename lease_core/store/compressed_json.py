"""Maps kept in one coordinator-state attribute as zlib-compressed JSON.

As a DynamoDB map, 10,000 multi-stream lease keys (~57 bytes each) would pass the 400 KB item
limit, and every KB of a record is a write unit each time it is written; compressed, the keys'
common prefixes cost next to nothing (~6.5 bytes a lease).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any


def compress_map(values: Mapping[str, Any]) -> bytes:
    return zlib.compress(json.dumps(dict(values), separators=(",", ":"), sort_keys=True).encode(), 9)


def decompress_map(blob: bytes) -> dict[str, Any]:
    values = json.loads(zlib.decompress(blob))
    if not isinstance(values, dict):
        raise ValueError(f"expected a compressed JSON object, got {type(values).__name__}")
    return values
