"""The map of docs/architecture.md, enforced: lease_core is below spark_jobs, which is below the Airflow
plugins and the DAG; inside lease_core and spark_jobs, parts import only the ones below them (the sinks
are below the consumer); lease_core imports neither Airflow nor Spark, spark_jobs not Airflow; and
DynamoDB's attribute-value format is written only inside `store/`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
LEASE_CORE = REPOSITORY / "lease_core"

# Each part of lease_core and the parts it may import (docs/architecture.md, "Where the code of `lease_core` lives").
# The values, the errors, the configuration and the retry policy are below everything that does I/O.
BASE = {"model", "errors", "config", "retry", "aws"}
ALLOWED = {
    "ops": BASE | {"application", "leader", "sync", "metrics", "assignment", "lifecycle", "retrieval", "store"},
    "application": BASE | {"leader", "metrics", "retrieval", "store"},
    "leader": BASE | {"metrics", "assignment", "store"},
    "sync": BASE | {"lifecycle", "retrieval", "store"},
    "metrics": BASE | {"assignment", "store"},
    "lifecycle": BASE | {"store"},
    "retrieval": BASE,
    "store": BASE,
    "assignment": {"model", "errors", "config"},
    "aws": {"model", "errors", "config", "retry"},
    "config": {"errors"},
    "model": {"errors"},
    "retry": set(),
    "errors": set(),
}
FORBIDDEN_ROOTS = {"airflow", "pyspark"}


def part_of(path: Path) -> str:
    relative = path.relative_to(LEASE_CORE)
    return relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 or path.stem != "__init__" else "root"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


MODULES = sorted(path for path in LEASE_CORE.rglob("*.py") if part_of(path) != "root")


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_a_module_imports_only_parts_below_its_own(path):
    part = part_of(path)
    for module in imported_modules(path):
        root = module.partition(".")[0]
        assert root not in FORBIDDEN_ROOTS, f"{path.name} imports {module}: lease_core runs without Airflow and Spark"
    assert_imports_only_parts_below(path, LEASE_CORE, "lease_core", ALLOWED[part] | {part})


# Inside retrieval/: each folder is one way of reading shards (`polling/`; KCL's retrieval/polling and
# retrieval/fanout), beside the modules every way shares (the record-source seam, start positions,
# KPL deaggregation, retention gaps, the batches). What reads records knows only the seam: no shared
# module, no other way of reading and nothing outside lease_core imports a way of reading; the
# composition root alone picks one (below, once the project's packages are listed).
RETRIEVAL = LEASE_CORE / "retrieval"
RETRIEVAL_MODES = sorted(path.name for path in RETRIEVAL.iterdir() if (path / "__init__.py").is_file())
COMPOSITION_ROOT = LEASE_CORE / "application.py"


def retrieval_mode_of(module: str) -> str | None:
    """The way of reading that `module` (a dotted name) belongs to, or None."""
    parts = module.split(".")
    return (
        parts[2]
        if parts[:2] == ["lease_core", "retrieval"] and len(parts) > 2 and parts[2] in RETRIEVAL_MODES
        else None
    )


def test_retrieval_has_a_way_of_reading_in_a_folder_of_its_own():
    assert "polling" in RETRIEVAL_MODES


# The project's top-level packages and the ones each may import. plugins/kinesis_lease is installed
# as the package `kinesis_lease` (pyproject.toml), the name the DAG and the plugin import it by.
PACKAGES = {
    "lease_core": set(),
    "sinks": {"lease_core"},
    "spark_jobs": {"lease_core", "sinks"},
    "plugins": {"lease_core", "sinks", "spark_jobs"},
    "dags": {"lease_core", "plugins"},
}
PACKAGE_OF_ROOT = {
    "lease_core": "lease_core",
    "sinks": "sinks",
    "spark_jobs": "spark_jobs",
    "plugins": "plugins",
    "kinesis_lease": "plugins",
    "dags": "dags",
}
PACKAGE_MODULES = sorted(path for package in PACKAGES for path in (REPOSITORY / package).rglob("*.py"))


@pytest.mark.parametrize("path", PACKAGE_MODULES, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_a_package_imports_only_the_packages_below_it(path):
    package = path.relative_to(REPOSITORY).parts[0]
    allowed = PACKAGES[package] | {package}
    upward = {
        module
        for module in imported_modules(path)
        if PACKAGE_OF_ROOT.get(module.partition(".")[0], package) not in allowed
    }
    assert not upward, (
        f"{package}/ may import only {sorted(allowed - {package})}, but {path.name} imports {sorted(upward)}"
    )


@pytest.mark.parametrize("path", PACKAGE_MODULES, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_a_way_of_reading_shards_is_imported_only_by_itself_and_the_composition_root(path):
    relative = path.relative_to(REPOSITORY)
    own = retrieval_mode_of(".".join(relative.with_suffix("").parts))
    chosen = {module for module in imported_modules(path) if retrieval_mode_of(module) not in (None, own)}
    assert not chosen or path == COMPOSITION_ROOT, (
        f"{relative} imports {sorted(chosen)}: only {COMPOSITION_ROOT.relative_to(REPOSITORY)} picks a way of "
        "reading shards; the rest read through lease_core.retrieval.record_source"
    )


# Each part of spark_jobs and the parts it may import (the sinks are a package below it, `sinks/`).
SPARK_JOBS = REPOSITORY / "spark_jobs"
SPARK_JOBS_ALLOWED = {
    "consume_job": {
        "errors",
        "consume_spec",
        "lease_consumer",
        "round_publication",
        "round_report",
        "slot_task",
        "transform",
        "decode",
        "dead_letters",
        "slot_memory",
        "job_errors",
        "record_processing",
    },
    # The error that stops the driver without a round, written for the consume step, which reads it.
    "job_errors": {"errors"},
    # The consume step's check, before it submits the job, that the decoder and the transform load.
    "user_functions": {"errors", "decode", "transform", "job_errors", "record_processing"},
    "round_publication": {"errors", "round_report"},
    "leasectl": {"errors", "dead_letter_replay"},
    "slot_task": {
        "errors",
        "consume_spec",
        "lease_consumer",
        "round_report",
        "transform",
        "decode",
        "slot_memory",
    },
    "consume_spec": {"errors", "lease_consumer", "record_processing"},
    # The round's record-processing options, defined once: checked, as flags, on the trigger form.
    "record_processing": {"errors", "dead_letters", "decode"},
    "lease_consumer": {"errors", "round_report", "transform", "decode", "dead_letters"},
    # What a record the decoder rejects does: fail the batch, or set it aside as a dead letter.
    "dead_letters": {"errors", "decode"},
    # Dead letters landed after a fix: the user's decoder and transform again, into the sinks.
    "dead_letter_replay": {"errors", "decode", "transform"},
    "round_report": {"errors"},
    # How a slot process allocates (Arrow's pool, glibc's heap), set where the slot starts.
    "slot_memory": set(),
    "transform": {"errors"},
    # The per-record decode hook: loads the user's function as the transform does.
    "decode": {"errors", "transform"},
    # The built-in decoders, one module each (json's reader serves cloudwatch_logs and dynamodb too).
    "decoders": {"errors", "decode"},
    "errors": set(),
}
SPARK_JOBS_MODULES = sorted(path for path in SPARK_JOBS.rglob("*.py") if path != SPARK_JOBS / "__init__.py")


@pytest.mark.parametrize("path", SPARK_JOBS_MODULES, ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_a_spark_jobs_module_imports_only_parts_below_its_own(path):
    part = path.relative_to(SPARK_JOBS).parts[0].removesuffix(".py")
    for module in imported_modules(path):
        assert module.partition(".")[0] != "airflow", f"{path.name} imports {module}: spark_jobs runs without Airflow"
    assert_imports_only_parts_below(path, SPARK_JOBS, "spark_jobs", SPARK_JOBS_ALLOWED[part] | {part})


def assert_imports_only_parts_below(path: Path, package: Path, name: str, allowed: set[str]) -> None:
    """Every `<name>.<part>` that the module at `path` imports is an `allowed` part."""
    part = path.relative_to(package).parts[0].removesuffix(".py")
    upward = set()
    for module in imported_modules(path):
        root, _, rest = module.partition(".")
        if root == name and rest and rest.split(".")[0] not in allowed:
            upward.add(module)
    assert not upward, f"{part}/ may import only {sorted(allowed - {part})}, but {path.name} imports {sorted(upward)}"


ATTRIBUTE_VALUE = re.compile(
    r"""\{\s*["'](?:S|N|B|SS|NS|BS|M|L|BOOL|NULL)["']\s*:|\[\s*["'](?:S|N|SS|M|L|BOOL)["']\s*\]"""
)
OUTSIDE_STORE = sorted(
    path
    for folder in ("lease_core", "spark_jobs", "plugins", "dags")
    for path in (REPOSITORY / folder).rglob("*.py")
    if "store" not in path.relative_to(REPOSITORY).parts
)


def test_dynamodb_attribute_values_are_written_only_inside_the_store():
    found = [
        f"{path.relative_to(REPOSITORY)}:{number}: {line.strip()}"
        for path in OUTSIDE_STORE
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if ATTRIBUTE_VALUE.search(line)
    ]
    assert not found, "attribute-value literals outside lease_core/store/ (use a record's to_item):\n" + "\n".join(
        found
    )


# The sinks: no Airflow and no Spark, and each table format (a module the registry names, with the
# modules of its own name beside it: `iceberg_maintenance` is Iceberg's) is imported by nothing else in
# the project's packages: the registry alone picks a format, and the committer knows only its primitives.
SINKS = REPOSITORY / "sinks"
SINK_MODULES = sorted(SINKS.rglob("*.py"))
FORMAT_MODULES = {"sinks.table.iceberg", "sinks.table.delta"}
REGISTRY = SINKS / "registry.py"


def format_of_module(module: str) -> str | None:
    """The table format a dotted module name belongs to (`sinks.table.iceberg_maintenance`: iceberg)."""
    for format_module in FORMAT_MODULES:
        if module == format_module or module.startswith(f"{format_module}_"):
            return format_module
    return None


def test_the_registry_names_every_format_module():
    from sinks.registry import SCHEMES

    assert set(SCHEMES.values()) == FORMAT_MODULES


@pytest.mark.parametrize("path", [*SINK_MODULES, *PACKAGE_MODULES], ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_a_table_format_is_imported_only_by_itself(path):
    relative = path.relative_to(REPOSITORY)
    own = format_of_module(".".join(relative.with_suffix("").parts))
    for module in imported_modules(path):
        assert module.partition(".")[0] not in FORBIDDEN_ROOTS or relative.parts[0] != "sinks", (
            f"{relative} imports {module}: the sinks run without Airflow and Spark"
        )
    chosen = {module for module in imported_modules(path) if format_of_module(module) not in (None, own)}
    assert not chosen, f"{relative} imports {sorted(chosen)}: only sinks/registry.py picks a table format, by URI"
