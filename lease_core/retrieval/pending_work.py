"""Whether a round has anything to consume: the leader's idle check, over a lease table it already holds.

The check runs over the shard sync's own view of the table (its scan plus its writes), so that an
idle round costs one scan of the lease table, not one per step. A lease needs the round when it
carries retention losses no kept report has named, has a prepared batch to finish, is at LATEST
with no pin yet (`Lease.latest_since`: leases from before pins, or reset to LATEST), is of a shard
the listing says is closed and has not reached SHARD_END (the end of a closed shard is a null
iterator, which the reader may only see a call after the last record: the children wait for it),
has a record after its checkpoint (after its pin, at LATEST), has reached its shard's end, or has
committed batches readers cannot see yet (making them visible was cut short; the sink says, through
`awaiting_visibility`, from the lease's record of them). A lease the check could not read (an
error, or every GetRecords throttled by the shard's other readers) counts as work too: "idle" must
mean nothing to read, never "could not look". Records that aged out unread with none after them
are not work on their own: the round that reads the next record reports them (a round would report
the same gap every time). Leases are looked at without a call first; then a read of one record per
open lease through the retrieval it is given (polling: one GetShardIterator and one short GetRecords),
a few at a time, stopping at the first lease with work. In fan-out mode too the check polls
(`LeaseApplication.idle_check_retrieval`): one short GetRecords costs a fifth of a shard's calls for
one second, where a subscription per lease would hold the lease's shard for seconds (an event comes
at the tip only as a heartbeat), spend its one SubscribeToShard a second, and bill fan-out's per-GB
retrieval (docs/cost.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from lease_core.config.settings import ConsumerConfig, parse_iso_timestamp
from lease_core.errors import LeaseCoreError
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.sequence import AT_TIMESTAMP, LATEST
from lease_core.retrieval.kinesis_records import KinesisRecord
from lease_core.retrieval.record_source import ReadBatch, ReadLimits, ReadStart, Retrieval, ShardToRead

# Reads in flight at once: the check's wall time at 1,000 idle leases is ~1,000 round trips.
CHECK_THREADS = 16
# Kinesis serves 5 GetRecords a second per shard: a probe takes one call's share of the read budget.
PROBE_CALLS_PER_SECOND = 5
# A shard takes at most 1 MiB/s of writes: no page arrived faster.
SHARD_WRITE_BYTES_PER_SECOND = 1024 * 1024


@dataclass(frozen=True)
class PendingWork:
    """The check's answer: the first lease found with work and why, or none (`idle`)."""

    open_leases: int  # leases not at SHARD_END, the ones the check may have read
    lease_key: str | None = None
    reason: str | None = None

    @property
    def idle(self) -> bool:
        return self.lease_key is None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "idle": self.idle}

    @classmethod
    def from_dict(cls, value: Any, source: str) -> PendingWork:
        """The answer as `to_dict` wrote it (an XCom); `source` names where it came from in the error."""
        if not isinstance(value, Mapping) or not isinstance(value.get("open_leases"), int):
            raise ValueError(f"{source} holds no idle-check answer (open_leases, lease_key, reason): {value!r}")
        return cls(int(value["open_leases"]), value.get("lease_key"), value.get("reason"))

    def summary(self) -> str:
        if self.idle:
            return f"no new records in {self.open_leases} open lease(s)"
        return f"lease {self.lease_key}: {self.reason}"


def find_pending_work(
    leases: Sequence[Lease],
    stream_names: Sequence[str],
    retrieval: Retrieval,
    config: ConsumerConfig,
    threads: int = CHECK_THREADS,
    closed_lease_keys: Collection[str] = (),
    awaiting_visibility: Callable[[Lease], tuple[str, ...]] | None = None,
) -> PendingWork:
    """The first of `leases` that needs a round (module doc), or an idle answer; `stream_names` are
    the round's streams (a single-stream lease key names only its shard, and a multi-stream lease of
    another stream is not the round's). `retrieval` reads the leases' shards (the application's
    `idle_check_retrieval`). `closed_lease_keys`: the leases of shards the sync's listing
    says are closed. `awaiting_visibility`: the names of a lease's committed batches that readers
    cannot see yet (the sink's answer; None: not asked)."""
    leases = [lease for lease in leases if _of_streams(lease, stream_names)]
    open_leases = [lease for lease in leases if not lease.is_at_shard_end]
    for lease in leases:
        reason = _work_without_reading(lease, closed_lease_keys)
        if reason is not None:
            return PendingWork(len(open_leases), lease.lease_key, reason)
    finished_waiting = _finished_with_batches_waiting(leases, awaiting_visibility)
    if finished_waiting is not None:
        return PendingWork(len(open_leases), *finished_waiting)
    timestamp = config.initial_position_timestamp
    at_timestamp = None if timestamp is None else parse_iso_timestamp(timestamp)

    def work_in_shard(lease: Lease) -> str | None:
        if lease.checkpoint == AT_TIMESTAMP and at_timestamp is None:
            return "it starts AT_TIMESTAMP, and the round has no initial_position_timestamp to read it from"
        stream, shard = _stream_and_shard(lease, stream_names)
        start = ReadStart(lease.checkpoint, at_timestamp=at_timestamp, latest_since=lease.latest_since)
        reader = retrieval.open(ShardToRead(stream, shard), start)
        try:
            awaiting = () if awaiting_visibility is None else awaiting_visibility(lease)
            if awaiting:
                return f"committed batches are not visible yet: {', '.join(awaiting)}"
            batch = reader.read(ReadLimits(max_records=1))
            if batch.records:
                return "records after its checkpoint"
            if batch.shard_ended:
                return "its shard has ended"
            if batch.stopped_by == "throttled":
                return (
                    f"it could not be read here: all {batch.calls} {reader.operation} were throttled "
                    "(the shard's read limits are shared with its other consumers)"
                )
        except LeaseCoreError as error:
            # The consume step meets the same error on this lease alone (a shard gone since the
            # listing, a refusal, the sink unreachable) and reports it there; the check must not
            # fail the whole sync step.
            return f"it could not be read here ({type(error).__name__}: {error})"
        finally:
            reader.close()
        return None

    return _first_with_work(open_leases, work_in_shard, threads)


def probe_unmeasured_leases(
    leases: Sequence[Lease],
    stream_names: Sequence[str],
    retrieval: Retrieval,
    config: ConsumerConfig,
    clock_millis: Callable[[], int],
    threads: int = CHECK_THREADS,
) -> dict[str, float]:
    """The load signal, in KB/s, of each open lease of the round's streams with no throughput yet,
    from one page of it read where the lease stands (`estimated_backlog`, `probed_throughputs`).

    The page is at most a fifth of a second of the shard's read budget (`shard_read_limit_kbps`),
    as one of Kinesis' five calls a second would be, so the round's reader finds the shard's burst
    all but whole. A lease whose page was throttled, refused or failed, or says nothing, is left
    out: the assignment then gives it the average, as it does without a probe.
    """
    unmeasured = [
        lease
        for lease in leases
        if _of_streams(lease, stream_names) and not lease.is_at_shard_end and lease.throughput_kbps is None
    ]
    limits = ReadLimits(max_bytes=max(1, int(config.shard_read_limit_kbps * 1024 / PROBE_CALLS_PER_SECOND)))
    timestamp = config.initial_position_timestamp
    at_timestamp = None if timestamp is None else parse_iso_timestamp(timestamp)

    def probe(lease: Lease) -> Backlog | None:
        stream, shard = _stream_and_shard(lease, stream_names)
        start = ReadStart(lease.checkpoint, at_timestamp=at_timestamp, latest_since=lease.latest_since)
        try:
            reader = retrieval.open(ShardToRead(stream, shard), start)
        except ValueError:  # a start it cannot read (AT_TIMESTAMP without its timestamp): no signal
            return None
        try:
            page = reader.read(limits)
        except LeaseCoreError:  # refused, the shard gone: the round reports it; here, no signal
            return None
        finally:
            reader.close()
        return None if page.stopped_by == "throttled" else _backlog_of(page)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        backlogs = dict(zip((lease.lease_key for lease in unmeasured), pool.map(probe, unmeasured)))
    return probed_throughputs(
        {key: backlog for key, backlog in backlogs.items() if backlog is not None}, clock_millis()
    )


@dataclass(frozen=True)
class Backlog:
    """What one page says waits on a lease: bytes, and the arrival of the first of them (None: nothing)."""

    bytes: float
    first_arrival_millis: int | None


def _backlog_of(page: ReadBatch) -> Backlog | None:
    records = page.records
    first, last = (_arrival_millis(records[0]), _arrival_millis(records[-1])) if records else (None, None)
    behind = 0 if page.shard_ended else page.millis_behind_latest  # a closed shard's page holds all of it
    return estimated_backlog(page.bytes, first, last, behind)


def estimated_backlog(
    page_bytes: int, first_arrival_millis: int | None, last_arrival_millis: int | None, millis_behind_latest: int | None
) -> Backlog | None:
    """The bytes waiting on a lease, from one page read where it stands (docs/protocol.md §6): the page
    itself when it reached the tip (MillisBehindLatest 0); otherwise the page plus MillisBehindLatest
    at the page's arrival rate, which no shard exceeds beyond its write limit (so a page that arrived
    in one instant still has a rate). None when the page cannot say: no MillisBehindLatest, or empty
    behind the tip."""
    if page_bytes < 0:
        raise ValueError(f"page_bytes must be >= 0, got {page_bytes}")
    if millis_behind_latest is None:
        return None
    if first_arrival_millis is None or last_arrival_millis is None:
        return Backlog(0.0, None) if millis_behind_latest == 0 else None
    span_seconds = max((last_arrival_millis - first_arrival_millis) / 1000, page_bytes / SHARD_WRITE_BYTES_PER_SECOND)
    rest = page_bytes / span_seconds * millis_behind_latest / 1000 if span_seconds > 0 else 0.0
    return Backlog(page_bytes + rest, first_arrival_millis)


def probed_throughputs(backlogs: Mapping[str, Backlog], now_millis: int) -> dict[str, float]:
    """KB/s per lease: each backlog over one window for all, from the earliest first arrival to now.

    One window, not each lease's own: the probed leases are read in the same round, so their work
    there is their backlog, and a window per lease would weigh a shard whose data came a second
    earlier as lighter. A lease whose round then measures its own window moves on from this figure.
    """
    arrivals = [
        backlog.first_arrival_millis for backlog in backlogs.values() if backlog.first_arrival_millis is not None
    ]
    seconds = (now_millis - min(arrivals)) / 1000 if arrivals else 0.0
    if seconds <= 0:
        return {key: 0.0 for key, backlog in backlogs.items() if backlog.bytes == 0}
    return {key: backlog.bytes / 1024 / seconds for key, backlog in backlogs.items()}


def _arrival_millis(record: KinesisRecord) -> int:
    return int(record.approximate_arrival_timestamp.timestamp() * 1000)


def _finished_with_batches_waiting(
    leases: Sequence[Lease], awaiting_visibility: Callable[[Lease], tuple[str, ...]] | None
) -> tuple[str, str] | None:
    """A lease at SHARD_END whose last committed batches readers cannot see yet (a table's commit at
    the round's end failed): only a round's publication makes them visible, so it is work, however
    quiet its children are. (lease key, reason), or None."""
    if awaiting_visibility is None:
        return None
    for lease in leases:
        if not (lease.is_at_shard_end and lease.committed_batch):
            continue
        try:
            awaiting = awaiting_visibility(lease)
        except LeaseCoreError as error:
            return lease.lease_key, f"its committed batches could not be checked here ({type(error).__name__}: {error})"
        if awaiting:
            return lease.lease_key, f"committed batches are not visible yet: {', '.join(awaiting)}"
    return None


def _work_without_reading(lease: Lease, closed_lease_keys: Collection[str]) -> str | None:
    if lease.unreported_losses:  # an earlier round's driver died before its report named them
        return "retention losses wait to be reported"
    if lease.is_at_shard_end:
        return None
    if lease.pending_checkpoint is not None:
        return "a prepared batch waits to be committed"
    if lease.lease_key in closed_lease_keys:
        return "its shard is closed and the lease has not reached SHARD_END"
    if lease.checkpoint == LATEST and lease.latest_since is None:
        return "at LATEST with no pin: the first round that claims it pins where it reads from"
    return None


def _first_with_work(leases: Sequence[Lease], work_in: Callable[[Lease], str | None], threads: int) -> PendingWork:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        # map() hands answers back in order; at the first one with work, the calls not yet started
        # are cancelled (closing map's iterator would too, but only once it is collected).
        for lease, reason in zip(leases, pool.map(work_in, leases)):
            if reason is not None:
                pool.shutdown(wait=True, cancel_futures=True)
                return PendingWork(len(leases), lease.lease_key, reason)
    return PendingWork(len(leases))


def _of_streams(lease: Lease, stream_names: Sequence[str]) -> bool:
    """False for a lease of a stream the round does not consume (a former stream's, kept until its
    deletion, or one whose stream identifier is not one): the consume job leaves it alone."""
    if lease.stream_name is None:
        return True
    try:
        return StreamIdentifier.parse(lease.stream_name).stream_name in stream_names
    except ValueError:
        return False


def _stream_and_shard(lease: Lease, stream_names: Sequence[str]) -> tuple[str, str]:
    if lease.stream_name is not None and lease.shard_id is not None:
        return StreamIdentifier.parse(lease.stream_name).stream_name, lease.shard_id
    return stream_names[0], lease.lease_key
