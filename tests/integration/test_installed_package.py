"""The wheel installed like an Airflow provider: `uv build --wheel`, installed into a throwaway venv, and
Airflow run from outside the checkout finds everything through the installed package alone.

The venv is `tests/support/installed_package.py`'s. Each probe is a fresh `python -I` in a folder
outside the checkout, so neither PYTHONPATH nor the working directory can bring the checkout's
modules back.
"""

from __future__ import annotations

import json
import os
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.installed_package import DISTRIBUTION, REPOSITORY, build_wheel, installed_venv, run

VERSION = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
PACKAGES = ("kinesis_lease", "lease_core", "sinks", "spark_jobs")
STATIC = REPOSITORY / "plugins" / "kinesis_lease" / "static"
ENTRY_POINTS = {
    ("apache_airflow_provider", "kinesis_lease.provider_info:get_provider_info"),
    ("airflow.plugins", "kinesis_lease.plugin:KinesisLeasePlugin"),
}

# Run by the venv's Python: what Airflow finds, as JSON in the file named by argv[1].
PROBE = """
import importlib, inspect, json, sys
from pathlib import Path

import kinesis_lease, lease_core, sinks, spark_jobs
from airflow import plugins_manager
from airflow.models.baseoperator import BaseOperator
from airflow.providers_manager import ProvidersManager

provider = ProvidersManager().providers.get("kinesis-lease-batch")
operators = {
    module: sorted(
        name for name, value in vars(importlib.import_module(module)).items()
        if inspect.isclass(value) and issubclass(value, BaseOperator) and value.__module__ == module
    )
    for entry in (provider.data.get("operators", []) if provider else [])
    for module in entry["python-modules"]
}
plugins = plugins_manager.get_plugin_info()
static = Path(kinesis_lease.__file__).parent / "static"
Path(sys.argv[1]).write_text(json.dumps({
    "sys_path": sys.path,
    "files": {module.__name__: module.__file__ for module in (kinesis_lease, lease_core, sinks, spark_jobs)},
    "provider": provider and {"version": provider.version, "data": provider.data},
    "operators": operators,
    "plugins": [
        {"name": p["name"], "source": str(p["source"]), "fastapi_apps": [a["url_prefix"] for a in p["fastapi_apps"]]}
        for p in plugins
    ],
    "plugin_import_errors": plugins_manager.get_import_errors(),
    "static": sorted(path.name for path in static.iterdir()),
}, default=str))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return installed_venv(tmp_path_factory.mktemp("installed"), wheel)


def probe(venv_python: Path, root: Path, plugins_folder: Path, **settings: str) -> dict[str, Any]:
    """What Airflow in the venv finds, run in `root` (outside the checkout) with a home of its own there."""
    for folder in ("home", "dags", "cwd"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    inherited = {name: value for name, value in os.environ.items() if not name.startswith(("AIRFLOW", "PYTHON"))}
    env = {
        **inherited,
        "AIRFLOW_HOME": str(root / "home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        **settings,
    }
    out = root / "probe.json"
    run(venv_python, "-I", "-c", PROBE, out, cwd=root / "cwd", env=env, timeout=120)
    found: dict[str, Any] = json.loads(out.read_text())
    return found


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, venv_python: Path) -> dict[str, Any]:
    """A deployment: the package installed, an empty plugins folder, Airflow's defaults."""
    root = tmp_path_factory.mktemp("deployment")
    (root / "plugins").mkdir()
    return probe(venv_python, root, root / "plugins")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory, venv_python: Path) -> dict[str, Any]:
    """A developer's set-up: the checkout's plugins/ as Airflow's plugins folder, providers discovered eagerly."""
    root = tmp_path_factory.mktemp("checkout")
    return probe(venv_python, root, REPOSITORY / "plugins", AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS="False")


def test_the_wheel_carries_the_airflow_integration_the_libraries_and_the_ui_files(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        declared = archive.read(entry_points).decode()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == set(PACKAGES)
    assert {"kinesis_lease/plugin.py", "kinesis_lease/provider_info.py", "kinesis_lease/operators.py"} <= names
    assert {f"kinesis_lease/static/{path.name}" for path in STATIC.iterdir()} <= names
    for group, target in ENTRY_POINTS:
        assert f"[{group}]" in declared and f"= {target}" in declared


def test_the_packages_import_from_the_venvs_site_packages_with_no_part_of_the_checkout_on_the_path(
    deployment, venv_python
):
    site_packages = venv_python.parent.parent / "lib"
    for package in PACKAGES:
        assert Path(deployment["files"][package]).is_relative_to(site_packages), deployment["files"][package]
    assert [entry for entry in deployment["sys_path"] if Path(entry).is_relative_to(REPOSITORY)] == []


def test_airflow_lists_the_provider_with_its_version_and_operators(deployment):
    provider = deployment["provider"]
    assert provider is not None, "ProvidersManager does not list kinesis-lease-batch"
    assert provider["version"] == provider["data"]["versions"][0] == VERSION
    assert provider["data"]["package-name"] == DISTRIBUTION
    operators = set(deployment["operators"]["kinesis_lease.operators"])
    assert {"KinesisConsumeOperator", "LeaseAssignmentOperator", "FinalizeRoundOperator"} <= operators


@pytest.mark.parametrize("setup", ["deployment", "checkout"])
def test_airflow_loads_the_ui_plugin_once_from_its_entry_point(request, setup):
    found = request.getfixturevalue(setup)
    [plugin] = [plugin for plugin in found["plugins"] if plugin["name"] == "kinesis_lease"]
    assert plugin["source"].startswith(f"{DISTRIBUTION}=={VERSION}: EntryPoint(name='kinesis_lease'")
    assert plugin["fastapi_apps"] == ["/kinesis-lease"]
    # Ours only: other installed providers' plugins (OpenLineage's, under eager discovery) say their own.
    ours = {
        source: error for source, error in found["plugin_import_errors"].items() if "kinesis" in f"{source} {error}"
    }
    assert ours == {}


def test_the_installed_ui_has_every_static_file_of_the_checkout(deployment):
    assert deployment["static"] == sorted(path.name for path in STATIC.iterdir())
