"""Which stream a single-stream application consumes: recorded once, compared on every sync."""

from __future__ import annotations

import pytest

from lease_core.errors import StreamMismatchError
from lease_core.model.shards import StreamDescription
from lease_core.sync.consumed_stream import StreamCheck, check_stream, from_item, to_item
from tests.support.shard_sources import CREATED_MILLIS, stream_description

ORDERS = stream_description("orders")


@pytest.mark.parametrize(
    ("remembered", "table_has_leases", "expected"),
    [
        pytest.param(None, False, StreamCheck.RECORDED, id="first-sync-of-a-new-application-records"),
        pytest.param(None, True, StreamCheck.ADOPTED, id="leases-without-a-record-adopt-the-stream"),
        pytest.param(ORDERS, True, StreamCheck.MATCHED, id="the-remembered-stream-matches"),
        pytest.param(ORDERS, False, StreamCheck.MATCHED, id="the-remembered-stream-matches-an-empty-table"),
    ],
)
def test_a_stream_that_may_be_synced(remembered, table_has_leases, expected):
    assert check_stream(remembered, ORDERS, table_has_leases, "app-CoordinatorState") is expected


@pytest.mark.parametrize(
    ("requested", "recreated"),
    [
        pytest.param(stream_description("payments"), False, id="another-stream"),
        pytest.param(stream_description("orders", CREATED_MILLIS + 1), True, id="the-same-name-created-again"),
        pytest.param(
            StreamDescription("orders", "arn:aws:kinesis:eu-west-1:123456789012:stream/orders", CREATED_MILLIS),
            False,
            id="the-same-name-in-another-region",
        ),
    ],
)
def test_a_stream_that_is_refused_even_when_the_table_is_empty(requested, recreated):
    with pytest.raises(StreamMismatchError) as refused:
        check_stream(ORDERS, requested, False, "app-CoordinatorState")
    assert refused.value.recreated is recreated
    assert (refused.value.remembered, refused.value.requested) == (str(ORDERS), str(requested))
    assert ORDERS.stream_arn in str(refused.value) and requested.stream_arn in str(refused.value)


def test_the_record_reads_back_as_the_stream_it_was_written_from():
    assert from_item(to_item(ORDERS)) == ORDERS and from_item(None) is None
