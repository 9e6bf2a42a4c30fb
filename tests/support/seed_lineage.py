"""The seed issue's example lineage: as values for the planner tests, and resharded for real on kinesis-mock.

Six uniform shards 0..5; merge 0+1 -> 6, 2+3 -> 7, 6+7 -> 8; split 5 -> 9 (lower half) and 10; 4 untouched.
"""

from __future__ import annotations

from typing import Any

from devtools.kinesis_streams import create_stream, merge_shards, open_shards, split_shard
from devtools.shard_lineage import LineageBuilder, shard_id
from lease_core.model.shards import Shard

# The lineage of the seed issue, by seed name: child -> its parents (merges list ShardToMerge first).
SEED_LINEAGE_PARENTS: dict[int, tuple[int, ...]] = {6: (0, 1), 7: (2, 3), 8: (6, 7), 9: (5,), 10: (5,)}
SEED_OPEN_SHARDS = (4, 8, 9, 10)


def seed_lineage() -> list[Shard]:
    """The lineage as values, shard n named `shard_id(n)`."""
    lineage = LineageBuilder(6)
    lineage.merge(shard_id(0), shard_id(1))
    lineage.merge(shard_id(2), shard_id(3))
    lineage.merge(shard_id(6), shard_id(7))
    lineage.split(shard_id(5))
    return lineage.shards()


def build_seed_lineage(client: Any, stream: str) -> dict[int, str]:
    """Create `stream` and reshard it into the seed lineage; the real shard id of each seed name 0..10.

    The ids are taken from what kinesis-mock answers, so the mapping holds however it numbers shards.
    """
    create_stream(client, stream, 6)
    ids = {seed: shard.shard_id for seed, shard in enumerate(open_shards(client, stream))}
    ids[6] = merge_shards(client, stream, ids[0], ids[1])
    ids[7] = merge_shards(client, stream, ids[2], ids[3])
    ids[8] = merge_shards(client, stream, ids[6], ids[7])
    ids[9], ids[10] = split_shard(client, stream, ids[5])
    return ids
