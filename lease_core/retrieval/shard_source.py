"""Listing a stream's shards from Kinesis (docs/protocol.md §3.2, §7).

`ShardSource` is the seam shard sync lists shards through; `KinesisShardSource` implements it over a
boto3 Kinesis client. Two listings exist, as in KCL:

- the full listing (no filter), used when the lease table already holds leases;
- the filtered listing for a new application (empty lease table), whose ShardFilter follows the
  initial position and whose answer must tile the whole hash key space, else it is retried.

A listing is never proof that a shard is gone: cleanup asks about one shard at a time
(`shard_exists`, KCL's garbage check of docs/protocol.md §3.10).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.errors import (
    DependencyError,
    IncompleteShardListError,
    StreamNotActiveError,
    StreamNotFoundError,
)
from lease_core.model.lease import MAX_HASH_KEY, StreamIdentifier
from lease_core.model.shards import InitialPosition, InitialPositionInStream, Shard, StreamDescription
from lease_core.retry import RetryPolicy

# KCL's HierarchicalShardSyncer: 3 attempts at a complete filtered listing, 1 s apart.
FILTERED_LISTING_ATTEMPTS = 3
FILTERED_LISTING_RETRY_SECONDS = 1.0
# A NextToken lives 300 s; a listing that keeps outliving its tokens will not get better by retrying.
LISTING_RESTARTS = 3

T = TypeVar("T")


class ShardSource(Protocol):
    """Where shard sync gets a stream's shards and identity from."""

    def list_shards(self, stream_name: str) -> list[Shard]:
        """Every shard of the stream (open and closed, all pages), in the order Kinesis lists them."""
        ...

    def list_shards_for_new_application(
        self, stream_name: str, initial_position: InitialPositionInStream
    ) -> list[Shard]:
        """The shards a new application starts from; they cover the whole hash key space exactly."""
        ...

    def stream_identifier(self, stream_name: str) -> StreamIdentifier:
        """The multi-stream identity of the stream: account id and creation epoch seconds."""
        ...

    def describe_stream(self, stream_name: str) -> StreamDescription:
        """The stream the name stands for now: its ARN and creation time."""
        ...

    def shard_exists(self, stream_name: str, shard_id: str) -> bool:
        """Whether Kinesis still knows the shard; False only when it says the shard does not exist.

        A missing stream raises `StreamNotFoundError` instead: a deleted stream must never read as
        "each of its shards is gone".
        """
        ...


# --- pure helpers ---------------------------------------------------------------------------------


def shard_filter(initial_position: InitialPositionInStream) -> dict[str, Any]:
    """The ListShards ShardFilter KCL derives from the initial position (§3.2)."""
    if initial_position.position is InitialPosition.AT_TIMESTAMP:
        return {"Type": "AT_TIMESTAMP", "Timestamp": initial_position.timestamp}
    if initial_position.position is InitialPosition.LATEST:
        return {"Type": "AT_LATEST"}
    return {"Type": "AT_TRIM_HORIZON"}


def hash_space_gap(shards: Iterable[Shard]) -> str | None:
    """None when the shards tile [0, 2^128-1] exactly; otherwise the first gap or overlap, in words."""
    ordered = sorted(shards, key=lambda shard: shard.hash_key_range.starting_hash_key)
    if not ordered:
        return "no shards were listed"
    first, last = ordered[0], ordered[-1]
    if first.hash_key_range.starting_hash_key != 0:
        return f"hash keys 0..{first.hash_key_range.starting_hash_key - 1} before {first.shard_id} are not covered"
    for previous, following in itertools.pairwise(ordered):
        problem = _seam_problem(previous, following)
        if problem is not None:
            return problem
    if last.hash_key_range.ending_hash_key != MAX_HASH_KEY:
        end = last.hash_key_range.ending_hash_key
        return f"hash keys {end + 1}..{MAX_HASH_KEY} after {last.shard_id} are not covered"
    return None


def _seam_problem(previous: Shard, following: Shard) -> str | None:
    end = previous.hash_key_range.ending_hash_key
    start = following.hash_key_range.starting_hash_key
    if start == end + 1:
        return None
    if start > end + 1:
        return f"hash keys {end + 1}..{start - 1} between {previous.shard_id} and {following.shard_id} are not covered"
    overlap_end = min(end, following.hash_key_range.ending_hash_key)
    return f"{previous.shard_id} and {following.shard_id} overlap on hash keys {start}..{overlap_end}"


def child_shards_of(shards: Iterable[Shard], shard_id: str) -> list[Shard]:
    """The shards whose parent or adjacent parent is `shard_id`, in listing order."""
    return [shard for shard in shards if shard_id in shard.parent_shard_ids]


def account_id_of(stream_arn: str) -> str:
    """The account field of `arn:aws:kinesis:<region>:<account>:stream/<name>`."""
    parts = stream_arn.split(":")
    if len(parts) < 6 or parts[0] != "arn":
        raise ValueError(f"not a stream ARN: {stream_arn!r}")
    return parts[4]


# --- Kinesis ---------------------------------------------------------------------------------------


class _ExpiredNextToken(Exception):
    """A page's NextToken expired; the listing must start again from its first page."""


class _StreamBusy(Exception):
    """Kinesis answered ResourceInUseException: the stream is CREATING or DELETING."""


# ListShards error codes that end the page call without retrying it; each is handled by the listing.
_LISTING_SIGNALS: dict[str, type[Exception]] = {
    "ResourceNotFoundException": StreamNotFoundError,
    "ResourceInUseException": _StreamBusy,
    "ExpiredNextTokenException": _ExpiredNextToken,
}


class KinesisShardSource:
    """`ShardSource` over a boto3 Kinesis client; throttling is retried by the retry policy."""

    def __init__(
        self,
        client: Any,
        retry_policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        page_size: int | None = None,
    ) -> None:
        self.client = client
        self._caller = AwsCaller("kinesis", retry_policy or RetryPolicy())
        self._sleep = sleep
        self._page_size = page_size

    def list_shards(self, stream_name: str) -> list[Shard]:
        return self._list(stream_name, {})

    def list_shards_for_new_application(
        self, stream_name: str, initial_position: InitialPositionInStream
    ) -> list[Shard]:
        arguments = {"ShardFilter": shard_filter(initial_position)}
        gap = None
        for attempt in range(FILTERED_LISTING_ATTEMPTS):
            if attempt:
                self._sleep(FILTERED_LISTING_RETRY_SECONDS)
            shards = self._list(stream_name, arguments)
            gap = hash_space_gap(shards)
            if gap is None:
                return shards
        raise IncompleteShardListError(stream_name, f"{gap} (after {FILTERED_LISTING_ATTEMPTS} attempts)")

    def stream_identifier(self, stream_name: str) -> StreamIdentifier:
        description = self.describe_stream(stream_name)
        return StreamIdentifier(
            account_id=account_id_of(description.stream_arn),
            stream_name=stream_name,
            # KCL keeps whole seconds (Instant.getEpochSecond).
            creation_epoch=description.creation_epoch_millis // 1000,
        )

    def describe_stream(self, stream_name: str) -> StreamDescription:
        return StreamDescription.from_api(self._describe_summary(stream_name))

    def shard_exists(self, stream_name: str, shard_id: str) -> bool:
        """GetShardIterator LATEST on the shard, as KCL's garbage check asks (it then reads the
        child shards, which the listing already gives here).

        Kinesis (and kinesis-mock, measured) answers ResourceNotFoundException both for a shard
        id the stream does not have and for a stream that does not exist; only a stream that
        DescribeStreamSummary still finds makes it the shard's answer. A closed shard still in
        retention exists (an iterator is handed out, GetRecords would answer its ChildShards).
        """

        def call() -> bool:
            try:
                self.client.get_shard_iterator(StreamName=stream_name, ShardId=shard_id, ShardIteratorType="LATEST")
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    return False
                if error_code(error) == "ResourceInUseException":
                    raise _StreamBusy(stream_name) from error
                raise
            return True

        exists = self._call_on_stream("GetShardIterator", stream_name, call)
        if not exists:
            self._describe_summary(stream_name)  # StreamNotFoundError when the stream is what is missing
        return exists

    # --- listing ---------------------------------------------------------------------------------

    def _list(self, stream_name: str, first_page_arguments: dict[str, Any]) -> list[Shard]:
        for _ in range(LISTING_RESTARTS + 1):
            try:
                return self._list_all_pages(stream_name, first_page_arguments)
            except _ExpiredNextToken:
                continue  # the shards seen so far may be stale too: start over from the first page
        raise DependencyError(
            "kinesis",
            "ListShards",
            f"ExpiredNextTokenException: the listing of {stream_name!r} outlived its NextToken "
            f"{LISTING_RESTARTS + 1} times",
            LISTING_RESTARTS + 1,
        )

    def _list_all_pages(self, stream_name: str, first_page_arguments: dict[str, Any]) -> list[Shard]:
        page = self._list_page(stream_name, {"StreamName": stream_name, **first_page_arguments})
        shards = [Shard.from_api(entry) for entry in page.get("Shards", ())]
        while page.get("NextToken"):
            # The API refuses StreamName or ShardFilter next to a NextToken: the token carries both.
            page = self._list_page(stream_name, {"NextToken": page["NextToken"]})
            shards.extend(Shard.from_api(entry) for entry in page.get("Shards", ()))
        return shards

    def _list_page(self, stream_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self._page_size is not None:
            arguments = {**arguments, "MaxResults": self._page_size}

        def call() -> dict[str, Any]:
            try:
                page: dict[str, Any] = self.client.list_shards(**arguments)
                return page
            except botocore.exceptions.ClientError as error:
                signal = _LISTING_SIGNALS.get(error_code(error) or "")
                if signal is None:
                    raise  # throttling and the rest are the retry policy's business
                raise signal(stream_name) from error

        return self._call_on_stream("ListShards", stream_name, call)

    def _call_on_stream(self, operation: str, stream_name: str, call: Callable[[], T]) -> T:
        """`call` under the retry policy; `_StreamBusy` becomes the stream's status (CREATING, DELETING)."""
        try:
            return self._caller.call(operation, call)
        except _StreamBusy:
            raise StreamNotActiveError(stream_name, self._stream_status(stream_name)) from None

    # --- describing ------------------------------------------------------------------------------

    def _describe_summary(self, stream_name: str) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            try:
                summary: dict[str, Any] = self.client.describe_stream_summary(StreamName=stream_name)[
                    "StreamDescriptionSummary"
                ]
                return summary
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    raise StreamNotFoundError(stream_name) from error
                raise

        return self._caller.call("DescribeStreamSummary", call)

    def _stream_status(self, stream_name: str) -> str:
        return str(self._describe_summary(stream_name)["StreamStatus"])
