"""Benchmark: the shard reader against Kinesis' per-shard read limit, on the Kinesis stand-in.

Method. Real shards serve 2 MiB/s and 5 GetRecords calls/s each; a round catching up a backlog can go
no faster, whatever the CPU. This run starts devtools/kinesis_standin.py (its own process) twice:
(a) With every limit off, it measures the stand-in's own serving rate: 1 and S concurrent raw HTTP
    readers (no JSON parsing on the client side, so the figure is the server's) re-reading their
    shard for --serve-seconds; MB/s and records/s, and the stand-in's CPU share. Any reader figure
    near this one measures the stand-in, not the reader.
(b) With the limits on (cap --cap-mb MiB/s per shard, 5 calls/s), S shards each hold a backlog of
    cap x --seconds bytes of --record-bytes records. One thread per shard reads its shard from
    TRIM_HORIZON until the tip (a page shorter than its Limit with MillisBehindLatest 0), which also
    means until the reads are paid off: the time is what the backlog costs at the cap. Efficiency per
    shard = bytes served (Kinesis' bytes: data + partition key) / time / cap. The baseline is a bare
    boto3 loop that paces at 5 calls/s with Limit 10000 and, when throttled, waits for its next slot;
    then one lease_core GetRecordsReader (polling) per shard paced by calls only (as it was before byte pacing:
    throttles back off through the retry policy), and one paced by bytes at the cap. Both run on the same data in
    the same run (the stand-in's meters and counters are reset in between; a bucket starts full, which
    is 1 s of the cap and is why a figure can exceed 1.0 by up to 1/--seconds).
Throttled calls are counted by the stand-in, by kind. "Bound by" names what limited the figure:
the stand-in (its CPU share near one core, or the S-reader serving rate below S x cap), the client's
CPU (the bench process near its 2 cores), else the cap.

Run: .venv/bin/python bench/kinesis_limits.py [--shards S] [--cap-mb C] [--seconds T] [--record-bytes B]
(defaults 4 shards, 2 MiB/s, 30 s of backlog (60 MiB per shard), 1,000-byte records: about 75 s).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

import botocore.exceptions  # noqa: E402

from devtools.kinesis_standin import MIB, KinesisStandIn, Limits, StreamSpec, shard_id_of  # noqa: E402
from lease_core.model.sequence import TRIM_HORIZON  # noqa: E402
from lease_core.retrieval.polling.get_records_reader import GetRecordsReader  # noqa: E402
from lease_core.retrieval.polling.read_pacing import MIN_CALL_INTERVAL_SECONDS  # noqa: E402
from lease_core.retrieval.record_source import ReadLimits, ReadStart, ShardToRead  # noqa: E402

STREAM = "bench-limits"
CORES = 2


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: dict[str, float]  # per shard: until the tip
    stats: dict[str, Any]  # the stand-in's counters for the phase
    client_cpu_seconds: float
    wall_seconds: float


# --- (a) the stand-in's own rate ------------------------------------------------------------------


def raw_reader(port: int, shard_id: str, until: float) -> None:
    """Re-read one shard over raw HTTP until `until`; the body is not parsed beyond its iterator."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    shard_iterator = None
    while time.monotonic() < until:
        if shard_iterator is None:
            body = call(
                connection,
                "GetShardIterator",
                {"StreamName": STREAM, "ShardId": shard_id, "ShardIteratorType": "TRIM_HORIZON"},
            )
            shard_iterator = json.loads(body)["ShardIterator"]
        body = call(connection, "GetRecords", {"ShardIterator": shard_iterator, "Limit": 10000})
        start = body.rfind(b'"NextShardIterator": "')
        shard_iterator = None if start < 0 else body[start + 22 : body.index(b'"', start + 22)].decode()
        if b'"MillisBehindLatest": 0' in body[start:]:
            shard_iterator = None  # at the tip: start over
    connection.close()


def call(connection: http.client.HTTPConnection, operation: str, request: dict[str, Any]) -> bytes:
    headers = {"X-Amz-Target": f"Kinesis_20131202.{operation}", "Content-Type": "application/x-amz-json-1.1"}
    connection.request("POST", "/", json.dumps(request).encode(), headers)
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"{operation} answered {response.status}: {body[:200]!r}")
    return body


def serving_rate(standin: KinesisStandIn, readers: int, seconds: float) -> dict[str, float]:
    standin.reset()
    until = time.monotonic() + seconds
    assert standin.port is not None
    threads = [
        threading.Thread(target=raw_reader, args=(standin.port, shard_id_of(index), until)) for index in range(readers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = standin.stats()
    return {
        "mb_per_s": stats["bytes"] / MIB / stats["seconds"],
        "records_per_s": stats["records"] / stats["seconds"],
        "standin_cpu": stats["cpu_seconds"] / stats["seconds"],
    }


# --- (b) readers at the cap -----------------------------------------------------------------------


def bare_loop(client: Any, shard_id: str) -> None:
    """The least a consumer does: 5 calls/s, Limit 10000; a throttled call waits for the next slot."""
    shard_iterator = client.get_shard_iterator(StreamName=STREAM, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")[
        "ShardIterator"
    ]
    next_call = time.monotonic()
    while True:
        time.sleep(max(0.0, next_call - time.monotonic()))
        next_call = time.monotonic() + MIN_CALL_INTERVAL_SECONDS
        try:
            response = client.get_records(ShardIterator=shard_iterator, Limit=10000)
        except botocore.exceptions.ClientError as error:
            if error.response["Error"]["Code"] != "ProvisionedThroughputExceededException":
                raise
            continue
        shard_iterator = response["NextShardIterator"]
        if response["MillisBehindLatest"] == 0 and len(response["Records"]) < 10000:
            return


def paced_reader(cap: float | None) -> Callable[[Any, str], None]:
    def read(client: Any, shard_id: str) -> None:
        reader = GetRecordsReader(
            client, ShardToRead(STREAM, shard_id), ReadStart(TRIM_HORIZON), read_bytes_per_second=cap
        )
        while reader.read(ReadLimits(max_records=100_000)).stopped_by != "tip":
            pass

    return read


def run_phase(standin: KinesisStandIn, name: str, shards: int, read: Callable[[Any, str], None]) -> Phase:
    standin.reset()
    seconds: dict[str, float] = {}
    clients = [standin.client() for _ in range(shards)]  # one connection pool per reader, as slots have

    def timed(index: int) -> None:
        started = time.monotonic()
        read(clients[index], shard_id_of(index))
        seconds[shard_id_of(index)] = time.monotonic() - started

    threads = [threading.Thread(target=timed, args=(index,)) for index in range(shards)]
    wall, cpu = time.monotonic(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    if len(seconds) != shards:
        raise RuntimeError(f"{name}: {shards - len(seconds)} readers failed (see the traceback above)")
    return Phase(name, seconds, standin.stats(), cpu, wall)


def efficiencies(phase: Phase, cap: float) -> list[float]:
    """Per shard: bytes served / what the shard could serve while it was busy (the stand-in's
    busy_seconds, first call until the reads are paid off, at the cap, plus the bucket's initial burst)."""
    burst = cap * phase.stats["limits"]["burst_seconds"]
    shards = phase.stats["shards"]
    return [
        shards[f"{STREAM}/{shard}"]["bytes"] / (shards[f"{STREAM}/{shard}"]["busy_seconds"] * cap + burst)
        for shard in sorted(phase.seconds)
    ]


def bound_by(phase: Phase, cap: float, shards: int, serving_mb: float) -> str:
    standin_cpu = phase.stats["cpu_seconds"] / phase.wall_seconds
    if standin_cpu > 0.85 or serving_mb * MIB < 1.2 * shards * cap:
        return f"stand-in (CPU {standin_cpu:.0%} of a core; serves {serving_mb:.0f} MB/s)"
    client_cpu = phase.client_cpu_seconds / phase.wall_seconds
    if client_cpu > 0.85 * CORES:
        return f"CPU (bench process {client_cpu:.0%} of one core)"
    low = min(efficiencies(phase, cap))
    if low >= 0.9:
        return f"cap (client CPU {client_cpu:.0%}, stand-in CPU {standin_cpu:.0%})"
    return f"pacing/throttling (client CPU {client_cpu:.0%}, stand-in CPU {standin_cpu:.0%})"


def report(phases: list[Phase], cap: float, shards: int, serving_mb: float) -> None:
    baseline = statistics.median(efficiencies(phases[0], cap))
    print(f"\n(b) reading {shards} shards to the tip at {cap / MIB:.3g} MiB/s per shard (efficiency = bytes/s / cap)")
    columns = ("min", 7), ("median", 8), ("max", 7), ("x base", 8), ("calls", 7), ("thr calls/s", 12)
    header = "".join(f"{name:>{width}}" for name, width in columns)
    print(f"{'reader':<28}{header}{'thr bytes/s':>12}{'wall s':>8}  bound by")
    for phase in phases:
        figures = efficiencies(phase, cap)
        median = statistics.median(figures)
        violations = phase.stats["violations"]
        print(
            f"{phase.name:<28}{min(figures):>7.3f}{median:>8.3f}{max(figures):>7.3f}{median / baseline:>8.2f}"
            f"{phase.stats['get_records']:>7}{violations['calls_per_second']:>12}{violations['bytes_per_second']:>12}"
            f"{phase.wall_seconds:>8.1f}"
            f"  {bound_by(phase, cap, shards, serving_mb)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--cap-mb", type=float, default=2.0, help="read cap per shard, MiB/s")
    parser.add_argument("--seconds", type=float, default=30.0, help="backlog per shard, in seconds of the cap")
    parser.add_argument("--record-bytes", type=int, default=1000)
    parser.add_argument("--serve-seconds", type=float, default=3.0)
    arguments = parser.parse_args()
    cap = arguments.cap_mb * MIB
    records = int(cap * arguments.seconds / (arguments.record_bytes + 8))
    spec = StreamSpec(STREAM, shards=arguments.shards, records_per_shard=records, record_bytes=arguments.record_bytes)
    started = time.monotonic()
    with KinesisStandIn([spec], Limits.off()) as standin:
        print(
            f"stand-in up in {time.monotonic() - started:.1f} s: {arguments.shards} shards x {records:,} records "
            f"of {arguments.record_bytes} B ({records * (arguments.record_bytes + 8) / MIB:.0f} MiB per shard)"
        )
        print(f"\n(a) the stand-in's own rate, limits off, raw HTTP readers ({arguments.serve_seconds:.0f} s each)")
        print(f"{'readers':<10}{'MB/s':>10}{'records/s':>12}{'stand-in CPU':>14}")
        serving_mb = 0.0
        for readers in sorted({1, arguments.shards}):
            rate = serving_rate(standin, readers, arguments.serve_seconds)
            print(f"{readers:<10}{rate['mb_per_s']:>10.1f}{rate['records_per_s']:>12,.0f}{rate['standin_cpu']:>14.0%}")
            serving_mb = rate["mb_per_s"]
        standin.set_limits(Limits(read_bytes_per_second=cap))
        phases = [
            run_phase(standin, "bare boto3 loop, 5 calls/s", arguments.shards, bare_loop),
            run_phase(standin, "polling, 5 calls/s only", arguments.shards, paced_reader(None)),
            run_phase(standin, "polling, paced by bytes", arguments.shards, paced_reader(cap)),
        ]
    report(phases, cap, arguments.shards, serving_mb)


if __name__ == "__main__":
    main()
