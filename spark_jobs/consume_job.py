"""The consume job: one round of W slot tasks on Spark, launched with `spark-submit`.

    spark-submit --master 'local[*,4]' -m spark_jobs.consume_job -- (or the file path)
        --application-name orders --stream orders --workers 4 --output-uri s3://lake/orders

The driver checks everything it can before Spark starts (configuration, tables, streams, sink,
transform), holds the application's leader lock while the slots run (the one the round's leader
handed over with `--leader-owner`, or, started by hand, one it takes itself and releases: it never
runs beside another round, and fails naming the holder) and cancels the slots the moment it is
lost, collects the slot reports, writes the round report
(`--report-uri`) and prints its summary. Exit status: 0 when every slot finished and no lease
failed; 1 when something failed (the report says what); 2 for a usage or configuration error.

Spark speculation is forced off: a speculative copy of a slot task would be a second worker with
the same identity racing the first for the same leases.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig, load_config, parse_iso_timestamp
from lease_core.errors import ConfigurationError, LeaseCoreError, TableNotFoundError
from lease_core.leader.assignment_round import slot_ids
from lease_core.leader.leader_lock import LeaderLock, LockHeartbeat
from lease_core.leader.leadership import release_quietly
from lease_core.lifecycle.lease_lifecycle import forget_reported_losses
from lease_core.lifecycle.parent_watch import closing_lease_keys
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.ops.command_line import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ArgumentParser, UsageError
from lease_core.store.table_layout import SEPARATE
from lease_core.sync.step import is_multi_stream, require_matching_lease_mode
from sinks import open_round_sink, sink_configuration
from sinks.batch_sink import RoundIdentity
from sinks.record_columns import RECORD_SCHEMA
from spark_jobs.consume_spec import ConsumeSpec, settings_for_executors
from spark_jobs.decode import load_decoder
from spark_jobs.job_errors import write_job_error
from spark_jobs.lease_consumer import LeaseBudget
from spark_jobs.record_processing import RecordProcessing
from spark_jobs.round_publication import publish_committed_batches, stream_incarnations
from spark_jobs.round_report import (
    Publication,
    RetentionLoss,
    RoundReport,
    check_report_location,
    report_location,
    write_report,
)
from spark_jobs.slot_memory import EXECUTOR_POOL_SETTING, SLOT_POOL
from spark_jobs.slot_task import slot_reports
from spark_jobs.transform import batch_columns, load_transform

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="consume_job", description="One consume round of a Kinesis lease application.")
    parser.add_argument("--application-name", help="the application (lease table) name; or set application_name")
    parser.add_argument(
        "--stream",
        action="append",
        required=True,
        dest="streams",
        metavar="NAME",
        help="stream to consume; more than one selects multi-stream mode",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        required=True,
        metavar="W",
        help="slot tasks <app>-worker-0..W-1 (the round's parallelism)",
    )
    parser.add_argument("--output-uri", required=True, help="the Parquet dataset: a local path or s3://bucket/prefix")
    parser.add_argument(
        "--report-uri",
        type=_report_uri,
        help="where to write the JSON round report: a local path, file:///path or s3://bucket/key",
    )
    parser.add_argument("--max-records-per-lease", type=_positive_int, help="records per lease per round")
    parser.add_argument("--max-bytes-per-lease", type=_positive_int, help="payload bytes per lease per round")
    parser.add_argument("--max-seconds-per-lease", type=_positive_float, help="reading time per lease per round")
    parser.add_argument(
        "--max-records-per-file",
        type=_positive_int,
        default=LeaseBudget.file_max_records,
        help="records per output file (one file per batch)",
    )
    parser.add_argument(
        "--max-bytes-per-file",
        type=_positive_int,
        default=LeaseBudget.file_max_bytes,
        help="payload bytes per output file",
    )
    parser.add_argument(
        "--stop-at-arrival",
        metavar="ISO8601",
        help="do not read records that arrived at or after this time (a backfill window's end)",
    )
    parser.add_argument(
        "--lease-threads",
        type=_positive_int,
        help="leases read at once per slot (default: every lease it holds, up to 64)",
    )
    parser.add_argument(
        "--busy-leases",
        type=_positive_int,
        default=ConsumeSpec.__dataclass_fields__["busy_leases"].default,
        help="leases of a slot parsing records or writing a file at once (the rest wait for Kinesis)",
    )
    parser.add_argument(
        "--slot-buffer-bytes",
        type=_positive_int,
        default=ConsumeSpec.__dataclass_fields__["slot_buffer_bytes"].default,
        help="record bytes a slot batches in memory at once, shared by the leases it reads at once",
    )
    RecordProcessing.add_arguments(parser)  # --transform, --decode, --bad-records, ...
    parser.add_argument(
        "--round",
        type=_positive_int,
        dest="round_number",
        help="the round number (default: the last assignment round in the coordinator state)",
    )
    parser.add_argument("--leader-owner", help="owner name of the leader lock the round's leader handed over")
    parser.add_argument(
        "--leader-record-version", help="record version of that lock (default: whatever version the owner wrote last)"
    )
    parser.add_argument(
        "--error-file",
        metavar="PATH",
        help="where to write, as JSON, the error that stops the job without its round (spark_jobs.job_errors)",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides", help="override a setting"
    )
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _report_uri(text: str) -> str:
    try:
        report_location(text)
    except ConfigurationError as error:
        raise argparse.ArgumentTypeError(error.problem) from None
    return text


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


@dataclass(frozen=True)
class HandedOverLock:
    """The leader lock the round's leader handed over to the driver (`--leader-owner`, `--leader-record-version`)."""

    owner: str
    record_version: str | None = None


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    error_file = _error_file(argv)
    try:
        arguments = build_parser().parse_args(argv)
        config = _load(arguments)
        spec = prepare_round(arguments, config)
    except (UsageError, ConfigurationError) as error:
        return _stopped(error, EXIT_USAGE, error_file)
    except LeaseCoreError as error:
        return _stopped(error, EXIT_FAILED, error_file)
    except Exception as error:  # not ours (a library's): its traceback in the log, its name and message reported
        traceback.print_exc()
        return _stopped(error, EXIT_FAILED, error_file)
    leadership = _leadership(arguments)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf()
    for key, value in executor_environment(os.environ).items():
        if not conf.contains(key):
            conf.set(key, value)
    if not conf.contains(EXECUTOR_POOL_SETTING):  # Arrow's allocator, before the workers import pyarrow
        conf.set(EXECUTOR_POOL_SETTING, SLOT_POOL)
    conf.set("spark.speculation", "false")
    spark = SparkSession.builder.appName(f"kinesis-consume-{spec.application_name}").config(conf=conf).getOrCreate()
    try:
        report = run_round(spark, spec, leadership)
    except LeaseCoreError as error:
        return _stopped(error, EXIT_FAILED, error_file)
    finally:
        spark.stop()
    print(report.summary())
    if arguments.report_uri:
        try:
            write_report(arguments.report_uri, report, LeaseApplication.from_config(config))
        except (LeaseCoreError, OSError) as error:
            print(
                f"consume_job: the round report could not be written to {arguments.report_uri}: {error}",
                file=sys.stderr,
            )
            return EXIT_FAILED
    if leadership is None:
        try:
            forget_kept_losses(LeaseApplication.from_config(config), report)
        except LeaseCoreError as error:  # they stay on the leases: the next round reports them again
            print(f"consume_job: the reported retention losses stay on their leases: {error}", file=sys.stderr)
    return EXIT_OK if report.succeeded else EXIT_FAILED


def _error_file(argv: Sequence[str] | None) -> str | None:
    """`--error-file`, read on its own first: a usage error in any other argument is reported there too."""
    parser = ArgumentParser(add_help=False)
    parser.add_argument("--error-file")
    try:
        known, _ = parser.parse_known_args(argv)
    except UsageError:  # reported by the whole parser
        return None
    return known.error_file


def _stopped(error: Exception, status: int, error_file: str | None) -> int:
    """The job stops without a round: its error on stderr and, for the step that started it, in `error_file`."""
    print(f"consume_job: {error}", file=sys.stderr)
    if error_file:
        write_job_error(error_file, error)
    return status


# What the executors need from the driver's environment to reach AWS. On a cluster an executor is
# started by its Spark worker, not by the driver, so it would otherwise only see the worker's own
# credential chain. Profiles are left out: their files live on the driver's machine only.
EXECUTOR_AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")


def executor_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`spark.executorEnv.*` settings that hand the driver's AWS credentials and region to the executors.

    They travel in the Spark configuration, never on a command line; Spark's UI redacts the secret
    and the token (`spark.redaction.regex`). A value the submitter set explicitly is kept.
    """
    return {f"spark.executorEnv.{name}": environ[name] for name in EXECUTOR_AWS_VARIABLES if environ.get(name)}


def _load(arguments: argparse.Namespace) -> ConsumerConfig:
    overrides = list(arguments.overrides)
    if arguments.application_name:
        overrides.append(f"application_name={arguments.application_name}")
    config = load_config(arguments.config, overrides=overrides)
    config.require_application_name()
    if arguments.stop_at_arrival:
        try:
            parse_iso_timestamp(arguments.stop_at_arrival)
        except ValueError as error:
            raise UsageError(f"--stop-at-arrival: {error}") from None
    if arguments.leader_record_version and not arguments.leader_owner:
        raise UsageError("--leader-record-version needs --leader-owner")
    return config


def _leadership(arguments: argparse.Namespace) -> HandedOverLock | None:
    if not arguments.leader_owner:
        return None
    return HandedOverLock(arguments.leader_owner, arguments.leader_record_version)


def prepare_round(arguments: argparse.Namespace, config: ConsumerConfig) -> ConsumeSpec:
    """Check everything checkable on the driver, then build the spec the slots receive."""
    app = LeaseApplication.from_config(config)
    processing = RecordProcessing.from_arguments(arguments)
    check_prerequisites(app, arguments.streams, arguments.output_uri, processing)
    check_lease_mode(app, arguments.streams, arguments.workers)
    if arguments.report_uri:  # before the round commits anything it could then not report
        try:
            check_report_location(arguments.report_uri, app)
        except ConfigurationError as error:
            raise UsageError(f"--report-uri: {error.problem}") from None
    budget = LeaseBudget(
        max_records=arguments.max_records_per_lease,
        max_bytes=arguments.max_bytes_per_lease,
        max_seconds=arguments.max_seconds_per_lease,
        file_max_records=arguments.max_records_per_file,
        file_max_bytes=arguments.max_bytes_per_file,
        stop_at_arrival=parse_iso_timestamp(arguments.stop_at_arrival) if arguments.stop_at_arrival else None,
    )
    round_number = arguments.round_number if arguments.round_number is not None else app.current_round()
    return ConsumeSpec(
        streams=tuple(arguments.streams),
        num_workers=arguments.workers,
        output_uri=arguments.output_uri,
        round_number=round_number,
        budget=budget,
        lease_threads=arguments.lease_threads,
        busy_leases=arguments.busy_leases,
        slot_buffer_bytes=arguments.slot_buffer_bytes,
        processing=processing,
        settings=settings_for_executors(config),
    )


def check_prerequisites(
    app: LeaseApplication,
    streams: Sequence[str],
    output_uri: str,
    processing: RecordProcessing,
) -> None:
    """Fail before Spark starts, with an error naming what is missing."""
    config = app.config
    tables = [config.lease_table]
    if app.table_layout.layout == SEPARATE:
        tables += [config.worker_metrics_table, config.coordinator_state_table]
    for table in tables:
        if app.tables.describe(table) is None:
            raise TableNotFoundError(table, "run `leasectl init` (or the DAG's ensure-tables step) first")
    for stream in streams:
        app.shard_source.stream_identifier(stream)  # raises StreamNotFoundError / StreamNotActiveError
    decoder = load_decoder(processing.decode, processing.decode_options)
    decoded = RECORD_SCHEMA if decoder is None else decoder.columns()
    sink = open_round_sink(output_uri, config=config, dead_letters=processing.bad_record_policy.dead_letters)
    transform = processing.transform
    sink.check_writable(batch_columns(transform, load_transform(transform), decoded))


def check_lease_mode(app: LeaseApplication, streams: Sequence[str], num_workers: int) -> None:
    """Refuse, as `leasectl sync` does, a lease table keyed in the other mode (single- or multi-stream):
    the slots would skip every lease and the round would look like one with nothing to read. The
    slots' leases tell, and the first slot holding any is enough: a sync never mixes the two modes."""
    multi_stream = is_multi_stream(app.config, streams)
    for worker_id in slot_ids(app.config.require_application_name(), num_workers):
        leases = app.lease_store.list_leases_for_owner(worker_id)
        if leases:
            require_matching_lease_mode(leases, multi_stream, "this consume job")
            return


def run_round(spark: Any, spec: ConsumeSpec, leadership: HandedOverLock | None = None) -> RoundReport:
    """The slots on `spark`, the leader lock kept alive meanwhile; the folded report."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    failures: list[str] = []
    reports = []
    app = LeaseApplication.from_config(spec.config)
    with _leader_heartbeat(app, leadership, on_lost=lambda: _cancel_slots(spark)) as watch:
        started_spec = spec
        try:
            started_spec = with_round_start(spark, spec, app)
            reports = slot_reports(spark, started_spec)
        except Exception as error:  # Spark wraps executor failures in Py4J errors; keep the message
            failures.append(_first_line(error))
        leases = scanned_leases(app)
        recorded = recorded_losses(leases)
        # The publication records the streams' incarnations the round started with (described again
        # when the round could not start: a position is never written without them).
        if not started_spec.stream_incarnations:
            started_spec = replace(started_spec, stream_incarnations=stream_incarnations(app, spec.streams))
        publication, gone = publish(app, started_spec, leases)
    return RoundReport.build(
        spec.application_name,
        spec.round_number,
        spec.streams,
        spec.output_uri,
        started_at,
        round(time.monotonic() - started, 3),
        reports,
        failures,
        leadership_lost=watch.lost,
        leader_record_version=watch.record_version,
        recorded_losses=recorded,
        publication=publication,
        unpublishable_batches=gone,
    )


def with_round_start(spark: Any, spec: ConsumeSpec, app: LeaseApplication | None = None) -> ConsumeSpec:
    """`spec` with what the driver's look at the streams at round start tells the slots.

    The closed shards, always: a slot reads a closed shard to its null iterator whatever
    MillisBehindLatest says (`ShardToRead.closed`), so none stops at its last record forever. The leases of
    closing parents other slots hold, only when every slot runs at once: then slots out of work wait
    for those to end. With fewer task slots than slots (local[2] and four slots), the slots run in
    waves, and a waiting slot would keep a later one from starting. And the sink's configuration as
    this machine has it (`sink_configuration`), unless the spec carries one, and the streams'
    incarnations (`stream_incarnations`), and under fan-out the consumers' ARNs (`stream_consumer_arns`)."""
    task_slots = concurrent_task_slots(spark)
    together = task_slots is not None and task_slots >= spec.num_workers
    if not together:
        log.info(
            "%d slot(s) on %s task slot(s) may run in waves: a slot out of work ends its task instead of "
            "waiting for children of other slots' parents",
            spec.num_workers,
            task_slots or "an unknown number of",
        )
    app = app or LeaseApplication.from_config(spec.config)
    closed = closed_shards(spec, app)
    parents = closing_parents(spec, app, closed) if together else ()
    configuration = (
        spec.sink_configuration if spec.sink_configuration is not None else sink_configuration(spec.output_uri)
    )
    return replace(
        spec,
        closed_shards=closed,
        slots_run_together=together,
        closing_parents=parents,
        sink_configuration=configuration,
        stream_incarnations=spec.stream_incarnations or stream_incarnations(app, spec.streams),
        stream_consumer_arns=spec.stream_consumer_arns or stream_consumer_arns(app, spec.streams),
    )


def stream_consumer_arns(app: LeaseApplication, streams: Sequence[str]) -> dict[str, str]:
    """Under retrieval = fan_out, the application's consumer ARN of each stream (raising, before any
    slot runs, when one is missing, not ACTIVE or not the application's); nothing under polling."""
    if app.config.retrieval != "fan_out":
        return {}
    return {stream: app.stream_consumers.arn(stream) for stream in streams}


def concurrent_task_slots(spark: Any) -> int | None:
    """How many tasks Spark can run at once now (executor cores over `spark.task.cpus`, as barrier
    stages count them), or None when it cannot say. Not `defaultParallelism`: a setting can change
    that figure, and on a cluster it is at least 2 whatever the cores."""
    try:
        context = spark.sparkContext._jsc.sc()
        return int(context.maxNumConcurrentTasks(context.resourceProfileManager().defaultResourceProfile()))
    except Exception as error:  # an internal Spark API: without it, slots are assumed to run in waves
        log.info("Spark did not say how many tasks it runs at once (%s)", error)
        return None


def closed_shards(spec: ConsumeSpec, app: LeaseApplication) -> dict[str, str | None]:
    """The round's closed shards as the listing gives them now: lease key -> the shard's known
    EndingSequenceNumber (None when the listing's is a placeholder). If the streams cannot be listed,
    none is known: a closed shard then stops at its tip in this round, as an open one does, and the
    next round reads on to its end (the leader's idle check counts it as work meanwhile)."""
    source = app.shard_source
    try:
        closed: dict[str, str | None] = {}
        for stream in spec.streams:
            scheme = LeaseKeyScheme(source.stream_identifier(stream) if spec.multi_stream else None)
            for shard in source.list_shards(stream):
                if not shard.is_open:
                    closed[scheme.lease_key(shard.shard_id)] = shard.known_ending_sequence_number
    except Exception as error:  # best effort: it must never keep the round's slots from running
        log.warning("the shards could not be listed (%s); closed shards are read to their tip in this round", error)
        return {}
    return closed


def closing_parents(spec: ConsumeSpec, app: LeaseApplication, closed: Mapping[str, str | None]) -> tuple[str, ...]:
    """The leases of `closed` shards that the round's slots hold, for idle slots to wait on
    (`lease_core.lifecycle.parent_watch`). Best effort: without them a split's children are all read by the
    slot that ends the parent, which is correct, only less balanced."""
    try:
        leases = app.lease_store.get_leases(closed)
    except Exception as error:  # best effort, as above
        log.warning("closed shards' leases could not be read (%s); idle slots will not wait for their children", error)
        return ()
    return closing_lease_keys(leases, set(closed), slot_ids(spec.application_name, spec.num_workers))


def scanned_leases(app: LeaseApplication) -> Sequence[Lease] | None:
    """Every lease of the application after the slots ended, or None when the table cannot be scanned
    now (then what the scan is for, the retention losses to report and the committed batches to
    publish, is left on the leases for the next round)."""
    try:
        return app.lease_store.scan_leases().leases
    except LeaseCoreError as error:
        log.warning("the lease table could not be scanned (%s); the next round reports and publishes for it", error)
        return None


def recorded_losses(leases: Sequence[Lease] | None) -> list[RetentionLoss]:
    """The retention losses the lease table carries: this round's, and earlier rounds' whose report
    was never kept (their driver died first)."""
    return [
        RetentionLoss.of(lease.lease_key, aged_out)
        for lease in leases or ()
        for aged_out in sorted(lease.unreported_losses, key=lambda loss: loss.after)
    ]


def publish(
    app: LeaseApplication, spec: ConsumeSpec, leases: Sequence[Lease] | None
) -> tuple[Publication, tuple[str, ...]]:
    """Make the round's committed batches visible (`spark_jobs.round_publication`)."""
    if leases is None:
        return Publication.failed("the lease table could not be scanned for the round's committed batches"), ()
    try:
        sink = open_round_sink(
            spec.output_uri,
            config=spec.config,
            dead_letters=spec.processing.bad_record_policy.dead_letters,
            configuration=spec.sink_configuration,
            streams=spec.stream_incarnations,
        )
    except LeaseCoreError as error:
        return Publication.failed(str(error)), ()
    identity = RoundIdentity(spec.application_name, spec.round_number, spec.stream_incarnations)
    return publish_committed_batches(sink, identity, leases)


def forget_kept_losses(app: LeaseApplication, report: RoundReport) -> None:
    """A round run by hand is its own last step: once its report is kept, its retention losses leave
    the leases (as `FinalizeRoundOperator` does for a DAG's round)."""
    forget_reported_losses(app.lease_store, report.reported_losses())


@dataclass
class _LeaderWatch:
    """The leader lock as the driver kept it: whether it was lost, and its latest record version."""

    lock: LeaderLock
    heartbeat: LockHeartbeat

    @property
    def lost(self) -> bool:
        return self.heartbeat.lost.is_set()

    @property
    def record_version(self) -> str | None:
        # The next step (finalize) needs the version the driver's heartbeats wrote last to release it.
        return self.lock.record_version_number


def _cancel_slots(spark: Any) -> None:
    """Stop every running slot task: another round may own the leases now (their writes are fenced
    by the lease counters anyway; this stops the reading too). A cancelled slot leaves at most a
    prepared batch, which the lease's next owner finishes (docs/architecture.md, "Exactly once")."""
    log.warning("the leader lock was lost while the slots ran: cancelling them")
    spark.sparkContext.cancelAllJobs()


@contextmanager
def _leader_heartbeat(
    app: LeaseApplication, leadership: HandedOverLock | None, on_lost: Callable[[], None] | None = None
) -> Iterator[_LeaderWatch]:
    """The application's leader lock, held while the slots run: the one the round's leader handed
    over, or (a job started by hand) one this driver takes itself and releases at the end. Either
    way the job never runs beside another round of the same application."""
    owner = (
        leadership.owner
        if leadership is not None
        else f"consume_job/{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
    )
    lock = app.leader_lock(owner)
    if leadership is None:
        held = lock.try_acquire()
    else:
        held = lock.resume(leadership.record_version) if leadership.record_version else lock.resume_as_owner()
    if not held:
        raise lock.unavailable()
    try:
        with LockHeartbeat(lock, on_lost=on_lost) as heartbeat:
            yield _LeaderWatch(lock, heartbeat)
    finally:
        if leadership is None:
            release_quietly(lock)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if "slot " in line and "failed" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
