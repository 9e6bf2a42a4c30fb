"""Transforms that steer a consume job from the test process (they run inside Spark executors), and a
few ordinary user transforms and decoders.

Instructions are files in the session's control directory (`KINESIS_TEST_CONTROL_DIR`), named after
the shard they apply to, so that one test's instructions never touch another test's stream:

- `crash-once-<stream>-<shard>`: the first task attempt that transforms a batch of that shard kills
  its Python worker (os._exit), after the batch was prepared and before it was written.
- `block-<stream>-<shard>`: the transform writes `blocked-<stream>-<shard>` and waits until the test
  creates `release-<stream>-<shard>`.
- `fail-<stream>-<shard>`: the transform raises.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa

from spark_jobs.decode import RecordContext

BLOCK_TIMEOUT_SECONDS = 60.0


def _control() -> Path:
    return Path(os.environ["KINESIS_TEST_CONTROL_DIR"])


def _batch_of(table: pa.Table) -> str:
    return f"{table.column('stream_name')[0].as_py()}-{table.column('shard_id')[0].as_py()}"


def steer(table: pa.Table) -> pa.Table:
    """Obey the control directory's instruction for this batch's shard, then pass the batch on."""
    if table.num_rows == 0:
        return table
    batch = _batch_of(table)
    control = _control()
    if (control / f"fail-{batch}").exists():
        raise RuntimeError(f"instructed to fail on {batch}")
    if (control / f"crash-once-{batch}").exists():
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0:
            (control / f"crashed-{batch}").touch()
            os._exit(1)
    if (control / f"block-{batch}").exists():
        (control / f"blocked-{batch}").touch()
        deadline = time.monotonic() + BLOCK_TIMEOUT_SECONDS
        while not (control / f"release-{batch}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return table


def upper_case_data(table: pa.Table) -> pa.Table:
    """An ordinary user transform: upper-cases every payload and keeps a payload length column."""
    data = [value.upper() for value in table.column("data").to_pylist()]
    table = table.set_column(table.schema.get_field_index("data"), "data", pa.array(data, pa.binary()))
    return table.append_column("data_length", pa.array([len(value) for value in data], pa.int64()))


def refuse_poison(table: pa.Table) -> pa.Table:
    """A user transform with a deterministic bug: it cannot handle a record whose payload is `poison`."""
    if b"poison" in table.column("data").to_pylist():
        raise ValueError("cannot decode the payload b'poison'")
    return table


def text_payload(data: bytes, record: RecordContext) -> dict[str, bytes]:
    """A user decoder: a payload of UTF-8 text lands as it came; one that is not (a malformed record,
    such as `MALFORMED_MARK` starts) raises UnicodeDecodeError, and the pipeline rejects the record."""
    data.decode("utf-8")
    return {"data": data}


text_payload.schema = pa.schema([pa.field("data", pa.binary(), nullable=False)])

# No UTF-8 text starts with this byte: a payload that does is one `text_payload` rejects.
MALFORMED_MARK = b"\xff"


def stall(table: pa.Table) -> pa.Table:
    """A user transform that takes far longer than its task may run (a hung call to a service, say)."""
    time.sleep(600)
    return table
