"""The installed `leasectl`: lease_core's commands (`lease_core.ops.cli`), with `verify`, `restore` and
`maintain` reading the application's sink, which lives here, above lease_core, and
`replay-dead-letters` (`spark_jobs.dead_letter_replay`) writing to it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import timedelta

from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import ConfigurationError
from lease_core.model.lease import Lease
from lease_core.model.sequence import ExtendedSequenceNumber
from lease_core.ops.cli import holding_leader_lock
from lease_core.ops.cli import main as lease_main
from lease_core.ops.command_line import EXIT_FAILED, EXIT_OK, UsageError
from lease_core.ops.landed_audit import LandedBatch, LandedRecords, StreamLookup
from sinks import open_sink
from sinks.errors import SinkError
from sinks.registry import Upkeep, format_of
from sinks.table.committer import TableCommitter
from spark_jobs.dead_letter_replay import DeadLetterReplay, Processing, is_replay_lease
from spark_jobs.errors import TransformError


class TableRecords:
    """A table sink as leasectl's sink commands use it: its record of what landed, judged against the
    streams it names as they are now (looked up at the first question that needs them: `maintain`
    asks none), and its upkeep."""

    def __init__(self, sink: TableCommitter, upkeep: Upkeep, lookup: StreamLookup) -> None:
        self.sink = sink
        self.upkeep = upkeep
        self.lookup = lookup
        self._streams_known = False

    def landed_batches(self) -> list[LandedBatch]:
        """The batches of the lease table's leases: a dead-letter replay's pseudo leases are no lease's,
        and their batches do not chain (each starts at its own first record)."""
        self._know_streams()
        return [batch for batch in self.sink.landed_batches() if not is_replay_lease(batch.lease_key)]

    def awaiting_from(self, lease: Lease) -> ExtendedSequenceNumber | None:
        self._know_streams()
        return self.sink.awaiting_from(lease)

    def maintain(self, leases: Sequence[Lease], orphan_age: timedelta, target_file_bytes: int) -> list[str]:
        return self.upkeep(self.sink, leases, orphan_age, target_file_bytes)

    def _know_streams(self) -> None:
        if not self._streams_known:
            names = sorted(self.sink.stream_names())
            self.sink.streams = {name: found for name in names if (found := self.lookup(name)) is not None}
            self._streams_known = True


def open_landed(output_uri: str, config: ConsumerConfig, lookup: StreamLookup) -> LandedRecords:
    """The sink at `output_uri`, if it records what landed, judged against the streams it names as they
    are now (`lookup`); `ConfigurationError` naming the option otherwise."""
    try:
        sink = open_sink(output_uri, config=config)
        upkeep = format_of(output_uri).upkeep
    except SinkError as error:
        raise ConfigurationError("output_uri", error.problem) from None
    if not isinstance(sink, TableCommitter) or upkeep is None:
        raise ConfigurationError(
            "output_uri", f"{output_uri!r} is a Parquet dataset, which does not record what landed; only table sinks do"
        )
    return TableRecords(sink, upkeep, lookup)


def run_replay_dead_letters(arguments: argparse.Namespace, app: LeaseApplication) -> int:
    try:
        processing = Processing.load(arguments.decode, arguments.transform, arguments.decode_options)
        replay = DeadLetterReplay.open(arguments.output_uri, app.config, processing)
    except TransformError as error:
        raise UsageError(str(error)) from None
    except SinkError as error:
        raise ConfigurationError("output_uri", error.problem) from None
    if arguments.dry_run:
        report = replay.run(stream=arguments.stream, dry_run=True)
    else:
        with holding_leader_lock(app, "replay-dead-letters") as leadership:
            report = replay.run(stream=arguments.stream, ensure_held=leadership.ensure_held)
    print(report.render())
    return EXIT_OK if report.complete else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    return lease_main(
        argv, open_landed=open_landed, installed_commands={"replay-dead-letters": run_replay_dead_letters}
    )


def console_main() -> None:
    sys.exit(main())
