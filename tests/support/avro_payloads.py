"""Avro payloads as producers write them: one binary datum (no container), and framed the way the
AWS Glue Schema Registry serializer frames it (docs/decoders.md, "`glue_schema_registry`")."""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import fastavro
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import Message

from spark_jobs.decoders.glue_schema_registry import SchemaVersion

GSR_HEADER_VERSION = 3
GSR_NO_COMPRESSION, GSR_ZLIB = 0, 5


def avro_datum(schema: Mapping[str, Any], value: Mapping[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(dict(schema)), dict(value))
    return out.getvalue()


def gsr_protobuf_data(message: Message) -> bytes:
    """A Protobuf message as the serializer writes it after the header (AWS's
    ProtobufWireFormatEncoder): its index among the file's messages sorted by full name
    (`writeUInt32NoTag`), then the message."""
    file = message.DESCRIPTOR.file
    names = sorted(_message_names(file.message_types_by_name.values()))
    return _VarintBytes(names.index(message.DESCRIPTOR.full_name)) + message.SerializeToString()


def _message_names(descriptors: Any) -> list[str]:
    return [name for d in descriptors for name in (d.full_name, *_message_names(d.nested_types))]


def gsr_framed(schema_version_id: str, data: bytes, compress: bool = False) -> bytes:
    """The serializer's bytes: header version byte 3, compression byte (0 none, 5 zlib), the schema
    version id's 16 bytes (most significant first), then the data, zlib'd when compressing."""
    compression = GSR_ZLIB if compress else GSR_NO_COMPRESSION
    body = zlib.compress(data) if compress else data
    return bytes([GSR_HEADER_VERSION, compression]) + UUID(schema_version_id).bytes + body


def registered_versions(
    glue: Any, registry: str, schema: str, definitions: list[Mapping[str, Any]] | list[str], data_format: str = "AVRO"
) -> list[str]:
    """A registry with a schema of `definitions` (in order: Avro schemas as objects, or texts, a
    .proto file's for PROTOBUF) as its versions 1, 2, ..., made through Glue's API as a producer's
    registration does; the versions' ids."""
    glue.create_registry(RegistryName=registry)
    first, *later = [text if isinstance(text, str) else json.dumps(text) for text in definitions]
    created = glue.create_schema(
        RegistryId={"RegistryName": registry},
        SchemaName=schema,
        DataFormat=data_format,
        Compatibility="BACKWARD",
        SchemaDefinition=first,
    )
    ids = [created["SchemaVersionId"]]
    for definition in later:
        registered = glue.register_schema_version(
            SchemaId={"RegistryName": registry, "SchemaName": schema}, SchemaDefinition=definition
        )
        ids.append(registered["SchemaVersionId"])
    return ids


@dataclass(frozen=True)
class VersionTable:
    """Schema versions held in the process, looked up as Glue's are: where Glue is not what is tested."""

    versions: tuple[SchemaVersion, ...]

    def by_id(self, version_id: str) -> SchemaVersion | None:
        return next((version for version in self.versions if version.version_id == version_id), None)

    def by_number(self, schema_arn: str, version_number: int) -> SchemaVersion | None:
        matches = (v for v in self.versions if (v.schema_arn, v.version_number) == (schema_arn, version_number))
        return next(matches, None)
