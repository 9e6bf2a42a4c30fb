"""The load probe's figures for leases never measured (docs/protocol.md §6): what waits on each, from
one page of it, over one window for all of them."""

from __future__ import annotations

import pytest

from lease_core.config.settings import ConsumerConfig
from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON
from lease_core.retrieval.pending_work import Backlog, estimated_backlog, probed_throughputs
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.store.load_probes import LOAD_PROBES_KEY
from lease_core.sync.step import probe_load

MIB = 1024 * 1024

# (page bytes, first arrival, last arrival, MillisBehindLatest) -> backlog; times in ms.
BACKLOGS = [
    pytest.param(10_240, 0, 500, 0, Backlog(10_240, 0), id="a-page-at-the-tip-is-the-whole-backlog"),
    pytest.param(10_240, 0, 1_000, 4_000, Backlog(51_200, 0), id="behind-the-tip-the-rest-comes-at-the-pages-rate"),
    pytest.param(
        MIB, 700, 700, 2_000, Backlog(3 * MIB, 700), id="a-page-of-one-instant-came-at-most-at-the-write-limit"
    ),
    pytest.param(0, None, None, 0, Backlog(0, None), id="an-empty-page-at-the-tip-is-no-backlog"),
    pytest.param(0, None, None, 3_000, None, id="an-empty-page-behind-the-tip-says-nothing"),
    pytest.param(10_240, 0, 500, None, None, id="no-millis-behind-latest-says-nothing"),
]


@pytest.mark.parametrize(("page_bytes", "first", "last", "behind", "expected"), BACKLOGS)
def test_a_page_estimates_what_waits_on_its_lease(
    page_bytes: int, first: int | None, last: int | None, behind: int | None, expected: Backlog | None
) -> None:
    assert estimated_backlog(page_bytes, first, last, behind) == expected


def test_a_page_of_negative_bytes_is_rejected_naming_them() -> None:
    with pytest.raises(ValueError, match="page_bytes must be >= 0, got -1"):
        estimated_backlog(-1, 0, 1, 0)


THROUGHPUTS = [
    pytest.param(
        {"hot": Backlog(30 * 1024, 1_000), "cool": Backlog(10 * 1024, 1_900)},
        {"hot": 3.0, "cool": 1.0},
        id="one-window-for-all-from-the-earliest-arrival-so-figures-follow-the-backlogs",
    ),
    pytest.param(
        {"busy": Backlog(20 * 1024, 1_000), "empty": Backlog(0, None)},
        {"busy": 2.0, "empty": 0.0},
        id="an-empty-lease-weighs-nothing",
    ),
    pytest.param({"empty": Backlog(0, None)}, {"empty": 0.0}, id="only-empty-leases-weigh-nothing"),
    pytest.param({"future": Backlog(1024, 20_000)}, {}, id="a-clock-behind-every-arrival-gives-no-figure"),
]


@pytest.mark.parametrize(("backlogs", "expected"), THROUGHPUTS)
def test_probed_leases_weigh_their_backlog_over_one_window(
    backlogs: dict[str, Backlog], expected: dict[str, float]
) -> None:
    assert probed_throughputs(backlogs, now_millis=11_000) == expected


class UnreachableKinesis:
    """A retrieval whose every read fails the way a bug or a reset connection would."""

    def open(self, *_: object, **__: object) -> None:
        raise ConnectionResetError("connection reset by peer")


def test_a_probe_that_fails_leaves_the_round_to_the_average_and_writes_nothing(caplog) -> None:
    state = InMemoryCoordinatorStateStore()
    lease = Lease("shardId-000000000001", checkpoint=TRIM_HORIZON)

    probes = probe_load([lease], ["orders"], UnreachableKinesis(), ConsumerConfig(application_name="app"), state)

    assert probes == {}
    assert state.get(LOAD_PROBES_KEY) is None
    assert "the load probe failed" in caplog.text and "connection reset by peer" in caplog.text
