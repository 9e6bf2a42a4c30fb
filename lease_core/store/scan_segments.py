"""How many segments a parallel scan of the lease table uses (docs/protocol.md §1.5)."""

from __future__ import annotations

import math

BYTES_PER_SEGMENT = 0.2 * 1024**3
MAX_SEGMENTS = 32
SEGMENTS_WHEN_SIZE_UNKNOWN = 10
SEGMENT_COUNT_CACHE_SECONDS = 2 * 60 * 60


def scan_segment_count(table_size_bytes: int | None, configured: int = 0, last_known: int | None = None) -> int:
    """A configured count wins; otherwise one segment per 0.2 GiB of table, clamped to [1, 32].

    When the table size cannot be read, the last computed count is reused, or 10.
    """
    if configured > 0:
        return configured
    if table_size_bytes is None:
        return last_known if last_known is not None else SEGMENTS_WHEN_SIZE_UNKNOWN
    return max(1, min(MAX_SEGMENTS, math.ceil(table_size_bytes / BYTES_PER_SEGMENT)))
