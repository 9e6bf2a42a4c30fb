"""The campaign's transform, run inside the Spark executors on every batch.

`pace` passes the batch on unchanged (so the job stays deterministic) after a short sleep: a batch
then spends most of its time between its prepare and its commit, as a batch with a heavy transform
does, so a kill at a random moment usually lands mid-batch. It also notes, per Python worker, which
slot (Spark partition) and task attempt it runs and whether it is inside a batch right now, so the
campaign can say what it killed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

PACE_SECONDS = 0.3
CONTROL_DIR_VARIABLE = "KINESIS_CHAOS_CONTROL_DIR"


@dataclass(frozen=True)
class WorkerNote:
    slot: int
    task_attempt: int
    in_batch: bool


def pace(table: pa.Table) -> pa.Table:
    _note(in_batch=True)
    time.sleep(PACE_SECONDS)
    _note(in_batch=False)
    return table


def _note(in_batch: bool) -> None:
    from pyspark import TaskContext

    context = TaskContext.get()
    control = os.environ.get(CONTROL_DIR_VARIABLE)
    if context is None or control is None:
        return
    note = Path(control) / f"worker-{os.getpid()}"
    note.write_text(f"{context.partitionId()} {context.attemptNumber()} {int(in_batch)}\n")


def worker_note(control_dir: Path, pid: int) -> WorkerNote | None:
    """What the worker `pid` noted last, or None when it has not run a batch."""
    try:
        slot, attempt, in_batch = (control_dir / f"worker-{pid}").read_text().split()
    except (OSError, ValueError):
        return None
    return WorkerNote(int(slot), int(attempt), in_batch == "1")
