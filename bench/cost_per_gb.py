"""The all-in cost per GB landed in an Iceberg table, against Firehose's price for its Iceberg destination.

A model, not a measurement: it multiplies what the project's benchmarks measured per round, per lease
and per GiB (each input below names the command that measured it) by AWS's list prices (us-east-1, as
docs/cost.md states them and where they come from). It prints one row per workload: S shards at R KB/s
each, read by polling on a provisioned stream, landed into an Iceberg table on Glue and S3 by a round
every 5 minutes, with the round's metrics at SUMMARY level, Operation dimension only.

Run: .venv/bin/python bench/cost_per_gb.py [--schedule-minutes 5]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

GIB = 2**30
HOURS_PER_MONTH = 720

# --- measured inputs (docs/cost.md says which run gave each) --------------------------------------
# DynamoDB writes per lease with data per round: claim, prepare, commit, throughput (bench/round_cost.py
# --consume-up-to 1000: 4,103 writes for 1,000 leases and 100 slots, the 100 worker-metrics writes included).
WRITES_PER_LEASE_ROUND = 4.1
# A slot renews each lease it reads every failover_time_millis / 3 - epsilon_millis (3.3 s by default).
RENEWAL_SECONDS = 3.308
# What a round writes and reads whatever the leases: the lock, the auditor's and consumed-stream
# records, the history, the assignment record (bench/round_cost.py: the DAG sync and assign rows).
FIXED_WRITES_PER_ROUND = 12
# A lease item is ~714 bytes; the round scans the lease table twice (sync, assign), eventually consistent.
LEASE_ITEM_BYTES = 714
SCANS_PER_ROUND = 2
# A slot lands ~150 MiB of payload per CPU second into Iceberg on this machine (bench/pipeline_cpu.py
# --no-scaling: Parquet slot 158-213 MiB/s, Iceberg 0.87-0.91 of it on plain records).
MIB_PER_CPU_SECOND = 150.0
# What a round costs whatever its data, an upper bound: a spark-submit of the job starting and stopping
# on local[2] used 19 CPU seconds (/usr/bin/time of a trivial PySpark job, docs/cost.md), and each of
# the round's 9 Airflow tasks at most 7 (a fresh process importing Airflow and the operators; the
# LocalExecutor's forked task processes spend less).
FIXED_CPU_SECONDS_PER_ROUND = 19.0 + 9 * 7.0
# Each data file is one multipart upload by pyarrow: CreateMultipartUpload, an UploadPart per part (of
# at least 5 MiB: counting 5 MiB parts is the upper bound), CompleteMultipartUpload, all PUT-class. An
# Iceberg commit uploads a manifest, a manifest list and a metadata file and makes ~4 Glue calls. Each
# file also costs ~2 GET-class requests (HEAD, and the idle check's staged-file HEAD).
PART_BYTES = 5 * 2**20
COMMIT_UPLOADS_PER_ROUND = 3
GLUE_CALLS_PER_ROUND = 4
GETS_PER_FILE = 2
# Metrics at SUMMARY, Operation only (bench/metrics_cost.py): 24 custom metrics and 1 call per round.
CUSTOM_METRICS = 24
METRIC_CALLS_PER_ROUND = 1

# --- list prices, us-east-1 (docs/cost.md "Prices") -----------------------------------------------
DYNAMODB_PER_MILLION_WRITES = 0.625
DYNAMODB_PER_MILLION_READS = 0.125
S3_PER_THOUSAND_PUTS = 0.005
S3_PER_THOUSAND_GETS = 0.0004
GLUE_PER_MILLION_REQUESTS = 1.0  # beyond the first million a month, which this model does not subtract
CLOUDWATCH_PER_METRIC_MONTH = 0.30
CLOUDWATCH_PER_THOUSAND_CALLS = 0.01
VCPU_HOUR = 0.048  # an m6i.xlarge on demand, $0.192 an hour for 4 vCPUs
FIREHOSE_ICEBERG_PER_GB = 0.075  # first 250 TB a month


@dataclass(frozen=True)
class Workload:
    shards: int
    kbps_per_shard: float
    schedule_minutes: float

    @property
    def rounds(self) -> float:
        return HOURS_PER_MONTH * 60 / self.schedule_minutes

    @property
    def bytes_per_shard_round(self) -> float:
        return self.kbps_per_shard * 1000 * self.schedule_minutes * 60

    @property
    def gib_per_month(self) -> float:
        return self.shards * self.bytes_per_shard_round * self.rounds / GIB


def monthly_costs(workload: Workload) -> dict[str, float]:
    rounds, leases = workload.rounds, workload.shards
    # Reading a shard's round of data at Kinesis' 2 MiB/s cap, renewing the lease meanwhile.
    read_seconds = workload.bytes_per_shard_round / (2 * 2**20)
    writes = rounds * (leases * (WRITES_PER_LEASE_ROUND + read_seconds / RENEWAL_SECONDS) + FIXED_WRITES_PER_ROUND)
    reads = rounds * SCANS_PER_ROUND * math.ceil(leases * LEASE_ITEM_BYTES / 4096) / 2
    parts = max(1, math.ceil(workload.bytes_per_shard_round / PART_BYTES))
    puts = rounds * (leases * (parts + 2) + COMMIT_UPLOADS_PER_ROUND * 3)
    cpu_seconds = workload.gib_per_month * 1024 / MIB_PER_CPU_SECOND + rounds * FIXED_CPU_SECONDS_PER_ROUND
    return {
        "DynamoDB": writes * DYNAMODB_PER_MILLION_WRITES / 1e6 + reads * DYNAMODB_PER_MILLION_READS / 1e6,
        "S3": puts * S3_PER_THOUSAND_PUTS / 1000 + rounds * leases * GETS_PER_FILE * S3_PER_THOUSAND_GETS / 1000,
        "Glue": rounds * GLUE_CALLS_PER_ROUND * GLUE_PER_MILLION_REQUESTS / 1e6,
        "CloudWatch": CUSTOM_METRICS * CLOUDWATCH_PER_METRIC_MONTH
        + rounds * METRIC_CALLS_PER_ROUND * CLOUDWATCH_PER_THOUSAND_CALLS / 1000,
        "compute": cpu_seconds / 3600 * VCPU_HOUR,
        "Kinesis reads": 0.0,  # GetRecords is not charged on a provisioned stream
    }


WORKLOADS = ((1, 100), (10, 100), (100, 100), (100, 1000), (1000, 100))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedule-minutes", type=float, default=5.0)
    arguments = parser.parse_args(argv)
    parts = ["DynamoDB", "S3", "Glue", "CloudWatch", "compute"]
    print(
        "| shards x KB/s | GiB / month | "
        + " | ".join(f"{part} $" for part in parts)
        + " | **this project $/GiB** | Firehose $/GiB | Firehose / this project |"
    )
    print("|---|" + "---:|" * (len(parts) + 4))
    for shards, kbps in WORKLOADS:
        workload = Workload(shards, kbps, arguments.schedule_minutes)
        costs = monthly_costs(workload)
        ours = sum(costs.values()) / workload.gib_per_month
        print(
            f"| {shards:,} x {kbps:,} | {workload.gib_per_month:,.0f} | "
            + " | ".join(f"{costs[part]:,.2f}" for part in parts)
            + f" | **{ours:.4f}** | {FIREHOSE_ICEBERG_PER_GB:.3f} | {FIREHOSE_ICEBERG_PER_GB / ours:,.1f}x |"
        )


if __name__ == "__main__":
    main()
