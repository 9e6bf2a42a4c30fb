"""Shard lineages as values, for the planner tests and the benchmarks (no Kinesis involved)."""

from __future__ import annotations

from lease_core.model.lease import MAX_HASH_KEY, HashKeyRange
from lease_core.model.shards import Shard


def shard_id(n: int) -> str:
    return f"shardId-{n:012d}"


class LineageBuilder:
    """Creates shards in order, closing parents on split and merge like Kinesis does."""

    def __init__(self, initial_shards: int) -> None:
        self._shards: dict[str, Shard] = {}
        self._next = 0
        self._sequence = 0
        width = (MAX_HASH_KEY + 1) // initial_shards
        for index in range(initial_shards):
            end = MAX_HASH_KEY if index == initial_shards - 1 else (index + 1) * width - 1
            self._add(HashKeyRange(index * width, end))

    def _add(self, hash_range: HashKeyRange, parent: str | None = None, adjacent: str | None = None) -> str:
        new_id = shard_id(self._next)
        self._next += 1
        self._sequence += 1000
        self._shards[new_id] = Shard(new_id, hash_range, str(self._sequence), parent, adjacent)
        return new_id

    def _close(self, closed_id: str) -> None:
        shard = self._shards[closed_id]
        self._sequence += 1000
        self._shards[closed_id] = Shard(
            shard.shard_id,
            shard.hash_key_range,
            shard.starting_sequence_number,
            shard.parent_shard_id,
            shard.adjacent_parent_shard_id,
            str(self._sequence),
        )

    def split(self, parent_id: str) -> tuple[str, str]:
        hash_range = self._shards[parent_id].hash_key_range
        middle = (hash_range.starting_hash_key + hash_range.ending_hash_key) // 2
        self._close(parent_id)
        low = self._add(HashKeyRange(hash_range.starting_hash_key, middle), parent_id)
        high = self._add(HashKeyRange(middle + 1, hash_range.ending_hash_key), parent_id)
        return low, high

    def merge(self, first_id: str, second_id: str) -> str:
        first, second = self._shards[first_id].hash_key_range, self._shards[second_id].hash_key_range
        self._close(first_id)
        self._close(second_id)
        return self._add(HashKeyRange(first.starting_hash_key, second.ending_hash_key), first_id, second_id)

    def shards(self) -> list[Shard]:
        return list(self._shards.values())

    def open_shard_ids(self) -> list[str]:
        return [shard.shard_id for shard in self._shards.values() if shard.is_open]
