"""`leasectl`: operate an application's lease tables from the command line.

    leasectl [--app APP] [--config FILE] [--set KEY=VALUE ...] COMMAND

Exit status: 0 on success, 1 when AWS or the tables say no, 2 for usage and configuration errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence

from lease_core import aws
from lease_core.config import ConsumerConfig, load_config
from lease_core.coordinator_state import DynamoDBCoordinatorStateStore
from lease_core.dynamodb_store import DynamoDBLeaseStore
from lease_core.errors import ConfigurationError, LeaseCoreError
from lease_core.shard_source import KinesisShardSource
from lease_core.shard_sync_step import ShardSyncReport, sync_streams
from lease_core.status import render_status, status_report
from lease_core.tables import TableAdministrator

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class _UsageError(Exception):
    pass


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit; we map it to our exit status
        raise _UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="leasectl", description="Operate the KCL-compatible lease tables of an application.")
    parser.add_argument("--app", help="application name (the lease table's name unless lease_table_name is set)")
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    parser.add_argument(
        "--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides", help="override a setting"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser("init", help="create the lease, worker-metrics and coordinator-state tables")
    status = commands.add_parser("status", help="leases per owner with counts, throughput and checkpoints")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    sync = commands.add_parser("sync", help="one full shard sync of the given streams now (no auditor)")
    sync.add_argument("--stream", action="append", required=True, dest="streams", metavar="NAME",
                      help="stream to sync; more than one selects multi-stream mode")
    sync.add_argument("--initial-position", choices=["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"],
                      help="where new leases start (default: initial_position_in_stream)")
    sync.add_argument("--timestamp", metavar="ISO8601", help="the time AT_TIMESTAMP starts at")
    sync.add_argument("--json", action="store_true", help="print the report as JSON")
    teardown = commands.add_parser("teardown", help="delete the application's three tables")
    teardown.add_argument("--yes", action="store_true", help="confirm the deletion")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        arguments = build_parser().parse_args(argv)
        config = _load(arguments)
        return COMMANDS[arguments.command](arguments, config)
    except (_UsageError, ConfigurationError) as error:
        print(f"leasectl: {error}", file=sys.stderr)
        return EXIT_USAGE
    except LeaseCoreError as error:
        print(f"leasectl: {error}", file=sys.stderr)
        return EXIT_FAILED


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


def _administrator(config: ConsumerConfig) -> TableAdministrator:
    return TableAdministrator(aws.client("dynamodb", config), config, retry_policy=aws.retry_policy(config))


def run_init(arguments: argparse.Namespace, config: ConsumerConfig) -> int:
    for report in _administrator(config).ensure_tables():
        verb = "created" if report.created else "exists "
        print(f"{verb}  {report.name}  ({report.role}, {report.status})")
    return EXIT_OK


def _lease_store(config: ConsumerConfig) -> DynamoDBLeaseStore:
    return DynamoDBLeaseStore(
        aws.client("dynamodb", config),
        config.lease_table,
        retry_policy=aws.retry_policy(config),
        consistent_reads=config.consistent_reads,
        scan_total_segments=config.lease_table_scan_total_segments,
    )


def run_status(arguments: argparse.Namespace, config: ConsumerConfig) -> int:
    report = status_report(config.lease_table, _lease_store(config).scan_leases())
    print(json.dumps(report.to_dict(), indent=2) if arguments.json else render_status(report))
    return EXIT_OK


def run_sync(arguments: argparse.Namespace, config: ConsumerConfig) -> int:
    policy = aws.retry_policy(config)
    report = sync_streams(
        arguments.streams,
        config,
        _lease_store(config),
        KinesisShardSource(aws.client("kinesis", config), retry_policy=policy),
        DynamoDBCoordinatorStateStore(aws.client("dynamodb", config), config.coordinator_state_table, policy),
    )
    if arguments.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render_sync_report(report))
    return EXIT_OK


def render_sync_report(report: ShardSyncReport) -> str:
    mode = "multi-stream" if report.multi_stream else "single-stream"
    lines = []
    for result in report.streams:
        path = "empty lease table" if result.table_was_empty else "existing leases"
        lines.append(f"{result.stream_name}: {result.shards_listed} shard(s) listed ({path}, {mode})")
        lines += [f"  created  {key}" for key in result.created]
        if result.skipped_inconsistent:
            lines.append(f"  skipped (parent still open): {', '.join(result.skipped_inconsistent)}")
    lines += [f"deleted  {key}" for key in report.deleted]
    lines += [f"WARNING: {key} was deleted before reaching SHARD_END; its records may have expired unread"
              for key in report.possibly_unread]
    if report.former_streams is not None:
        lines += [f"former stream {stream} pending deletion since {since} ms"
                  for stream, since in sorted(report.former_streams.pending.items())]
    lines.append(f"{len(report.created)} lease(s) created, {len(report.deleted)} deleted")
    return "\n".join(lines)


def run_teardown(arguments: argparse.Namespace, config: ConsumerConfig) -> int:
    if not arguments.yes:
        raise _UsageError(
            f"teardown deletes every lease and checkpoint of {config.application_name!r}; add --yes to confirm"
        )
    deleted = _administrator(config).delete_tables()
    for name in deleted:
        print(f"deleted  {name}")
    if not deleted:
        print(f"no tables of {config.application_name!r} exist")
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace, ConsumerConfig], int]] = {
    "init": run_init,
    "status": run_status,
    "sync": run_sync,
    "teardown": run_teardown,
}


def console_main() -> None:
    sys.exit(main())
