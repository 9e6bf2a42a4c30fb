"""`kinesis-lease`: the project's own command for trying it out locally (`leasectl` operates lease tables).

    kinesis-lease local up [--kinesis auto|kinesis-mock|moto] [--kinesis-mock DIR] [--state-dir DIR]
    kinesis-lease local status [--json] [--state-dir DIR]
    kinesis-lease local env [--spark-master MASTER] [--state-dir DIR]
    kinesis-lease local create-stream NAME [--shards N] [--state-dir DIR]
    kinesis-lease local down [--state-dir DIR]

`up` and `env` print `export` lines (everything else they print is a `#` comment), so
`eval "$(kinesis-lease local up)"` starts the trial and sets the shell's environment at once.
Exit status: 0 success, 1 the trial does not run or refused, 2 usage errors and missing packages.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import boto3

from kinesis_lease.local_trial.emulators import RESHARD_OPERATIONS
from kinesis_lease.local_trial.environment import CREDENTIALS, REGION, SPARK_MASTER, export_lines, trial_environment
from kinesis_lease.local_trial.streams import create_stream
from kinesis_lease.local_trial.trial import (
    DEFAULT_STATE_DIR,
    KINESIS_CHOICES,
    KINESIS_MOCK,
    LocalTrial,
    Service,
    TrialError,
    TrialState,
)
from lease_core.ops.command_line import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ArgumentParser, UsageError

PROGRAM = "kinesis-lease"
NOT_RUNNING = "no local trial runs here: start one with `kinesis-lease local up`"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=PROGRAM, description="Try kinesis-lease-batch locally, on emulators.")
    groups = parser.add_subparsers(dest="group", metavar="GROUP", required=True)
    local = groups.add_parser("local", help="AWS emulators on loopback for a local trial (the `local` extra)")
    state = ArgumentParser(add_help=False)
    state.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where the trial records its processes and logs (default {DEFAULT_STATE_DIR})",
    )
    spark = ArgumentParser(add_help=False)
    spark.add_argument("--spark-master", default=SPARK_MASTER, help=f"spark_default's master (default {SPARK_MASTER})")
    commands = local.add_subparsers(dest="command", metavar="COMMAND", required=True)
    up = commands.add_parser(
        "up", parents=[state, spark], help="start the emulators in the background (or say which run); print the env"
    )
    up.add_argument(
        "--kinesis",
        choices=KINESIS_CHOICES,
        default="auto",
        help="Kinesis' emulator: kinesis-mock (needs Node.js), moto's (cannot reshard), or the first if it can run",
    )
    up.add_argument("--kinesis-mock", type=Path, metavar="DIR", help="the folder kinesis-mock was npm-installed into")
    status = commands.add_parser("status", parents=[state], help="what runs, and whether it is still the trial's")
    status.add_argument("--json", action="store_true", help="as a JSON document")
    commands.add_parser("env", parents=[state, spark], help="print the environment of the running trial")
    stream = commands.add_parser("create-stream", parents=[state], help="create a stream and wait until it is ACTIVE")
    stream.add_argument("name")
    stream.add_argument("--shards", type=int, default=1)
    commands.add_parser("down", parents=[state], help="stop the processes `up` started, and nothing else")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        arguments = build_parser().parse_args(argv)
    except UsageError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return EXIT_USAGE
    trial = LocalTrial(arguments.state_dir)
    return COMMANDS[arguments.command](trial, arguments)


def run_up(trial: LocalTrial, arguments: argparse.Namespace) -> int:
    try:
        state, started = trial.up(arguments.kinesis, arguments.kinesis_mock)
    except TrialError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"# local trial {'started' if started else 'already running'} (state in {trial.state_dir})")
    _describe(trial, state)
    print('# Set this environment in your shell: eval "$(kinesis-lease local env)"')
    _print_environment(state, arguments.spark_master)
    return EXIT_OK


def run_status(trial: LocalTrial, arguments: argparse.Namespace) -> int:
    state = trial.state()
    running = state is not None and state.running()
    if arguments.json:
        document = {"running": running, "state_dir": str(trial.state_dir)}
        if state is not None:
            document |= {
                "kinesis": state.kinesis,
                "services": [_service_document(service) for service in state.services],
                "environment": trial_environment(state.endpoints),
            }
        print(json.dumps(document, indent=2))
    elif state is None:
        print(f"# {NOT_RUNNING} (no state in {trial.state_dir})")
    else:
        print(f"# local trial {'running' if running else 'NOT running'} (state in {trial.state_dir})")
        _describe(trial, state)
    return EXIT_OK if running else EXIT_FAILED


def run_env(trial: LocalTrial, arguments: argparse.Namespace) -> int:
    state = trial.state()
    if state is None or not state.running():
        print(f"{PROGRAM}: {NOT_RUNNING}", file=sys.stderr)
        return EXIT_FAILED
    _print_environment(state, arguments.spark_master)
    return EXIT_OK


def run_create_stream(trial: LocalTrial, arguments: argparse.Namespace) -> int:
    state = trial.state()
    if state is None or not state.running():
        print(f"{PROGRAM}: {NOT_RUNNING}", file=sys.stderr)
        return EXIT_FAILED
    kinesis = boto3.client(
        "kinesis",
        endpoint_url=state.endpoints.kinesis,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS,
        aws_secret_access_key=CREDENTIALS,
    )
    try:
        create_stream(kinesis, arguments.name, arguments.shards)
    except kinesis.exceptions.ResourceInUseException:
        print(f"{PROGRAM}: stream {arguments.name!r} exists already", file=sys.stderr)
        return EXIT_FAILED
    except kinesis.exceptions.ClientError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"# stream {arguments.name!r}: {arguments.shards} shard(s), ACTIVE, on {state.endpoints.kinesis}")
    return EXIT_OK


def run_down(trial: LocalTrial, arguments: argparse.Namespace) -> int:
    outcome = trial.down()
    if outcome is None:
        print(f"# nothing to stop: no local trial state in {trial.state_dir}")
        return EXIT_OK
    for service in outcome.stopped:
        print(f"# stopped {service.name} (PID {service.pid}, {service.endpoint})")
    for service in outcome.gone:
        print(f"# {service.name} (PID {service.pid}) had ended already; whatever has that PID now was left alone")
    return EXIT_OK


def _service_document(service: Service) -> dict[str, object]:
    document: dict[str, object] = {"name": service.name, "pid": service.pid, "endpoint": service.endpoint}
    return document | {"log": service.log, "running": service.process() is not None}


def _describe(trial: LocalTrial, state: TrialState) -> None:
    for service in state.services:
        health = "running" if service.process() is not None else "ENDED"
        where = f"PID {service.pid}, {service.endpoint}, {health}, log {service.log}"
        print(f"#   {state.served_by(service)}: {service.name}, {where}")
    if state.kinesis != KINESIS_MOCK:
        print(
            f"#   Kinesis is moto's, which refuses {', '.join(RESHARD_OPERATIONS)}; to reshard, run the trial on "
            f"kinesis-mock (`down`, then `up --kinesis kinesis-mock`); to get it, {trial.kinesis_mock_hint()}"
        )


def _print_environment(state: TrialState, spark_master: str) -> None:
    print("\n".join(export_lines(trial_environment(state.endpoints, spark_master))))


COMMANDS = {"up": run_up, "status": run_status, "env": run_env, "create-stream": run_create_stream, "down": run_down}


def console_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    console_main()
