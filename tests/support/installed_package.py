"""The project as a user installs it: `uv build --wheel`, installed into a throwaway venv outside the checkout.

A full install resolves ~200 packages (Airflow, PySpark): too slow for a test. The venv instead sees
the dependencies of this test's environment (links to each entry of its site-packages, leaving out
this project's own install, whose editable `.pth` would put the checkout on `sys.path`) and gets the
wheel with `--no-deps`. Run its Python with `-I` in a folder outside the checkout, so that neither
PYTHONPATH nor the working directory can bring the checkout's modules back.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
DISTRIBUTION = "kinesis-lease-batch"


def pip_install_wheel(folder: Path, wheel: Path, extras: str = "local") -> PipVenv:
    """A fresh venv in `folder` with `pip install "<wheel>[extras]"`, pip resolving every dependency."""
    venv = fresh_venv(folder)
    venv.pip("install", f"{wheel}[{extras}]" if extras else wheel)
    return venv


def run(*command: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, check=False, **kwargs)
    assert result.returncode == 0, f"{command}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


def uv() -> str:
    found = shutil.which("uv")
    assert found is not None, "uv is not on PATH (scripts/bootstrap.sh installs it)"
    return found


def build_wheel(out: Path) -> Path:
    run(uv(), "build", "--wheel", "--out-dir", out, cwd=REPOSITORY)
    [built] = out.glob("*.whl")
    return built


def installed_venv(folder: Path, wheel: Path, leave_out: Collection[str] = ()) -> Path:
    """A venv in `folder` with `wheel` installed (and this environment's dependencies, but the
    distributions named in `leave_out`, as a user has who did not install them): its Python."""
    venv = folder / "venv"
    run(uv(), "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    purelib = run(python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout
    _link_dependencies(Path(purelib.strip()), leave_out)
    run(uv(), "pip", "install", "--quiet", "--no-deps", "--python", python, wheel)
    return python


def outside_environment(variables: Mapping[str, str]) -> dict[str, str]:
    """`os.environ` with `variables`, without anything that could put the checkout on a Python path."""
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}
    return {**inherited, **variables}


def _link_dependencies(site_packages: Path, leave_out: Collection[str]) -> None:
    """Every entry of this environment's site-packages, except this project's own install and `leave_out`."""
    skipped = {Path(str(file)).parts[0] for name in (DISTRIBUTION, *leave_out) for file in _files_of(name)}
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name not in skipped:
            (site_packages / entry.name).symlink_to(entry)


def _files_of(distribution: str) -> list[Any]:
    try:
        return list(importlib.metadata.distribution(distribution).files or ())
    except importlib.metadata.PackageNotFoundError:
        return []


class PipVenv:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.bin = folder / "bin"
        self.python = self.bin / "python"
        self.seconds = 0.0

    def pip(self, *arguments: str | Path) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        try:
            return run(self.python, "-m", "pip", *arguments, cwd=self.folder.parent, timeout=1500)
        finally:
            self.seconds += time.monotonic() - started

    def environment(self, **variables: str) -> dict[str, str]:
        """The test's environment without this venv or the test's own on PATH, and no Spark or Python
        settings: as an Airflow started as `<venv>/bin/airflow` without activating the venv sees it."""
        ours = {self.bin.resolve(), Path(sys.executable).parent.resolve()}
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() not in ours]
        inherited = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("PYTHON", "PYSPARK", "SPARK", "AIRFLOW", "VIRTUAL_ENV"))
        }
        return {**inherited, "PATH": os.pathsep.join(path), **variables}


def fresh_venv(folder: Path) -> PipVenv:
    """`python -m venv` with the pip it brings: the base interpreter of this test's Python 3.11."""
    run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", folder)
    return PipVenv(folder)
