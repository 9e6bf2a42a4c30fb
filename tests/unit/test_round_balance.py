"""The balance figure of a round (bench/balance_pipeline.py, the demo): busiest slot against the lower bound."""

from __future__ import annotations

import pytest

from spark_jobs.round_report import busiest_over_bound


@pytest.mark.parametrize(
    ("slot_bytes", "lease_bytes", "expected"),
    [
        pytest.param([50, 50], [25, 25, 25, 25], 1.0, id="perfect-split"),
        pytest.param(
            [55, 15, 15, 15], [30, 25, 15, 15, 15], 55 / 30, id="hot-pair-on-one-slot-against-the-largest-lease"
        ),
        pytest.param([60, 40], [60, 40], 1.0, id="the-largest-lease-bounds-the-round"),
        pytest.param([100, 0, 0, 0], [100], 1.0, id="one-lease-cannot-be-split"),
        pytest.param([0, 0], [], None, id="nothing-landed"),
        pytest.param([], [], None, id="no-slot"),
    ],
)
def test_the_busiest_slot_against_max_of_the_even_share_and_the_largest_lease(slot_bytes, lease_bytes, expected):
    assert busiest_over_bound(slot_bytes, lease_bytes) == (None if expected is None else pytest.approx(expected))
