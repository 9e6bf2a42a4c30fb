"""The application's enhanced fan-out consumer on each stream: registered once, reused by every round.

A consumer is billed per consumer-shard hour and takes seconds to register, so it belongs to the
application, not to a round: the table step (`ensure_tables`) and `leasectl init` register it when
it is missing (`StreamConsumers.ensure`), every round's slots look its ARN up (`arn`, again with
`refresh` once Kinesis no longer knows the one they had), and `leasectl teardown` deregisters it
(`deregister_recorded`).

Ownership. Kinesis does not say who registered a consumer, and a consumer name is the application's
name by default, which another application may also use. So the application writes its own proof,
one record per stream in its coordinator-state table: key `StreamConsumer:<stream name>`, with the
consumer's name, the stream's ARN, the consumer's ARN and creation time (an ARN ends with the
creation time on Kinesis, not on moto: both are compared), `claimedAtMillis`, `nameFree` and a
`version` every write replaces (each write is conditional on the version read). The record is
written as a claim (no consumer ARN yet) BEFORE registering, and the claim is marked `nameFree` once
DescribeStreamConsumer, asked after the claim was written, answered that no consumer has the name.
Whoever finds a consumer of the name can then tell, without comparing the application's clock with
Kinesis' (a host's clock may be seconds or minutes off Kinesis'):

- a claim marked `nameFree`, and a consumer created within minutes of it
  (`CLAIM_REGISTERS_WITHIN_MILLIS`): ours, being created (by us, by an overlapping table step whose
  registration answered ResourceInUseException, or by a killed try of this step): record its ARN and
  wait for ACTIVE. A registration that Kinesis accepted records the consumer of its own answer at
  once, whatever the clocks say: only the consumers found, not registered, are judged by the window;
- a claim written by a version of this project before `nameFree` (the attribute absent): judged as
  that version judged it, a consumer created from 5 s before the claim to the window after it;
- a claim not marked `nameFree`, and a consumer of the name: it was there when the application
  claimed the name (registered by someone else between the application's look and its claim);
- no record, or a record naming another ARN, and a consumer of the name: another application's, or
  one re-created by hand. `ForeignStreamConsumerError` names it; it is never used nor deregistered;
- a record whose consumer is gone (deregistered by hand): registered again under a fresh claim, and
  slots holding the old ARN find the new one with `refresh`;
- a claim and no consumer: marked `nameFree` (stamped anew), then registered under while that mark
  is fresh (`CLAIM_FRESH_MILLIS`): a claim left unfinished (its holder died, or its registration
  failed) is marked again before anything registers under it.

The decision is `decide`, pure over the record and DescribeStreamConsumer's answer; `ensure` loads,
decides and applies until the consumer is ACTIVE, at most `activation_timeout_seconds` of waiting.
It reads the record BEFORE asking Kinesis: an answer "no consumer of the name" is then about a
moment after the claim it read was written, which is what `nameFree` says.
Every Kinesis call goes through `AwsCaller` with the application's retry policy, except that
RegisterStreamConsumer's refusals (the consumer exists, a limit) are answers here, not failures to
retry: a stream's 20 consumers (`StreamConsumerError`) or 5 consumers in CREATING at once
(`StreamConsumerNotReadyError`, retryable) are reported at once, naming the stream.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import botocore.exceptions

from lease_core.aws import AwsCaller, error_code
from lease_core.errors import ForeignStreamConsumerError, StreamConsumerError, StreamConsumerNotReadyError
from lease_core.model.stream_consumer import ABSENT, StreamConsumerState
from lease_core.retry import RetryPolicy

log = logging.getLogger(__name__)

RECORD_KEY_PREFIX = "StreamConsumer:"
CONSUMER_NAME = "consumerName"
STREAM_NAME = "streamName"
STREAM_ARN = "streamARN"
CONSUMER_ARN = "consumerARN"
CONSUMER_CREATED = "consumerCreationEpochMillis"
CLAIMED_AT = "claimedAtMillis"
NAME_FREE = "nameFree"
VERSION = "version"

ACTIVE, CREATING, DELETING = "ACTIVE", "CREATING", "DELETING"
# Kinesis' limits per stream (RegisterStreamConsumer answers LimitExceededException beyond them).
MAX_CONSUMERS_PER_STREAM = 20
MAX_CREATING_CONSUMERS = 5
# A claim registers its consumer within seconds of being marked `nameFree` (a registration refused for
# a limit removes it). A consumer of the name created this long after an unfinished claim was not
# created under it: that claim's holder died before registering, and someone else registered the name
# since. The consumer's creation time is Kinesis' clock, the claim's ours: this bound is the one place
# they meet, and the margin over `CLAIM_FRESH_MILLIS` (5 minutes) is what a clock skew may take.
CLAIM_REGISTERS_WITHIN_MILLIS = 10 * 60_000
# A claim marked `nameFree` longer ago than this is marked again before registering (not registered
# under): a consumer registered under it could be created past `CLAIM_REGISTERS_WITHIN_MILLIS`.
CLAIM_FRESH_MILLIS = CLAIM_REGISTERS_WITHIN_MILLIS // 2
# A claim written before `nameFree` existed: the versions that wrote it took a consumer created from
# this long before the claim (the host's clock against Kinesis') to the window after it as theirs.
LEGACY_CLAIM_CLOCK_TOLERANCE_MILLIS = 5_000
# How often a consumer in CREATING (or DELETING) is described again: KCL's retryBackoffMillis.
POLL_SECONDS = 1.0
# Writes and registrations one `ensure` may try: overlapping table steps make it go round again.
MAX_STEPS = 12


class StateRecords(Protocol):
    """What the coordinator-state table does for this module (`lease_core.store.coordinator_state`)."""

    table_name: str
    hash_key: str

    def get(self, key: str) -> dict[str, Any] | None: ...
    def scan(self) -> list[dict[str, Any]]: ...
    def put(self, key: str, attributes: Mapping[str, Any], expected: Mapping[str, Any] | None = None) -> bool: ...
    def delete(self, key: str, expected: Mapping[str, Any] | None = None) -> bool: ...


def record_key(stream_name: str) -> str:
    return RECORD_KEY_PREFIX + stream_name


@dataclass(frozen=True)
class Consumer:
    """DescribeStreamConsumer's (or ListStreamConsumers') answer about one consumer."""

    name: str
    arn: str
    status: str
    created_millis: int

    @classmethod
    def from_api(cls, description: Mapping[str, Any]) -> Consumer:
        created = description["ConsumerCreationTimestamp"]
        millis = int(created.timestamp() * 1000) if isinstance(created, datetime) else int(float(created) * 1000)
        return cls(description["ConsumerName"], description["ConsumerARN"], description["ConsumerStatus"], millis)

    @property
    def created(self) -> datetime:
        return datetime.fromtimestamp(self.created_millis / 1000, UTC)


@dataclass(frozen=True)
class Ownership:
    """The application's record of its consumer on one stream; a claim until `consumer_arn` is set.
    `name_free`: Kinesis answered, after the claim was written, that no consumer has the name
    (`claimed_at_millis` is then when that was recorded); None for a claim written by a version of
    this project before the mark existed."""

    stream_name: str
    consumer_name: str
    stream_arn: str
    claimed_at_millis: int
    consumer_arn: str | None = None
    consumer_created_millis: int | None = None
    version: str | None = None
    name_free: bool | None = False

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Ownership:
        def text(name: str) -> str | None:
            value = record.get(name)
            return value if isinstance(value, str) else None

        created = record.get(CONSUMER_CREATED)
        consumer_arn = text(CONSUMER_ARN)
        if NAME_FREE in record:
            name_free: bool | None = record[NAME_FREE] is True
        else:  # a claim without the attribute was written before it existed
            name_free = None if consumer_arn is None else False
        return cls(
            stream_name=text(STREAM_NAME) or str(record.get("key", "")).removeprefix(RECORD_KEY_PREFIX),
            consumer_name=text(CONSUMER_NAME) or "",
            stream_arn=text(STREAM_ARN) or "",
            claimed_at_millis=int(record.get(CLAIMED_AT, 0)),
            consumer_arn=consumer_arn,
            consumer_created_millis=None if created is None else int(created),
            version=text(VERSION),
            name_free=name_free,
        )

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            STREAM_NAME: self.stream_name,
            CONSUMER_NAME: self.consumer_name,
            STREAM_ARN: self.stream_arn,
            CLAIMED_AT: self.claimed_at_millis,
            VERSION: uuid.uuid4().hex,
        }
        if self.consumer_arn is not None:
            record[CONSUMER_ARN] = self.consumer_arn
        if self.consumer_created_millis is not None:
            record[CONSUMER_CREATED] = self.consumer_created_millis
        if self.consumer_arn is None:
            record[NAME_FREE] = self.name_free is True
        return record

    def names(self, consumer: Consumer) -> bool:
        """Whether this record proves `consumer` the application's own."""
        if self.consumer_name != consumer.name:
            return False
        latest = self.claimed_at_millis + CLAIM_REGISTERS_WITHIN_MILLIS
        if self.consumer_arn is None and self.name_free is None:  # a claim of a version before the mark
            return self.claimed_at_millis - LEGACY_CLAIM_CLOCK_TOLERANCE_MILLIS <= consumer.created_millis <= latest
        if self.consumer_arn is None:  # a claim: what was created once the name was free under it, not long after
            return self.name_free is True and consumer.created_millis <= latest
        return self.consumer_arn == consumer.arn and self.consumer_created_millis in (None, consumer.created_millis)


class Step(enum.Enum):
    USE = "use"  # ours and ACTIVE
    WAIT = "wait"  # ours in CREATING, or a consumer of the name in DELETING: describe again shortly
    CLAIM = "claim"  # no consumer of the name and no claim: claim it (afresh over a record whose consumer is gone)
    MARK_FREE = "mark_free"  # our claim stands and no consumer of the name exists since: say so, stamped now
    REGISTER = "register"  # our claim was marked name-free lately and no consumer of the name exists yet
    RECORD = "record"  # a consumer was created under our claim: record its ARN
    FOREIGN = "foreign"  # a consumer of the name the record does not name
    RENAMED = "renamed"  # the record is of a consumer under another name


def decide(record: Ownership | None, consumer: Consumer | None, consumer_name: str, now_millis: int) -> Step:
    """What `ensure` does next at `now_millis`, from the application's record and the consumer Kinesis
    has under the name, asked after the record was read. A claim is marked name-free before anything
    registers under it, and again when that mark is old (its holder died before registering): what is
    registered under it must be created within its window to be ours."""
    if record is not None and record.consumer_name != consumer_name:
        return Step.RENAMED
    if consumer is not None and consumer.status == DELETING:
        return Step.WAIT  # gone shortly, then there is nothing to judge
    if consumer is None:
        if record is None or record.consumer_arn is not None:
            return Step.CLAIM
        fresh = record.name_free and now_millis - record.claimed_at_millis <= CLAIM_FRESH_MILLIS
        return Step.REGISTER if fresh else Step.MARK_FREE
    if record is None or not record.names(consumer):
        return Step.FOREIGN
    if record.consumer_arn is None:
        return Step.RECORD
    return Step.USE if consumer.status == ACTIVE else Step.WAIT


@dataclass(frozen=True)
class Deregistration:
    """What `deregister_recorded` did with one record's consumer."""

    stream_name: str
    consumer_name: str
    consumer_arn: str | None
    deregistered: bool
    note: str


RegisterRefusal = Literal["exists", "limit"]


class StreamConsumers:
    """The application's consumers on its streams, through `kinesis` (a boto3 Kinesis client) and
    its coordinator-state table `state`; `stream_arn` gives a stream's ARN from its name."""

    def __init__(
        self,
        kinesis: Any,
        state: StateRecords,
        consumer_name: str,
        stream_arn: Callable[[str], str],
        *,
        retry_policy: RetryPolicy = RetryPolicy(),
        activation_timeout_seconds: float = 60.0,
        poll_seconds: float = POLL_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock_millis: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._kinesis = kinesis
        self._state = state
        self.consumer_name = consumer_name
        self._stream_arn = stream_arn
        self._caller = AwsCaller("kinesis", retry_policy)
        self._timeout = activation_timeout_seconds
        self._poll = poll_seconds
        self._sleep = sleep
        self._monotonic = monotonic
        self._now_millis = wall_clock_millis
        self._arns: dict[str, str] = {}  # what `arn` found, per stream; slots look up from several threads
        self._arns_lock = threading.Lock()
        # One lookup per stream at a time: a slot's lease threads start (or find a consumer re-created)
        # together, and Kinesis allows DescribeStreamConsumer 20 times a second per stream.
        self._lookups: dict[str, threading.Lock] = {}

    # --- for the table step and `leasectl init` ----------------------------------------------------

    def ensure(self, stream_name: str) -> StreamConsumerState:
        """The application's consumer on the stream, registered if missing and ACTIVE.

        Raises `ForeignStreamConsumerError` for a consumer of the name the application did not
        register, `StreamConsumerError` at the stream's consumer limit or after a rename,
        `StreamConsumerNotReadyError` when it is not ACTIVE within the activation timeout or the
        stream has 5 consumers in CREATING."""
        stream_arn = self._stream_arn(stream_name)
        deadline = self._monotonic() + self._timeout
        steps = 0
        while True:
            record = self._ownership(stream_name)
            consumer = self._describe(stream_arn)
            step = decide(record, consumer, self.consumer_name, self._now_millis())
            if step is Step.USE:
                assert consumer is not None
                with self._arns_lock:
                    self._arns[stream_name] = consumer.arn
                return self._state_of(stream_name, record, consumer)
            if step in (Step.FOREIGN, Step.RENAMED):
                # The verdict rests on the record as read before Kinesis answered: another step may
                # have marked, registered and recorded the consumer since. Only an unchanged record
                # makes the consumer foreign; a changed one is looked at again.
                if self._version_of(self._ownership(stream_name)) == self._version_of(record):
                    raise self._refusal(step, stream_name, record, consumer)
            elif step is Step.WAIT:
                assert consumer is not None
                if self._monotonic() >= deadline:
                    raise self._not_ready(stream_name, consumer, f"still {consumer.status} after {self._timeout:g} s")
                self._sleep(self._poll)
                continue
            steps += 1
            if steps > MAX_STEPS:
                raise StreamConsumerNotReadyError(
                    stream_name,
                    self.consumer_name,
                    f"its registration changed under each of {MAX_STEPS} attempts (another table step or "
                    "`leasectl init` registering it at the same time, or the stream not ACTIVE); try again",
                )
            if step not in (Step.FOREIGN, Step.RENAMED):
                self._apply(step, stream_name, stream_arn, record, consumer)

    def _apply(
        self, step: Step, stream_name: str, stream_arn: str, record: Ownership | None, consumer: Consumer | None
    ) -> None:
        key = record_key(stream_name)
        if step is Step.CLAIM:
            claim = Ownership(stream_name, self.consumer_name, stream_arn, self._now_millis())
            expected = {self._state.hash_key: None} if record is None else {VERSION: record.version}
            self._state.put(key, claim.to_record(), expected=expected)  # lost: a racer claimed, look again
        elif step is Step.MARK_FREE:
            assert record is not None
            free = Ownership(stream_name, self.consumer_name, stream_arn, self._now_millis(), name_free=True)
            self._state.put(key, free.to_record(), expected={VERSION: record.version})  # lost: look again
        elif step is Step.REGISTER:
            assert record is not None
            answer = self._register(stream_arn)
            if isinstance(answer, Consumer):
                # Registered under this claim by this very call: ours, whatever Kinesis' clock says.
                self._record(stream_name, stream_arn, record, answer)  # lost: a racer changed it, look again
            elif answer == "exists":
                self._sleep(self._poll)  # an overlapping registration's consumer: Kinesis shows it shortly
            else:
                self._refuse_at_limit(stream_name, stream_arn, record)
        elif step is Step.RECORD:
            assert record is not None and consumer is not None
            self._record(stream_name, stream_arn, record, consumer)

    def _record(self, stream_name: str, stream_arn: str, claim: Ownership, consumer: Consumer) -> None:
        """Record `consumer` as the one registered under `claim`, if the claim is still as read."""
        owned = Ownership(
            stream_name, self.consumer_name, stream_arn, claim.claimed_at_millis, consumer.arn, consumer.created_millis
        )
        self._state.put(record_key(stream_name), owned.to_record(), expected={VERSION: claim.version})

    def _refuse_at_limit(self, stream_name: str, stream_arn: str, claim: Ownership) -> None:
        """After LimitExceededException: which of Kinesis' limits the stream is at (or none: the call's own rate)."""
        consumers = self._list(stream_arn)
        creating = [consumer.name for consumer in consumers if consumer.status == CREATING]
        if len(consumers) < MAX_CONSUMERS_PER_STREAM and len(creating) < MAX_CREATING_CONSUMERS:
            self._sleep(self._poll)  # RegisterStreamConsumer's own 5 calls a second: try again
            return
        # Not registered: the claim goes, so that nothing reads as a registration under way.
        self._state.delete(record_key(stream_name), expected={VERSION: claim.version})
        if len(consumers) >= MAX_CONSUMERS_PER_STREAM:
            raise StreamConsumerError(
                stream_name,
                self.consumer_name,
                f"cannot be registered: the stream has {len(consumers)} consumers, Kinesis' limit per stream is "
                f"{MAX_CONSUMERS_PER_STREAM} ({', '.join(sorted(c.name for c in consumers))}); deregister one "
                "that is no longer needed, or read with retrieval = polling. No lease was moved",
            )
        raise StreamConsumerNotReadyError(
            stream_name,
            self.consumer_name,
            f"cannot be registered now: the stream has {len(creating)} consumers in CREATING, the most Kinesis "
            f"registers at once ({', '.join(sorted(creating))}); try again once they are ACTIVE. No lease was moved",
        )

    # --- for the slots ---------------------------------------------------------------------------

    def arn(self, stream_name: str) -> str:
        """The ARN of the application's ACTIVE consumer on the stream, looked up once per object (one
        GetItem, one DescribeStreamConsumer, which threads asking at once wait for). Raises
        `StreamConsumerError` when the application has not registered one (or it is gone),
        `ForeignStreamConsumerError` when the consumer of the name is not the one it registered,
        `StreamConsumerNotReadyError` when it is not ACTIVE."""
        with self._arns_lock:
            cached = self._arns.get(stream_name)
            lookup = self._lookups.setdefault(stream_name, threading.Lock())
        if cached is not None:
            return cached
        with lookup:
            with self._arns_lock:
                cached = self._arns.get(stream_name)
            return cached if cached is not None else self._look_up(stream_name)

    def remember(self, arns: Mapping[str, str]) -> None:
        """Take ARNs another process looked up with `arn` (the consume job's driver, at round start) as
        this object's own: a slot's leases subscribe without a lookup each (Kinesis answers
        DescribeStreamConsumer 20 times a second per stream, and a round may start a hundred slots);
        `refresh` still looks one up again once Kinesis no longer knows it."""
        with self._arns_lock:
            self._arns.update(arns)

    def _look_up(self, stream_name: str) -> str:
        record = self._ownership(stream_name)
        if record is None or record.consumer_arn is None:
            raise StreamConsumerError(
                stream_name,
                self.consumer_name,
                "this application has not registered it (the DAG's ensure_tables step, or "
                f"`leasectl init --stream {stream_name}` with retrieval = fan_out, registers it)",
            )
        consumer = self._describe(record.stream_arn)
        step = decide(record, consumer, self.consumer_name, self._now_millis())
        if consumer is None:
            raise StreamConsumerError(
                stream_name,
                self.consumer_name,
                f"the consumer this application registered ({record.consumer_arn}) no longer exists; the next "
                "round's ensure_tables step (or `leasectl init --stream`) registers it again",
            )
        if step in (Step.FOREIGN, Step.RENAMED):
            raise self._refusal(step, stream_name, record, consumer)
        if step is not Step.USE:
            raise self._not_ready(stream_name, consumer, f"{consumer.status}, not ACTIVE")
        with self._arns_lock:
            return self._arns.setdefault(stream_name, consumer.arn)

    def refresh(self, stream_name: str, stale_arn: str) -> str:
        """The consumer's ARN looked up anew, when Kinesis does not know `stale_arn` any more (the
        consumer was re-registered since): as `arn`, without the ARN this object had."""
        with self._arns_lock:
            if self._arns.get(stream_name) == stale_arn:
                del self._arns[stream_name]
        return self.arn(stream_name)

    # --- for status, the monitoring page and teardown --------------------------------------------

    def describe(self, stream_name: str) -> StreamConsumerState:
        """The consumer under the application's consumer name on the stream, and whether it is ours."""
        record = self._ownership(stream_name)
        stream_arn = record.stream_arn if record is not None and record.stream_arn else self._stream_arn(stream_name)
        return self._state_of(stream_name, record, self._describe(stream_arn))

    def describe_streams(self, stream_names: Iterable[str]) -> list[StreamConsumerState]:
        """`describe` of each of these streams the application has a consumer record for (one GetItem
        per stream, a DescribeStreamConsumer per record), by stream name; no Scan, so a role without
        Scan on the coordinator-state table (the monitoring API's) can ask."""
        records = [record for name in sorted(set(stream_names)) if (record := self._ownership(name)) is not None]
        return [
            self._state_of(record.stream_name, record, self._describe(record.stream_arn, record.consumer_name))
            for record in records
        ]

    def describe_recorded(self) -> list[StreamConsumerState]:
        """`describe` of every stream the application keeps a consumer record for, by stream name (a Scan)."""
        return [
            self._state_of(record.stream_name, record, self._describe(record.stream_arn, record.consumer_name))
            for record in self._recorded()
        ]

    def deregister_recorded(self) -> list[Deregistration]:
        """Deregister the consumers the application's records prove its own, and delete the records
        (teardown). A consumer of the name that the record does not name is left, and said so."""
        outcomes = []
        for record in self._recorded():
            consumer = self._describe(record.stream_arn, record.consumer_name)
            outcomes.append(self._deregister(record, consumer))
            self._state.delete(record_key(record.stream_name), expected={VERSION: record.version})
            with self._arns_lock:
                self._arns.pop(record.stream_name, None)
        return outcomes

    def _deregister(self, record: Ownership, consumer: Consumer | None) -> Deregistration:
        def outcome(deregistered: bool, note: str) -> Deregistration:
            arn = consumer.arn if consumer is not None else record.consumer_arn
            return Deregistration(record.stream_name, record.consumer_name, arn, deregistered, note)

        if consumer is None:
            return outcome(False, "already gone")
        if not record.names(consumer):
            recorded = record.consumer_arn or "a registration it did not finish"
            return outcome(False, f"left registered: not the consumer this application registered ({recorded})")
        if consumer.status == DELETING:
            return outcome(False, "already being deregistered")
        self._caller.call(
            "DeregisterStreamConsumer",
            # By ARN alone: the very consumer judged ours (a consumer re-created since has another ARN).
            lambda: self._kinesis.deregister_stream_consumer(ConsumerARN=consumer.arn),
        )
        return outcome(True, "deregistered")

    # --- reads and calls -------------------------------------------------------------------------

    def _ownership(self, stream_name: str) -> Ownership | None:
        record = self._state.get(record_key(stream_name))
        return None if record is None else Ownership.from_record(record)

    def _recorded(self) -> list[Ownership]:
        key = self._state.hash_key
        records = [
            Ownership.from_record(r) for r in self._state.scan() if str(r.get(key, "")).startswith(RECORD_KEY_PREFIX)
        ]
        return sorted(records, key=lambda record: record.stream_name)

    @staticmethod
    def _version_of(record: Ownership | None) -> str | None:
        return None if record is None else record.version

    def _describe(self, stream_arn: str, consumer_name: str | None = None) -> Consumer | None:
        """DescribeStreamConsumer by stream and name; None when Kinesis has no consumer of the name."""
        name = consumer_name or self.consumer_name

        def call() -> Consumer | None:
            try:
                answer = self._kinesis.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=name)
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    return None
                raise
            return Consumer.from_api(answer["ConsumerDescription"])

        return self._caller.call("DescribeStreamConsumer", call)

    def _register(self, stream_arn: str) -> Consumer | RegisterRefusal:
        """The consumer registered (RegisterStreamConsumer's answer), or why Kinesis refused."""

        def call() -> Consumer | RegisterRefusal:
            try:
                answer = self._kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=self.consumer_name)
            except botocore.exceptions.ClientError as error:
                if error_code(error) == "ResourceInUseException":  # it exists: an overlapping registration's
                    return "exists"
                if error_code(error) == "LimitExceededException":  # a limit: which one is looked up
                    return "limit"
                raise
            return Consumer.from_api(answer["Consumer"])

        answer = self._caller.call("RegisterStreamConsumer", call)
        said = answer.arn if isinstance(answer, Consumer) else answer
        log.info("RegisterStreamConsumer %s on %s: %s", self.consumer_name, stream_arn, said)
        return answer

    def _list(self, stream_arn: str) -> list[Consumer]:
        consumers: list[Consumer] = []
        token: str | None = None
        while True:
            paging = {"NextToken": token} if token else {}
            page = self._caller.call(
                "ListStreamConsumers",
                functools.partial(self._kinesis.list_stream_consumers, StreamARN=stream_arn, **paging),
            )
            consumers += [Consumer.from_api(entry) for entry in page.get("Consumers", [])]
            token = page.get("NextToken")
            if not token:
                return consumers

    # --- what is said ----------------------------------------------------------------------------

    def _state_of(self, stream_name: str, record: Ownership | None, consumer: Consumer | None) -> StreamConsumerState:
        name = record.consumer_name if record is not None else self.consumer_name
        return StreamConsumerState(
            stream_name=stream_name,
            consumer_name=name,
            status=ABSENT if consumer is None else consumer.status,
            consumer_arn=None if consumer is None else consumer.arn,
            created=None if consumer is None else consumer.created,
            ours=consumer is not None and record is not None and record.names(consumer),
            recorded_arn=None if record is None else record.consumer_arn,
        )

    def _refusal(
        self, step: Step, stream_name: str, record: Ownership | None, consumer: Consumer | None
    ) -> StreamConsumerError:
        if step is Step.RENAMED:
            assert record is not None
            return StreamConsumerError(
                stream_name,
                self.consumer_name,
                f"this application registered consumer {record.consumer_name!r} on the stream "
                f"({record.consumer_arn or 'registration unfinished'}), and consumer_name now says "
                f"{self.consumer_name!r}: set consumer_name back; a renamed consumer would leave the old one "
                "registered and billed (`leasectl teardown` deregisters it with the application)",
            )
        assert consumer is not None
        if record is None:
            whose = "this application has no record of registering it"
        elif record.consumer_arn is None and not record.name_free:
            whose = "Kinesis had it when this application, having claimed the name, looked for it"
        elif record.consumer_arn is None:
            whose = (
                f"it was created {_iso(consumer.created_millis)}, more than "
                f"{CLAIM_REGISTERS_WITHIN_MILLIS // 60_000} minutes after this application's unfinished registration "
                f"({_iso(record.claimed_at_millis)})"
            )
        else:
            whose = (
                f"this application registered {record.consumer_arn} (created {_iso(record.consumer_created_millis)})"
            )
        return ForeignStreamConsumerError(
            stream_name,
            self.consumer_name,
            f"the consumer of that name ({consumer.arn}, created {consumer.created.isoformat(timespec='seconds')}) is "
            f"not this application's: {whose}. It is another application's, or was re-created by hand; it is never "
            "used nor deregistered. Set consumer_name to a name of this application's own, or deregister that "
            "consumer if nobody uses it. No lease was moved",
        )

    def _not_ready(self, stream_name: str, consumer: Consumer, state: str) -> StreamConsumerNotReadyError:
        return StreamConsumerNotReadyError(
            stream_name,
            consumer.name,
            f"{consumer.arn} is {state} (consumer_activation_timeout_millis bounds the wait); try again later. "
            "No lease was moved",
        )


def _iso(millis: int | None) -> str:
    return "?" if millis is None else datetime.fromtimestamp(millis / 1000, UTC).isoformat(timespec="seconds")
