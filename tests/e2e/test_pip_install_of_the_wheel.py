"""The wheel installed with pip, as a user of the published package installs it, yields a consistent
environment whose Spark runs without activating the venv.

Two routes, each into a fresh `python -m venv` with the pip it brings (not uv), resolved for real from
the configured package indexes (pip.conf, PIP_* variables):

- `pip install "<wheel>[local]"`: pip resolves every dependency itself (README, "Installing it into Airflow",
  with the extra of the README's walk-through; the venv is the session's, `pip_installed`, which
  tests/e2e/test_first_hour.py walks through too);
- the locked route of docs/running-on-aws.md: `uv export --frozen --no-dev --no-emit-project` into a
  requirements file (pinned, with hashes), `pip install -r` it, then `pip install --no-deps <wheel>`.

Each must leave `pip check` clean, pyspark 4.3.0 in its files and its metadata, no `pyspark-client`
(whose wheels install the same files over pyspark's), no file claimed by two distributions, pyspark's
`spark-submit` runnable from outside the venv the ways the docs say, and the consume operator running
the Spark of the venv's Python when the venv's bin is not on PATH.

Time measured on 2 cores (2026-11-28): pip's first install of the wheel, with an empty pip cache
(downloading ~1.5 GB, building pyspark's 456 MB wheel from its sdist), took 1 min 52 s on an idle
machine. This module, with pip's cache warm and other jobs sharing the cores (load ~3.5), took 7 min 17 s:
`pip install <wheel>` 87 s, the locked route 169 s, the rest building the wheel and starting Spark 6 times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.installed_package import REPOSITORY, PipVenv, fresh_venv, run, uv

pytestmark = pytest.mark.timeout(1800)

PYSPARK_VERSION = "4.3.0"
# The exact options of docs/running-on-aws.md's locked route.
EXPORT_OPTIONS = ("export", "--frozen", "--no-dev", "--no-emit-project")

# Run by the venv's Python: what is installed, as JSON on stdout.
INVENTORY = """
import importlib.metadata, json, re
from collections import defaultdict
from pathlib import Path
import pyspark

owners = defaultdict(set)
for distribution in importlib.metadata.distributions():
    for file in distribution.files or ():
        if not file.parts[0].endswith((".dist-info", "..")):
            owners[str(file)].add(distribution.metadata["Name"])
version_file = Path(pyspark.__file__).with_name("version.py").read_text()
print(json.dumps({
    "pyspark_imported": pyspark.__version__,
    "pyspark_file": re.search(r"__version__[^=]*=\\s*['\\"]([^'\\"]+)", version_file).group(1),
    "pyspark_metadata": importlib.metadata.version("pyspark"),
    "pyspark_home": str(Path(pyspark.__file__).resolve().parent),
    "distributions": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions()),
    "shared_files": sorted(f"{path}: {sorted(names)}" for path, names in owners.items() if len(names) > 1),
}))
"""

# Run by the venv's Python: the consume operator submits a small job through the provider's own
# SparkSubmitOperator.execute (its hook as the operator configures it), on the `spark_default` connection
# of the environment; the job writes what it ran on to argv[1].
SUBMIT = """
import sys
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from kinesis_lease.operators import KinesisConsumeOperator

operator = KinesisConsumeOperator(
    task_id="consume", application=sys.argv[1], application_args=[sys.argv[2]],
    env_vars={"PYSPARK_PYTHON": sys.executable},
    settings={}, streams=["s"], num_workers=1, output_uri="/nonexistent", leader_owner="o", round_number=1,
)
SparkSubmitOperator.execute(operator, {})
"""

JOB = """
import json, os, sys
import pyspark
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("which-spark").getOrCreate()
count = spark.sparkContext.parallelize(range(10), 2).count()
with open(sys.argv[1], "w") as out:
    json.dump({"spark": spark.version, "pyspark": pyspark.__version__, "spark_home": os.environ.get("SPARK_HOME"),
               "count": count}, out)
spark.stop()
"""


@pytest.fixture(scope="module")
def plain(pip_installed: PipVenv) -> PipVenv:
    """`pip install "<wheel>[local]"`: pip resolves the dependencies (tests/e2e/conftest.py)."""
    return pip_installed


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> PipVenv:
    """docs/running-on-aws.md's route: the lock exported with hashes, installed by pip, then the wheel."""
    root = tmp_path_factory.mktemp("locked")
    requirements = root / "requirements.txt"
    requirements.write_text(run(uv(), *EXPORT_OPTIONS, cwd=REPOSITORY).stdout)
    venv = fresh_venv(root / "venv")
    venv.pip("install", "-r", requirements)
    venv.pip("install", "--no-deps", built_wheel)
    print(f"locked route: {venv.seconds:.0f} s", file=sys.stderr)
    return venv


@pytest.fixture(scope="module", params=["plain", "locked"])
def venv(request: pytest.FixtureRequest) -> PipVenv:
    found: PipVenv = request.getfixturevalue(request.param)
    return found


@pytest.fixture(scope="module")
def inventory(venv: PipVenv) -> dict[str, object]:
    found: dict[str, object] = json.loads(
        run(venv.python, "-I", "-c", INVENTORY, cwd=venv.folder, env=venv.environment()).stdout
    )
    return found


def test_the_locked_export_is_pinned_with_hashes_and_names_no_local_path():
    exported = run(uv(), *EXPORT_OPTIONS, cwd=REPOSITORY).stdout
    requirements = [line for line in exported.splitlines() if line and not line.startswith(("#", " "))]
    assert requirements
    assert [line for line in requirements if "==" not in line] == []
    assert exported.count("--hash=sha256:") >= len(requirements)
    assert not any(line.split("==")[0].strip().lower() == "pyspark-client" for line in requirements)


def test_pip_check_finds_nothing_broken(venv):
    assert "No broken requirements found" in venv.pip("check").stdout


def test_pyspark_is_4_3_0_in_its_files_and_its_metadata(inventory):
    assert inventory["pyspark_imported"] == PYSPARK_VERSION
    assert inventory["pyspark_file"] == PYSPARK_VERSION
    assert inventory["pyspark_metadata"] == PYSPARK_VERSION


def test_no_pyspark_client_is_installed_and_no_file_belongs_to_two_distributions(inventory):
    assert "pyspark-client" not in inventory["distributions"]
    assert inventory["shared_files"] == []


def test_the_apache_spark_provider_is_the_5_x_line_that_requires_pyspark(venv):
    shown = venv.pip("show", "apache-airflow-providers-apache-spark").stdout
    assert "Version: 5." in shown


def spark_submit_version(command: list[str], env: dict[str, str], cwd: Path) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False)
    assert result.returncode == 0, f"{command}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result.stdout + result.stderr


def test_the_venvs_spark_submit_runs_unactivated_with_pyspark_python_set(venv):
    """docs/running-on-aws.md: `<venv>/bin/spark-submit` finds SPARK_HOME with $PYSPARK_PYTHON (else the
    `python3` of PATH, which has no pyspark); set it to the venv's Python, as the executors need anyway."""
    env = venv.environment(PYSPARK_PYTHON=str(venv.python))
    output = spark_submit_version([str(venv.bin / "spark-submit"), "--version"], env, venv.folder)
    assert f"version {PYSPARK_VERSION}" in output


def test_the_spark_submit_inside_pyspark_runs_unactivated_with_nothing_set(venv, inventory):
    """`$SPARK_HOME/bin/spark-submit` (SPARK_HOME = the installed pyspark package) finds its own home."""
    spark_submit = Path(str(inventory["pyspark_home"])) / "bin" / "spark-submit"
    output = spark_submit_version([str(spark_submit), "--version"], venv.environment(), venv.folder)
    assert f"version {PYSPARK_VERSION}" in output


def test_the_consume_operator_runs_the_spark_of_its_python_without_the_venv_on_path(venv, inventory, tmp_path):
    job, out = tmp_path / "which_spark.py", tmp_path / "which_spark.json"
    job.write_text(JOB)
    env = venv.environment(
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        SPARK_LOCAL_IP="127.0.0.1",
    )
    result = subprocess.run(
        [str(venv.python), "-I", "-c", SUBMIT, str(job), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
    ran = json.loads(out.read_text())
    assert ran == {
        "spark": PYSPARK_VERSION,
        "pyspark": PYSPARK_VERSION,
        "spark_home": inventory["pyspark_home"],
        "count": 10,
    }
