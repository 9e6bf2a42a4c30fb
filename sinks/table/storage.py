"""Where a table sink keeps files of its own beside a table (staged data files, receipts, position
maps): a local folder or an S3 prefix, behind the few operations the sink's protocol needs.

The one that carries the protocol is `create`: a file written only if nothing is at its path yet, so
that of two writers of the same path exactly one succeeds and the other learns it lost. A local
folder does it with `O_EXCL`, S3 with a conditional put (`If-None-Match: *`; S3 has honoured it
since 2024, and so does moto). Every other write replaces its path whole (a rename locally, one
PUT on S3), so a reader never sees half a file.

Paths are relative to the storage's root, with `/` between folders.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import boto3
import pyarrow.fs as pafs
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from sinks.errors import SinkError

CONNECT_TIMEOUT_SECONDS = 10
READ_TIMEOUT_SECONDS = 60
# S3's answer to a conditional put racing another conditional put of the same key: try again.
_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted"})
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "ServiceUnavailable"}
)
CREATE_ATTEMPTS = 5


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the root
    size: int
    modified: datetime  # UTC


class TableStorage(Protocol):
    """A root folder of files (module doc)."""

    @property
    def location(self) -> str:
        """The root as delta-rs and readers take it: an absolute path, or s3://bucket/prefix."""

    def read(self, path: str) -> bytes:
        """The file's content; `FileNotFoundError` when there is none."""

    def exists(self, path: str) -> bool: ...

    def put(self, path: str, payload: bytes) -> None:
        """Write the file whole, replacing what is there."""

    def create(self, path: str, payload: bytes) -> bool:
        """Write the file only if nothing is at `path`: False (and nothing written) when something is."""

    def listing(self, prefix: str = "") -> Iterator[StoredFile]:
        """Every file under the folder `prefix` ("": the whole root), in no particular order."""

    def delete(self, paths: Sequence[str]) -> None:
        """Remove the files (those already gone are fine)."""

    def check_root(self, *, parent_is_ours: bool = False) -> None:
        """`OSError` naming why the root cannot hold files (a missing bucket or parent folder, a file).
        `parent_is_ours`: the folder the root goes in is named by the project (a backfill's), so it is
        created when missing, as long as the folder it goes in exists."""


class LocalStorage:
    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    @property
    def location(self) -> str:
        return self.root

    def read(self, path: str) -> bytes:
        with open(self._local(path), "rb") as stream:
            return stream.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(self._local(path))

    def put(self, path: str, payload: bytes) -> None:
        target = self._local(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        temporary = f"{target}.{uuid.uuid4().hex}.tmp"  # per writer: two writers never share one
        try:
            _write_durably(temporary, payload, "wb")
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)

    def create(self, path: str, payload: bytes) -> bool:
        target = self._local(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            _write_durably(target, payload, "xb")
        except FileExistsError:
            return False
        return True

    def listing(self, prefix: str = "") -> Iterator[StoredFile]:
        top = self._local(prefix) if prefix else self.root
        for folder, _, names in os.walk(top):
            for name in names:
                local = os.path.join(folder, name)
                try:
                    status = os.stat(local)
                except FileNotFoundError:  # removed while listed
                    continue
                modified = datetime.fromtimestamp(status.st_mtime, UTC)
                yield StoredFile(os.path.relpath(local, self.root).replace(os.sep, "/"), status.st_size, modified)

    def delete(self, paths: Sequence[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._local(path))

    def check_root(self, *, parent_is_ours: bool = False) -> None:
        parent = os.path.dirname(self.root)
        if parent_is_ours:
            parent = os.path.dirname(parent)  # the user's folder, which ours goes in
            if os.path.isdir(parent):
                os.makedirs(os.path.dirname(self.root), exist_ok=True)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"the folder {parent!r} the table goes in does not exist")
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(f"{self.root!r} is a file, not a folder")

    def _local(self, path: str) -> str:
        return os.path.join(self.root, *path.split("/"))


class S3Storage:
    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client = client

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def read(self, path: str) -> bytes:
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as error:
            if _code(error) in ("NoSuchKey", "404"):
                raise FileNotFoundError(f"{self.location}/{path}") from error
            raise
        body: bytes = answer["Body"].read()
        return body

    def exists(self, path: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as error:
            if _code(error) in ("NoSuchKey", "404", "NotFound"):
                return False
            raise
        return True

    def put(self, path: str, payload: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=self._key(path), Body=payload)

    def create(self, path: str, payload: bytes) -> bool:
        for _ in range(CREATE_ATTEMPTS):
            try:
                self._client.put_object(Bucket=self.bucket, Key=self._key(path), Body=payload, IfNoneMatch="*")
                return True
            except ClientError as error:
                if _code(error) == "PreconditionFailed":
                    return False
                if _code(error) not in _CONFLICT_CODES:
                    raise
        raise OSError(f"{self.location}/{path}: S3 answered {CREATE_ATTEMPTS} conditional puts with a conflict")

    def listing(self, prefix: str = "") -> Iterator[StoredFile]:
        folder = self._key(prefix).rstrip("/") + "/" if prefix else (f"{self.prefix}/" if self.prefix else "")
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder)
        start = len(self.prefix) + 1 if self.prefix else 0
        for page in pages:
            for item in page.get("Contents", ()):
                if item["Key"].endswith("/"):  # a folder's marker (the console's "Create folder", s3a): no file
                    continue
                yield StoredFile(item["Key"][start:], int(item["Size"]), item["LastModified"].astimezone(UTC))

    def delete(self, paths: Sequence[str]) -> None:
        for first in range(0, len(paths), 1000):  # DeleteObjects takes at most 1,000 keys
            keys = [{"Key": self._key(path)} for path in paths[first : first + 1000]]
            answer = self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
            errors = answer.get("Errors") or ()
            if errors:
                raise OSError(f"S3 refused to delete {len(errors)} files, the first {errors[0]}")

    def check_root(self, *, parent_is_ours: bool = False) -> None:
        try:  # (S3 has no folders to create)
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as error:
            if _code(error) in ("404", "NoSuchBucket", "NotFound"):
                raise FileNotFoundError(f"the bucket {self.bucket!r} does not exist") from error
            raise

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path


@dataclass(frozen=True)
class S3Access:
    """How to reach S3: credentials (a snapshot of the session's; a sink is built per job, well within
    the life of temporary credentials), region and endpoint (None: AWS's own)."""

    access_key: str
    secret_key: str
    session_token: str | None
    region: str | None
    endpoint_url: str | None

    @classmethod
    def resolve(cls, uri: str, endpoint_url: str | None, region: str | None, session: boto3.Session | None) -> S3Access:
        """S3's credentials from `session` (an Airflow connection's), else boto3's default chain; its
        endpoint from `endpoint_url`, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (else AWS); its
        region from `region`, else the session's. `SinkError` naming `uri` when something is wrong."""
        session = session or boto3.Session()
        credentials = session.get_credentials()
        if credentials is None:
            raise SinkError(uri, "no AWS credentials: boto3's default chain found none")
        frozen = credentials.get_frozen_credentials()
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise SinkError(uri, f"S3 endpoint {endpoint!r} is not an http:// or https:// URL")
        return cls(frozen.access_key, frozen.secret_key, frozen.token, region or session.region_name, endpoint or None)

    def client(self) -> Any:
        config = Config(
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=READ_TIMEOUT_SECONDS,
            retries={"mode": "standard", "max_attempts": 5},
        )
        return boto3.client(
            "s3",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            aws_session_token=self.session_token,
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            config=config,
        )

    def arrow_filesystem(self) -> pafs.S3FileSystem:
        location: dict[str, str] = {}
        if self.endpoint_url:
            parts = urlsplit(self.endpoint_url)
            location = {"scheme": parts.scheme, "endpoint_override": parts.netloc}
        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            session_token=self.session_token,
            region=self.region,
            **location,
        )

    def delta_storage_options(self) -> dict[str, str]:
        """The same access as delta-rs' storage options (it reads no boto3 configuration of its own).
        delta-rs commits each log entry on S3 with a conditional put, so no locking provider is needed."""
        options = {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        if self.session_token:
            options["AWS_SESSION_TOKEN"] = self.session_token
        if self.region:
            options["AWS_REGION"] = self.region
        if self.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.endpoint_url
            if self.endpoint_url.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        return options


def is_transient(error: BaseException) -> bool:
    """Whether storage that failed this way may recover soon (a throttled or failing S3, a lost
    connection), as opposed to a missing bucket or a refused permission."""
    if isinstance(error, ClientError):
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return _code(error) in _TRANSIENT_CODES or status >= 500 or status == 429
    return isinstance(error, BotoCoreError)  # no answer at all: a connection or endpoint that may come back


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _write_durably(path: str, payload: bytes, mode: str) -> None:
    with open(path, mode) as stream:
        stream.write(payload)
        stream.flush()
        os.fsync(stream.fileno())
