"""A `ShardSource` held in memory: what Kinesis has, and what its listings answer, set apart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lease_core.errors import StreamNotFoundError
from lease_core.model.lease import StreamIdentifier
from lease_core.model.shards import InitialPositionInStream, Shard, StreamDescription

ACCOUNT = "123456789012"
CREATED_MILLIS = 1_700_000_000_000


def stream_description(name: str, created_millis: int = CREATED_MILLIS) -> StreamDescription:
    return StreamDescription(name, f"arn:aws:kinesis:us-east-1:{ACCOUNT}:stream/{name}", created_millis)


@dataclass
class FakeShardSource:
    """Streams by name. `shards` is what Kinesis has; `listing` (when set) rewrites what ListShards
    answers, as a partial or stale answer would; `probes` records every `shard_exists` question."""

    shards: dict[str, list[Shard]] = field(default_factory=dict)
    descriptions: dict[str, StreamDescription] = field(default_factory=dict)
    listing: Callable[[list[Shard]], list[Shard]] = lambda shards: shards
    probes: list[tuple[str, str]] = field(default_factory=list)

    def create_stream(self, name: str, shards: Sequence[Shard], created_millis: int = CREATED_MILLIS) -> None:
        self.shards[name] = list(shards)
        self.descriptions[name] = stream_description(name, created_millis)

    def _stream(self, name: str) -> list[Shard]:
        if name not in self.shards:
            raise StreamNotFoundError(name)
        return self.shards[name]

    def list_shards(self, stream_name: str) -> list[Shard]:
        return self.listing(list(self._stream(stream_name)))

    def list_shards_for_new_application(
        self, stream_name: str, initial_position: InitialPositionInStream
    ) -> list[Shard]:
        return [shard for shard in self.list_shards(stream_name) if shard.is_open]

    def describe_stream(self, stream_name: str) -> StreamDescription:
        self._stream(stream_name)
        return self.descriptions[stream_name]

    def stream_identifier(self, stream_name: str) -> StreamIdentifier:
        return StreamIdentifier(ACCOUNT, stream_name, self.describe_stream(stream_name).creation_epoch_millis // 1000)

    def shard_exists(self, stream_name: str, shard_id: str) -> bool:
        self.probes.append((stream_name, shard_id))
        return any(shard.shard_id == shard_id for shard in self._stream(stream_name))
