"""The round's operators: each is thin over one lease_core step (docs/architecture.md, "Components").

Every operator only stores its arguments in `__init__`; `execute` builds clients from the Airflow AWS
connection (`aws_conn_id`, `aws_default` by default), calls lease_core inside `airflow_outcomes()`
(the one place errors become Airflow outcomes), and returns a small JSON-serialisable summary for
XCom. `settings` is a mapping of consumer configuration keys (application_name included); steps
that run under the round's leadership take `leader_owner`, unique to the DAG run's execution
(`<dag>/<run id>/<leader token>`), resume the lock
under that name, keep it alive with a background heartbeat while they work, and write only through
stores that check it before every write (`lease_core.leader.leadership`): a step that loses the lock stops
before its next write. Every step is safe to retry: a new try resumes the same lock, keeps the same
round number and replaces the round's history entry.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
    AirflowTaskTerminated,
    AirflowTaskTimeout,
)

from kinesis_lease.airflow_metrics import emit_round_metrics
from kinesis_lease.aws_connection import AwsAccess, aws_access
from kinesis_lease.errors import airflow_outcomes
from kinesis_lease.round_plan import plan_round, stream_names
from lease_core.errors import CorruptLeasesSkippedError, LeaseCoreError, RecordsLostError
from lease_core.leader.assignment_round import AssignmentCoordinator, slot_ids
from lease_core.leader.leader_lock import LeaderLock
from lease_core.leader.leadership import Leadership, hold
from lease_core.leader.round_history import RoundHistory
from lease_core.lifecycle.lease_lifecycle import forget_reported_losses
from lease_core.metrics.cloudwatch import CloudWatchPublisher, MetricsPublication
from lease_core.metrics.freshness import Freshness, fresh_lease_rows
from lease_core.metrics.round_metrics import (
    MetricsLevel,
    MetricValue,
    RoundObservation,
    kcl_filtered,
    round_metric_values,
)
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.retrieval.pending_work import PendingWork, find_pending_work
from lease_core.retrieval.shard_source import KinesisShardSource
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.lease_store import LeaseStore
from lease_core.sync.audit import ShardSyncAuditor
from lease_core.sync.step import is_multi_stream, probe_load, sync_streams
from sinks import open_round_sink, open_sink
from sinks.batch_sink import BatchSink
from spark_jobs.errors import ReportedError
from spark_jobs.job_errors import read_job_error
from spark_jobs.record_processing import RecordProcessing
from spark_jobs.round_publication import stream_incarnations
from spark_jobs.round_report import (
    Outcome,
    RetentionLoss,
    RoundFigures,
    abridged,
    history_figures,
    missing_batch_loss,
    read_report,
    report_uri_for,
    round_observation,
)

log = logging.getLogger(__name__)

# In the sync step's `pending_work`: when its idle check began (epoch milliseconds).
CHECKED_AT = "checked_at_millis"

# The consume step's XCom when it fails: {"error": text, "figures": the report's figures or None}.
FAILED_ROUND_KEY = "failed_round"

# The job file of the installed `spark_jobs` package (imported above), installed beside this one: in a
# checkout, an image or a deployment, the job and the code its executors import match.
_CONSUME_JOB_SPEC = importlib.util.find_spec("spark_jobs.consume_job")
assert _CONSUME_JOB_SPEC is not None and _CONSUME_JOB_SPEC.origin is not None, "spark_jobs is not installed"
CONSUME_JOB = str(Path(_CONSUME_JOB_SPEC.origin).resolve())


class _LeaseStep(BaseOperator):
    """Common arguments and clients of the round's steps."""

    template_fields: Sequence[str] = ("settings",)

    def __init__(self, *, settings: Any, aws_conn_id: str | None = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Any) -> Any:
        with airflow_outcomes():
            access = aws_access(self.aws_conn_id, dict(self.settings))
            # Plain JSON for XCom: tuples would be stored with Airflow's class tags.
            return json.loads(json.dumps(self.run(access, context)))

    # Each step defines `run(access, context)`: its one lease_core call, returning the XCom summary.
    run: Callable[[AwsAccess, Any], Any]


class RoundPlanOperator(BaseOperator):
    """Decides the run's plan (live round or backfill) from its params; no I/O.

    It also draws the run's `leader_token`, which makes the leader lock's owner name unique to this
    execution of the run: run ids repeat (two deployments of the DAG name their scheduled runs
    alike), and two holders under one name would each take the other's lock for their own.
    """

    template_fields: Sequence[str] = ("round_params",)

    def __init__(self, *, round_params: Any, pipeline_settings: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """`pipeline_settings`: the pipeline's consumer settings, under what the params set."""
        super().__init__(**kwargs)
        self.round_params = round_params
        self.pipeline_settings = dict(pipeline_settings or {})

    def execute(self, context: Any) -> dict[str, Any]:
        with airflow_outcomes():
            plan = plan_round(dict(self.round_params), self.pipeline_settings)
            return {**plan.to_dict(), "leader_token": uuid.uuid4().hex[:16]}


class EnsureLeaseTablesOperator(_LeaseStep):
    """Creates the lease, worker-metrics and coordinator-state tables if they are missing, once the
    round's `streams` are known to exist. An existing table of another schema is refused, and then
    nothing is created or changed (`ForeignTableError`, not retried). Under `retrieval = fan_out` it
    then makes sure the application's enhanced fan-out consumer of each stream is registered and
    ACTIVE (`lease_core.retrieval.fanout.stream_consumers`), before any lease moves: a consumer of the
    name that is not the application's, a stream at its consumer limit or a consumer stuck in
    CREATING fails the round here, naming it."""

    template_fields: Sequence[str] = ("settings", "streams")

    def __init__(self, *, streams: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.streams = streams

    def run(self, access: AwsAccess, context: Any) -> dict[str, Any]:
        # No tables for a round whose streams do not exist (StreamNotFoundError, not retried).
        for name in stream_names(self.streams):
            access.app.shard_source.describe_stream(name)
        administrator = access.app.tables
        summary: dict[str, Any] = {
            "tables": [
                {"name": r.name, "role": r.role, "created": r.created, "status": r.status}
                for r in administrator.ensure_tables()
            ]
        }
        if access.config.retrieval == "fan_out":
            consumers = access.app.stream_consumers
            summary["stream_consumers"] = [consumers.ensure(name).to_dict() for name in stream_names(self.streams)]
        return summary


class _LeaderStep(_LeaseStep):
    template_fields: Sequence[str] = ("settings", "leader_owner")

    def __init__(self, *, leader_owner: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.leader_owner = leader_owner

    @contextmanager
    def leadership(self, access: AwsAccess) -> Iterator[Leadership]:
        """The round's lock, resumed from an earlier step and heartbeaten while this step works."""
        with hold(access.app.leader_lock(self.leader_owner), self.task_id, acquire=False, release=False) as leadership:
            yield leadership

    def fenced_stores(self, access: AwsAccess, leadership: Leadership) -> tuple[LeaseStore, CoordinatorStateStore]:
        """The lease and coordinator-state stores of a step that holds the lock: every write and
        every retry checks it first."""
        policy = leadership.retry_policy(access.app.retry_policy)
        return (
            leadership.lease_store(access.app.lease_store_with(policy)),
            leadership.state_store(access.app.state_store_with(policy)),
        )


class TakeLeadershipOperator(_LeaderStep):
    """Takes the application's leader lock for this run; retryable while another round holds it."""

    def run(self, access: AwsAccess, context: Any) -> dict[str, Any]:
        lock = access.app.leader_lock(self.leader_owner)
        if not lock.try_acquire():
            raise lock.unavailable()
        return {"owner": self.leader_owner, "record_version": lock.record_version_number}


class ShardSyncOperator(_LeaderStep):
    """Syncs shards to leases and cleans up, audits the lease table's hash-range coverage, and looks
    for the round's first lease with work (`pending_work`, which `IdleCheckOperator` acts on), all
    over the sync's one scan of the lease table. With the round's `output_uri`, a lease with
    committed batches that sink's readers cannot see yet (making them visible was cut short) is work
    too."""

    template_fields: Sequence[str] = ("settings", "leader_owner", "streams", "output_uri")

    def __init__(self, *, streams: Any, output_uri: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.streams = streams
        self.output_uri = output_uri

    def run(self, access: AwsAccess, context: Any) -> dict[str, Any]:
        names = stream_names(self.streams)
        source = access.app.shard_source
        with self.leadership(access) as leadership:
            store, state = self.fenced_stores(access, leadership)
            # The sync first: it refuses a stream the application does not consume before the
            # auditor writes anything (hash ranges filled from that stream's listing, its record).
            awaiting = self._awaiting_visibility(access, names)
            report = sync_streams(
                names, access.config, store, source, state, awaiting_visibility=_kept_if_unsure(awaiting)
            )
            # The sync's own view of the table (its scan plus its writes): the audit needs no second scan.
            audits = self._audit(access, names, store, state, source, report.leases)
            leases = report.leases if report.leases is not None else store.list_leases()
            # Nothing that arrived before the check began is unread when it finds none: an idle
            # round's freshness (the finalize step's) is measured from this moment.
            checked_at = int(time.time() * 1000)
            work = find_pending_work(
                leases,
                names,
                access.app.idle_check_retrieval,
                access.config,
                closed_lease_keys=report.closed_lease_keys,
                awaiting_visibility=awaiting,
            )
            if not work.idle:  # a round with work: what its assignment should know of leases never measured
                probe_load(leases, names, access.app.idle_check_retrieval, access.config, state)
        pending_work = {**work.to_dict(), CHECKED_AT: checked_at}
        return {**report.to_dict(), "audits": audits, "pending_work": pending_work}

    def _awaiting_visibility(
        self, access: AwsAccess, names: Sequence[str]
    ) -> Callable[[Lease], tuple[str, ...]] | None:
        """The idle check's question to the round's sink, built when first asked: a sink that cannot be
        reached (no credentials, say) makes each lease work with the reason, not the sync fail."""
        if not self.output_uri:
            return None
        uri, config = self.output_uri, access.config

        @functools.cache
        def sink() -> BatchSink:
            streams = stream_incarnations(access.app, names)
            # Whether this round sets records aside or not, it finishes the dead letters earlier ones did.
            return open_round_sink(uri, config=config, dead_letters=False, session=access.session, streams=streams)

        return lambda lease: sink().awaiting_visibility(lease.committed_batch)

    @staticmethod
    def _audit(
        access: AwsAccess,
        names: list[str],
        store: Any,
        state: Any,
        source: KinesisShardSource,
        leases: Sequence[Lease] | None,
    ) -> dict[str, Any]:
        auditor = ShardSyncAuditor(store, state, lambda: int(time.time() * 1000))
        threshold = access.config.leases_recovery_auditor_inconsistency_confidence_threshold
        audits = {}
        for name in names:
            if is_multi_stream(access.config, names):
                identifier = source.stream_identifier(name)
                key, scheme = identifier.serialize(), LeaseKeyScheme(identifier)
            else:
                key, scheme = name, LeaseKeyScheme()
            decision = auditor.audit(key, scheme, functools.partial(source.list_shards, name), threshold, leases)
            audits[name] = {
                "reason": decision.reason.value,
                "hole": decision.hole,
                "consecutive_holes": decision.consecutive_holes,
            }
        return audits


class LeaseAssignmentOperator(_LeaderStep):
    """One assignment round over the slots <app>-worker-0..W-1 with the configured strategy."""

    template_fields: Sequence[str] = ("settings", "leader_owner", "num_workers")

    def __init__(self, *, num_workers: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_workers = num_workers

    def run(self, access: AwsAccess, context: Any) -> dict[str, Any]:
        config = access.config
        metrics = access.app.worker_metrics
        with self.leadership(access) as leadership:
            store, state = self.fenced_stores(access, leadership)
            coordinator = AssignmentCoordinator(store, metrics, state, config)
            report = coordinator.run(
                slot_ids(config.require_application_name(), int(self.num_workers)), round_owner=self.leader_owner
            )
        return report.to_dict()


class IdleCheckOperator(BaseOperator):
    """Skips itself, and so the assignment and the consume step after it, when the shard sync found
    nothing to read (`lease_core.retrieval.pending_work`): an idle round scans the lease table once.

    `pending_work` is the sync's answer in its XCom. Clearing this task alone re-reads that answer;
    clearing `sync_shards` looks at the streams again. Before it skips, it checks what the consume step
    would have checked before submitting the job: that the round's decoder and transform (`processing`,
    the plan's) load (`check_user_functions`, with `py_files` and the Spark connection `spark_conn_id`'s
    deploy mode), so that a wrong one fails the round on a quiet stream too, not first when records come.
    """

    template_fields: Sequence[str] = ("pending_work", "processing")

    def __init__(
        self,
        *,
        pending_work: Any,
        processing: Any = None,
        py_files: str | None = None,
        spark_conn_id: str = "spark_default",
        conf: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """`py_files`, `spark_conn_id` and `conf`: the consume step's, which say where and with which
        Python (`spark.pyspark.driver.python`) its driver starts."""
        super().__init__(**kwargs)
        self.pending_work = pending_work
        self.processing = processing
        self.py_files = py_files
        self.spark_conn_id = spark_conn_id
        self.conf = conf

    def execute(self, context: Any) -> dict[str, Any]:
        with airflow_outcomes():
            work = PendingWork.from_dict(self.pending_work, "the sync_shards XCom's pending_work")
            if work.idle:
                self._check_user_functions(RecordProcessing.from_options(self.processing or {}))
        if work.idle:
            raise AirflowSkipException(f"{work.summary()}; the assignment and the consume step are skipped")
        return work.to_dict()

    def _check_user_functions(self, processing: RecordProcessing) -> None:
        """The consume step's check before it submits the job; none when the driver runs elsewhere."""
        if SparkSubmitHook(conn_id=self.spark_conn_id)._connection["deploy_mode"] == "cluster":
            return
        with tempfile.TemporaryDirectory(prefix="kinesis-idle-") as folder:
            reported = check_user_functions(
                processing, self.py_files, None, str(Path(folder) / "error.json"), self.conf
            )
        if reported is not None:
            raise reported


class KinesisConsumeOperator(SparkSubmitOperator):
    """The consume job through the Apache Spark provider's `SparkSubmitOperator` (`spark_default`).

    The application arguments are built from the round's plan at run time; the AWS connection's
    credentials and region go to the job's environment, its endpoints into the configuration. The
    round report is written beside the output (`BatchSink.reports_root`: `<output>/_rounds/<run id>.json`
    for a Parquet dataset, the table's `metadata/kinesis-rounds/` for an Iceberg table), out of the
    readers' way, unless `report_uri` names another place,
    and its totals are returned to XCom.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "settings",
        "streams",
        "num_workers",
        "output_uri",
        "limits",
        "stop_at_arrival",
        "leader_owner",
        "round_number",
        "report_uri",
        "processing",
    )

    def __init__(
        self,
        *,
        settings: Any,
        streams: Any,
        num_workers: Any,
        output_uri: str,
        leader_owner: str,
        round_number: Any,
        report_uri: str | None = None,
        limits: Any = None,
        stop_at_arrival: Any = None,
        processing: Any = None,
        aws_conn_id: str | None = "aws_default",
        **kwargs: Any,
    ) -> None:
        """`processing`: how the job turns records into rows, the options of `RecordProcessing` by name
        (the round plan's `processing`; none: the records as they are). A decoder or transform it names
        must be importable where the job's driver and executors run: installed there, or shipped with
        the job (`py_files`)."""
        kwargs.setdefault("application", CONSUME_JOB)
        kwargs.setdefault("conf", {"spark.speculation": "false"})
        super().__init__(**kwargs)
        self.settings = settings
        self.streams = streams
        self.num_workers = num_workers
        self.output_uri = output_uri
        self.limits = limits
        self.stop_at_arrival = stop_at_arrival
        self.leader_owner = leader_owner
        self.round_number = round_number
        self.report_uri = report_uri
        self.processing = processing
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]  # XCom: the round's figures
        report_uri: str | None = None
        access: AwsAccess | None = None
        earlier: dict[str, Any] | None = None
        try:
            with airflow_outcomes():
                access = aws_access(self.aws_conn_id, dict(self.settings))
                self._access = access  # for the lineage, asked for after the step
                self._processing = RecordProcessing.from_options(self.processing or {})
                report_uri = self._report_uri(access, context)
                earlier = _figures_if_any(report_uri, access)  # an earlier try's, which this one replaces
                self.application_args = self._arguments(access, context, report_uri)
                # The executors must run this environment's Python (otherwise Spark's workers run the system one).
                python = {"PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
                self.env_vars = {**(self.env_vars or {}), **access.spark_env(), **python}
                self.conf = {**(self.conf or {}), "spark.speculation": "false"}
            with airflow_outcomes(), tempfile.TemporaryDirectory(prefix="kinesis-consume-") as folder:
                self._submit(context, str(Path(folder) / "error.json"))
                return read_report(report_uri, access.app).figures().to_dict()
        except (Exception, AirflowTaskTimeout, AirflowTaskTerminated) as error:
            # For the round's failure recorder (the DAG's `record_failed_round`): what stopped it, and
            # the figures of its report if this try's job wrote one (a lease failed: the job exits 1
            # after writing it), not an earlier try's. A try stopped by its execution_timeout or
            # terminated is a round that ran too (both are BaseExceptions, not Exceptions).
            figures = _figures_if_any(report_uri, access)
            figures = None if figures == earlier else figures
            for_good = RoundFigures.from_dict(figures, "the round's report").failed_for_good() if figures else ()
            raised: BaseException = error
            if for_good and not isinstance(error, AirflowFailException):
                # The same round again would fail the same way: the run fails now, and the next one
                # (or a fix) takes the leases up again.
                raised = AirflowFailException(
                    f"the round ran, and {len(for_good)} lease(s) failed in a way a retry cannot help: "
                    + "; ".join(for_good)
                )
            failure = {"error": f"{type(raised).__name__}: {raised}", "figures": figures}
            context["ti"].xcom_push(key=FAILED_ROUND_KEY, value=failure)
            if raised is error:
                raise
            raise raised from error

    def _get_hook(self) -> SparkSubmitHook:
        """The provider's hook, running the spark-submit `spark_submit_binary` picks."""
        self._spark_binary = spark_submit_binary(self._spark_binary, self._conn_id, self.env_vars)
        return super()._get_hook()

    def _submit(self, context: Any, error_file: str) -> None:
        """spark-submit the job; when it fails, the job's own error, as its driver reported it in
        `error_file` (`spark_jobs.job_errors`), rather than spark-submit's exit status. A decoder or
        transform that cannot be loaded fails the step before the job is submitted, when the driver
        would run here (`check_user_functions`)."""
        self.application_args = [*(self.application_args or []), "--error-file", error_file]
        # The provider resolves the deploy mode (argument or connection) into a hook's connection; the
        # submission builds its own hook (after adding its OpenLineage settings to the configuration).
        functions = self._processing.decode or self._processing.transform
        if functions and self._get_hook()._connection["deploy_mode"] != "cluster":
            reported = check_user_functions(self._processing, self.py_files, self.env_vars, error_file, self.conf)
            if reported is not None:
                raise reported
        try:
            super().execute(context)
        except AirflowException as failure:
            reported = read_job_error(error_file)
            if reported is None:  # the job ran its round (its report says what failed), or died
                raise
            raise reported from failure

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The round's lineage for Airflow's OpenLineage integration (called only when it is on):
        the streams it read, by ARN, and the dataset or table it landed in, by location."""
        from airflow.providers.common.compat.openlineage.facet import Dataset
        from airflow.providers.openlineage.extractors import OperatorLineage

        access = getattr(self, "_access", None)
        if access is None:  # the step failed before it could reach AWS: nothing is known
            return OperatorLineage()
        inputs = []
        for name in stream_names(self.streams):
            try:
                arn = access.app.shard_source.describe_stream(name).stream_arn
            except LeaseCoreError as error:
                log.warning("lineage: stream %r could not be described (%s)", name, error)
                continue
            inputs.append(Dataset(*stream_dataset(arn)))
        try:
            namespace, name = open_sink(self.output_uri, config=access.config, session=access.session).lineage_dataset()
            outputs = [Dataset(namespace=namespace, name=name)]
        except LeaseCoreError as error:
            log.warning("lineage: the output %s could not be named (%s)", self.output_uri, error)
            outputs = []
        return OperatorLineage(inputs=inputs, outputs=outputs)

    get_openlineage_facets_on_failure = get_openlineage_facets_on_complete

    def _report_uri(self, access: AwsAccess, context: Any) -> str:
        if self.report_uri:
            return self.report_uri
        sink = open_sink(self.output_uri, config=access.config, session=access.session)
        return report_uri_for(sink.reports_root(), context["run_id"])

    def _arguments(self, access: AwsAccess, context: Any, report_uri: str) -> list[str]:
        config = access.config
        arguments = [
            "--workers",
            str(int(self.num_workers)),
            "--output-uri",
            self.output_uri,
            "--report-uri",
            report_uri,
            "--leader-owner",
            self.leader_owner,
            "--round",
            str(int(self.round_number)),
        ]
        for name in stream_names(self.streams):
            arguments += ["--stream", name]
        for key, value in (self.limits or {}).items():
            arguments += [f"--{key.replace('_', '-')}", str(value)]
        if self.stop_at_arrival:
            arguments += ["--stop-at-arrival", str(self.stop_at_arrival)]
        arguments += self._processing.to_arguments()
        # The run's settings, plus what the connection resolved (endpoints, region): the driver
        # may run where the connection does not exist (a cluster), so it gets plain values.
        settings = dict(self.settings)
        for key in _CONNECTION_SETTINGS:
            if getattr(config, key) is not None:
                settings[key] = getattr(config, key)
        for key, value in settings.items():
            if value is not None:
                arguments += ["--set", f"{key}={_setting_text(value)}"]
        return arguments


def spark_submit_binary(explicit: str | None, conn_id: str, env_vars: Mapping[str, Any] | None) -> str | None:
    """The spark-submit the consume step runs: what the deployment chose, else this Python's pyspark's.

    The deployment's choice, left to the provider (`spark-submit` looked up on PATH unless named): the
    operator's `spark_binary`, the `spark-binary` extra of the Spark connection, or a `SPARK_HOME` in
    the worker's environment or the task's `env_vars`. Otherwise the `bin/spark-submit` inside the
    installed `pyspark` package, by its absolute path: Airflow started as `<venv>/bin/airflow` without
    activating the venv has no spark-submit on PATH, and pyspark's copy in `<venv>/bin` would look for
    SPARK_HOME with the `python3` of PATH (docs/running-on-aws.md). The one inside the package needs no
    Python to find its home (it is the package folder), so it runs the Spark of this environment, the
    one the job's code and `PYSPARK_PYTHON` are installed with.
    """
    if explicit:
        return explicit
    if os.environ.get("SPARK_HOME") or (env_vars or {}).get("SPARK_HOME"):
        return None
    try:
        extra = SparkSubmitHook.get_connection(conn_id).extra_dejson
    except AirflowException:  # no such connection: the provider defaults the master, and we the binary
        extra = {}
    if extra.get("spark-binary"):
        return None
    pyspark = importlib.util.find_spec("pyspark")
    if pyspark is None or pyspark.origin is None:
        return None  # no pyspark in this Python: whatever spark-submit PATH has
    return str(Path(pyspark.origin).resolve().parent / "bin" / "spark-submit")


_CONNECTION_SETTINGS = ("aws_region", "aws_endpoint_url_dynamodb", "aws_endpoint_url_kinesis", "aws_endpoint_url_s3")


def check_user_functions(
    processing: RecordProcessing,
    py_files: str | None,
    env_vars: Mapping[str, str] | None,
    error_file: str,
    conf: Mapping[str, Any] | None = None,
) -> ReportedError | None:
    """The error loading the decoder or the transform raises in a driver started here: the Python
    spark-submit starts it with (`driver_python`, from the step's Spark `conf` and environment), its
    environment, and `py_files` first on its path (a .py file's folder, a .zip or .egg itself), as
    `spark_jobs.user_functions` finds it. None when both load (or there are none), or when the check
    could not be made, logged (that Python cannot be run, or cannot run the check: the job checks
    them again anyway)."""
    if processing.decode is None and processing.transform is None:
        return None
    environment = {**os.environ, **(env_vars or {})}
    python = driver_python(conf, environment)
    shipped = [
        str(Path(name).parent) if name.endswith(".py") else name for name in (py_files or "").split(",") if name.strip()
    ]
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [*shipped, environment.get("PYTHONPATH")]))
    command = [python, "-m", "spark_jobs.user_functions", "--error-file", error_file, *processing.to_arguments()]
    try:
        checked = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("the decoder and the transform could not be checked before the job with %s (%s)", python, error)
        return None
    if checked.returncode == 0:
        return None
    reported = read_job_error(error_file)
    if reported is None:
        log.warning(
            "the decoder and the transform could not be checked before the job with %s: %s",
            python,
            checked.stderr[-2000:],
        )
    Path(error_file).unlink(missing_ok=True)  # the job's own report goes there next
    return reported


# What names the Python of a driver spark-submit starts, the first set wins (Spark's PythonRunner): its
# settings (the step's `conf` over spark-defaults.conf), then its environment.
_DRIVER_PYTHON_SETTINGS = ("spark.pyspark.driver.python", "spark.pyspark.python")
_DRIVER_PYTHON_VARIABLES = ("PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON")


def driver_python(conf: Mapping[str, Any] | None, environment: Mapping[str, str]) -> str:
    """The Python spark-submit starts a driver on this machine with, picked as Spark picks it; this
    Python when nothing names one (the consume step then names it, `PYSPARK_PYTHON`)."""
    settings = {**_spark_defaults(environment), **{name: str(value) for name, value in (conf or {}).items()}}
    named = [settings.get(name) for name in _DRIVER_PYTHON_SETTINGS]
    named += [environment.get(name) for name in _DRIVER_PYTHON_VARIABLES]
    return next((python for python in named if python), sys.executable)


def _spark_defaults(environment: Mapping[str, str]) -> dict[str, str]:
    """spark-defaults.conf's settings, from SPARK_CONF_DIR (else SPARK_HOME/conf): a Java properties
    file of "name value" (or "name=value") lines, # comments."""
    folder = environment.get("SPARK_CONF_DIR") or (
        str(Path(environment["SPARK_HOME"]) / "conf") if environment.get("SPARK_HOME") else None
    )
    path = Path(folder, "spark-defaults.conf") if folder else None
    if path is None or not path.is_file():
        return {}
    lines = (_PROPERTY.match(line) for line in path.read_text().splitlines())
    return {found["name"]: found["value"].strip() for found in lines if found is not None}


_PROPERTY = re.compile(r"\s*(?P<name>[^\s=:#!][^\s=:]*)\s*[=:\s]\s*(?P<value>.*)")


def _setting_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    return str(value)


def _kept_if_unsure(
    awaiting: Callable[[Lease], tuple[str, ...]] | None,
) -> Callable[[Lease], bool] | None:
    """The cleanup's question (`may_await_visibility`): a lease whose batches the sink cannot be asked
    about now (unreachable, say) is kept, as one whose batches are not visible yet is."""
    if awaiting is None:
        return None

    def may_await(lease: Lease) -> bool:
        try:
            return bool(awaiting(lease))
        except LeaseCoreError as error:
            log.warning(
                "lease %s stays: the sink could not say whether its batches are visible (%s)", lease.lease_key, error
            )
            return True

    return may_await


def records_lost(
    retention_losses: Sequence[RetentionLoss], shard_sync: Mapping[str, Any], missing_batches: Sequence[str] = ()
) -> tuple[str, ...]:
    """What the round says can never be landed: retention gaps, leases deleted before SHARD_END, and
    committed batches the sink lacks (their files deleted before they were visible, or rolled back)."""
    aged_out = tuple(f"lease {loss.description}" for loss in retention_losses)
    deleted = tuple(f"lease {missing_batch_loss(batch)}" for batch in missing_batches)
    vanished = tuple(
        f"lease {key}: its shard no longer exists and the lease never reached SHARD_END, so its last records "
        "may have expired unread"
        for key in shard_sync.get("possibly_unread", [])
    )
    return aged_out + vanished + deleted


def stream_dataset(arn: str) -> tuple[str, str]:
    """OpenLineage's (namespace, name) of a Kinesis stream, from its ARN
    `arn:aws:kinesis:REGION:ACCOUNT:stream/NAME`: ("arn:aws:kinesis:REGION:ACCOUNT", "stream/NAME"),
    the form the naming spec gives AWS resources named by ARN (Glue's tables are alike)."""
    prefix, _, resource = arn.rpartition(":")
    return prefix, resource


def _figures_if_any(report_uri: str | None, access: AwsAccess | None) -> dict[str, Any] | None:
    """The figures of the round's report, or None when there is none to read (the job stopped before
    writing it, or the step failed before starting the job)."""
    if report_uri is None or access is None:
        return None
    try:
        return read_report(report_uri, access.app).figures().to_dict()
    except Exception as error:  # the failure that matters is the round's own, already on its way up
        log.info("no round report to read at %s (%s)", report_uri, error)
        return None


class FinalizeRoundOperator(_LeaderStep):
    """Keeps the round's figures (round history, per-lease rows) and sets the output asset event's extra.

    Runs under the round's lock like the other writers. A retry replaces the round's history entry
    (it is keyed by run id) instead of adding a second one. When the round lost records for good
    (`records_lost`), the task fails after saving the figures: a failed run is the alert, and the
    next round runs normally. The retention losses the report names are then removed from their
    leases, which carry them until a round's report is kept this way (a driver that died before
    writing its report leaves them for the next round's).
    """

    template_fields: Sequence[str] = (
        "settings",
        "leader_owner",
        "round_report",
        "assignment",
        "shard_sync",
        "failed_round",
    )

    def __init__(
        self,
        *,
        round_report: Any = None,
        assignment: Any,
        shard_sync: Any = None,
        failed_round: Any = None,
        after_failure: bool = False,
        **kwargs: Any,
    ) -> None:
        """`after_failure`: this is the round's failure recorder, which keeps the round whose consume
        step failed (`failed_round`, the consume step's `FAILED_ROUND_KEY` XCom) in the history;
        without that XCom (the consume step succeeded, was skipped or never ran) it does nothing."""
        super().__init__(**kwargs)
        self.round_report = round_report
        self.assignment = assignment
        self.shard_sync = shard_sync
        self.failed_round = failed_round
        self.after_failure = after_failure

    def run(self, access: AwsAccess, context: Any) -> dict[str, Any]:
        report, error = self.round_report, None
        if self.after_failure:
            if not self.failed_round:
                return {"recorded": False}
            report, error = self.failed_round.get("figures"), str(self.failed_round.get("error") or "failed")
        # No figures when the consume step was skipped (nothing to read): the round consumed nothing.
        figures = RoundFigures.from_dict(report, "the consume step's XCom") if report else None
        shard_sync = dict(self.shard_sync or {})
        assignment = dict(self.assignment or {})
        summary = round_summary(figures, assignment, shard_sync, context["run_id"], self.dag_id, self.leader_owner)
        summary["error"] = abridged(error)
        totals = figures.totals if figures else None
        losses = records_lost(
            totals.retention_losses if totals else (), shard_sync, totals.missing_batches if totals else ()
        )
        corrupt = corrupt_leases(shard_sync)
        summary["succeeded"] = error is None and (figures is None or figures.succeeded) and not (losses or corrupt)
        history = RoundHistory(access.app.state_store)
        rows = self._fresh_rows(summary, figures, history, shard_sync)
        with self.leadership(access) as leadership:
            store, state = self.fenced_stores(access, leadership)
            history = RoundHistory(state)
            # Published while the lock is heartbeaten, and once: a try of this step that got as far as
            # the history had published them, and a second publication would count the round twice.
            earlier_try = next((entry for entry in history.rounds() if entry.get("run_id") == summary["run_id"]), None)
            if earlier_try is None:
                observation = round_observation(access.app.name, summary, figures, rows, assignment)
                summary["metrics"] = publish_round_metrics(access, observation)
            else:
                summary["metrics"] = earlier_try.get("metrics")
            history.append(summary)
            if figures:
                history.record_lease_rows(int(summary["round"] or 0), rows)
                # Kept now (history, and this task's failure below): the leases need not carry them any more.
                forget_reported_losses(store, figures.totals.reported_losses())
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {
                key: summary[key] for key in ("round", "records", "bytes", "files", "consumed")
            }
        if corrupt:
            raise CorruptLeasesSkippedError(corrupt, losses)
        if losses:
            raise RecordsLostError(losses)
        return summary

    @staticmethod
    def _fresh_rows(
        summary: dict[str, Any], figures: RoundFigures | None, history: RoundHistory, shard_sync: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """The round's per-lease rows with their freshness, and the round's own in `summary`, at its end
        (`lease_core.metrics.freshness`): carried from the round before, which `history` keeps (a retry of
        this step finds this round's own entry, which it passes over). Leases the round did not read are
        carried too, unless they had ended or the sync deleted them."""
        deleted = frozenset(shard_sync.get("deleted", ()))
        at = summary["finished_at"]
        earlier = next(
            (entry for entry in reversed(history.rounds()) if entry.get("run_id") != summary["run_id"]), None
        )
        visible = figures is None or figures.publication is None or figures.publication.error is None
        if figures is None:
            rows: list[dict[str, Any]] = []
            # An idle round's check found no record the output lacks (of those that arrived before it
            # began); a failed one says nothing.
            checked_at = (shard_sync.get("pending_work") or {}).get(CHECKED_AT, at)
            own = Freshness(landed_through_millis=checked_at) if summary["error"] is None else Freshness()
        else:
            rows = fresh_lease_rows(
                figures.lease_rows(),
                history.lease_rows()[1],
                visible,
                at,
                done=lambda row: row.get("outcome") in Outcome.ENDED or row["lease_key"] in deleted,
            )
            own = Freshness.of_leases(Freshness.of_row(row) for row in rows)
        summary.update(own.carried_from(Freshness.of_row(earlier)).to_dict(at))
        return rows


def publish_round_metrics(access: AwsAccess, observation: RoundObservation) -> dict[str, Any]:
    """The round's metrics to CloudWatch (KCL's names, `metrics_level`) and to Airflow's metrics backend;
    what each did, for the round's summary. Never raises: the round's data is landed whatever happens here.
    `metrics_level = NONE` publishes nothing to either (a backfill's replay must not trip live alarms)."""
    if access.config.metrics_level == "NONE":
        return {"cloudwatch": None, "airflow": None}
    values = round_metric_values(observation)
    return {
        "cloudwatch": _to_cloudwatch(access, values, observation.finished_at_millis),
        "airflow": emit_round_metrics(values, observation.application),
    }


def _to_cloudwatch(access: AwsAccess, values: list[MetricValue], at_millis: int) -> dict[str, Any] | None:
    config = access.config
    try:
        client = access.client("cloudwatch")
    except Exception as error:  # no region, say: reported like a failed call, never failing the round
        log.warning("no CloudWatch client, so the round's metrics were not published: %s", error)
        kept = kcl_filtered(values, MetricsLevel[config.metrics_level], config.metrics_enabled_dimensions)
        problem = f"{type(error).__name__}: {error}"
        return MetricsPublication(config.cloudwatch_namespace, len(kept), 0, 0, problem).to_dict()
    return CloudWatchPublisher.of(client, config, access.app.retry_policy).publish(values, at_millis).to_dict()


def corrupt_leases(shard_sync: Mapping[str, Any]) -> tuple[str, ...]:
    """The lease items the round's sync could not read, each with its bad attribute: skipped by the round."""
    return tuple(
        f"lease item {item['lease_key']!r}: {item['problem']}" for item in shard_sync.get("corrupt_leases", [])
    )


def round_summary(
    figures: RoundFigures | None,
    assignment: Mapping[str, Any],
    shard_sync: Mapping[str, Any],
    run_id: str,
    dag_id: str | None = None,
    leader: str | None = None,
) -> dict[str, Any]:
    """The round's entry in the round history, and the finalize step's XCom: with the DAG and the
    leader lock's owner name of the round, for the monitoring page's links and its "last leader"."""
    return {
        "round": assignment.get("round_number", figures.round_number if figures else None),
        "run_id": run_id,
        "dag_id": dag_id,
        "leader": leader,
        "finished_at": int(time.time() * 1000),
        "consumed": figures is not None,
        **history_figures(figures),
        "possibly_unread": len(shard_sync.get("possibly_unread", [])),
        "corrupt_leases": len(shard_sync.get("corrupt_leases", [])),
        "moves": len(assignment.get("moves", [])),
    }


class ReleaseLeadershipOperator(_LeaderStep):
    """Releases the round's leader lock; the teardown of `TakeLeadershipOperator`, so it runs whatever
    happened in between once the lock was taken (and a lock it never releases is taken over later).

    Before that, holding the lock (heartbeaten, every write fenced by it), it takes the next step of
    KCL 3.5's table migration of a `separate` application (`lease_core.leader.table_migration_run`),
    which goes by the worker metrics the round's slots wrote. Whatever the migration step does or
    raises, the lock is released; a step that failed is logged and in the summary, and the next round
    takes it."""

    def run(self, access: AwsAccess, context: Any) -> dict[str, Any]:
        lock = access.app.leader_lock(self.leader_owner)
        summary: dict[str, Any] = {"owner": self.leader_owner}
        if not lock.resume_as_owner():
            return {**summary, "released": False}
        try:
            summary["table_migration"] = self._advance_table_migration(access, lock)
        finally:
            summary["released"] = lock.release()
        return summary

    def _advance_table_migration(self, access: AwsAccess, lock: LeaderLock) -> dict[str, Any] | None:
        try:
            with hold(lock, self.task_id, acquire=False, release=False) as leadership:
                migration = access.app.table_migration(self.leader_owner, leadership=leadership)
                return None if migration is None else migration.advance()
        except (LeaseCoreError, ValueError) as error:
            self.log.warning("The table migration did not advance: %s", error)
            return {"error": str(error)}
