"""Listing shards from kinesis-mock: pages, the real seed lineage, a new application's filtered listing,
the whole-hash-space check, and how stream-level failures surface.

Two kinesis-mock 0.6.2 habits shape these tests (both measured, see the notes in the test bodies):
- its ShardFilter AT_TIMESTAMP compares whole epoch seconds, so a shard closed in the same second
  as the timestamp still counts as open then;
- its AT_TRIM_HORIZON answers every shard, closed descendants included (Kinesis answers only the
  shards open at the trim horizon).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from devtools.kinesis_streams import create_stream, kinesis_client, split_shard
from lease_core.errors import (
    DependencyError,
    IncompleteShardListError,
    StreamNotActiveError,
    StreamNotFoundError,
    ThrottledError,
)
from lease_core.model.lease import StreamIdentifier
from lease_core.model.shards import InitialPosition, InitialPositionInStream, Shard
from lease_core.retrieval.shard_source import FILTERED_LISTING_ATTEMPTS, LISTING_RESTARTS, KinesisShardSource
from lease_core.retry import RetryPolicy
from tests.support.faults import FaultInjectingClient, client_error
from tests.support.seed_lineage import SEED_LINEAGE_PARENTS, SEED_OPEN_SHARDS, build_seed_lineage

WIDE_SHARD_COUNT = 25
LATEST = InitialPositionInStream(InitialPosition.LATEST)
TRIM_HORIZON = InitialPositionInStream(InitialPosition.TRIM_HORIZON)


def at_timestamp(moment: datetime) -> InitialPositionInStream:
    return InitialPositionInStream(InitialPosition.AT_TIMESTAMP, moment)


def now() -> datetime:
    return datetime.now(UTC)


def wait_for_the_next_second(after_epoch: float) -> None:
    """kinesis-mock compares AT_TIMESTAMP in whole seconds: step past the second of `after_epoch`."""
    remaining = math.floor(after_epoch) + 1 - time.time()
    if remaining > 0:
        time.sleep(remaining + 0.01)


class Sleeps(list[float]):
    """A fake sleep that records what it was asked to wait."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def source(
    client: Any, sleeps: Sleeps | None = None, retry_sleeps: Sleeps | None = None, **options: Any
) -> KinesisShardSource:
    """A source whose sleeps (between filtered attempts, and between retries) are only recorded."""
    retry_sleep = Sleeps() if retry_sleeps is None else retry_sleeps
    policy = RetryPolicy(attempts=4, base_millis=1, max_millis=5, sleep=retry_sleep)
    return KinesisShardSource(client, retry_policy=policy, sleep=Sleeps() if sleeps is None else sleeps, **options)


def ids(shards: list[Shard]) -> list[str]:
    return [shard.shard_id for shard in shards]


def shard_id(index: int) -> str:
    return f"shardId-{index:012d}"


@dataclass(frozen=True)
class SeedStream:
    name: str
    ids: dict[int, str]
    resharded_at: float

    def seeds(self, *names: int) -> list[str]:
        return [self.ids[name] for name in names]


@pytest.fixture(scope="module")
def kinesis(kinesis_endpoint: str) -> Any:
    return kinesis_client(kinesis_endpoint)


@pytest.fixture(scope="module")
def lineage(kinesis: Any) -> SeedStream:
    name = f"seed-lineage-{uuid.uuid4().hex[:8]}"
    seed_ids = build_seed_lineage(kinesis, name)
    return SeedStream(name, seed_ids, time.time())


@pytest.fixture(scope="module")
def wide_stream(kinesis: Any) -> str:
    name = f"wide-{uuid.uuid4().hex[:8]}"
    create_stream(kinesis, name, WIDE_SHARD_COUNT)
    return name


# --- full listing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("page_size", "pages"), [pytest.param(4, 7, id="pages-of-4"), pytest.param(None, 1, id="one-page")]
)
def test_the_full_listing_follows_next_tokens_to_the_last_page(kinesis, wide_stream, page_size, pages):
    # kinesis-mock refuses a StreamName or ShardFilter beside a NextToken, as Kinesis does: passing
    # here also proves that continuation pages send the token alone.
    counting = FaultInjectingClient(kinesis, lambda method, call: None)
    shards = source(counting, page_size=page_size).list_shards(wide_stream)
    assert ids(shards) == [shard_id(index) for index in range(WIDE_SHARD_COUNT)]
    assert counting.calls["list_shards"] == pages


def test_kinesis_mock_numbers_the_seed_lineage_sequentially(lineage):
    assert lineage.ids == {seed: shard_id(seed) for seed in range(11)}


@pytest.mark.parametrize("seed", range(11), ids=lambda seed: f"seed-{seed}")
def test_the_full_listing_reports_parents_and_closing_of_every_shard_in_the_lineage(kinesis, lineage, seed):
    listed = {shard.shard_id: shard for shard in source(kinesis).list_shards(lineage.name)}
    shard = listed[lineage.ids[seed]]
    parents = [lineage.ids[parent] for parent in SEED_LINEAGE_PARENTS.get(seed, ())]
    assert (shard.parent_shard_id, shard.adjacent_parent_shard_id) == (
        parents[0] if parents else None,
        parents[1] if len(parents) > 1 else None,
    )
    # Closed shards carry an ending sequence number (kinesis-mock always answers 9223372036854775807).
    assert shard.is_open == (seed in SEED_OPEN_SHARDS)
    assert len(listed) == 11


# --- the filtered listing of a new application ------------------------------------------------------


def test_a_new_application_at_latest_starts_from_the_open_shards(kinesis, lineage):
    shards = source(kinesis).list_shards_for_new_application(lineage.name, LATEST)
    assert sorted(ids(shards)) == lineage.seeds(*SEED_OPEN_SHARDS)


def test_a_new_application_at_timestamp_now_starts_from_the_open_shards(kinesis, lineage):
    wait_for_the_next_second(lineage.resharded_at)
    shards = source(kinesis).list_shards_for_new_application(lineage.name, at_timestamp(now()))
    assert sorted(ids(shards)) == lineage.seeds(*SEED_OPEN_SHARDS)


def test_a_new_application_at_a_timestamp_before_a_split_starts_from_the_shards_open_then(kinesis, unique_name):
    create_stream(kinesis, unique_name, 2)
    before_split = now()
    wait_for_the_next_second(before_split.timestamp())
    children = split_shard(kinesis, unique_name, shard_id(0))
    listing = source(kinesis)
    assert ids(listing.list_shards_for_new_application(unique_name, at_timestamp(before_split))) == [
        shard_id(0),
        shard_id(1),
    ]
    assert sorted(ids(listing.list_shards_for_new_application(unique_name, LATEST))) == sorted([shard_id(1), *children])


def test_a_filtered_listing_sends_the_next_token_alone(kinesis, wide_stream):
    # Every shard is open here: kinesis-mock forgets the ShardFilter on NextToken pages (it resumes in
    # the unfiltered list), which must not decide this test.
    shards = source(kinesis, page_size=4).list_shards_for_new_application(wide_stream, LATEST)
    assert ids(shards) == [shard_id(index) for index in range(WIDE_SHARD_COUNT)]


def test_a_new_application_at_trim_horizon_on_a_stream_never_resharded_gets_every_shard(kinesis, wide_stream):
    shards = source(kinesis).list_shards_for_new_application(wide_stream, TRIM_HORIZON)
    assert ids(shards) == [shard_id(index) for index in range(WIDE_SHARD_COUNT)]


def test_kinesis_mocks_trim_horizon_answer_after_resharding_overlaps_and_is_refused(kinesis, lineage):
    # Kinesis would answer the shards open at the trim horizon (0..5, which tile the hash space);
    # kinesis-mock answers all 11, parents and children overlap, and the check refuses the listing.
    sleeps = Sleeps()
    with pytest.raises(IncompleteShardListError, match="overlap") as raised:
        source(kinesis, sleeps).list_shards_for_new_application(lineage.name, TRIM_HORIZON)
    assert raised.value.stream_name == lineage.name
    assert sleeps == [1.0] * (FILTERED_LISTING_ATTEMPTS - 1)


# --- the whole-hash-space check ---------------------------------------------------------------------


def dropping(kinesis: Any, stream: str, shard_to_drop: str, on_calls: range) -> FaultInjectingClient:
    """A client whose AT_LATEST answers lack one shard on the given list_shards calls."""

    def fault(method: str, call: int) -> Any:
        if method != "list_shards" or call not in on_calls:
            return None
        answer = kinesis.list_shards(StreamName=stream, ShardFilter={"Type": "AT_LATEST"})
        return {**answer, "Shards": [entry for entry in answer["Shards"] if entry["ShardId"] != shard_to_drop]}

    return FaultInjectingClient(kinesis, fault)


@pytest.mark.parametrize(
    ("dropped_seed", "named_in_detail"),
    [
        pytest.param(8, "before {4}", id="lowest-range-missing"),
        pytest.param(9, "between {4} and {10}", id="middle-range-missing"),
        pytest.param(10, "after {9}", id="highest-range-missing"),
    ],
)
def test_an_incomplete_answer_is_tried_three_times_then_fails_naming_the_gap(
    kinesis, lineage, dropped_seed, named_in_detail
):
    client = dropping(kinesis, lineage.name, lineage.ids[dropped_seed], on_calls=range(1, 100))
    sleeps = Sleeps()
    with pytest.raises(IncompleteShardListError) as raised:
        source(client, sleeps).list_shards_for_new_application(lineage.name, LATEST)
    assert named_in_detail.format(*lineage.seeds(*range(11))) in raised.value.detail
    assert "not covered" in raised.value.detail
    assert client.calls["list_shards"] == 3
    assert sleeps == [1.0, 1.0]


def test_an_answer_that_becomes_complete_on_a_later_attempt_is_used(kinesis, lineage):
    client = dropping(kinesis, lineage.name, lineage.ids[9], on_calls=range(1, 3))
    sleeps = Sleeps()
    shards = source(client, sleeps).list_shards_for_new_application(lineage.name, LATEST)
    assert sorted(ids(shards)) == lineage.seeds(*SEED_OPEN_SHARDS)
    assert client.calls["list_shards"] == 3
    assert sleeps == [1.0, 1.0]


def test_an_empty_answer_never_covers_the_hash_space(kinesis, lineage):
    client = FaultInjectingClient(kinesis, lambda method, call: {"Shards": []} if method == "list_shards" else None)
    with pytest.raises(IncompleteShardListError, match="no shards were listed"):
        source(client).list_shards_for_new_application(lineage.name, LATEST)
    assert client.calls["list_shards"] == 3


# --- stream-level failures ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(lambda listing, name: listing.list_shards(name), id="list_shards"),
        pytest.param(lambda listing, name: listing.list_shards_for_new_application(name, LATEST), id="filtered"),
        pytest.param(lambda listing, name: listing.stream_identifier(name), id="stream_identifier"),
        pytest.param(lambda listing, name: listing.describe_stream(name), id="describe_stream"),
        # kinesis-mock answers ResourceNotFoundException to GetShardIterator for a missing stream as for
        # a missing shard ("Stream arn ... not found" vs "Could not find shardId ... in stream ..."):
        # a missing stream must never read as "this shard is gone".
        pytest.param(lambda listing, name: listing.shard_exists(name, shard_id(0)), id="shard_exists"),
    ],
)
def test_a_missing_stream_is_reported_as_not_found(kinesis, unique_name, operation):
    with pytest.raises(StreamNotFoundError) as raised:
        operation(source(kinesis), unique_name)
    assert raised.value.stream_name == unique_name


@pytest.mark.parametrize("status", ["CREATING", "DELETING"])
def test_a_stream_in_use_is_reported_with_the_status_it_is_in(kinesis, wide_stream, status):
    # kinesis-mock never answers ResourceInUseException to ListShards (it lists a CREATING stream and
    # answers no shards for a DELETING one), so both the refusal and the status are injected.
    def fault(method: str, call: int) -> Any:
        if method == "list_shards":
            return client_error("ResourceInUseException", "ListShards")
        if method == "describe_stream_summary":
            return {"StreamDescriptionSummary": {"StreamName": wide_stream, "StreamStatus": status}}
        return None

    with pytest.raises(StreamNotActiveError) as raised:
        source(FaultInjectingClient(kinesis, fault)).list_shards(wide_stream)
    assert (raised.value.stream_name, raised.value.status, raised.value.retryable) == (wide_stream, status, True)


def test_a_stream_in_use_that_is_gone_by_the_status_lookup_is_not_found(kinesis, unique_name):
    client = FaultInjectingClient(
        kinesis,
        lambda method, call: client_error("ResourceInUseException", "ListShards") if method == "list_shards" else None,
    )
    with pytest.raises(StreamNotFoundError):
        source(client).list_shards(unique_name)


def test_throttled_pages_are_retried_without_restarting_the_listing(kinesis, wide_stream):
    # Calls 2 and 3 are the second page: it is retried in place, then the third page follows.
    client = FaultInjectingClient(
        kinesis,
        lambda method, call: (
            client_error("LimitExceededException", "ListShards") if method == "list_shards" and call in (2, 3) else None
        ),
    )
    retry_sleeps = Sleeps()
    shards = source(client, retry_sleeps=retry_sleeps, page_size=10).list_shards(wide_stream)
    assert ids(shards) == [shard_id(index) for index in range(WIDE_SHARD_COUNT)]
    assert client.calls["list_shards"] == 5
    assert len(retry_sleeps) == 2


def test_throttling_that_outlasts_the_retry_policy_surfaces_as_throttled(kinesis, wide_stream):
    client = FaultInjectingClient(kinesis, lambda method, call: client_error("LimitExceededException", "ListShards"))
    with pytest.raises(ThrottledError) as raised:
        source(client).list_shards(wide_stream)
    assert (raised.value.operation, raised.value.attempts, raised.value.retryable) == ("ListShards", 4, True)


def test_an_expired_next_token_restarts_the_listing_from_the_first_page(kinesis, wide_stream):
    client = FaultInjectingClient(
        kinesis,
        lambda method, call: (
            client_error("ExpiredNextTokenException", "ListShards") if method == "list_shards" and call == 2 else None
        ),
    )
    shards = source(client, page_size=10).list_shards(wide_stream)
    assert ids(shards) == [shard_id(index) for index in range(WIDE_SHARD_COUNT)]
    assert client.calls["list_shards"] == 1 + 1 + 3


def test_next_tokens_that_keep_expiring_give_up_after_a_few_restarts(kinesis, wide_stream):
    client = FaultInjectingClient(
        kinesis,
        lambda method, call: (
            client_error("ExpiredNextTokenException", "ListShards")
            if method == "list_shards" and call % 2 == 0
            else None
        ),
    )
    with pytest.raises(DependencyError, match="ExpiredNextTokenException") as raised:
        source(client, page_size=10).list_shards(wide_stream)
    assert raised.value.retryable
    assert client.calls["list_shards"] == 2 * (LISTING_RESTARTS + 1)


# --- stream identity ------------------------------------------------------------------------------------


@pytest.mark.parametrize("account_id", ["123456789012", None], ids=["signed-account", "default-account"])
def test_the_stream_identifier_carries_the_account_and_the_creation_second(kinesis_endpoint, unique_name, account_id):
    client = kinesis_client(kinesis_endpoint, account_id=account_id)
    before = time.time()
    create_stream(client, unique_name, 1)
    summary = client.describe_stream_summary(StreamName=unique_name)["StreamDescriptionSummary"]
    created = summary["StreamCreationTimestamp"]
    identifier = source(client).stream_identifier(unique_name)
    assert identifier == StreamIdentifier(account_id or "000000000000", unique_name, int(created.timestamp()))
    assert math.floor(before) <= identifier.creation_epoch <= time.time()


def test_the_stream_description_carries_the_arn_and_the_creation_millisecond(kinesis, wide_stream):
    summary = kinesis.describe_stream_summary(StreamName=wide_stream)["StreamDescriptionSummary"]
    description = source(kinesis).describe_stream(wide_stream)
    assert (description.stream_name, description.stream_arn) == (wide_stream, summary["StreamARN"])
    assert description.created_at == summary["StreamCreationTimestamp"]
    assert source(kinesis).describe_stream(wide_stream) == description, "the same stream reads the same each time"


# --- single shards: KCL's garbage check --------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed_name", "exists"),
    [
        pytest.param(8, True, id="an-open-shard"),
        pytest.param(0, True, id="a-closed-shard-still-in-retention"),
        pytest.param(None, False, id="a-shard-id-the-stream-never-had"),
    ],
)
def test_kinesis_is_asked_about_one_shard_at_a_time(kinesis, lineage, seed_name, exists):
    asked = shard_id(999) if seed_name is None else lineage.ids[seed_name]
    assert source(kinesis).shard_exists(lineage.name, asked) is exists


def test_a_shard_question_about_a_stream_in_use_is_reported_with_the_status_it_is_in(kinesis, wide_stream):
    def fault(method: str, call: int) -> Any:
        if method == "get_shard_iterator":
            return client_error("ResourceInUseException", "GetShardIterator")
        if method == "describe_stream_summary":
            return {"StreamDescriptionSummary": {"StreamName": wide_stream, "StreamStatus": "DELETING"}}
        return None

    with pytest.raises(StreamNotActiveError) as raised:
        source(FaultInjectingClient(kinesis, fault)).shard_exists(wide_stream, shard_id(0))
    assert (raised.value.status, raised.value.retryable) == ("DELETING", True)


def test_a_throttled_shard_question_is_retried(kinesis, wide_stream):
    client = FaultInjectingClient(
        kinesis,
        lambda method, call: (
            client_error("LimitExceededException", "GetShardIterator")
            if method == "get_shard_iterator" and call == 1
            else None
        ),
    )
    assert source(client).shard_exists(wide_stream, shard_id(3)) is True
    assert client.calls["get_shard_iterator"] == 2
