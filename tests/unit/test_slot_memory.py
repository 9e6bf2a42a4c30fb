"""How a slot process allocates (`spark_jobs.slot_memory`). Arrow's pool: the executors' environment chooses it; a slot
that starts without the setting moves pyarrow's own allocations to the system's and says so. glibc's heap: a slot
process keeps the blocks it frees for its next ones."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pyarrow as pa
import pytest

from spark_jobs import slot_memory
from spark_jobs.slot_memory import POOL_SETTING, use_slot_memory_pool


@pytest.fixture(autouse=True)
def default_pool_restored() -> Iterator[None]:
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


def test_a_slot_without_the_setting_allocates_with_the_system_allocator_and_warns(monkeypatch, caplog):
    monkeypatch.delenv(POOL_SETTING, raising=False)
    pa.set_memory_pool(pa.mimalloc_memory_pool())  # pyarrow's default, imported without the setting
    with caplog.at_level(logging.WARNING, logger="spark_jobs.slot_memory"):
        assert use_slot_memory_pool() == "system"
    assert POOL_SETTING in caplog.text


def test_a_slot_warns_once_a_process(monkeypatch, caplog):
    monkeypatch.delenv(POOL_SETTING, raising=False)
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    use_slot_memory_pool()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spark_jobs.slot_memory"):
        assert use_slot_memory_pool() == "system"
    assert not caplog.text


def test_the_pool_the_environment_chose_is_kept(monkeypatch, caplog):
    monkeypatch.setenv(POOL_SETTING, "mimalloc")
    pa.set_memory_pool(pa.mimalloc_memory_pool())  # what pyarrow chose when imported with the setting
    with caplog.at_level(logging.WARNING, logger="spark_jobs.slot_memory"):
        assert use_slot_memory_pool() == "mimalloc"
    assert not caplog.text


# Run in a process of its own: glibc's settings are the process's. A 16 MiB block, as a GetRecords body
# is, freed and asked for again: the page faults of the second.
_REUSED_BLOCK = """
import resource, sys
from spark_jobs.slot_memory import hold_freed_memory

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

if sys.argv[1] == "held":
    assert hold_freed_memory()
block = b"x" * (16 << 20)
del block
before = faults()
block = b"x" * (16 << 20)
print(faults() - before)
"""


def second_block_faults(mode: str) -> int:
    # glibc's own defaults: none of the environment's malloc settings.
    environment = {
        name: value for name, value in os.environ.items() if name != "GLIBC_TUNABLES" and not name.startswith("MALLOC_")
    }
    done = subprocess.run(
        [sys.executable, "-c", _REUSED_BLOCK, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=environment,
    )
    return int(done.stdout)


def test_a_slot_process_reuses_the_blocks_it_freed_without_new_pages():
    # glibc's defaults: the first 16 MiB block is mapped and unmapped, the second is new heap pages (a
    # fault a page, 4,096 here; a few where transparent huge pages are always on).
    default = second_block_faults("default")
    held = second_block_faults("held")
    assert default > 0
    assert held * 20 <= default, (held, default)


def test_a_process_that_cannot_load_libraries_runs_its_slots_with_the_heap_as_it_is(monkeypatch):
    def refuse(*_: object, **__: object) -> None:
        raise OSError("Dynamic loading not supported")

    slot_memory._glibc.cache_clear()
    monkeypatch.setattr(slot_memory.ctypes, "CDLL", refuse)
    try:
        assert slot_memory.hold_freed_memory() is False
    finally:
        slot_memory._glibc.cache_clear()
