"""Lease throughput for batch rounds (kcl-spec.md §7, adapted; DESIGN.md §4).

KCL samples delivered bytes over a sliding window of one renewer interval and keeps an EMA that the
renewer stores in `throughputKBps`. A batch slot knows exactly how many bytes it delivered for a
lease and how long that took, so the window is the batch itself: raw = bytes / 1024 / seconds. The
EMA across rounds keeps KCL's alpha and its "first value = raw" rule, so a lease with no traffic
halves every round towards 0 just as KCL's halves every renewal.

Rounding half-up to 6 decimals happens once, when the value is stored (`codec.throughput_value`);
these functions never round, so a stored value is never rounded twice.
"""

from __future__ import annotations

import math

DEFAULT_ALPHA = 0.5


def batch_throughput_kbps(bytes_delivered: int, seconds: float) -> float:
    """KB/s over one batch; a batch that took no measurable time delivered at rate 0, not infinity."""
    if bytes_delivered < 0:
        raise ValueError(f"bytes_delivered must be >= 0, got {bytes_delivered}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"seconds must be a finite number >= 0, got {seconds}")
    if seconds == 0:
        return 0.0
    return bytes_delivered / 1024 / seconds


def ema_throughput(previous_kbps: float | None, batch_kbps: float, alpha: float = DEFAULT_ALPHA) -> float:
    """The new stored throughput: the batch value first, then alpha x batch + (1 - alpha) x previous."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if previous_kbps is None:
        return batch_kbps
    return alpha * batch_kbps + (1 - alpha) * previous_kbps
