"""When a shard's next GetRecords may go out: Kinesis' two read limits per shard, shared by every
polling reader of the shard.

At most 5 GetRecords per second, and `read_bytes_per_second` (2 MiB/s) of records. Kinesis charges a
response's bytes (data plus partition key) after serving it and refuses the shard's calls while it is
in debt, so after a response of B bytes the next call waits until B / rate has passed since this one
was sent. A reader that only kept to 5 calls/s would run into ProvisionedThroughputExceeded after
every large page and lose a retry-policy backoff each time; paced by bytes it reads at the cap and is
never refused.
"""

from __future__ import annotations

from collections.abc import Callable

# Kinesis' read limit per shard (shared by every reader of the shard).
KINESIS_SHARD_READ_BYTES_PER_SECOND = 2 * 1024 * 1024
# 5 GetRecords per second per shard, with 5 ms to spare: a call exactly 1 s after the fifth one
# before it is on the edge of Kinesis' second, and clock or network jitter puts it inside as often
# as not (measured on the stand-in: a throttled call, then a retry-policy backoff).
MIN_CALL_INTERVAL_SECONDS = 0.205


class ReadPacer:
    """One shard's calls as Kinesis counts them: `min_call_interval_seconds` apart, and the bytes read
    paid off at `read_bytes_per_second` (None: paced by calls only)."""

    def __init__(
        self, min_call_interval_seconds: float, read_bytes_per_second: float | None, clock: Callable[[], float]
    ) -> None:
        if read_bytes_per_second is not None and read_bytes_per_second <= 0:
            raise ValueError(f"read_bytes_per_second must be positive (or None: unpaced), not {read_bytes_per_second}")
        self._min_call_interval = min_call_interval_seconds
        self._read_rate = read_bytes_per_second
        self._clock = clock
        self._last_call_at: float | None = None
        # When the bytes read so far are paid off at the read rate: Kinesis refuses calls before.
        self._read_paid_at: float | None = None

    def next_call_at(self) -> float:
        """When the next GetRecords may go out (a value of the clock; now at the earliest)."""
        now = self._clock()
        if self._last_call_at is None:
            return now
        return max(now, self._last_call_at + self._min_call_interval, self._read_paid_at or now)

    def calling(self) -> float:
        """A call goes out now: Kinesis counts it when it arrives. The moment, for `charge`."""
        called_at = self._last_call_at = self._clock()
        return called_at

    def charge(self, called_at: float, size: int) -> None:
        """Account a response's `size` as Kinesis does (data plus partition keys,
        `KinesisRecordColumns.charged_bytes`), from the call's start."""
        if self._read_rate is None:
            return
        paid_at = called_at if self._read_paid_at is None else max(called_at, self._read_paid_at)
        self._read_paid_at = paid_at + size / self._read_rate
