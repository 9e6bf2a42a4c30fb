"""Running the installed `leasectl` console script as a real process, pointed at emulators."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LEASECTL = Path(sys.executable).with_name("leasectl")


def run_leasectl(
    *arguments: str, dynamodb: str | None = None, kinesis: str | None = None, **environment: str
) -> subprocess.CompletedProcess[str]:
    """Run leasectl with a clean AWS endpoint environment: only what the test passes."""
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("AWS_ENDPOINT_URL", "KINESIS_LEASE_"))
    }
    if dynamodb is not None:
        env["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb
    if kinesis is not None:
        env["AWS_ENDPOINT_URL_KINESIS"] = kinesis
    env.update(environment)
    return subprocess.run(
        [str(LEASECTL), *arguments], capture_output=True, text=True, env=env, timeout=120, check=False
    )
