"""The end of a closed shard through the public interfaces: `leasectl init/sync/assign`, then the consume
job under `spark-submit`, against the Kinesis stand-in serving a closed parent (listed with its
EndingSequenceNumber) and its two open children, ended both ways a Kinesis may end it: the null
iterator with the parent's last records (kinesis-mock), or one call after them (the GetRecords
documentation: the last records come with a next iterator and MillisBehindLatest 0)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from devtools.kinesis_standin import SHARD_ENDS, FanOutLimits, KinesisStandIn, Limits, StreamSpec, shard_id_of
from devtools.stream_records import landed_records
from tests.support.consume_job_process import submit_consume_job
from tests.support.leasectl import run_leasectl

RECORDS = 150  # per shard: the parent's, and each child's own


def spark_submit(
    app: str, stream: str, output: Path, report: Path, moto: str, kinesis: str, arguments: tuple[str, ...] = ()
) -> dict:
    completed = submit_consume_job(app, stream, str(output), str(report), moto, kinesis, arguments=arguments)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.parametrize(
    ("shard_end", "retrieval"),
    [*((shard_end, "polling") for shard_end in SHARD_ENDS), ("after_last_records", "fan_out")],
)
def test_a_closed_parent_reaches_shard_end_and_its_children_land_in_the_same_round(
    shard_end, retrieval, moto_endpoint, unique_name, tmp_path
):
    """By fan-out too: `leasectl init --stream` registers the application's consumer, the round
    subscribes through it (the stand-in is the one Kinesis here boto3 can subscribe to)."""
    stream = StreamSpec(unique_name, shards=1, records_per_shard=RECORDS, split=True, shard_end=shard_end)
    with KinesisStandIn([stream], Limits.off(), FanOutLimits(heartbeat_seconds=0.2)) as standin:
        settings = ("--set", "initial_position_in_stream=TRIM_HORIZON", "--set", f"retrieval={retrieval}")
        tables = ("--app", unique_name, *settings)
        commands = (("init", "--stream", unique_name), ("sync", "--stream", unique_name), ("assign", "--workers", "2"))
        for command in commands:
            result = run_leasectl(*tables, *command, dynamodb=moto_endpoint, kinesis=standin.endpoint)
            assert result.returncode == 0, result.stderr
        output = tmp_path / "lake"
        report = spark_submit(
            unique_name, unique_name, output, tmp_path / "round.json", moto_endpoint, standin.endpoint, settings
        )
        served = standin.stats()
        status = run_leasectl(*tables, "status", "--json", dynamodb=moto_endpoint, kinesis=standin.endpoint)
    outcomes = {lease["shard_id"]: lease["outcome"] for slot in report["slots"] for lease in slot["leases"]}
    parent, children = shard_id_of(0), (shard_id_of(1), shard_id_of(2))
    assert outcomes == {parent: "shard_end", children[0]: "caught_up", children[1]: "caught_up"}
    landed = Counter(record.shard_id for record in landed_records(str(output)))
    assert landed == dict.fromkeys((parent, *children), RECORDS)
    checkpoints = {lease["lease_key"]: lease["checkpoint"] for lease in json.loads(status.stdout)["leases"]}
    assert checkpoints[parent] == "SHARD_END"
    # By fan-out, each of the three leases read by one subscription, none refused.
    assert served["fan_out"]["subscriptions"] == (3 if retrieval == "fan_out" else 0)
    assert not any(served["fan_out"]["violations"].values())
