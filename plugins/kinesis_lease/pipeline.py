"""A whole pipeline in one call: the round's tasks, as a DAG of their own or a TaskGroup in yours.

```python
from kinesis_lease.pipeline import kinesis_pipeline

orders = kinesis_pipeline(
    "orders_to_lake",
    streams=["orders"],
    application_name="orders-lake",
    output_uri="iceberg://glue/lake.orders",
    schedule="*/10 * * * *",
    num_workers=8,
    decode="my_company.decoding:order",
    bad_records="dead_letter",
    settings={"max_leases_for_worker": 64},
)
```

Each pipeline is one KCL application: its own lease tables, leader lock, round history and output,
so several pipelines run side by side in one deployment. Its consumer `settings` (KCL's names, as in
docs/configuration.md) are checked when the DAG file is parsed and win over the deployment-wide
`KINESIS_LEASE_*` variables; its connections (`aws_conn_id`, `spark_conn_id`) are its own. A DAG
made by `kinesis_pipeline` has the trigger form (params) of the shipped DAG: the pipeline's values are
the defaults, and a manual run may change them or run a backfill. `kinesis_round` puts the same
tasks in a TaskGroup of a DAG of yours, with the pipeline's values fixed (no params needed).

Nothing here does I/O: building a pipeline is safe at parse time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Asset, Param, TaskGroup, TriggerRule

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
from kinesis_lease.plugin import PIPELINE_TAG
from kinesis_lease.round_plan import plan_round
from lease_core.config.settings import LEASE_ASSIGNMENT_STRATEGIES, ConsumerConfig
from lease_core.errors import ConfigurationError
from spark_jobs.record_processing import RecordProcessing

INITIAL_POSITIONS = ("LATEST", "TRIM_HORIZON", "AT_TIMESTAMP")
DEFAULT_SCHEDULE = "*/5 * * * *"


# A user's function as the trigger form takes it: `package.module:function`.
@dataclass(frozen=True)
class Pipeline:
    """What a pipeline consumes, how, and where it lands: the round's values, checked on creation."""

    streams: Sequence[str]
    application_name: str
    output_uri: str
    num_workers: int = 2
    initial_position: str = "LATEST"
    at_timestamp: str | None = None
    lease_assignment_strategy: str = LEASE_ASSIGNMENT_STRATEGIES[0]
    # How records become rows (transform, decode, bad_records, ...): given to `kinesis_pipeline` and
    # `kinesis_round` as keywords of their own (`Pipeline.of`).
    processing: RecordProcessing = field(default_factory=RecordProcessing)
    settings: Mapping[str, Any] = field(default_factory=dict)
    max_records_per_lease: int | None = None
    max_bytes_per_lease: int | None = None
    max_seconds_per_lease: float | None = None
    aws_conn_id: str | None = "aws_default"
    spark_conn_id: str = "spark_default"
    # Files spark-submit ships with the job (`--py-files`: .py, .zip, .egg), put on the driver's and
    # the executors' path: where the decoder or transform module comes from when Spark's image lacks it.
    py_files: str | None = None

    def __post_init__(self) -> None:
        reserved = sorted(set(self.settings) & {"application_name", "lease_assignment_strategy"})
        if reserved:
            raise ConfigurationError(reserved[0], "is an argument of the pipeline, not one of its settings")
        ConsumerConfig(**dict(self.settings))  # ConfigurationError naming a bad key
        plan_round(self.round_params())  # ConfigurationError naming a bad param

    @classmethod
    def of(cls, **values: Any) -> Pipeline:
        """The pipeline from its keywords, the record-processing options (`RecordProcessing`) among them;
        `ConfigurationError` naming the first option that is wrong."""
        options = {name: values.pop(name) for name in RecordProcessing.option_names() if name in values}
        return cls(**values, processing=RecordProcessing.from_options(options))

    def round_params(self) -> dict[str, Any]:
        """The round's params (`kinesis_lease.round_plan`), as a live run of this pipeline has them."""
        return {
            "streams": list(self.streams),
            "application_name": self.application_name,
            "num_workers": self.num_workers,
            "initial_position": self.initial_position,
            "at_timestamp": self.at_timestamp,
            "output_uri": self.output_uri,
            "lease_assignment_strategy": self.lease_assignment_strategy,
            "max_records_per_lease": self.max_records_per_lease,
            "max_bytes_per_lease": self.max_bytes_per_lease,
            "max_seconds_per_lease": self.max_seconds_per_lease,
            **self.processing.to_dict(),
            "mode": "live",
            "start": None,
            "end": None,
        }

    def trigger_form(self) -> dict[str, Param]:
        """The DAG's params: the pipeline's values as defaults, each described for the trigger form."""
        return {
            "streams": Param(
                list(self.streams),
                type="array",
                items={"type": "string", "minLength": 1},
                minItems=1,
                description="Kinesis streams to consume; more than one selects multi-stream lease keys.",
            ),
            "application_name": Param(
                self.application_name,
                type="string",
                minLength=1,
                description="The KCL application: lease table name and slot prefix.",
            ),
            "num_workers": Param(
                self.num_workers,
                type="integer",
                minimum=1,
                maximum=1000,
                description="Slot tasks of the consume step (the round's parallelism).",
            ),
            "initial_position": Param(
                self.initial_position,
                enum=list(INITIAL_POSITIONS),
                description="Where leases created by shard sync start.",
            ),
            "at_timestamp": Param(
                self.at_timestamp,
                type=["null", "string"],
                format="date-time",
                description="The time AT_TIMESTAMP starts at (ISO 8601 with a zone).",
            ),
            "output_uri": Param(
                self.output_uri,
                type="string",
                minLength=1,
                description=(
                    "Where the records land: an Iceberg table, iceberg://CATALOG/NAMESPACE.TABLE (the catalog "
                    "configured as pyiceberg's are), a Delta table in a local folder, delta:PATH, or a Parquet "
                    "dataset, a local path or s3://bucket/prefix."
                ),
            ),
            "lease_assignment_strategy": Param(
                self.lease_assignment_strategy,
                enum=list(LEASE_ASSIGNMENT_STRATEGIES),
                description="How leases are spread over the slots.",
            ),
            "max_records_per_lease": Param(
                self.max_records_per_lease,
                type=["null", "integer"],
                minimum=1,
                description="Records per lease per round.",
            ),
            "max_bytes_per_lease": Param(
                self.max_bytes_per_lease,
                type=["null", "integer"],
                minimum=1,
                description="Payload bytes per lease per round.",
            ),
            "max_seconds_per_lease": Param(
                self.max_seconds_per_lease,
                type=["null", "number"],
                exclusiveMinimum=0,
                description="Reading time per lease per round.",
            ),
            **{name: Param(**form) for name, form in self.processing.trigger_params().items()},
            "mode": Param(
                "live",
                enum=["live", "backfill"],
                description="live: the scheduled round; backfill: replay [start, end).",
            ),
            "start": Param(None, type=["null", "string"], format="date-time", description="Backfill window start."),
            "end": Param(
                None, type=["null", "string"], format="date-time", description="Backfill window end (exclusive)."
            ),
        }


def kinesis_pipeline(
    dag_id: str,
    *,
    streams: Sequence[str],
    application_name: str,
    output_uri: str,
    schedule: str | None = DEFAULT_SCHEDULE,
    start_date: datetime = datetime(2026, 1, 1, tzinfo=UTC),
    retries: int = 2,
    tags: Sequence[str] = (),
    doc_md: str | None = None,
    output_asset: Asset | None = None,
    **pipeline: Any,
) -> DAG:
    """A DAG that runs one round of the pipeline per run, one run at a time, with the trigger form for
    manual runs and backfills. `pipeline`: the other fields of `Pipeline` (num_workers, transform,
    settings, initial_position, limits, connections). `output_asset`: the asset the consume step
    updates (default: one named after the DAG), whose events carry the round's figures."""
    values = Pipeline.of(streams=list(streams), application_name=application_name, output_uri=output_uri, **pipeline)
    with DAG(
        dag_id=dag_id,
        description=f"Kinesis {', '.join(values.streams)} to {values.output_uri}, exactly once, in rounds",
        doc_md=doc_md,
        schedule=schedule,
        start_date=start_date,
        catchup=False,
        max_active_runs=1,
        default_args={"retries": retries, "retry_delay": timedelta(seconds=20), "retry_exponential_backoff": True},
        tags=sorted({PIPELINE_TAG, "kinesis", "kcl", "spark", "exactly-once", *tags}),
        render_template_as_native_obj=True,
        params=values.trigger_form(),
    ) as dag:
        asset = output_asset or Asset(name=f"{dag_id}_output", uri=f"kinesis-lease://{dag_id}/output")
        _round_tasks(values, "{{ params }}", asset, prefix="")
    return dag


def kinesis_round(group_id: str = "kinesis_round", *, output_asset: Asset | None = None, **pipeline: Any) -> TaskGroup:
    """The pipeline's round as a TaskGroup of the DAG being defined (use inside `with DAG(...)`), with
    the pipeline's values fixed. Give the DAG `max_active_runs=1` and `render_template_as_native_obj=True`
    (the round's steps pass lists and mappings through templates); the leader lock keeps two rounds of
    one application apart in any case."""
    values = Pipeline.of(**pipeline)
    with TaskGroup(group_id=group_id) as group:
        asset = output_asset or Asset(name=f"{group_id}_output", uri=f"kinesis-lease://{group_id}/output")
        _round_tasks(values, values.round_params(), asset, prefix=f"{group.group_id}.")
    return group


def _round_tasks(values: Pipeline, round_params: Any, output: Asset, *, prefix: str) -> None:
    """The round's steps and their order (the shipped DAG's docstring tells what each does).
    `prefix`: the task ids' prefix inside a TaskGroup, which the steps' XCom pulls must name."""

    def pull(task: str, key: str | None = None) -> str:
        keyed = f", key='{key}'" if key else ""
        return f"ti.xcom_pull(task_ids='{prefix}{task}'{keyed})"

    plan = pull("plan_round")
    settings = "{{ " + plan + "['settings'] }}"
    streams = "{{ " + plan + "['streams'] }}"
    # The leader lock's owner: the run, and a token drawn by plan_round, since run ids repeat across
    # deployments of a DAG and a lock held under one name is taken for its own by every holder.
    leader = "{{ dag.dag_id }}/{{ run_id }}/{{ " + plan + "['leader_token'] }}"
    aws: dict[str, Any] = {"aws_conn_id": values.aws_conn_id}
    steps: dict[str, Any] = {"settings": settings, "leader_owner": leader, **aws}

    plan_round_task = RoundPlanOperator(
        task_id="plan_round", round_params=round_params, pipeline_settings=dict(values.settings)
    )
    ensure_tables = EnsureLeaseTablesOperator(task_id="ensure_tables", settings=settings, streams=streams, **aws)
    take_leadership = TakeLeadershipOperator(
        task_id="take_leadership", retries=5, retry_delay=timedelta(seconds=30), **steps
    )
    sync_shards = ShardSyncOperator(
        task_id="sync_shards", streams=streams, output_uri="{{ " + plan + "['output_uri'] }}", **steps
    )
    assign_leases = LeaseAssignmentOperator(
        task_id="assign_leases", num_workers="{{ " + plan + "['num_workers'] }}", **steps
    )
    check_idle = IdleCheckOperator(
        task_id="check_idle",
        pending_work="{{ " + pull("sync_shards") + "['pending_work'] }}",
        processing="{{ " + plan + "['processing'] }}",
        py_files=values.py_files,
        spark_conn_id=values.spark_conn_id,
    )
    consume = KinesisConsumeOperator(
        task_id="consume",
        conn_id=values.spark_conn_id,
        name="kinesis-consume",
        streams=streams,
        num_workers="{{ " + plan + "['num_workers'] }}",
        output_uri="{{ " + plan + "['output_uri'] }}",
        limits="{{ " + plan + "['limits'] }}",
        stop_at_arrival="{{ " + plan + "['stop_at_arrival'] }}",
        processing="{{ " + plan + "['processing'] }}",
        py_files=values.py_files,
        round_number="{{ " + pull("assign_leases") + "['round_number'] }}",
        outlets=[output],
        **steps,
    )
    finalize_round = FinalizeRoundOperator(
        task_id="finalize_round",
        round_report="{{ " + pull("consume") + " }}",
        assignment="{{ " + pull("assign_leases") + " }}",
        shard_sync="{{ " + pull("sync_shards") + " }}",
        trigger_rule=TriggerRule.NONE_FAILED,
        **steps,
    )
    # A round whose consume step failed (a lease failed, the job died) is kept in the history as well,
    # with what stopped it; the run stays failed (finalize_round, a leaf, is upstream-failed). It runs
    # whatever happened and does nothing unless the consume step failed: a skipped step would skip
    # the tasks a user puts after the round.
    record_failed_round = FinalizeRoundOperator(
        task_id="record_failed_round",
        after_failure=True,
        failed_round="{{ " + pull("consume", FAILED_ROUND_KEY) + " }}",
        assignment="{{ " + pull("assign_leases") + " }}",
        shard_sync="{{ " + pull("sync_shards") + " }}",
        trigger_rule=TriggerRule.ALL_DONE,
        **steps,
    )
    # The teardown of take_leadership: it runs whatever happened in between, and as a teardown it
    # does not decide the run's state, so a failed finalize_round (the data-loss alert) fails the run.
    release_leadership = ReleaseLeadershipOperator(task_id="release_leadership", **steps).as_teardown(
        setups=take_leadership
    )

    # An idle round (the sync found nothing to read) skips the assignment with the consume step: its
    # decisions are only used by a consume, and the next round that consumes assigns first.
    plan_round_task >> ensure_tables >> take_leadership >> sync_shards >> check_idle >> assign_leases >> consume
    consume >> [finalize_round, record_failed_round]
    # Every step under the lock precedes its release, so clearing one step (which re-runs the setup
    # and the teardown with it) releases the lock only once that step is done.
    under_the_lock = [sync_shards, assign_leases, check_idle, consume, finalize_round, record_failed_round]
    under_the_lock >> release_leadership
