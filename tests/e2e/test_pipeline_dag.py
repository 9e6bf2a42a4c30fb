"""The DAG `kinesis_lease_pipeline` with the real operators, the real Spark job (spark-submit through
the Apache Spark provider) and the emulators, run in-process with `dag.test()`."""

from __future__ import annotations

import copy
import os
import socket
from datetime import UTC, timedelta

import pytest

from devtools.airflow_env import DAG_FILE, REPOSITORY, load_dag_module
from devtools.kinesis_streams import create_stream, kinesis_client, merge_shards, split_shard
from lease_core.leader.round_history import RoundHistory
from lease_core.model.sequence import SHARD_END
from tests.support.airflow_dag import consumed_cleanly, run_round
from tests.support.pipeline import ConsumerPipeline, duplicates

# The fixtures `dag` and `airflow_run_environment` (Spark `local[2,4]`) are in tests/e2e/conftest.py.


# --- integrity ---------------------------------------------------------------------------------


def test_the_dag_folder_imports_without_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAG_FILE.parent))
    assert bag.import_errors == {}
    assert "kinesis_lease_pipeline" in bag.dag_ids


def test_parsing_the_dag_makes_no_network_call(monkeypatch):
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the DAG file opened a connection while being parsed")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    load_dag_module("kinesis_lease_pipeline_offline")


def test_the_schedule_runs_one_round_at_a_time_without_catchup_and_with_retries(dag):
    assert (dag.max_active_runs, dag.catchup) == (1, False)
    assert dag.timetable.expression == "*/5 * * * *"
    assert {"kinesis", "kcl", "spark"} <= set(dag.tags)
    assert all(task.retries >= 2 for task in dag.tasks)


def test_leadership_is_released_whatever_happened_and_a_failed_round_fails_the_run(dag):
    take, _finalize, release = (
        dag.get_task(name) for name in ("take_leadership", "finalize_round", "release_leadership")
    )
    assert take.is_setup and release.is_teardown and not release.on_failure_fail_dagrun
    assert release.trigger_rule == "all_done_setup_success"
    assert {task.task_id for task in dag.leaves} == {"release_leadership"}


def test_a_round_whose_consume_step_failed_is_recorded_and_its_run_still_fails(dag):
    record, finalize = dag.get_task("record_failed_round"), dag.get_task("finalize_round")
    assert record.upstream_task_ids == {"consume"} and record.trigger_rule == "all_done" and record.after_failure
    assert finalize.trigger_rule == "none_failed", "an upstream-failed finalize_round, a leaf, fails the run"


def test_clearing_one_step_releases_the_lock_only_once_that_step_is_done(dag):
    """Clearing a step re-runs its setup and teardown with it; the teardown waits for every step under the lock."""
    release = dag.get_task("release_leadership")
    under_the_lock = {"sync_shards", "assign_leases", "check_idle", "consume", "finalize_round", "record_failed_round"}
    assert release.upstream_task_ids == {"take_leadership", *under_the_lock}
    for step in under_the_lock:
        cleared = dag.partial_subset(task_ids=[step], include_downstream=False, include_upstream=False)
        assert {"take_leadership", step, "release_leadership"} <= set(cleared.task_dict)


def test_each_execution_of_a_run_owns_the_lock_under_its_own_name(dag):
    """Run ids repeat (two deployments name their scheduled runs alike): plan_round draws a token per execution."""
    from kinesis_lease.operators import RoundPlanOperator

    assert "leader_token" in dag.get_task("take_leadership").leader_owner
    assert {task.leader_owner for task in dag.tasks if hasattr(task, "leader_owner")} == {
        dag.get_task("take_leadership").leader_owner
    }
    plan = RoundPlanOperator(task_id="plan", round_params=dag.params.dump())
    assert len({plan.execute({})["leader_token"] for _ in range(3)}) == 3


PARAM_CASES = [
    pytest.param({"num_workers": 0}, id="no-workers"),
    pytest.param({"streams": []}, id="no-streams"),
    pytest.param({"initial_position": "EARLIEST"}, id="unknown-position"),
    pytest.param({"lease_assignment_strategy": "random"}, id="unknown-strategy"),
    pytest.param({"mode": "replay"}, id="unknown-mode"),
    pytest.param({"max_records_per_lease": 0}, id="zero-limit"),
]


def test_the_default_params_are_valid(dag):
    dag.params.validate()


@pytest.mark.parametrize("change", PARAM_CASES)
def test_the_trigger_form_refuses_bad_values(dag, change):
    from airflow.sdk.exceptions import ParamValidationError

    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError):
        params.update(change)  # a ParamsDict validates what it is given, as the trigger form does
        params.validate()


TEMPLATED = {
    "plan_round": {"round_params"},
    "ensure_tables": {"settings", "streams"},
    "take_leadership": {"settings", "leader_owner"},
    "sync_shards": {"settings", "leader_owner", "streams", "output_uri"},
    "assign_leases": {"settings", "leader_owner", "num_workers"},
    "check_idle": {"pending_work"},
    "consume": {
        "settings",
        "streams",
        "num_workers",
        "output_uri",
        "limits",
        "stop_at_arrival",
        "leader_owner",
        "round_number",
        "report_uri",
        "application_args",
        "conf",
    },
    "finalize_round": {"settings", "leader_owner", "round_report", "assignment", "shard_sync"},
    "release_leadership": {"settings", "leader_owner"},
}


@pytest.mark.parametrize("task_id", sorted(TEMPLATED))
def test_every_operator_argument_that_comes_from_the_run_is_a_template_field(dag, task_id):
    assert TEMPLATED[task_id] <= set(dag.get_task(task_id).template_fields)


# --- end to end --------------------------------------------------------------------------------


def test_a_split_and_a_merge_between_scheduled_rounds_are_read_with_their_children_in_the_next_round(
    dag, airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, unique_name, 3)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 2,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
    }
    ledger.produce(300, hot_keys=2)
    first = run_round(dag, conf)
    assert consumed_cleanly(first), first
    shards = sorted(ledger.leases())
    children = set(split_shard(kinesis, unique_name, shards[0])) | {
        merge_shards(kinesis, unique_name, shards[1], shards[2])
    }
    ledger.produce(200)
    second = run_round(dag, conf)
    assert consumed_cleanly(second), second
    # The parents were read to their ends and every child in the same round: nothing is left over.
    landed = ledger.landed()
    assert duplicates(landed) == []
    assert sorted(landed, key=lambda r: r.data) == sorted(ledger.produced, key=lambda r: r.data)
    _, rows = RoundHistory(ledger.state).lease_rows()
    assert sorted(row["lease_key"] for row in rows if row["lease_key"] in children) == sorted(children)
    assert {key: lease.checkpoint for key, lease in ledger.leases().items() if key in shards} == dict.fromkeys(
        shards, SHARD_END
    )
    assert ledger.state.get("Leader") is None
    # Each kept round says how far its busiest slot was from the balance bound (the monitoring page's column).
    assert [entry["busiest_over_bound"] >= 1.0 for entry in RoundHistory(ledger.state).rounds()] == [True, True]


def test_an_idle_round_skips_the_assignment_and_the_consume_step_and_still_releases_leadership(
    dag, airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
    }
    states = run_round(dag, conf)
    assert (states["check_idle"], states["assign_leases"], states["consume"]) == ("skipped", "skipped", "skipped")
    assert (states["finalize_round"], states["release_leadership"]) == ("success", "success")


def test_at_latest_a_quiet_shard_skips_what_came_before_and_lands_what_comes_between_rounds(
    dag, airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 2)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "initial_position": "LATEST",  # the DAG's default; the module's DAG object keeps other tests' conf
        "output_uri": str(tmp_path / "lake"),
    }
    before = ledger.produce(20)
    first = run_round(dag, conf)
    # The new leases are pinned at their creation: with nothing after the pin, the round is idle.
    assert (first["check_idle"], first["consume"], first["finalize_round"]) == ("skipped", "skipped", "success")
    between = ledger.produce(30)
    second = run_round(dag, conf)
    assert consumed_cleanly(second), second
    landed = ledger.landed()
    assert duplicates(landed) == []
    assert sorted(record.data for record in landed) == sorted(record.data for record in between)
    assert len(before) == 20 and not {record.data for record in before} & {record.data for record in landed}


def test_a_run_whose_plan_fails_fails_without_the_release_failing_or_retrying(
    dag, airflow_run_environment, unique_name
):
    """No plan, no lock taken by the run: the teardown of a setup that never succeeded does not run
    (Airflow marks it upstream_failed), so it neither renders the missing plan nor retries."""
    conf = {"streams": [unique_name], "application_name": unique_name, "output_uri": "hdfs://namenode/lake"}
    run = dag.test(run_conf=conf)
    instances = {ti.task_id: ti for ti in run.get_task_instances()}
    assert (run.state, instances["plan_round"].state) == ("failed", "failed")
    release = instances["release_leadership"]
    assert release.state in ("success", "skipped", "upstream_failed")
    assert release.try_number <= 1


def test_a_backfill_replays_its_window_into_its_own_namespace_and_is_idempotent(
    dag, airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path
):
    import time
    from datetime import datetime, timedelta

    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    live = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    inside = live.produce(40)
    time.sleep(2.2)
    end = datetime.now(UTC).replace(microsecond=0)
    time.sleep(1.2)
    live.produce(15)  # after the window
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "output_uri": str(tmp_path / "lake"),
        "mode": "backfill",
        "start": start.isoformat(),
        "end": end.isoformat(),
    }
    for _ in range(2):
        states = run_round(dag, conf)
        assert states["finalize_round"] == "success", states
    window = f"{start:%Y%m%dT%H%M%SZ}-{end:%Y%m%dT%H%M%SZ}"
    backfill = ConsumerPipeline(
        f"{unique_name}-backfill-{window}",
        (unique_name,),
        kinesis_endpoint,
        moto_endpoint,
        str(tmp_path / "lake") + f"-backfill/{window}",
    )
    landed = backfill.landed()
    assert duplicates(landed) == []
    assert sorted(record.data for record in landed) == sorted(record.data for record in inside)
    assert live.leases() == {}  # the live application's lease table was never written
    assert not (tmp_path / "lake").exists() or not any((tmp_path / "lake").rglob("*.parquet"))


def test_a_lease_whose_processing_fails_is_in_the_history_with_its_error_and_the_run_fails_without_retrying(
    dag, airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, monkeypatch
):
    """A transform with a deterministic bug: the same round again would fail the same way."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])))
    kinesis = kinesis_client(kinesis_endpoint)
    create_stream(kinesis, unique_name, 2)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    ledger.produce(40)
    poisoned = kinesis.put_record(StreamName=unique_name, Data=b"poison", PartitionKey="poison")["ShardId"]
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
        "transform": "tests.support.spark_transforms:refuse_poison",
        "mode": "live",  # in one process, `dag.test` runs keep an earlier run's backfill mode otherwise
    }

    states = run_round(dag, conf)

    assert (states["consume"], states["record_failed_round"], states["finalize_round"]) == (
        "failed",
        "success",
        "upstream_failed",
    )
    assert states["release_leadership"] == "success"
    healthy = [record for record in ledger.produced if record.shard_id != poisoned]
    assert sorted(ledger.landed(), key=lambda r: r.data) == sorted(healthy, key=lambda r: r.data)
    entry = RoundHistory(ledger.state).rounds()[-1]
    assert entry["failed_leases"] == 1 and "a retry cannot help" in entry["error"]
    assert entry["failures"] == [
        f"{poisoned}: transform 'tests.support.spark_transforms:refuse_poison': raised ValueError: "
        "cannot decode the payload b'poison'"
    ]
    _, rows = RoundHistory(ledger.state).lease_rows()
    assert [row["outcome"] for row in rows if row["lease_key"] == poisoned] == ["failed"]


def test_a_round_its_execution_timeout_stops_is_kept_in_the_history_with_the_timeout(
    dag, airflow_run_environment, unique_name, kinesis_endpoint, moto_endpoint, tmp_path, monkeypatch
):
    """The consume step runs past its `execution_timeout` (a transform stuck on a call): Airflow stops it
    with AirflowTaskTimeout, which is not an Exception; the round is in the history all the same."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])))
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    ledger.produce(5)
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
        "transform": "tests.support.spark_transforms:stall",
        "mode": "live",
    }
    consume = dag.get_task("consume")
    timeout, retries = consume.execution_timeout, consume.retries
    consume.execution_timeout, consume.retries = timedelta(seconds=20), 0
    try:
        states = run_round(dag, conf)
    finally:
        consume.execution_timeout, consume.retries = timeout, retries

    assert (states["consume"], states["record_failed_round"], states["release_leadership"]) == (
        "failed",
        "success",
        "success",
    ), states
    entry = RoundHistory(ledger.state).rounds()[-1]
    assert "AirflowTaskTimeout" in (entry["error"] or ""), entry
