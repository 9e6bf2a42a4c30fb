"""The round's record-processing options: one definition, checked the same way from params and from flags."""

from __future__ import annotations

import pytest

from lease_core.errors import ConfigurationError
from lease_core.ops.command_line import ArgumentParser, UsageError
from spark_jobs.record_processing import RecordProcessing


def parsed_flags(arguments: list[str]) -> RecordProcessing:
    parser = ArgumentParser(prog="consume_job")
    RecordProcessing.add_arguments(parser)
    return RecordProcessing.from_arguments(parser.parse_args(arguments))


def test_options_given_to_the_job_as_flags_come_back_as_the_same_options():
    chosen = RecordProcessing.from_options(
        {"transform": "users.orders:clean", "decode": "users.orders:decode", "bad_records": "dead_letter"}
    )
    assert parsed_flags(chosen.to_arguments()) == chosen
    assert parsed_flags([]) == RecordProcessing()


def test_default_options_give_the_job_no_flags():
    assert RecordProcessing().to_arguments() == []


@pytest.mark.parametrize(
    ("values", "option", "complaint"),
    [
        (
            {"decode": "orders.decode"},
            "decode",
            "must be a built-in decoder \\(json, cloudwatch_logs, dynamodb, avro, protobuf, glue_schema_registry\\) "
            "or 'package.module:function', got 'orders.decode'",
        ),
        ({"transform": 3}, "transform", "got 3"),
        ({"bad_records": "skip"}, "bad_records", "must be one of fail, dead_letter, got 'skip'"),
        ({"dead_letter_max_share": "half"}, "dead_letter_max_share", "above 0 and at most 1, got 'half'"),
        ({"bad_records": "dead_letter"}, "bad_records", "dead_letter needs a decoder"),
    ],
    ids=[
        "a decoder without its function",
        "a transform not text",
        "an unknown action",
        "a share not a number",
        "dead letters without a decoder",
    ],
)
def test_a_wrong_option_is_refused_naming_it(values, option, complaint):
    with pytest.raises(ConfigurationError, match=complaint) as raised:
        RecordProcessing.from_options(values)
    assert raised.value.key == option


def test_a_wrong_flag_is_a_usage_error_naming_the_flag():
    with pytest.raises(UsageError, match=r"^--dead-letter-max-share: must be a number above 0 and at most 1, got '2'$"):
        parsed_flags(["--dead-letter-max-share", "2"])


def test_the_trigger_form_offers_every_option_with_its_value_as_the_default():
    form = RecordProcessing(decode="users.orders:decode").trigger_params()
    assert set(form) == set(RecordProcessing.option_names())
    assert form["decode"]["default"] == "users.orders:decode"
    assert all(field["description"] for field in form.values())
