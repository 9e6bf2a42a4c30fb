"""Retrying AWS calls: capped exponential backoff with full jitter."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a call that failed for a retryable reason.

    Delay before retry n (1-based) is uniform in [0, min(max, base * 2^(n-1))]: full jitter spreads
    a crowd of throttled workers instead of having them retry in lock-step.
    """

    attempts: int = 6
    base_millis: int = 50
    max_millis: int = 5000
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    # Runs before every retry and may raise to stop retrying (a leader checks it still holds its lock).
    before_retry: Callable[[], None] = field(default=lambda: None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("a retry policy needs at least one attempt")

    def delay_seconds(self, retry_number: int) -> float:
        ceiling = min(self.max_millis, self.base_millis * 2 ** (retry_number - 1))
        return self.rng.uniform(0, ceiling) / 1000.0

    def call(self, operation: Callable[[], T], is_retryable: Callable[[Exception], bool]) -> T:
        """Run `operation`, retrying retryable failures; the last failure propagates unchanged."""
        for attempt in range(1, self.attempts + 1):
            try:
                return operation()
            except Exception as error:
                if attempt == self.attempts or not is_retryable(error):
                    raise
                self.sleep(self.delay_seconds(attempt))
                self.before_retry()
        raise AssertionError("unreachable: the loop returns or raises")
