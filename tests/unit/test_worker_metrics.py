"""Worker metrics: a slot's own utilization, the KCL item (docs/protocol.md §5.1-5.2) and the leader's view."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lease_core.assignment.decision import WorkerLoad
from lease_core.metrics.worker_metrics import (
    InMemoryWorkerMetricsStore,
    WorkerMetricStats,
    active_workers,
    ema,
    publish_worker_metrics,
    slot_utilization_percent,
)
from lease_core.store.record_table import from_attribute_values, to_attribute_values

# --- A slot's utilization -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_seconds", "covered_seconds", "expected"),
    [
        pytest.param(3.0, 60.0, 5.0, id="3-cpu-seconds-for-a-minute-of-data-is-5-percent-of-a-core"),
        pytest.param(0.0, 60.0, 0.0, id="no-cpu"),
        pytest.param(1.0, 3.0, 33.333333, id="six-decimals-half-up"),
        pytest.param(90.0, 60.0, 100.0, id="more-than-a-core-is-capped-at-100-as-kcl"),
        pytest.param(2.0, None, None, id="no-lease-read-no-figure"),
        pytest.param(2.0, 0.0, None, id="no-data-time-covered-no-figure"),
    ],
)
def test_a_slots_utilization_is_its_own_cpu_over_the_data_time_it_covered(cpu_seconds, covered_seconds, expected):
    assert slot_utilization_percent(cpu_seconds, covered_seconds) == expected


def test_negative_cpu_time_is_rejected():
    with pytest.raises(ValueError, match="cpu_seconds"):
        slot_utilization_percent(-1.0, 60.0)


# --- The item --------------------------------------------------------------------------------------


def cpu_worker(values, round_=5, lut=1_700_000_000, worker_id="app-worker-0", opr=(100.0,)) -> WorkerMetricStats:
    return WorkerMetricStats(worker_id, lut, stats={"C": tuple(values)}, operating_range={"C": opr}, round=round_)


def test_the_item_uses_kcl_attribute_names_and_types_plus_our_round():
    stats = cpu_worker([12.5, -1, 40.123456])
    assert to_attribute_values(stats.to_item()) == {
        "wid": {"S": "app-worker-0"},
        "lut": {"N": "1700000000"},
        "sts": {"M": {"C": {"L": [{"N": "12.5"}, {"N": "-1"}, {"N": "40.123456"}]}}},
        "opr": {"M": {"C": {"L": [{"N": "100"}]}}},
        "round": {"N": "5"},
    }


@pytest.mark.parametrize(
    "stats",
    [
        pytest.param(cpu_worker([12.5, -1, 40.123456]), id="cpu-worker"),
        pytest.param(WorkerMetricStats("app-worker-1", 17, round=3), id="default-metric-worker"),
        pytest.param(
            WorkerMetricStats("app-worker-2", 17, stats={"C": (1.0,)}, operating_range={"C": (100.0,)}),
            id="written-by-kcl-without-round",
        ),
        pytest.param(WorkerMetricStats("app-worker-3"), id="no-lut"),
    ],
)
def test_items_round_trip(stats):
    assert WorkerMetricStats.from_item(stats.to_item()) == stats


def test_an_item_with_kcl_3_5_attributes_decodes_its_support_code_and_ignores_the_rest():
    item = to_attribute_values(cpu_worker([5.0]).to_item()) | {
        "sup": {"N": "1"},
        "slu": {"N": "1"},
        "entityType": {"S": "WORKER_METRIC_STATS"},
        "properties": {"M": {}},
    }
    assert WorkerMetricStats.from_item(from_attribute_values(item)) == replace(cpu_worker([5.0]), support_code=1)


def test_a_slot_s_write_carries_kcl_3_5_s_support_code_of_the_single_table_migration_dated_as_its_update():
    item = WorkerMetricStats("app-worker-0").appended(20.0, now=1_700_000_000, round=4).to_item()
    assert (item["sup"], item["slu"], item["lut"]) == (1, 1_700_000_000, 1_700_000_000)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"wid": {"N": "1"}}, "'wid' must be a non-empty string", id="wid-wrong-type"),
        pytest.param({"wid": {"S": ""}}, "'wid' must be a non-empty string", id="wid-empty"),
        pytest.param({"lut": {"S": "1"}}, "'app-worker-0': attribute 'lut' must be of type N", id="lut-wrong-type"),
        pytest.param({"lut": {"N": "1.5"}}, "'lut' must be an integer", id="lut-fraction"),
        pytest.param({"sts": {"L": []}}, "'app-worker-0': attribute 'sts' must be of type M", id="sts-not-a-map"),
        pytest.param({"sts": {"M": {"C": {"SS": ["1"]}}}}, "'sts' must be of type L", id="sts-entry-not-a-list"),
        pytest.param(
            {"opr": {"M": {"C": {"L": [{"S": "100"}]}}}}, "'opr' must be of type N", id="opr-value-not-a-number"
        ),
        pytest.param({"sts": {"M": {"C": {"L": [{"N": "NaN"}]}}}}, "'sts' must be finite", id="sts-nan"),
    ],
)
def test_corrupt_items_raise_value_errors_naming_worker_and_attribute(change, message):
    item = from_attribute_values(to_attribute_values(cpu_worker([5.0]).to_item()) | change)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        WorkerMetricStats.from_item(item)


def test_appending_starts_a_new_worker_with_a_cpu_range_of_100():
    stats = WorkerMetricStats("app-worker-0").appended(42.0, now=1000, round=7)
    assert stats == WorkerMetricStats("app-worker-0", 1000, {"C": (42.0,)}, {"C": (100.0,)}, round=7, support_code=1)


def test_appending_keeps_only_the_last_ten_values_oldest_first():
    stats = WorkerMetricStats("w")
    for n in range(12):
        stats = stats.appended(float(n), now=n, round=n)
    assert stats.stats["C"] == tuple(float(n) for n in range(2, 12))
    assert stats.last_update_epoch_seconds == 11 and stats.round == 11


def test_appending_keeps_other_metrics_and_an_existing_operating_range():
    stats = WorkerMetricStats("w", 1, {"C": (1.0,), "M": (2.0,)}, {"C": (80.0,), "M": (90.0,)}).appended(
        -1, now=2, round=2, keep=2
    )
    assert stats.stats == {"C": (1.0, -1.0), "M": (2.0,)} and stats.operating_range == {"C": (80.0,), "M": (90.0,)}


@pytest.mark.parametrize(
    "value", [pytest.param(100.5, id="above-100"), pytest.param(-0.5, id="negative-not-minus-one")]
)
def test_appending_an_out_of_range_value_is_rejected(value):
    with pytest.raises(ValueError, match=r"'w'.*'C'"):
        WorkerMetricStats("w").appended(value, now=1, round=1)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([50, 60], 55.0, id="kcl-example"),
        pytest.param([50, -1, 60], 55.0, id="minus-one-skipped"),
        pytest.param([-1, 40], 40.0, id="first-real-value-starts"),
        pytest.param([10, 20, 30], 22.5, id="three-values"),
        pytest.param([-1], 0.0, id="no-sample-at-all-is-zero"),
    ],
)
def test_ema_with_alpha_one_half(values, expected):
    assert ema(values) == expected


# --- Validity, failing, freshness ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stats", "valid"),
    [
        pytest.param(cpu_worker([10]), True, id="cpu-worker"),
        pytest.param(WorkerMetricStats("w", 1), True, id="default-metric-worker"),
        pytest.param(WorkerMetricStats("w", 1, {"T": (1.0,)}), True, id="throughput-metric-is-default"),
        pytest.param(WorkerMetricStats("w"), False, id="no-lut"),
        pytest.param(WorkerMetricStats("w", 1, {"C": (10.0,)}), False, id="stats-without-ranges"),
        pytest.param(WorkerMetricStats("w", 1, {}, {"C": (100.0,)}), False, id="ranges-without-stats"),
        pytest.param(WorkerMetricStats("w", 1, {"C": (10.0,)}, {"M": (100.0,)}), False, id="metric-without-its-range"),
        pytest.param(cpu_worker([10], opr=()), False, id="empty-range"),
        pytest.param(cpu_worker([10], opr=(0.0,)), False, id="zero-maximum"),
        pytest.param(cpu_worker([]), False, id="empty-value-list"),
    ],
)
def test_validity(stats, valid):
    assert stats.is_valid() is valid


@pytest.mark.parametrize(
    ("stats", "failing"),
    [
        pytest.param(cpu_worker([10, 20]), False, id="all-sampled"),
        pytest.param(cpu_worker([10, -1]), True, id="latest-missing"),
        pytest.param(cpu_worker([-1, 10]), False, id="older-missing-is-fine"),
        pytest.param(
            WorkerMetricStats("w", 1, {"C": (10.0,), "M": (-1.0,)}, {"C": (100.0,), "M": (100.0,)}),
            True,
            id="any-metric",
        ),
        pytest.param(WorkerMetricStats("w", 1), False, id="default-metric-worker"),
    ],
)
def test_failing(stats, failing):
    assert stats.is_failing() is failing


@pytest.mark.parametrize(
    ("written_round", "current_round", "fresh"),
    [
        pytest.param(7, 7, True, id="this-round"),
        pytest.param(6, 7, True, id="previous-round"),
        pytest.param(5, 7, False, id="two-rounds-ago"),
        pytest.param(None, 7, False, id="no-round-written-by-kcl"),
    ],
)
def test_freshness_is_counted_in_rounds(written_round, current_round, fresh):
    assert cpu_worker([10], round_=written_round).is_fresh(current_round) is fresh


def test_freshness_window_is_configurable():
    assert cpu_worker([10], round_=5).is_fresh(7, max_rounds_old=2)


def test_to_worker_load_carries_values_and_the_range_maximum():
    assert cpu_worker([10, -1, 30], opr=(80.0,)).to_worker_load() == WorkerLoad(
        "app-worker-0", metrics={"C": (10.0, -1.0, 30.0)}, operating_range={"C": 80.0}
    )


# --- active_workers ------------------------------------------------------------------------------

SLOTS = ["app-worker-0", "app-worker-1"]


@pytest.mark.parametrize(
    ("stored", "expected_loads", "expected_notes"),
    [
        pytest.param(
            {}, [WorkerLoad("app-worker-0"), WorkerLoad("app-worker-1")], {}, id="no-metrics-balanced-by-throughput"
        ),
        pytest.param(
            {"app-worker-0": cpu_worker([40, 60], round_=9)},
            [WorkerLoad("app-worker-0", {"C": (40.0, 60.0)}, {"C": 100.0}), WorkerLoad("app-worker-1")],
            {},
            id="fresh-cpu-worker-and-listed-worker-without-metrics",
        ),
        pytest.param(
            {"app-worker-0": cpu_worker([40, 60], round_=10)},
            [WorkerLoad("app-worker-0", {"C": (40.0, 60.0)}, {"C": 100.0}), WorkerLoad("app-worker-1")],
            {},
            id="written-this-round",
        ),
        pytest.param(
            {"app-worker-0": cpu_worker([40, -1], round_=9)},
            [WorkerLoad("app-worker-1")],
            {"app-worker-0": "failing: the latest interval of a metric has no sample (-1)"},
            id="failing-excluded",
        ),
        pytest.param(
            {"app-worker-1": cpu_worker([40], round_=9, worker_id="app-worker-1", opr=(0.0,))},
            [WorkerLoad("app-worker-0")],
            {"app-worker-1": "invalid: operating range of 'C' must start with a non-zero maximum"},
            id="invalid-excluded",
        ),
        pytest.param(
            {"app-worker-0": cpu_worker([90, 95], round_=3)},
            [WorkerLoad("app-worker-0"), WorkerLoad("app-worker-1")],
            {"app-worker-0": "stale: last written in round 3, metrics ignored, balanced by throughput"},
            id="stale-ignored-not-excluded",
        ),
        pytest.param(
            {"app-worker-0": cpu_worker([90, -1], round_=3, opr=(0.0,))},
            [WorkerLoad("app-worker-0"), WorkerLoad("app-worker-1")],
            {"app-worker-0": "stale: last written in round 3, metrics ignored, balanced by throughput"},
            id="stale-failing-or-invalid-metrics-are-ignored-too",
        ),
        pytest.param(
            {"app-worker-9": cpu_worker([50], round_=10, worker_id="app-worker-9")},
            [WorkerLoad("app-worker-0"), WorkerLoad("app-worker-1")],
            {},
            id="metrics-of-a-slot-not-requested-are-ignored",
        ),
        pytest.param(
            {"app-worker-1": WorkerMetricStats("app-worker-1", 5, round=10)},
            [WorkerLoad("app-worker-0"), WorkerLoad("app-worker-1")],
            {},
            id="fresh-default-metric-worker",
        ),
    ],
)
def test_active_workers(stored, expected_loads, expected_notes):
    loads, notes = active_workers(SLOTS, stored, current_round=10)
    assert (loads, notes) == (expected_loads, expected_notes)


def test_a_slot_is_excluded_exactly_when_it_has_no_load():
    stored = {
        "app-worker-0": cpu_worker([1, -1], round_=10),
        "app-worker-1": cpu_worker([1], round_=1, worker_id="app-worker-1"),
    }
    loads, notes = active_workers(SLOTS, stored, current_round=10)
    assert [load.worker_id for load in loads] == ["app-worker-1"] and set(notes) == set(SLOTS)
    assert all(load.is_default_metric_worker for load in loads)


# --- Publishing --------------------------------------------------------------------------------


def test_a_slot_publishes_its_average_onto_its_history():
    store = InMemoryWorkerMetricsStore()
    publish_worker_metrics(store, "app-worker-0", 30.0, now=100, round=1)
    published = publish_worker_metrics(store, "app-worker-0", -1.0, now=200, round=2)
    assert store.get("app-worker-0") == published == replace(cpu_worker([30, -1], round_=2, lut=200), support_code=1)
