"""Lease throughput for batch rounds (docs/protocol.md §6).

KCL's `throughputKBps` is an EMA of the bytes a worker delivered per second. An always-on worker
delivers what arrives, so at steady state it is the rate at which data arrives on the shard: the
load the lease puts on whoever holds it, which is what assignment balances. A batch round reads in
bursts, so bytes over its reading seconds would measure how fast the round read, not the load. A
round instead measures the arrival rate over the data time its read covered (`ArrivalWindow`):
from where the previous round's read ended (the lease's `readThroughMillis`) to where this one's
ended (the moment it reached the stream's tip, or the arrival time of the last record it read when
a limit stopped it). The EMA across rounds keeps KCL's alpha and its "first value = raw" rule, so a
lease with no traffic halves every round towards 0 just as KCL's halves every renewal.

Rounding half-up to 6 decimals happens once, when the value is stored (`codec.throughput_value`);
these functions never round, so a stored value is never rounded twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from lease_core.model.lease import Lease, MeasurementBeforeClaim

DEFAULT_ALPHA = 0.5


@dataclass(frozen=True)
class ArrivalWindow:
    """The stretch of data time (epoch milliseconds of arrival) one round's read of a lease covered."""

    start_millis: int
    end_millis: int

    @property
    def seconds(self) -> float:
        return (self.end_millis - self.start_millis) / 1000


def covered_window(
    read_through_millis: int | None, first_arrival_millis: int | None, end_millis: int | None
) -> ArrivalWindow | None:
    """What a round's read covered, or None when it says nothing about the arrival rate.

    It starts where the previous read ended (`read_through_millis`) or, for a lease never measured,
    at the arrival of the first record this round read; it ends at `end_millis`. A first record that
    arrived before `read_through_millis` moves the start back to it: the previous round's read did
    not reach it (a claim's `idle_measurement` whose round then died, a Kinesis clock behind the
    host's). A window that is empty or runs backwards (clocks of two hosts) measures nothing.
    """
    start = first_arrival_millis if read_through_millis is None else read_through_millis
    if first_arrival_millis is not None and start is not None:
        start = min(start, first_arrival_millis)
    if start is None or end_millis is None or end_millis <= start:
        return None
    return ArrivalWindow(start, end_millis)


def claimed_measurement(lease: Lease, round_number: int, now_millis: int) -> Lease:
    """`lease` with the measurement a slot's claim in round `round_number` writes.

    The lease's measurement is its own, or, when another attempt of this round claimed it with a
    stand-in, the one that claim kept aside (`measured_before_claim`): a retry never measures from
    a stand-in. The claim stores the `idle_measurement` of it and keeps it aside in turn; without
    an idle measurement (never measured, a clock behind the window) the claim stores it as it is.
    """
    kept = lease.measured_before_claim
    throughput, read_through = (
        measurement_before_claim(lease)
        if kept is not None and kept.round == round_number
        else (lease.throughput_kbps, lease.read_through_millis)
    )
    idle = idle_measurement(throughput, read_through, now_millis)
    if idle is None or throughput is None or read_through is None:
        return lease.replace(throughput_kbps=throughput, read_through_millis=read_through, measured_before_claim=None)
    return lease.replace(
        throughput_kbps=idle[0],
        read_through_millis=idle[1],
        measured_before_claim=MeasurementBeforeClaim(round_number, throughput, read_through),
    )


def measurement_before_claim(lease: Lease) -> tuple[float | None, int | None]:
    """(throughput, read through) the lease had before its claim stood in for them, else its own."""
    kept = lease.measured_before_claim
    if kept is not None:
        return kept.throughput_kbps, kept.read_through_millis
    return lease.throughput_kbps, lease.read_through_millis


def idle_measurement(
    throughput_kbps: float | None, read_through_millis: int | None, now_millis: int, alpha: float = DEFAULT_ALPHA
) -> tuple[float, int] | None:
    """(throughput, read through) that a round which reads nothing on the lease stores: no data
    arrived from `read_through_millis` to now. A slot's claim stores it ahead of the read, so that a
    lease with nothing new costs the round one write; a round that does read data stores its own
    measurement afterwards, from the values the lease had before the claim. None for a lease never
    measured (there is nothing to decay) or whose window would run backwards."""
    if throughput_kbps is None or read_through_millis is None or now_millis <= read_through_millis:
        return None
    return ema_throughput(throughput_kbps, 0.0, alpha), now_millis


def arrival_rate_kbps(bytes_landed: int, window: ArrivalWindow) -> float:
    """KB/s that arrived on the lease over `window`: the bytes a round landed over the data time it covered."""
    if bytes_landed < 0:
        raise ValueError(f"bytes_landed must be >= 0, got {bytes_landed}")
    return bytes_landed / 1024 / window.seconds


def ema_throughput(previous_kbps: float | None, batch_kbps: float, alpha: float = DEFAULT_ALPHA) -> float:
    """The new stored throughput: the batch value first, then alpha x batch + (1 - alpha) x previous."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if previous_kbps is None:
        return batch_kbps
    return alpha * batch_kbps + (1 - alpha) * previous_kbps
