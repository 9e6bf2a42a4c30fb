"""Arrow's allocator in a slot process: jemalloc (else the system's), not pyarrow's default mimalloc.

mimalloc keeps memory for each thread that allocates, and where transparent huge pages are on, that
memory is backed by them: about 7 MiB per reading thread, which a slot reading 64 leases (about 70
threads) holds whatever its `slot_buffer_bytes` (docs/performance.md, "Memory"). jemalloc and glibc's
allocator give it back. The choice is made where the slot starts rather than left to
ARROW_DEFAULT_MEMORY_POOL in the executors' environment: that setting has to be in place before
pyarrow is imported, in every deployment (Spark's executor environment, the embedded demo, tests), and
one that misses it holds the memory again without a word. An operator who sets it keeps their choice.
"""

from __future__ import annotations

import os

import pyarrow as pa

# pyarrow's own setting, read when it is imported: set, it is the operator's choice and is left alone.
POOL_SETTING = "ARROW_DEFAULT_MEMORY_POOL"


def use_slot_memory_pool() -> str:
    """Make jemalloc (or, in a pyarrow built without it, the system's allocator) Arrow's default pool
    in this process, unless ARROW_DEFAULT_MEMORY_POOL says otherwise: the backend in use."""
    if not os.environ.get(POOL_SETTING):
        try:
            pool = pa.jemalloc_memory_pool()
        except NotImplementedError:  # pyarrow built without jemalloc (its macOS and Windows wheels)
            pool = pa.system_memory_pool()
        pa.set_memory_pool(pool)
    return str(pa.default_memory_pool().backend_name)
