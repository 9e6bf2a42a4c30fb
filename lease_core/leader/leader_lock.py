"""The leader lock: one round at a time per application (docs/protocol.md §5.4).

The lock is the `Leader` record of the coordinator-state table, with the attributes of the DynamoDB
lock client that KCL uses, so a KCL 3.x worker and this library read each other's lock:
`ownerName`, `leaseDuration` (decimal string, ms), `recordVersionNumber` (a fresh UUID on every
acquire and heartbeat) and, only when released without deleting, `isReleased` = "1".

There is no server-side timestamp. Expiry is *observed*: a version seen unchanged for longer than
the item's `leaseDuration` is expired, and a contender may then replace it with a put conditional
on that version, so of many contenders exactly one wins. A changed version (the holder heartbeated)
restarts the observation.

Every contender of a batch application is a new process (an Airflow try, a `leasectl` command)
that tries once, so an observation kept in one process's memory never grows old enough: that is
how a dead round's lock stayed forever, as in KCL issue #1803 (awslabs/amazon-kinesis-client). The
observation is therefore shared: the first contender to see a version writes it, with the wall-
clock time it saw it, to the `LeaderObservation` record of the same table, and every later
contender judges expiry from that record (or from its own in-memory observation, whichever is
older). So a dead round's lock is taken over by the first try made more than `leaseDuration` after
any contender first saw its last version.

Safety relies on clocks. The holder counts its lease from *before* it sent its last successful
write, and stops counting itself the holder `CLOCK_SKEW_MARGIN_FRACTION` of the lease duration
early (12 s of the default 120 s); a contender counts from *after* it read that write. So no
contender can take over while `is_held` is true as long as the clocks of every machine that
contends (Airflow workers, wherever `leasectl` runs) agree within that margin (NTP keeps them
within milliseconds). A sighting dated in a contender's future is replaced by the contender's own,
so a clock running fast cannot hold off takeovers; a clock running slow by more than the margin
can make one early, which matters only while the holder's heartbeats are failing (a live holder
writes a new version every heartbeat period, which starts a new sighting). Every control-plane
write is made only while `is_held` (`lease_core.leader.leadership`).

An owner name is unique to one execution of a round (`<dag>/<run id>/<token>`,
`leasectl-<command>/<host>/<pid>/<token>`), so a lock held under our own name is ours: a retried
try whose first try's acquire landed (its answer lost, or the process died after the write)
resumes it instead of waiting for it to expire.

Every acquire and heartbeat of ours also writes `heartbeatAt` (ours, not the lock client's: the wall-
clock time, epoch ms, taken before the write), so readers that keep no observation (the monitoring
UI, reports) can tell a live lock from a dead round's: `LockHolder.is_live`. It plays no part in
the takeover rule, which stays the observed one above. KCL's lock client ignores attributes it does
not know and writes the whole item when it takes the lock, so a lock KCL holds has none.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType

from lease_core.errors import LeadershipUnavailableError
from lease_core.store.coordinator_state import KEY, CoordinatorStateStore, update_record
from lease_core.store.record_table import Expectations, Record, text, whole_number

log = logging.getLogger(__name__)

LEADER_KEY = "Leader"
OWNER_NAME = "ownerName"
LEASE_DURATION = "leaseDuration"
RECORD_VERSION_NUMBER = "recordVersionNumber"
IS_RELEASED = "isReleased"
RELEASED = "1"
# Ours: when the holder last wrote the lock (wall clock, epoch ms), for readers; see the module docstring.
HEARTBEAT_AT = "heartbeatAt"

# The shared evidence for expiry: which version was first seen when, by whom (ours, not KCL's).
OBSERVATION_KEY = "LeaderObservation"
OBSERVED_VERSION = "observedVersion"
FIRST_SEEN_AT = "firstSeenAt"
OBSERVER_NAME = "observerName"

DEFAULT_LEASE_DURATION_MILLIS = 120_000
DEFAULT_HEARTBEAT_PERIOD_MILLIS = 30_000
# The holder stops counting itself the holder this fraction of the lease early: the clock skew
# between machines that the takeover rule tolerates.
CLOCK_SKEW_MARGIN_FRACTION = 10
# KCL releases the leader lock after this many consecutive failed leader runs (docs/protocol.md §4.1).
FAILURES_BEFORE_RELEASE = 3


def monotonic_millis() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_clock_millis() -> int:
    return time.time_ns() // 1_000_000


def new_record_version() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class LockHolder:
    """The lock record as stored: who holds it, at which version, for how long."""

    owner_name: str
    record_version_number: str
    lease_duration_millis: int
    is_released: bool = False
    heartbeat_at_millis: int | None = None  # our `heartbeatAt`; None on a lock KCL (or an older release) wrote

    @classmethod
    def from_item(cls, item: Record, default_lease_duration_millis: int) -> LockHolder:
        """Read a lock item; a foreign item without a usable duration is given ours."""
        return cls(
            owner_name=text(item, OWNER_NAME),
            record_version_number=text(item, RECORD_VERSION_NUMBER),
            lease_duration_millis=_duration(item, default_lease_duration_millis),
            is_released=text(item, IS_RELEASED) == RELEASED,
            heartbeat_at_millis=_heartbeat_at(item),
        )

    def is_live(self, now_millis: int, observation: SharedObservation | None) -> bool:
        """Whether a round holds this lock now, as a reader without observations of its own judges it.

        Not when released. With our `heartbeatAt`: the last write is at most one lease duration old
        (after that any contender may take it over). Without it (KCL's lock client writes none): held
        until the shared observation shows this version unchanged for longer than its lease, which is
        how contenders judge it too.
        """
        if self.is_released:
            return False
        if self.heartbeat_at_millis is not None:
            return now_millis - self.heartbeat_at_millis <= self.lease_duration_millis
        if observation is None or observation.record_version_number != self.record_version_number:
            return True
        return now_millis - observation.first_seen_at_millis <= self.lease_duration_millis


def _duration(item: Record, default_millis: int) -> int:
    try:
        return int(text(item, LEASE_DURATION))
    except ValueError:
        return default_millis


def _heartbeat_at(item: Record) -> int | None:
    try:
        return whole_number(item, HEARTBEAT_AT) if HEARTBEAT_AT in item else None
    except ValueError:
        return None  # not ours after all: the lock is judged as one without it


@dataclass(frozen=True)
class _Observation:
    record_version_number: str
    first_seen_millis: int


@dataclass(frozen=True)
class SharedObservation:
    """The `LeaderObservation` record: a lock version and the wall-clock time it was first seen."""

    record_version_number: str
    first_seen_at_millis: int
    observer_name: str

    @classmethod
    def from_item(cls, item: Record) -> SharedObservation | None:
        try:
            return cls(item[OBSERVED_VERSION], whole_number(item, FIRST_SEEN_AT), text(item, OBSERVER_NAME))
        except (KeyError, ValueError):
            return None  # unreadable evidence is no evidence: it is rewritten at the next observation

    def to_item(self) -> Record:
        return {
            OBSERVED_VERSION: self.record_version_number,
            FIRST_SEEN_AT: self.first_seen_at_millis,
            OBSERVER_NAME: self.observer_name,
        }


def _utc(millis: int) -> str:
    return datetime.fromtimestamp(millis / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class LeaderLock:
    """One contender's view of the `Leader` record; safe to share with a `LockHeartbeat` thread."""

    def __init__(
        self,
        state: CoordinatorStateStore,
        owner_name: str,
        lease_duration_millis: int = DEFAULT_LEASE_DURATION_MILLIS,
        heartbeat_period_millis: int = DEFAULT_HEARTBEAT_PERIOD_MILLIS,
        monotonic_millis: Callable[[], int] = monotonic_millis,
        new_version: Callable[[], str] = new_record_version,
        wall_clock_millis: Callable[[], int] = wall_clock_millis,
        guard: Callable[[], None] | None = None,
    ) -> None:
        """`guard` runs after each acquisition and raises when the lock just taken is not the
        application's lock any more (it was moved to another table); the lock is then released."""
        if not owner_name:
            raise ValueError("a leader lock needs an owner name")
        if not 0 < heartbeat_period_millis < lease_duration_millis:
            raise ValueError("the heartbeat period must be positive and shorter than the lease duration")
        self.state = state
        self.owner_name = owner_name
        self.lease_duration_millis = lease_duration_millis
        self.heartbeat_period_millis = heartbeat_period_millis
        self._clock = monotonic_millis
        self._wall_clock = wall_clock_millis
        self._new_version = new_version
        self._guard = guard
        # One operation at a time: a heartbeat thread and the caller must not race on our version.
        self._mutex = threading.RLock()
        self._version: str | None = None
        self._last_write_millis = 0
        self._observation: _Observation | None = None

    @property
    def record_version_number(self) -> str | None:
        """The version we last wrote while holding the lock (to hand over to the next step)."""
        with self._mutex:
            return self._version

    @property
    def held_for_millis(self) -> int:
        """How long after our last successful write we still count ourselves the holder."""
        return self.lease_duration_millis - self.lease_duration_millis // CLOCK_SKEW_MARGIN_FRACTION

    @property
    def is_held(self) -> bool:
        """We hold the lock and our last successful write is younger than `held_for_millis`."""
        with self._mutex:
            return self._version is not None and self._clock() - self._last_write_millis < self.held_for_millis

    def holder(self) -> LockHolder | None:
        """The lock record as stored now, for reports and the UI; None when nobody holds it."""
        item = self.state.get(LEADER_KEY)
        return LockHolder.from_item(item, self.lease_duration_millis) if item is not None else None

    def observation(self) -> SharedObservation | None:
        """The shared `LeaderObservation` record as stored now (see the module docstring)."""
        record = self.state.get(OBSERVATION_KEY)
        return None if record is None else SharedObservation.from_item(record)

    def unavailable(self) -> LeadershipUnavailableError:
        """The error for a failed acquire or resume, naming the holder and when it can be taken over."""
        holder = self.holder()
        if holder is None:
            return LeadershipUnavailableError("(nobody: the lock expired or was released)")
        observation = self.observation()
        if observation is None or observation.record_version_number != holder.record_version_number:
            return LeadershipUnavailableError(holder.owner_name)
        return LeadershipUnavailableError(
            holder.owner_name,
            f"its record has not changed since {_utc(observation.first_seen_at_millis)}; if its holder is dead, "
            f"the first attempt after {_utc(observation.first_seen_at_millis + holder.lease_duration_millis)} "
            "takes it over",
        )

    def try_acquire(self) -> bool:
        """Take the lock if it is free, released, ours, or observed expired; never blocks or waits."""
        acquired = self._try_acquire()
        if acquired and self._guard is not None:
            try:
                self._guard()
            except BaseException:
                self.release()
                raise
        return acquired

    def _try_acquire(self) -> bool:
        with self._mutex:
            item = self.state.get(LEADER_KEY)
            now = self._clock()
            if item is None:
                return self._write(now, {KEY: None})
            holder = LockHolder.from_item(item, self.lease_duration_millis)
            if holder.is_released:
                return self._write(now, {IS_RELEASED: RELEASED, **_version_expectation(holder)})
            if holder.owner_name == self.owner_name:
                # Ours: written by this object, or by an earlier try whose answer never arrived.
                self._version = holder.record_version_number
                return self.heartbeat()
            if not self._observed_expired(holder, now):
                return False
            log.info(
                "taking over the leader lock of %s (version %s unchanged for longer than %d ms)",
                holder.owner_name,
                holder.record_version_number,
                holder.lease_duration_millis,
            )
            return self._write(now, {KEY: LEADER_KEY, **_version_expectation(holder)})

    def heartbeat(self) -> bool:
        """Replace our version; False means leadership is lost (and `is_held` turns False)."""
        with self._mutex:
            if self._version is None:
                return False
            expected = {OWNER_NAME: self.owner_name, RECORD_VERSION_NUMBER: self._version}
            if self._write(self._clock(), expected):
                return True
            log.warning("leader lock of %s lost: its record changed under it", self.owner_name)
            self._forget()
            return False

    def resume(self, record_version_number: str) -> bool:
        """Continue holding a lock that an earlier step of the same owner acquired (in another process).

        A heartbeat on the handed-over version: it succeeds only if nobody replaced that version.
        """
        with self._mutex:
            self._version = record_version_number
            return self.heartbeat()

    def resume_as_owner(self) -> bool:
        """Continue a lock held under our owner name by an earlier step, whatever version it wrote last.

        Every step of a round heartbeats (and so rewrites the version), so the next step cannot know
        the latest version; it knows the owner name, which is unique to the round (`<dag>/<run id>/<token>`).
        The heartbeat is still conditional on the version read, so a takeover in between wins.
        """
        with self._mutex:
            item = self.state.get(LEADER_KEY)
            if item is None:
                return False
            holder = LockHolder.from_item(item, self.lease_duration_millis)
            if holder.owner_name != self.owner_name or holder.is_released:
                return False
            self._version = holder.record_version_number
            return self.heartbeat()

    def release(self) -> bool:
        """Delete the lock record if it is still ours (KCL releases by deleting); we no longer hold it.

        True when the record is gone afterwards: deleted now, or by our own earlier attempt whose
        answer was lost. False when it was not ours to delete.
        """
        with self._mutex:
            if self._version is None:
                return False
            expected = {OWNER_NAME: self.owner_name, RECORD_VERSION_NUMBER: self._version}
            self._forget()
            return self.state.delete(LEADER_KEY, expected=expected) or self.state.get(LEADER_KEY) is None

    def _observed_expired(self, holder: LockHolder, now: int) -> bool:
        """Whether this version was seen unchanged for longer than its lease, by us or by anyone."""
        observation = self._observation
        if observation is None or observation.record_version_number != holder.record_version_number:
            self._observation = observation = _Observation(holder.record_version_number, now)
        if now - observation.first_seen_millis > holder.lease_duration_millis:
            return True
        shared = self._share_observation(holder)
        return self._wall_clock() - shared.first_seen_at_millis > holder.lease_duration_millis

    def _share_observation(self, holder: LockHolder) -> SharedObservation:
        """The shared record for the holder's version, written now if nobody has seen it before."""
        seen = SharedObservation(holder.record_version_number, self._wall_clock(), self.owner_name)

        def change(record: Record | None) -> Record | None:
            stored = None if record is None else SharedObservation.from_item(record)
            if (
                stored is not None
                and stored.record_version_number == holder.record_version_number
                and stored.first_seen_at_millis <= seen.first_seen_at_millis
            ):
                return None  # an earlier sighting of this version stands
            # A sighting in our future came from a clock running fast: it would hold off every
            # takeover by as much, so ours replaces it.
            return seen.to_item()

        stored = SharedObservation.from_item(update_record(self.state, OBSERVATION_KEY, change) or {})
        return stored if stored is not None and stored.record_version_number == holder.record_version_number else seen

    def _write(self, now: int, expected: Expectations) -> bool:
        """Put the lock with a fresh version; `now` is taken before the write, so our lease errs short.

        A put that landed but whose answer was lost fails its retry's condition against itself; the
        fresh version tells it apart from a lost race.
        """
        version = self._new_version()
        attributes: Record = {
            OWNER_NAME: self.owner_name,
            LEASE_DURATION: str(self.lease_duration_millis),  # a decimal string, as the lock client writes it
            RECORD_VERSION_NUMBER: version,
            HEARTBEAT_AT: self._wall_clock(),
        }
        if not self.state.put(LEADER_KEY, attributes, expected=expected) and not self._stored_version_is(version):
            return False
        self._version = version
        self._last_write_millis = now
        self._observation = None
        return True

    def _stored_version_is(self, version: str) -> bool:
        item = self.state.get(LEADER_KEY)
        return item is not None and text(item, RECORD_VERSION_NUMBER) == version

    def _forget(self) -> None:
        self._version = None
        self._last_write_millis = 0


def _version_expectation(holder: LockHolder) -> Expectations:
    """The observed version must be unchanged (a record written without one must still lack it)."""
    return {RECORD_VERSION_NUMBER: holder.record_version_number if holder.record_version_number else None}


class LeadershipFailures:
    """Consecutive failed leader runs; at the limit the caller releases the lock (docs/protocol.md §4.1)."""

    def __init__(self, limit: int = FAILURES_BEFORE_RELEASE) -> None:
        if limit < 1:
            raise ValueError("the failure limit must be at least 1")
        self.limit = limit
        self.consecutive = 0

    def record_failure(self) -> bool:
        """Count a failure; True once there have been `limit` in a row: release the lock."""
        self.consecutive += 1
        return self.consecutive >= self.limit

    def record_success(self) -> None:
        self.consecutive = 0


class LockHeartbeat:
    """Heartbeats a held lock from a daemon thread during a long step (e.g. the Spark consume step).

    `lost` is set once a heartbeat fails or, if heartbeats keep raising, once the lock is no longer
    held by our clock; the step should then stop and commit nothing, and `on_lost` (if given) is
    called once from the heartbeat thread to make it stop (the Spark driver cancels its slots).
    Leaving the context stops and joins the thread; it does not release the lock.
    """

    def __init__(
        self, lock: LeaderLock, period_millis: int | None = None, on_lost: Callable[[], None] | None = None
    ) -> None:
        self.lock = lock
        self.period_millis = period_millis or lock.heartbeat_period_millis
        self.on_lost = on_lost
        self.lost = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LockHeartbeat:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("a lock heartbeat starts once")
        if not self.lock.is_held:
            self.lost.set()
            return
        self._thread = threading.Thread(
            target=self._run, name=f"leader-lock-heartbeat-{self.lock.owner_name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self.period_millis / 1000):
            if not self._beat():
                self.lost.set()
                if self.on_lost is not None and not self._stopping.is_set():
                    self.on_lost()
                return

    def _beat(self) -> bool:
        try:
            return self.lock.heartbeat()
        except Exception:  # a transient store error: keep beating while the lease lasts
            log.warning("leader lock heartbeat failed; retrying next period", exc_info=True)
            return self.lock.is_held
