"""Whose consumer is it: `decide` judges the consumer Kinesis has under the application's consumer name
against the application's ownership record (lease_core.retrieval.fanout.stream_consumers)."""

from __future__ import annotations

import dataclasses

import pytest

from lease_core.retrieval.fanout.stream_consumers import (
    CLAIM_FRESH_MILLIS,
    CLAIM_REGISTERS_WITHIN_MILLIS,
    Consumer,
    Ownership,
    Step,
    decide,
)

NAME = "orders-lake"
STREAM_ARN = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
CLAIMED = 1_700_000_000_000
NOW = CLAIMED + 2000  # when `ensure` decides, unless a case says otherwise
ARN = f"{STREAM_ARN}/consumer/{NAME}:1700000001"


def consumer(status: str = "ACTIVE", arn: str = ARN, created: int = CLAIMED + 1000, name: str = NAME) -> Consumer:
    return Consumer(name, arn, status, created)


CLAIM = Ownership("orders", NAME, STREAM_ARN, CLAIMED, version="v1", name_free=True)
# Claimed, and Kinesis not yet asked since: a consumer found now was there when the name was claimed.
UNCHECKED = Ownership("orders", NAME, STREAM_ARN, CLAIMED, version="v0")
# A claim written by a version of the project before `nameFree` existed (the attribute absent).
LEGACY = Ownership("orders", NAME, STREAM_ARN, CLAIMED, version="v-old", name_free=None)
OWNED = Ownership("orders", NAME, STREAM_ARN, CLAIMED, ARN, CLAIMED + 1000, version="v2")


@pytest.mark.parametrize(
    ("record", "found", "step"),
    [
        pytest.param(None, None, Step.CLAIM, id="nothing-yet-claim-first"),
        pytest.param(None, consumer(), Step.FOREIGN, id="a-consumer-without-our-record-is-foreign"),
        pytest.param(UNCHECKED, None, Step.MARK_FREE, id="our-claim-and-no-consumer-since-mark-the-name-free"),
        pytest.param(CLAIM, None, Step.REGISTER, id="our-name-free-claim-and-no-consumer-register"),
        pytest.param(CLAIM, consumer("CREATING"), Step.RECORD, id="created-under-our-claim-record-it"),
        pytest.param(
            CLAIM,
            consumer(created=CLAIMED - 60_000),
            Step.RECORD,
            id="created-under-our-claim-by-a-kinesis-clock-a-minute-behind-ours",
        ),
        pytest.param(
            UNCHECKED,
            consumer(created=CLAIMED + 1000),
            Step.FOREIGN,
            id="there-when-we-claimed-before-the-name-was-free",
        ),
        pytest.param(
            CLAIM,
            consumer(created=CLAIMED + CLAIM_REGISTERS_WITHIN_MILLIS + 1),
            Step.FOREIGN,
            id="created-long-after-an-unfinished-claim-by-someone-else",
        ),
        pytest.param(LEGACY, consumer(created=CLAIMED + 1000), Step.RECORD, id="created-under-an-older-versions-claim"),
        pytest.param(
            LEGACY, consumer(created=CLAIMED - 4000), Step.RECORD, id="older-versions-claim-keeps-its-5-s-tolerance"
        ),
        pytest.param(LEGACY, consumer(created=CLAIMED - 6000), Step.FOREIGN, id="there-before-an-older-versions-claim"),
        pytest.param(LEGACY, None, Step.MARK_FREE, id="an-older-versions-claim-and-no-consumer-mark-the-name-free"),
        pytest.param(OWNED, consumer(), Step.USE, id="ours-and-active"),
        pytest.param(OWNED, consumer("CREATING"), Step.WAIT, id="ours-and-creating"),
        pytest.param(OWNED, consumer("DELETING"), Step.WAIT, id="being-deleted-wait-until-gone"),
        pytest.param(None, consumer("DELETING", arn="other"), Step.WAIT, id="foreign-being-deleted-wait-too"),
        pytest.param(OWNED, None, Step.CLAIM, id="ours-is-gone-claim-again"),
        pytest.param(
            OWNED,
            consumer(arn=f"{STREAM_ARN}/consumer/{NAME}:1800000000", created=CLAIMED + 9_000_000),
            Step.FOREIGN,
            id="recreated-by-hand-new-arn",
        ),
        pytest.param(OWNED, consumer(created=CLAIMED + 5000), Step.FOREIGN, id="same-arn-other-creation-time-moto"),
        pytest.param(
            Ownership("orders", "old-name", STREAM_ARN, CLAIMED, "x", 1), None, Step.RENAMED, id="consumer-name-changed"
        ),
    ],
)
def test_what_ensure_does_next_follows_from_the_record_and_the_consumer(record, found, step):
    assert decide(record, found, NAME, NOW) is step


@pytest.mark.parametrize(
    ("claim_age", "step"),
    [
        pytest.param(CLAIM_FRESH_MILLIS, Step.REGISTER, id="fresh-claim-register-under-it"),
        # Its holder died before registering: a consumer registered under it now could be created past
        # its window, and then be judged foreign, registered and billed but never used.
        pytest.param(CLAIM_FRESH_MILLIS + 1, Step.MARK_FREE, id="stale-claim-marked-name-free-afresh-first"),
    ],
)
def test_an_unfinished_claim_is_registered_under_only_while_its_name_free_mark_is_fresh(claim_age, step):
    assert decide(CLAIM, None, NAME, CLAIMED + claim_age) is step


@pytest.mark.parametrize("record", [OWNED, CLAIM, UNCHECKED], ids=["owned", "name-free-claim", "unchecked-claim"])
def test_a_record_reads_back_as_it_was_written(record):
    stored = {**record.to_record(), "key": "StreamConsumer:orders"}
    assert Ownership.from_record(stored) == dataclasses.replace(record, version=stored["version"])


def test_a_claim_without_the_name_free_attribute_reads_as_an_older_versions_and_is_written_back_marked_or_not():
    stored = {**CLAIM.to_record(), "key": "StreamConsumer:orders"}
    del stored["nameFree"]
    assert Ownership.from_record(stored).name_free is None
    assert LEGACY.to_record()["nameFree"] is False
