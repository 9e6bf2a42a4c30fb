"""The round's publication on the driver: whatever the sink raises, the round reports it instead of
the driver dying without a report."""

from __future__ import annotations

from lease_core.model.lease import Lease
from sinks.batch_sink import RoundIdentity, RoundPublication
from sinks.errors import SinkError
from spark_jobs.round_publication import publish_committed_batches

IDENTITY = RoundIdentity("app", 3, {})
LEASES = [Lease("shardId-000000000001", committed_batch='{"f":"iceberg/1"}'), Lease("shardId-000000000002")]


class Raising:
    uri = "iceberg://lake/k.orders"

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.records: dict[str, str] = {}

    def publish_round(self, records, identity) -> RoundPublication:
        self.records = dict(records)
        raise self.error


def test_only_leases_with_a_record_are_handed_to_the_sink():
    sink = Raising(SinkError("iceberg://lake/k.orders", "the catalog is down", retryable=True))
    publish_committed_batches(sink, IDENTITY, LEASES)  # type: ignore[arg-type]
    assert sink.records == {"shardId-000000000001": '{"f":"iceberg/1"}'}


def test_a_sinks_error_is_the_rounds_publication_error():
    sink = Raising(SinkError("iceberg://lake/k.orders", "the catalog is down", retryable=True))
    publication, gone = publish_committed_batches(sink, IDENTITY, LEASES)  # type: ignore[arg-type]
    assert publication.error is not None and "the catalog is down" in publication.error and gone == ()


def test_a_library_error_the_sink_did_not_expect_is_reported_too():
    publication, _ = publish_committed_batches(Raising(KeyError("snapshot-id")), IDENTITY, LEASES)  # type: ignore[arg-type]
    assert publication.error == "KeyError: 'snapshot-id'"
