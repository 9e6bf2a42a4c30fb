"""One slot task: worker `<app>-worker-<i>` claims its leases, works them concurrently, reports.

docs/protocol.md §0 and §4.8: find my leases through the owner index, claim each (counter-conditional
renewal), heartbeat them at the renewer interval while working, read them on a thread pool, wait
for parents that have not reached SHARD_END, take up the children of the parents it ends, and at the
end publish the slot's utilization (its own CPU time over the data time its reads covered) for the
next assignment round. A lease that cannot be worked is reported, never silently skipped.

Errors of one lease stay in its report; an error that stops the whole slot (the lease table cannot
be read) propagates, and Spark retries the task. The retry claims the same leases again with a claim
token of its own, which fences the failed attempt if it is somehow still running.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import CorruptLeaseError, LeaseCoreError
from lease_core.leader.assignment_round import slot_ids
from lease_core.lifecycle.lease_holder import HeldLease, LeaseHeartbeat
from lease_core.lifecycle.lease_lifecycle import parents_have_finished
from lease_core.lifecycle.parent_watch import ParentWatch
from lease_core.metrics.throughput import claimed_measurement, measurement_before_claim
from lease_core.metrics.worker_metrics import (
    NO_SAMPLE,
    publish_worker_metrics,
    slot_utilization_percent,
)
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.lease_keys import LeaseKeyScheme
from sinks import open_round_sink
from spark_jobs.consume_spec import ConsumeSpec
from spark_jobs.decode import load_decoder
from spark_jobs.lease_consumer import (
    LeaseBudget,
    LeaseConsumer,
    LeaseContext,
    make_committed_visible,
    not_yet_visible,
)
from spark_jobs.round_report import LeaseReport, Outcome, SlotReport
from spark_jobs.slot_memory import hold_freed_memory, use_slot_memory_pool
from spark_jobs.transform import load_transform

log = logging.getLogger(__name__)

PARENT_POLL_SECONDS = 1.0
# How long the slot that ended a split's parent leaves its other children to slots out of work.
OFFER_SECONDS = 2 * PARENT_POLL_SECONDS
# Claims of one lease by one attempt while other attempts of its slot keep writing it.
CLAIM_ATTEMPTS = 3
# A batch (one output file) is never made smaller than this to share the slot's buffer: files of a few
# KB would cost more in requests and Parquet overhead than the memory they save.
MIN_BATCH_BYTES = 1024 * 1024
# Leases a slot reads at once when the spec does not say: beyond this many the slot's CPU, not the
# shards' cap, bounds it (the pipeline ran at ~22 MiB/s on 2 cores here: bench/catch_up_round.py), and
# boto3's connection pool (64, lease_core.aws) would churn connections.
DEFAULT_MAX_LEASE_THREADS = 64


@dataclass(frozen=True)
class _Offer:
    """Children of `parent` left for a slot out of work to take up, until `until` (monotonic seconds)."""

    parent: Lease
    until: float


@dataclass(frozen=True)
class _Placement:
    """Where a lease's shard lives: its stream, shard id, and how its relatives are keyed."""

    stream_name: str
    shard_id: str
    scheme: LeaseKeyScheme


class SlotTask:
    def __init__(self, spec: ConsumeSpec, slot_index: int, attempt: int = 0) -> None:
        self.spec = spec
        self.config: ConsumerConfig = spec.config
        self.worker_id = slot_ids(self.config.require_application_name(), spec.num_workers)[slot_index]
        self.attempt = attempt
        # Orders this slot's attempts (Spark's attempt numbers restart with each driver): the newest wins.
        self.started_millis = time.time_ns() // 1_000_000
        self._superseded = False  # a lease of this attempt was lost: take nothing more up
        app = LeaseApplication.from_config(self.config)
        app.stream_consumers.remember(spec.stream_consumer_arns)  # the driver's look-up (fan-out)
        self.store = app.lease_store
        self.metrics = app.worker_metrics
        self.context = LeaseContext(
            store=self.store,
            retrieval=app.retrieval,
            shards=app.shard_source,
            sink=open_round_sink(
                spec.output_uri,
                config=self.config,
                dead_letters=spec.processing.bad_record_policy.dead_letters,
                configuration=spec.sink_configuration,
                streams=spec.stream_incarnations,
            ),
            transform_spec=spec.processing.transform,
            transform=load_transform(spec.processing.transform),
            decoder=load_decoder(spec.processing.decode, spec.processing.decode_options),
            bad_records=spec.processing.bad_record_policy,
            application=self.config.require_application_name(),
            stream_incarnations=spec.stream_incarnations,
            at_timestamp=spec.at_timestamp,
            budget=spec.budget,
            closed_shards=spec.closed_shards,
        )

    def run(self) -> SlotReport:
        started, cpu_started = time.monotonic(), time.process_time()
        reports = self._work()
        # The slot's own process (a Spark Python worker runs one task at a time): all its threads.
        covered = max((report.covered_seconds for report in reports if report.covered_seconds), default=None)
        utilization = slot_utilization_percent(time.process_time() - cpu_started, covered)
        if utilization is not None:
            publish_worker_metrics(
                self.metrics,
                self.worker_id,
                utilization,
                now=int(time.time()),
                round=self.spec.round_number,
                keep=self.config.no_of_persisted_metrics_per_worker_metrics,
            )
        return SlotReport(
            self.worker_id,
            self.attempt,
            round(time.monotonic() - started, 3),
            NO_SAMPLE if utilization is None else utilization,
            tuple(reports),
        )

    def _work(self) -> list[LeaseReport]:
        reports: list[LeaseReport] = []
        workable: list[tuple[HeldLease, _Placement]] = []
        for lease in self.store.list_leases_for_owner(self.worker_id):
            placement = self._placement(lease)
            if placement is None:
                continue
            skipped = self._skip_reason(lease)
            if skipped is not None:
                invisible = self._finish_visibility(lease)
                reports.append(replace(self._untouched(lease, placement, *skipped), unpromoted_batch=invisible))
                continue
            held = self._claim(lease)
            if not held.is_lost:
                workable.append((held, placement))
            else:
                reports.append(self._untouched(lease, placement, Outcome.LOST, held.lost_reason))
        heartbeat = LeaseHeartbeat(
            (held for held, _ in workable), self.config.renewer_interval_millis, self.config.max_lease_renewal_threads
        )
        threads = reading_threads(self.spec.lease_threads, len(workable))
        self.context = replace(
            self.context,
            budget=batch_budget(self.spec, threads),
            busy_gate=threading.BoundedSemaphore(self.spec.busy_leases),
        )
        with heartbeat:
            reports.extend(self._work_concurrently(workable, heartbeat, threads))
        return reports

    def _claim(self, lease: Lease) -> HeldLease:
        """Claim `lease` for this attempt, fencing any other attempt of this slot.

        When an older attempt of this slot wrote the lease since it was read (a Spark task or Airflow
        try still running beside this newer one), the lease is read again and claimed from there: the
        newest attempt, by the time it started, wins. A newer attempt's claim, and anyone else's write
        (the leader moved the lease), end the claim.
        """
        token = f"{self.worker_id}/attempt-{self.attempt}/{self.started_millis}"
        for _ in range(CLAIM_ATTEMPTS):
            # The claim carries what a round that reads nothing would measure: one write for such a lease.
            # It also pins a lease at LATEST that is not pinned yet, so later rounds read on from here.
            now = self.context.wall_clock_millis()
            claimed = claimed_measurement(lease, self.spec.round_number, now).pinned_at_latest(now)
            held = HeldLease(self.store, claimed, self.config.failover_time_millis, claim_token=token)
            if held.claim():
                return held
            fresh = self.store.get_lease(lease.lease_key, consistent=True)
            if fresh is None or fresh.lease_owner != self.worker_id or fresh.is_in_handoff:
                return held
            if attempt_started_millis(fresh.claim_token) > self.started_millis:
                self._superseded = True
                return held  # a newer attempt of this slot holds it: this one is the zombie
            lease = fresh
        return held

    def _finish_visibility(self, lease: Lease) -> str | None:
        """A lease this attempt does not work on may still name committed batches readers cannot see:
        make them visible; the ones still invisible when that failed (the lease's report names them),
        else None."""
        try:
            make_committed_visible(self.context.sink, lease)
        except LeaseCoreError as error:  # the sink is the leases' business, not the whole slot's
            log.warning("lease %s: its committed batches could not be made visible: %s", lease.lease_key, error)
            return not_yet_visible(self.context.sink, lease.committed_batch)
        return None

    def _placement(self, lease: Lease) -> _Placement | None:
        """The lease's stream and shard, or None for a lease of a stream this job does not consume."""
        if not self.spec.multi_stream:
            if lease.is_multi_stream:
                log.warning("lease %s is a multi-stream lease; this job runs in single-stream mode", lease.lease_key)
                return None
            return _Placement(self.spec.streams[0], lease.lease_key, LeaseKeyScheme())
        if not lease.is_multi_stream or lease.stream_name is None or lease.shard_id is None:
            log.warning("lease %s is a single-stream lease; this job runs in multi-stream mode", lease.lease_key)
            return None
        stream = StreamIdentifier.parse(lease.stream_name)
        if stream.stream_name not in self.spec.streams:
            return None
        return _Placement(stream.stream_name, lease.shard_id, LeaseKeyScheme(stream))

    @staticmethod
    def _skip_reason(lease: Lease) -> tuple[str, str | None] | None:
        if lease.is_at_shard_end:
            return Outcome.FINISHED, None
        if lease.is_in_handoff:
            return Outcome.IN_HANDOFF, f"being handed from {lease.checkpoint_owner} to {lease.lease_owner}"
        return None

    def _untouched(self, lease: Lease, placement: _Placement, outcome: str, detail: str | None) -> LeaseReport:
        """A lease this attempt did not read: a finished one holds nothing more to land; any other is
        landed through where its last measured read ended (`LeaseReport.landed_through_millis`)."""
        checkpoint = str(lease.checkpoint)
        finished = outcome == Outcome.FINISHED
        return LeaseReport(
            lease.lease_key,
            placement.stream_name,
            placement.shard_id,
            self.worker_id,
            outcome,
            checkpoint,
            checkpoint,
            detail=detail,
            landed_through_millis=self.context.wall_clock_millis() if finished else measurement_before_claim(lease)[1],
        )

    def _work_concurrently(
        self, workable: list[tuple[HeldLease, _Placement]], heartbeat: LeaseHeartbeat, threads: int
    ) -> list[LeaseReport]:
        """Run every lease whose parents are done; re-check the waiting ones as work completes.

        Out of work, the slot stays while a parent that another slot of the round reads is closing:
        its children (ours waiting on it, or new ones nobody holds yet) are read in this round.
        """
        reports: list[LeaseReport] = []
        waiting = list(workable)
        running: dict[Future[LeaseReport], tuple[HeldLease, _Placement]] = {}
        offers: list[_Offer] = []
        watch = self._parent_watch()
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lease") as pool:
            while True:
                ready, waiting = self._split_ready(waiting, heartbeat, reports)
                for held, placement in ready:
                    running[pool.submit(self._consume, held, placement)] = (held, placement)
                if not running and offers:
                    offers = self._take_up_offered(offers, waiting, heartbeat, every=True)
                    continue
                if not running:
                    if not self._wait_for_parents(watch, waiting, heartbeat):
                        break
                    continue
                done, _ = wait(running, timeout=PARENT_POLL_SECONDS, return_when=FIRST_COMPLETED)
                for future in done:
                    held, placement = running.pop(future)
                    heartbeat.release(held)
                    report = future.result()
                    reports.append(report)
                    self._superseded = self._superseded or report.outcome == Outcome.LOST
                    if report.outcome == Outcome.SHARD_END:
                        self._take_up(
                            self._take_up_children(held.lease, limit=self._first_children), waiting, heartbeat
                        )
                        if self._first_children is not None:
                            offers.append(_Offer(held.lease, time.monotonic() + OFFER_SECONDS))
                offers = self._take_up_offered(offers, waiting, heartbeat, every=False)
        for held, placement in waiting:
            heartbeat.release(held)
            _settle_unread_measurement(held)
            reports.append(self._waiting_report(held, placement))
        return reports

    def _wait_for_parents(
        self, watch: ParentWatch, waiting: list[tuple[HeldLease, _Placement]], heartbeat: LeaseHeartbeat
    ) -> bool:
        """Out of work: poll the closing parents other slots read once, take up a child of those
        that ended, and pause; False when there is nothing (left) to wait for.

        An attempt that lost a lease (to a newer attempt of its slot, most likely) takes nothing more
        up; waiting is an optimization, so a failed read of the table ends it instead of the slot.
        """
        if self._superseded:
            watch.stop()
        elif self.spec.slots_run_together:
            watch.watch(self._parent_keys(waiting))
        if not watch.in_flight:
            return False
        try:
            taken = [
                child
                for parent in watch.poll(self.store)
                for child in self._take_up_children(parent, limit=self._first_children)
            ]
        except LeaseCoreError as error:
            log.warning("%s stops waiting for other slots' closing parents: %s", self.worker_id, error)
            watch.stop()
            return True
        self._take_up(taken, waiting, heartbeat)
        if not taken:
            time.sleep(PARENT_POLL_SECONDS)
        return True

    @property
    def _first_children(self) -> int | None:
        """How many children of an ended parent the slot takes at once; the rest are offered to slots
        out of work first, when there can be any (every slot runs at once)."""
        return 1 if self.spec.num_workers > 1 and self.spec.slots_run_together else None

    def _parent_watch(self) -> ParentWatch:
        slots = slot_ids(self.config.require_application_name(), self.spec.num_workers)
        # A failover time without a renewal is KCL's expiry; a poll more, for the poll's own delay.
        stale_after = self.config.failover_time_millis / 1000 + PARENT_POLL_SECONDS
        watch = ParentWatch(self.worker_id, slots, stale_after_seconds=stale_after)
        watch.watch(self.spec.closing_parents)
        return watch

    @staticmethod
    def _parent_keys(waiting: Iterable[tuple[HeldLease, _Placement]]) -> list[str]:
        return [
            placement.scheme.lease_key(parent) for held, placement in waiting for parent in held.lease.parent_shard_ids
        ]

    @staticmethod
    def _take_up(
        taken: list[tuple[HeldLease, _Placement]],
        waiting: list[tuple[HeldLease, _Placement]],
        heartbeat: LeaseHeartbeat,
    ) -> None:
        for held, placement in taken:
            heartbeat.add(held)
            waiting.append((held, placement))

    def _take_up_offered(
        self,
        offers: list[_Offer],
        waiting: list[tuple[HeldLease, _Placement]],
        heartbeat: LeaseHeartbeat,
        every: bool,
    ) -> list[_Offer]:
        """Take up the children still unheld of offers that ran out (of all offers with `every`)."""
        now, kept = time.monotonic(), []
        for offer in offers:
            if every or offer.until <= now:
                self._take_up(self._take_up_children(offer.parent), waiting, heartbeat)
            else:
                kept.append(offer)
        return kept

    def _take_up_children(self, parent: Lease, limit: int | None = None) -> list[tuple[HeldLease, _Placement]]:
        """Children of an ended parent that this slot takes up in this same round (at most `limit`).

        A child is taken when no slot owns it (it was created at this shard end, or by the slot that
        ended its other parent) and every parent of it has finished; the leader's owner-conditional
        assignment write makes exactly one slot get it. KCL workers pick children up within seconds;
        without this, a child's records would wait for the next round. The lease stays with the slot
        afterwards, as any assignment does. The slot that ended a split's parent takes one child and
        offers the others for `OFFER_SECONDS` to slots that are out of work (`ParentWatch`).
        """
        placement = self._placement(parent)
        if placement is None:
            return []
        taken: list[tuple[HeldLease, _Placement]] = []
        for child_id in sorted(parent.child_shard_ids):
            if limit is not None and len(taken) >= limit:
                break
            child = self.store.get_lease(placement.scheme.lease_key(child_id), consistent=True)
            if child is None or child.lease_owner is not None or child.is_at_shard_end:
                continue
            try:
                if not parents_have_finished(self.store, child, placement.scheme):
                    continue  # a merge's other parent is still being read: its slot takes the child up
            except CorruptLeaseError as error:  # the child waits for the repair; the sync names the item
                log.warning("lease %s is not taken up: %s", child.lease_key, error)
                continue
            assigned = self.store.assign_lease(child, self.worker_id)
            if not assigned.applied or assigned.lease is None:
                continue  # another slot that ended a parent took it
            held = self._claim(assigned.lease)
            if held.is_lost:
                continue
            log.info("lease %s: taken up in this round after its parent %s ended", child.lease_key, parent.lease_key)
            taken.append((held, _Placement(placement.stream_name, child_id, placement.scheme)))
        return taken

    def _split_ready(
        self, candidates: Iterable[tuple[HeldLease, _Placement]], heartbeat: LeaseHeartbeat, reports: list[LeaseReport]
    ) -> tuple[list[tuple[HeldLease, _Placement]], list[tuple[HeldLease, _Placement]]]:
        """The candidates whose parents have finished, and those still waiting. A lease whose parent's
        item cannot be read is neither: it is let go with a failed report naming the item, and only it
        stops; the slot's other leases are read."""
        ready: list[tuple[HeldLease, _Placement]] = []
        waiting: list[tuple[HeldLease, _Placement]] = []
        for held, placement in candidates:
            try:
                finished = held.is_lost or parents_have_finished(self.store, held.lease, placement.scheme)
            except CorruptLeaseError as error:
                heartbeat.release(held)
                _settle_unread_measurement(held)
                reports.append(self._blocked_report(held, placement, error))
                continue
            (ready if finished else waiting).append((held, placement))
        return ready, waiting

    def _blocked_report(self, held: HeldLease, placement: _Placement, error: CorruptLeaseError) -> LeaseReport:
        detail = (
            f"not read: a parent's lease item cannot be read ({error}); repair it (leasectl repair) and a "
            "later round reads this lease"
        )
        return replace(self._untouched(held.lease, placement, Outcome.FAILED, detail), retryable=False)

    def _consume(self, held: HeldLease, placement: _Placement) -> LeaseReport:
        consumer = LeaseConsumer(
            held, placement.stream_name, placement.shard_id, placement.scheme, self.worker_id, self.context
        )
        return consumer.run()

    def _waiting_report(self, held: HeldLease, placement: _Placement) -> LeaseReport:
        lease = held.lease
        parents = ", ".join(sorted(lease.parent_shard_ids))
        return self._untouched(
            lease, placement, Outcome.WAITING_FOR_PARENTS, f"parent shard(s) {parents} not at SHARD_END"
        )


def _settle_unread_measurement(held: HeldLease) -> None:
    """A lease claimed but never read this round gets back the measurement its claim stood in for."""
    if held.lease.measured_before_claim is None:
        return
    throughput, read_through = measurement_before_claim(held.lease)
    try:
        held.renew(throughput_kbps=throughput, read_through_millis=read_through)
    except LeaseCoreError as error:  # then a later round takes the stand-in for this round's measurement
        log.warning("lease %s: its measurement could not be put back: %s", held.lease_key, error)


def reading_threads(lease_threads: int | None, leases: int) -> int:
    """How many leases a slot reads at once: every one it holds, up to the spec's cap (at least 1)."""
    return max(1, min(DEFAULT_MAX_LEASE_THREADS if lease_threads is None else lease_threads, leases))


def batch_budget(spec: ConsumeSpec, threads: int) -> LeaseBudget:
    """The lease budget with each batch's bytes cut to its share of the slot's buffer."""
    share = max(MIN_BATCH_BYTES, spec.slot_buffer_bytes // threads)
    return replace(spec.budget, file_max_bytes=min(spec.budget.file_max_bytes, share))


def attempt_started_millis(claim_token: str | None) -> int:
    """When the slot attempt that wrote `claim_token` started (`SlotTask._claim`'s format), else 0."""
    parts = (claim_token or "").rsplit("/", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


def run_slot(spec: ConsumeSpec, slot_index: int) -> SlotReport:
    """The Spark task body: one slot, with the attempt number Spark gives this try."""
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    # Before the slot allocates: memory per reading thread, and a page fault per page of every block otherwise.
    use_slot_memory_pool()
    hold_freed_memory()
    try:
        return SlotTask(spec, slot_index, attempt).run()
    except LeaseCoreError as error:
        # Raised again with its message first, which is what Spark shows for the failed task.
        raise RuntimeError(f"slot {slot_index} (attempt {attempt}) failed: {error}") from error


def slot_reports(spark: Any, spec: ConsumeSpec) -> list[SlotReport]:
    """Run the round's W slot tasks on the cluster and collect their reports."""
    context = spark.sparkContext
    context.setJobDescription(f"consume round {spec.round_number}: {spec.num_workers} slot(s)")
    slots = context.parallelize(range(spec.num_workers), spec.num_workers)
    return slots.map(lambda index: run_slot(spec, index)).collect()
