"""What a pipeline does with the records its decoder rejects (`spark_jobs.dead_letters`), and how the
output's and the dead letters' parts of a lease's record are told apart (`sinks.dead_lettering`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.dead_lettering import dead_letter_uri, join_record, split_record
from sinks.errors import SinkError
from spark_jobs.dead_letters import BadRecordPolicy
from spark_jobs.decode import RejectedRecord
from spark_jobs.errors import TransformError

SPEC = "users.orders:decode"


def rejected(count: int) -> list[RejectedRecord]:
    arrival = datetime(2026, 11, 26, tzinfo=UTC)
    return [RejectedRecord(KinesisRecord(str(n), 0, "k", arrival, b"x"), f"bad {n}") for n in range(count)]


@pytest.mark.parametrize(
    ("policy", "rejects", "records", "fails_with"),
    [
        (BadRecordPolicy(), 1, 100, "bad 0"),
        (BadRecordPolicy("dead_letter"), 1, 1, None),  # a lone bad record in a quiet shard is set aside
        (BadRecordPolicy("dead_letter"), 9, 9, None),
        (BadRecordPolicy("dead_letter"), 10, 100, None),  # exactly the share is allowed
        (BadRecordPolicy("dead_letter"), 11, 100, "rejected 11 of a batch's 100 records"),
        (BadRecordPolicy("dead_letter", 0.5), 11, 20, "more than dead_letter_max_share \\(0.5\\)"),
        (BadRecordPolicy("dead_letter"), 0, 100, None),
    ],
    ids=["fail", "one of one", "nine of nine", "at the share", "over the share", "over a larger share", "none"],
)
def test_rejected_records_are_set_aside_unless_the_policy_fails_or_the_processing_fails_wholesale(
    policy, rejects, records, fails_with
):
    if fails_with is None:
        assert len(policy.set_aside(rejected(rejects), records, SPEC)) == rejects
    else:
        with pytest.raises(TransformError, match=fails_with) as raised:
            policy.set_aside(rejected(rejects), records, SPEC)
        assert raised.value.spec == SPEC and raised.value.retryable is False


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [(("skip",), "bad_records must be one of fail, dead_letter"), (("dead_letter", 0.0), "above 0 and at most 1")],
)
def test_a_policy_that_cannot_be_applied_is_refused(arguments, complaint):
    with pytest.raises(ValueError, match=complaint):
        BadRecordPolicy(*arguments)


@pytest.mark.parametrize(
    ("output", "dead_letters"),
    [
        ("/lake/orders", "/lake/orders-dead-letters"),
        ("s3://bucket/lake/", "s3://bucket/lake-dead-letters"),
        ("iceberg://glue/lake.orders", "iceberg://glue/lake.orders_dead_letters"),
    ],
)
def test_dead_letters_go_beside_the_output(output, dead_letters):
    assert dead_letter_uri(output) == dead_letters


def test_a_dataset_at_a_buckets_root_has_no_place_beside_it():
    with pytest.raises(SinkError, match="need a prefix in the bucket"):
        dead_letter_uri("s3://bucket")


@pytest.mark.parametrize(
    ("output", "dead"),
    [("stream_name=s/shard_id=x/_staged-ab.1_2.parquet", None), ('{"f":"iceberg"}', '{"f":"iceberg"}'), (None, "d")],
)
def test_a_record_naming_both_parts_splits_back_into_them_and_one_without_dead_letters_is_the_outputs_own(output, dead):
    joined = join_record(output, dead)
    assert split_record(joined) == (output, dead)
    if dead is None:
        assert joined == output, "a lease without dead letters keeps the record it always had"


def test_a_damaged_record_naming_both_parts_is_an_error_naming_it():
    with pytest.raises(SinkError, match="cannot be read"):
        split_record("dead-letters/1 [not json")
