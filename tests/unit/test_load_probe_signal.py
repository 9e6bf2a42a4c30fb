"""The load probe's figure for a lease never measured (docs/protocol.md §6): what a round reading it now
would measure, from one page of it."""

from __future__ import annotations

import pytest

from lease_core.retrieval.pending_work import probed_throughput_kbps

# (page bytes, first arrival, last arrival, MillisBehindLatest, now) -> KB/s, all times in ms.
PROBES = [
    pytest.param(10_240, 0, 500, 0, 10_000, 1.0, id="page-at-the-tip-is-the-whole-backlog-over-first-arrival-to-now"),
    pytest.param(10_240, 0, 1_000, 4_000, 5_000, 10.0, id="behind-the-tip-the-rest-comes-at-the-pages-rate"),
    pytest.param(0, None, None, 0, 5_000, 0.0, id="an-empty-page-at-the-tip-is-no-load"),
    pytest.param(0, None, None, 3_000, 5_000, None, id="an-empty-page-behind-the-tip-says-nothing"),
    pytest.param(10_240, 0, 500, None, 5_000, None, id="no-millis-behind-latest-says-nothing"),
    pytest.param(10_240, 700, 700, 3_000, 5_000, None, id="a-burst-behind-the-tip-has-no-rate"),
    pytest.param(10_240, 6_000, 6_500, 0, 5_000, None, id="a-clock-behind-the-first-arrival-says-nothing"),
]


@pytest.mark.parametrize(("page_bytes", "first", "last", "behind", "now", "expected"), PROBES)
def test_a_probe_estimates_what_a_round_reading_the_lease_now_would_measure(
    page_bytes: int, first: int | None, last: int | None, behind: int | None, now: int, expected: float | None
) -> None:
    assert probed_throughput_kbps(page_bytes, first, last, behind, now) == expected


def test_a_probe_of_negative_bytes_is_rejected_naming_them() -> None:
    with pytest.raises(ValueError, match="page_bytes must be >= 0, got -1"):
        probed_throughput_kbps(-1, 0, 1, 0, 2)
