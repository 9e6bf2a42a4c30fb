"""The README's walk-through ("Your own pipelines") as a newcomer runs it: its ```bash blocks, in order,
each in a fresh `bash` that starts where the one before ended (its exported variables, its folder), in
a home folder of its own (`~` is the test's), with the machine's `python3.11` on PATH.

Variables a block sets stay for the next ones, as in one terminal (`set -a` exports each, and the next
block starts from `export -p`). A block that starts `airflow api-server` is what the README runs "in a
second terminal": it is started in the background, in a process group of its own, and waited for
until it answers; it is stopped with the shell. Its port, 8080 in the README, is a free one in every
block.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.airflow_server import stop_process_group

README = Path(__file__).resolve().parents[2] / "README.md"
README_PORT = "8080"
SERVER = "airflow api-server"
BLOCK_TIMEOUT = 900
SERVER_STARTUP_SECONDS = 180


def walkthrough_blocks() -> list[str]:
    """The walk-through's bash blocks, in order."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Your own pipelines") : text.index("#### In a deployment")]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@dataclass
class ReadmeShell:
    """A newcomer's terminal: `home` is `~`, `start` the folder the first block runs in."""

    home: Path
    start: Path
    environment: Mapping[str, str]
    port: str = field(default_factory=_free_port)
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = self.home / ".walkthrough"
        self.state.mkdir(parents=True)
        tools = self.state / "bin"  # the machine's Python 3.11 as `python3.11`, as the README expects
        tools.mkdir()
        (tools / "python3.11").symlink_to(getattr(sys, "_base_executable", sys.executable))
        path = f"{tools}{os.pathsep}{self.environment.get('PATH', '')}"
        self.base = {**self.environment, "HOME": str(self.home), "PATH": path}
        (self.state / "cwd").write_text(str(self.start))

    def run(self, block: str) -> str:
        """Run one block; its output (stdout and stderr). A failing command fails it, naming the block."""
        block = block.replace(README_PORT, self.port)
        if block.lstrip().startswith(SERVER):
            self._serve(block)
            return ""
        result = subprocess.run(
            ["bash", "-c", self._script(block)],
            capture_output=True,
            text=True,
            env=self.base,
            timeout=BLOCK_TIMEOUT,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, (
            f"the README's block failed ({result.returncode}):\n{block}\n---\n{output[-5000:]}"
        )
        return output

    def variable(self, name: str) -> str:
        """A variable the blocks exported so far."""
        return subprocess.run(
            ["bash", "-c", f'. {self.state / "exports"}; printf %s "${name}"'],
            capture_output=True,
            text=True,
            env=self.base,
            check=True,
        ).stdout

    def stop(self) -> None:
        for server in self.servers:
            stop_process_group(server)

    def _script(self, block: str) -> str:
        exports, cwd = self.state / "exports", self.state / "cwd"
        return (
            f'[ -f {exports} ] && . {exports}\ncd "$(cat {cwd})"\nset -aeo pipefail\n{block}\n'
            f"export -p > {exports}\npwd > {cwd}\n"
        )

    def _serve(self, block: str) -> None:
        log = self.state / "api-server.log"
        with log.open("ab") as output:
            server = subprocess.Popen(
                ["bash", "-c", self._script(f"exec {block.strip()}")],
                env=self.base,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.servers.append(server)
        deadline = time.monotonic() + SERVER_STARTUP_SECONDS
        while time.monotonic() < deadline:
            assert server.poll() is None, f"the API server exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/monitor/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"the API server did not answer in {SERVER_STARTUP_SECONDS} s:\n{log.read_text()[-3000:]}")
