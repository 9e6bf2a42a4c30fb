"""Local AWS emulators for the embedded default and the tests, each in its own process on loopback.

The emulators are the installed package's (`kinesis_lease.local_trial.emulators`, which says why moto
is served behind a lock); this module adds the checkout's kinesis-mock, installed by
`scripts/bootstrap.sh` under `packaging/kinesis-mock/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kinesis_lease.local_trial import emulators
from kinesis_lease.local_trial.emulators import LOOPBACK, EmulatorProcess, free_port, moto_server

__all__ = ["KINESIS_MOCK_HOME", "LOOPBACK", "EmulatorProcess", "free_port", "kinesis_mock", "moto_server"]

KINESIS_MOCK_HOME = (
    Path(__file__).resolve().parents[1] / "packaging" / "kinesis-mock" / "node_modules" / "kinesis-local"
)


def kinesis_mock(**options: Any) -> EmulatorProcess:
    """The checkout's kinesis-mock on a free loopback port, with fast stream operations for tests and the demo
    (`options`: those of `kinesis_lease.local_trial.emulators.kinesis_mock`, such as `shard_limit`)."""
    if not (KINESIS_MOCK_HOME / "main.js").exists():
        raise FileNotFoundError(f"kinesis-mock is not installed at {KINESIS_MOCK_HOME}; run scripts/bootstrap.sh first")
    return emulators.kinesis_mock(KINESIS_MOCK_HOME, **options)
