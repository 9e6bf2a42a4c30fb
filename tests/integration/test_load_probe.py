"""The leader's load probe of leases never measured, against kinesis-mock: one page each gives a load
signal in proportion to what waits on the shard; a probe refused or throttled gives none, so that
lease keeps today's signal (the average)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from devtools.kinesis_streams import create_stream, kinesis_client, put_entries, shards_of
from lease_core.config.settings import ConsumerConfig
from lease_core.model.lease import Lease
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON
from lease_core.retrieval.pending_work import probe_unmeasured_leases
from lease_core.retrieval.polling.polling_retrieval import idle_check_retrieval
from lease_core.retry import RetryPolicy
from tests.support.faults import FaultInjectingClient, client_error

CONFIG = ConsumerConfig(application_name="load-probe-test", initial_position_in_stream="TRIM_HORIZON")
RECORDS = (30, 10, 0)  # per shard
RECORD = b"x" * 500


@pytest.fixture()
def skewed(kinesis_endpoint: str, unique_name: str) -> tuple[str, list[Lease]]:
    """A stream of 3 shards holding 30, 10 and 0 records, put at once a second ago; a lease per shard
    at TRIM_HORIZON with no throughput yet."""
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, unique_name, len(RECORDS))
    shards = shards_of(client, unique_name)
    entries = [
        {"Data": RECORD, "PartitionKey": "p", "ExplicitHashKey": str(shard.hash_key_range.starting_hash_key)}
        for shard, count in zip(shards, RECORDS)
        for _ in range(count)
    ]
    put_entries(client, unique_name, entries)
    time.sleep(1.0)  # the data time from the first arrival to the probe dwarfs the put's own spread
    return unique_name, [Lease(shard.shard_id, checkpoint=TRIM_HORIZON) for shard in shards]


def probe(client: Any, stream: str, leases: list[Lease]) -> dict[str, float]:
    retrieval = idle_check_retrieval(client, RetryPolicy(attempts=2, base_millis=1))
    return probe_unmeasured_leases(leases, [stream], retrieval, CONFIG, lambda: int(time.time() * 1000))


def test_a_probe_weighs_each_new_lease_by_what_waits_on_its_shard(kinesis_endpoint, skewed):
    stream, leases = skewed
    signals = probe(kinesis_client(kinesis_endpoint), stream, leases)
    hot, cool, empty = (signals[lease.lease_key] for lease in leases)
    assert hot / cool == pytest.approx(3.0, rel=0.1)
    assert empty == 0.0


def test_leases_measured_already_or_at_shard_end_are_not_probed(kinesis_endpoint, skewed):
    stream, leases = skewed
    client = FaultInjectingClient(kinesis_client(kinesis_endpoint), lambda name, number: None)
    measured = leases[0].replace(throughput_kbps=4.0)
    finished = leases[1].replace(checkpoint=SHARD_END)
    assert probe(client, stream, [measured, finished]) == {}
    assert client.calls.get("get_records", 0) == 0


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(client_error("ProvisionedThroughputExceededException", "GetRecords"), id="throttled"),
        pytest.param(client_error("AccessDeniedException", "GetRecords", status=403), id="refused"),
    ],
)
def test_a_lease_whose_probe_was_throttled_or_refused_gets_no_signal(kinesis_endpoint, skewed, error):
    stream, leases = skewed
    failing = FaultInjectingClient(
        kinesis_client(kinesis_endpoint), lambda name, number: error if name == "get_records" else None
    )
    assert probe(failing, stream, leases) == {}
