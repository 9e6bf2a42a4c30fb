"""The prepared batch of the exactly-once protocol (docs/protocol.md §2.6), kept in `pendingCheckpointState`.

For a lease at committed checkpoint C, a batch is prepared as pending checkpoint P before its output
is written, and committed after. Whoever finds a pending checkpoint must redo exactly (C, P]. The
state bytes describe that batch so a redo needs no guessing:

- `first`: the position of the batch's first record. A batch that started at a sentinel (LATEST,
  AT_TIMESTAMP, TRIM_HORIZON) cannot be replayed from the sentinel: LATEST has moved on and the trim
  horizon may have. The redo reads from `first` instead.
- `name`: the sink's name for the batch, a pure function of (stream, shard, C, P), shown in reports
  (kept under the key `path`, from when it was always a file's); None when the batch had no rows to
  write (e.g. a transform dropped them all).
- `staged`: the sink's token for what the preparing attempt stages before the commit (its own,
  invisible to readers); a redo by another attempt adopts it rather than read the range again.
  Absent in batches prepared before batches were staged, or when the sink cannot name it in advance.
- `child_shards`: at P = SHARD_END, the children GetRecords named, so a redo whose batch is already
  visible can create the child leases without reading the shard again.

State written by anyone else (a KCL application sharing the table stores its own bytes) is not ours:
`decode` returns None and the redo falls back to reading (C, P] from C.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lease_core.errors import CorruptLeaseError
from lease_core.model.lease import HashKeyRange, Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.model.shards import ChildShard

STATE_FORMAT = "kinesis-lease-batch/1"


@dataclass(frozen=True)
class PendingBatch:
    start: ExtendedSequenceNumber
    end: ExtendedSequenceNumber
    first: ExtendedSequenceNumber | None
    name: str | None
    records: int
    child_shards: tuple[ChildShard, ...] = ()
    staged: str | None = None

    def encode(self) -> bytes:
        document = {
            "format": STATE_FORMAT,
            "start": _position(self.start),
            "end": _position(self.end),
            "first": None if self.first is None else _position(self.first),
            "path": self.name,
            "staged": self.staged,
            "records": self.records,
            "children": [_child(child) for child in sorted(self.child_shards, key=lambda c: c.shard_id)],
        }
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, lease: Lease) -> PendingBatch | None:
        """The lease's pending batch if its state is ours and matches its checkpoints, else None.

        Ours but unreadable raises `CorruptLeaseError`: a redo must not guess what was written.
        """
        if lease.pending_checkpoint is None or lease.pending_checkpoint_state is None:
            return None
        try:
            document = json.loads(lease.pending_checkpoint_state)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
            return None
        try:
            batch = cls(
                start=_parse_position(document["start"]),
                end=_parse_position(document["end"]),
                first=None if document["first"] is None else _parse_position(document["first"]),
                name=document["path"],
                records=int(document["records"]),
                child_shards=tuple(_parse_child(child) for child in document["children"]),
                staged=document.get("staged"),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptLeaseError(lease.lease_key, f"pendingCheckpointState is unreadable: {error!r}") from None
        if batch.start != lease.checkpoint or batch.end != lease.pending_checkpoint:
            # A stale description (the checkpoints moved without it) describes some other batch.
            return None
        return batch


def _position(value: ExtendedSequenceNumber) -> list[object]:
    return [value.sequence_number, value.sub_sequence_number]


def _parse_position(raw: object) -> ExtendedSequenceNumber:
    if not isinstance(raw, list) or len(raw) != 2:
        raise ValueError(f"a position is [sequence number, sub-sequence number], got {raw!r}")
    return ExtendedSequenceNumber(raw[0], raw[1])


def _child(child: ChildShard) -> dict[str, object]:
    return {
        "shard_id": child.shard_id,
        "parents": sorted(child.parent_shard_ids),
        "hash_key_range": [str(child.hash_key_range.starting_hash_key), str(child.hash_key_range.ending_hash_key)],
    }


def _parse_child(raw: dict[str, Any]) -> ChildShard:
    starting, ending = raw["hash_key_range"]
    return ChildShard(
        shard_id=str(raw["shard_id"]),
        parent_shard_ids=frozenset(raw["parents"]),
        hash_key_range=HashKeyRange.from_strings(starting, ending),
    )
