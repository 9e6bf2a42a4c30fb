"""Dead letters replayed into the output after the decoder is fixed (`spark_jobs.dead_letter_replay`),
against a Parquet dataset and an Iceberg table (a local SQL catalog), into which a round set the
records its decoder rejected aside as a round does: staged with their batches, committed, made
visible. Then `leasectl replay-dead-letters` itself, under the leader lock (DynamoDB on moto)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from lease_core.config.settings import ConsumerConfig
from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock
from lease_core.model.lease import Lease
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks import open_round_sink, open_sink
from sinks.batch_sink import BatchRange, RoundIdentity
from sinks.dead_lettering import dead_letter_uri
from sinks.table.iceberg import IcebergSink
from spark_jobs import leasectl
from spark_jobs.dead_letter_replay import (
    DeadLetterReplay,
    Processing,
    ReplayReport,
    read_dead_letters,
    replay_lease_key,
)
from spark_jobs.dead_letters import dead_letter_table
from spark_jobs.decode import load_decoder
from spark_jobs.round_publication import publish_committed_batches
from tests.integration.test_leasectl_leadership import state_store
from tests.support.iceberg_tables import URI, catalog_environment, catalog_properties, faulty_catalog
from tests.support.stores import dynamodb_store

APPLICATION = "orders-app"
STREAM = "orders"
STREAM_ARN = f"arn:aws:kinesis:us-east-1:000000000000:stream/{STREAM}"
SHARD_1 = "shardId-000000000001"
SHARD_2 = "shardId-000000000002"
ARRIVAL = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
DECODERS = "tests.support.decoders"
# The records a producer sent by mistake, by sequence number (every other payload is JSON), and the
# round's batches (lease, checkpoint, records): shard 1's three each with dead letters, shard 2's one.
MISTAKES = {102: "amount=102", 108: "amount:108", 113: "amount=113", 114: "amount=114", 203: "amount=203"}
BATCHES = (
    (SHARD_1, TRIM_HORIZON, range(101, 106)),
    (SHARD_1, ExtendedSequenceNumber("105"), range(106, 111)),
    (SHARD_1, ExtendedSequenceNumber("110"), range(111, 116)),
    (SHARD_2, TRIM_HORIZON, range(201, 206)),
)
EVERY_RECORD = [*range(101, 116), *range(201, 206)]
ACCEPTED = [number for number in EVERY_RECORD if number not in MISTAKES]


def record(number: int) -> KinesisRecord:
    payload = MISTAKES.get(number, json.dumps({"amount": number}))
    return KinesisRecord(str(number), 0, f"key-{number}", ARRIVAL + timedelta(seconds=number), payload.encode())


def batches() -> list[tuple[BatchRange, list[KinesisRecord]]]:
    found = []
    for shard, start, numbers in BATCHES:
        records = [record(number) for number in numbers]
        found.append((BatchRange(shard, STREAM, shard, start, records[0].position, records[-1].position), records))
    return found


def land_round(output_uri: str, application: str = APPLICATION) -> None:
    """Shard 1's three batches and shard 2's one, landed as a round of a pipeline that decodes with
    `json_amounts` and dead-letters what it rejects: each batch staged with its dead letters,
    committed and made visible by its slot, then the round's publication."""
    decoder = load_decoder(f"{DECODERS}:json_amounts")
    assert decoder is not None
    sink = open_round_sink(output_uri, config=ConsumerConfig(application_name=application), dead_letters=True)
    records: dict[str, str] = {}
    for batch, batch_records in batches():
        decoded = decoder.decode_batch(batch_records, batch.stream_name, batch.shard_id)
        dead_letters = dead_letter_table(decoded.rejected, batch, decoder.spec, application)
        staged = sink.stage_with_dead_letters(batch, decoded.table, dead_letters, "a-claim-token")
        record = sink.commit_record(records.get(batch.lease_key), staged)
        assert record is not None
        sink.make_visible(record)
        records[batch.lease_key] = record
    sink.publish_round(records, RoundIdentity(application, 1, {STREAM: (STREAM_ARN, 1_764_000_000)}))


@pytest.fixture(params=["parquet", "iceberg", "delta"])
def output_uri(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The pipeline's output, configured as a user configures it (pyiceberg's environment variables)."""
    if request.param == "parquet":
        return str(tmp_path / "lake")
    if request.param == "delta":
        return f"delta:{tmp_path / 'lake'}"
    for name, value in catalog_environment("lake", {"type": "sql", **catalog_properties(tmp_path)}).items():
        monkeypatch.setenv(name, value)
    faulty_catalog(tmp_path)  # its namespace
    return URI


def read(uri: str) -> pa.Table:
    """What readers see at `uri`: a Parquet dataset as pyarrow reads it, a table's rows."""
    if uri.startswith(("iceberg://", "delta:")):
        rows = read_dead_letters(open_sink(uri, config=ConsumerConfig(application_name=APPLICATION)))
        return pa.table({}) if rows is None else rows
    return ds.dataset(uri, format="parquet", partitioning="hive").to_table()


def landed_amounts(output_uri: str) -> list[tuple[int, int]]:
    """(sequence number, amount) of every row of the output, in order: a record landed twice shows twice."""
    rows = read(output_uri).select(["sequence_number", "amount"]).to_pylist()
    return sorted((int(row["sequence_number"]), row["amount"]) for row in rows)


def dead_letter_numbers(output_uri: str) -> list[int]:
    return sorted(int(number) for number in read(dead_letter_uri(output_uri)).column("sequence_number").to_pylist())


def replay(output_uri: str, decoder: str, *, dry_run: bool = False, batches_per_commit: int = 500) -> ReplayReport:
    config = ConsumerConfig(application_name=APPLICATION)
    processing = Processing.load(f"{DECODERS}:{decoder}")
    return DeadLetterReplay.open(output_uri, config, processing, batches_per_commit).run(dry_run=dry_run)


def summary(report: ReplayReport) -> dict[str, tuple[int, int, str | None, int]]:
    """Per lease: batches replayed, batches landed before, the batch still failing (its end) and the
    batches waiting behind it."""
    return {
        lease.lease_key: (
            len(lease.replayed),
            len(lease.already_landed),
            None if lease.failing is None else lease.failing.group.batch_end,
            len(lease.waiting),
        )
        for lease in report.leases
    }


def amounts(numbers: Sequence[int]) -> list[tuple[int, int]]:
    return [(number, number) for number in sorted(numbers)]


def test_a_fixed_decoder_lands_every_dead_letter_once_with_its_columns_and_the_dead_letters_stay(output_uri):
    land_round(output_uri)
    assert landed_amounts(output_uri) == amounts(ACCEPTED)

    report = replay(output_uri, "amounts")

    assert report.complete
    assert summary(report) == {SHARD_1: (3, 0, None, 0), SHARD_2: (1, 0, None, 0)}
    assert landed_amounts(output_uri) == amounts(EVERY_RECORD)
    assert dead_letter_numbers(output_uri) == sorted(MISTAKES), "the dead letters are a log: they stay"


def test_a_second_replay_finds_every_batch_landed_and_lands_nothing_more(output_uri):
    land_round(output_uri)
    replay(output_uri, "amounts")

    again = replay(output_uri, "amounts")

    assert again.complete
    assert summary(again) == {SHARD_1: (0, 3, None, 0), SHARD_2: (0, 1, None, 0)}
    assert landed_amounts(output_uri) == amounts(EVERY_RECORD)


def test_a_batch_the_decoder_still_rejects_stops_its_lease_there_and_a_later_fix_lands_the_rest_once(output_uri):
    land_round(output_uri)

    partly = replay(output_uri, "amounts_with_equals")

    assert not partly.complete
    # Shard 1's second batch still fails (108 is `amount:108`); its third, which would decode, waits.
    assert summary(partly) == {SHARD_1: (1, 0, "110", 1), SHARD_2: (1, 0, None, 0)}
    failing = partly.leases[0].failing
    assert (
        failing is not None
        and failing.rejected == 1
        and "record 108/0 of orders/shardId-000000000001" in (failing.error)
    )
    assert "STILL FAILING" in partly.render()
    assert landed_amounts(output_uri) == amounts([*ACCEPTED, 102, 203])

    fixed = replay(output_uri, "amounts")

    assert fixed.complete
    assert summary(fixed) == {SHARD_1: (2, 1, None, 0), SHARD_2: (0, 1, None, 0)}
    assert landed_amounts(output_uri) == amounts(EVERY_RECORD)


def test_dead_letters_a_replays_decoder_leaves_out_on_purpose_are_counted_and_named_not_called_landed(output_uri):
    land_round(output_uri)

    report = replay(output_uri, "amounts_or_give_up")

    assert report.complete, "what the decoder gives up on does not stop the replay"
    assert (report.left_out, [lease.left_out for lease in report.leases]) == (1, [1, 0])
    assert landed_amounts(output_uri) == amounts([number for number in EVERY_RECORD if number != 108])
    assert "1 dead letter(s) left out by the decoder (it returned None)" in report.render()
    assert "every dead letter is in the output except the 1 the decoder left out on purpose" in report.render()
    assert replay(output_uri, "amounts").leases[0].already_landed, "its batch landed: a later replay skips it"


def test_a_dry_run_decodes_and_lands_nothing(output_uri):
    land_round(output_uri)

    report = replay(output_uri, "amounts", dry_run=True)

    assert report.complete
    assert summary(report) == {SHARD_1: (3, 0, None, 0), SHARD_2: (1, 0, None, 0)}
    assert "would replay" in report.render()
    assert landed_amounts(output_uri) == amounts(ACCEPTED)
    assert summary(replay(output_uri, "amounts")) == summary(report)


@pytest.mark.parametrize("output_uri", ["iceberg"], indirect=True)
def test_a_replay_of_many_batches_commits_them_a_few_at_a_time_and_each_once(output_uri):
    land_round(output_uri)

    report = replay(output_uri, "amounts", batches_per_commit=3)

    assert report.complete
    assert landed_amounts(output_uri) == amounts(EVERY_RECORD)
    table = IcebergSink(output_uri, APPLICATION).table(refresh=True)
    assert table is not None
    replays = [s for s in table.snapshots() if s.summary is not None and s.summary.get("kinesis.round") == "0"]
    assert [s.summary.get("kinesis.ranges") for s in replays] == [
        "shardId-000000000001 102-0..102-0; shardId-000000000001 108-0..108-0; shardId-000000000001 113-0..114-0",
        "shardId-000000000002 203-0..203-0",
    ]


def test_an_output_without_dead_letters_has_nothing_to_replay(output_uri):
    report = replay(output_uri, "amounts")

    assert report.complete and report.leases == ()
    assert report.render() == f"no dead letters at {dead_letter_uri(output_uri)}: nothing to replay"


# --- leasectl replay-dead-letters ---------------------------------------------------------------


def run_leasectl(app: str, moto_endpoint: str, *arguments: str) -> int:
    """The installed `leasectl`'s main, in this process (the decoders are this checkout's modules), with
    DynamoDB and Kinesis on moto (where the test's stream does not exist: `verify` takes its positions
    as they are)."""
    settings = (
        *("--set", "aws_region=us-east-1"),
        *("--set", f"aws_endpoint_url_dynamodb={moto_endpoint}"),
        *("--set", f"aws_endpoint_url_kinesis={moto_endpoint}"),
    )
    return leasectl.main(["--app", app, *settings, *arguments])


def replay_command(output_uri: str, decoder: str, *options: str) -> tuple[str, ...]:
    return ("replay-dead-letters", "--output-uri", output_uri, "--decode", f"{DECODERS}:{decoder}", *options)


def test_leasectl_replays_under_the_leader_lock_and_exits_1_while_a_lease_still_fails(
    moto_endpoint, unique_name, tmp_path, capsys
):
    dynamodb_store(moto_endpoint, unique_name)  # the application's tables
    output_uri = str(tmp_path / "lake")
    land_round(output_uri, unique_name)

    assert run_leasectl(unique_name, moto_endpoint, *replay_command(output_uri, "amounts_with_equals")) == 1
    assert "STILL FAILING" in capsys.readouterr().out
    assert run_leasectl(unique_name, moto_endpoint, *replay_command(output_uri, "amounts")) == 0
    out = capsys.readouterr().out
    replayed = "replayed 2 batch(es) of 3 dead letter(s) as 3 row(s); 1 batch(es) of 1 dead letter(s) landed before"
    assert f"{SHARD_1}: {replayed}" in out
    assert landed_amounts(output_uri) == amounts(EVERY_RECORD)
    assert state_store(moto_endpoint, unique_name).get(LEADER_KEY) is None, "the command releases the lock"


def test_leasectl_never_replays_while_a_round_holds_the_lock(moto_endpoint, unique_name, tmp_path, capsys):
    dynamodb_store(moto_endpoint, unique_name)
    output_uri = str(tmp_path / "lake")
    land_round(output_uri, unique_name)
    round_lock = LeaderLock(state_store(moto_endpoint, unique_name), "kinesis_lease_pipeline/scheduled__live")
    assert round_lock.try_acquire()

    assert run_leasectl(unique_name, moto_endpoint, *replay_command(output_uri, "amounts")) == 1

    assert "'kinesis_lease_pipeline/scheduled__live'" in capsys.readouterr().err
    assert landed_amounts(output_uri) == amounts(ACCEPTED)
    assert run_leasectl(unique_name, moto_endpoint, *replay_command(output_uri, "amounts", "--dry-run")) == 0, (
        "a dry run writes nothing, and needs no lock"
    )
    assert round_lock.heartbeat(), "the round's lock is untouched"


def test_leasectl_refuses_a_decoder_it_cannot_load_as_a_usage_error(tmp_path, capsys):
    status = leasectl.main(["--app", "orders-app", *replay_command(str(tmp_path / "lake"), "no_such_decoder")])

    assert status == 2
    assert (
        f"decoder '{DECODERS}:no_such_decoder' cannot be loaded: module 'tests.support.decoders' has no attribute "
        "'no_such_decoder'"
    ) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("decode", "options", "complaint"),
    [
        pytest.param(
            "json",
            '{"schema": 5}',
            "decoder 'json' cannot be loaded: schema must be a JSON Schema document or a pyarrow.Schema, got 5",
            id="a-built-in-decoder-gets-them-and-names-what-is-wrong",
        ),
        pytest.param(
            f"{DECODERS}:amounts",
            '{"schema": {}}',
            f"decoder '{DECODERS}:amounts' cannot be loaded: takes no decode_options",
            id="a-decoder-of-yours-takes-none",
        ),
        pytest.param("json", "[1]", "--decode-options: must be a JSON object, got list", id="not-an-object"),
        pytest.param("json", "{", "--decode-options: not JSON", id="not-json"),
    ],
)
def test_leasectl_hands_decode_options_to_a_built_in_decoder_and_refuses_wrong_ones_as_a_usage_error(
    decode, options, complaint, tmp_path, capsys
):
    command = ("replay-dead-letters", "--output-uri", str(tmp_path / "lake"), "--decode", decode)
    try:
        status = leasectl.main(["--app", "orders-app", *command, "--decode-options", options])
    except SystemExit as exit:  # argparse refuses the value itself
        status = exit.code

    assert status == 2
    assert complaint in capsys.readouterr().err


def test_verify_takes_a_replays_batches_for_no_leases_and_finds_the_table_and_the_checkpoints_in_agreement(
    moto_endpoint, unique_name, tmp_path, monkeypatch, capsys
):
    for name, value in catalog_environment("lake", {"type": "sql", **catalog_properties(tmp_path)}).items():
        monkeypatch.setenv(name, value)
    faulty_catalog(tmp_path)
    store = dynamodb_store(moto_endpoint, unique_name)
    for shard, end in ((SHARD_1, "115"), (SHARD_2, "205")):
        store.create_lease_if_not_exists(Lease(shard, checkpoint=ExtendedSequenceNumber(end)))
    land_round(URI, unique_name)
    assert run_leasectl(unique_name, moto_endpoint, *replay_command(URI, "amounts")) == 0
    landed = IcebergSink(URI, unique_name).landed_batches()
    assert {batch.lease_key for batch in landed} >= {replay_lease_key(SHARD_1), replay_lease_key(SHARD_2)}
    capsys.readouterr()

    status = run_leasectl(unique_name, moto_endpoint, "verify", "--output-uri", URI, "--json")

    document = json.loads(capsys.readouterr().out)
    assert status == 0, document
    assert document["findings"] == [] and document["batches"] == 4


def test_a_leases_dead_letters_after_batches_without_any_are_no_gap_and_no_loss(output_uri):
    """The dead letters hold only the batches that had some: after round 1, shard 2's next batch has
    none and the one after it has one. Its publication into the dead letters is no gap of the lease's
    records there, and names no loss (the output holds every batch)."""
    land_round(output_uri)
    decoder = load_decoder(f"{DECODERS}:json_amounts")
    assert decoder is not None
    sink = open_round_sink(output_uri, config=ConsumerConfig(application_name=APPLICATION), dead_letters=True)
    record_of_shard_2, start = None, ExtendedSequenceNumber("205")
    for numbers, mistake in ((range(206, 211), None), (range(211, 216), 213)):
        records = [
            KinesisRecord(str(n), 0, f"key-{n}", ARRIVAL, (b"amount=" if n == mistake else b'{"amount": 1}'))
            for n in numbers
        ]
        batch = BatchRange(SHARD_2, STREAM, SHARD_2, start, records[0].position, records[-1].position)
        decoded = decoder.decode_batch(records, STREAM, SHARD_2)
        dead = dead_letter_table(decoded.rejected, batch, decoder.spec, APPLICATION)
        staged = sink.stage_with_dead_letters(batch, decoded.table, dead, "a-claim-token")
        record_of_shard_2 = sink.commit_record(record_of_shard_2, staged)
        start = batch.end
    assert record_of_shard_2 is not None
    identity = RoundIdentity(APPLICATION, 2, {STREAM: (STREAM_ARN, 1_764_000_000)})

    publication, losses = publish_committed_batches(sink, identity, [lease_at(SHARD_2, start, record_of_shard_2)])

    assert publication.error is None and losses == (), (publication, losses)
    assert 213 in dead_letter_numbers(output_uri)


def lease_at(key: str, checkpoint: ExtendedSequenceNumber, record: str) -> Lease:
    return Lease(key, checkpoint=checkpoint, committed_batch=record)
