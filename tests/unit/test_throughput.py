"""Lease throughput (docs/protocol.md §6 adapted to rounds): the arrival rate over the data time a round
covered, EMA across rounds."""

from __future__ import annotations

import pytest

from lease_core.metrics.throughput import (
    ArrivalWindow,
    arrival_rate_kbps,
    covered_window,
    ema_throughput,
    idle_measurement,
)
from lease_core.store.codec import throughput_value

MIB = 1024 * 1024


def window(seconds: float, start: int = 1_700_000_000_000) -> ArrivalWindow:
    return ArrivalWindow(start, start + int(seconds * 1000))


@pytest.mark.parametrize(
    ("bytes_landed", "seconds", "stored"),
    [
        pytest.param(5 * MIB, 60, "85.333333", id="kcl-five-1MiB-over-60s"),
        pytest.param(MIB, 60, "17.066667", id="kcl-one-1MiB-over-60s"),
        pytest.param(1000 * 1024 * MIB, 60, "17476266.666667", id="kcl-1000-GiB-over-60s"),
        pytest.param(0, 60, "0.000000", id="nothing-arrived"),
        pytest.param(2048, 2, "1.000000", id="one-kb-per-second"),
    ],
)
def test_the_arrival_rate_is_kilobytes_landed_per_second_of_data_time_covered(bytes_landed, seconds, stored):
    assert throughput_value(arrival_rate_kbps(bytes_landed, window(seconds))) == {"N": stored}


def test_kcl_examples_round_to_two_decimals_as_the_spec_quotes_them():
    assert round(arrival_rate_kbps(5 * MIB, window(60)), 2) == 85.33
    assert round(arrival_rate_kbps(MIB, window(60)), 2) == 17.07


def test_negative_bytes_are_rejected():
    with pytest.raises(ValueError, match="bytes_landed"):
        arrival_rate_kbps(-1, window(1))


@pytest.mark.parametrize(
    ("read_through", "first_arrival", "end", "expected"),
    [
        pytest.param(1_000, 5_000, 61_000, ArrivalWindow(1_000, 61_000), id="from-where-the-last-read-ended"),
        pytest.param(None, 5_000, 65_000, ArrivalWindow(5_000, 65_000), id="never-measured-from-the-first-record"),
        pytest.param(None, None, 65_000, None, id="never-measured-and-nothing-read"),
        pytest.param(1_000, None, None, None, id="no-end-known"),
        pytest.param(61_000, None, 61_000, None, id="empty-window"),
        pytest.param(70_000, None, 61_000, None, id="backwards-window-between-two-hosts-clocks"),
        pytest.param(
            9_000, 5_000, 61_000, ArrivalWindow(5_000, 61_000), id="back-to-a-record-the-previous-read-did-not-reach"
        ),
    ],
)
def test_the_window_a_round_covered(read_through, first_arrival, end, expected):
    assert covered_window(read_through, first_arrival, end) == expected


@pytest.mark.parametrize(
    ("previous", "batch", "expected"),
    [
        pytest.param(None, 85.0, 85.0, id="first-value-is-the-batch-value"),
        pytest.param(80.0, 0.0, 40.0, id="no-traffic-halves"),
        pytest.param(100.0, 50.0, 75.0, id="mean-of-previous-and-batch"),
        pytest.param(85.333333, 85.333333, 85.333333, id="equal-values-are-unchanged"),
    ],
)
def test_ema_with_alpha_one_half(previous, batch, expected):
    assert ema_throughput(previous, batch) == pytest.approx(expected)


def test_ema_decays_by_half_each_idle_round():
    values = [64.0]
    for _ in range(4):
        values.append(ema_throughput(values[-1], 0.0))
    assert values == [64.0, 32.0, 16.0, 8.0, 4.0]


def test_ema_is_not_rounded_before_storing():
    value = ema_throughput(0.0000014, 0.0000014)
    assert value == 0.0000014 and throughput_value(value) == {"N": "0.000001"}


def test_alpha_outside_zero_one_is_rejected():
    with pytest.raises(ValueError, match="alpha"):
        ema_throughput(1.0, 1.0, alpha=0)


@pytest.mark.parametrize(
    ("throughput", "read_through", "now", "expected"),
    [
        pytest.param(80.0, 1_000, 61_000, (40.0, 61_000), id="no-data-since-the-last-read-halves-it"),
        pytest.param(0.0, 1_000, 61_000, (0.0, 61_000), id="already-idle"),
        pytest.param(None, None, 61_000, None, id="never-measured-nothing-to-decay"),
        pytest.param(80.0, 70_000, 61_000, None, id="a-clock-behind-the-window"),
    ],
)
def test_what_a_claim_stores_for_a_round_that_reads_nothing(throughput, read_through, now, expected):
    assert idle_measurement(throughput, read_through, now) == expected
