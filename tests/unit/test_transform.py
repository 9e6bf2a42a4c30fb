"""The user transform: loading it from a spec, and applying it to a batch with failures named."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.record_columns import RECORD_SCHEMA, records_table
from spark_jobs.errors import FunctionLoadError, TransformError
from spark_jobs.transform import apply_transform, load_transform
from tests.support import transforms

ARRIVAL = datetime(2026, 11, 2, 8, 30, tzinfo=UTC)
BATCH = records_table(
    [
        KinesisRecord("100", 0, "a", ARRIVAL, b'{"n": 1}'),
        KinesisRecord("101", 0, "b", ARRIVAL, b""),
    ]
)


def load(spec: str):
    transform = load_transform(spec)
    assert transform is not None
    return transform


def test_no_spec_means_no_transform() -> None:
    assert load_transform(None) is None


def test_a_spec_loads_the_named_function_and_the_transform_sees_exactly_the_file_columns() -> None:
    result = apply_transform(
        "tests.support.transforms:with_payload_size", load("tests.support.transforms:with_payload_size"), BATCH
    )
    assert BATCH.schema == RECORD_SCHEMA
    assert result.column_names == [*RECORD_SCHEMA.names, "payload_size"]
    assert result["payload_size"].to_pylist() == [8, 0]


def test_a_transform_may_drop_rows() -> None:
    spec = "tests.support.transforms:without_empty_payloads"
    assert apply_transform(spec, load(spec), BATCH)["sequence_number"].to_pylist() == ["100"]


BAD_SPECS = [
    pytest.param("", "is not of the form", id="empty"),
    pytest.param("tests.support.transforms", "is not of the form", id="no-colon"),
    pytest.param("tests.support.transforms:", "is not of the form", id="no-function"),
    pytest.param(":with_payload_size", "is not of the form", id="no-module"),
    pytest.param("tests..support:with_payload_size", "is not of the form", id="empty-package-part"),
    pytest.param("tests.support.transforms:with payload", "is not of the form", id="space-in-function"),
    pytest.param("tests.support.transforms:a:b", "is not of the form", id="two-colons"),
    pytest.param("tests/support/transforms.py:failing", "is not of the form", id="file-path"),
    pytest.param("no_such_package.module:f", "No module named 'no_such_package'", id="missing-package"),
    pytest.param("tests.support.no_such:f", "No module named 'tests.support.no_such'", id="missing-module"),
    pytest.param(
        "tests.support.transforms:no_such_function",
        "module 'tests.support.transforms' has no attribute 'no_such_function'",
        id="missing-function",
    ),
    pytest.param(
        "tests.support.transforms:NOT_CALLABLE",
        "'NOT_CALLABLE' is not callable (it is of type 'int')",
        id="not-callable",
    ),
]


@pytest.mark.parametrize(("spec", "problem"), BAD_SPECS)
def test_a_bad_spec_raises_a_function_load_error_naming_the_transform_its_spec_and_the_problem(
    spec: str, problem: str
) -> None:
    with pytest.raises(FunctionLoadError) as raised:
        load_transform(spec)
    assert raised.value.spec == spec
    assert problem in raised.value.problem
    assert str(raised.value).startswith(f"transform {spec!r} cannot be loaded: ")
    assert raised.value.retryable is False


BROKEN_MODULES = [
    pytest.param("raise RuntimeError('no config file')", "raised RuntimeError: no config file", id="raises"),
    pytest.param(
        "import no_such_dependency_of_the_transform",
        "raised ModuleNotFoundError: No module named 'no_such_dependency_of_the_transform'",
        id="missing-dependency",
    ),
]


@pytest.mark.parametrize(("source", "problem"), BROKEN_MODULES)
def test_a_module_that_fails_to_import_is_reported_with_its_own_error(
    source: str, problem: str, tmp_path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    module_name = f"broken_transform_{request.node.callspec.id.replace('-', '_')}"
    (tmp_path / f"{module_name}.py").write_text(f"{source}\n\ndef transform(table):\n    return table\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TransformError) as raised:
        load_transform(f"{module_name}:transform")
    assert raised.value.problem == f"importing {module_name!r} {problem}"


def test_an_exception_from_the_transform_becomes_a_transform_error_with_its_type_and_message() -> None:
    spec = "tests.support.transforms:failing"
    with pytest.raises(TransformError) as raised:
        apply_transform(spec, load(spec), BATCH)
    assert (raised.value.spec, raised.value.problem) == (spec, "raised ValueError: cannot decode 2 payloads")
    assert isinstance(raised.value.__cause__, ValueError)


def test_a_result_that_is_not_a_table_is_refused() -> None:
    spec = "tests.support.transforms:row_count"
    with pytest.raises(TransformError, match=r"returned an object of type 'int', not a pyarrow\.Table"):
        apply_transform(spec, load(spec), BATCH)


def test_a_record_batch_is_not_accepted_in_place_of_a_table() -> None:
    with pytest.raises(TransformError, match="'RecordBatch'"):
        apply_transform("inline", lambda table: table.to_batches()[0], BATCH)


def test_a_transform_error_survives_pickling_as_it_must_to_leave_an_executor() -> None:
    with pytest.raises(TransformError) as raised:
        apply_transform("tests.support.transforms:failing", transforms.failing, BATCH)
    copy = pickle.loads(pickle.dumps(raised.value))
    assert (type(copy), copy.spec, copy.problem, str(copy)) == (
        TransformError,
        raised.value.spec,
        raised.value.problem,
        str(raised.value),
    )


def test_the_transformed_table_is_returned_as_the_transform_built_it() -> None:
    sliced = apply_transform("inline", lambda table: table.slice(1), BATCH)
    assert sliced.equals(BATCH.slice(1))
    assert isinstance(sliced, pa.Table)
