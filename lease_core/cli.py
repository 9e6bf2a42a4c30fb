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
from lease_core.dynamodb_store import DynamoDBLeaseStore
from lease_core.errors import ConfigurationError, LeaseCoreError
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


def run_status(arguments: argparse.Namespace, config: ConsumerConfig) -> int:
    store = DynamoDBLeaseStore(
        aws.client("dynamodb", config),
        config.lease_table,
        retry_policy=aws.retry_policy(config),
        consistent_reads=config.consistent_reads,
        scan_total_segments=config.lease_table_scan_total_segments,
    )
    report = status_report(config.lease_table, store.scan_leases())
    print(json.dumps(report.to_dict(), indent=2) if arguments.json else render_status(report))
    return EXIT_OK


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
    "teardown": run_teardown,
}


def console_main() -> None:
    sys.exit(main())
