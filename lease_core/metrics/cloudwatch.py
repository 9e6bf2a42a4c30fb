"""The round's metrics to CloudWatch, as KCL publishes them (docs/metrics.md, "CloudWatch, as KCL publishes it").

`cloudwatch_batches` (pure) turns the values `kcl_filtered` kept into PutMetricData requests: each value
a MetricDatum with its dimensions (`Operation` first), its unit, the round's end as its timestamp and
its statistic set as StatisticValues, as KCL's CloudWatchMetricsScope sends them; at most
`MAX_DATA_PER_CALL` (CloudWatch's 1,000) data and `MAX_REQUEST_BYTES` per request. KCL sends 20 per
request, CloudWatch's limit when KCL was written.

`CloudWatchPublisher` makes the calls: each one retried while CloudWatch throttles it or fails
server-side (the application's retry policy, `lease_core.aws.AwsCaller`). It never raises: what it
could not publish, and why, is in its `MetricsPublication`, which the caller logs and keeps in the
round's summary. A round's data is landed before its metrics are published, and stays landed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from lease_core.aws import AwsCaller
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import LeaseCoreError
from lease_core.metrics.round_metrics import MetricsLevel, MetricValue, kcl_filtered
from lease_core.retry import RetryPolicy

log = logging.getLogger(__name__)

MAX_DATA_PER_CALL = 1000
# CloudWatch refuses a PutMetricData request over 1 MB; a datum's JSON size is a bound on its CBOR one.
MAX_REQUEST_BYTES = 1_000_000


@dataclass(frozen=True)
class MetricsPublication:
    """What one round's publication to CloudWatch did: the values it had to send, how many it sent in
    how many calls, and the error that stopped it (None: everything was sent)."""

    namespace: str | None
    values: int
    published: int
    calls: int
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def metric_datum(value: MetricValue, timestamp: datetime) -> dict[str, Any]:
    """One value as the MetricDatum KCL's CloudWatch scope sends."""
    statistics = value.statistics
    return {
        "MetricName": value.metric.name,
        "Dimensions": [{"Name": name, "Value": text} for name, text in value.all_dimensions],
        "Timestamp": timestamp,
        "Unit": value.metric.unit.value,
        "StatisticValues": {
            "SampleCount": float(statistics.sample_count),
            "Sum": statistics.sum,
            "Minimum": statistics.minimum,
            "Maximum": statistics.maximum,
        },
    }


def cloudwatch_batches(values: Sequence[MetricValue], timestamp: datetime) -> Iterator[list[dict[str, Any]]]:
    """The data of `values`, in requests within CloudWatch's limits, in order."""
    batch: list[dict[str, Any]] = []
    size = 0
    for value in values:
        datum = metric_datum(value, timestamp)
        datum_size = len(json.dumps(datum, default=str))
        if batch and (len(batch) == MAX_DATA_PER_CALL or size + datum_size > MAX_REQUEST_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(datum)
        size += datum_size
    if batch:
        yield batch


class CloudWatchPublisher:
    """Publishes a round's metric values under `namespace` with the configuration's level and dimensions."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        level: MetricsLevel,
        enabled_dimensions: Sequence[str],
        retry_policy: RetryPolicy,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.level = level
        self.enabled_dimensions = tuple(enabled_dimensions)
        self.caller = AwsCaller("cloudwatch", retry_policy)

    @classmethod
    def of(cls, client: Any, config: ConsumerConfig, retry_policy: RetryPolicy) -> CloudWatchPublisher:
        return cls(
            client,
            config.cloudwatch_namespace,
            MetricsLevel[config.metrics_level],
            config.metrics_enabled_dimensions,
            retry_policy,
        )

    def publish(self, values: Sequence[MetricValue], at_millis: int) -> MetricsPublication:
        """Send the values KCL's filters keep, stamped `at_millis` (the round's end); never raises."""
        kept = kcl_filtered(values, self.level, self.enabled_dimensions)
        timestamp = datetime.fromtimestamp(at_millis / 1000, UTC)
        published = calls = 0
        for batch in cloudwatch_batches(kept, timestamp):
            calls += 1
            try:
                self._put(batch)
            except LeaseCoreError as error:
                return self._failed(len(kept), published, calls, str(error))
            except Exception as error:  # a bug or an unexpected client failure must not fail the round either
                return self._failed(len(kept), published, calls, f"{type(error).__name__}: {error}")
            published += len(batch)
        return MetricsPublication(self.namespace, len(kept), published, calls)

    def _put(self, data: list[dict[str, Any]]) -> None:
        self.caller.call(
            "PutMetricData", lambda: self.client.put_metric_data(Namespace=self.namespace, MetricData=data)
        )

    def _failed(self, values: int, published: int, calls: int, error: str) -> MetricsPublication:
        log.warning(
            "%d of %d metric value(s) were not published to CloudWatch namespace %r: %s",
            values - published,
            values,
            self.namespace,
            error,
        )
        return MetricsPublication(self.namespace, values, published, calls, error)
