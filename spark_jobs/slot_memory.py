"""Arrow's allocator in a slot process: the system's, not pyarrow's default mimalloc.

A slot reads its leases on a thread each and lets go of each batch's memory soon after; what the
allocator keeps of it was most of a slot's memory (docs/performance.md, "Memory"). mimalloc keeps
memory for each thread that allocates, about 7 MiB per reading thread where transparent huge pages
back it. At the peak of a 64-lease catch-up with Arrow holding 140 MiB, a slot under mimalloc had
added about 1.6 GiB of RSS, under the system's allocator or jemalloc 320 MiB.

Only ARROW_DEFAULT_MEMORY_POOL, in the environment when pyarrow is imported, changes the pool Arrow's
C++ code allocates from (Parquet writing, compute kernels): `pyarrow.set_memory_pool` changes
pyarrow's own default only, and the same slot still added 900 MiB. So the consume job hands the
setting to its executors (`spark.executorEnv`, unless the submitter set it), and a slot that starts
without it (a process that imported pyarrow before) moves what it can and says so.
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa

log = logging.getLogger(__name__)

# pyarrow's own setting, read when it is imported.
POOL_SETTING = "ARROW_DEFAULT_MEMORY_POOL"
# The system's allocator: jemalloc took as little memory (not in every pyarrow build), and as little CPU.
SLOT_POOL = "system"
# The Spark setting that puts it in the executors' environment, before their Python workers import pyarrow.
EXECUTOR_POOL_SETTING = f"spark.executorEnv.{POOL_SETTING}"


def use_slot_memory_pool() -> str:
    """Where the executor's environment did not choose Arrow's pool: the system's for pyarrow's own
    allocations, and a warning (once a process) that Arrow's C++ ones stay with its default. The
    backend in use."""
    if not os.environ.get(POOL_SETTING) and pa.default_memory_pool().backend_name != SLOT_POOL:
        log.warning(
            "%s is not set in this executor's environment: Arrow's C++ code allocates from %s, which keeps "
            "memory per reading thread; set it to %s (the consume job's spark.executorEnv does)",
            POOL_SETTING,
            pa.default_memory_pool().backend_name,
            SLOT_POOL,
        )
        pa.set_memory_pool(pa.system_memory_pool())
    return str(pa.default_memory_pool().backend_name)
