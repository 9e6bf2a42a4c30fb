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

This file is an example of `kinesis_lease.pipeline.kinesis_pipeline`, the one call that builds a
pipeline; write your own DAG files with it, one per stream or application. Here the defaults come
from `KINESIS_PIPELINE_*` environment variables (read when the file is parsed, no I/O): `STREAMS`
(comma-separated), `APPLICATION`, `WORKERS`, `OUTPUT_URI`, `SCHEDULE` (cron, or `none` for manual
runs only), `INITIAL_POSITION`, `STRATEGY`.
"""

from __future__ import annotations

import os

# Airflow parses only files that name both `airflow` and `dag` (its safe mode): this import does.
from airflow.sdk import DAG
from kinesis_lease.pipeline import DEFAULT_SCHEDULE, kinesis_pipeline

from lease_core.config.settings import LEASE_ASSIGNMENT_STRATEGIES

DAG_ID = "kinesis_lease_pipeline"
# Not under KINESIS_LEASE_: that prefix belongs to the consumer's settings, and every name under it
# must be a setting (lease_core.config.settings refuses unknown ones).
ENV_PREFIX = "KINESIS_PIPELINE_"


def _default(name: str, fallback: str) -> str:
    return os.environ.get(ENV_PREFIX + name, fallback)


def _schedule() -> str | None:
    schedule = _default("SCHEDULE", DEFAULT_SCHEDULE)
    return None if schedule.strip().lower() in ("", "none", "null") else schedule


dag: DAG = kinesis_pipeline(
    DAG_ID,
    streams=[name.strip() for name in _default("STREAMS", "orders").split(",") if name.strip()],
    application_name=_default("APPLICATION", "kinesis-lease-app"),
    output_uri=_default("OUTPUT_URI", "/tmp/kinesis-lease/output"),
    schedule=_schedule(),
    num_workers=int(_default("WORKERS", "2")),
    initial_position=_default("INITIAL_POSITION", "LATEST"),
    lease_assignment_strategy=_default("STRATEGY", LEASE_ASSIGNMENT_STRATEGIES[0]),
    doc_md=__doc__,
)
