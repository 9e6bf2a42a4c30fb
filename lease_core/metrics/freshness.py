"""Freshness: how old the records are that the output lacks, and how old its newest record is (docs/metrics.md).

A round reports, per lease, two moments in data time (epoch milliseconds of Kinesis' arrival times):
`landed_through_millis`, before which every record that arrived on the shard is landed, and
`newest_arrival_millis`, the arrival of the newest record landed (`spark_jobs.round_report.LeaseReport`).
At a moment `at` (the end of the round), the oldest record in Kinesis that the output lacks arrived at
or after `landed_through`, so it is at most `at - landed_through` old: that is the headline figure,
exact while records keep arriving and an upper bound when the shard went quiet. The newest record the
output holds is `at - newest_arrival` old.

What readers could not see in this round, and what the round could not say, comes from the round
before (`carried_from`): a round that landed nothing on a lease leaves its newest record as it was,
and a round whose landing did not become visible (a table commit that failed) leaves both moments
where the earlier round put them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LANDED_THROUGH = "landed_through_millis"
NEWEST_ARRIVAL = "newest_arrival_millis"


@dataclass(frozen=True)
class Freshness:
    """The two moments (epoch milliseconds), None where nothing says."""

    landed_through_millis: int | None = None
    newest_arrival_millis: int | None = None

    @classmethod
    def of_row(cls, row: Mapping[str, Any] | None) -> Freshness:
        """The moments a lease row or a round's history entry keeps (absent in an older release's)."""
        if row is None:
            return cls()
        return cls(_moment(row, LANDED_THROUGH), _moment(row, NEWEST_ARRIVAL))

    @classmethod
    def of_leases(cls, leases: Iterable[Freshness]) -> Freshness:
        """The application's: the output lacks nothing that arrived before the least advanced lease's
        moment, and its newest record is the newest of any lease."""
        leases = list(leases)
        through = [lease.landed_through_millis for lease in leases if lease.landed_through_millis is not None]
        newest = [lease.newest_arrival_millis for lease in leases if lease.newest_arrival_millis is not None]
        return cls(min(through, default=None), max(newest, default=None))

    def carried_from(self, earlier: Freshness) -> Freshness:
        """These moments, with `earlier`'s where these say nothing; a record once visible stays, so the
        newest arrival never goes back."""
        through = (
            self.landed_through_millis if self.landed_through_millis is not None else earlier.landed_through_millis
        )
        newest = [value for value in (self.newest_arrival_millis, earlier.newest_arrival_millis) if value is not None]
        return Freshness(through, max(newest, default=None))

    def oldest_unlanded_age_millis(self, at_millis: int) -> int | None:
        """How old, at `at_millis`, the oldest record the output lacks can be; None when not known."""
        return _age(self.landed_through_millis, at_millis)

    def newest_landed_age_millis(self, at_millis: int) -> int | None:
        """How old, at `at_millis`, the newest record the output holds is; None when not known."""
        return _age(self.newest_arrival_millis, at_millis)

    def to_dict(self, at_millis: int) -> dict[str, int | None]:
        """The moments and, at `at_millis`, the two ages: what a history entry and a lease row keep."""
        return {
            LANDED_THROUGH: self.landed_through_millis,
            NEWEST_ARRIVAL: self.newest_arrival_millis,
            "oldest_unlanded_age_millis": self.oldest_unlanded_age_millis(at_millis),
            "newest_landed_age_millis": self.newest_landed_age_millis(at_millis),
        }


def fresh_lease_rows(
    rows: Sequence[Mapping[str, Any]],
    earlier_rows: Sequence[Mapping[str, Any]],
    visible: bool,
    at_millis: int,
    done: Callable[[Mapping[str, Any]], bool] = lambda row: False,
) -> list[dict[str, Any]]:
    """A round's per-lease rows with their freshness at `at_millis`, carried from `earlier_rows` (the
    round before's, by lease key). `visible`: whether what the round landed became visible; when not,
    every lease keeps the earlier round's moments.

    A lease of `earlier_rows` this round did not report (no slot held it: the assignment could not
    place it, its slot died before its report, its item could not be read) still lacks what arrived
    since its moment: it gets a row of its moments alone, so its age keeps growing in this round's
    figures and the next round carries it on. `done(row)` names the earlier rows of leases with
    nothing left to land (their shard ended, or the sync deleted them), which are not carried."""
    earlier = {row["lease_key"]: Freshness.of_row(row) for row in earlier_rows if "lease_key" in row}
    fresh = []
    for row in rows:
        own = Freshness.of_row(row) if visible else Freshness()
        freshness = own.carried_from(earlier.get(row["lease_key"], Freshness()))
        fresh.append({**row, **freshness.to_dict(at_millis)})
    reported = {row["lease_key"] for row in rows}
    for row in earlier_rows:
        key = row.get("lease_key")
        if key is None or key in reported or done(row) or earlier[key] == Freshness():
            continue
        fresh.append({"lease_key": key, **earlier[key].to_dict(at_millis)})
    return fresh


def ages_at_newest_round(row: Mapping[str, Any], newest_round: Mapping[str, Any] | None) -> dict[str, int | None]:
    """A lease row's two ages at the end of the newest round the history keeps, which may have come
    after the row's own (an idle round, or one whose job died before its report, records no rows).
    The newest round's own `landed_through` bounds every lease's from below (it is the least of
    them, and an idle round's check found nothing older unread), so the lease's moment is the later
    of the two. A row without moments (an older release's) keeps the ages it was stored with."""
    own = Freshness.of_row(row)
    stored = {
        "oldest_unlanded_age_millis": row.get("oldest_unlanded_age_millis"),
        "newest_landed_age_millis": row.get("newest_landed_age_millis"),
    }
    at = newest_round.get("finished_at") if newest_round else None
    if own == Freshness() or not isinstance(at, int):
        return stored
    floor = Freshness.of_row(newest_round).landed_through_millis
    through = [moment for moment in (own.landed_through_millis, floor) if moment is not None]
    fresh = Freshness(max(through, default=None), own.newest_arrival_millis)
    return {
        "oldest_unlanded_age_millis": fresh.oldest_unlanded_age_millis(at),
        "newest_landed_age_millis": fresh.newest_landed_age_millis(at),
    }


def _moment(row: Mapping[str, Any], key: str) -> int | None:
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be epoch milliseconds (an integer >= 0), got {value!r}")
    return value


def _age(moment: int | None, at_millis: int) -> int | None:
    return None if moment is None else max(0, at_millis - moment)
