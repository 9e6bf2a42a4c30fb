"""Arrow's allocator in a slot process (`spark_jobs.arrow_memory`): the system's, unless the operator chose one."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from spark_jobs.arrow_memory import POOL_SETTING, use_slot_memory_pool


@pytest.fixture(autouse=True)
def default_pool_restored() -> Iterator[None]:
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


def test_a_slot_allocates_with_the_system_allocator(monkeypatch):
    monkeypatch.delenv(POOL_SETTING, raising=False)
    assert use_slot_memory_pool() == "system"
    assert pa.default_memory_pool().backend_name == "system"


def test_an_operator_who_set_arrows_pool_keeps_it(monkeypatch):
    monkeypatch.setenv(POOL_SETTING, "mimalloc")
    pa.set_memory_pool(pa.mimalloc_memory_pool())  # what pyarrow chose when imported with the setting
    assert use_slot_memory_pool() == "mimalloc"
