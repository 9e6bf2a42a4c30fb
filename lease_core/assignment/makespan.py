"""Makespan assignment (ours, docs/protocol.md §4.7): a batch round ends when its slowest slot ends.

A worker's load is the sum of its leases' throughput (leases never measured count as the average,
as in docs/protocol.md §4.2). Up-for-grabs leases are placed largest first on the least-loaded worker
(LPT). Rebalancing then repeatedly takes the most-loaded worker and makes the single move, or the
pair swap, with the least-loaded worker that most lowers the larger of their two loads; it stops
when no move lowers it or when `max_moves_per_round` moves are spent. Every move strictly lowers
the sum of squared loads, so the loop cannot cycle, and a lease never moves without a gain. The
rebalance is made only if it lowers the busiest load by `rebalance_min_effect_percentage` of it or
more (less is what measurement noise alone produces, and acting on it moves leases every round),
and stops once what is left to gain is under a quarter of that.

Unlike KCL's deciders the limits are strict: a worker never takes a lease that would put it above
`max_throughput_per_host_kbps` or `max_leases_for_worker`; such leases spill over.
"""

from __future__ import annotations

import bisect
import heapq

from lease_core.assignment.decision import AssignmentInput, AssignmentPlan, AssignmentSettings, moves_to
from lease_core.assignment.view import build_view


def lower_bound(snapshot: AssignmentInput) -> float:
    """No assignment can do better than an even split, nor split the largest lease."""
    throughput = build_view(snapshot).lease_throughput
    total = sum(throughput.values())
    return max(total / max(len(snapshot.workers), 1), max(throughput.values(), default=0.0))


class MakespanAssignment:
    """The `makespan` strategy: minimise the largest projected slot load under a move budget."""

    def decide(self, snapshot: AssignmentInput) -> AssignmentPlan:
        state = _Loads(snapshot)
        spillover = state.place_up_for_grabs()
        if snapshot.balance:
            state.rebalance()
        return AssignmentPlan(moves=moves_to(snapshot, state.owner_of), spillover=spillover)


class _Loads:
    """Per-worker loads and leases (sorted by throughput) while one decision moves leases around."""

    def __init__(self, snapshot: AssignmentInput) -> None:
        self.snapshot = snapshot
        self.settings: AssignmentSettings = snapshot.settings
        self.throughput = build_view(snapshot).lease_throughput
        self.owner_of = {lease.lease_key: lease.actual_owner for lease in snapshot.leases}
        self.waiting = [
            key
            for key in dict.fromkeys(snapshot.up_for_grabs)
            if key in self.owner_of and key not in snapshot.blocked_on_handoff
        ]
        waiting = set(self.waiting)
        self.load = {worker.worker_id: 0.0 for worker in snapshot.workers}
        # (throughput, key) pairs kept sorted so that the best move is a binary search away.
        self.held: dict[str, list[tuple[float, str]]] = {worker: [] for worker in self.load}
        for key, owner in self.owner_of.items():
            if owner in self.load and key not in waiting:
                self.held[owner].append((self.throughput[key], key))
                self.load[owner] += self.throughput[key]
        for pairs in self.held.values():
            pairs.sort()

    # --- bookkeeping ---------------------------------------------------------------------------------

    def _take(self, worker: str, key: str) -> None:
        bisect.insort(self.held[worker], (self.throughput[key], key))
        self.load[worker] += self.throughput[key]
        self.owner_of[key] = worker

    def _give(self, worker: str, key: str) -> None:
        self.held[worker].remove((self.throughput[key], key))
        self.load[worker] -= self.throughput[key]

    def _fits(self, worker: str, extra_throughput: float, extra_leases: int) -> bool:
        return (
            self.load[worker] + extra_throughput <= self.settings.max_throughput_per_host_kbps
            and len(self.held[worker]) + extra_leases <= self.settings.max_leases_for_worker
        )

    # --- placing up-for-grabs leases (LPT) ---------------------------------------------------------

    def place_up_for_grabs(self) -> tuple[str, ...]:
        spillover = []
        # Equal loads go to the worker with fewer leases: before any throughput is measured every
        # lease weighs 0, and a tie broken by name alone would stack them all on one worker.
        heap = [
            (load, len(self.held[worker]), worker) for worker, load in self.load.items() if self._fits(worker, 0.0, 1)
        ]
        heapq.heapify(heap)
        # Largest first; the given order (longest waiting first) breaks ties.
        for key in sorted(self.waiting, key=lambda key: -self.throughput[key]):
            if not heap or not self._fits(heap[0][2], self.throughput[key], 1):
                spillover.append(key)
                continue
            _, _, worker = heapq.heappop(heap)
            self._take(worker, key)
            if self._fits(worker, 0.0, 1):
                heapq.heappush(heap, (self.load[worker], len(self.held[worker]), worker))
        order = {key: index for index, key in enumerate(self.waiting)}
        return tuple(sorted(spillover, key=order.__getitem__))

    # --- rebalancing -------------------------------------------------------------------------------

    def rebalance(self) -> None:
        """Rebalance if that lowers the busiest load by at least the floor, and stop as soon as what
        is left to gain is under a quarter of it; or, while a slot holds no lease, as far as it helps.

        Measured throughput is noisy: re-solving every round would trade leases between slots whose
        loads only look different, each move costing a handoff for no real gain. A real change of load
        (a shard that doubles) lowers the busiest load by far more than noise can; the steps that
        would follow it only chase the noise, and the next round would not take them either. A slot
        with no lease is no noise: one added to W >= 12 slots lowers the busiest load by less than
        the default floor, and would otherwise stay empty round after round.
        """
        before = self._copy()
        busiest = max(self.load.values(), default=0.0)
        self._rebalance_steps(until=0.0)
        floor = self.settings.rebalance_min_effect_percentage / 100 * busiest
        best = max(self.load.values(), default=0.0)
        self.owner_of, self.load, self.held = before
        empty_slot = any(not self.held.get(worker) for worker in self.load)
        if busiest > 0 and (empty_slot or busiest - best >= floor):
            # The steps are deterministic: the same ones again, up to the first good-enough state.
            self._rebalance_steps(until=best if empty_slot else best + floor / 4)

    def _copy(self) -> tuple[dict[str, str | None], dict[str, float], dict[str, list[tuple[float, str]]]]:
        return dict(self.owner_of), dict(self.load), {worker: list(pairs) for worker, pairs in self.held.items()}

    def _rebalance_steps(self, until: float) -> None:
        """Steps from the busiest to the idlest slot until the busiest load is at most `until`, no
        step helps, or the move budget is spent."""
        budget = self.settings.max_moves_per_round
        moved = 0
        while len(self.load) > 1 and (budget is None or moved < budget):
            donor = max(self.load, key=lambda worker: (self.load[worker], worker))
            if self.load[donor] <= until:
                return
            receiver = min(self.load, key=lambda worker: (self.load[worker], worker))
            room = None if budget is None else budget - moved
            step = self._best_step(donor, receiver, room)
            if step is None:
                return
            for key, source, target in step:
                self._give(source, key)
                self._take(target, key)
            moved += len(step)

    def _best_step(self, donor: str, receiver: str, room: int | None) -> list[tuple[str, str, str]] | None:
        """The single move or swap that leaves max(donor, receiver) lowest, if it beats the donor's load."""
        gap = self.load[donor] - self.load[receiver]
        best_delta, best_step = 0.0, None
        single = self._best_single(donor, receiver, gap)
        if single is not None:
            best_delta, best_step = single[0], [(single[1], donor, receiver)]
        if room is None or room >= 2:
            swap = self._best_swap(donor, receiver, gap)
            # A swap costs two moves, so it must be strictly better than the best single move.
            if swap is not None and _pair_max_drop(swap[0], gap) > _pair_max_drop(best_delta, gap):
                best_step = [(swap[1], donor, receiver), (swap[2], receiver, donor)]
        return best_step

    def _best_single(self, donor: str, receiver: str, gap: float) -> tuple[float, str] | None:
        if not self._fits(receiver, 0.0, 1):
            return None
        candidates = _nearest(self.held[donor], gap / 2, self.snapshot.blocked_on_handoff)
        useful = [(t, key) for t, key in candidates if 0 < t < gap and self._fits(receiver, t, 1)]
        return min(useful, key=lambda pair: (-_pair_max_drop(pair[0], gap), pair[1]), default=None)

    def _best_swap(self, donor: str, receiver: str, gap: float) -> tuple[float, str, str] | None:
        blocked = self.snapshot.blocked_on_handoff
        best: tuple[float, str, str] | None = None
        for given, give_key in self.held[donor]:
            if give_key in blocked:
                continue
            for taken, take_key in _nearest(self.held[receiver], given - gap / 2, blocked):
                delta = given - taken
                if not (0 < delta < gap and self._fits(receiver, delta, 0)):
                    continue
                if best is None or _pair_max_drop(delta, gap) > _pair_max_drop(best[0], gap):
                    best = (delta, give_key, take_key)
        return best


def _pair_max_drop(delta: float, gap: float) -> float:
    """How much moving `delta` of load from donor to receiver lowers the larger of their two loads."""
    return min(delta, gap - delta) if 0 < delta < gap else 0.0


def _nearest(pairs: list[tuple[float, str]], value: float, blocked: frozenset[str]) -> list[tuple[float, str]]:
    """The movable leases just below and just above `value` in a throughput-sorted list."""
    index = bisect.bisect_left(pairs, (value, ""))
    below = next((pairs[i] for i in range(index - 1, -1, -1) if pairs[i][1] not in blocked), None)
    above = next((pairs[i] for i in range(index, len(pairs)) if pairs[i][1] not in blocked), None)
    return [pair for pair in (below, above) if pair is not None]
