"""The leader's shard-sync step in process, against kinesis-mock and DynamoDB on moto."""

from __future__ import annotations

import pytest

from devtools.kinesis_streams import create_stream, kinesis_client, split_shard, wait_until_gone
from lease_core.errors import ConfigurationError, InconsistentShardsError, StreamMismatchError
from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.sync.step import sync_streams
from tests.support.faults import FaultInjectingClient
from tests.support.seed_lineage import build_seed_lineage
from tests.support.stores import FAST_RETRIES, dynamodb_state_store, dynamodb_store, fast_config


def state_store(moto_endpoint: str, app: str) -> CoordinatorStateStore:
    return dynamodb_state_store(moto_endpoint, app)


class ListingDroppingClient(FaultInjectingClient):
    """Answers ListShards without the given shards, as a partial or stale answer would."""

    def __init__(self, client, *shard_ids: str) -> None:
        super().__init__(client, lambda method, number: None)
        self._dropped = set(shard_ids)

    def list_shards(self, **arguments):
        page = self._client.list_shards(**arguments)
        page["Shards"] = [shard for shard in page["Shards"] if shard["ShardId"] not in self._dropped]
        return page


class ReopeningClient(FaultInjectingClient):
    def __init__(self, client, shard_id: str) -> None:
        super().__init__(client, lambda method, number: None)
        self._shard_id = shard_id

    def list_shards(self, **arguments):
        page = self._client.list_shards(**arguments)
        for shard in page["Shards"]:
            if shard["ShardId"] == self._shard_id:
                shard["SequenceNumberRange"].pop("EndingSequenceNumber", None)
        return page


def test_children_of_an_open_parent_stop_the_sync_unless_told_to_ignore_them(
    moto_endpoint, kinesis_endpoint, unique_name
):
    client = kinesis_client(kinesis_endpoint)
    seed = build_seed_lineage(client, unique_name)
    store = dynamodb_store(moto_endpoint, unique_name)
    store.create_lease_if_not_exists(Lease(seed[4], checkpoint=ExtendedSequenceNumber("1")))
    source = KinesisShardSource(ReopeningClient(client, seed[5]), retry_policy=FAST_RETRIES)
    config = fast_config(unique_name)
    with pytest.raises(InconsistentShardsError, match=f"{seed[9]}, {seed[10]}"):
        sync_streams([unique_name], config, store, source, state_store(moto_endpoint, unique_name))
    assert [lease.lease_key for lease in store.list_leases()] == [seed[4]], "nothing was created"
    report = sync_streams(
        [unique_name],
        config.with_overrides(ignore_unexpected_child_shards=True),
        store,
        source,
        state_store(moto_endpoint, unique_name),
    )
    assert seed[9] not in report.created and seed[10] not in report.created
    assert report.streams[0].skipped_inconsistent == (seed[9], seed[10])


def test_a_former_streams_leases_are_deleted_when_the_strategy_says_so(moto_endpoint, kinesis_endpoint, unique_name):
    client = kinesis_client(kinesis_endpoint)
    kept, dropped = f"{unique_name[:40]}-kept", f"{unique_name[:40]}-dropped"
    create_stream(client, kept, 1)
    create_stream(client, dropped, 2)
    store = dynamodb_store(moto_endpoint, unique_name)
    source = KinesisShardSource(client, retry_policy=FAST_RETRIES)
    state = state_store(moto_endpoint, unique_name)
    now = [10_000]
    config = fast_config(
        unique_name,
        former_streams_leases_deletion_strategy="FORMER_STREAMS_AUTO_DETECTION_DEFERRED_DELETION",
        wait_period_to_delete_former_streams_millis=60_000,
        multi_stream=True,
    )
    first = sync_streams([kept, dropped], config, store, source, state, lambda: now[0])
    assert len(first.created) == 3 and first.multi_stream
    pending = sync_streams([kept], config, store, source, state, lambda: now[0])
    assert pending.deleted == () and len(pending.former_streams.pending) == 1
    now[0] += 60_000
    done = sync_streams([kept], config, store, source, state, lambda: now[0])
    assert len(done.deleted) == 2 and all(f":{dropped}:" in key for key in done.deleted)
    assert {lease.stream_name.split(":")[1] for lease in store.list_leases()} == {kept}


def test_a_single_stream_sync_refuses_a_table_of_multi_stream_leases(moto_endpoint, kinesis_endpoint, unique_name):
    client = kinesis_client(kinesis_endpoint)
    first, second = f"{unique_name[:40]}-1", f"{unique_name[:40]}-2"
    create_stream(client, first, 1)
    create_stream(client, second, 1)
    store = dynamodb_store(moto_endpoint, unique_name)
    source = KinesisShardSource(client, retry_policy=FAST_RETRIES)
    state = state_store(moto_endpoint, unique_name)
    sync_streams([first, second], fast_config(unique_name), store, source, state)
    with pytest.raises(ConfigurationError, match=r"'multi_stream'.*holds multi-stream leases"):
        sync_streams([first], fast_config(unique_name), store, source, state)
    assert len(store.list_leases()) == 2, "nothing was deleted"


def shard(index: int) -> str:
    return f"shardId-{index:012d}"


def test_a_listing_that_misses_an_open_shard_changes_nothing(moto_endpoint, kinesis_endpoint, unique_name):
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, unique_name, 2)
    store = dynamodb_store(moto_endpoint, unique_name)
    state = state_store(moto_endpoint, unique_name)
    config = fast_config(unique_name)
    sync_streams([unique_name], config, store, KinesisShardSource(client, retry_policy=FAST_RETRIES), state)
    before = store.list_leases()

    partial = KinesisShardSource(ListingDroppingClient(client, shard(1)), retry_policy=FAST_RETRIES)
    report = sync_streams([unique_name], config, store, partial, state)

    assert (report.created, report.deleted, report.possibly_unread) == ((), (), ())
    assert "not covered" in report.streams[0].listing_incomplete
    assert store.list_leases() == before


def test_an_unlisted_lease_is_kept_while_kinesis_knows_its_shard_and_deleted_once_it_does_not(
    moto_endpoint, kinesis_endpoint, unique_name
):
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, unique_name, 1)
    store = dynamodb_store(moto_endpoint, unique_name)
    state = state_store(moto_endpoint, unique_name)
    config = fast_config(unique_name)
    sync_streams([unique_name], config, store, KinesisShardSource(client, retry_policy=FAST_RETRIES), state)
    low, high = split_shard(client, unique_name, shard(0))
    for child in (low, high):  # as the parent's SHARD_END would have created them; the parent is still read
        store.create_lease_if_not_exists(Lease(child, checkpoint=TRIM_HORIZON, parent_shard_ids={shard(0)}))
    store.create_lease_if_not_exists(Lease(shard(99), checkpoint=ExtendedSequenceNumber("7")))  # no such shard
    stale = ListingDroppingClient(client, shard(0))  # a stale listing that misses the closed parent

    report = sync_streams([unique_name], config, store, KinesisShardSource(stale, retry_policy=FAST_RETRIES), state)
    again = sync_streams([unique_name], config, store, KinesisShardSource(stale, retry_policy=FAST_RETRIES), state)

    assert (report.deleted, report.possibly_unread) == ((shard(99),), (shard(99),))
    assert report.cleanups[0].unlisted_existing == (shard(0),)
    assert sorted(lease.lease_key for lease in store.list_leases()) == [shard(0), low, high]
    assert again.cleanups[0].unlisted_unprobed == (shard(0),), "asked again only after the interval"
    assert stale.calls["get_shard_iterator"] == 2


def test_a_stream_created_again_under_the_same_name_is_refused(moto_endpoint, kinesis_endpoint, unique_name):
    client = kinesis_client(kinesis_endpoint)
    create_stream(client, unique_name, 2)
    store = dynamodb_store(moto_endpoint, unique_name)
    state = state_store(moto_endpoint, unique_name)
    source = KinesisShardSource(client, retry_policy=FAST_RETRIES)
    sync_streams([unique_name], fast_config(unique_name), store, source, state)
    before = store.list_leases()
    client.delete_stream(StreamName=unique_name)
    wait_until_gone(client, unique_name)
    create_stream(client, unique_name, 1)

    with pytest.raises(StreamMismatchError, match="created again") as refused:
        sync_streams([unique_name], fast_config(unique_name), store, source, state)

    assert refused.value.recreated and refused.value.remembered != refused.value.requested
    assert store.list_leases() == before
