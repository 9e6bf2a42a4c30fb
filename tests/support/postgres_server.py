"""A throwaway PostgreSQL server on 127.0.0.1 for tests: Debian's package, a fresh cluster, one database.

`initdb` makes a cluster in a temporary folder, `pg_ctl start` runs it on a free loopback port with its
socket in that folder (never the system's /var/run/postgresql), and `pg_ctl stop` ends it: pg_ctl
signals the postmaster by the PID in the cluster's own postmaster.pid, so only this server is
stopped. PostgreSQL refuses to run as root; as root, the server runs as Debian's `postgres` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devtools.emulators import LOOPBACK, free_port

SUPERUSER = "airflow"
START_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class PostgresServer:
    port: int
    database: str

    def sqlalchemy_url(self, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{SUPERUSER}@{LOOPBACK}:{self.port}/{self.database}"


def postgres_binaries() -> Path:
    """The folder of Debian's PostgreSQL programs (the newest version installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda path: int(path.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: scripts/bootstrap.sh installs Debian's postgresql package")
    return Path(found[-1]).parent


@contextmanager
def postgres_server(database: str = "airflow") -> Iterator[PostgresServer]:
    """A started server with `database` (owner and trusted superuser: `airflow`, loopback only); stopped on exit."""
    binaries = postgres_binaries()
    folder = Path(tempfile.mkdtemp(prefix="postgres-"))
    cluster = folder / "cluster"
    as_owner = _as_cluster_owner(folder)
    _run([*as_owner, str(binaries / "initdb"), "-D", str(cluster), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8"])
    port = free_port()
    options = f"-c listen_addresses={LOOPBACK} -p {port} -c unix_socket_directories={folder} -c fsync=off"
    start = [str(binaries / "pg_ctl"), "-D", str(cluster), "-l", str(folder / "server.log"), "-o", options]
    _run([*as_owner, *start, "-w", "-t", str(START_TIMEOUT_SECONDS), "start"])
    try:
        _run([str(binaries / "createdb"), "-h", LOOPBACK, "-p", str(port), "-U", SUPERUSER, database])
        yield PostgresServer(port, database)
    finally:
        _run([*as_owner, str(binaries / "pg_ctl"), "-D", str(cluster), "-m", "fast", "-w", "stop"])
        shutil.rmtree(folder, ignore_errors=True)


def _as_cluster_owner(folder: Path) -> list[str]:
    """The command prefix that runs PostgreSQL's programs as a user it accepts, owning `folder`."""
    if os.geteuid() != 0:
        return []
    shutil.chown(folder, "postgres", "postgres")
    return ["runuser", "-u", "postgres", "--"]


def _run(command: list[str]) -> None:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, cwd=tempfile.gettempdir()
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
