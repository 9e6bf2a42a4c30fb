"""Build-time self-check of the project image: the build fails when an invariant the stack relies on is broken.

Run by docker/project.Dockerfile with the image's Python after the install:
`python docker/check_image.py requirements.txt` (the requirements exported from uv.lock).

- every locked requirement is installed at its locked version (the base image's own packages that
  the lock also pins were replaced, not left behind);
- pyspark is the full 4.x distribution, its files its own: no `pyspark-client` is installed (its
  wheels install the same files over pyspark's; the Apache Spark provider 5.x requires pyspark itself);
- `lease_core`, `spark_jobs` and `kinesis_lease` are installed in site-packages, not editable, so the
  operators find the consume job with `importlib.util.find_spec("spark_jobs.consume_job")`;
- Airflow finds the integration through the installed package alone: its `apache_airflow_provider`
  and `airflow.plugins` entry points, and the monitoring UI's static files inside `kinesis_lease`;
- `SPARK_HOME` is the installed pyspark, `spark-submit`/`spark-class` are on PATH, `PYSPARK_PYTHON`
  is this Python (executors and driver share one interpreter), and a Java runtime answers;
- the Postgres driver of the metadata database imports.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement

DISTRIBUTION = "kinesis-lease-batch"
ENTRY_POINTS = {
    ("apache_airflow_provider", "kinesis_lease.provider_info:get_provider_info"),
    ("airflow.plugins", "kinesis_lease.plugin:KinesisLeasePlugin"),
}
MODULES = (
    "airflow.providers.amazon.aws.hooks.base_aws",
    "airflow.providers.apache.spark.hooks.spark_submit",
    "boto3",
    "pyarrow.dataset",
    "psycopg2",
)


def locked_requirements(path: Path) -> Iterator[Requirement]:
    """The `name==version` lines of a `uv export` file (continuations and hashes dropped)."""
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0].split(" --hash", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            yield requirement


def problems(requirements: Path) -> Iterator[str]:
    for requirement in locked_requirements(requirements):
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            yield f"{requirement} is locked but not installed"
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            yield f"{requirement} is locked but {installed} is installed"

    import pyspark

    if pyspark.__version__ != importlib.metadata.version("pyspark"):
        yield f"pyspark's files say {pyspark.__version__}: another distribution overwrote them"
    try:
        client = importlib.metadata.version("pyspark-client")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        yield f"pyspark-client {client} is installed: its files are pyspark's (the lock has none)"

    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    for module in ("lease_core", "spark_jobs.consume_job", "kinesis_lease.plugin"):
        spec = importlib.util.find_spec(module)
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin is None or site_packages not in origin.parents:
            yield f"{module} is not installed in {site_packages} (found at {origin})"

    declared = {(entry.group, entry.value) for entry in importlib.metadata.distribution(DISTRIBUTION).entry_points}
    for entry_point in ENTRY_POINTS - declared:
        yield f"{DISTRIBUTION} does not declare the entry point {entry_point}"
    static = site_packages / "kinesis_lease" / "static"
    if not (static / "index.html").is_file():
        yield f"the monitoring UI's static files are not installed in {static}"

    spark_home = Path(os.environ.get("SPARK_HOME", "/nonexistent"))
    if spark_home.resolve() != Path(pyspark.__file__).parent.resolve():
        yield f"SPARK_HOME={spark_home} is not the installed pyspark ({Path(pyspark.__file__).parent})"
    for command in ("spark-submit", "spark-class"):
        if shutil.which(command) is None:
            yield f"{command} is not on PATH"
    python = shutil.which(os.environ.get("PYSPARK_PYTHON", "python3"))
    if python is None or Path(python).resolve() != Path(sys.executable).resolve():
        yield f"PYSPARK_PYTHON={os.environ.get('PYSPARK_PYTHON')} is not this Python ({sys.executable})"
    java = shutil.which("java")
    if java is None or subprocess.run([java, "-version"], capture_output=True, check=False).returncode != 0:
        yield "no Java runtime answers `java -version`"

    for module in MODULES:
        try:
            importlib.import_module(module)
        except ImportError as error:
            yield f"{module} does not import: {error}"


def main(argv: list[str]) -> int:
    found = list(problems(Path(argv[1])))
    for problem in found:
        print(f"check_image: {problem}", file=sys.stderr)
    print(f"check_image: {'FAILED' if found else 'ok'}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
