"""The round's metrics through Airflow's own metrics backend: StatsD, Datadog or OpenTelemetry, whatever
`[metrics]` in airflow.cfg configures (docs/metrics.md, "Airflow's metrics backend").

The values are `lease_core.metrics.round_metrics`' own, all of them: Airflow's `[metrics]` allow and
block lists choose among them, as they do among Airflow's metrics (the KCL level and dimension
settings are CloudWatch's). Each goes out as Airflow names its own: `kinesis_lease.<Operation>.<Metric>`
with its dimensions as tags (`application`, `shard_id`, `stream_id`, `worker_id`), for the backends
that keep tags (OpenTelemetry, Datadog, StatsD with InfluxDB tags); and, while Airflow's
`legacy_names_on` is true (its default), once more under the name with the tags' values in it,
`kinesis_lease.<Operation>.<Metric>.<application>[.<stream id>][.<shard id> | .<worker id>]`, for a
plain StatsD, which drops tags (a `.` in a value becomes `__`, as in Airflow's legacy names).

Counts go out as counters (`incr` by the value), levels as gauges and durations as timers, in
milliseconds; a value accumulated over several samples (`ApplicationTracker` `MillisBehindLatest`, one
per lease) goes out as its sum when it is a count and as its maximum otherwise. Nothing here fails a
round: a backend that cannot send is logged and reported in the round's summary.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from airflow.sdk.configuration import conf
from airflow.sdk.observability import stats

from lease_core.metrics.round_metrics import SHARD_ID, STREAM_ID, WORKER_IDENTIFIER, Kind, MetricValue

log = logging.getLogger(__name__)

PREFIX = "kinesis_lease"
TAG_NAMES = {SHARD_ID: "shard_id", STREAM_ID: "stream_id", WORKER_IDENTIFIER: "worker_id"}
_NOT_IN_A_NAME = re.compile(r"[^a-zA-Z0-9_-]")


def stat_name(value: MetricValue) -> str:
    return f"{PREFIX}.{value.metric.operation}.{value.metric.name}"


def tags_of(value: MetricValue, application: str) -> dict[str, str]:
    return {"application": application, **{TAG_NAMES[name]: text for name, text in value.dimensions}}


def name_with_tags(value: MetricValue, application: str) -> str:
    """The name with the tags' values in it, for a StatsD without tags."""
    parts = [application, *(text for _, text in value.dimensions)]
    return ".".join([stat_name(value), *(_NOT_IN_A_NAME.sub("_", part.replace(".", "__")) for part in parts)])


def emit_round_metrics(values: Sequence[MetricValue], application: str) -> dict[str, Any]:
    """Send every value to Airflow's backend; what was sent, and the error that stopped it (None: none)."""
    legacy = conf.getboolean("metrics", "legacy_names_on", fallback=True)
    sent = 0
    try:
        for value in values:
            _emit(stat_name(value), value, tags_of(value, application))
            if legacy:
                _emit(name_with_tags(value, application), value, None)
            sent += 1
    except Exception as error:  # a metrics backend must never fail the round
        log.warning(
            "%d of %d metric value(s) were not sent to Airflow's metrics backend: %s",
            len(values) - sent,
            len(values),
            error,
        )
        return {"values": len(values), "sent": sent, "error": f"{type(error).__name__}: {error}"}
    return {"values": len(values), "sent": sent, "error": None}


def _emit(name: str, value: MetricValue, tags: dict[str, str] | None) -> None:
    statistics, kind = value.statistics, value.metric.kind
    if kind is Kind.COUNT:
        stats.incr(name, count=int(statistics.sum), tags=tags)
    elif kind is Kind.TIMING:
        stats.timing(name, statistics.maximum, tags=tags)
    else:
        stats.gauge(name, statistics.maximum, tags=tags)
