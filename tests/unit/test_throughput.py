"""Lease throughput per batch (kcl-spec.md §7 adapted to rounds): KB/s over the batch, EMA across rounds."""

from __future__ import annotations

import pytest

from lease_core.codec import throughput_value
from lease_core.throughput import batch_throughput_kbps, ema_throughput

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("bytes_delivered", "seconds", "stored"),
    [
        pytest.param(5 * MIB, 60, "85.333333", id="kcl-five-1MiB-over-60s"),
        pytest.param(MIB, 60, "17.066667", id="kcl-one-1MiB-over-60s"),
        pytest.param(1000 * 1024 * MIB, 60, "17476266.666667", id="kcl-1000-GiB-over-60s"),
        pytest.param(0, 60, "0.000000", id="no-records"),
        pytest.param(MIB, 0, "0.000000", id="zero-seconds-is-zero-not-infinity"),
        pytest.param(2048, 2, "1.000000", id="one-kb-per-second"),
    ],
)
def test_batch_throughput_is_kilobytes_per_second_of_the_batch(bytes_delivered, seconds, stored):
    assert throughput_value(batch_throughput_kbps(bytes_delivered, seconds)) == {"N": stored}


def test_kcl_examples_round_to_two_decimals_as_the_spec_quotes_them():
    assert round(batch_throughput_kbps(5 * MIB, 60), 2) == 85.33
    assert round(batch_throughput_kbps(MIB, 60), 2) == 17.07


@pytest.mark.parametrize(
    ("bytes_delivered", "seconds"),
    [pytest.param(-1, 1, id="negative-bytes"), pytest.param(1, -1, id="negative-seconds"), pytest.param(1, float("nan"), id="nan-seconds")],
)
def test_impossible_measurements_are_rejected(bytes_delivered, seconds):
    with pytest.raises(ValueError):
        batch_throughput_kbps(bytes_delivered, seconds)


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
