"""The round's leader, as the DAG's steps do it: take the lock, sync and assign under it, hand it to the
consume job by owner name, keep the report of its last try (`finalize`), release it at the end (the
teardown that runs whatever happened).

`lead` is the work under the lock, shared with `dying_leader` (a leader process that is killed
while it holds the lock). The control plane talks to the emulators directly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from lease_core import aws
from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.leader.assignment_round import AssignmentCoordinator, AssignmentReport, slot_ids
from lease_core.leader.leader_lock import LeaderLock
from lease_core.leader.leadership import hold
from lease_core.lifecycle.lease_lifecycle import forget_reported_losses
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.sync.step import ShardSyncReport, sync_streams
from spark_jobs.round_report import RoundReport

TAKE_POLL_SECONDS = 0.5


class LockNeverFreed(RuntimeError):
    """The round's leader could not take the lock within the bound: nobody took a dead holder's lock over."""


def leader_lock(config: ConsumerConfig, owner: str) -> LeaderLock:
    state = LeaseApplication(config).state_store
    return LeaderLock(state, owner, config.leader_lease_duration_millis, config.leader_heartbeat_period_millis)


def lead(
    config: ConsumerConfig, owner: str, streams: Sequence[str], workers: int
) -> tuple[ShardSyncReport, AssignmentReport]:
    """Shard sync and one assignment round under the lock `owner` already holds (resumed by name)."""
    dynamodb = aws.client("dynamodb", config)
    with hold(leader_lock(config, owner), "chaos leader", acquire=False, release=False) as leadership:
        policy = leadership.retry_policy(aws.retry_policy(config))
        store = leadership.lease_store(DynamoDBLeaseStore(dynamodb, config.lease_table, retry_policy=policy))
        application = LeaseApplication(config)
        state = leadership.state_store(application.state_store_with(policy))
        metrics = application.worker_metrics
        source = KinesisShardSource(aws.client("kinesis", config), retry_policy=aws.retry_policy(config))
        synced = sync_streams(streams, config, store, source, state)
        assigned = AssignmentCoordinator(store, metrics, state, config).run(
            slot_ids(config.require_application_name(), workers), round_owner=owner
        )
    return synced, assigned


def finalize(config: ConsumerConfig, owner: str, report: RoundReport) -> tuple[str, ...]:
    """What the DAG's finalize step does to the leases once it kept the round's report: the retention
    losses the report names leave their leases (under the round's lock). The leases written."""
    dynamodb = aws.client("dynamodb", config)
    with hold(leader_lock(config, owner), "chaos finalize", acquire=False, release=False) as leadership:
        policy = leadership.retry_policy(aws.retry_policy(config))
        store = leadership.lease_store(DynamoDBLeaseStore(dynamodb, config.lease_table, retry_policy=policy))
        return forget_reported_losses(store, report.reported_losses())


def describe(synced: ShardSyncReport, assigned: AssignmentReport) -> str:
    """The leader's steps in one line, for the campaign log."""
    incomplete = [result.stream_name for result in synced.streams if result.listing_incomplete is not None]
    return (
        f"sync created {list(synced.created)} deleted {list(synced.deleted)} changed {list(synced.changed)}"
        + (f" INCOMPLETE LISTING {incomplete}" if incomplete else "")
        + f"; assignment round {assigned.round_number}: {len(assigned.moves)} move(s), "
        f"{assigned.lost_conditions} lost condition(s), spillover {list(assigned.spillover)}"
    )


@dataclass
class Taking:
    """How the round got its lock: the refusals it met (each naming a holder) and the time it waited."""

    waited_seconds: float = 0.0
    refusals: list[str] = field(default_factory=list)
    first_refusal_at: float | None = None


def take(config: ConsumerConfig, owner: str, give_up_after_seconds: float) -> Taking:
    """Acquire the lock as a DAG's take_leadership does, retrying every half second while it is held.

    Raises `LockNeverFreed` after `give_up_after_seconds` (a lock that is never taken over is a
    campaign violation).
    """
    lock = leader_lock(config, owner)
    taking = Taking()
    started = time.monotonic()
    while not lock.try_acquire():
        if taking.first_refusal_at is None:
            taking.first_refusal_at = time.monotonic()
        message = str(lock.unavailable())
        if not taking.refusals or taking.refusals[-1] != message:
            taking.refusals.append(message)
        if time.monotonic() - started > give_up_after_seconds:
            raise LockNeverFreed(f"{taking.refusals[-1]} (still refused after {give_up_after_seconds:.0f} s)")
        time.sleep(TAKE_POLL_SECONDS)
    taking.waited_seconds = time.monotonic() - started
    return taking


def release(config: ConsumerConfig, owner: str) -> str:
    """The teardown: resume the lock by owner name and release it. What happened, in a few words."""
    lock = leader_lock(config, owner)
    if lock.resume_as_owner():
        return "released" if lock.release() else "release refused"
    holder = lock.holder()
    return "free" if holder is None else f"held by {holder.owner_name}"
