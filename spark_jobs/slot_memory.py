"""How a slot process allocates: Arrow's pool (the system's), and glibc's heap held while the slot runs.

Arrow's pool. A slot reads its leases on a thread each and lets go of each batch's memory soon after;
what the allocator keeps of it was most of a slot's memory (docs/performance.md, "Memory"). mimalloc,
pyarrow's default, keeps memory for each thread that allocates, about 7 MiB per reading thread where
transparent huge pages back it. At the peak of a 64-lease catch-up with Arrow holding 140 MiB, a slot
under mimalloc had added about 1.6 GiB of RSS, under the system's allocator or jemalloc 320 MiB.
Only ARROW_DEFAULT_MEMORY_POOL, in the environment when pyarrow is imported, changes the pool Arrow's
C++ code allocates from (Parquet writing, compute kernels): `pyarrow.set_memory_pool` changes
pyarrow's own default only, and the same slot still added 900 MiB. So the consume job hands the
setting to its executors (`spark.executorEnv`, unless the submitter set it), and a slot that starts
without it (a process that imported pyarrow before) moves what it can and says so.

glibc's heap (`hold_freed_memory`). A slot allocates and frees the same large blocks over and over: a
GetRecords body (up to 13 MiB of JSON), its records, their Arrow columns, a KPL batch's split. glibc
hands blocks above its mmap threshold (128 KiB at first, raised to the largest freed, up to 32 MiB)
straight back to the kernel, and gives back any free top of a heap above twice that: every next block
is then new pages, each faulted in and zeroed by the kernel. A profile of a slot on KPL aggregates
(`perf`, 8 leases) spent about a quarter of its CPU in page faults and madvise. So a slot process's
glibc keeps what it frees for its next blocks: blocks up to 32 MiB come from the heap, a heap's free top
is kept up to 256 MiB, and threads that start allocating after it share two arenas, since the
interpreter's lock already serializes most of their allocations (glibc keeps the arenas it made
before, and makes no more once it has more than 8). The process holds what its largest slot needed at
its peak (bounded by `slot_buffer_bytes`, measured in docs/performance.md), for the next round's slot
to reuse. Giving it back when each slot ends cost 8% more CPU in `bench/pipeline_cpu.py` (every
round's blocks faulted in again) and lowers no peak. The settings are the process's, for its life: in
the consume job a Python worker runs slots; another Python task Spark gives the same worker (of the
same application) allocates under them too. Off glibc (musl, macOS, or an allocator preloaded in
glibc's place, which takes the call and ignores it) nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import cache

import pyarrow as pa

log = logging.getLogger(__name__)

# pyarrow's own setting, read when it is imported.
POOL_SETTING = "ARROW_DEFAULT_MEMORY_POOL"
# The system's allocator: jemalloc took as little memory (not in every pyarrow build), and as little CPU.
SLOT_POOL = "system"
# The Spark setting that puts it in the executors' environment, before their Python workers import pyarrow.
EXECUTOR_POOL_SETTING = f"spark.executorEnv.{POOL_SETTING}"

# mallopt(3)'s parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# What a slot's heap holds on to (module doc): glibc's own ceiling for its mmap threshold, a free top
# of a heap kept up to 256 MiB, two arenas.
HELD_HEAP_SETTINGS = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 256 << 20), (_M_ARENA_MAX, 2))


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


@cache
def _glibc() -> ctypes.CDLL | None:
    """The process's own C library when it is glibc (it has mallopt), else None: looked up among the
    symbols the process has loaded, so that nothing is loaded nor searched for."""
    try:
        library = ctypes.CDLL(None)
    except OSError:  # a process that cannot load libraries at all (a static build)
        return None
    if not all(hasattr(library, symbol) for symbol in ("mallopt", "gnu_get_libc_version")):
        return None
    library.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return library


def hold_freed_memory() -> bool:
    """glibc keeps what this process frees for its next blocks (module doc); a second call changes
    nothing. Whether it does: False off glibc, or where glibc refused a setting (logged)."""
    glibc = _glibc()
    if glibc is None:
        return False
    refused = [(parameter, value) for parameter, value in HELD_HEAP_SETTINGS if glibc.mallopt(parameter, value) != 1]
    if refused:
        log.warning("glibc refused mallopt %s: this slot process gives freed memory back as it goes", refused)
    return not refused
