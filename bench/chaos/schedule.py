"""The campaign's schedule: which faults, in which round, at which moment, drawn from one seeded Random.

Everything random about a campaign comes from `random.Random(seed)`, drawn here, before anything
runs: the rounds' parallelism W, the faults of each round, their delays, variants and the uniform
`pick`s that later choose among what exists at that moment (a shard, a worker process, a lease).
The same seed therefore replays the same schedule; only process timing differs between runs.

Every fault kind appears once in the first rounds (a shuffled permutation of all kinds), so even a
short campaign injects each kind; the rest are weighted draws. A round carries at most one dying
leader, one faulty proxy window and one table commit's fault, and at most one of a driver kill, an
Airflow retry and a table commit's fault. A sink meets only the kinds it can (`kinds_for`: a table
commit's faults are a Delta table's), and the schedule of the other kinds is the same whatever the sink.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

WORKER_SIGKILL = "worker_sigkill"
DRIVER_KILL = "driver_kill"
TWIN_ATTEMPT = "twin_attempt"
AIRFLOW_RETRY = "airflow_retry"
LEADER_DEATH = "leader_death"
SPLIT = "split"
MERGE = "merge"
PROXY_FAULTS = "proxy_faults"
RESET = "reset"
RETENTION_TRIM = "retention_trim"
TABLE_COMMIT = "table_commit"
# The faults of enhanced fan-out (bench/chaos/subscription_faults.py).
SUBSCRIPTION_CUT = "subscription_cut"
ZOMBIE_SUBSCRIPTION = "zombie_subscription"
IN_USE_WINDOW = "in_use_window"
CONSUMER_DEREGISTERED = "consumer_deregistered"
MODE_SWITCH = "mode_switch"
SUBSCRIPTION_FAULTS = frozenset({SUBSCRIPTION_CUT, ZOMBIE_SUBSCRIPTION, IN_USE_WINDOW})
# Faults done before the round's table step (between rounds), not on the round's timeline.
BEFORE_ROUND = frozenset({CONSUMER_DEREGISTERED, MODE_SWITCH})

# Weights of the draws after the first permutation. A leader death costs a lock takeover (one
# leader lease duration of waiting), so it is drawn less often. A table commit's fault comes at most
# once a round, so it is drawn more often: most rounds into a Delta table carry one.
FAULT_WEIGHTS: dict[str, float] = {
    WORKER_SIGKILL: 4,
    DRIVER_KILL: 3,
    TWIN_ATTEMPT: 2,
    AIRFLOW_RETRY: 3,
    LEADER_DEATH: 0.5,
    SPLIT: 3,
    MERGE: 3,
    PROXY_FAULTS: 4,
    RESET: 3,
    RETENTION_TRIM: 2,
    TABLE_COMMIT: 6,
    SUBSCRIPTION_CUT: 4,
    ZOMBIE_SUBSCRIPTION: 2,
    IN_USE_WINDOW: 2,
    CONSUMER_DEREGISTERED: 1,
    MODE_SWITCH: 1,
}
FAULT_KINDS = tuple(FAULT_WEIGHTS)
# Kinds only some sinks meet: the faults of a Delta table's commit (bench/chaos/commit_faults.py).
SINK_ONLY: dict[str, frozenset[str]] = {TABLE_COMMIT: frozenset({"delta"})}
# Kinds only a campaign that reads by enhanced fan-out meets.
FAN_OUT_ONLY = frozenset({SUBSCRIPTION_CUT, ZOMBIE_SUBSCRIPTION, IN_USE_WINDOW, CONSUMER_DEREGISTERED, MODE_SWITCH})

VARIANTS: dict[str, tuple[str, ...]] = {
    # Which process of the consume job dies: the JVM (the Spark driver), its Python driver, or both.
    DRIVER_KILL: ("jvm", "python", "both"),
    # The twin holds the round's lock name (an Airflow try beside a zombie try), or none (by hand).
    TWIN_ATTEMPT: ("same_owner", "by_hand"),
    # The operator retries a refused reset once the round has released the lock, or gives up.
    RESET: ("retry_after_round", "refused_only"),
    # How the trimmed shard answers an iterator below its trim horizon (devtools/fault_proxy.py).
    RETENTION_TRIM: ("reject", "skip"),
    # What the driver's table commit meets (bench/chaos/commit_faults.py).
    TABLE_COMMIT: ("killed_before", "killed_after", "answer_lost", "answer_as_conflict", "stalled"),
    # How a slot's subscription is cut mid-stream: its connection reset, or an exception event.
    SUBSCRIPTION_CUT: ("reset", "InternalFailureException", "ResourceInUseException"),
}

# When a fault fires: `delay` seconds after its anchor. "start": the start of the round's first try
# (spark-submit starts, a driver comes up, slots run: a twin or an Airflow retry may land in any of
# these; a trim then lands before the slots open their iterators, so what it ages out is really
# lost). "batches": the first moment a slot's Python worker has run a batch (kills, the stream and
# the data plane's calls matter while slots read). "leader": after the dying leader holds the lock.
# "commit": the first table commit of the round's first try (its driver meets the fault then).
# "round": before the round's table step, between this round and the one before (`BEFORE_ROUND`).
ANCHORS: dict[str, str] = {
    WORKER_SIGKILL: "batches",
    DRIVER_KILL: "batches",
    TWIN_ATTEMPT: "start",
    AIRFLOW_RETRY: "start",
    LEADER_DEATH: "leader",
    SPLIT: "batches",
    MERGE: "batches",
    PROXY_FAULTS: "batches",
    RESET: "batches",
    RETENTION_TRIM: "start",
    TABLE_COMMIT: "commit",
    SUBSCRIPTION_CUT: "batches",
    ZOMBIE_SUBSCRIPTION: "batches",
    IN_USE_WINDOW: "batches",
    CONSUMER_DEREGISTERED: "round",
    MODE_SWITCH: "round",
}
DELAYS: dict[str, tuple[float, float]] = {
    WORKER_SIGKILL: (0.0, 3.0),
    DRIVER_KILL: (0.0, 4.0),
    TWIN_ATTEMPT: (0.0, 10.0),
    AIRFLOW_RETRY: (1.0, 14.0),
    LEADER_DEATH: (0.0, 2.0),
    SPLIT: (0.0, 4.0),
    MERGE: (0.0, 4.0),
    PROXY_FAULTS: (0.0, 2.0),
    RESET: (0.0, 4.0),
    RETENTION_TRIM: (0.0, 5.0),
    TABLE_COMMIT: (0.0, 0.0),
    SUBSCRIPTION_CUT: (0.0, 6.0),
    ZOMBIE_SUBSCRIPTION: (0.0, 4.0),
    IN_USE_WINDOW: (0.0, 6.0),
    CONSUMER_DEREGISTERED: (0.0, 0.0),
    MODE_SWITCH: (0.0, 0.0),
}
PROXY_WINDOW_SECONDS = (4.0, 12.0)
WORKER_CHOICES = (1, 2, 2, 3)
# At most one of these per round: each ends the running try, and a round in which every try is
# killed says little about the other faults in it (a table commit's fault needs its try to get there).
TRY_ENDING = frozenset({DRIVER_KILL, AIRFLOW_RETRY, TABLE_COMMIT})
# At most once per round: a dead leader is met before the round's first step, one faulty window
# of the proxies is open at a time, and a round's first try commits once. Other kinds may come twice
# (two worker kills, two splits, ...).
ONCE_PER_ROUND = frozenset({LEADER_DEATH, PROXY_FAULTS, TABLE_COMMIT, CONSUMER_DEREGISTERED, MODE_SWITCH})


@dataclass(frozen=True)
class Fault:
    kind: str
    delay: float
    variant: str = ""
    pick: float = 0.0  # chooses among what exists when the fault fires
    depth: float = 0.0  # retention_trim: how far into the shard's unread records the trim horizon goes
    duration: float = 0.0  # proxy_faults: how long the faulty window lasts
    deferrals: int = 0  # how often it was carried to a later round because what it needs was missing

    def describe(self) -> str:
        variant = f"[{self.variant}]" if self.variant else ""
        window = f" for {self.duration:.1f} s" if self.duration else ""
        return f"{self.kind}{variant}@{ANCHORS[self.kind]}+{self.delay:.1f}s{window}"


@dataclass(frozen=True)
class RoundPlan:
    number: int
    workers: int
    faults: tuple[Fault, ...]
    token: str  # makes the round's leader owner name unique


@dataclass(frozen=True)
class Schedule:
    rounds: tuple[RoundPlan, ...]

    @property
    def faults(self) -> int:
        return sum(len(plan.faults) for plan in self.rounds)


# At least three faults per round on average, so that a short campaign has injected every kind
# after four rounds.
MIN_FAULTS_PER_ROUND = 3.0


def faults_per_round(faults: int, rounds: int) -> float:
    """The mean number of faults per round that spreads `faults` over the `rounds` expected to fit."""
    return max(MIN_FAULTS_PER_ROUND, faults / max(1, rounds))


def kinds_for(sink: str, retrieval: str = "polling") -> tuple[str, ...]:
    """The fault kinds a campaign into `sink`, reading by `retrieval`, injects by default: every kind
    the sink and the mode can meet."""
    return tuple(
        kind
        for kind in FAULT_KINDS
        if sink in SINK_ONLY.get(kind, frozenset({sink})) and (retrieval == "fan_out" or kind not in FAN_OUT_ONLY)
    )


def build_schedule(
    rng: random.Random, faults: int, expected_rounds: int, kinds: tuple[str, ...] = FAULT_KINDS
) -> Schedule:
    """`faults` faults of `kinds` over rounds of about `faults / expected_rounds` faults each (at
    least three), drawn from `rng` (the campaign's one `random.Random(seed)`).

    The first rounds take a shuffled permutation of every kind (the kinds that need a running try
    first: when the try has ended before they fire they are deferred, and a short campaign still
    has rounds left to inject them); after that each round draws kinds by weight (`_fits`).
    """
    mean = faults_per_round(faults, expected_rounds)
    uncovered = list(kinds)
    rng.shuffle(uncovered)
    uncovered.sort(key=lambda kind: kind not in (WORKER_SIGKILL, DRIVER_KILL))
    rounds: list[RoundPlan] = []
    planned = 0
    while planned < faults:
        count = min(_round_size(rng, mean, len(kinds)), faults - planned)
        chosen: list[str] = []
        for kind in list(uncovered):
            if len(chosen) < count and _fits(kind, chosen):
                chosen.append(kind)
                uncovered.remove(kind)
        while len(chosen) < count:
            options = [kind for kind in kinds if _fits(kind, chosen)]
            if not options:
                break
            chosen.append(rng.choices(options, weights=[FAULT_WEIGHTS[kind] for kind in options])[0])
        faults_of_round = tuple(_fault(rng, kind) for kind in chosen)
        rounds.append(
            RoundPlan(len(rounds) + 1, rng.choice(WORKER_CHOICES), faults_of_round, f"{rng.getrandbits(32):08x}")
        )
        planned += len(chosen)
    return Schedule(tuple(rounds))


def _fits(kind: str, chosen: list[str]) -> bool:
    if kind in ONCE_PER_ROUND and kind in chosen:
        return False
    # A round that switches to polling has no subscription to cut, take over or overlap.
    if (kind == MODE_SWITCH and SUBSCRIPTION_FAULTS & set(chosen)) or (
        kind in SUBSCRIPTION_FAULTS and MODE_SWITCH in chosen
    ):
        return False
    return not (kind in TRY_ENDING and TRY_ENDING & set(chosen))


def _round_size(rng: random.Random, mean: float, kinds: int) -> int:
    """floor or ceil of the mean, so that the rounds average it; at most one of each kind."""
    low = math.floor(mean)
    size = low + (1 if rng.random() < mean - low else 0)
    return max(1, min(size, kinds))


def _fault(rng: random.Random, kind: str) -> Fault:
    low, high = DELAYS[kind]
    delay = round(rng.uniform(low, high), 2)
    variant = rng.choice(VARIANTS[kind]) if kind in VARIANTS else ""
    pick = rng.random()
    depth = rng.random() if kind == RETENTION_TRIM else 0.0
    duration = round(rng.uniform(*PROXY_WINDOW_SECONDS), 2) if kind == PROXY_FAULTS else 0.0
    return Fault(kind, delay, variant, pick, depth, duration)
