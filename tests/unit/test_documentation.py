"""The operator's documentation matches the code: every setting, DAG param, variable and metric it names exists."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

from lease_core.config.settings import ConsumerConfig, load_config
from lease_core.metrics.round_metrics import METRICS
from lease_core.ops import config_reference

REPOSITORY = Path(__file__).resolve().parents[2]
CONFIGURATION = REPOSITORY / "docs" / "configuration.md"
METRICS_DOC = REPOSITORY / "docs" / "metrics.md"
METRIC_ROW = re.compile(r"^\| `(?P<operation>\w+)` \| `(?P<name>\w+)` \| (?P<rest>.*) \|$")
DAG_FILE = REPOSITORY / "dags" / "kinesis_lease_pipeline.py"
SETTING_ROW = re.compile(r"^\| `(?P<key>[a-z0-9_]+)` \| `(?P<default>[^`]*)` \| (?P<kcl>`[^`]+`|\(ours\)) \|")
PARAM_ROW = re.compile(r"^\| `(?P<param>[a-z_]+)` \| (?P<default>[^|]*) \|")


def settings_rows() -> dict[str, dict[str, str]]:
    rows = {}
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        match = SETTING_ROW.match(line)
        if match:
            assert match["key"] not in rows, f"{match['key']} is documented twice"
            rows[match["key"]] = match.groupdict()
    return rows


def code_keys() -> list[str]:
    return [setting.key for setting in ConsumerConfig.describe()]


def test_every_documented_setting_exists_in_the_code():
    assert sorted(set(settings_rows()) - set(code_keys())) == []


def test_every_setting_in_the_code_is_documented():
    assert sorted(set(code_keys()) - set(settings_rows())) == []


@pytest.mark.parametrize("key", code_keys())
def test_the_documented_default_reads_back_as_the_code_default(key):
    documented = settings_rows()[key]["default"]
    default = getattr(ConsumerConfig(), key)
    if documented == "unset":
        assert default is None
    elif documented == "(none)":
        assert default == ()
    else:
        read = getattr(load_config(environ={}, overrides=[f"{key}={documented}"]), key)
        assert read == default or (isinstance(default, float) and math.isinf(default) and math.isinf(read))


@pytest.mark.parametrize("setting", ConsumerConfig.describe(), ids=lambda setting: setting.key)
def test_the_documented_kcl_name_is_the_code_one(setting):
    documented = settings_rows()[setting.key]["kcl"]
    assert documented == (f"`{setting.kcl_name}`" if setting.kcl_name else "(ours)")


def test_the_generated_reference_is_current():
    document = CONFIGURATION.read_text(encoding="utf-8")
    assert config_reference.with_reference(document) == document, (
        "run: python -m lease_core.ops.config_reference --write docs/configuration.md"
    )


def test_the_reference_command_finds_a_stale_table_and_rewrites_it(tmp_path, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(CONFIGURATION.read_text(encoding="utf-8").replace("`10000`", "`9999`", 1), encoding="utf-8")
    assert config_reference.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert config_reference.main(["--write", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == CONFIGURATION.read_text(encoding="utf-8")


def test_the_reference_command_refuses_a_document_without_markers(tmp_path, capsys):
    other = tmp_path / "other.md"
    other.write_text("# no table here\n", encoding="utf-8")
    assert config_reference.main(["--check", str(other)]) == 2
    assert "markers" in capsys.readouterr().err


# --- the metrics ---------------------------------------------------------------------------------


def documented_metrics() -> list[tuple[str, ...]]:
    rows = []
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        match = METRIC_ROW.match(line)
        if match:
            rows.append((match["operation"], match["name"], *(cell.strip() for cell in match["rest"].split("|"))))
    return rows


def test_the_metrics_table_lists_every_metric_once_in_order_as_the_code_defines_it():
    defined = [
        (m.operation, m.name, m.unit.value, m.level.name, m.scope.value, "KCL" if m.kcl else "", m.meaning)
        for m in METRICS
    ]
    assert documented_metrics() == defined


# --- the DAG's params and environment defaults ---------------------------------------------------


@pytest.fixture(scope="module")
def dag():
    spec = importlib.util.spec_from_file_location("kinesis_lease_pipeline_documented", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def documented_params() -> dict[str, str]:
    text = CONFIGURATION.read_text(encoding="utf-8").split("## The DAG's trigger form", 1)[1].split("\n## ", 1)[0]
    return {match["param"]: match["default"] for match in map(PARAM_ROW.match, text.splitlines()) if match}


def test_every_param_of_the_dag_is_documented_and_every_documented_param_exists(dag):
    assert sorted(documented_params()) == sorted(dag.params.keys())


def test_every_environment_default_the_dag_reads_is_documented():
    read = set(re.findall(r'_default\("([A-Z_]+)"', DAG_FILE.read_text(encoding="utf-8")))
    documented = set(re.findall(r"KINESIS_PIPELINE_([A-Z_]+)", CONFIGURATION.read_text(encoding="utf-8")))
    assert read and read == documented


def test_the_dags_environment_defaults_are_not_taken_for_consumer_settings():
    environ = {f"KINESIS_PIPELINE_{name}": "x" for name in ("STREAMS", "APPLICATION", "WORKERS", "OUTPUT_URI")}
    assert load_config(environ=environ) == ConsumerConfig()
