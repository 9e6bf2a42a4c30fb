"""Which stream a single-stream application consumes, remembered from its first sync.

Single-stream lease keys are bare shard ids, which every stream has (`shardId-000000000000`, ...),
so a lease table alone cannot tell whose shards its leases track. A sync against another stream, or
against a stream deleted and created again under the same name, would take some leases for its own
(and read them from checkpoints of another stream) and judge the others garbage. So the first sync
records the stream's name, ARN and creation time in the coordinator-state table (`ConsumedStream`,
a put conditional on absence), and every later sync compares and refuses another stream with
`StreamMismatchError`. A table that has leases but no record (written by an older release, or by
KCL) adopts the stream of its first sync here.

Multi-stream applications need no record: each lease key carries the stream's account and creation
epoch, so the leases of each stream are told apart, and a stream created again is a new stream
whose predecessor's leases become a former stream's (`stream_tracking`, deleted at once under the
deferred-deletion strategy because the old identifier no longer exists in Kinesis).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from lease_core.errors import StreamMismatchError
from lease_core.model.shards import StreamDescription
from lease_core.store.coordinator_state import CoordinatorStateStore, decide_and_record
from lease_core.store.record_table import Record, text, whole_number

log = logging.getLogger(__name__)

RECORD_KEY = "ConsumedStream"
STREAM_NAME = "streamName"
STREAM_ARN = "streamARN"
CREATED = "streamCreationEpochMillis"


class StreamCheck(str, enum.Enum):
    RECORDED = "recorded"  # the first sync of a new application
    ADOPTED = "adopted"  # leases existed without a record: they are taken as this stream's
    MATCHED = "matched"


@dataclass(frozen=True)
class ConsumedStream:
    """The stream a single-stream sync ran against, and how it compared with the remembered one."""

    stream: StreamDescription
    check: StreamCheck

    def to_dict(self) -> dict[str, object]:
        return {
            "stream_name": self.stream.stream_name,
            "stream_arn": self.stream.stream_arn,
            "created": self.stream.created_at.isoformat(timespec="milliseconds"),
            "check": self.check.value,
        }


def check_stream(
    remembered: StreamDescription | None, requested: StreamDescription, table_has_leases: bool, table_name: str
) -> StreamCheck:
    """Pure: whether a single-stream application may sync `requested`; `StreamMismatchError` if not.

    Same name and ARN with another creation time is the same name for a new stream: refused too.
    """
    if remembered is None:
        return StreamCheck.ADOPTED if table_has_leases else StreamCheck.RECORDED
    if remembered == requested:
        return StreamCheck.MATCHED
    recreated = (remembered.stream_name, remembered.stream_arn) == (requested.stream_name, requested.stream_arn)
    raise StreamMismatchError(table_name, str(remembered), str(requested), recreated)


def to_item(stream: StreamDescription) -> Record:
    return {STREAM_NAME: stream.stream_name, STREAM_ARN: stream.stream_arn, CREATED: stream.creation_epoch_millis}


def from_item(item: Record | None) -> StreamDescription | None:
    if item is None:
        return None
    return StreamDescription(text(item, STREAM_NAME), text(item, STREAM_ARN), whole_number(item, CREATED))


def remember_consumed_stream(
    state: CoordinatorStateStore, requested: StreamDescription, table_has_leases: bool
) -> ConsumedStream:
    """Record `requested` as the application's stream if none is recorded yet, else compare.

    Written once and never changed: two first syncs racing each other write under the same absence
    condition, and the loser compares against the winner's stream.
    """

    def decide(record: Record | None) -> tuple[StreamCheck, Record | None]:
        check = check_stream(from_item(record), requested, table_has_leases, state.table_name)
        return check, to_item(requested) if record is None else None

    check = decide_and_record(state, RECORD_KEY, decide)
    if check is StreamCheck.ADOPTED:
        log.warning(
            "the lease table has leases but %r records no stream yet: stream %s is remembered as the stream "
            "this application consumes from now on, and a sync against any other stream will be refused",
            state.table_name,
            requested,
        )
    return ConsumedStream(requested, check)
