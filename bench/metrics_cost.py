"""Benchmark: what publishing one round's metrics to CloudWatch costs, per metrics level and dimensions.

Method. The run starts its own moto server (CloudWatch) on loopback. For each size it builds one
round of N leases on one stream and N / 10 slots, every lease with all its figures (records, bytes,
lag, read calls, freshness), and publishes it with the project's `CloudWatchPublisher` under each
configuration below, each into a namespace of its own. It counts:
- `values`: the metric values KCL's level and dimension filters keep (`kcl_filtered`);
- `calls` and `KiB sent`: the PutMetricData requests and their bodies, as botocore sent them (a
  `before-send` hook on the client reads each request's body);
- `metrics`: the distinct metrics (name and dimensions) the namespace holds afterwards, read back
  with ListMetrics. CloudWatch bills each one as a custom metric for every hour it receives data.

Then a month of rounds on a 5-minute schedule (8,640 rounds) at CloudWatch's list prices (us-east-1,
docs/cost.md "Publishing the round's metrics"): requests at $0.01 per 1,000 PutMetricData calls, and
custom metrics at $0.30 per metric-month for the first 10,000 and $0.10 for the next 240,000 (a metric
that receives a value every round is billed the whole month).

Run: .venv/bin/python bench/metrics_cost.py [--leases 100,1000] (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import boto3  # noqa: E402

from bench.harness import REGION, prepare_environment  # noqa: E402
from devtools.emulators import moto_server  # noqa: E402
from lease_core.metrics.cloudwatch import CloudWatchPublisher  # noqa: E402
from lease_core.metrics.freshness import Freshness  # noqa: E402
from lease_core.metrics.round_metrics import (  # noqa: E402
    ALL_DIMENSIONS,
    LeaseObservation,
    MetricsLevel,
    RoundObservation,
    SlotObservation,
    kcl_filtered,
    round_metric_values,
)
from lease_core.retry import RetryPolicy  # noqa: E402

ROUNDS_PER_MONTH = 8_640  # 30 days on a 5-minute schedule
PRICE_PER_THOUSAND_CALLS = 0.01
# CloudWatch's custom-metric tiers (metrics per month, $ per metric-month), first tiers only.
METRIC_TIERS = ((10_000, 0.30), (240_000, 0.10))


@dataclass(frozen=True)
class Configuration:
    label: str
    level: MetricsLevel
    dimensions: tuple[str, ...]


CONFIGURATIONS = (
    Configuration("DETAILED, ALL (the default)", MetricsLevel.DETAILED, (ALL_DIMENSIONS,)),
    Configuration("DETAILED, Operation only", MetricsLevel.DETAILED, ("Operation",)),
    Configuration("SUMMARY, ALL", MetricsLevel.SUMMARY, (ALL_DIMENSIONS,)),
    Configuration("SUMMARY, Operation only", MetricsLevel.SUMMARY, ("Operation",)),
)


def busy_round(application: str, leases: int, at_millis: int) -> RoundObservation:
    """A round in which every lease landed records and every slot held ten leases."""
    slots = max(1, leases // 10)
    observations = tuple(
        LeaseObservation(
            lease_key=f"shardId-{index:012d}",
            shard_id=f"shardId-{index:012d}",
            worker_id=f"{application}-worker-{index % slots}",
            records=1_000 + index,
            bytes=200_000 + index,
            seconds=12.5,
            millis_behind_latest=index,
            read_calls=3,
            refused_read_calls=index % 2,
            dead_lettered=0,
            failed=False,
            lost=False,
            freshness=Freshness(at_millis - 300_000 - index, at_millis - 2_000),
        )
        for index in range(leases)
    )
    return RoundObservation(
        application=application,
        finished_at_millis=at_millis,
        idle=False,
        succeeded=True,
        consumed=True,
        seconds=40.0,
        records=sum(lease.records for lease in observations),
        bytes=sum(lease.bytes for lease in observations),
        dead_lettered=0,
        lost_leases=0,
        retention_losses=0,
        freshness=Freshness.of_leases(lease.freshness for lease in observations),
        total_leases=leases,
        workers=slots,
        moves=0,
        leases=observations,
        slots=tuple(SlotObservation(f"{application}-worker-{slot}", 38.0) for slot in range(slots)),
    )


class RequestSizes:
    """The bodies of the PutMetricData requests a client sends."""

    def __init__(self, client: Any) -> None:
        self.sizes: list[int] = []
        client.meta.events.register("before-send.cloudwatch.PutMetricData", self._seen)

    def _seen(self, request: Any, **_: Any) -> None:
        body = request.body or b""
        self.sizes.append(len(body if isinstance(body, bytes) else body.encode()))


def distinct_metrics(client: Any, namespace: str) -> int:
    pages = client.get_paginator("list_metrics").paginate(Namespace=namespace)
    return sum(len(page["Metrics"]) for page in pages)


def metric_month_dollars(metrics: int) -> float:
    dollars, left = 0.0, metrics
    for size, price in METRIC_TIERS:
        dollars += min(left, size) * price
        left -= min(left, size)
    return dollars


def measured_rows(endpoint: str, leases: int) -> Iterator[list[str]]:
    at_millis = int(time.time() * 1000)
    round_ = busy_round("orders", leases, at_millis)
    values = round_metric_values(round_)
    for number, configuration in enumerate(CONFIGURATIONS):
        client = boto3.client("cloudwatch", endpoint_url=endpoint, region_name=REGION)
        sizes = RequestSizes(client)
        namespace = f"bench-{leases}-{number}"
        publisher = CloudWatchPublisher(client, namespace, configuration.level, configuration.dimensions, RetryPolicy())
        publication = publisher.publish(values, at_millis)
        if publication.error is not None:
            raise RuntimeError(f"{configuration.label}: {publication.error}")
        kept = len(kcl_filtered(values, configuration.level, configuration.dimensions))
        metrics = distinct_metrics(client, namespace)
        calls_dollars = publication.calls * ROUNDS_PER_MONTH * PRICE_PER_THOUSAND_CALLS / 1000
        yield [
            str(leases),
            configuration.label,
            f"{kept:,}",
            str(publication.calls),
            f"{sum(sizes.sizes) / 1024:,.1f}",
            f"{metrics:,}",
            f"{calls_dollars:,.2f}",
            f"{metric_month_dollars(metrics):,.2f}",
        ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", default="100,1000", help="comma-separated lease counts (default: 100,1000)")
    arguments = parser.parse_args(argv)
    prepare_environment()
    header = ["leases", "level, dimensions", "values", "calls", "KiB sent", "metrics"]
    header += ["calls $/month", "metrics $/month"]
    rows: list[list[str]] = []
    with moto_server() as server:
        for leases in (int(size) for size in arguments.leases.split(",")):
            rows.extend(measured_rows(server.endpoint, leases))
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if index < 2 else "---:" for index in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n(one round; a month is {ROUNDS_PER_MONTH:,} rounds on a 5-minute schedule; list prices in docs/cost.md)")


if __name__ == "__main__":
    main()
