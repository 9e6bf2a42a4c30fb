"""The monitoring API's documents over reads: overview, leader, workers' CPU, rounds, lease pages, reads cache."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kinesis_lease.monitoring import (
    NOT_KEPT,
    NOT_READ,
    ApplicationReads,
    LeaseQuery,
    ReadsCache,
    RunLinks,
    application_document,
    leases_document,
    natural_key,
    run_document,
)

from lease_core.config.settings import ConsumerConfig
from lease_core.errors import CorruptLeaseError
from lease_core.leader.leader_lock import LockHolder, SharedObservation
from lease_core.metrics.worker_metrics import WorkerMetricStats
from lease_core.model.lease import Lease
from lease_core.model.stream_consumer import StreamConsumerState
from lease_core.store.lease_store import LeaseScan

APP = "orders"
NOW = 1_800_000_000_000
SCRIPT = Path(__file__).resolve().parents[2] / "plugins" / "kinesis_lease" / "static" / "monitoring.js"


def reads(
    leases: list[tuple[str, str | None]] | None = None,
    *,
    rows: list[dict[str, Any]] | None = None,
    rounds: list[dict[str, Any]] | None = None,
    leader: LockHolder | None = None,
    observation: SharedObservation | None = None,
    metrics: tuple[WorkerMetricStats, ...] = (),
    last_round: int | None = None,
    corrupt: tuple[CorruptLeaseError, ...] = (),
    left_out: int = 0,
    consumers: tuple[StreamConsumerState, ...] = (),
) -> ApplicationReads:
    scan = LeaseScan(tuple(Lease(key, lease_owner=owner) for key, owner in leases or []), corrupt)
    return ApplicationReads(
        ConsumerConfig(application_name=APP),
        scan,
        metrics,
        leader,
        tuple(rounds or []),
        last_round,
        tuple(rows or []),
        observation,
        NOW,
        left_out,
        consumers,
    )


def keys(document: dict[str, Any]) -> list[str]:
    return [lease["lease_key"] for lease in document["leases"]]


# --- lease pages ---------------------------------------------------------------------------------


def test_lease_keys_sort_naturally_in_single_and_multi_stream_mode():
    names = ["shardId-000000000010", "shardId-000000000009", "1:s:2:shardId-10", "1:s:2:shardId-9", "1:s:10:shardId-1"]
    assert sorted(names, key=natural_key) == [
        "1:s:2:shardId-9",
        "1:s:2:shardId-10",
        "1:s:10:shardId-1",
        "shardId-000000000009",
        "shardId-000000000010",
    ]


def test_a_page_is_a_slice_of_every_lease_in_natural_order_with_the_totals():
    application = reads([(f"shardId-{index}", "w") for index in range(250)])
    page = leases_document(application, LeaseQuery(offset=100, limit=100))
    assert keys(page) == [f"shardId-{index}" for index in range(100, 200)]
    assert (page["total"], page["filtered"], page["offset"], page["limit"]) == (250, 250, 100, 100)
    assert keys(leases_document(application, LeaseQuery(offset=240, limit=100))) == [
        f"shardId-{index}" for index in range(240, 250)
    ]


LAGGING = reads(
    [("shardId-1", "w-0"), ("shardId-2", "w-1"), ("shardId-3", None), ("shardId-4", "w-0"), ("shardId-5", "w-1")],
    rows=[
        {
            "lease_key": "shardId-1",
            "records": 5,
            "millis_behind_latest": 100,
            "oldest_unlanded_age_millis": 3000,
            "newest_landed_age_millis": 3100,
            "outcome": "limit",
            "worker_id": "w-0",
            "dead_lettered": 2,
        },
        {
            "lease_key": "shardId-2",
            "records": 9,
            "millis_behind_latest": 0,
            "oldest_unlanded_age_millis": 500,
            "outcome": "caught_up",
            "worker_id": "w-1",
        },
        {
            "lease_key": "shardId-4",
            "records": 5,
            "millis_behind_latest": 100,
            "oldest_unlanded_age_millis": 3000,
            "outcome": "limit",
            "worker_id": "w-0",
        },
    ],
    last_round=3,
)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param(LeaseQuery(sort="lease_key", order="desc"), [5, 4, 3, 2, 1], id="key-desc"),
        pytest.param(LeaseQuery(sort="lag", order="desc"), [1, 4, 2, 3, 5], id="lag-desc-ties-natural-missing-last"),
        pytest.param(LeaseQuery(sort="lag"), [2, 1, 4, 3, 5], id="lag-asc-missing-last"),
        pytest.param(LeaseQuery(sort="freshness", order="desc"), [1, 4, 2, 3, 5], id="freshness-oldest-first"),
        pytest.param(LeaseQuery(sort="records", order="desc"), [2, 1, 4, 3, 5], id="records-desc"),
        pytest.param(LeaseQuery(sort="owner"), [1, 4, 2, 5, 3], id="owner-unassigned-last"),
        pytest.param(LeaseQuery(sort="outcome"), [2, 1, 4, 3, 5], id="outcome"),
        pytest.param(LeaseQuery(owner="w-1"), [2, 5], id="owner-filter"),
        pytest.param(LeaseQuery(owner="(unassigned)"), [3], id="unassigned-filter"),
        pytest.param(LeaseQuery(outcome="limit"), [1, 4], id="outcome-filter"),
        pytest.param(LeaseQuery(outcome=NOT_READ), [3, 5], id="not-read-filter"),
        pytest.param(LeaseQuery(q="W-0"), [1, 4], id="text-in-owner-any-case"),
        pytest.param(LeaseQuery(q="shardId-3"), [3], id="text-in-key"),
        pytest.param(LeaseQuery(owner="w-0", sort="lease_key", order="desc", limit=1), [4], id="filter-sort-page"),
    ],
)
def test_leases_are_sorted_and_filtered_before_they_are_paged(query, expected):
    page = leases_document(LAGGING, query)
    assert keys(page) == [f"shardId-{number}" for number in expected]


def test_a_lease_the_last_round_did_not_read_shows_as_not_read_with_the_freshness_carried_for_it():
    carried = {"lease_key": "shardId-1", "landed_through_millis": 5, "oldest_unlanded_age_millis": 900_000}
    page = leases_document(reads([("shardId-1", None)], rows=[carried], last_round=3), LeaseQuery())
    (lease,) = page["leases"]
    assert lease["last_round"]["outcome"] == NOT_READ
    assert lease["last_round"]["oldest_unlanded_age_millis"] == 900_000
    assert page["outcomes"] == [NOT_READ]
    assert keys(
        leases_document(reads([("shardId-1", None)], rows=[carried], last_round=3), LeaseQuery(outcome=NOT_READ))
    ) == ["shardId-1"]


def test_a_page_names_the_owners_and_outcomes_its_filters_can_take_and_the_filtered_count():
    page = leases_document(LAGGING, LeaseQuery(outcome="limit", limit=1))
    assert page["owners"] == ["w-0", "w-1", "(unassigned)"]
    assert page["outcomes"] == ["caught_up", "limit", NOT_READ]
    assert (page["total"], page["filtered"], len(page["leases"])) == (5, 2, 1)
    assert page["leases"][0]["last_round"] == {
        "records": 5,
        "millis_behind_latest": 100,
        "oldest_unlanded_age_millis": 3000,
        "newest_landed_age_millis": 3100,
        "outcome": "limit",
        "worker_id": "w-0",
        "error": None,
        "dead_lettered": 2,
    }
    # A row of an older release has no dead-letter count: not known, rather than none.
    older = leases_document(LAGGING, LeaseQuery(q="shardId-2"))["leases"][0]
    assert older["last_round"]["dead_lettered"] is None


@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param({"offset": -1}, id="offset"),
        pytest.param({"limit": 0}, id="limit-0"),
        pytest.param({"limit": 1001}, id="limit-over-1000"),
        pytest.param({"sort": "checkpoint"}, id="sort"),
        pytest.param({"order": "up"}, id="order"),
    ],
)
def test_a_query_out_of_range_names_its_parameter(wrong):
    (name,) = wrong
    with pytest.raises(ValueError, match=f"invalid {name}"):
        LeaseQuery(**wrong)


# --- the overview --------------------------------------------------------------------------------


def test_the_overview_has_no_lease_list_and_names_corrupt_items_by_key_and_attribute():
    corrupt = (
        CorruptLeaseError("shardId-7", "attribute 'leaseCounter' is not a number", "leaseCounter"),
        CorruptLeaseError("shardId-8", "the item is not a map"),
    )
    overview = application_document(reads([("shardId-1", "w")], corrupt=corrupt))
    assert "leases" not in overview and overview["now_millis"] == NOW
    assert overview["summary"]["corrupt_items"] == [
        {"lease_key": "shardId-7", "attribute": "leaseCounter", "problem": "attribute 'leaseCounter' is not a number"},
        {"lease_key": "shardId-8", "attribute": None, "problem": "the item is not a map"},
    ]


def holder(heartbeat_at: int | None, released: bool = False) -> LockHolder:
    return LockHolder("pipeline/run-3/t", "v3", 120_000, released, heartbeat_at)


@pytest.mark.parametrize(
    ("lock", "observation", "running"),
    [
        pytest.param(holder(NOW - 30_000), None, True, id="heartbeat-within-the-lease"),
        pytest.param(holder(NOW - 120_001), None, False, id="heartbeat-older-than-the-lease"),
        pytest.param(holder(NOW - 1_000, released=True), None, False, id="released"),
        pytest.param(holder(None), None, True, id="kcl-lock-never-observed-expired"),
        pytest.param(holder(None), SharedObservation("v3", NOW - 60_000, "x"), True, id="kcl-lock-seen-recently"),
        pytest.param(holder(None), SharedObservation("v3", NOW - 200_000, "x"), False, id="kcl-lock-observed-expired"),
        pytest.param(
            holder(None), SharedObservation("v2", NOW - 200_000, "x"), True, id="observation-of-older-version"
        ),
    ],
)
def test_the_leader_is_running_only_while_a_round_holds_the_lock(lock, observation, running):
    rounds = [{"run_id": "run-2", "finished_at": NOW - 300_000, "leader": "pipeline/run-2/t"}]
    leader = application_document(reads(rounds=rounds, leader=lock, observation=observation))["leader"]
    assert leader == {
        "owner": "pipeline/run-3/t",
        "released": lock.is_released,
        "running": running,
        "lease_duration_millis": 120_000,
        "heartbeat_at": lock.heartbeat_at_millis,
        "seen_at": lock.heartbeat_at_millis,  # this owner's own time, never the previous round's
        "last_round_at": NOW - 300_000,
    }


@pytest.mark.parametrize(
    ("state", "running"),
    [
        pytest.param("running", True, id="its-dag-run-runs-between-two-steps"),
        pytest.param("failed", False, id="its-dag-run-died"),
        pytest.param(None, False, id="its-dag-run-is-unknown"),
    ],
)
def test_a_lock_whose_heartbeat_is_older_than_its_lease_is_running_while_its_dag_run_runs(state, running):
    # Rounds heartbeat inside their steps only: a gap between two steps can outlast the lease.
    runs = RunLinks({("pipeline", "run-3"): state} if state else {})
    document = application_document(reads(leader=holder(NOW - 600_000)), runs)
    assert (document["leader"]["running"], document["leader"]["seen_at"]) == (running, NOW - 600_000)


def test_a_released_lock_is_never_running_whatever_its_dag_run_says():
    runs = RunLinks({("pipeline", "run-3"): "running"})
    assert application_document(reads(leader=holder(NOW, released=True)), runs)["leader"]["running"] is False


@pytest.mark.parametrize(
    ("rounds", "leader"),
    [
        pytest.param([], None, id="no-round-ever"),
        pytest.param(
            [
                {"run_id": "run-1", "finished_at": 5, "leader": "a"},
                {"run_id": "run-2", "finished_at": 9, "leader": "b"},
            ],
            {
                "owner": "b",
                "released": True,
                "running": False,
                "lease_duration_millis": None,
                "heartbeat_at": None,
                "seen_at": 9,
                "last_round_at": 9,
            },
            id="released-the-newest-rounds-leader",
        ),
        pytest.param(
            [{"run_id": "run-1", "finished_at": 5}],
            {
                "owner": None,
                "released": True,
                "running": False,
                "lease_duration_millis": None,
                "heartbeat_at": None,
                "seen_at": 5,
                "last_round_at": 5,
            },
            id="older-release-entry-without-leader",
        ),
    ],
)
def test_after_the_lock_was_released_the_last_leader_is_the_newest_rounds(rounds, leader):
    assert application_document(reads(rounds=rounds))["leader"] == leader


def metrics(worker: str, round_: int, cpu: float) -> WorkerMetricStats:
    return WorkerMetricStats(worker, 1, {"C": (50.0, cpu)}, {"C": (100.0,)}, round_)


def test_a_slot_shows_its_cpu_only_if_it_read_a_lease_in_the_last_round_and_holds_one_now():
    application = reads(
        [("shardId-1", "w-0"), ("shardId-2", "w-1")],
        rows=[
            {"lease_key": "shardId-1", "outcome": "caught_up", "worker_id": "w-0"},
            {"lease_key": "shardId-9", "outcome": "shard_end", "worker_id": "w-2"},  # its lease is gone since
        ],
        metrics=(metrics("w-0", 4, 40.0), metrics("w-1", 4, 100.0), metrics("w-2", 4, 100.0)),
        last_round=4,
    )
    workers = {worker["worker_id"]: worker for worker in application_document(application)["workers"]}
    assert {name: (worker["leases"], worker["cpu_percent"]) for name, worker in workers.items()} == {
        "w-0": (1, 40.0),
        "w-1": (1, None),  # holds a lease, but read none in round 4
        "w-2": (0, None),  # read in round 4, holds none now
    }
    assert workers["w-2"]["cpu_history"] == [50.0, 100.0] and workers["w-2"]["metrics_round"] == 4


# --- rounds --------------------------------------------------------------------------------------

COMPACT = {
    "run_id": "scheduled__2026-11-24T03:00:00+00:00",
    "dag_id": "pipeline",
    "round": 2,
    "consumed": True,
    "dead_lettered": 2,
    "slots": {
        "columns": ["slot", "leases", "records", "bytes", "seconds", "cpu_percent"],
        "rows": [[0, 2, 10, 100, 1.5, 30.0], ["foreign-worker", 0, 0, 0, 0.1, None]],
    },
}
OLDER = {
    "run_id": "manual__1",
    "round": 1,
    "records": 4,
    "slots": [
        {
            "worker_id": "orders-worker-0",
            "leases": 1,
            "attempt": 0,
            "records": 4,
            "bytes": 8,
            "seconds": 1.0,
            "cpu_percent": -1,
        }
    ],
}
IDLE = {"run_id": "manual__3", "dag_id": "pipeline", "round": 3, "consumed": False, "slots": None}


def test_rounds_come_newest_first_with_their_run_state_page_and_every_field():
    runs = RunLinks({("pipeline", COMPACT["run_id"]): "success", ("pipeline", "manual__1"): "failed"}, "/airflow")
    rounds = application_document(reads(rounds=[OLDER, COMPACT, IDLE]), runs)["rounds"]
    assert [(entry["round"], entry["idle"], entry["state"]) for entry in rounds] == [
        (3, True, None),
        (2, False, "success"),
        (1, False, "failed"),
    ]
    assert rounds[1]["run_url"] == "/airflow/dags/pipeline/runs/scheduled__2026-11-24T03%3A00%3A00%2B00%3A00"
    # An older release's entry: its DAG is the only one with that run, the fields it lacks are null.
    assert (rounds[2]["dag_id"], rounds[2]["leases_behind"], rounds[2]["outcomes"]) == ("pipeline", None, None)
    assert [entry["dead_lettered"] for entry in rounds] == [None, 2, None]
    assert rounds[2]["run_url"] == "/airflow/dags/pipeline/runs/manual__1"


def test_a_rounds_slots_read_as_objects_from_the_compact_rows_and_from_an_older_releases():
    rounds = application_document(reads(rounds=[OLDER, COMPACT, IDLE]))["rounds"]
    assert [entry["slots"] for entry in rounds] == [
        None,
        [
            {
                "worker_id": "orders-worker-0",
                "leases": 2,
                "records": 10,
                "bytes": 100,
                "seconds": 1.5,
                "cpu_percent": 30.0,
            },
            {"worker_id": "foreign-worker", "leases": 0, "records": 0, "bytes": 0, "seconds": 0.1, "cpu_percent": None},
        ],
        [{"worker_id": "orders-worker-0", "leases": 1, "records": 4, "bytes": 8, "seconds": 1.0, "cpu_percent": None}],
    ]


def test_a_round_without_a_run_id_or_with_an_unknown_run_has_no_state_and_no_link_it_cannot_make():
    rounds = application_document(reads(rounds=[{"round": 1}, {"round": 2, "run_id": "gone"}]))["rounds"]
    assert [(entry["dag_id"], entry["state"], entry["run_url"]) for entry in rounds] == [(None, None, None)] * 2


def test_a_dag_runs_view_names_its_application_and_its_round():
    document = run_document("pipeline", "manual__3", reads(rounds=[COMPACT, IDLE]))
    assert (document["application"], document["round"]["round"], document["round"]["idle"]) == (APP, 3, True)
    assert run_document("other_dag", "manual__3", reads(rounds=[IDLE]))["round"] is None


# --- the reads cache -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Reader:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> ApplicationReads:
        self.count += 1
        return reads([(f"shardId-{self.count}", None)])


def test_cached_reads_serve_pages_for_the_ttl_and_a_fresh_call_reads_anew():
    clock, reader = Clock(), Reader()
    cache = ReadsCache(ttl_seconds=5, clock=clock)
    first = cache.get("app", reader)
    clock.now = 5
    assert cache.get("app", reader) is first and reader.count == 1
    assert cache.get("app", reader, fresh=True) is not first and reader.count == 2
    clock.now = 10.5
    cache.get("app", reader)
    assert reader.count == 3


def test_reads_slower_than_the_ttl_are_served_for_the_ttl_after_they_finished():
    clock = Clock()
    count = 0

    def slow_read() -> ApplicationReads:
        nonlocal count
        count += 1
        clock.now += 8  # a Scan of 10,000 leases on moto
        return reads()

    cache = ReadsCache(ttl_seconds=5, clock=clock)
    first = cache.get("app", slow_read)
    clock.now += 4
    assert cache.get("app", slow_read) is first and count == 1


def test_the_cache_keeps_the_most_recently_used_applications_only():
    clock, reader = Clock(), Reader()
    cache = ReadsCache(ttl_seconds=60, max_entries=2, clock=clock)
    for key in ("a", "b", "a", "c", "a"):
        cache.get(key, reader)
    assert reader.count == 3  # a, b, c; "b" was evicted by "c", "a" stayed
    cache.get("b", reader)
    assert reader.count == 4


def test_callers_of_one_application_wait_for_one_read_instead_of_each_scanning():
    cache = ReadsCache(ttl_seconds=60)
    started, release = threading.Event(), threading.Event()
    count = 0

    def slow_read() -> ApplicationReads:
        nonlocal count
        count += 1
        started.set()
        release.wait(5)
        return reads()

    results: list[ApplicationReads] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("app", slow_read))) for _ in range(4)]
    threads[0].start()
    started.wait(5)
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.05)
    release.set()
    for thread in threads:
        thread.join(5)
    assert count == 1 and len({id(result) for result in results}) == 1


def test_a_failed_read_keeps_nothing_and_raises():
    cache = ReadsCache()

    def failing() -> ApplicationReads:
        raise RuntimeError("Scan failed")

    with pytest.raises(RuntimeError, match="Scan failed"):
        cache.get("app", failing)
    reader = Reader()
    cache.get("app", reader)
    assert reader.count == 1


def test_a_failed_read_of_an_unknown_application_makes_no_room_for_it():
    cache = ReadsCache(ttl_seconds=60, max_entries=2, clock=lambda: 0.0)
    scans = []

    def good() -> ApplicationReads:
        scans.append(1)
        return reads()

    def missing_table() -> ApplicationReads:
        raise LookupError("no such table")

    cache.get("orders", good)
    for typo in ("ordres", "oders"):
        with pytest.raises(LookupError):
            cache.get(typo, missing_table)
    cache.get("orders", good)
    assert len(scans) == 1


def test_leases_whose_rows_did_not_fit_the_last_rounds_record_are_not_known_rather_than_not_read():
    leases = [(f"shardId-{index}", "w-0") for index in range(6)]
    rows = [{"lease_key": f"shardId-{index}", "worker_id": "w-0", "outcome": "caught_up"} for index in range(4)]
    application = reads(leases, rows=rows, last_round=7, left_out=2)
    page = leases_document(application, LeaseQuery(limit=100))
    assert [lease["last_round"]["outcome"] for lease in page["leases"]] == ["caught_up"] * 4 + [NOT_KEPT] * 2
    assert page["outcomes"] == ["caught_up", NOT_KEPT]
    assert leases_document(application, LeaseQuery(outcome=NOT_READ))["filtered"] == 0


def leader_line(document: dict[str, Any]) -> str:
    """The page's own `format` and `leaderText` (static/monitoring.js), run by node over an overview."""
    source = SCRIPT.read_text(encoding="utf-8")
    functions = source[source.index("  const format = {") : source.index("  // --- the API")]
    functions += source[source.index("  function leaderText(") : source.index("  function lastRoundNodes(")]
    program = f"{functions}\nconst d = {json.dumps(document)};\nprocess.stdout.write(leaderText(d.leader, d.rounds));"
    return subprocess.run(["node", "-e", program], capture_output=True, text=True, check=True).stdout


def test_a_dead_rounds_lock_is_named_with_its_own_last_heartbeat_not_the_previous_rounds_finish():
    # run-2 finished at 07:40 UTC and released; run-3 took the lock, heartbeat last at 07:46:30, died.
    rounds = [{"run_id": "run-2", "finished_at": NOW - 20 * 60_000, "leader": "pipeline/run-2/t"}]
    document = application_document(reads(rounds=rounds, leader=holder(NOW - 13 * 60_000 - 30_000)))
    assert leader_line(document) == "no round running; last leader pipeline/run-3/t at 2027-01-15 07:46:30 UTC"


def test_the_overview_lists_the_applications_fan_out_consumers_and_whether_each_is_its_own():
    created = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    arn = "arn:aws:kinesis:us-east-1:1:stream/orders/consumer/orders:1793620800"
    consumers = (
        StreamConsumerState("clicks", APP, "ACTIVE", arn.replace("orders", "clicks", 1), created, False, "old-arn"),
        StreamConsumerState("orders", APP, "ACTIVE", arn, created, True, arn),
    )
    document = application_document(reads(consumers=consumers))
    assert [(c["stream_name"], c["status"], c["ours"], c["created"]) for c in document["stream_consumers"]] == [
        ("clicks", "ACTIVE", False, "2026-11-01T12:00:00+00:00"),
        ("orders", "ACTIVE", True, "2026-11-01T12:00:00+00:00"),
    ]
    assert application_document(reads())["stream_consumers"] == []
