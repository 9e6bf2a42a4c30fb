"""The Python driver of a consume try that meets a fault at its Delta table commit (fault `table_commit`).

For that one try, spark-submit starts this module instead of the plain interpreter (the campaign points
`PYSPARK_DRIVER_PYTHON` at `launcher`'s script): it wraps `DeltaSink._append`, the one call that writes a
round's commit into the table's log, and runs consume_job.py as `__main__`, as spark-submit would. The
try's first commit then meets the fault `COMMIT_FAULT_VARIABLE` names (`<variant>:<note path>`). Before
the fault acts, a note (`CommitNote`) tells the campaign what happened and when:

- killed_before: SIGKILL once the position map of its transaction version is written, before the
  commit: a version claimed and never committed, batches the lease table says committed and the table
  lacks.
- killed_after: SIGKILL once the commit is in the log, before the driver hears of it: no report, the
  round fails, the next round finds the batches in the table.
- answer_lost: the commit is made, then its call fails as one whose answer was lost (a dropped
  connection): the round's publication fails and the try exits 1 although its commit is in the table;
  the campaign retries the round as Airflow would.
- answer_as_conflict: the commit is made, then its call fails as a lost race (`CommitFailedError`), which
  is how delta-rs answers on S3 when it retries a conditional put whose answer was lost and meets its own
  first put: the driver must tell its own commit from another publisher's.
- stalled: SIGSTOP just before the commit (a frozen driver: a long pause, a suspended machine). The
  campaign retries the round beside it and resumes it with SIGCONT once another commit is in the log,
  so its commit meets a newer head than the one it planned on.

The faults are injected inside the job because no process boundary lies between a position map and its
commit (they are milliseconds apart), and a local file system has no answer to lose. The wrapper never
changes what a commit holds: every call it lets through is the sink's own.
"""

from __future__ import annotations

import errno
import json
import os
import runpy
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

COMMIT_FAULT_VARIABLE = "KINESIS_CHAOS_COMMIT_FAULT"
KILLED_BEFORE = "killed_before"
KILLED_AFTER = "killed_after"
ANSWER_LOST = "answer_lost"
ANSWER_AS_CONFLICT = "answer_as_conflict"
STALLED = "stalled"
VARIANTS = (KILLED_BEFORE, KILLED_AFTER, ANSWER_LOST, ANSWER_AS_CONFLICT, STALLED)
LAUNCHER_NAME = "commit-fault-python"


@dataclass(frozen=True)
class CommitNote:
    """What the driver's commit met: the fault, the transaction version and commit id of the commit."""

    variant: str
    version: int  # the application's transaction version the commit carries (its position map's)
    commit_id: str
    pid: int  # the Python driver's
    at: float  # time.time() when the fault acted

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(asdict(self)))
        temporary.replace(path)  # the campaign never reads half a note

    @classmethod
    def read(cls, path: Path) -> CommitNote | None:
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None


def launcher(directory: Path) -> Path:
    """An executable that runs this module with this interpreter (`PYSPARK_DRIVER_PYTHON` takes one path)."""
    path = directory / LAUNCHER_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bench.chaos.commit_faults "$@"\n')
    path.chmod(0o755)
    return path


def driver_environment(launcher_path: Path, variant: str, note: Path) -> dict[str, str]:
    """The environment of the try whose driver meets `variant` at its first commit."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown table commit fault {variant!r}; the variants are {', '.join(VARIANTS)}")
    return {"PYSPARK_DRIVER_PYTHON": str(launcher_path), COMMIT_FAULT_VARIABLE: f"{variant}:{note}"}


def install(variant: str, note: Path) -> None:
    """Wrap `DeltaSink._append` so that the first commit of this process meets `variant` (module doc)."""
    from deltalake.exceptions import CommitFailedError

    from sinks.table.committer import SUMMARY_COMMIT_ID
    from sinks.table.delta import DeltaSink

    real_append: Callable[..., None] = DeltaSink._append
    met: list[CommitNote] = []

    def append(self: DeltaSink, table: Any, plan: Any, info: dict[str, str], version: int) -> None:
        if met:
            real_append(self, table, plan, info, version)
            return
        met.append(CommitNote(variant, version, info[SUMMARY_COMMIT_ID], os.getpid(), time.time()))
        if variant in (KILLED_BEFORE, STALLED):
            met[0].write(note)
            os.kill(os.getpid(), signal.SIGKILL if variant == KILLED_BEFORE else signal.SIGSTOP)
            real_append(self, table, plan, info, version)  # resumed by SIGCONT
            return
        real_append(self, table, plan, info, version)
        met[0].write(note)
        if variant == KILLED_AFTER:
            os.kill(os.getpid(), signal.SIGKILL)
        if variant == ANSWER_LOST:
            with self.failures("commit the round"):  # the sink's own translation of a dropped connection
                raise ConnectionResetError(errno.ECONNRESET, "the commit's answer was lost (injected)")
        raise CommitFailedError("the commit's version already exists (injected: its own answer was lost)")

    DeltaSink._append = append  # type: ignore[method-assign,assignment]


def main(argv: Sequence[str]) -> int:
    """`argv`: the driver's script (consume_job.py) and its arguments, as spark-submit passes them."""
    variant, _, note = os.environ[COMMIT_FAULT_VARIABLE].partition(":")
    install(variant, Path(note))
    script, *arguments = argv
    sys.argv = [script, *arguments]
    runpy.run_path(script, run_name="__main__")  # consume_job.py ends with sys.exit(main())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
