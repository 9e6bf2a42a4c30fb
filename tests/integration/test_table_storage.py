"""The files a table sink keeps beside its table (`sinks.table.storage`), in a local folder
and under an S3 prefix on moto: whole-file writes, listings, deletes, and the exclusive create the
position maps rely on, of which concurrent writers win exactly one."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from sinks.table.storage import LocalStorage, S3Access, S3Storage, TableStorage

WRITERS = 8


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> TableStorage:
    if request.param == "local":
        return LocalStorage(str(tmp_path / "table"))
    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    access = S3Access.resolve(f"s3://{bucket}/table", endpoint, "us-east-1", None)
    return S3Storage(bucket, "table", access.client())


def test_a_file_is_written_whole_read_back_listed_under_its_folder_and_deleted(storage):
    storage.put("_kinesis/staged/app/a.json", b"first")
    storage.put("_kinesis/staged/app/a.json", b"second")
    storage.put("arrival_day=2026-11-27/part-1.parquet", b"rows")

    assert storage.read("_kinesis/staged/app/a.json") == b"second"
    assert storage.exists("_kinesis/staged/app/a.json") and not storage.exists("_kinesis/staged/app/b.json")
    assert [(file.path, file.size) for file in storage.listing("_kinesis")] == [("_kinesis/staged/app/a.json", 6)]
    assert sorted(file.path for file in storage.listing()) == [
        "_kinesis/staged/app/a.json",
        "arrival_day=2026-11-27/part-1.parquet",
    ]
    storage.delete(["_kinesis/staged/app/a.json", "_kinesis/staged/app/gone-already.json"])
    assert not storage.exists("_kinesis/staged/app/a.json")
    with pytest.raises(FileNotFoundError):
        storage.read("_kinesis/staged/app/a.json")


def test_an_exclusive_create_refuses_a_path_that_holds_a_file_and_leaves_it_as_it_was(storage):
    assert storage.create("_kinesis/positions/app/1.json", b"mine") is True
    assert storage.create("_kinesis/positions/app/1.json", b"theirs") is False
    assert storage.read("_kinesis/positions/app/1.json") == b"mine"


def test_of_concurrent_exclusive_creates_of_one_path_exactly_one_wins(storage):
    start = threading.Barrier(WRITERS)
    won: list[bytes] = []

    def writer(payload: bytes) -> Callable[[], None]:
        def write() -> None:
            start.wait()
            if storage.create("_kinesis/positions/app/2.json", payload):
                won.append(payload)

        return write

    threads = [threading.Thread(target=writer(f"writer {n}".encode())) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(won) == 1
    assert storage.read("_kinesis/positions/app/2.json") == won[0]


def test_a_missing_bucket_or_parent_folder_is_named_by_the_root_check(tmp_path, moto_endpoint):
    access = S3Access.resolve("s3://no-such-lake/table", moto_endpoint, "us-east-1", None)
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-lake' does not exist"):
        S3Storage("no-such-lake", "table", access.client()).check_root()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LocalStorage(str(tmp_path / "missing" / "table")).check_root()
