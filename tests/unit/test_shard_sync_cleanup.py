"""The shard-sync step with fakes: a lease goes only when its shard is provably gone, a listing that
does not cover the hash key space changes nothing, a single-stream application keeps to its stream.

docs/protocol.md §3.2 and §3.10; the in-memory stores, a fake shard source and a fake clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from devtools.shard_lineage import LineageBuilder, shard_id
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import StreamMismatchError
from lease_core.model.lease import Lease
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import Shard
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.store.memory_store import InMemoryLeaseStore
from lease_core.sync.consumed_stream import RECORD_KEY
from lease_core.sync.garbage_probe import GarbageProbe
from lease_core.sync.step import ShardSyncReport, sync_streams
from tests.support.shard_sources import CREATED_MILLIS, FakeShardSource

S = shard_id
READING = ExtendedSequenceNumber("1500")
CONFIG = ConsumerConfig(application_name="orders-app")
INTERVAL = CONFIG.garbage_lease_cleanup_interval_millis
T0 = 1_700_000_000_000


@dataclass
class Round:
    """One application: its stores, Kinesis as a fake, and the clock its shard-sync step reads."""

    source: FakeShardSource
    store: InMemoryLeaseStore
    state: InMemoryCoordinatorStateStore
    now: int = T0

    def sync(self, stream: str = "orders", config: ConsumerConfig = CONFIG) -> ShardSyncReport:
        return sync_streams([stream], config, self.store, self.source, self.state, lambda: self.now)

    def lease_keys(self) -> list[str]:
        return sorted(lease.lease_key for lease in self.store.list_leases())


def application(shards: list[Shard], *leases: Lease) -> Round:
    source = FakeShardSource()
    source.create_stream("orders", shards)
    store = InMemoryLeaseStore()
    for lease in leases:
        assert store.create_lease_if_not_exists(lease)
    return Round(source, store, InMemoryCoordinatorStateStore())


def quarters() -> list[Shard]:
    return LineageBuilder(4).shards()


def split_of_shard_0() -> list[Shard]:
    """Shard 0 (closed) split into 1 and 2 (open)."""
    lineage = LineageBuilder(1)
    lineage.split(S(0))
    return lineage.shards()


def leased(*numbers: int, checkpoint: ExtendedSequenceNumber = READING) -> list[Lease]:
    return [Lease(S(n), checkpoint=checkpoint) for n in numbers]


def without(*numbers: int):
    return lambda shards: [shard for shard in shards if shard.shard_id not in {S(n) for n in numbers}]


# --- a listing that does not cover the hash key space changes nothing ------------------------------


@pytest.mark.parametrize(
    ("listing", "described"),
    [
        pytest.param(without(3), "after shardId-000000000002 are not covered", id="the-last-open-shard-missing"),
        pytest.param(
            without(1), "between shardId-000000000000 and shardId-000000000002", id="a-middle-open-shard-missing"
        ),
        pytest.param(lambda shards: shards + shards[2:3], "overlap", id="an-open-shard-listed-twice"),
        pytest.param(lambda shards: [], "no shards were listed", id="an-empty-listing"),
    ],
)
def test_a_listing_whose_open_shards_leave_a_gap_creates_and_deletes_nothing_and_says_why(listing, described, caplog):
    app = application(quarters(), *leased(0, 1, 2, 3))
    app.sync()  # remembers the stream
    before = app.store.list_leases()
    app.source.listing = listing

    with caplog.at_level(logging.WARNING, logger="lease_core.sync.syncer"):
        report = app.sync()

    assert (report.created, report.deleted, report.possibly_unread) == ((), (), ())
    assert described in report.streams[0].listing_incomplete
    assert report.to_dict()["streams"][0]["listing_incomplete"] == report.streams[0].listing_incomplete
    assert app.store.list_leases() == before and app.source.probes == []
    assert "do not cover the hash key space" in caplog.text


def test_an_incomplete_listing_does_not_even_finish_a_completed_parent():
    app = application(
        split_of_shard_0(), Lease(S(0), checkpoint=SHARD_END, child_shard_ids=frozenset({S(1), S(2)})), *leased(1, 2)
    )
    app.source.listing = without(2)
    assert app.sync().deleted == ()
    assert app.lease_keys() == [S(0), S(1), S(2)]


# --- a lease goes only when Kinesis says its shard is gone -----------------------------------------


@pytest.mark.parametrize(
    ("checkpoint", "possibly_unread"),
    [
        pytest.param(READING, True, id="before-shard-end-reported-as-possibly-unread"),
        pytest.param(SHARD_END, False, id="at-shard-end-no-loss"),
    ],
)
def test_an_unlisted_lease_stays_while_kinesis_knows_its_shard_and_goes_once_it_says_gone(checkpoint, possibly_unread):
    # Shard 0 is closed and still in Kinesis, but the listing (stale) misses it; shard 9 is not in Kinesis.
    app = application(
        split_of_shard_0(), *leased(0), *leased(1, 2, checkpoint=TRIM_HORIZON), *leased(9, checkpoint=checkpoint)
    )
    app.source.listing = without(0)

    report = app.sync()

    assert report.deleted == (S(9),)
    assert report.possibly_unread == ((S(9),) if possibly_unread else ())
    assert report.cleanups[0].unlisted_existing == (S(0),)
    assert sorted(app.source.probes) == [("orders", S(0)), ("orders", S(9))]
    assert app.lease_keys() == [S(0), S(1), S(2)]


def test_kinesis_is_asked_about_unlisted_shards_at_most_once_per_interval():
    app = application(quarters())
    gone = leased(7, 8)  # leases of shards Kinesis does not have

    def sync_at(now: int) -> ShardSyncReport:
        for lease in gone:
            app.store.create_lease_if_not_exists(lease)
        app.now = now
        return app.sync()

    first, within, after = sync_at(T0), sync_at(T0 + INTERVAL - 1), sync_at(T0 + INTERVAL)

    assert (first.deleted, within.deleted, after.deleted) == ((S(7), S(8)), (), (S(7), S(8)))
    assert within.cleanups[0].unlisted_unprobed == (S(7), S(8))
    assert len(app.source.probes) == 4, "two passes of two questions"
    assert app.state.get(GarbageProbe.record_key("orders"))["lastPassAt"] == T0 + INTERVAL


def test_a_stream_with_nothing_unlisted_asks_nothing_and_starts_no_interval():
    app = application(quarters(), *leased(0, 1, 2, 3))
    app.sync()
    assert app.source.probes == [] and app.state.get(GarbageProbe.record_key("orders")) is None
    app.store.create_lease_if_not_exists(Lease(S(7), checkpoint=READING))
    assert app.sync().deleted == (S(7),), "the first unlisted lease is asked about at once"


def test_the_interval_is_kept_per_stream_in_multi_stream_mode():
    app = application(quarters())
    app.source.create_stream("clicks", quarters())
    config = CONFIG.with_overrides(multi_stream=True)
    sync_streams(["orders", "clicks"], config, app.store, app.source, app.state, lambda: app.now)
    for stream in ("orders", "clicks"):
        app.store.create_lease_if_not_exists(Lease.for_stream(app.source.stream_identifier(stream), S(7)))

    report = sync_streams(["orders", "clicks"], config, app.store, app.source, app.state, lambda: app.now)

    assert sorted(key.split(":")[1] for key in report.deleted) == ["clicks", "orders"]
    assert app.source.probes == [("orders", S(7)), ("clicks", S(7))]


# --- a single-stream application keeps to its stream -----------------------------------------------


def test_the_first_sync_records_the_stream_and_later_syncs_match_it():
    app = application(quarters())
    first, second = app.sync(), app.sync()
    assert (first.consumed_stream.check.value, second.consumed_stream.check.value) == ("recorded", "matched")
    record = app.state.get(RECORD_KEY)
    assert (record["streamName"], record["streamCreationEpochMillis"]) == ("orders", CREATED_MILLIS)
    assert first.to_dict()["consumed_stream"]["stream_arn"] == "arn:aws:kinesis:us-east-1:123456789012:stream/orders"


def test_a_table_with_leases_but_no_record_adopts_the_stream_and_says_so(caplog):
    app = application(quarters(), *leased(0, 1, 2, 3))
    with caplog.at_level(logging.WARNING, logger="lease_core.sync.consumed_stream"):
        report = app.sync()
    assert report.to_dict()["consumed_stream"]["check"] == "adopted"
    assert "remembered as the stream this application consumes" in caplog.text
    assert app.sync().consumed_stream.check.value == "matched"


@pytest.mark.parametrize(
    ("prepare", "stream", "words"),
    [
        pytest.param(
            lambda source: source.create_stream("payments", quarters()[:1]),
            "payments",
            ("'orders'", "'payments'", "another application name"),
            id="another-stream",
        ),
        pytest.param(
            lambda source: source.create_stream("orders", quarters(), CREATED_MILLIS + 60_000),
            "orders",
            ("created again", "2023-11-14T22:13:20.000+00:00", "2023-11-14T22:14:20.000+00:00"),
            id="the-stream-created-again",
        ),
    ],
)
def test_a_sync_against_any_other_stream_is_refused_and_changes_nothing(prepare, stream, words):
    app = application(quarters(), *leased(0, 1, 2), Lease(S(3), checkpoint=SHARD_END))
    app.sync()
    before = app.store.list_leases()
    prepare(app.source)
    app.source.probes.clear()

    with pytest.raises(StreamMismatchError) as refused:
        app.sync(stream)

    assert all(word in str(refused.value) for word in words), str(refused.value)
    assert not refused.value.retryable
    assert app.store.list_leases() == before and app.source.probes == []


def test_multi_stream_mode_remembers_no_stream_its_lease_keys_carry_the_identity():
    app = application(quarters())
    app.source.create_stream("clicks", quarters())
    report = sync_streams(["orders", "clicks"], CONFIG, app.store, app.source, app.state, lambda: app.now)
    assert report.consumed_stream is None and report.to_dict()["consumed_stream"] is None
    assert app.state.get(RECORD_KEY) is None


def test_the_report_keeps_its_keys_and_leaves_the_listing_out():
    report = application(quarters()).sync().to_dict()
    assert {"created", "deleted", "possibly_unread", "former_streams_pending", "streams", "multi_stream"} <= set(report)
    assert "full_listing" not in report["streams"][0] and "cleanup" in report["streams"][0]


# --- a lease whose record names batches the sink may not show yet stays ------------------------------

RECORD = '{"f":"iceberg/1","lease":"shardId-000000000000","batches":[["r1","1400",0]]}'


@pytest.mark.parametrize(
    ("awaiting", "kept"),
    [
        pytest.param(None, True, id="no-sink-to-ask"),
        pytest.param(lambda lease: True, True, id="the-sink-says-not-visible-yet"),
        pytest.param(lambda lease: False, False, id="the-sink-says-visible"),
    ],
)
def test_a_finished_or_gone_lease_stays_while_its_committed_batches_may_not_be_visible(awaiting, kept):
    """A table sink publishes a round's batches at its end, from the records on the leases: deleting a
    lease whose publication failed would lose the only record of its committed batches."""
    finished = Lease(S(0), checkpoint=SHARD_END, child_shard_ids=frozenset({S(1), S(2)}), committed_batch=RECORD)
    gone = Lease(S(9), checkpoint=READING, committed_batch=RECORD)
    app = application(split_of_shard_0(), finished, *leased(1, 2), gone)
    app.source.listing = without(9)

    report = sync_streams(["orders"], CONFIG, app.store, app.source, app.state, lambda: app.now, awaiting)

    assert sorted(report.deleted) == ([] if kept else [S(0), S(9)])
    assert (S(0) in app.lease_keys(), S(9) in app.lease_keys()) == (kept, kept)
