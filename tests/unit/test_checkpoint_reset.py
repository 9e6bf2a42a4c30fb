"""The pure decisions of `leasectl reset`: the target, the lease, the write, and what the operator is told."""

from __future__ import annotations

import pickle

import pytest

from lease_core.errors import CorruptLeaseError
from lease_core.model.lease import HashKeyRange, Lease, StreamIdentifier
from lease_core.model.pending_batch import STATE_FORMAT, PendingBatch
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.ops.checkpoint_reset import (
    CheckpointResetError,
    Direction,
    LeaseNotFoundError,
    LeaseSelector,
    ResetUsageError,
    compare_positions,
    parse_target,
    plan_reset,
    render_position,
    select_lease,
)
from lease_core.store.lease_store import LeaseScan
from lease_core.store.lease_writes import AttributeEquals

ESN = ExtendedSequenceNumber
KEY = "shardId-000000000001"
PENDING_FIELDS = {"pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState"}
ORDERS = StreamIdentifier("123456789012", "orders", 1)
ORDERS_AGAIN = StreamIdentifier("123456789012", "orders", 2)
CLICKS = StreamIdentifier("123456789012", "clicks", 1)


def owned(checkpoint: ESN = ExtendedSequenceNumber("500"), **fields) -> Lease:
    return Lease(KEY, checkpoint=checkpoint, lease_owner="app-worker-0", lease_counter=7, **fields)


def prepared(checkpoint: ESN, pending: ESN, path: str | None = "stream_name=s/shard_id=x/500_800.parquet") -> Lease:
    batch = PendingBatch(checkpoint, pending, None, path, 30)
    return owned(checkpoint, pending_checkpoint=pending, pending_checkpoint_state=batch.encode())


# --- the target ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "target"),
    [
        pytest.param("TRIM_HORIZON", TRIM_HORIZON, id="trim-horizon"),
        pytest.param("LATEST", LATEST, id="latest"),
        pytest.param(
            "49590338271490256608559692538361571095921575989136588898",
            ESN("49590338271490256608559692538361571095921575989136588898"),
            id="kinesis-sequence-number",
        ),
        pytest.param("0", ESN("0"), id="zero"),
        pytest.param("4959:3", ESN("4959", 3), id="with-sub-sequence-number"),
        pytest.param("4959/3", ESN("4959", 3), id="status-syntax-with-slash"),
        pytest.param("4959:0", ESN("4959"), id="explicit-sub-sequence-zero"),
        pytest.param(" 4959 ", ESN("4959"), id="surrounding-spaces"),
    ],
)
def test_a_target_parses_to_the_checkpoint_it_writes(text, target):
    assert parse_target(text) == target


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("AT_TIMESTAMP", "initial_position_timestamp", id="at-timestamp-explains-why"),
        pytest.param("SHARD_END", "only the consume job marks a shard finished", id="shard-end"),
        pytest.param("latest", "not a sequence number", id="sentinel-in-lower-case"),
        pytest.param("12a4", "not a sequence number", id="letters"),
        pytest.param("-5", "not a sequence number", id="negative"),
        pytest.param("0042", "without leading zeros", id="leading-zeros"),
        pytest.param("", "not a sequence number", id="empty"),
        pytest.param("1" * 130, "not a sequence number", id="longer-than-kinesis-allows"),
        pytest.param("4959:", "sub-sequence number", id="empty-sub-sequence-number"),
        pytest.param("4959:x", "sub-sequence number", id="letters-in-sub-sequence-number"),
        pytest.param("4959:1:2", "sub-sequence number", id="two-sub-sequence-numbers"),
        pytest.param("٤٥", "not a sequence number", id="non-ascii-digits"),
    ],
)
def test_a_target_that_is_not_one_is_refused_saying_what_is_wrong(text, message):
    with pytest.raises(ResetUsageError, match=message):
        parse_target(text)


@pytest.mark.parametrize(
    ("position", "rendered"),
    [
        pytest.param(ESN("4959"), "4959", id="sequence-number"),
        pytest.param(ESN("4959", 3), "4959:3", id="sub-sequence-number"),
        pytest.param(TRIM_HORIZON, "TRIM_HORIZON", id="sentinel"),
    ],
)
def test_a_position_is_rendered_in_the_syntax_a_reset_accepts(position, rendered):
    assert render_position(position) == rendered
    assert parse_target(rendered) == position


# --- the lease ----------------------------------------------------------------------------------


def scan(*leases: Lease, corrupt: tuple[CorruptLeaseError, ...] = ()) -> LeaseScan:
    return LeaseScan(tuple(leases), corrupt)


SINGLE = scan(Lease("shardId-000000000000"), Lease(KEY))
MULTI = scan(
    Lease.for_stream(ORDERS, KEY), Lease.for_stream(CLICKS, KEY), Lease.for_stream(ORDERS, "shardId-000000000000")
)


@pytest.mark.parametrize(
    ("leases", "selector", "key"),
    [
        pytest.param(SINGLE, LeaseSelector(KEY), KEY, id="single-stream-by-shard-id"),
        pytest.param(MULTI, LeaseSelector(KEY, "orders"), ORDERS.lease_key(KEY), id="multi-stream-by-stream-name"),
        pytest.param(
            MULTI, LeaseSelector(KEY, ORDERS.serialize()), ORDERS.lease_key(KEY), id="multi-stream-by-stream-identifier"
        ),
        pytest.param(
            scan(Lease.for_stream(ORDERS, KEY), Lease.for_stream(ORDERS_AGAIN, KEY)),
            LeaseSelector(KEY, ORDERS_AGAIN.serialize()),
            ORDERS_AGAIN.lease_key(KEY),
            id="identifier-tells-apart-two-epochs",
        ),
    ],
)
def test_the_lease_is_found_by_shard_and_in_a_multi_stream_table_by_stream(leases, selector, key):
    assert select_lease(leases, selector, "app").lease_key == key


@pytest.mark.parametrize(
    ("leases", "selector", "error", "message"),
    [
        pytest.param(
            SINGLE,
            LeaseSelector("shardId-000000000009"),
            LeaseNotFoundError,
            "lease table 'app' has no lease for shard 'shardId-000000000009'",
            id="unknown-shard",
        ),
        pytest.param(scan(), LeaseSelector(KEY), LeaseNotFoundError, "has no lease", id="empty-table"),
        pytest.param(
            scan(), LeaseSelector(KEY, "orders"), LeaseNotFoundError, "has no lease", id="empty-table-with-stream"
        ),
        pytest.param(
            MULTI,
            LeaseSelector(KEY, "payments"),
            LeaseNotFoundError,
            "no lease for shard 'shardId-000000000001' of stream 'payments'",
            id="unknown-stream",
        ),
        pytest.param(
            MULTI,
            LeaseSelector(KEY),
            ResetUsageError,
            "multi-stream .* --stream is required",
            id="multi-stream-without-stream",
        ),
        pytest.param(
            SINGLE,
            LeaseSelector(KEY, "orders"),
            ResetUsageError,
            "single-stream .* leave out --stream",
            id="single-stream-with-stream",
        ),
        pytest.param(
            scan(Lease.for_stream(ORDERS, KEY), Lease.for_stream(ORDERS_AGAIN, KEY)),
            LeaseSelector(KEY, "orders"),
            ResetUsageError,
            "matches 2 leases .*<account>:<stream>:<epoch>",
            id="stream-name-of-two-epochs-is-ambiguous",
        ),
        pytest.param(
            scan(Lease("shardId-000000000000"), corrupt=(CorruptLeaseError("shardId-000000000007", "bad"),)),
            LeaseSelector(KEY),
            LeaseNotFoundError,
            "1 item\\(s\\) of the table could not be read",
            id="not-found-mentions-unreadable-items",
        ),
        pytest.param(
            scan(corrupt=(CorruptLeaseError(KEY, "attribute 'checkpoint' is missing"),)),
            LeaseSelector(KEY),
            CorruptLeaseError,
            "attribute 'checkpoint' is missing",
            id="the-shards-own-item-is-unreadable",
        ),
    ],
)
def test_a_lease_that_cannot_be_named_that_way_is_an_error_saying_why(leases, selector, error, message):
    with pytest.raises(error, match=message):
        select_lease(leases, selector, "app")


@pytest.mark.parametrize(
    ("shard", "stream"),
    [
        pytest.param("", None, id="empty-shard"),
        pytest.param(KEY, "", id="empty-stream"),
        pytest.param(KEY, "123456789012:orders", id="stream-with-two-fields"),
    ],
)
def test_a_selector_without_a_usable_shard_or_stream_is_a_usage_error(shard, stream):
    with pytest.raises(ResetUsageError):
        LeaseSelector(shard, stream)


# --- the decision -------------------------------------------------------------------------------


def test_a_lease_at_shard_end_is_refused_saying_a_backfill_replays_a_finished_shard():
    with pytest.raises(CheckpointResetError, match=r"SHARD_END: the shard is finished.*backfill") as refused:
        plan_reset(owned(SHARD_END), ESN("100"))
    assert refused.value.lease_key == KEY and not refused.value.retryable


@pytest.mark.parametrize(
    "target", [pytest.param(SHARD_END, id="shard-end"), pytest.param(AT_TIMESTAMP, id="at-timestamp")]
)
def test_a_target_no_reset_may_write_is_refused_by_the_decision_too(target):
    with pytest.raises(ResetUsageError, match="is not a reset target"):
        plan_reset(owned(), target)


@pytest.mark.parametrize(
    ("current", "target", "direction"),
    [
        pytest.param(ESN("500"), ESN("100"), Direction.BACKWARD, id="earlier-sequence-number"),
        pytest.param(ESN("500", 2), ESN("500", 1), Direction.BACKWARD, id="earlier-sub-record"),
        pytest.param(ESN("500"), TRIM_HORIZON, Direction.BACKWARD, id="to-trim-horizon"),
        pytest.param(LATEST, ESN("100"), Direction.BACKWARD, id="from-latest-to-a-sequence-number"),
        pytest.param(ESN("500"), ESN("900"), Direction.FORWARD, id="later-sequence-number"),
        pytest.param(ESN("500"), LATEST, Direction.FORWARD, id="to-latest-skips-to-the-tip"),
        pytest.param(TRIM_HORIZON, ESN("100"), Direction.FORWARD, id="from-trim-horizon"),
        pytest.param(AT_TIMESTAMP, LATEST, Direction.FORWARD, id="from-at-timestamp-to-latest"),
        pytest.param(AT_TIMESTAMP, TRIM_HORIZON, Direction.BACKWARD, id="from-at-timestamp-to-trim-horizon"),
        pytest.param(AT_TIMESTAMP, ESN("100"), Direction.UNKNOWN, id="from-at-timestamp-to-a-sequence-number"),
        pytest.param(ESN("500"), ESN("500"), Direction.UNCHANGED, id="same-sequence-number"),
        pytest.param(LATEST, LATEST, Direction.UNCHANGED, id="same-sentinel"),
    ],
)
def test_the_direction_of_a_reset_is_where_the_next_read_starts_relative_to_now(current, target, direction):
    assert plan_reset(owned(current), target).direction is direction


@pytest.mark.parametrize(
    ("a", "b", "order"),
    [
        pytest.param(LATEST, ESN("9" * 50), 1, id="latest-is-the-tip-after-every-number"),
        pytest.param(TRIM_HORIZON, ESN("0"), -1, id="trim-horizon-before-every-number"),
        pytest.param(ESN("10"), ESN("9"), 1, id="numbers-compare-numerically"),
        pytest.param(SHARD_END, LATEST, 1, id="shard-end-after-the-tip"),
        pytest.param(AT_TIMESTAMP, SHARD_END, -1, id="at-timestamp-before-shard-end"),
        pytest.param(ESN("10"), AT_TIMESTAMP, None, id="number-against-at-timestamp-is-unknown"),
    ],
)
def test_positions_compare_in_reading_order(a, b, order):
    assert compare_positions(a, b) == order


@pytest.mark.parametrize(
    "lease",
    [
        pytest.param(owned(ESN("500"), throughput_kbps=12.5, owner_switches_since_checkpoint=2), id="committed"),
        pytest.param(prepared(ESN("500"), ESN("800")), id="with-prepared-batch"),
        pytest.param(
            owned(
                ESN("500"),
                checkpoint_owner="app-worker-1",
                parent_shard_ids={"shardId-000000000000"},
                hash_key_range=HashKeyRange(0, 99),
            ),
            id="in-handoff-with-parents-and-range",
        ),
    ],
)
def test_the_write_is_a_counter_conditional_checkpoint_without_pending_fields_two_counts_up_same_owner(
    lease,
):
    write = plan_reset(lease, ESN("100", 4)).write
    sets = dict(write.set_attributes)
    assert write.lease_key == KEY
    assert write.conditions == (AttributeEquals("leaseCounter", {"N": "7"}),)
    assert sets["leaseCounter"] == {"N": "9"}  # by 2: a holder takes exactly + 1 for its own lost renewal
    assert (sets["checkpoint"], sets["checkpointSubSequenceNumber"]) == ({"S": "100"}, {"N": "4"})
    assert sets["ownerSwitchesSinceCheckpoint"] == {"N": "0"}
    # None was committed, and a LATEST pin never survives a reset.
    assert set(write.remove_attributes) == PENDING_FIELDS | {"committedBatchFile", "latestStartMillis"}
    assert write.add_numbers == ()
    untouched = {"leaseOwner", "checkpointOwner", "throughputKBps", "parentShardId", "leaseKey"}
    assert not untouched & (set(sets) | set(write.remove_attributes))


def test_the_write_keeps_the_sinks_record_of_the_committed_batches_so_that_one_left_invisible_is_made_visible():
    lease = owned(ESN("500")).replace(committed_batch="stream_name=s/shard_id=x/400-0_500-0.parquet")
    write = plan_reset(lease, ESN("100")).write
    assert dict(write.set_attributes)["committedBatchFile"] == {"S": "stream_name=s/shard_id=x/400-0_500-0.parquet"}
    assert "committedBatchFile" not in write.remove_attributes


def test_the_write_of_a_multi_stream_lease_keeps_its_stream_and_shard():
    lease = Lease.for_stream(ORDERS, KEY, checkpoint=ESN("500"), lease_owner="w", lease_counter=3)
    sets = dict(plan_reset(lease, TRIM_HORIZON).write.set_attributes)
    assert (sets["streamName"], sets["shardId"]) == ({"S": ORDERS.serialize()}, {"S": KEY})


@pytest.mark.parametrize(
    ("current", "target", "fragments"),
    [
        pytest.param(
            ESN("500"), ESN("100"), ("moving backwards from 500 to 100", "duplicates in the sink"), id="backward"
        ),
        pytest.param(
            ESN("500"),
            TRIM_HORIZON,
            ("to TRIM_HORIZON (the oldest record still in the stream)", "landed again"),
            id="to-trim-horizon",
        ),
        pytest.param(ESN("500"), ESN("900"), ("moving forward from 500 to 900", "never be landed (loss"), id="forward"),
        pytest.param(
            ESN("500"),
            LATEST,
            ("LATEST (the newest record when the next round claims the lease)", "loss"),
            id="to-latest",
        ),
        pytest.param(AT_TIMESTAMP, ESN("100"), ("is not known here", "twice", "never"), id="unknown"),
    ],
)
def test_the_operator_is_warned_that_backwards_duplicates_and_forward_loses(current, target, fragments):
    (warning,) = plan_reset(owned(current), target).warnings()
    for fragment in fragments:
        assert fragment in warning


def test_an_unchanged_checkpoint_warns_of_nothing():
    assert plan_reset(owned(ESN("500")), ESN("500")).warnings() == ()


# --- the prepared batch -------------------------------------------------------------------------


def test_a_lease_without_a_pending_checkpoint_discards_no_batch():
    plan = plan_reset(owned(), ESN("100"))
    assert (plan.discarded, plan.batch_notes()) == (None, ())


def test_a_prepared_batch_of_ours_is_reported_with_its_range_records_and_file():
    discarded = plan_reset(prepared(ESN("500"), ESN("800")), ESN("100")).discarded
    assert discarded is not None and discarded.batch is not None
    assert (discarded.batch.start, discarded.pending_checkpoint) == (ESN("500"), ESN("800"))
    assert (discarded.batch.records, discarded.batch.name) == (30, "stream_name=s/shard_id=x/500_800.parquet")


@pytest.mark.parametrize(
    ("target", "present", "absent"),
    [
        pytest.param(
            ESN("100"),
            ("is never made visible", "after 100 will be read and landed again, once"),
            ("lost",),
            id="rewind-relands-the-whole-batch",
        ),
        pytest.param(
            ESN("500"), ("after 500 will be read and landed again",), ("lost",), id="same-checkpoint-relands-the-batch"
        ),
        pytest.param(
            ESN("650"),
            ("after 650 will be read and landed again", "its records up to 650 will not be read again"),
            (),
            id="into-the-batch-splits-it",
        ),
        pytest.param(
            ESN("800"),
            ("all of its records will not be read again and are not in the sink",),
            ("landed again",),
            id="to-the-batch-end-loses-it",
        ),
        pytest.param(
            LATEST, ("all of its records will not be read again",), ("landed again",), id="to-latest-loses-it"
        ),
    ],
)
def test_the_notes_on_a_discarded_batch_say_where_its_records_end_up(target, present, absent):
    notes = " | ".join(plan_reset(prepared(ESN("500"), ESN("800")), target).batch_notes())
    for fragment in present:
        assert fragment in notes
    for fragment in absent:
        assert fragment not in notes


@pytest.mark.parametrize(
    ("state", "note", "unreadable"),
    [
        pytest.param(b"state of a KCL application", "no batch description of ours", False, id="foreign-state"),
        pytest.param(None, "no batch description of ours", False, id="no-state"),
        pytest.param(
            f'{{"format": "{STATE_FORMAT}"}}'.encode(), "its description is unreadable", True, id="ours-but-unreadable"
        ),
    ],
)
def test_a_pending_checkpoint_without_a_readable_description_is_reported_with_its_output_unknown(
    state, note, unreadable
):
    lease = owned(ESN("500"), pending_checkpoint=ESN("800"), pending_checkpoint_state=state)
    plan = plan_reset(lease, ESN("100"))
    assert plan.discarded is not None
    assert (plan.discarded.pending_checkpoint, plan.discarded.batch) == (ESN("800"), None)
    assert (plan.discarded.unreadable is not None) is unreadable
    (text,) = plan.batch_notes()
    assert note in text and "up to 800" in text and "name in the sink, if any, is not known" in text


def test_a_batch_that_staged_nothing_says_so():
    (note,) = plan_reset(prepared(ESN("500"), ESN("800"), path=None), ESN("100")).batch_notes()
    assert note == "the batch staged nothing (it had no rows to write)"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ResetUsageError("--stream is required"), id="ResetUsageError"),
        pytest.param(LeaseNotFoundError("app", "shard 'shardId-1'", " (deleted)"), id="LeaseNotFoundError"),
        pytest.param(CheckpointResetError(KEY, "its counter changed", retryable=True), id="CheckpointResetError"),
    ],
)
def test_every_reset_error_survives_pickling_with_its_message_and_attributes(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.args, vars(copy), copy.retryable) == (str(error), error.args, vars(error), error.retryable)
