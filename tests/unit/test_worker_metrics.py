"""Worker metrics: cgroup-aware CPU sampling, the KCL item (kcl-spec.md §6.1-6.3) and the leader's view."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lease_core.assignment import WorkerLoad
from lease_core.worker_metrics import (
    CpuUtilizationSampler,
    InMemoryWorkerMetricsStore,
    MetricRecorder,
    WorkerMetricStats,
    active_workers,
    ema,
    interval_average,
    publish_worker_metrics,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeHost:
    """psutil.cpu_times()-shaped cumulative seconds."""

    def __init__(self) -> None:
        self.times = {"user": 0.0, "system": 0.0, "idle": 0.0, "iowait": 0.0}

    def __call__(self) -> dict[str, float]:
        return dict(self.times)


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def cgroup_v2(root: Path, cpu_max: str, usage_usec: int) -> None:
    write(root, "cpu.max", f"{cpu_max}\n")
    write(root, "cpu.stat", f"usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 1\n")


def cgroup_v1(root: Path, quota: int, period: int, usage_ns: int, cpu_dir: str = "cpu", acct_dir: str = "cpuacct") -> None:
    write(root, f"{cpu_dir}/cpu.cfs_quota_us", f"{quota}\n")
    write(root, f"{cpu_dir}/cpu.cfs_period_us", f"{period}\n")
    write(root, f"{acct_dir}/cpuacct.usage", f"{usage_ns}\n")


def two_samples(root: Path, update, seconds: float = 1.0, host: FakeHost | None = None) -> tuple[float | None, float | None]:
    clock = FakeClock()
    sampler = CpuUtilizationSampler(root, clock=clock, host_cpu_times=host or FakeHost())
    first = sampler.sample()
    clock.now += seconds
    update()
    return first, sampler.sample()


# --- CPU sampling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_max", "used_seconds", "elapsed", "expected"),
    [
        pytest.param("200000 100000", 1.0, 1.0, 50.0, id="2-cpus-1-cpu-second-in-1s-is-50"),
        pytest.param("200000 100000", 2.0, 1.0, 100.0, id="2-cpus-fully-used-is-100"),
        pytest.param("50000 100000", 0.25, 1.0, 50.0, id="half-a-cpu-quarter-used-is-50"),
        pytest.param("400000 100000", 1.0, 2.0, 12.5, id="4-cpus-1-cpu-second-in-2s"),
        pytest.param("100000 100000", 1.5, 1.0, 100.0, id="burst-over-the-limit-is-clamped-to-100"),
    ],
)
def test_cgroup_v2_utilization_is_relative_to_the_quota(tmp_path, cpu_max, used_seconds, elapsed, expected):
    cgroup_v2(tmp_path, cpu_max, 5_000_000)
    first, second = two_samples(tmp_path, lambda: cgroup_v2(tmp_path, cpu_max, 5_000_000 + int(used_seconds * 1e6)), elapsed)
    assert first is None, "the first sample only takes the baseline"
    assert second == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cpu_dir", "acct_dir"),
    [
        pytest.param("cpu", "cpuacct", id="separate-controllers"),
        pytest.param("cpu,cpuacct", "cpu,cpuacct", id="joint-controller"),
    ],
)
def test_cgroup_v1_utilization_is_relative_to_the_cfs_quota(tmp_path, cpu_dir, acct_dir):
    cgroup_v1(tmp_path, 200_000, 100_000, 7_000_000_000, cpu_dir, acct_dir)
    _, second = two_samples(tmp_path, lambda: cgroup_v1(tmp_path, 200_000, 100_000, 8_000_000_000, cpu_dir, acct_dir))
    assert second == pytest.approx(50.0)


def busy_host(host: FakeHost) -> FakeHost:
    """Between the two samples the host spends 3 of 4 CPU-seconds busy: 75%."""
    host.times = {"user": 10.0, "system": 10.0, "idle": 80.0, "iowait": 0.0}
    return host


@pytest.mark.parametrize(
    "make_cgroup",
    [
        pytest.param(lambda root: cgroup_v2(root, "max 100000", 0), id="v2-max"),
        pytest.param(lambda root: cgroup_v1(root, -1, 100_000, 0), id="v1-minus-one"),
        pytest.param(lambda root: None, id="no-cgroup-files"),
    ],
)
def test_without_a_limit_the_sampler_falls_back_to_host_cpu(tmp_path, make_cgroup):
    make_cgroup(tmp_path)
    host = busy_host(FakeHost())

    def spend() -> None:
        host.times = {"user": 12.0, "system": 11.0, "idle": 80.5, "iowait": 0.5}

    _, second = two_samples(tmp_path, spend, host=host)
    assert second == pytest.approx(75.0)


def test_host_fallback_excludes_guest_time_already_counted_as_user(tmp_path):
    host = FakeHost()
    host.times = {"user": 0.0, "idle": 0.0, "guest": 0.0}

    def spend() -> None:
        host.times = {"user": 1.0, "idle": 1.0, "guest": 1.0}

    assert two_samples(tmp_path, spend, host=host)[1] == pytest.approx(50.0)


@pytest.mark.parametrize(
    "break_files",
    [
        pytest.param(lambda root: (root / "cpu.stat").unlink(), id="v2-cpu-stat-missing"),
        pytest.param(lambda root: (root / "cpu.stat").write_text("user_usec 5\n"), id="v2-no-usage-line"),
        pytest.param(lambda root: (root / "cpu.max").write_text("garbage\n"), id="v2-garbled-cpu-max"),
        pytest.param(lambda root: (root / "cpu.max").write_text("0 100000\n"), id="v2-zero-quota"),
        pytest.param(lambda root: (root / "cpu.stat").write_text("usage_usec lots\n"), id="v2-usage-not-a-number"),
    ],
)
def test_unreadable_cgroup_v2_files_give_no_sample(tmp_path, break_files):
    cgroup_v2(tmp_path, "200000 100000", 0)
    assert two_samples(tmp_path, lambda: break_files(tmp_path))[1] is None


def test_cgroup_v1_quota_without_an_accounting_file_gives_no_sample(tmp_path):
    cgroup_v1(tmp_path, 200_000, 100_000, 0)
    assert two_samples(tmp_path, lambda: (tmp_path / "cpuacct" / "cpuacct.usage").unlink())[1] is None


def test_a_reset_counter_gives_no_sample_rather_than_a_negative_one(tmp_path):
    cgroup_v2(tmp_path, "200000 100000", 9_000_000)
    assert two_samples(tmp_path, lambda: cgroup_v2(tmp_path, "200000 100000", 1_000_000))[1] is None


def test_a_sampler_recovers_after_a_failed_capture(tmp_path):
    clock = FakeClock()
    sampler = CpuUtilizationSampler(tmp_path, clock=clock)
    cgroup_v2(tmp_path, "100000 100000", 0)
    sampler.sample()
    (tmp_path / "cpu.stat").unlink()
    clock.now += 1
    assert sampler.sample() is None
    cgroup_v2(tmp_path, "100000 100000", 500_000)
    clock.now += 1
    assert sampler.sample() is None, "a new baseline is needed after a failure"
    cgroup_v2(tmp_path, "100000 100000", 800_000)
    clock.now += 1
    assert sampler.sample() == pytest.approx(30.0)


def test_the_real_sampler_measures_something_between_0_and_100():
    sampler = CpuUtilizationSampler()
    sampler.sample()
    sum(range(200_000))
    value = sampler.sample()
    assert value is None or 0 <= value <= 100


# --- MetricRecorder ------------------------------------------------------------------------------


class ScriptedSampler:
    def __init__(self, *values: float | None) -> None:
        self.values = list(values)
        self.calls = 0

    def sample(self) -> float | None:
        self.calls += 1
        return self.values.pop(0) if self.values else None


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        pytest.param([10.0, 20.0], 15.0, id="mean"),
        pytest.param([], -1.0, id="nothing-captured-is-minus-one"),
        pytest.param([1 / 3], 0.333333, id="six-decimals"),
        pytest.param([0.0000005], 0.000001, id="half-up-not-half-even"),
        pytest.param([0.0000025], 0.000003, id="half-up-on-an-even-digit"),
    ],
)
def test_interval_average(samples, expected):
    assert interval_average(samples) == expected


def test_the_recorder_averages_captured_samples_and_skips_failed_captures():
    recorder = MetricRecorder(ScriptedSampler(None, 40.0, None, 60.0))
    for _ in range(4):
        recorder.record()
    assert recorder.average() == 50.0


def test_a_recorder_that_captured_nothing_reports_minus_one():
    with MetricRecorder(ScriptedSampler(), interval_seconds=60) as recorder:
        pass
    assert recorder.average() == -1.0


def test_the_recorder_samples_at_start_and_end_of_short_work():
    sampler = ScriptedSampler(None, 70.0)
    with MetricRecorder(sampler, interval_seconds=60) as recorder:
        pass
    assert sampler.calls == 2 and recorder.average() == 70.0


def test_the_recorder_thread_samples_periodically_until_stopped():
    sampled = threading.Event()

    class Counting(ScriptedSampler):
        def sample(self) -> float | None:
            if self.calls >= 3:
                sampled.set()
            super().sample()
            return 25.0

    sampler = Counting()
    recorder = MetricRecorder(sampler, interval_seconds=0.01)
    recorder.start()
    assert sampled.wait(5)
    assert recorder.stop() == 25.0
    calls = sampler.calls
    assert calls >= 5
    threading.Event().wait(0.05)
    assert sampler.calls == calls, "no sampling after stop"


def test_a_non_positive_interval_is_rejected():
    with pytest.raises(ValueError, match="interval_seconds"):
        MetricRecorder(ScriptedSampler(), interval_seconds=0)


# --- The item --------------------------------------------------------------------------------------


def cpu_worker(values, round_=5, lut=1_700_000_000, worker_id="app-worker-0", opr=(100.0,)) -> WorkerMetricStats:
    return WorkerMetricStats(worker_id, lut, stats={"C": tuple(values)}, operating_range={"C": opr}, round=round_)


def test_the_item_uses_kcl_attribute_names_and_types_plus_our_round():
    stats = cpu_worker([12.5, -1, 40.123456])
    assert stats.to_item() == {
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
        pytest.param(WorkerMetricStats("app-worker-2", 17, stats={"C": (1.0,)}, operating_range={"C": (100.0,)}), id="written-by-kcl-without-round"),
        pytest.param(WorkerMetricStats("app-worker-3"), id="no-lut"),
    ],
)
def test_items_round_trip(stats):
    assert WorkerMetricStats.from_item(stats.to_item()) == stats


def test_an_item_with_kcl_3_5_attributes_decodes_and_ignores_them():
    item = cpu_worker([5.0]).to_item() | {"sup": {"N": "1"}, "slu": {"N": "1"}, "entityType": {"S": "WORKER_METRIC_STATS"}, "properties": {"M": {}}}
    assert WorkerMetricStats.from_item(item) == cpu_worker([5.0])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"wid": {"N": "1"}}, "'wid' must be a non-empty string", id="wid-wrong-type"),
        pytest.param({"wid": {"S": ""}}, "'wid' must be a non-empty string", id="wid-empty"),
        pytest.param({"lut": {"S": "1"}}, "'app-worker-0': attribute 'lut' must be of type N", id="lut-wrong-type"),
        pytest.param({"lut": {"N": "1.5"}}, "'lut' must be an integer", id="lut-fraction"),
        pytest.param({"round": {"N": "x"}}, "'round' is not a number", id="round-not-a-number"),
        pytest.param({"sts": {"L": []}}, "'app-worker-0': attribute 'sts' must be of type M", id="sts-not-a-map"),
        pytest.param({"sts": {"M": {"C": {"SS": ["1"]}}}}, "'sts' must be of type L", id="sts-entry-not-a-list"),
        pytest.param({"opr": {"M": {"C": {"L": [{"S": "100"}]}}}}, "'opr' must be of type N", id="opr-value-not-a-number"),
        pytest.param({"sts": {"M": {"C": {"L": [{"N": "NaN"}]}}}}, "'sts' must be finite", id="sts-nan"),
    ],
)
def test_corrupt_items_raise_value_errors_naming_worker_and_attribute(change, message):
    item = cpu_worker([5.0]).to_item() | change
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        WorkerMetricStats.from_item(item)


def test_appending_starts_a_new_worker_with_a_cpu_range_of_100():
    stats = WorkerMetricStats("app-worker-0").appended(42.0, now=1000, round=7)
    assert stats == WorkerMetricStats("app-worker-0", 1000, {"C": (42.0,)}, {"C": (100.0,)}, round=7)


def test_appending_keeps_only_the_last_ten_values_oldest_first():
    stats = WorkerMetricStats("w")
    for n in range(12):
        stats = stats.appended(float(n), now=n, round=n)
    assert stats.stats["C"] == tuple(float(n) for n in range(2, 12))
    assert stats.last_update_epoch_seconds == 11 and stats.round == 11


def test_appending_keeps_other_metrics_and_an_existing_operating_range():
    stats = WorkerMetricStats("w", 1, {"C": (1.0,), "M": (2.0,)}, {"C": (80.0,), "M": (90.0,)}).appended(-1, now=2, round=2, keep=2)
    assert stats.stats == {"C": (1.0, -1.0), "M": (2.0,)} and stats.operating_range == {"C": (80.0,), "M": (90.0,)}


@pytest.mark.parametrize("value", [pytest.param(100.5, id="above-100"), pytest.param(-0.5, id="negative-not-minus-one")])
def test_appending_an_out_of_range_value_is_rejected(value):
    with pytest.raises(ValueError, match="'w'.*'C'"):
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
        pytest.param(WorkerMetricStats("w", 1, {"C": (10.0,), "M": (-1.0,)}, {"C": (100.0,), "M": (100.0,)}), True, id="any-metric"),
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
        pytest.param({}, [WorkerLoad("app-worker-0"), WorkerLoad("app-worker-1")], {}, id="no-metrics-balanced-by-throughput"),
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
    stored = {"app-worker-0": cpu_worker([1, -1], round_=10), "app-worker-1": cpu_worker([1], round_=1, worker_id="app-worker-1")}
    loads, notes = active_workers(SLOTS, stored, current_round=10)
    assert [load.worker_id for load in loads] == ["app-worker-1"] and set(notes) == set(SLOTS)
    assert all(load.is_default_metric_worker for load in loads)


# --- Publishing --------------------------------------------------------------------------------


def test_a_slot_publishes_its_average_onto_its_history():
    store = InMemoryWorkerMetricsStore()
    publish_worker_metrics(store, "app-worker-0", 30.0, now=100, round=1)
    published = publish_worker_metrics(store, "app-worker-0", -1.0, now=200, round=2)
    assert store.get("app-worker-0") == published == cpu_worker([30, -1], round_=2, lut=200)
