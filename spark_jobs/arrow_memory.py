"""Arrow's allocator in a slot process: the system's (glibc's malloc), not pyarrow's default mimalloc.

A slot reads its leases on a thread each and lets go of each batch's memory soon after; what an
allocator keeps of it is most of a slot's memory (docs/performance.md, "Memory"). mimalloc keeps
memory for each thread that allocates, about 7 MiB per reading thread where transparent huge pages
back it; jemalloc, as pyarrow builds it, kept 840 MiB of RSS for 140 MiB allocated at the peak of a
64-lease catch-up (even with its decay at 0); the system's allocator 320 MiB. The choice is made where
the slot starts rather than left to ARROW_DEFAULT_MEMORY_POOL in the executors' environment: that
setting has to be in place before pyarrow is imported, in every deployment (Spark's executor
environment, the embedded demo, tests), and one that misses it holds the memory again without a word.
An operator who sets it keeps their choice.
"""

from __future__ import annotations

import os

import pyarrow as pa

# pyarrow's own setting, read when it is imported: set, it is the operator's choice and is left alone.
POOL_SETTING = "ARROW_DEFAULT_MEMORY_POOL"


def use_slot_memory_pool() -> str:
    """Make the system's allocator Arrow's default pool in this process, unless
    ARROW_DEFAULT_MEMORY_POOL says otherwise: the backend in use."""
    if not os.environ.get(POOL_SETTING):
        pa.set_memory_pool(pa.system_memory_pool())
    return str(pa.default_memory_pool().backend_name)
