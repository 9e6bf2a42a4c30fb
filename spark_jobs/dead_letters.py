"""Bad records set aside: what a pipeline does with a record its processing rejects.

A record is rejected when the decoder (`spark_jobs.decode`) raises on it, returns something other
than a row, or returns a row that does not fit its schema. A pipeline chooses (`BadRecordPolicy`):

- `fail` (the default): the lease fails for the round with an error naming the record, and stays at
  its checkpoint before the batch; loud, and nothing moves until the processing is fixed.
- `dead_letter`: the record is set aside in the dead-letter destination beside the output (its raw
  bytes, stream, shard, sequence and sub-sequence number, arrival time and the error), exactly once
  with its batch (`sinks.dead_lettering`), and the rest of the batch lands. A batch whose
  processing fails wholesale still fails the lease: more than `max_share` of its records rejected,
  and at least `WHOLESALE_MIN_REJECTED` of them (so that one bad record in a quiet shard's batch of
  three is set aside, not taken for a bug). `leasectl replay-dead-letters` lands them after a fix.

A batch transform's failure names no record: it fails the lease either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import pyarrow as pa

from sinks.batch_sink import BatchRange
from sinks.dead_lettering import DEAD_LETTER_SCHEMA
from sinks.record_columns import RECORD_SCHEMA
from spark_jobs.decode import DECODER, RejectedRecord
from spark_jobs.errors import TransformError

BadRecordAction = Literal["fail", "dead_letter"]
BAD_RECORD_ACTIONS: tuple[str, ...] = get_args(BadRecordAction)
DEFAULT_MAX_SHARE = 0.1
# A batch with fewer rejected records than this is never taken for a wholesale failure.
WHOLESALE_MIN_REJECTED = 10


@dataclass(frozen=True)
class BadRecordPolicy:
    action: BadRecordAction = "fail"
    max_share: float = DEFAULT_MAX_SHARE  # of a batch's records rejected, beyond which the batch fails

    def __post_init__(self) -> None:
        if self.action not in BAD_RECORD_ACTIONS:
            raise ValueError(f"bad_records must be one of {', '.join(BAD_RECORD_ACTIONS)}, got {self.action!r}")
        if not 0 < self.max_share <= 1:
            raise ValueError(f"dead_letter_max_share must be above 0 and at most 1, got {self.max_share!r}")

    @property
    def dead_letters(self) -> bool:
        return self.action == "dead_letter"

    def set_aside(self, rejected: Sequence[RejectedRecord], records: int, spec: str) -> Sequence[RejectedRecord]:
        """The rejected records to dead-letter, out of a batch of `records`; `TransformError` when the
        policy fails the batch instead (it fails on bad records, or the processing failed wholesale)."""
        if not rejected:
            return ()
        if not self.dead_letters:
            raise TransformError(spec, rejected[0].error, DECODER)
        if len(rejected) >= WHOLESALE_MIN_REJECTED and len(rejected) > self.max_share * records:
            raise TransformError(
                spec,
                f"rejected {len(rejected)} of a batch's {records} records, more than dead_letter_max_share "
                f"({self.max_share:g}) allows: the processing fails, not a few bad records; the first: "
                f"{rejected[0].error}",
                DECODER,
            )
        return rejected


def dead_letter_table(
    rejected: Sequence[RejectedRecord],
    batch: BatchRange,
    processing: str,
    application: str,
    incarnation: tuple[str, int] | None = None,
) -> pa.Table:
    """The batch's dead letters as a DEAD_LETTER_SCHEMA table, in shard order: a pure function of the
    batch and its records (a retried batch stages the same rows). `incarnation`: the stream's ARN and
    creation time (epoch seconds), when the round knows them."""
    records = [rejection.record for rejection in rejected]
    count = len(records)
    columns: dict[str, list[object]] = {
        name: [getattr(record, name) for record in records] for name in RECORD_SCHEMA.names
    }
    arn, created = incarnation if incarnation is not None else (None, None)
    columns.update(
        error=[rejection.error for rejection in rejected],
        processing=[processing] * count,
        application=[application] * count,
        stream_arn=[arn] * count,
        stream_created=[created] * count,
        lease_key=[batch.lease_key] * count,
        batch_start=[str(batch.start)] * count,
        batch_end=[str(batch.end)] * count,
    )
    return pa.table(columns, schema=DEAD_LETTER_SCHEMA)
