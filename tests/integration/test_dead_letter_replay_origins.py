"""The dead-letter replay over a destination that holds more than one application's (or one
stream's) dead letters. An Iceberg table may be written by several applications (each has its own
position map, staging and upkeep: `sinks.table.iceberg`), so the dead-letter table beside it is
shared too; each row says which application set it aside, and from which incarnation of its stream."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lease_core.config.settings import ConsumerConfig
from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks import open_round_sink
from sinks.batch_sink import BatchRange, RoundIdentity
from sinks.table.iceberg import IcebergSink
from spark_jobs.dead_letter_replay import DeadLetterReplay, Processing
from spark_jobs.dead_letters import dead_letter_table
from spark_jobs.decode import load_decoder
from tests.support.iceberg_tables import URI, catalog_environment, catalog_properties, faulty_catalog

DECODERS = "tests.support.decoders"
SHARD = "shardId-000000000001"  # single-stream lease keys are bare shard ids: the same in every stream
ARRIVAL = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)


@pytest.fixture
def iceberg_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in catalog_environment("lake", {"type": "sql", **catalog_properties(tmp_path)}).items():
        monkeypatch.setenv(name, value)
    faulty_catalog(tmp_path)  # its namespace
    return URI


def record(number: int, bad: set[int]) -> KinesisRecord:
    payload = f"amount={number}" if number in bad else json.dumps({"amount": number})
    return KinesisRecord(str(number), 0, f"key-{number}", ARRIVAL + timedelta(seconds=number), payload.encode())


def land_batch(
    output_uri: str,
    application: str,
    stream: str,
    start: ExtendedSequenceNumber,
    numbers: range,
    bad: set[int],
    round_number: int,
    previous: str | None = None,
    created: int = 1_764_000_000,
) -> str:
    """One batch of `application`'s single-stream lease SHARD of `stream`, landed as a round lands it:
    staged with its dead letters, committed, made visible, published; `created`: the stream's creation
    time (its incarnation), as the round's driver describes it."""
    streams = {stream: (f"arn:aws:kinesis:us-east-1:000000000000:stream/{stream}", created)}
    decoder = load_decoder(f"{DECODERS}:json_amounts")
    assert decoder is not None
    sink = open_round_sink(
        output_uri, config=ConsumerConfig(application_name=application), dead_letters=True, streams=streams
    )
    records = [record(number, bad) for number in numbers]
    batch = BatchRange(SHARD, stream, SHARD, start, records[0].position, records[-1].position)
    decoded = decoder.decode_batch(records, stream, SHARD)
    staged = sink.stage_with_dead_letters(
        batch,
        decoded.table,
        dead_letter_table(decoded.rejected, batch, decoder.spec, application, streams[stream]),
        "claim",
    )
    committed = sink.commit_record(previous, staged)
    assert committed is not None
    sink.make_visible(committed)
    sink.publish_round({SHARD: committed}, RoundIdentity(application, round_number, streams))
    return committed


def replay(output_uri: str, application: str, stream: str | None = None) -> None:
    processing = Processing.load(f"{DECODERS}:amounts")
    report = DeadLetterReplay.open(output_uri, ConsumerConfig(application_name=application), processing).run(
        stream=stream
    )
    assert report.complete, report.render()


def output_rows(output_uri: str) -> list[tuple[str, int]]:
    table = IcebergSink(output_uri, "anyone").table(refresh=True)
    assert table is not None
    rows = table.scan().to_arrow().select(["stream_name", "sequence_number"]).to_pylist()
    return sorted((row["stream_name"], int(row["sequence_number"])) for row in rows)


def test_two_applications_sharing_a_table_each_replaying_their_dead_letters_land_every_one_once(iceberg_output):
    """orders-app consumes `orders`, payments-app `payments`, both into the same table (each with its
    own position map). Each replays its dead letters with its fixed decoder: every dead letter is in
    the output once (each application replays only its own)."""
    land_batch(iceberg_output, "orders-app", "orders", TRIM_HORIZON, range(101, 106), {102}, 1)
    land_batch(iceberg_output, "payments-app", "payments", TRIM_HORIZON, range(501, 506), {503}, 1)

    replay(iceberg_output, "orders-app")
    replay(iceberg_output, "payments-app")

    rows = output_rows(iceberg_output)
    assert rows.count(("orders", 102)) == 1 and rows.count(("payments", 503)) == 1, rows


def test_a_replay_never_takes_a_former_stream_incarnations_dead_letters_for_this_ones(iceberg_output):
    """`orders` was deleted and created again under its name, and the application set up again over it
    (`leasectl teardown`, `init`): its single-stream lease keys are the same bare shard ids, and the new
    stream's sequence numbers start over (docs/architecture.md, "Reshards"). The former
    stream's dead letter at 503 was replayed; the new stream's at 102 (< 503) is replayed too: each
    incarnation has a pseudo lease of its own."""
    land_batch(iceberg_output, "orders-app", "orders", TRIM_HORIZON, range(501, 506), {503}, 1)
    replay(iceberg_output, "orders-app")

    # The stream again, from its start: the same lease key, smaller sequence numbers.
    land_batch(iceberg_output, "orders-app", "orders", TRIM_HORIZON, range(101, 106), {102}, 2, created=1_765_000_000)
    assert ("orders", 101) in output_rows(iceberg_output), "the output tells the incarnations apart"
    replay(iceberg_output, "orders-app")

    assert ("orders", 102) in output_rows(iceberg_output), "the new stream's dead letter 102 was never replayed"
