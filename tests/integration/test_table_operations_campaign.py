"""A short table-operations campaign (`bench/table_operations.py`, run as the command it is): ~30 of
other tools' operations per format on Iceberg and Delta, between and during rounds, for a few seeds.
The campaign judges every committed record (duplicated, lost silently, verify's false agreements) and
exits 1 on a violation. The seeds are the first three; the long runs of docs/operating.md ("Other tools
on the table") take more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_short_campaign_of_other_tools_operations_lands_every_record_once(seed):
    command = [sys.executable, str(REPOSITORY / "bench" / "table_operations.py"), "--seed", str(seed)]
    finished = subprocess.run(
        [*command, "--operations", "30"], capture_output=True, text=True, timeout=300, check=False
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-2000:]
    assert "duplicated 0, lost silently 0, false agreements 0, other violations 0" in finished.stdout
