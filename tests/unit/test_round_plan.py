"""A backfill's namespace (application name and output prefix) is a pure, injective function of its window."""

from __future__ import annotations

import json

import pytest
from kinesis_lease.round_plan import RoundPlan, plan_round

from lease_core.config.settings import ConsumerConfig
from lease_core.errors import ConfigurationError
from spark_jobs.record_processing import RecordProcessing

START, END = "2026-11-20T00:00:00Z", "2026-11-21T00:00:00Z"


def backfill(start: str, end: str, application: str = "app", output_uri: str = "s3://bucket/lake") -> RoundPlan:
    return plan_round(
        {
            "mode": "backfill",
            "application_name": application,
            "streams": "s",
            "num_workers": 1,
            "output_uri": output_uri,
            "start": start,
            "end": end,
        }
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param((START, END), ("2026-11-20T00:00:00.000001Z", END), id="start-1us-later"),
        pytest.param((START, END), (START, "2026-11-21T00:00:00.5Z"), id="end-half-a-second-later"),
        pytest.param(
            ("2026-11-20T00:00:00.25Z", END), ("2026-11-20T00:00:00.250001Z", END), id="both-fractional-1us-apart"
        ),
        pytest.param(
            ("2026-11-20T00:00:00.5Z", END), (START, "2026-11-21T00:00:00.5Z"), id="fraction-on-the-other-bound"
        ),
    ],
)
def test_backfill_windows_that_differ_by_less_than_a_second_get_different_namespaces(first, second):
    one, other = backfill(*first), backfill(*second)
    assert one.application_name != other.application_name
    assert one.output_uri != other.output_uri


@pytest.mark.parametrize(
    ("start", "end", "window"),
    [
        pytest.param(START, END, "20261120T000000Z-20261121T000000Z", id="whole-seconds"),
        pytest.param(
            "2026-11-20T01:00:00+01:00",
            "2026-11-20T00:00:30.000Z",
            "20261120T000000Z-20261120T000030Z",
            id="whole-seconds-written-with-offset-and-zero-fraction",
        ),
        pytest.param(
            "2026-11-20T00:00:00.5Z", END, "20261120T000000.500000Z-20261121T000000.000000Z", id="fractional-start"
        ),
        pytest.param(
            START, "2026-11-20T00:00:00.000001Z", "20261120T000000.000000Z-20261120T000000.000001Z", id="fractional-end"
        ),
    ],
)
def test_a_window_names_its_namespace_in_seconds_with_microseconds_only_when_a_bound_has_a_fraction(start, end, window):
    plan = backfill(start, end)
    assert (plan.application_name, plan.output_uri) == (f"app-backfill-{window}", f"s3://bucket/lake-backfill/{window}")
    assert plan.settings["application_name"] == plan.application_name


@pytest.mark.parametrize(
    ("written", "rewritten"),
    [
        pytest.param((START, END), ("2026-11-20T01:00:00+01:00", "2026-11-20T16:00:00-08:00"), id="other-offsets"),
        pytest.param(
            ("2026-11-20T00:00:00.5Z", END),
            ("2026-11-20T00:00:00.500000+00:00", "2026-11-21T00:00:00.000Z"),
            id="other-fraction-digits",
        ),
    ],
)
def test_the_same_window_maps_to_the_same_namespace_however_its_instants_are_written(written, rewritten):
    assert backfill(*written) == backfill(*rewritten)


@pytest.mark.parametrize(
    ("start", "suffix"),
    [
        pytest.param(START, "-backfill-20261120T000000Z-20261121T000000Z", id="whole-seconds"),
        pytest.param(
            "2026-11-20T00:00:00.5Z", "-backfill-20261120T000000.500000Z-20261121T000000.000000Z", id="fractional"
        ),
    ],
)
def test_a_backfill_takes_the_longest_application_name_whose_tables_fit_dynamodb_and_refuses_a_longer_one(
    start, suffix
):
    longest = 255 - len("-WorkerMetricStats") - len(suffix)
    plan = backfill(start, END, application="a" * longest)
    assert ConsumerConfig(application_name=plan.application_name).worker_metrics_table.endswith(
        suffix + "-WorkerMetricStats"
    )
    with pytest.raises(ConfigurationError, match="too long for a backfill") as refused:
        backfill(start, END, application="a" * (longest + 1))
    assert refused.value.key == "application_name"


def live(**changes: object) -> RoundPlan:
    return plan_round({"application_name": "app", "streams": "s", "num_workers": 1, "output_uri": "/lake", **changes})


@pytest.mark.parametrize(
    ("changes", "param", "expected"),
    [
        pytest.param({"output_uri": "hdfs://namenode/lake"}, "output_uri", "s3://bucket[/prefix]", id="hdfs-uri"),
        pytest.param({"output_uri": "s3://"}, "output_uri", "s3://bucket[/prefix]", id="s3-without-bucket"),
        pytest.param({"output_uri": "s3:///lake"}, "output_uri", "s3://bucket[/prefix]", id="s3-empty-bucket"),
        pytest.param({"output_uri": "file://host/lake"}, "output_uri", "file:///path", id="file-uri-with-host"),
        pytest.param({"output_uri": ""}, "output_uri", "is required", id="empty-uri"),
        pytest.param(
            {"output_uri": "s3://bucket", "mode": "backfill", "start": START, "end": END},
            "output_uri",
            "needs a prefix",
            id="backfill-at-a-bucket-root",
        ),
        pytest.param({"application_name": "ab"}, "application_name", "3 to 237 characters", id="name-too-short"),
        pytest.param({"application_name": "my app"}, "application_name", "A-Z a-z 0-9 _ - .", id="name-with-space"),
        pytest.param({"application_name": "a" * 238}, "application_name", "3 to 237", id="suffixed-tables-too-long"),
    ],
)
def test_a_plan_refuses_an_output_or_application_name_the_round_could_not_use_naming_the_param(
    changes, param, expected
):
    with pytest.raises(ConfigurationError) as raised:
        live(**changes)
    assert raised.value.key == param
    assert expected in raised.value.problem


@pytest.mark.parametrize(
    "uri", ["/lake", "relative/lake", "file:///lake", "s3://bucket", "s3://bucket/lake/"], ids=lambda uri: uri
)
def test_a_plan_accepts_every_output_the_sink_writes_to(uri):
    assert live(output_uri=uri).output_uri == uri.rstrip("/")


def test_the_longest_application_name_whose_derived_tables_fit_is_accepted():
    assert live(application_name="a" * 237).application_name == "a" * 237


@pytest.mark.parametrize(
    ("start", "end", "table"),
    [
        pytest.param(START, END, "orders_backfill_20261120t000000z_20261121t000000z", id="whole-seconds"),
        pytest.param(
            START,
            "2026-11-21T00:00:00.5Z",
            "orders_backfill_20261120t000000p000000z_20261121t000000p500000z",
            id="fractional",
        ),
    ],
)
def test_an_iceberg_backfill_lands_in_a_table_of_its_window_beside_the_live_one(start, end, table):
    plan = backfill(start, end, output_uri="iceberg://glue/lake.orders")
    assert plan.output_uri == f"iceberg://glue/lake.{table}"


def test_a_backfill_of_a_dataset_at_a_buckets_root_is_refused_naming_the_param():
    with pytest.raises(ConfigurationError, match=r"output_uri.*a backfill needs a prefix in the bucket"):
        backfill(START, END, output_uri="s3://bucket")


@pytest.mark.parametrize(
    ("params", "param", "complaint"),
    [
        ({"bad_records": "skip", "decode": "m:f"}, "bad_records", "must be one of fail, dead_letter, got 'skip'"),
        ({"bad_records": "dead_letter"}, "bad_records", "dead_letter needs a decoder"),
        (
            {"bad_records": "dead_letter", "decode": "m:f", "dead_letter_max_share": 0},
            "dead_letter_max_share",
            "above 0",
        ),
        ({"dead_letter_max_share": 1.5}, "dead_letter_max_share", "at most 1, got 1.5"),
        ({"dead_letter_max_share": True}, "dead_letter_max_share", "got True"),
        (
            {"bad_records": "dead_letter", "decode": "m:f", "output_uri": "s3://bucket"},
            "bad_records",
            "dead letters need a prefix in the bucket",
        ),
    ],
    ids=[
        "an unknown action",
        "dead letters without a decoder",
        "a share of 0",
        "a share above 1",
        "a boolean",
        "no place beside a bucket's root",
    ],
)
def test_a_plan_refuses_a_bad_record_policy_it_cannot_apply_naming_the_param(params, param, complaint):
    with pytest.raises(ConfigurationError, match=complaint) as raised:
        live(**params)
    assert raised.value.key == param


def test_a_plan_fails_on_bad_records_unless_told_to_dead_letter_them():
    assert (live().processing.bad_records, live().processing.dead_letter_max_share) == ("fail", 0.1)
    chosen = live(bad_records="dead_letter", decode="users.orders:decode", dead_letter_max_share=0.25).processing
    assert (chosen.bad_records, chosen.dead_letter_max_share) == ("dead_letter", 0.25)


def test_a_plan_carries_its_record_processing_as_one_json_object_its_steps_read_back():
    plan = live(decode="users.orders:decode", bad_records="dead_letter", transform="users.orders:clean")
    carried = json.loads(json.dumps(plan.to_dict()))["processing"]
    assert RecordProcessing.from_options(carried) == plan.processing
