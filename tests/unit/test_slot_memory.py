"""Arrow's allocator in a slot process (`spark_jobs.arrow_memory`): the executors' environment chooses it; a slot
that starts without the setting moves pyarrow's own allocations to the system's and says so."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
import pytest

from spark_jobs.arrow_memory import POOL_SETTING, use_slot_memory_pool


@pytest.fixture(autouse=True)
def default_pool_restored() -> Iterator[None]:
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


def test_a_slot_without_the_setting_allocates_with_the_system_allocator_and_warns(monkeypatch, caplog):
    monkeypatch.delenv(POOL_SETTING, raising=False)
    pa.set_memory_pool(pa.mimalloc_memory_pool())  # pyarrow's default, imported without the setting
    with caplog.at_level(logging.WARNING, logger="spark_jobs.arrow_memory"):
        assert use_slot_memory_pool() == "system"
    assert POOL_SETTING in caplog.text


def test_a_slot_warns_once_a_process(monkeypatch, caplog):
    monkeypatch.delenv(POOL_SETTING, raising=False)
    pa.set_memory_pool(pa.mimalloc_memory_pool())
    use_slot_memory_pool()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spark_jobs.arrow_memory"):
        assert use_slot_memory_pool() == "system"
    assert not caplog.text


def test_the_pool_the_environment_chose_is_kept(monkeypatch, caplog):
    monkeypatch.setenv(POOL_SETTING, "mimalloc")
    pa.set_memory_pool(pa.mimalloc_memory_pool())  # what pyarrow chose when imported with the setting
    with caplog.at_level(logging.WARNING, logger="spark_jobs.arrow_memory"):
        assert use_slot_memory_pool() == "mimalloc"
    assert not caplog.text
