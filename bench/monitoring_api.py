"""Benchmark: the monitoring API's leases pages at 1,000 and 10,000 leases (issue 18), on moto.

Method. The run starts its own moto (DynamoDB) on loopback. For each size it creates a fresh
application with N leases over 10 owners, the per-lease rows of a last round and 100 rounds of
history, then times what the API routes do, in this process (`monitoring.read_application`, the
`ReadsCache` and the pure documents; the API server adds its HTTP, JSON encoding and authentication
on top, a few ms per page):
- `Scan only (baseline)`: `scan_leases()` of the lease table, the read a cold page cannot avoid;
- `Scan, 4 segments`: the same Scan as a parallel scan of 4 segments (`scan_total_segments`);
- `first page, cold`: a fresh read of the three tables and the first page of 100 (`?fresh=1`, or
  the first call after the cache's 5 s);
- `next page, warm`: the next page of 100 from the cached reads (what paging costs);
- `sorted+filtered, warm`: a page sorted by lag, descending, of one owner's leases matching a text;
- `overview, warm`: the overview document over the cached reads (the route reads anew first:
  its cost is the cold figure's reads plus this).
Times are the best of 3 runs; the ratio compares each with the Scan baseline of the same size,
measured in the same run. What bounds each: the cold figures are moto's Scan (about 0.75 ms per
item here, single-threaded Python; real DynamoDB returns 10,000 small leases in 3-4 pages of 1 MB,
tens of ms each), the warm figures this process's sorting and slicing of the cached documents.

Run: .venv/bin/python bench/monitoring_api.py [--sizes 1000,10000]   (about 2 minutes with the defaults)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))
sys.path.insert(0, str(REPOSITORY / "plugins"))

from kinesis_lease.monitoring import (  # noqa: E402
    LeaseQuery,
    ReadsCache,
    application_document,
    leases_document,
    read_application,
)

from bench.harness import REGION, prepare_environment  # noqa: E402
from devtools.emulators import moto_server  # noqa: E402
from lease_core.application import LeaseApplication  # noqa: E402
from lease_core.config.settings import ConsumerConfig  # noqa: E402
from lease_core.leader.round_history import RoundHistory  # noqa: E402
from lease_core.model.lease import Lease  # noqa: E402
from lease_core.model.sequence import ExtendedSequenceNumber  # noqa: E402
from lease_core.store.dynamodb_store import DynamoDBLeaseStore  # noqa: E402
from lease_core.store.tables import TableAdministrator  # noqa: E402

REPEATS = 3
OWNERS = 10
PAGE = 100
T = TypeVar("T")


def best_seconds(function: Callable[[], T]) -> float:
    seconds = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def seeded_application(endpoint: str, size: int) -> LeaseApplication:
    config = ConsumerConfig(
        application_name=f"bench-monitoring-{uuid.uuid4().hex[:8]}",
        aws_region=REGION,
        aws_endpoint_url_dynamodb=endpoint,
        table_status_poll_seconds=0.05,
    )
    app = LeaseApplication.from_config(config)
    TableAdministrator(app.client("dynamodb"), config, retry_policy=app.retry_policy).ensure_tables()
    store = app.lease_store

    def create(index: int) -> None:
        lease = Lease(
            f"shardId-{index:012d}", ExtendedSequenceNumber(str(49_600_000 + index)), throughput_kbps=index % 97
        )
        store.create_lease_if_not_exists(lease)
        store.assign_lease(lease, f"{config.application_name}-worker-{index % OWNERS}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(size)))
    history = RoundHistory(app.state_store)
    for number in range(1, 101):
        history.append({"round": number, "run_id": f"scheduled__{number}", "consumed": True, "records": number})
    rows: list[dict[str, Any]] = [
        {
            "lease_key": f"shardId-{index:012d}",
            "worker_id": f"{config.application_name}-worker-{index % OWNERS}",
            "outcome": "caught_up" if index % 3 else "limit",
            "records": index % 1000,
            "millis_behind_latest": (index * 7919) % 60_000,
        }
        for index in range(size)
    ]
    history.record_lease_rows(100, rows)
    return app


def measure(app: LeaseApplication) -> list[tuple[str, float]]:
    config = app.config
    segmented = DynamoDBLeaseStore(
        app.client("dynamodb"), config.lease_table, retry_policy=app.retry_policy, scan_total_segments=4
    )
    cache = ReadsCache()
    key = config.lease_table

    def read() -> Any:
        return read_application(app)

    def cold_first_page() -> None:
        leases_document(cache.get(key, read, fresh=True), LeaseQuery())

    cold_first_page()  # fills the cache for the warm cases
    owner = f"{config.application_name}-worker-3"
    sorted_filtered = LeaseQuery(sort="lag", order="desc", owner=owner, q="shardId-0000000001")
    return [
        ("Scan only (baseline)", best_seconds(app.lease_store.scan_leases)),
        ("Scan, 4 segments", best_seconds(segmented.scan_leases)),
        ("first page, cold", best_seconds(cold_first_page)),
        ("next page, warm", best_seconds(lambda: leases_document(cache.get(key, read), LeaseQuery(offset=PAGE)))),
        ("sorted+filtered, warm", best_seconds(lambda: leases_document(cache.get(key, read), sorted_filtered))),
        ("overview, warm", best_seconds(lambda: application_document(cache.get(key, read)))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    sizes = [int(size) for size in parser.parse_args().sizes.split(",")]
    prepare_environment(clear_overrides=True)
    with moto_server() as moto:
        print(
            f"machine: {os.cpu_count()} cores; Python {sys.version.split()[0]}; moto on loopback; best of {REPEATS}\n"
        )
        header = f"{'leases':>7}  {'case':<24}{'ms':>10}{'ratio':>8}"
        print(header)
        print("-" * len(header))
        for size in sizes:
            app = seeded_application(moto.endpoint, size)
            results = measure(app)
            baseline = results[0][1]
            for name, seconds in results:
                print(f"{size:>7}  {name:<24}{seconds * 1000:>10.1f}{seconds / baseline:>8.3f}")


if __name__ == "__main__":
    main()
