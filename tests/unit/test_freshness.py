"""Freshness: the ages at a round's end, the application's from its leases', and what a round carries from the
one before."""

from __future__ import annotations

import pytest

from lease_core.metrics.freshness import Freshness, ages_at_newest_round, fresh_lease_rows

END = 1_800_000_000_000


def test_the_ages_are_measured_from_the_rounds_end_and_never_negative():
    freshness = Freshness(landed_through_millis=END - 90_000, newest_arrival_millis=END + 5)
    assert freshness.oldest_unlanded_age_millis(END) == 90_000
    assert freshness.newest_landed_age_millis(END) == 0  # a Kinesis clock ahead of the host's


def test_an_unknown_moment_has_no_age():
    assert Freshness().oldest_unlanded_age_millis(END) is None
    assert Freshness().newest_landed_age_millis(END) is None


def test_the_application_lacks_nothing_older_than_its_least_advanced_lease_and_holds_its_newest_record():
    leases = [Freshness(END - 1000, END - 2000), Freshness(END - 50_000, END - 60_000), Freshness(None, None)]
    assert Freshness.of_leases(leases) == Freshness(END - 50_000, END - 2000)
    assert Freshness.of_leases([]) == Freshness()


def test_a_round_that_says_nothing_carries_the_earlier_rounds_moments():
    earlier = Freshness(END - 30_000, END - 40_000)
    assert Freshness().carried_from(earlier) == earlier


def test_a_newer_landing_wins_but_the_newest_record_never_goes_back():
    earlier = Freshness(END - 30_000, END - 40_000)
    stalled = Freshness(landed_through_millis=END - 35_000, newest_arrival_millis=END - 50_000)
    assert stalled.carried_from(earlier) == Freshness(END - 35_000, END - 40_000)


def test_lease_rows_get_their_ages_and_carry_the_earlier_rounds_newest_record():
    rows = [
        {"lease_key": "shardId-1", "landed_through_millis": END - 1000, "newest_arrival_millis": None},
        {"lease_key": "shardId-2", "landed_through_millis": None, "newest_arrival_millis": None},
    ]
    earlier = [{"lease_key": "shardId-1", "landed_through_millis": END - 9000, "newest_arrival_millis": END - 9500}]
    fresh = fresh_lease_rows(rows, earlier, visible=True, at_millis=END)
    assert fresh[0] == {
        "lease_key": "shardId-1",
        "landed_through_millis": END - 1000,
        "newest_arrival_millis": END - 9500,
        "oldest_unlanded_age_millis": 1000,
        "newest_landed_age_millis": 9500,
    }
    assert (fresh[1]["oldest_unlanded_age_millis"], fresh[1]["newest_landed_age_millis"]) == (None, None)


def test_a_landing_that_did_not_become_visible_leaves_every_lease_where_the_earlier_round_put_it():
    rows = [{"lease_key": "shardId-1", "landed_through_millis": END - 10, "newest_arrival_millis": END - 20}]
    earlier = [{"lease_key": "shardId-1", "landed_through_millis": END - 9000, "newest_arrival_millis": END - 9500}]
    (fresh,) = fresh_lease_rows(rows, earlier, visible=False, at_millis=END)
    assert (fresh["landed_through_millis"], fresh["oldest_unlanded_age_millis"]) == (END - 9000, 9000)


UNREAD_EARLIER = [
    {"lease_key": "shardId-1", "outcome": "caught_up", "landed_through_millis": END - 1000},
    {"lease_key": "shardId-2", "outcome": "limit", "landed_through_millis": END - 600_000},
    {"lease_key": "shardId-3", "outcome": "shard_end", "landed_through_millis": END - 900_000},
    {"lease_key": "shardId-4", "outcome": "caught_up", "landed_through_millis": END - 700_000},
]


def test_a_lease_the_round_did_not_read_keeps_its_moment_so_its_age_and_the_applications_keep_growing():
    rows = [{"lease_key": "shardId-1", "landed_through_millis": END - 500, "newest_arrival_millis": END - 600}]
    done = {"shardId-3", "shardId-4"}  # ended (shard_end), and deleted by the sync
    fresh = fresh_lease_rows(rows, UNREAD_EARLIER, True, END + 300_000, done=lambda row: row["lease_key"] in done)
    assert [row["lease_key"] for row in fresh] == ["shardId-1", "shardId-2"]
    assert fresh[1] == {
        "lease_key": "shardId-2",  # no outcome: the page shows it as not read
        "landed_through_millis": END - 600_000,
        "newest_arrival_millis": None,
        "oldest_unlanded_age_millis": 900_000,
        "newest_landed_age_millis": None,
    }
    assert Freshness.of_leases(Freshness.of_row(row) for row in fresh).oldest_unlanded_age_millis(END + 300_000) == (
        900_000
    )


def test_an_unread_lease_is_carried_round_after_round_until_it_is_read_again():
    at = END
    rows = [{"lease_key": "shardId-1", "landed_through_millis": END - 1000}]
    earlier = UNREAD_EARLIER[:2]
    for _ in range(3):
        at += 300_000
        earlier = fresh_lease_rows(rows, earlier, True, at)
    assert earlier[1]["oldest_unlanded_age_millis"] == at - (END - 600_000)
    read_again = [{"lease_key": "shardId-2", "landed_through_millis": at - 10}]
    assert fresh_lease_rows(read_again, earlier, True, at)[0] == {
        "lease_key": "shardId-2",
        "landed_through_millis": at - 10,
        "newest_arrival_millis": None,
        "oldest_unlanded_age_millis": 10,
        "newest_landed_age_millis": None,
    }


ROW = {
    "lease_key": "shardId-1",
    "landed_through_millis": END - 60_000,
    "newest_arrival_millis": END - 70_000,
    "oldest_unlanded_age_millis": 60_000,  # at END, the end of the row's own round
    "newest_landed_age_millis": 70_000,
}


@pytest.mark.parametrize(
    ("newest_round", "ages"),
    [
        pytest.param({"finished_at": END, "landed_through_millis": END - 90_000}, (60_000, 70_000), id="its-own-round"),
        pytest.param(
            {"finished_at": END + 300_000, "landed_through_millis": END + 290_000},
            (10_000, 370_000),
            id="an-idle-round-after-lacks-nothing-older-than-its-check",
        ),
        pytest.param(
            {"finished_at": END + 300_000, "landed_through_millis": END - 90_000},
            (360_000, 370_000),
            id="a-round-that-reported-nothing-ages-it",
        ),
        pytest.param(None, (60_000, 70_000), id="no-history"),
    ],
)
def test_a_leases_ages_are_those_at_the_end_of_the_newest_round(newest_round, ages):
    aged = ages_at_newest_round(ROW, newest_round)
    assert (aged["oldest_unlanded_age_millis"], aged["newest_landed_age_millis"]) == ages


def test_a_row_without_moments_keeps_the_ages_it_was_stored_with():
    row = {"lease_key": "shardId-1", "oldest_unlanded_age_millis": 5, "newest_landed_age_millis": 6}
    newest = {"finished_at": END, "landed_through_millis": END}
    assert ages_at_newest_round(row, newest) == {"oldest_unlanded_age_millis": 5, "newest_landed_age_millis": 6}


@pytest.mark.parametrize("value", ["1700000000000", -5, 1.5, True], ids=["text", "negative", "fraction", "boolean"])
def test_a_moment_that_is_not_epoch_milliseconds_is_refused_naming_its_key(value):
    with pytest.raises(ValueError, match="landed_through_millis must be epoch milliseconds"):
        Freshness.of_row({"landed_through_millis": value})
