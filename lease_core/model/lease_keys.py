"""How a shard's lease is keyed: the bare shard id, or `<stream id>:<shard id>` in multi-stream mode
(docs/protocol.md §7), and the new lease a shard gets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.sequence import ExtendedSequenceNumber


@dataclass(frozen=True)
class LeaseKeyScheme:
    """How a shard's lease is keyed: the bare shard id, or `<stream id>:<shard id>` in multi-stream mode."""

    stream: StreamIdentifier | None = None

    def lease_key(self, shard_id: str) -> str:
        return shard_id if self.stream is None else self.stream.lease_key(shard_id)

    def shard_id_of(self, lease: Lease) -> str:
        return lease.lease_key if self.stream is None or lease.shard_id is None else lease.shard_id

    def owns(self, lease: Lease) -> bool:
        """Whether `lease` belongs to this scheme's stream; single-stream mode owns no multi-stream lease."""
        if self.stream is None:
            return lease.stream_name is None
        return lease.stream_name == self.stream.serialize()

    def new_lease(
        self,
        shard_id: str,
        checkpoint: ExtendedSequenceNumber,
        parent_shard_ids: Iterable[str],
        hash_key_range: object,
    ) -> Lease:
        fields = {
            "checkpoint": checkpoint,
            "parent_shard_ids": frozenset(parent_shard_ids),
            "hash_key_range": hash_key_range,
        }
        if self.stream is None:
            return Lease(shard_id, **fields)  # type: ignore[arg-type]
        return Lease.for_stream(self.stream, shard_id, **fields)
