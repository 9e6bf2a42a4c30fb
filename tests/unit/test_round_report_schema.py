"""The round report owns its schema: what `write_report` writes `read_report` rebuilds whole, a file
of another shape is refused naming the field, and the XCom figures and history entries the operators
return keep the keys and values the DAG, the monitoring UI and the e2e tests read."""

from __future__ import annotations

import dataclasses
import json

import pytest
from kinesis_lease.operators import corrupt_leases, records_lost, round_summary

from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.errors import LeaseCoreError
from lease_core.model.lease import AgedOutRange
from spark_jobs.round_report import (
    ERROR_CHARACTERS,
    LeaseFigures,
    LeaseReport,
    MalformedReportError,
    Outcome,
    Publication,
    RetentionLoss,
    RoundFigures,
    RoundReport,
    RoundTotals,
    SlotReport,
    read_report,
    report_uri_for,
    write_report,
)

AGED_OUT = RetentionLoss("shardId-000000000001", "49600000000000000001", "49600000000000000090", None)
EARLIER = RetentionLoss("shardId-000000000009", "49600000000000000005", None, None)
CAUGHT_UP = LeaseReport(
    "shardId-000000000001",
    "orders",
    "shardId-000000000001",
    "orders-worker-0",
    Outcome.CAUGHT_UP,
    "49600000000000000000",
    "49600000000000000120",
    records=120,
    bytes=4096,
    seconds=2.5,
    files=2,
    replayed_batches=1,
    millis_behind_latest=1200,
    throughput_kbps=1.6,
    covered_seconds=2.0,
    children_created=("shardId-000000000003",),
    retention_losses=(AGED_OUT,),
    read_calls=4,
    refused_read_calls=1,
    read_reopens=1,
    dead_lettered=3,
    left_out=5,
    landed_through_millis=1_795_000_000_000,
    newest_arrival_millis=1_794_999_990_000,
)
FAILED = LeaseReport(
    "shardId-000000000002",
    "orders",
    "shardId-000000000002",
    "orders-worker-1",
    Outcome.FAILED,
    "TRIM_HORIZON",
    "TRIM_HORIZON",
    detail="cannot promote its batch: 503 Slow Down",
    retryable=True,
    unpromoted_batch="stream_name=orders/shard_id=shardId-000000000002/b.parquet",
)
REPORT = RoundReport.build(
    "orders",
    7,
    ["orders"],
    "/lake",
    "2026-11-24T03:00:00+00:00",
    3.25,
    # Unordered on purpose, with a float field holding an integer: `-1` is what "no sample" may be written as.
    [SlotReport("orders-worker-1", 2, 1.5, -1, (FAILED,)), SlotReport("orders-worker-0", 0, 3.0, 42.5, (CAUGHT_UP,))],
    slot_failures=["slot 3: executor lost"],
    leader_record_version="rvn-1",
    recorded_losses=[EARLIER, AGED_OUT],
)

FIGURES = {
    "application_name": "orders",
    "round_number": 7,
    "seconds": 3.25,
    "succeeded": False,
    "totals": {
        "leases": 2,
        "records": 120,
        "bytes": 4096,
        "files": 2,
        "outcomes": {"caught_up": 1, "failed": 1},
        "lost_leases": [],
        "failed_leases": ["shardId-000000000002"],
        "retention_losses": [
            {
                "lease_key": "shardId-000000000001",
                "after": "49600000000000000001",
                "first_available": "49600000000000000090",
                "first_available_arrival": None,
            },
            {
                "lease_key": "shardId-000000000009",
                "after": "49600000000000000005",
                "first_available": None,
                "first_available_arrival": None,
            },
        ],
        "max_millis_behind_latest": 1200,
        "busiest_over_bound": 1.0,
        "unpromoted_batches": ["shardId-000000000002: stream_name=orders/shard_id=shardId-000000000002/b.parquet"],
        "missing_batches": [],
        "dead_lettered": 3,
        "left_out": 5,
    },
    "slot_failures": ["slot 3: executor lost"],
    "slots": [
        {
            "worker_id": "orders-worker-0",
            "leases": 1,
            "attempt": 0,
            "records": 120,
            "bytes": 4096,
            "seconds": 3.0,
            "cpu_percent": 42.5,
        },
        {
            "worker_id": "orders-worker-1",
            "leases": 1,
            "attempt": 2,
            "records": 0,
            "bytes": 0,
            "seconds": 1.5,
            "cpu_percent": -1,
        },
    ],
    "leases": [
        {
            "lease_key": "shardId-000000000001",
            "stream_name": "orders",
            "shard_id": "shardId-000000000001",
            "worker_id": "orders-worker-0",
            "outcome": "caught_up",
            "records": 120,
            "bytes": 4096,
            "seconds": 2.5,
            "start": "49600000000000000000",
            "end": "49600000000000000120",
            "millis_behind_latest": 1200,
            "throughput_kbps": 1.6,
            "error": None,
            "retryable": None,
            "dead_lettered": 3,
            "left_out": 5,
            "read_calls": 4,
            "refused_read_calls": 1,
            "landed_through_millis": 1_795_000_000_000,
            "newest_arrival_millis": 1_794_999_990_000,
        },
        {
            "lease_key": "shardId-000000000002",
            "stream_name": "orders",
            "shard_id": "shardId-000000000002",
            "worker_id": "orders-worker-1",
            "outcome": "failed",
            "records": 0,
            "bytes": 0,
            "seconds": 0.0,
            "start": "TRIM_HORIZON",
            "end": "TRIM_HORIZON",
            "millis_behind_latest": None,
            "throughput_kbps": None,
            "error": "cannot promote its batch: 503 Slow Down",
            "retryable": True,
            "dead_lettered": 0,
            "left_out": 0,
            "read_calls": 0,
            "refused_read_calls": 0,
            "landed_through_millis": None,
            "newest_arrival_millis": None,
        },
    ],
    "publication": None,
    "output_uri": "/lake",
}


def local_application() -> LeaseApplication:
    return LeaseApplication.from_config(ConsumerConfig(application_name="orders"))  # local paths need no client


def test_a_written_report_is_read_back_equal_to_the_one_written(tmp_path):
    uri = report_uri_for(str(tmp_path / "lake" / "_rounds"), "manual__1")
    write_report(uri, REPORT, local_application())
    assert read_report(uri, local_application()) == REPORT


def test_the_files_keys_are_the_schemas_field_names_and_succeeded():
    document = json.loads(REPORT.to_json())
    assert set(document) == {
        "application_name",
        "round_number",
        "streams",
        "output_uri",
        "started_at",
        "seconds",
        "slots",
        "totals",
        "slot_failures",
        "leadership_lost",
        "leader_record_version",
        "publication",
        "succeeded",
    }
    assert document["totals"] == FIGURES["totals"] and document["succeeded"] is False
    assert document["slots"][0]["leases"][0]["retention_losses"] == [FIGURES["totals"]["retention_losses"][0]]


def test_a_report_names_its_losses_each_once_and_as_the_lease_stores_them():
    assert REPORT.reported_losses() == [
        ("shardId-000000000001", AgedOutRange("49600000000000000001", "49600000000000000090", None)),
        ("shardId-000000000009", AgedOutRange("49600000000000000005", None, None)),
    ]


def test_the_consume_steps_xcom_keeps_its_keys_and_values_and_reads_back():
    figures = REPORT.figures().to_dict()
    assert figures == FIGURES
    assert RoundFigures.from_dict(json.loads(json.dumps(figures)), "xcom") == REPORT.figures()


def test_the_finalize_summary_of_a_consumed_round_counts_its_figures():
    figures = RoundFigures.from_dict(FIGURES, "xcom")
    assignment = {"round_number": 7, "moves": [{"lease_key": "a"}, {"lease_key": "b"}]}
    shard_sync = {
        "possibly_unread": ["shardId-000000000004"],
        "corrupt_leases": [{"lease_key": "shardId-000000000009", "problem": "attribute 'checkpoint' is missing"}],
    }
    summary = round_summary(figures, assignment, shard_sync, "manual__1", "pipeline", "pipeline/manual__1/t")
    assert summary.pop("finished_at") > 0
    assert summary == {
        "round": 7,
        "run_id": "manual__1",
        "dag_id": "pipeline",
        "leader": "pipeline/manual__1/t",
        "consumed": True,
        "records": 120,
        "bytes": 4096,
        "files": 2,
        "seconds": 3.25,
        "leases": 2,
        "leases_behind": 1,
        "outcomes": {"caught_up": 1, "failed": 1},
        "max_millis_behind_latest": 1200,
        "lost_leases": 0,
        "failed_leases": 1,
        "retention_losses": 2,
        "dead_lettered": 3,
        "possibly_unread": 1,
        "corrupt_leases": 1,
        "moves": 2,
        "busiest_over_bound": 1.0,
        # Compact: the slot's index for `orders-worker-<index>`, no attempt, no CPU sample as null.
        "slots": {
            "columns": ["slot", "leases", "records", "bytes", "seconds", "cpu_percent"],
            "rows": [[0, 1, 120, 4096, 3.0, 42.5], [1, 1, 0, 0, 1.5, None]],
        },
        "snapshot_id": None,
        "table_commits": None,
        "output": "/lake",
        "failures": ["shardId-000000000002: cannot promote its batch: 503 Slow Down"],
    }
    assert figures.lease_rows() == FIGURES["leases"]


def test_the_finalize_summary_of_a_round_whose_consume_step_was_skipped_has_zeros():
    summary = round_summary(None, {"round_number": 8}, {}, "scheduled__2")
    del summary["finished_at"]
    assert summary == {
        "round": 8,
        "run_id": "scheduled__2",
        "dag_id": None,
        "leader": None,
        "consumed": False,
        "records": 0,
        "bytes": 0,
        "files": 0,
        "seconds": 0.0,
        "leases": 0,
        "leases_behind": 0,
        "outcomes": {},
        "max_millis_behind_latest": None,
        "lost_leases": 0,
        "failed_leases": 0,
        "retention_losses": 0,
        "dead_lettered": 0,
        "possibly_unread": 0,
        "corrupt_leases": 0,
        "moves": 0,
        "busiest_over_bound": None,
        "slots": None,
        "snapshot_id": None,
        "table_commits": None,
        "output": None,
        "failures": [],
    }


def test_the_corrupt_lease_items_the_sync_skipped_are_named_with_their_attribute():
    shard_sync = {
        "corrupt_leases": [{"lease_key": "shardId-000000000009", "problem": "attribute 'leaseCounter' is missing"}]
    }
    assert corrupt_leases(shard_sync) == ("lease item 'shardId-000000000009': attribute 'leaseCounter' is missing",)
    assert corrupt_leases({}) == ()


def test_the_losses_of_the_figures_are_the_ones_the_round_alerts_on():
    figures = RoundFigures.from_dict(FIGURES, "xcom")
    assert records_lost(figures.totals.retention_losses, {}) == (
        "lease shardId-000000000001: records after 49600000000000000001 aged out of the stream before they were "
        "read (first still available: 49600000000000000090)",
        "lease shardId-000000000009: records after 49600000000000000005 aged out of the stream before they were "
        "read (first still available: none)",
    )


def _with(path: tuple[str | int, ...], value: object) -> dict:
    """The report's JSON with the value at `path` replaced (or removed, for `...`)."""
    document = json.loads(REPORT.to_json())
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if value is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return document


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        pytest.param([], "the document should be an object, not []", id="not-an-object"),
        pytest.param({"rounds": []}, "application_name is missing", id="foreign-json"),
        pytest.param(_with(("totals",), ...), "totals is missing", id="no-totals"),
        pytest.param(
            _with(("round_number",), "7"), "round_number should be a valid integer, not '7'", id="text-number"
        ),
        pytest.param(
            _with(("slots", 1, "leases", 0, "records"), True),
            "slots[1].leases[0].records should be a valid integer, not True",
            id="nested-boolean-for-integer",
        ),
        pytest.param(
            _with(("totals", "retention_losses", 1, "after"), None),
            "totals.retention_losses[1].after should be a valid string, not None",
            id="loss-without-position",
        ),
        pytest.param(
            _with(("totals", "outcomes", "failed"), 1.5),
            "totals.outcomes.failed should be a valid integer, not 1.5",
            id="fractional-count",
        ),
        pytest.param(
            _with(("streams",), "orders"), "streams should be a valid array, not 'orders'", id="text-for-list"
        ),
    ],
)
def test_a_document_of_another_shape_is_refused_naming_the_report_and_the_field(document, problem):
    with pytest.raises(MalformedReportError) as refused:
        RoundReport.from_dict(document, "/lake/_rounds/manual__1.json")
    assert str(refused.value) == f"round report '/lake/_rounds/manual__1.json' cannot be read: {problem}"
    assert isinstance(refused.value, LeaseCoreError) and not refused.value.retryable


def test_a_file_that_is_not_json_is_refused_naming_it(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("<html>not a report</html>")
    with pytest.raises(MalformedReportError, match=rf"round report '{path}' cannot be read: not JSON"):
        read_report(str(path), local_application())


RENAMED_COUNTERS = [
    ("read_calls", "get_records_calls", 4),
    ("refused_read_calls", "throttled_calls", 1),
    ("read_reopens", "expired_iterators", 1),
]


def test_a_report_names_the_reads_counters_whatever_the_retrieval():
    lease = json.loads(REPORT.to_json())["slots"][0]["leases"][0]
    assert [(name, lease.get(name), former in lease) for name, former, _ in RENAMED_COUNTERS] == [
        (name, value, False) for name, _, value in RENAMED_COUNTERS
    ]


def test_a_report_of_an_earlier_release_reads_back_its_counters_under_their_polling_names():
    document = json.loads(REPORT.to_json())
    lease = document["slots"][0]["leases"][0]
    for name, former, _ in RENAMED_COUNTERS:
        lease[former] = lease.pop(name)
    assert RoundReport.from_dict(document, "an earlier release's report") == REPORT


def test_fields_the_schema_does_not_have_are_ignored_and_missing_defaults_apply():
    document = _with(("slots", 0, "leases", 0, "detail"), ...)
    document["written_by"] = "a later version"
    assert RoundReport.from_dict(document, "report") == REPORT


PUBLISHED = dataclasses.replace(REPORT, publication=Publication(1, 12, 3, snapshot_id=4270864056888507805))


def test_a_rounds_publication_is_in_its_summary_its_figures_and_its_history_entry():
    assert "  published: 12 batch(es) in 1 table commit(s), snapshot 4270864056888507805" in PUBLISHED.summary()
    figures = RoundFigures.from_dict(json.loads(json.dumps(PUBLISHED.figures().to_dict())), "xcom")
    assert figures.publication == PUBLISHED.publication
    summary = round_summary(figures, {"round_number": 7}, {}, "manual__1")
    assert (summary["snapshot_id"], summary["table_commits"]) == ("4270864056888507805", 1)
    assert summary["output"] == PUBLISHED.output_uri


def test_a_round_whose_batches_could_not_be_published_did_not_succeed_and_says_why():
    failed = dataclasses.replace(
        REPORT, slots=(), totals=RoundTotals.of(()), publication=Publication.failed("the catalog is down")
    )
    assert not failed.succeeded
    assert (
        "  NOT VISIBLE YET: the round's committed batches were not published: the catalog is down" in failed.summary()
    )


def test_batches_the_publication_found_gone_are_losses_of_the_round():
    report = RoundReport.build(
        "orders", 7, ["orders"], "iceberg://lake/k.orders", "now", 1.0, (), unpublishable_batches=["shardId-1: up to 9"]
    )
    assert report.totals.missing_batches == ("shardId-1: up to 9",)
    assert records_lost((), {}, report.totals.missing_batches)


def test_a_failed_leases_error_is_kept_in_its_row_cut_short_and_a_healthy_leases_detail_is_not():
    long = dataclasses.replace(FAILED, detail="TransformError: " + "x" * 1000)
    healthy = dataclasses.replace(FAILED, outcome=Outcome.CAUGHT_UP, detail="read to the tip")
    error = LeaseFigures.of(long).error
    assert error is not None and len(error) == ERROR_CHARACTERS and error.startswith("TransformError: xxx")
    assert LeaseFigures.of(healthy).error is None


def test_a_round_failed_for_good_only_when_each_failed_lease_says_a_retry_cannot_help():
    refused = dataclasses.replace(FAILED, detail="transform 'm:f': raised ValueError: bad record", retryable=False)
    slots = (SlotReport("orders-worker-1", 1, 1.0, -1, (refused,)),)
    figures = dataclasses.replace(REPORT, slots=slots, slot_failures=()).figures()
    assert figures.failed_for_good() == ("shardId-000000000002: transform 'm:f': raised ValueError: bad record",)
    assert REPORT.figures().failed_for_good() == (), "a 503 may pass: the step is retried"
    unpublished = dataclasses.replace(figures, publication=Publication.failed("the catalog is down"))
    assert unpublished.failed_for_good() == ()
