"""The alarm definitions of docs/operating.md ("Alerts on metrics") are valid PutMetricAlarm input, as
botocore checks a request, and name only metrics the rounds publish, under their operation."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import botocore.session
import botocore.validate
import pytest

from lease_core.metrics.round_metrics import metric

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
ALARM = re.compile(r"<!-- alarm: (?P<name>[a-z-]+) -->\n```json\n(?P<body>.*?)\n```", re.DOTALL)
ALARMS = {match["name"]: json.loads(match["body"]) for match in ALARM.finditer(OPERATING.read_text(encoding="utf-8"))}


def metric_stats(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    """The metrics an alarm reads: its own, or each one of its expression's."""
    if "MetricName" in alarm:
        return [alarm]
    return [query["MetricStat"]["Metric"] for query in alarm["Metrics"] if "MetricStat" in query]


def test_the_document_defines_the_four_alarms():
    assert set(ALARMS) == {"freshness", "falling-behind", "rounds-failing", "dead-letters"}


@pytest.mark.parametrize("name", sorted(ALARMS))
def test_an_alarm_is_a_valid_put_metric_alarm_request(name):
    shape = botocore.session.get_session().get_service_model("cloudwatch").operation_model("PutMetricAlarm").input_shape
    botocore.validate.validate_parameters(ALARMS[name], shape)  # raises ParamValidationError naming the problem


@pytest.mark.parametrize("name", sorted(ALARMS))
def test_an_alarm_reads_metrics_the_rounds_publish_in_whole_minutes(name):
    for stat in metric_stats(ALARMS[name]):
        dimensions = {dimension["Name"]: dimension["Value"] for dimension in stat["Dimensions"]}
        assert metric(dimensions["Operation"], stat["MetricName"]).scope.value == "application"
        assert set(dimensions) == {"Operation"}
    alarm = ALARMS[name]
    periods = (
        [alarm["Period"]]
        if "Period" in alarm
        else [query["MetricStat"]["Period"] for query in alarm["Metrics"] if "MetricStat" in query]
    )
    assert periods and all(period % 60 == 0 for period in periods)
