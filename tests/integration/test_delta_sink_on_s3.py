"""The Delta sink on S3 (moto, behind the recording fault proxy): delta-rs commits each log entry with a
conditional put, so of concurrent committers of one table version exactly one wins, and of concurrent
publishers of the same batches exactly one adds them; a bucket that is not there or a prefix that
holds something else is refused before any lease moves. The faults every sink meets run over a
Delta table on moto in tests/contract (`sinks_under_test`, its `delta-s3` cases)."""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pytest
from deltalake import CommitProperties, Transaction
from deltalake.exceptions import CommitFailedError

from devtools.fault_proxy import FaultProxy, HttpRequest, HttpResponse
from lease_core.config.settings import ConsumerConfig
from lease_core.model.sequence import TRIM_HORIZON
from sinks import open_sink
from sinks.batch_sink import RoundIdentity
from sinks.errors import SinkError
from sinks.table.delta import DeltaSink
from tests.support.iceberg_tables import batch_of, position, rows

APPLICATION = "orders-app"
IDENTITY = RoundIdentity(APPLICATION, 3, {"orders": ("arn:aws:kinesis:us-east-1:000000000000:stream/orders", 1)})
LEASE = "shardId-000000000001"
RACERS = 4


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def uri(moto_endpoint: str) -> str:
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    return f"delta:s3://{bucket}/tables/orders"


def opened(uri: str, endpoint: str) -> DeltaSink:
    sink = open_sink(uri, config=ConsumerConfig(application_name=APPLICATION, aws_endpoint_url_s3=endpoint))
    assert isinstance(sink, DeltaSink)
    return sink


def land(sink: DeltaSink, record: str | None, first: int, count: int, start: Any = TRIM_HORIZON) -> str:
    committed = sink.commit_record(record, sink.stage(batch_of(start, first, count), rows(first, count), "a"))
    assert committed is not None
    return committed


def sequence_numbers(sink: DeltaSink) -> list[int]:
    landed = sink.visible_rows(["sequence_number"])
    return [] if landed is None else sorted(int(n) for n in landed.column("sequence_number").to_pylist())


def all_at_once(racers: list[Callable[[], Any]]) -> list[Any]:
    """Each racer's answer (or what it raised), all started together."""
    start = threading.Barrier(len(racers))
    answers: list[Any] = [None] * len(racers)

    def run(index: int) -> None:
        start.wait()
        try:
            answers[index] = racers[index]()
        except Exception as error:  # the answer under test
            answers[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(racers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_of_concurrent_committers_of_one_table_version_exactly_one_wins_by_a_conditional_put(uri, proxy):
    sink = opened(uri, proxy.endpoint)
    land(sink, None, 1, 3)  # creates the table (version 0)
    tables = [sink.table() for _ in range(RACERS)]  # each committer read version 0

    def committer(number: int) -> Callable[[], Any]:
        table = tables[number]
        assert table is not None
        properties = CommitProperties(app_transactions=[Transaction(f"writer-{number}", 1)], max_commit_retries=0)
        return lambda: table.create_write_transaction(
            [], mode="append", schema=table.schema(), commit_properties=properties
        )

    answers = all_at_once([committer(number) for number in range(RACERS)])

    assert sum(answer is None for answer in answers) == 1
    assert all(isinstance(answer, CommitFailedError) for answer in answers if answer is not None)
    table = sink.table()
    assert table is not None and table.version() == 1
    log_puts = [call for call in proxy.calls() if call.operation == "PutObject" and call.key.endswith("01.json")]
    # A committer that finds the winner's entry listed already gives up before it puts its own.
    assert 1 <= len(log_puts) <= RACERS
    assert all(call.conditions == (("if-none-match", "*"),) for call in log_puts)
    assert sorted(call.status for call in log_puts) == [200] + [412] * (len(log_puts) - 1)


def test_of_concurrent_publishers_of_the_same_batches_one_adds_them_and_the_others_find_them_held(uri, moto_endpoint):
    sink = opened(uri, moto_endpoint)
    record = land(sink, land(sink, None, 1, 3), 4, 2, start=position(3))
    publishers = [opened(uri, moto_endpoint) for _ in range(RACERS)]

    answers = all_at_once(
        [lambda publisher=publisher: publisher.publish_round({LEASE: record}, IDENTITY) for publisher in publishers]
    )

    assert [answer.batches_published for answer in answers].count(2) == 1, answers
    assert all(answer.batches_published in (0, 2) for answer in answers), answers
    assert sequence_numbers(sink) == [1, 2, 3, 4, 5]
    table = sink.table()
    assert table is not None
    version, positions = sink.transaction_version(table), sink.positions_in(table)
    assert version == table.transaction_version(sink.app_id) >= 1 and positions[LEASE].end == position(5)


def test_a_round_on_s3_records_what_it_added_where_verify_finds_it(uri, moto_endpoint):
    sink = opened(uri, moto_endpoint)
    sink.publish_round({LEASE: land(sink, None, 1, 3)}, IDENTITY)

    (batch,) = opened(uri, moto_endpoint).landed_batches()
    assert (batch.lease_key, batch.end, batch.round_number) == (LEASE, position(3), 3)
    assert sink.reports_root() == f"{uri.removeprefix('delta:')}/_kinesis/rounds"


def test_a_missing_bucket_is_refused_before_any_lease_moves(moto_endpoint):
    with pytest.raises(SinkError, match="bucket 'no-such-lake' does not exist"):
        opened("delta:s3://no-such-lake/orders", moto_endpoint).check_writable(None)


def test_a_prefix_holding_files_but_no_delta_table_is_refused_before_any_lease_moves(uri, moto_endpoint):
    bucket, _, prefix = uri.removeprefix("delta:s3://").partition("/")
    boto3.client("s3", endpoint_url=moto_endpoint).put_object(Bucket=bucket, Key=f"{prefix}/notes.csv", Body=b"a,b")

    with pytest.raises(SinkError, match="not a Delta table"):
        opened(uri, moto_endpoint).check_writable(None)


def test_storage_that_cannot_be_reached_is_a_retryable_error_naming_the_table(uri):
    sink = opened(uri, "http://127.0.0.1:9")  # the discard port: nothing listens on loopback

    with pytest.raises(SinkError) as refused:
        sink.check_writable(None)
    assert refused.value.retryable and uri in str(refused.value)


class AnswerLosingProxy(FaultProxy):
    """The recording proxy, which also applies the first PUT of the key ending in `lose_answer_to` and
    then closes the connection unanswered: the client cannot tell whether its write happened."""

    lose_answer_to: str | None = None

    def respond(self, request: HttpRequest) -> HttpResponse | None:
        key = unquote(urlsplit(request.path).path)
        if self.lose_answer_to is not None and request.method == "PUT" and key.endswith(self.lose_answer_to):
            self.lose_answer_to = None
            self._forward(request)
            return None
        return super().respond(request)


def _serve_answer_losing_proxy(upstream: str, key: str, control: Connection) -> None:
    with AnswerLosingProxy(upstream) as proxy:
        proxy.lose_answer_to = key
        control.send(proxy.endpoint)
        control.recv()  # the test is done
        control.send(
            [call.status for call in proxy.calls() if call.operation == "PutObject" and call.key.endswith(key)]
        )


@contextmanager
def answer_losing_proxy(upstream: str, key: str) -> Iterator[tuple[str, Callable[[], list[int]]]]:
    """An `AnswerLosingProxy` in a process of its own (delta-rs holds the GIL while it reads a table's
    history, so a proxy thread of this process could not answer meanwhile): its endpoint, and the
    statuses it answered the PUTs of `key` it recorded (the lost one is not)."""
    ours, theirs = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(
        target=_serve_answer_losing_proxy, args=(upstream, key, theirs), daemon=True
    )
    process.start()
    statuses: list[int] = []

    def answered() -> list[int]:
        if not statuses:
            ours.send("done")
            statuses.extend(ours.recv())
        return statuses

    try:
        yield ours.recv(), answered
    finally:
        answered()
        process.join(timeout=30)


def test_a_round_whose_commit_landed_but_whose_answer_was_lost_reports_its_commit(uri, moto_endpoint):
    """delta-rs puts the log entry again and S3 answers that it exists: the commit is the round's own.
    Nothing is added twice; the round's report must still say it published its batch, in which table
    version, not that it found it held already and published nothing."""
    entry = "_delta_log/" + "0" * 19 + "1.json"
    with answer_losing_proxy(moto_endpoint, entry) as (endpoint, answered):
        sink = opened(uri, endpoint)
        record = land(sink, None, 1, 3)  # creates the table (version 0)

        published = sink.publish_round({LEASE: record}, IDENTITY)

        assert answered() == [412], "the put again of the entry whose first put's answer was lost"
    assert (published.commits, published.batches_published, published.snapshot_id) == (1, 1, 1)
    assert sequence_numbers(opened(uri, moto_endpoint)) == [1, 2, 3]


def test_an_empty_folder_made_in_the_s3_console_is_a_place_for_a_new_table(uri, moto_endpoint):
    """The console's "Create folder" (and Hadoop's s3a) leave a zero-byte object named after the prefix
    with a slash: an empty folder, not "files that are not a Delta table"."""
    bucket, _, prefix = uri.removeprefix("delta:s3://").partition("/")
    boto3.client("s3", endpoint_url=moto_endpoint).put_object(Bucket=bucket, Key=f"{prefix}/", Body=b"")
    sink = opened(uri, moto_endpoint)

    sink.check_writable(rows(1, 3).schema)
    sink.publish_round({LEASE: land(sink, None, 1, 3)}, IDENTITY)
    assert sequence_numbers(opened(uri, moto_endpoint)) == [1, 2, 3]
