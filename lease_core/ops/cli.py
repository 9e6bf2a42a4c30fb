"""`leasectl`: operate an application's lease tables from the command line.

    leasectl [--app APP] [--config FILE] [--set KEY=VALUE ...] COMMAND

The commands that write for the application as a whole (`sync`, `assign`, `reset`, `repair`, `restore`,
`maintain`, `replay-dead-letters`, `teardown`)
hold the application's leader lock while they write, like a round, so they never run beside one;
they fail naming the holder (and when a dead holder's lock can be taken over) when it is held, and
stop before their next write if they lose it. `reset` moves one lease's checkpoint; its rules are in
`lease_core.ops.checkpoint_reset`. `repair` writes an item that cannot be read as a lease anew
(`lease_core.ops.lease_repair`). `status`, `sync` and `assign` exit 1 after their work when they met
such items, naming each one and its attribute: their shards are not read until repaired.
`verify` compares what a sink that records what landed (an Iceberg or Delta table) holds with the
checkpoints (`lease_core.ops.landed_audit`), `restore` moves checkpoints forward to it, and
`maintain` runs the table's upkeep. `replay-dead-letters` lands the records a pipeline's decoder
rejected once it is fixed (`spark_jobs.dead_letter_replay`). These commands need the sinks, which
live above lease_core: their arguments are parsed here, and the installed `leasectl`
(`spark_jobs.leasectl`) passes in what runs them.

`init` and `teardown` act only on tables that are the application's own
(`lease_core.store.table_ownership`): `init` refuses an existing table whose key schema is not its
role's, `teardown` one whose key schema or items are not, and either refuses before it creates,
changes or deletes any table.

Exit status: 0 on success, 1 when AWS or the tables say no, 2 for usage and configuration errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta

from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig, load_config
from lease_core.errors import ConfigurationError, LayoutConflictError, LeaseCoreError, StreamNotFoundError
from lease_core.leader.assignment_round import AssignmentCoordinator, AssignmentReport, slot_ids
from lease_core.leader.leader_lock import LeaderLock
from lease_core.leader.leadership import Leadership, hold, release_quietly
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.model.stream_consumer import StreamConsumerState
from lease_core.ops.checkpoint_reset import (
    TARGET_FORMS,
    CheckpointReset,
    LeaseSelector,
    ResetReport,
    ResetUsageError,
    describe_position,
    parse_target,
    render_position,
)
from lease_core.ops.command_line import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ArgumentParser, UsageError
from lease_core.ops.landed_audit import LandedRecords, OpenLanded, audit_landed, plan_restore
from lease_core.ops.lease_repair import LeaseRepair
from lease_core.ops.status import consumed_stream_names, render_status, status_report
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.lease_store import LeaseStore
from lease_core.store.table_layout import CONFLICT, SEPARATE, SINGLE, LayoutDecision
from lease_core.store.table_ownership import ROLE_NAMES
from lease_core.store.tables import TEARDOWN
from lease_core.sync.step import ShardSyncReport, sync_streams


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="leasectl", description="Operate the KCL-compatible lease tables of an application.")
    parser.add_argument("--app", help="application name (the lease table's name unless lease_table_name is set)")
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides", help="override a setting"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    init = commands.add_parser(
        "init",
        help="create the lease, worker-metrics and coordinator-state tables (refusing existing ones of another "
        "schema), and under retrieval = fan_out the enhanced fan-out consumer of each --stream",
    )
    init.add_argument(
        "--stream",
        action="append",
        default=[],
        dest="streams",
        metavar="NAME",
        help="a stream whose enhanced fan-out consumer to register (retrieval = fan_out), as the DAG's table step does",
    )
    status = commands.add_parser(
        "status", help="leases per owner with counts, throughput and checkpoints, and the stream consumers"
    )
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    sync = commands.add_parser("sync", help="one full shard sync of the given streams now (no auditor)")
    sync.add_argument(
        "--stream",
        action="append",
        required=True,
        dest="streams",
        metavar="NAME",
        help="stream to sync; more than one selects multi-stream mode",
    )
    sync.add_argument(
        "--initial-position",
        choices=["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"],
        help="where new leases start (default: initial_position_in_stream)",
    )
    sync.add_argument("--timestamp", metavar="ISO8601", help="the time AT_TIMESTAMP starts at")
    sync.add_argument("--json", action="store_true", help="print the report as JSON")
    assign = commands.add_parser("assign", help="one lease-assignment round now, as the leader")
    workers = assign.add_mutually_exclusive_group(required=True)
    workers.add_argument("--worker", action="append", dest="workers", metavar="ID", help="an active worker id")
    workers.add_argument(
        "--workers", type=int, dest="slot_count", metavar="N", help="the round's slots <app>-worker-0..N-1"
    )
    assign.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_reset_parser(commands)
    repair = commands.add_parser(
        "repair",
        help="write a lease item that cannot be read as a lease anew at a position, holding the leader lock",
        description=REPAIR_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    repair.add_argument("--lease", required=True, metavar="KEY", help="the lease key, as the alert names it")
    repair.add_argument(
        "--to",
        dest="target",
        metavar="POSITION",
        help=f"where its shard resumes, when its own checkpoint does not read: {TARGET_FORMS}",
    )
    repair.add_argument("--json", action="store_true", help="print the result as JSON")
    repair.add_argument("--yes", action="store_true", help="confirm the repair")
    teardown = commands.add_parser(
        "teardown",
        help="deregister the application's own stream consumers and delete its three tables, only if their schemas "
        "and items are the application's",
    )
    teardown.add_argument("--yes", action="store_true", help="confirm the deletion")
    _add_replay_parser(commands)
    return parser


REPAIR_DESCRIPTION = """\
Write a lease item that cannot be read as a lease (a round skips it and names it) anew.

The attributes that read are kept, each one that does not is dropped and named (never the key, the
stream, the shard or the parents: those are corrected by hand), and the checkpoint is the item's
own when it reads, else POSITION (as for reset: TRIM_HORIZON, LATEST, or the last record to count
as landed), with no owner (the next assignment places it). An item at SHARD_END stays there. A
readable lease is refused: move its checkpoint with reset.
"""

RESET_DESCRIPTION = """\
Move one lease's checkpoint: replay a shard from an earlier point, or skip ahead.

The lease's next batch starts right after the new checkpoint. TRIM_HORIZON replays every record
still in the stream; LATEST skips to the newest record when the next round claims the lease; a
sequence number is the last record to count as landed (a record of this shard, written as Kinesis
writes it; ':<k>' resumes inside a KPL aggregate after its sub-record k). It is not checked
against Kinesis: the lease's next read fails if Kinesis refuses it for the shard. AT_TIMESTAMP is
not offered: the lease would store only the sentinel and be read from the configured
initial_position_timestamp. SHARD_END is never a target, and a lease at SHARD_END is refused (its
children depend on it being finished; replay a finished shard with a backfill).

A single-stream table is keyed by shard id (no --stream); in a multi-stream table --stream is
required (a name, or <account>:<stream>:<epoch> when a name is ambiguous). The reset holds the
application's leader lock, so no round runs meanwhile (it fails if someone else holds it). It
writes the checkpoint conditional on the lease counter, removes the pending checkpoint and raises
the counter by 2, so a worker still holding the lease is fenced; the owner stays. Moving backwards
lands records again (duplicates, by request); moving forward never lands the records skipped
(loss, by request). A discarded prepared batch is reported with the sink's name for it; the
consume job never makes it visible (a batch becomes visible only after its commit).

Exit status: 0 reset; 1 no such lease, SHARD_END, leader lock held, or the lease kept changing;
2 usage.
"""


def _add_reset_parser(commands: argparse._SubParsersAction[ArgumentParser]) -> None:
    reset = commands.add_parser(
        "reset",
        help="move one lease's checkpoint (replay or skip), holding the leader lock",
        description=RESET_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reset.add_argument("--shard", required=True, metavar="SHARD_ID", help="the shard whose lease to reset")
    reset.add_argument(
        "--stream",
        metavar="NAME",
        help="multi-stream tables only: the stream, by name or as <account>:<stream>:<epoch>",
    )
    reset.add_argument(
        "--to", required=True, dest="target", metavar="POSITION", help=f"the new checkpoint: {TARGET_FORMS}"
    )
    reset.add_argument("--json", action="store_true", help="print the result as JSON")
    reset.add_argument("--yes", action="store_true", help="confirm the reset")
    verify = commands.add_parser(
        "verify",
        help="compare what the sink says it holds (an Iceberg table's commits) with the lease checkpoints",
    )
    verify.add_argument("--output-uri", required=True, metavar="URI", help="the sink, as the job's --output-uri")
    verify.add_argument("--json", action="store_true", help="print the findings as JSON")
    restore = commands.add_parser(
        "restore",
        help="move checkpoints forward to what the sink holds (a lost or re-created lease table), under the lock",
    )
    restore.add_argument("--output-uri", required=True, metavar="URI", help="the sink, as the job's --output-uri")
    restore.add_argument("--yes", action="store_true", help="confirm the restore")
    maintain = commands.add_parser(
        "maintain",
        help="a table sink's upkeep: compact small files, expire old snapshots (Iceberg) or vacuum removed files "
        "and checkpoint the log (Delta), remove files nothing will commit (under the lock)",
    )
    maintain.add_argument("--output-uri", required=True, metavar="URI", help="the sink, as the job's --output-uri")
    maintain.add_argument(
        "--orphan-age-hours",
        type=float,
        default=72.0,
        help="remove unreferenced files only when older than this (default 72, Iceberg's own)",
    )
    maintain.add_argument(
        "--target-file-mib",
        type=float,
        default=128.0,
        help="rewrite each partition's data files smaller than this into files of about this size (default 128)",
    )
    maintain.add_argument("--yes", action="store_true", help="confirm the upkeep")


REPLAY_DESCRIPTION = """\
Land the dead letters beside the output (the records its decoder rejected, set aside under
bad_records = dead_letter) in the output, once the decoder is fixed: exactly once, however often it
runs.

The application's dead letters (another application's in a shared table are its own) of each
batch they came from go through the fixed decoder (--decode) and the pipeline's transform
(--transform, when it has one) together, and land as one batch of the pseudo lease
<lease key>:<stream creation time>:dead-letters (one per lease and incarnation of its stream).
Each lease's batches are replayed in shard order; a batch whose
records the decoder still rejects stops its lease's replay (it is named, with its first error), and
a later run after another fix goes on from it. What landed before is skipped.

The dead letters stay in their destination, replayed or not: it is the log of what was rejected,
and by what. The command holds the application's leader lock while it writes, so it never runs
beside a round; --dry-run decodes and lands nothing (without the lock).

Exit status: 0 when every dead letter is in the output; 1 when some lease still has records the
decoder rejects, or the lock is held; 2 usage (a decoder or transform that cannot be loaded, a URI
that is not a sink's).
"""


def _add_replay_parser(commands: argparse._SubParsersAction[ArgumentParser]) -> None:
    replay = commands.add_parser(
        "replay-dead-letters",
        help="land the records the decoder rejected once it is fixed, exactly once (they stay in the dead letters)",
        description=REPLAY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument("--output-uri", required=True, metavar="URI", help="the sink, as the job's --output-uri")
    replay.add_argument(
        "--decode", required=True, metavar="MODULE:FUNCTION", help="the fixed decoder (the pipeline's decode)"
    )
    replay.add_argument(
        "--decode-options",
        type=_json_object,
        default={},
        metavar="JSON",
        help="a built-in decoder's options, as the pipeline's decode_options (a JSON object)",
    )
    replay.add_argument("--transform", metavar="MODULE:FUNCTION", help="the pipeline's transform, if it has one")
    replay.add_argument("--stream", metavar="NAME", help="replay this stream's dead letters only")
    replay.add_argument("--dry-run", action="store_true", help="decode and report, land nothing")


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


# A command whose work is above lease_core, as the installed `leasectl` passes it in (`main`).
Command = Callable[[argparse.Namespace, LeaseApplication], int]
INSTALLED_COMMANDS = frozenset({"replay-dead-letters"})


def main(
    argv: Sequence[str] | None = None,
    open_landed: OpenLanded | None = None,
    installed_commands: Mapping[str, Command] | None = None,
) -> int:
    """`open_landed` opens a sink's record of what landed, for `verify` and `restore`, and
    `installed_commands` run the INSTALLED_COMMANDS: the sinks live above lease_core, so the
    installed `leasectl` (`spark_jobs.leasectl`) passes them in."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        arguments = build_parser().parse_args(argv)
        config = _load(arguments)
        app = LeaseApplication.from_config(config)
        if arguments.command in SINK_COMMANDS:
            if open_landed is None:
                raise _needs_the_sinks(arguments.command)
            landed = open_landed(arguments.output_uri, config, lambda stream: _incarnation(app, stream))
            return SINK_COMMANDS[arguments.command](arguments, app, landed)
        if arguments.command in INSTALLED_COMMANDS:
            installed = (installed_commands or {}).get(arguments.command)
            if installed is None:
                raise _needs_the_sinks(arguments.command)
            return installed(arguments, app)
        return COMMANDS[arguments.command](arguments, app)
    except (UsageError, ConfigurationError) as error:
        print(f"leasectl: {error}", file=sys.stderr)
        return EXIT_USAGE
    except LeaseCoreError as error:
        print(f"leasectl: {error}", file=sys.stderr)
        return EXIT_FAILED


def _needs_the_sinks(command: str) -> UsageError:
    return UsageError(f"{command} needs the sinks: run the installed `leasectl` command")


def _load(arguments: argparse.Namespace) -> ConsumerConfig:
    overrides = list(arguments.overrides)
    if arguments.app is not None:
        overrides.append(f"application_name={arguments.app}")
    # Command options are overrides too, so they are validated (and named) like any setting.
    if getattr(arguments, "initial_position", None):
        overrides.append(f"initial_position_in_stream={arguments.initial_position}")
    if getattr(arguments, "timestamp", None):
        overrides.append(f"initial_position_timestamp={arguments.timestamp}")
    config = load_config(arguments.config, overrides=overrides)
    config.require_application_name()
    return config


def run_init(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    for name in arguments.streams:  # no tables for a stream that does not exist, as in the DAG's table step
        app.shard_source.describe_stream(name)
    for report in app.tables.ensure_tables():
        verb = "created" if report.created else "exists "
        print(f"{verb}  {report.name}  ({report.role}, {report.status})")
    if app.config.retrieval != "fan_out":
        if arguments.streams:
            print("no stream consumer registered: retrieval is polling (set retrieval = fan_out to use one)")
        return EXIT_OK
    for name in arguments.streams:
        consumer = app.stream_consumers.ensure(name)
        print(f"consumer {consumer.consumer_name}  of stream {name}  ({consumer.status}, {consumer.consumer_arn})")
    if not arguments.streams:
        print(
            "retrieval = fan_out: give --stream NAME to register the stream consumers now (the DAG's table step does)"
        )
    return EXIT_OK


def run_status(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    config = app.config
    scan = app.lease_store.scan_leases()
    report = status_report(config.lease_table, scan)
    layout = app.layout_document()
    conflict = layout["layout"] == CONFLICT
    # In a conflict the coordinator-state records cannot be told where to read: the leases are shown alone.
    consumers = (
        [] if conflict else app.stream_consumers.describe_streams(consumed_stream_names(scan.leases, app.state_store))
    )
    if arguments.json:
        document = {**report.to_dict(), "table_layout": layout, "stream_consumers": [c.to_dict() for c in consumers]}
        print(json.dumps(document, indent=2))
    else:
        print(render_status(report))
        print(
            f"Table layout: {layout['layout']} ({layout['reason']}); "
            f"table migration: {layout['table_migration'] or 'none'}"
        )
        if consumers or (config.retrieval == "fan_out" and not conflict):
            print("\n" + render_stream_consumers(consumers))
    if conflict:
        print(f"leasectl: rounds refuse to run: {layout['reason']}", file=sys.stderr)
        return EXIT_FAILED
    return _exit_status(report.corrupt_items)


def render_stream_consumers(consumers: Sequence[StreamConsumerState]) -> str:
    """The application's enhanced fan-out consumers, one line per stream it registered one on."""
    if not consumers:
        return "Stream consumers: none registered (the DAG's table step or `leasectl init --stream` registers them)"
    lines = ["Stream consumers:"]
    for consumer in consumers:
        created = "-" if consumer.created is None else consumer.created.isoformat(timespec="seconds")
        whose = "ours" if consumer.ours else "NOT OURS" if consumer.consumer_arn else "-"
        lines.append(
            f"  {consumer.stream_name}: {consumer.consumer_name} {consumer.status} {whose} "
            f"arn={consumer.consumer_arn or '-'} created={created}"
        )
        if consumer.consumer_arn is not None and not consumer.ours:
            lines.append(
                f"  WARNING: the consumer {consumer.consumer_name!r} of stream {consumer.stream_name!r} is not the one "
                f"this application registered ({consumer.recorded_arn or 'registration unfinished'})"
            )
    return "\n".join(lines)


def _exit_status(corrupt: Sequence[str]) -> int:
    """EXIT_OK, or EXIT_FAILED naming each lease item the command could not read: its shard is not
    read until the item is repaired, so a script or an operator must not take the run for a clean one."""
    if not corrupt:
        return EXIT_OK
    print(
        f"leasectl: {len(corrupt)} lease item(s) could not be read and were skipped; their shards are not read "
        "until repaired with `leasectl repair --lease KEY [--to POSITION] --yes`: " + "; ".join(corrupt),
        file=sys.stderr,
    )
    return EXIT_FAILED


def run_repair(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    try:
        target = None if arguments.target is None else parse_target(arguments.target)
    except ResetUsageError as error:
        raise UsageError(str(error)) from None
    if not arguments.yes:
        where = "its own checkpoint" if target is None else describe_position(target)
        raise UsageError(
            f"repair would write lease item {arguments.lease!r} of table {app.config.lease_table!r} anew at "
            f"{where}, keeping the attributes that read and dropping the others; add --yes to confirm"
        )
    report = LeaseRepair(app.lease_store, _leader_lock(app, "repair")).run(arguments.lease, target)
    print(json.dumps(report.to_dict(), indent=2) if arguments.json else report.render())
    return EXIT_OK


def _fenced_stores(app: LeaseApplication, leadership: Leadership) -> tuple[LeaseStore, CoordinatorStateStore]:
    """The stores of a command that holds the lock: every write and every retry checks it first."""
    policy = leadership.retry_policy(app.retry_policy)
    return (
        leadership.lease_store(app.lease_store_with(policy)),
        leadership.state_store(app.state_store_with(policy)),
    )


def holding_leader_lock(app: LeaseApplication, command: str) -> AbstractContextManager[Leadership]:
    """The application's leader lock, held for `command` (acquired, heartbeaten, released after it)
    as every command that writes for the application holds it; it fails naming the holder."""
    return hold(_leader_lock(app, command), f"leasectl {command}", acquire=True, release=True)


def _leader_lock(app: LeaseApplication, command: str) -> LeaderLock:
    """The application's leader lock under an owner name unique to this process (containers repeat
    host names and process ids, hence the random part)."""
    return app.leader_lock(f"leasectl-{command}/{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}")


def run_sync(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    config = app.config
    source = app.shard_source
    with hold(_leader_lock(app, "sync"), "leasectl sync", acquire=True, release=True) as leadership:
        store, state = _fenced_stores(app, leadership)
        report = sync_streams(arguments.streams, config, store, source, state)
    if arguments.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render_sync_report(report))
    return _exit_status(tuple(str(error) for error in report.corrupt))


def render_sync_report(report: ShardSyncReport) -> str:
    mode = "multi-stream" if report.multi_stream else "single-stream"
    lines = []
    if report.consumed_stream is not None:
        lines.append(f"stream {report.consumed_stream.stream} ({report.consumed_stream.check.value})")
    for result, cleanup in zip(report.streams, report.cleanups):
        path = "empty lease table" if result.table_was_empty else "existing leases"
        lines.append(f"{result.stream_name}: {result.shards_listed} shard(s) listed ({path}, {mode})")
        if result.listing_incomplete is not None:
            lines.append(
                f"  WARNING: nothing created or deleted: the listing is incomplete ({result.listing_incomplete})"
            )
        lines += [f"  created  {key}" for key in result.created]
        if result.skipped_inconsistent:
            lines.append(f"  skipped (parent still open): {', '.join(result.skipped_inconsistent)}")
        lines += [
            f"  kept     {key} (not listed, but Kinesis still has its shard)" for key in cleanup.unlisted_existing
        ]
        lines += [
            f"  kept     {key} (not listed; Kinesis is asked about it once per garbage_lease_cleanup_interval_millis)"
            for key in cleanup.unlisted_unprobed
        ]
    lines += [f"deleted  {key}" for key in report.deleted]
    lines += [f"kept     {key} (changed since it was judged; judged again next sync)" for key in report.changed]
    lines += [
        f"WARNING: {key} was deleted before reaching SHARD_END; its records may have expired unread"
        for key in report.possibly_unread
    ]
    if report.former_streams is not None:
        lines += [
            f"former stream {stream} pending deletion since {since} ms"
            for stream, since in sorted(report.former_streams.pending.items())
        ]
    lines.append(f"{len(report.created)} lease(s) created, {len(report.deleted)} deleted")
    return "\n".join(lines)


def run_assign(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    config = app.config
    if arguments.slot_count is not None and arguments.slot_count < 1:
        raise UsageError("--workers must be at least 1")
    worker_ids = arguments.workers or slot_ids(config.require_application_name(), arguments.slot_count)
    metrics = app.worker_metrics
    with hold(_leader_lock(app, "assign"), "leasectl assign", acquire=True, release=True) as leadership:
        store, state = _fenced_stores(app, leadership)
        report = AssignmentCoordinator(store, metrics, state, config).run(worker_ids)
    print(json.dumps(report.to_dict(), indent=2) if arguments.json else render_assignment_report(report))
    return _exit_status(report.corrupt_leases)


def render_assignment_report(report: AssignmentReport) -> str:
    lines = [
        f"assignment round {report.round_number} ({report.strategy}, "
        f"{'with' if report.balanced else 'without'} balancing): {len(report.moves)} move(s), "
        f"{report.lost_conditions} lost condition(s)"
    ]
    for move in report.moves:
        outcome = "" if move.applied else "  (lost: the lease changed meanwhile)"
        lines.append(
            f"  {move.write:<7} {move.lease_key}  {move.from_owner or '-'} -> {move.to_owner}  [{move.reason}]{outcome}"
        )
    rows = [
        (
            row.worker_id,
            f"{row.leases_before} -> {row.leases_after}",
            f"{row.load_before_kbps:.3f} -> {row.load_after_kbps:.3f}",
            "-" if row.cpu_percent is None else f"{row.cpu_percent:.1f}",
            row.note or "",
        )
        for row in report.workers
    ]
    header = ("WORKER", "LEASES", "PROJECTED KB/S", "CPU %", "NOTE")
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines.append("")
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (header, *rows)]
    if report.spillover:
        lines.append(f"not assigned this round (limits reached): {', '.join(report.spillover)}")
    return "\n".join(lines)


def run_reset(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    config = app.config
    try:
        target = parse_target(arguments.target)
        selector = LeaseSelector(arguments.shard, arguments.stream)
    except ResetUsageError as error:
        raise UsageError(str(error)) from None
    if not arguments.yes:
        raise UsageError(
            f"reset would set the checkpoint of {selector} in lease table {config.lease_table!r} to "
            f"{describe_position(target)}, discard its prepared batch if it has one, and fence its holder; "
            "moving backwards lands records again, moving forward skips them (see `leasectl status` for the "
            "current checkpoint); add --yes to confirm"
        )
    try:
        report = CheckpointReset(app.lease_store, _leader_lock(app, "reset")).run(selector, target)
    except ResetUsageError as error:
        raise UsageError(str(error)) from None
    print(json.dumps(report.to_dict(), indent=2) if arguments.json else render_reset_report(report))
    return EXIT_OK


def render_reset_report(report: ResetReport) -> str:
    plan, after = report.plan, report.after
    before = plan.before
    lines = [
        f"reset lease {before.lease_key} of table {report.table_name} (owner {after.lease_owner or '(none)'}): "
        f"checkpoint {render_position(before.checkpoint)} -> {render_position(after.checkpoint)} "
        f"({plan.direction.value})",
        f"  lease counter {before.lease_counter} -> {after.lease_counter}: a worker still holding the lease is "
        "fenced (its next renewal or checkpoint fails)",
    ]
    if plan.discarded is not None:
        batch = plan.discarded.batch
        pending = render_position(plan.discarded.pending_checkpoint)
        if batch is None:
            lines.append(f"  discarded the prepared checkpoint {pending}")
        else:
            lines.append(
                f"  discarded the prepared batch ({render_position(batch.start)}, {pending}]: "
                f"{batch.records} record(s), batch {batch.name or '(none)'}"
            )
        lines += [f"    {note}" for note in plan.batch_notes()]
    lines += [f"WARNING: {warning}" for warning in plan.warnings()]
    if report.attempts > 1:
        lines.append(f"(written at attempt {report.attempts}: the lease changed while it was being reset)")
    return "\n".join(lines)


def run_teardown(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    config = app.config
    if not arguments.yes:
        raise UsageError(
            f"teardown deletes every lease and checkpoint of {config.application_name!r}; add --yes to confirm"
        )
    administrator = app.tables
    deleted: list[str] = []
    # Every table is checked to be the application's own before the lock is taken: the lock is
    # written to the coordinator-state table, which may be another application's.
    existing = administrator.verify_tables(TEARDOWN, items=True)
    lock_table, lock_role = _lock_table(app, existing)
    lock = _leader_lock(app, "teardown") if lock_table in existing else None
    try:
        if lock is not None:
            # Under the lock, so never beside a round; the lock's own table goes last, once the others
            # are gone (the lock is never released: nobody can take it before that table is deleted).
            with hold(lock, "leasectl teardown", acquire=True, release=False) as leadership:
                # The consumers first: their records, which prove them ours, are in the coordinator-state table.
                for outcome in app.stream_consumers.deregister_recorded():
                    verb, note = ("deregistered", "") if outcome.deregistered else ("kept", f": {outcome.note}")
                    print(
                        f"{verb}  consumer {outcome.consumer_name} of stream {outcome.stream_name} "
                        f"({outcome.consumer_arn or '-'}){note}"
                    )
                leadership.ensure_held()
                deleted += administrator.delete_tables(
                    roles=tuple(role for role in ROLE_NAMES if role != lock_role), before_delete=leadership.ensure_held
                )
        # Without the lock's table no round can hold the lock (or run: its first step recreates it).
        deleted += administrator.delete_tables()
    except LeaseCoreError:
        if lock is not None:
            # A refused teardown (deletion protection of the lock's own table, ...) must not block every round.
            release_quietly(lock)
        raise
    for name in deleted:
        print(f"deleted  {name}")
    if not deleted:
        print(f"no tables of {config.application_name!r} exist")
    return EXIT_OK


def _lock_table(app: LeaseApplication, existing: Collection[str]) -> tuple[str, str]:
    """Where teardown takes the lock, and that table's role: as the application's layout says (in the
    lease table once KCL 3.5's table migration is COMPLETE, though the separate tables are left). Tables
    that hold both layouts are not refused here, since teardown is the way out of them: the lock is then
    in the coordinator-state table if there is one, and the lock and the consumers' records are read there."""
    config = app.config
    try:
        decision: LayoutDecision | None = app.table_layout
    except LayoutConflictError:
        decision = None
    if decision is not None and decision.layout == SINGLE:
        return config.lease_table, "lease"
    if config.coordinator_state_table in existing:
        if decision is None:
            app.table_layout = LayoutDecision(SEPARATE, "teardown of tables that hold both layouts")
        return config.coordinator_state_table, "coordinator_state"
    app.table_layout = LayoutDecision(SINGLE, f"teardown takes the lock in {config.lease_table!r}")
    return config.lease_table, "lease"


COMMANDS: dict[str, Callable[[argparse.Namespace, LeaseApplication], int]] = {
    "init": run_init,
    "status": run_status,
    "sync": run_sync,
    "assign": run_assign,
    "reset": run_reset,
    "repair": run_repair,
    "teardown": run_teardown,
}


def _incarnation(app: LeaseApplication, stream: str) -> tuple[str, int] | None:
    """The stream's ARN and creation time now; None when Kinesis has no such stream (its leases' records
    in a sink are then of no other incarnation). Throttling and other failures raise: `verify` must not
    judge a re-created stream by its predecessor's positions."""
    try:
        description = app.shard_source.describe_stream(stream)
    except StreamNotFoundError:
        return None
    return description.stream_arn, description.creation_epoch_millis // 1000


def run_verify(arguments: argparse.Namespace, app: LeaseApplication, landed: LandedRecords) -> int:
    leases = app.lease_store.scan_leases().leases
    awaiting = {lease.lease_key: start for lease in leases if (start := landed.awaiting_from(lease)) is not None}
    batches = landed.landed_batches()
    findings = audit_landed(leases, batches, awaiting)
    faults = [finding for finding in findings if finding.finding.is_fault]
    if arguments.json:
        document = {
            "sink": arguments.output_uri,
            "batches": len(batches),
            "leases": len(leases),
            "findings": [
                {"lease_key": f.lease_key, "finding": f.finding.value, "fault": f.finding.is_fault, "detail": f.detail}
                for f in findings
            ],
        }
        print(json.dumps(document, indent=2))
    else:
        print(
            f"{arguments.output_uri}: {len(batches)} batch(es) of {len({b.lease_key for b in batches})} lease(s) "
            f"in the sink, {len(leases)} lease(s) in {app.config.lease_table!r}"
        )
        for finding in findings:
            print(f"  {'FAULT' if finding.finding.is_fault else 'note '}  {finding.render()}")
        print(f"  {len(faults)} fault(s)" if faults else "  the sink and the checkpoints agree")
    return EXIT_FAILED if faults else EXIT_OK


def run_restore(arguments: argparse.Namespace, app: LeaseApplication, landed: LandedRecords) -> int:
    restores, missing = plan_restore(app.lease_store.scan_leases().leases, landed.landed_batches())
    if not arguments.yes:
        raise UsageError(
            f"restore would move {len(restores)} checkpoint(s) of lease table {app.config.lease_table!r} forward "
            f"to what {arguments.output_uri} holds, fencing their holders; add --yes to confirm"
        )
    with hold(_leader_lock(app, "restore"), "leasectl restore", acquire=True, release=True) as leadership:
        store = leadership.lease_store(app.lease_store)
        for restore in restores:
            moved = _restore_one(store, restore.lease.lease_key, restore.target)
            print(f"{'restored' if moved else 'kept    '}  {restore.lease.lease_key}  -> {restore.target}")
    for key in missing:
        print(f"absent    {key}: in the sink, not in the lease table (run `leasectl sync`, then restore again)")
    return EXIT_OK


def _restore_one(store: LeaseStore, lease_key: str, target: ExtendedSequenceNumber) -> bool:
    """Move the lease forward to `target` unless it is there or past it already (read again each try)."""
    for _ in range(RESTORE_ATTEMPTS):
        lease = store.get_lease(lease_key, consistent=True)
        checkpoint = None if lease is None else lease.checkpoint
        if lease is None or checkpoint is None or (not checkpoint.is_sentinel and checkpoint >= target):
            return False
        if checkpoint.is_shard_end:
            return False
        if store.reset_checkpoint(lease, target).applied:
            return True
    raise LeaseCoreError(lease_key, f"its counter kept changing during {RESTORE_ATTEMPTS} attempts to restore it")


def run_maintain(arguments: argparse.Namespace, app: LeaseApplication, landed: LandedRecords) -> int:
    if arguments.orphan_age_hours < 1:
        raise UsageError("--orphan-age-hours must be at least 1: a slot between staging and its commit is not orphaned")
    if arguments.target_file_mib <= 0:
        raise UsageError("--target-file-mib must be positive")
    if not arguments.yes:
        raise UsageError(
            f"maintain would compact the small files of {arguments.output_uri}, expire its old snapshots and delete "
            f"its files that no snapshot and no lease names, older than {arguments.orphan_age_hours:g} h; add --yes "
            "to confirm"
        )
    # Under the lock: no round stages or commits meanwhile, so the leases read now name every batch in flight.
    with hold(_leader_lock(app, "maintain"), "leasectl maintain", acquire=True, release=True) as leadership:
        scan = leadership.lease_store(app.lease_store).scan_leases()
        if scan.corrupt:  # what such an item names is unknown: its staged batches would look orphaned
            print(
                f"leasectl: maintain changed nothing: it removes only files no lease names, and {len(scan.corrupt)} "
                "lease item(s) could not be read; repair them first with `leasectl repair --lease KEY "
                "[--to POSITION] --yes`: " + "; ".join(str(error) for error in scan.corrupt),
                file=sys.stderr,
            )
            return EXIT_FAILED
        orphan_age = timedelta(hours=arguments.orphan_age_hours)
        for line in landed.maintain(scan.leases, orphan_age, int(arguments.target_file_mib * 1024 * 1024)):
            print(line)
    return EXIT_OK


RESTORE_ATTEMPTS = 5
SINK_COMMANDS: dict[str, Callable[[argparse.Namespace, LeaseApplication, LandedRecords], int]] = {
    "verify": run_verify,
    "restore": run_restore,
    "maintain": run_maintain,
}


def console_main() -> None:
    sys.exit(main())
