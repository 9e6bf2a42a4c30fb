"""A round that lost records for good says which, so the finalize step can fail the run as the alert."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from kinesis_lease.operators import records_lost

from lease_core.errors import LeaseCoreError, RecordsLostError
from spark_jobs.round_report import RetentionLoss

AGED_OUT = RetentionLoss("shardId-000000000001", "49600000000000000001", "49600000000000000090", None)


@pytest.mark.parametrize(
    ("losses", "shard_sync", "expected"),
    [
        pytest.param((), {"possibly_unread": []}, (), id="nothing-lost"),
        pytest.param((), {}, (), id="idle-round-without-report"),
        pytest.param(
            (AGED_OUT,),
            {},
            (
                "lease shardId-000000000001: records after 49600000000000000001 aged out of the stream before they "
                "were read (first still available: 49600000000000000090)",
            ),
            id="retention-gap",
        ),
        pytest.param(
            (dataclasses.replace(AGED_OUT, first_available=None),),
            {},
            (
                "lease shardId-000000000001: records after 49600000000000000001 aged out of the stream before they "
                "were read (first still available: none)",
            ),
            id="retention-gap-with-nothing-left",
        ),
        pytest.param(
            (),
            {"possibly_unread": ["shardId-000000000007"]},
            (
                "lease shardId-000000000007: its shard no longer exists and the lease never reached SHARD_END, so its "
                "last records may have expired unread",
            ),
            id="lease-deleted-before-shard-end",
        ),
    ],
)
def test_every_loss_of_the_round_is_named(losses, shard_sync, expected):
    assert records_lost(losses, shard_sync) == expected


def test_a_committed_batch_whose_file_was_deleted_before_it_was_visible_is_a_loss():
    missing = ("shardId-000000000002: stream_name=s/shard_id=shardId-000000000002/b.parquet",)
    assert records_lost((), {}, missing) == (
        "lease shardId-000000000002: stream_name=s/shard_id=shardId-000000000002/b.parquet: committed, but its file "
        "was deleted before it was visible in the sink",
    )


def test_records_a_table_lacks_for_another_reason_are_a_loss_with_the_tables_own_words():
    missing = (
        "shardId-000000000002: the table holds the lease through 12, but its next batch starts after 15: the records "
        "between are not in the table (rolled back, or skipped)",
    )
    assert records_lost((), {}, missing) == (f"lease {missing[0]}",)


def test_the_loss_error_is_final_names_every_loss_and_pickles():
    error = RecordsLostError(("lease a: gone", "lease b: gone"))
    assert isinstance(error, LeaseCoreError) and not error.retryable
    assert str(error) == "2 loss(es) of records that can no longer be landed: lease a: gone; lease b: gone"
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
