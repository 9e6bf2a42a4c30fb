"""The map of docs/architecture.md, enforced: lease_core's packages import only the ones below them, none
imports Airflow or Spark, and DynamoDB's attribute-value format is written only inside `store/`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
LEASE_CORE = REPOSITORY / "lease_core"

# Each part of lease_core and the parts it may import (docs/architecture.md, "Where the code lives").
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
    allowed = ALLOWED[part] | {part}
    upward = set()
    for module in imported_modules(path):
        root, _, rest = module.partition(".")
        assert root not in FORBIDDEN_ROOTS, f"{path.name} imports {module}: lease_core runs without Airflow and Spark"
        if root == "lease_core" and rest:
            target = rest.split(".")[0]
            if target not in allowed:
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
