"""Benchmark: planning a shard sync over a 10,000-shard lineage (issue 3).

The lineage starts with 1,000 shards and goes through six generations of resharding (split every
open shard, merge open shards pairwise, three times over): 10,000 shards, 1,000 of them open.
Each case plans against 0, half (a seeded random half) and all shards already leased, under LATEST
and TRIM_HORIZON. Times are the best of several runs; the ratio column compares each case with
the empty-table plan over the same listing (one lease per shard, the least work a plan can do),
measured in the same run.

Run: .venv/bin/python bench/shard_sync_planning.py
"""

from __future__ import annotations

import functools
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.shard_lineage import LineageBuilder
from lease_core.model.shards import InitialPosition, Shard
from lease_core.sync.planner import plan_for_empty_table, plan_for_existing_leases

REPEATS = 5


def ten_thousand_shard_lineage() -> list[Shard]:
    lineage = LineageBuilder(1000)
    for _ in range(3):
        for shard_id in lineage.open_shard_ids():
            lineage.split(shard_id)
        open_ids = lineage.open_shard_ids()
        for first, second in zip(open_ids[0::2], open_ids[1::2]):
            lineage.merge(first, second)
    return lineage.shards()


T = TypeVar("T")


def best_seconds(function: Callable[[], T]) -> tuple[float, T]:
    seconds, results = [], []
    for _ in range(REPEATS):
        started = time.perf_counter()
        results.append(function())
        seconds.append(time.perf_counter() - started)
    return min(seconds), results[-1]


def main() -> None:
    shards = ten_thousand_shard_lineage()
    open_count = sum(shard.is_open for shard in shards)
    all_ids = [shard.shard_id for shard in shards]
    half = set(random.Random(7).sample(all_ids, len(all_ids) // 2))
    baseline, _ = best_seconds(lambda: plan_for_empty_table(shards, InitialPosition.TRIM_HORIZON))
    print(f"lineage: {len(shards)} shards, {open_count} open; best of {REPEATS} runs\n")
    header = f"{'case':<44}{'leases planned':>15}{'time (ms)':>12}{'ratio':>8}"
    print(header)
    print("-" * len(header))
    print(f"{'empty table (baseline), TRIM_HORIZON':<44}{len(shards):>15}{baseline * 1000:>12.1f}{1.0:>8.2f}")
    for position in (InitialPosition.LATEST, InitialPosition.TRIM_HORIZON):
        cases: tuple[tuple[str, set[str]], ...] = (
            ("0 leased", set()),
            ("half leased", half),
            ("all leased", set(all_ids)),
        )
        for label, leased in cases:
            seconds, plan = best_seconds(functools.partial(plan_for_existing_leases, shards, leased, position))
            name = f"{label}, {position.value}"
            print(f"{name:<44}{len(plan):>15}{seconds * 1000:>12.1f}{seconds / baseline:>8.2f}")


if __name__ == "__main__":
    main()
