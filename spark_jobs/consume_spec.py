"""Everything a slot task needs to know, resolved once on the driver and shipped to the executors.

A frozen value of plain data: it pickles into every task, and each executor rebuilds and
re-validates the `ConsumerConfig` from it, so the driver and the executors never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lease_core.config.settings import ConsumerConfig, load_config, parse_iso_timestamp
from lease_core.sync.step import is_multi_stream
from spark_jobs.lease_consumer import LeaseBudget
from spark_jobs.record_processing import RecordProcessing

# boto3's endpoint variables, most specific first. The driver resolves them into the configuration
# so that executors on other machines (a Spark cluster) reach the same endpoints as the driver.
_ENDPOINT_VARIABLES = {
    "dynamodb": ("AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL"),
    "kinesis": ("AWS_ENDPOINT_URL_KINESIS", "AWS_ENDPOINT_URL"),
    "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
}


@dataclass(frozen=True)
class ConsumeSpec:
    streams: tuple[str, ...]
    num_workers: int
    output_uri: str
    round_number: int
    budget: LeaseBudget = field(default_factory=LeaseBudget)
    # Leases a slot reads at once; None: every lease it holds, up to 64. A reader spends most of its time waiting
    # for Kinesis' per-shard cap (bench/catch_up_round.py: 32 leases per slot read 8 at a time took
    # 4.2x the bound, all at once 1.25x), so threads are cheap in CPU, and in memory too: each lease's
    # batches share `slot_buffer_bytes`, its GetRecords answers are cut to that share, and Arrow allocates
    # with the system's allocator (the consume job's executor environment), not per thread (docs/performance.md,
    # "Memory").
    lease_threads: int | None = None
    # Leases of a slot in a CPU-heavy step at once (a GetRecords and its parsing, building a file): the
    # others wait for Kinesis or for a lane. 64 leases parsing at once starved the slot's heartbeat of
    # the interpreter: no renewal for 10 s, leases lost (bench/catch_up_round.py --seconds 60).
    busy_leases: int = 8
    # Record bytes a slot holds in its leases' batches at once: each of the N leases it reads at once
    # batches at most 1/N of it (at least 1 MiB, and at most `budget.file_max_bytes`), and asks GetRecords
    # for no more than that share. What bounds the slot's memory, with the copies a batch goes through on
    # its way to a file: the peak RSS a slot adds is about 2.7 x max(this, N x 1 MiB) + 160 MiB (a catch-up of
    # 64 shards: 850 MiB at 256 MiB, 330 at 64; docs/performance.md, "Memory").
    slot_buffer_bytes: int = 256 * 1024 * 1024
    processing: RecordProcessing = field(default_factory=RecordProcessing)  # how records become rows
    settings: Mapping[str, Any] = field(default_factory=dict)
    # Whether every slot of the round runs at once (enough task slots), and the leases of closed shards
    # the round's slots hold (the driver's look at round start): then slots out of work wait for those
    # to end and take up their children (`lease_core.lifecycle.parent_watch`).
    slots_run_together: bool = False
    closing_parents: tuple[str, ...] = ()
    # The round's closed shards as the driver listed them at round start: lease key -> the shard's known
    # EndingSequenceNumber or None. A slot reads these to their end (`ShardToRead.closed`).
    closed_shards: Mapping[str, str | None] = field(default_factory=dict)
    # The sink's configuration as the driver resolved it (`sinks.sink_configuration`: an
    # Iceberg catalog's properties), so that executors on other machines open the same sink; None:
    # each opens it from its own machine's configuration.
    sink_configuration: Mapping[str, str] | None = None
    # The streams' ARNs and creation times at round start (`spark_jobs.round_publication`), so that the
    # sink tells a stream created again under its name from the one it replaced.
    stream_incarnations: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # Under retrieval = fan_out, the ARN of the application's consumer of each stream as the driver
    # looked it up at round start (`StreamConsumers.arn`): a consumer missing, not ACTIVE or not the
    # application's fails the round there, before any lease moves, and the slots subscribe with it
    # without a DescribeStreamConsumer each.
    stream_consumer_arns: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.streams:
            raise ValueError("at least one stream is needed")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {self.num_workers}")
        if self.lease_threads is not None and self.lease_threads < 1:
            raise ValueError(
                f"lease_threads must be at least 1 (or None: every lease at once), got {self.lease_threads}"
            )
        if self.busy_leases < 1:
            raise ValueError(f"busy_leases must be at least 1, got {self.busy_leases}")
        if self.slot_buffer_bytes < 1:
            raise ValueError(f"slot_buffer_bytes must be at least 1, got {self.slot_buffer_bytes}")

    @property
    def config(self) -> ConsumerConfig:
        return load_config(environ={}, overrides=dict(self.settings))

    @property
    def application_name(self) -> str:
        return self.config.require_application_name()

    @property
    def multi_stream(self) -> bool:
        return is_multi_stream(self.config, self.streams)

    @property
    def at_timestamp(self) -> datetime | None:
        timestamp = self.config.initial_position_timestamp
        return None if timestamp is None else parse_iso_timestamp(timestamp)


def settings_for_executors(config: ConsumerConfig, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The configuration as data, with endpoints the driver resolved from its environment filled in."""
    environ = os.environ if environ is None else environ
    changes: dict[str, Any] = {}
    for service, variables in _ENDPOINT_VARIABLES.items():
        key = f"aws_endpoint_url_{service}"
        if getattr(config, key) is None:
            found = next((environ[name] for name in variables if environ.get(name)), None)
            if found is not None:
                changes[key] = found
    if config.aws_region is None and environ.get("AWS_DEFAULT_REGION"):
        changes["aws_region"] = environ["AWS_DEFAULT_REGION"]
    return (config.with_overrides(**changes) if changes else config).to_dict()
