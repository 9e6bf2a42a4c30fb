"""KCL's garbage check in rounds: Kinesis is asked about unlisted shards at most once per interval."""

from __future__ import annotations

import pytest

from devtools.shard_lineage import LineageBuilder, shard_id
from lease_core.errors import DependencyError
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.sync.garbage_probe import GarbageProbe, garbage_pass_due
from tests.support.shard_sources import FakeShardSource

HOUR = 3_600_000


@pytest.mark.parametrize(
    ("last_pass", "now", "due"),
    [
        pytest.param(None, 5, True, id="never-asked"),
        pytest.param(1_000, 1_000 + HOUR - 1, False, id="within-the-interval"),
        pytest.param(1_000, 1_000 + HOUR, True, id="the-interval-elapsed"),
        pytest.param(1_000, 1_000, False, id="asked-this-very-moment"),
        pytest.param(1_000 + HOUR, 1_000, False, id="a-pass-recorded-ahead-of-this-clock"),
    ],
)
def test_when_a_garbage_pass_is_due(last_pass, now, due):
    assert garbage_pass_due(last_pass, now, HOUR) is due


class FailingSource(FakeShardSource):
    def shard_exists(self, stream_name: str, shard_id: str) -> bool:
        raise DependencyError("kinesis", "GetShardIterator", "connection reset", 4)


def test_a_pass_whose_questions_failed_is_not_recorded_and_is_asked_again_next_round():
    state = InMemoryCoordinatorStateStore()
    failing = FailingSource()
    failing.create_stream("orders", LineageBuilder(1).shards())
    with pytest.raises(DependencyError):
        GarbageProbe(failing, state, lambda: 1_000, HOUR).ask("orders", "orders", {shard_id(7)})
    assert state.get(GarbageProbe.record_key("orders")) is None

    working = FakeShardSource(shards=failing.shards, descriptions=failing.descriptions)
    answers = GarbageProbe(working, state, lambda: 1_001, HOUR).ask("orders", "orders", {shard_id(7), shard_id(0)})
    assert answers == {shard_id(0): True, shard_id(7): False}
