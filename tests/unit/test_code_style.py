"""The style and typing rules the project holds itself to, enforced by tools (pyproject.toml):
ruff lints and formats everything; mypy checks lease_core strictly and the rest at least basically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

CHECKS = [
    pytest.param([str(BIN / "ruff"), "check", "."], id="ruff-lint"),
    pytest.param([str(BIN / "ruff"), "format", "--check", "."], id="ruff-format"),
    pytest.param([str(BIN / "mypy")], id="mypy"),
]


@pytest.mark.parametrize("command", CHECKS)
def test_the_code_passes(command):
    done = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(command)} found problems:\n{done.stdout}\n{done.stderr}"
