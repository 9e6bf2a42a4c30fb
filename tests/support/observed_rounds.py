"""A consumed round as its metrics see it (`lease_core.metrics.round_metrics.RoundObservation`), for the
tests of the exporters."""

from __future__ import annotations

from lease_core.metrics.freshness import Freshness
from lease_core.metrics.round_metrics import LeaseObservation, RoundObservation, SlotObservation


def observed_round(application: str, shards: int, end_millis: int) -> RoundObservation:
    """A consumed round over `shards` shards: shard i landed i + 1 records and is i seconds behind its tip."""
    leases = tuple(
        LeaseObservation(
            lease_key=f"shardId-{index:012d}",
            shard_id=f"shardId-{index:012d}",
            worker_id=f"{application}-worker-{index % 2}",
            records=index + 1,
            bytes=100 * (index + 1),
            seconds=1.5,
            millis_behind_latest=1000 * index,
            read_calls=2,
            refused_read_calls=0,
            dead_lettered=0,
            failed=False,
            lost=False,
            freshness=Freshness(end_millis - 1000 * index - 500, end_millis - 1000 * index - 700),
        )
        for index in range(shards)
    )
    return RoundObservation(
        application=application,
        finished_at_millis=end_millis,
        idle=False,
        succeeded=True,
        consumed=True,
        seconds=20.0,
        records=sum(lease.records for lease in leases),
        bytes=sum(lease.bytes for lease in leases),
        dead_lettered=0,
        lost_leases=0,
        retention_losses=0,
        freshness=Freshness.of_leases(lease.freshness for lease in leases),
        total_leases=shards,
        workers=2,
        moves=0,
        leases=leases,
        slots=(SlotObservation(f"{application}-worker-0", 18.0), SlotObservation(f"{application}-worker-1", 17.0)),
    )
