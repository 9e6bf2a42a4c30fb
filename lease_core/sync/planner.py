"""Shard sync planning: which leases a sync creates, decided purely from shards and leases.

KCL's HierarchicalShardSyncer (docs/protocol.md §3.3-3.6): an empty lease table gets a lease for every
listed shard at the initial position; a non-empty table gets leases only for open shards without a
leased ancestor and for at most one level of missing ancestry, so that descendants wait for their
parents' SHARD_END. Planned leases are ordered parents first (by starting sequence number).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import InitialPosition, Shard


def inconsistent_shards(shards: Sequence[Shard]) -> frozenset[str]:
    """§3.3: children of parents that are still open (only parents present in the listing count)."""
    by_id = {shard.shard_id: shard for shard in shards}
    return frozenset(
        shard.shard_id
        for shard in shards
        if any(parent in by_id and by_id[parent].is_open for parent in shard.parent_shard_ids)
    )


def order_parents_first(leases: Iterable[Lease], shards: Sequence[Shard], scheme: LeaseKeyScheme) -> list[Lease]:
    """§3.5: by the shard's starting sequence number, then by shard id; unlisted shards sort by id."""
    starts = {shard.shard_id: int(shard.starting_sequence_number) for shard in shards}

    def key(lease: Lease) -> tuple[int, int, str]:
        shard_id = scheme.shard_id_of(lease)
        return (0, starts[shard_id], shard_id) if shard_id in starts else (1, 0, shard_id)

    return sorted(leases, key=key)


def plan_for_empty_table(
    shards: Sequence[Shard], initial_position: InitialPosition, scheme: LeaseKeyScheme = LeaseKeyScheme()
) -> list[Lease]:
    """§3.4: one lease per listed shard, open or closed, at the initial position."""
    leases = [
        scheme.new_lease(shard.shard_id, initial_position.checkpoint, shard.parent_shard_ids, shard.hash_key_range)
        for shard in shards
    ]
    return order_parents_first(leases, shards, scheme)


def plan_for_existing_leases(
    shards: Sequence[Shard],
    leased_shard_ids: Iterable[str],
    initial_position: InitialPosition,
    skipped_shard_ids: Iterable[str] = (),
    scheme: LeaseKeyScheme = LeaseKeyScheme(),
) -> list[Lease]:
    """§3.5: leases for open shards with no leased ancestor, plus one level of missing ancestry.

    `skipped_shard_ids` are the inconsistent shards a sync was told to ignore.
    """
    planner = _HierarchyPlanner(shards, frozenset(leased_shard_ids), initial_position)
    skipped = frozenset(skipped_shard_ids)
    for shard in shards:
        if not shard.is_open or shard.shard_id in planner.leased or shard.shard_id in skipped:
            continue
        if not planner.is_descendant(shard.shard_id):
            planner.planned[shard.shard_id] = initial_position.checkpoint
    leases = [
        scheme.new_lease(
            shard_id, checkpoint, planner.shards[shard_id].parent_shard_ids, planner.shards[shard_id].hash_key_range
        )
        for shard_id, checkpoint in planner.planned.items()
    ]
    return order_parents_first(leases, shards, scheme)


class _HierarchyPlanner:
    """The memoised descendant walk of one sync run (`isDescendant` and `shouldCreateLease`)."""

    def __init__(self, shards: Sequence[Shard], leased: frozenset[str], initial_position: InitialPosition) -> None:
        self.shards = {shard.shard_id: shard for shard in shards}
        self.leased = leased
        self.initial_position = initial_position
        self.planned: dict[str, ExtendedSequenceNumber] = {}
        self._descendant: dict[str, bool] = {}
        self._should_create: set[str] = set()

    def _known_parents(self, shard_id: str) -> list[str]:
        """The listed parents, and the leased ones even when the listing lacks them; sorted for a
        deterministic walk.

        Trimmed parents without a lease are ignored (§3.5). A leased parent missing from a partial
        listing still makes its child a descendant: taken for a root, the child would get a lease at
        the initial position (LATEST skips its records written before its first read), while the
        parent's lease creates it at TRIM_HORIZON when it reaches SHARD_END. [deviation: KCL ignores
        every unlisted parent; for a complete listing the two agree.]
        """
        return sorted(p for p in self.shards[shard_id].parent_shard_ids if p in self.shards or p in self.leased)

    def is_descendant(self, shard_id: str) -> bool:
        """Whether the shard has a leased (or to-be-read) ancestor, planning ancestors on the way.

        An explicit stack instead of recursion: a stream resharded back and forth for long enough
        has lineages deeper than Python's recursion limit. Parents are decided before children, in
        the order the recursive definition visits them.
        """
        stack = [shard_id]
        while stack:
            current = stack[-1]
            if current in self._descendant:
                stack.pop()
            elif current in self.leased:
                self._descendant[current] = True
                stack.pop()
            elif current not in self.shards:
                stack.pop()
            elif undecided := [p for p in self._known_parents(current) if p not in self._descendant]:
                stack.extend(reversed(undecided))
            else:
                self._descendant[current] = self._decide(current)
                stack.pop()
        return self._descendant.get(shard_id, False)

    def _decide(self, shard_id: str) -> bool:
        """The descendant test of §3.5, once every listed parent of the shard is decided."""
        parents = self._known_parents(shard_id)
        descendant_parents = {p for p in parents if self._descendant[p] or p in self._should_create}
        if descendant_parents:
            for parent in parents:
                self._plan_ancestor(parent, parent in descendant_parents)
        elif self.initial_position is not InitialPosition.LATEST:
            # Not under any leased shard: read it from its beginning (TRIM_HORIZON / AT_TIMESTAMP).
            self._should_create.add(shard_id)
        return bool(descendant_parents)

    def _plan_ancestor(self, parent: str, is_descendant_parent: bool) -> None:
        """§3.5's rule for one parent of a descendant."""
        if parent in self.leased:
            return
        if parent not in self.planned and not (parent in self._should_create or not is_descendant_parent):
            return
        if is_descendant_parent and self.initial_position is not InitialPosition.AT_TIMESTAMP:
            self.planned[parent] = TRIM_HORIZON
        else:
            self.planned[parent] = self.initial_position.checkpoint
