"""What one DAG run does, decided once from its params: the live round or a manual backfill.

A backfill replays [start, end) of the streams into its own lease namespace and output prefix, both
pure functions of the application and the window: triggering the same window again finds the same
leases at their checkpoints and lands nothing twice, and the live application's leases and output
are never touched. Its leases start AT_TIMESTAMP start, and its slots stop before the first record
that arrived at or after end. Windows that differ by as little as a microsecond get different
namespaces: sharing one, the second window would find the first's checkpoints and land nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from lease_core.config.settings import (
    COORDINATOR_STATE_TABLE_SUFFIX,
    WORKER_METRICS_TABLE_SUFFIX,
    ConsumerConfig,
    parse_iso_timestamp,
)
from lease_core.errors import ConfigurationError
from sinks import backfill_uri, check_sink_uri
from sinks.dead_lettering import dead_letter_uri
from sinks.errors import SinkError
from spark_jobs.record_processing import RecordProcessing

MODES = ("live", "backfill")
# Params that are configuration keys of the consumer, passed through under the same name.
_SETTING_PARAMS = ("lease_assignment_strategy",)
# The application name names three DynamoDB tables (at most 255 characters each), two with a suffix.
_MAX_APPLICATION_NAME = 255 - max(len(WORKER_METRICS_TABLE_SUFFIX), len(COORDINATOR_STATE_TABLE_SUFFIX))


@dataclass(frozen=True)
class RoundPlan:
    mode: str
    application_name: str
    streams: list[str]
    num_workers: int
    output_uri: str
    settings: dict[str, Any]
    stop_at_arrival: str | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    processing: RecordProcessing = field(default_factory=RecordProcessing)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_round(params: Mapping[str, Any], pipeline_settings: Mapping[str, Any] | None = None) -> RoundPlan:
    """The run's plan from its params; `ConfigurationError` naming the param when one is wrong.
    `pipeline_settings`: the pipeline's own consumer settings (`kinesis_lease.pipeline`), under what
    the params set."""
    mode = params.get("mode") or "live"
    if mode not in MODES:
        raise ConfigurationError("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    application = _application_name(params)
    streams = stream_names(params.get("streams"))
    output_uri = _output_uri(params)
    settings: dict[str, Any] = dict(pipeline_settings or {})
    settings.update({key: params[key] for key in _SETTING_PARAMS if params.get(key) is not None})
    settings["initial_position_in_stream"] = params.get("initial_position") or "LATEST"
    if params.get("at_timestamp"):
        settings["initial_position_timestamp"] = params["at_timestamp"]
    limits = {
        key: params[key]
        for key in ("max_records_per_lease", "max_bytes_per_lease", "max_seconds_per_lease")
        if params.get(key) is not None
    }
    processing = _processing(params, output_uri)
    workers = params.get("num_workers")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigurationError("num_workers", f"must be an integer of at least 1, got {workers!r}")
    if mode == "live":
        return RoundPlan(
            mode,
            application,
            streams,
            workers,
            output_uri,
            {**settings, "application_name": application},
            None,
            limits,
            processing,
        )
    start, end = _window(params)
    window = _window_name(start, end)
    backfill_application = _backfill_application(application, window)
    settings.update(
        application_name=backfill_application,
        initial_position_in_stream="AT_TIMESTAMP",
        initial_position_timestamp=start.isoformat(),
        # A replay of history: its lag and freshness would trip the live application's alarms.
        metrics_level="NONE",
    )
    try:
        backfill_output = backfill_uri(output_uri, window)
    except SinkError as error:
        raise ConfigurationError("output_uri", f"{error.problem}, got {output_uri!r}") from None
    return RoundPlan(
        mode,
        backfill_application,
        streams,
        workers,
        backfill_output,
        settings,
        end.isoformat(),
        limits,
        processing,
    )


def stream_names(value: Any) -> list[str]:
    """Streams as a list, from a list or a comma-separated string (what a trigger form may send)."""
    names = value.split(",") if isinstance(value, str) else list(value or [])
    names = [str(name).strip() for name in names if str(name).strip()]
    if not names:
        raise ConfigurationError("streams", "at least one stream name is needed")
    return names


def _required_text(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(key, f"is required, got {value!r}")
    return value.strip()


def _application_name(params: Mapping[str, Any]) -> str:
    """The application name, checked as the configuration checks it (it names three DynamoDB tables)."""
    name = _required_text(params, "application_name")
    ConsumerConfig(application_name=name)  # ConfigurationError naming application_name
    return name


def _processing(params: Mapping[str, Any], output_uri: str) -> RecordProcessing:
    """How the round turns records into rows (`spark_jobs.record_processing`), checked, with the dead
    letters' place beside the output when records are set aside there."""
    processing = RecordProcessing.from_options(params)
    if processing.bad_records == "dead_letter":
        try:
            dead_letter_uri(output_uri)
        except SinkError as error:
            raise ConfigurationError("bad_records", f"{error.problem}, got output_uri {output_uri!r}") from None
    return processing


def _output_uri(params: Mapping[str, Any]) -> str:
    """The sink's URI, in a form a sink writes to (checked here, not after the round's first steps)."""
    try:
        return check_sink_uri(_required_text(params, "output_uri"))
    except SinkError as error:
        raise ConfigurationError("output_uri", f"{error.problem}, got {params.get('output_uri')!r}") from None


def _window(params: Mapping[str, Any]) -> tuple[datetime, datetime]:
    moments = []
    for key in ("start", "end"):
        text = params.get(key)
        if not text:
            raise ConfigurationError(key, "is required for a backfill (an ISO 8601 time with a time zone)")
        try:
            moments.append(parse_iso_timestamp(str(text)).astimezone(UTC))
        except ValueError as error:
            raise ConfigurationError(key, str(error)) from None
    start, end = moments
    if not start < end:
        raise ConfigurationError("end", f"must be after start ({start.isoformat()}), got {end.isoformat()}")
    return start, end


def _window_name(start: datetime, end: datetime) -> str:
    """The window's part of its namespace: a different text for every pair of UTC instants, the same
    text for the same pair.

    A whole-second window keeps the names backfills have always had (`20261120T000000Z-...`, the
    only shape docs/iam-policy.json grants), so existing namespaces stay valid. A window with a
    fraction of a second in either bound writes both bounds with microseconds (ISO 8601 basic format
    with a decimal fraction), the precision `parse_iso_timestamp` keeps: names come in two shapes,
    told apart by the `.`, and each shape has fixed-width fields.
    """
    shape = "%Y%m%dT%H%M%S.%fZ" if start.microsecond or end.microsecond else "%Y%m%dT%H%M%SZ"
    return f"{start.strftime(shape)}-{end.strftime(shape)}"


def _backfill_application(application: str, window: str) -> str:
    """The backfill's application name; `ConfigurationError` when it is too long to name its tables."""
    name = f"{application}-backfill-{window}"
    if len(name) > _MAX_APPLICATION_NAME:
        raise ConfigurationError(
            "application_name",
            f"is too long for a backfill: the window's application {name!r} has {len(name)} characters, "
            f"at most {_MAX_APPLICATION_NAME} fit a DynamoDB table name with its suffixes",
        )
    return name
