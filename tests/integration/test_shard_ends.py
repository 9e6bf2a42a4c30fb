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

from devtools.kinesis_standin import SHARD_ENDS, KinesisStandIn, Limits, StreamSpec, shard_id_of
from devtools.stream_records import landed_records
from tests.support.consume_job_process import submit_consume_job
from tests.support.leasectl import run_leasectl

RECORDS = 150  # per shard: the parent's, and each child's own


def spark_submit(app: str, stream: str, output: Path, report: Path, moto: str, kinesis: str) -> dict:
    completed = submit_consume_job(app, stream, str(output), str(report), moto, kinesis)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.parametrize("shard_end", SHARD_ENDS)
def test_a_closed_parent_reaches_shard_end_and_its_children_land_in_the_same_round(
    shard_end, moto_endpoint, unique_name, tmp_path
):
    stream = StreamSpec(unique_name, shards=1, records_per_shard=RECORDS, split=True, shard_end=shard_end)
    with KinesisStandIn([stream], Limits.off()) as standin:
        tables = ("--app", unique_name, "--set", "initial_position_in_stream=TRIM_HORIZON")
        for command in (("init",), ("sync", "--stream", unique_name), ("assign", "--workers", "2")):
            result = run_leasectl(*tables, *command, dynamodb=moto_endpoint, kinesis=standin.endpoint)
            assert result.returncode == 0, result.stderr
        output = tmp_path / "lake"
        report = spark_submit(
            unique_name, unique_name, output, tmp_path / "round.json", moto_endpoint, standin.endpoint
        )
        status = run_leasectl(*tables, "status", "--json", dynamodb=moto_endpoint, kinesis=standin.endpoint)
    outcomes = {lease["shard_id"]: lease["outcome"] for slot in report["slots"] for lease in slot["leases"]}
    parent, children = shard_id_of(0), (shard_id_of(1), shard_id_of(2))
    assert outcomes == {parent: "shard_end", children[0]: "caught_up", children[1]: "caught_up"}
    landed = Counter(record.shard_id for record in landed_records(str(output)))
    assert landed == dict.fromkeys((parent, *children), RECORDS)
    checkpoints = {lease["lease_key"]: lease["checkpoint"] for lease in json.loads(status.stdout)["leases"]}
    assert checkpoints[parent] == "SHARD_END"
