"""How many leases a slot reads at once, and how its buffer is shared between their batches."""

from __future__ import annotations

import pytest

from spark_jobs.consume_spec import ConsumeSpec
from spark_jobs.lease_consumer import LeaseBudget
from spark_jobs.slot_task import MIN_BATCH_BYTES, batch_budget, reading_threads

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("lease_threads", "leases", "threads"),
    [
        pytest.param(None, 32, 32, id="default-every-lease-at-once"),
        pytest.param(8, 32, 8, id="capped-by-the-spec"),
        pytest.param(8, 3, 3, id="never-more-threads-than-leases"),
        pytest.param(None, 0, 1, id="no-lease-still-one-thread"),
        pytest.param(None, 500, 64, id="default-at-most-64"),
        pytest.param(100, 500, 100, id="the-spec-may-ask-for-more"),
    ],
)
def test_a_slot_reads_every_lease_it_holds_at_once_unless_the_spec_caps_it(lease_threads, leases, threads):
    assert reading_threads(lease_threads, leases) == threads


def spec(slot_buffer_bytes: int = 256 * MIB, file_max_bytes: int = 128 * MIB) -> ConsumeSpec:
    budget = LeaseBudget(max_records=500, file_max_bytes=file_max_bytes)
    return ConsumeSpec(("orders",), 2, "/lake", 1, budget=budget, slot_buffer_bytes=slot_buffer_bytes)


@pytest.mark.parametrize(
    ("threads", "file_max_bytes"),
    [
        pytest.param(1, 128 * MIB, id="one-lease-keeps-the-file-size"),
        pytest.param(32, 8 * MIB, id="thirty-two-leases-share-256-mib"),
        pytest.param(1024, MIN_BATCH_BYTES, id="never-below-the-minimum-batch"),
    ],
)
def test_each_lease_read_at_once_batches_its_share_of_the_slot_buffer(threads, file_max_bytes):
    budget = batch_budget(spec(), threads)
    assert budget.file_max_bytes == file_max_bytes
    assert budget.max_records == 500, "the rest of the budget is the spec's"


def test_a_smaller_file_size_asked_for_is_kept():
    assert batch_budget(spec(file_max_bytes=2 * MIB), 4).file_max_bytes == 2 * MIB


def test_a_spec_refuses_a_buffer_or_thread_count_below_one():
    with pytest.raises(ValueError, match="slot_buffer_bytes"):
        spec(slot_buffer_bytes=0)
    with pytest.raises(ValueError, match="lease_threads"):
        ConsumeSpec(("orders",), 2, "/lake", 1, lease_threads=0)
