"""
### kinesis_lease_pipeline

One round of a KCL-compatible batch consumer of Kinesis per run: plan the run, ensure the lease
tables, take the application's leader lock, sync shards to leases (with the hash-range auditor and
cleanup) and look for new records over the same scan of the lease table, skip the rest when there
are none, assign leases to the slots `<app>-worker-0..W-1`, consume with Spark (exactly once into
the sink), keep the round's figures (`finalize_round`, or `record_failed_round` when the consume
step failed: a failed round is in the history too), and release the lock whatever happened
(`release_leadership` is the teardown of `take_leadership`).

A run marked failed or successful by hand, or killed, may leave the lock behind: the next run takes
it over once it has been seen unchanged for the lock's lease duration (2 minutes by default), within
its `take_leadership` retries. Clearing a task of a finished run re-takes the lock first.

Trigger with `mode = backfill`, `start` and `end` to replay [start, end) of the streams into a
separate lease namespace and output (`<output_uri>-backfill/<window>` for a Parquet dataset, a
table `<table>_backfill_<window>` beside an Iceberg table); triggering the same window again lands
nothing twice.

Defaults come from `KINESIS_PIPELINE_*` environment variables (read when the file is parsed,
no I/O): `STREAMS` (comma-separated), `APPLICATION`, `WORKERS`, `OUTPUT_URI`, `SCHEDULE`
(cron, or `none` for manual runs only), `INITIAL_POSITION`, `STRATEGY`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Asset, Param, TriggerRule
from kinesis_lease.operators import (
    FAILED_ROUND_KEY,
    EnsureLeaseTablesOperator,
    FinalizeRoundOperator,
    IdleCheckOperator,
    KinesisConsumeOperator,
    LeaseAssignmentOperator,
    ReleaseLeadershipOperator,
    RoundPlanOperator,
    ShardSyncOperator,
    TakeLeadershipOperator,
)

from lease_core.config.settings import LEASE_ASSIGNMENT_STRATEGIES

DAG_ID = "kinesis_lease_pipeline"
# Not under KINESIS_LEASE_: that prefix belongs to the consumer's settings, and every name under it
# must be a setting (lease_core.config.settings refuses unknown ones).
ENV_PREFIX = "KINESIS_PIPELINE_"
# The dataset the consume step lands records in; its events carry the round's figures.
OUTPUT = Asset(name="kinesis_lease_pipeline_output", uri="kinesis-lease://kinesis_lease_pipeline/output")


def _default(name: str, fallback: str) -> str:
    return os.environ.get(ENV_PREFIX + name, fallback)


def _schedule() -> str | None:
    schedule = _default("SCHEDULE", "*/5 * * * *")
    return None if schedule.strip().lower() in ("", "none", "null") else schedule


PLAN = "ti.xcom_pull(task_ids='plan_round')"
SETTINGS = "{{ " + PLAN + "['settings'] }}"
STREAMS = "{{ " + PLAN + "['streams'] }}"
# The leader lock's owner: the run, and a token drawn by plan_round, since run ids repeat across
# deployments of this DAG and a lock held under one name is taken for its own by every holder.
LEADER = "{{ dag.dag_id }}/{{ run_id }}/{{ " + PLAN + "['leader_token'] }}"

with DAG(
    dag_id=DAG_ID,
    description="Batch-incremental Kinesis consumer: shard sync, lease assignment and an exactly-once Spark round",
    doc_md=__doc__,
    schedule=_schedule(),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=20), "retry_exponential_backoff": True},
    tags=["kinesis", "kcl", "spark", "exactly-once"],
    render_template_as_native_obj=True,
    params={
        "streams": Param(
            [name.strip() for name in _default("STREAMS", "orders").split(",") if name.strip()],
            type="array",
            items={"type": "string", "minLength": 1},
            minItems=1,
            description="Kinesis streams to consume; more than one selects multi-stream lease keys.",
        ),
        "application_name": Param(
            _default("APPLICATION", "kinesis-lease-app"),
            type="string",
            minLength=1,
            description="The KCL application: lease table name and slot prefix.",
        ),
        "num_workers": Param(
            int(_default("WORKERS", "2")),
            type="integer",
            minimum=1,
            maximum=1000,
            description="Slot tasks of the consume step (the round's parallelism).",
        ),
        "initial_position": Param(
            _default("INITIAL_POSITION", "LATEST"),
            enum=["LATEST", "TRIM_HORIZON", "AT_TIMESTAMP"],
            description="Where leases created by shard sync start.",
        ),
        "at_timestamp": Param(
            None,
            type=["null", "string"],
            format="date-time",
            description="The time AT_TIMESTAMP starts at (ISO 8601 with a zone).",
        ),
        "output_uri": Param(
            _default("OUTPUT_URI", "/tmp/kinesis-lease/output"),
            type="string",
            minLength=1,
            description=(
                "Where the records land: an Iceberg table, iceberg://CATALOG/NAMESPACE.TABLE (the catalog "
                "configured as pyiceberg's are), or a Parquet dataset, a local path or s3://bucket/prefix."
            ),
        ),
        "lease_assignment_strategy": Param(
            _default("STRATEGY", LEASE_ASSIGNMENT_STRATEGIES[0]),
            enum=list(LEASE_ASSIGNMENT_STRATEGIES),
            description="How leases are spread over the slots.",
        ),
        "max_records_per_lease": Param(
            None, type=["null", "integer"], minimum=1, description="Records per lease per round."
        ),
        "max_bytes_per_lease": Param(
            None, type=["null", "integer"], minimum=1, description="Payload bytes per lease per round."
        ),
        "max_seconds_per_lease": Param(
            None, type=["null", "number"], exclusiveMinimum=0, description="Reading time per lease per round."
        ),
        "transform": Param(
            None,
            type=["null", "string"],
            pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$",
            description=(
                "Your batch transform, package.module:function (an Arrow table of the records in, one out), "
                "importable where Spark runs; none: the records as they are."
            ),
        ),
        "mode": Param(
            "live", enum=["live", "backfill"], description="live: the scheduled round; backfill: replay [start, end)."
        ),
        "start": Param(None, type=["null", "string"], format="date-time", description="Backfill window start."),
        "end": Param(None, type=["null", "string"], format="date-time", description="Backfill window end (exclusive)."),
    },
) as dag:
    plan = RoundPlanOperator(task_id="plan_round", round_params="{{ params }}")
    ensure_tables = EnsureLeaseTablesOperator(task_id="ensure_tables", settings=SETTINGS, streams=STREAMS)
    take_leadership = TakeLeadershipOperator(
        task_id="take_leadership", settings=SETTINGS, leader_owner=LEADER, retries=5, retry_delay=timedelta(seconds=30)
    )
    sync_shards = ShardSyncOperator(
        task_id="sync_shards",
        settings=SETTINGS,
        leader_owner=LEADER,
        streams=STREAMS,
        output_uri="{{ " + PLAN + "['output_uri'] }}",
    )
    assign_leases = LeaseAssignmentOperator(
        task_id="assign_leases", settings=SETTINGS, leader_owner=LEADER, num_workers="{{ " + PLAN + "['num_workers'] }}"
    )
    check_idle = IdleCheckOperator(
        task_id="check_idle", pending_work="{{ ti.xcom_pull(task_ids='sync_shards')['pending_work'] }}"
    )
    consume = KinesisConsumeOperator(
        task_id="consume",
        conn_id="spark_default",
        name="kinesis-consume",
        settings=SETTINGS,
        streams=STREAMS,
        num_workers="{{ " + PLAN + "['num_workers'] }}",
        output_uri="{{ " + PLAN + "['output_uri'] }}",
        limits="{{ " + PLAN + "['limits'] }}",
        stop_at_arrival="{{ " + PLAN + "['stop_at_arrival'] }}",
        transform="{{ " + PLAN + "['transform'] }}",
        leader_owner=LEADER,
        round_number="{{ ti.xcom_pull(task_ids='assign_leases')['round_number'] }}",
        outlets=[OUTPUT],
    )
    finalize_round = FinalizeRoundOperator(
        task_id="finalize_round",
        settings=SETTINGS,
        leader_owner=LEADER,
        round_report="{{ ti.xcom_pull(task_ids='consume') }}",
        assignment="{{ ti.xcom_pull(task_ids='assign_leases') }}",
        shard_sync="{{ ti.xcom_pull(task_ids='sync_shards') }}",
        trigger_rule=TriggerRule.NONE_FAILED,
    )
    # A round whose consume step failed (a lease failed, the job died) is kept in the history as well,
    # with what stopped it; the run stays failed (finalize_round, a leaf, is upstream-failed).
    record_failed_round = FinalizeRoundOperator(
        task_id="record_failed_round",
        settings=SETTINGS,
        leader_owner=LEADER,
        after_failure=True,
        failed_round="{{ ti.xcom_pull(task_ids='consume', key='" + FAILED_ROUND_KEY + "') }}",
        assignment="{{ ti.xcom_pull(task_ids='assign_leases') }}",
        shard_sync="{{ ti.xcom_pull(task_ids='sync_shards') }}",
        trigger_rule=TriggerRule.ONE_FAILED,
    )
    # The teardown of take_leadership: it runs whatever happened in between, and as a teardown it
    # does not decide the run's state, so a failed finalize_round (the data-loss alert) fails the run.
    release_leadership = ReleaseLeadershipOperator(
        task_id="release_leadership", settings=SETTINGS, leader_owner=LEADER
    ).as_teardown(setups=take_leadership)

    # An idle round (the sync found nothing to read) skips the assignment with the consume step: its
    # decisions are only used by a consume, and the next round that consumes assigns first.
    plan >> ensure_tables >> take_leadership >> sync_shards >> check_idle >> assign_leases >> consume
    consume >> [finalize_round, record_failed_round]
    # Every step under the lock precedes its release, so clearing one step (which re-runs the setup
    # and the teardown with it) releases the lock only once that step is done.
    [sync_shards, assign_leases, check_idle, consume, finalize_round, record_failed_round] >> release_leadership
