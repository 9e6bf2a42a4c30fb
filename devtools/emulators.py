"""Local AWS emulators for the embedded default and the tests, each in its own process on loopback.

The emulators are the installed package's (`kinesis_lease.local_trial.emulators`, which says why moto
is served behind a lock); this module adds the checkout's kinesis-mock, installed by
`scripts/bootstrap.sh` under `packaging/kinesis-mock/`.
"""

from __future__ import annotations

from pathlib import Path

from kinesis_lease.local_trial import emulators
from kinesis_lease.local_trial.emulators import LOOPBACK, EmulatorProcess, free_port, moto_server

__all__ = ["KINESIS_MOCK_HOME", "LOOPBACK", "EmulatorProcess", "free_port", "kinesis_mock", "moto_server"]

KINESIS_MOCK_HOME = (
    Path(__file__).resolve().parents[1] / "packaging" / "kinesis-mock" / "node_modules" / "kinesis-local"
)


def kinesis_mock(
    port: int | None = None,
    reshard_duration: str = "50ms",
    shard_limit: int = 2000,
    extra_env: dict[str, str] | None = None,
) -> EmulatorProcess:
    """The checkout's kinesis-mock on a free loopback port, with fast stream operations for tests and the demo."""
    if not (KINESIS_MOCK_HOME / "main.js").exists():
        raise FileNotFoundError(f"kinesis-mock is not installed at {KINESIS_MOCK_HOME}; run scripts/bootstrap.sh first")
    return emulators.kinesis_mock(KINESIS_MOCK_HOME, port, reshard_duration, shard_limit, extra_env)
