"""A short seeded fault campaign (`bench/chaos.py`, run as the command it is): rounds of the real consume
job on Spark local mode against moto and kinesis-mock, with a producer writing the whole time and
every kind of fault injected at least once, land every record exactly once and leave no lease stuck,
in a Parquet dataset and in a Delta table (with the faults of its table commit).

It starts its own emulators (the campaign's stack, not the session's) and takes about four minutes
on two cores per sink, so the suite runs two sinks, not three, to stay under 30 minutes: an Iceberg
table's round is published as a Delta table's is (receipts, a position map, one commit per round),
its faults run in tests/contract, and its campaign is `bench/chaos.py --sink iceberg` (the same
seed and minutes). docs/operating.md ("Fault campaign") has the long runs and their tables.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SEED = 7
MINUTES = 4
# One fault of each kind (the schedule puts a permutation of every kind first), three or four per
# round: ten, and an eleventh for a Delta table, the faults of its driver's table commit.
FAULTS = {"parquet": 10, "iceberg": 10, "delta": 11}  # (Iceberg: by hand, module doc)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sink", ["parquet", "delta"])
def test_a_short_seeded_fault_campaign_duplicates_and_loses_nothing_and_injects_every_fault_kind(tmp_path, sink):
    """With a table (Iceberg, Delta), the campaign also ends with `leasectl verify`: the table's record of
    what landed agrees with the checkpoints, and DuckDB reads the table's rows as its own library does.
    With a Delta table, one round's driver also meets a fault at its table commit
    (bench/chaos/commit_faults.py)."""
    summary = tmp_path / "summary.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(REPOSITORY / "bench" / "chaos.py"),
            "--seed",
            str(SEED),
            "--minutes",
            str(MINUTES),
            "--faults",
            str(FAULTS[sink]),
            "--workdir",
            str(tmp_path / "campaign"),
            "--summary",
            str(summary),
            "--sink",
            sink,
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    print(completed.stdout[-8000:])  # the rounds, the table and the verdict, when the test fails
    assert summary.exists(), completed.stderr[-4000:]
    result = json.loads(summary.read_text())
    assert result["violations"] == [], "\n".join(result["violations"])
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert {kind: count for kind, count in result["injected"].items() if count == 0} == {}, result["table"]
    assert result["verdict"].startswith("produced") and " duplicated 0, lost 0," in result["verdict"]
    if sink != "parquet":
        assert re.search(r"landed (\d+) rows \(DuckDB: \1\)", result["verdict"]), result["verdict"]


# The fan-out campaign's own kinds, with the reshards they meet (the others are the polling campaign's).
FAN_OUT_KINDS = "subscription_cut,zombie_subscription,in_use_window,consumer_deregistered,mode_switch,split,merge"


@pytest.mark.timeout(480)
def test_a_short_fan_out_campaign_duplicates_and_loses_nothing_and_injects_every_subscription_fault(tmp_path):
    """The slots read by enhanced fan-out, subscriptions served by the Kinesis proxy's bridge
    (devtools/subscription_bridge.py); closed shards end one call after their last records in even rounds."""
    summary = tmp_path / "summary.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(REPOSITORY / "bench" / "chaos.py"),
            "--retrieval",
            "fan_out",
            "--kinds",
            FAN_OUT_KINDS,
            "--seed",
            str(SEED),
            "--minutes",
            "3",
            "--faults",
            "7",
            "--workdir",
            str(tmp_path / "campaign"),
            "--summary",
            str(summary),
        ],
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    print(completed.stdout[-8000:])
    assert summary.exists(), completed.stderr[-4000:]
    result = json.loads(summary.read_text())
    assert result["violations"] == [], "\n".join(result["violations"])
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert {kind: count for kind, count in result["injected"].items() if count == 0} == {}, result["table"]
    assert " duplicated 0, lost 0," in result["verdict"]
