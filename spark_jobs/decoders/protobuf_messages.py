"""Protobuf payloads to Arrow: the built-in `protobuf` decoder, and the Protobuf part of the Glue
Schema Registry decoder (`read_gsr_protobuf`).

A .proto file's text is compiled at run time by protoc (grpcio-tools' `grpc_tools.protoc`, with the
well-known types it bundles) into a FileDescriptorSet, once per text per process. Its messages are
loaded into protobuf's default descriptor pool under a package of their own (`_isolated`): two texts
may define the same message names, and protarrow recognizes the well-known types (Timestamp, the
wrappers, ...) only as the default pool's descriptors. Each payload is parsed by upb (`FromString`),
and the batch's messages become Arrow columns column by column (protarrow), not a dict per record.

A Glue Schema Registry Protobuf payload names which message of its .proto it holds by an index
before the message's bytes (docs/decoders.md, "Protobuf in the Glue Schema Registry").
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import protarrow  # type: ignore[import-untyped]  # no type information
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.record_columns import BATCH_COLUMNS, POSITION_COLUMNS, POSITION_SCHEMA
from spark_jobs.decode import DecodedBatch
from spark_jobs.decoders.json_objects import PayloadRows, payloads_of, positions_of, rejected_records

NAME = "protobuf"
_OPTIONS = ("schema", "schema_file", "message")
_FILE_NAME = "schema.proto"  # what protoc's messages call the compiled text
_WELL_KNOWN = "google/protobuf/"  # the files protoc bundles, imported from protobuf's own modules
# Enums by their value's name; times in microseconds, the finest unit Iceberg and Delta keep.
ARROW_CONFIG = protarrow.ProtarrowConfig(
    enum_type=pa.string(),
    timestamp_type=pa.timestamp("us", tz="UTC"),
    duration_type=pa.duration("us"),
    time_of_day_type=pa.time64("us"),
)


class ProtoCompileError(ValueError):
    """A .proto text protoc refuses, or whose messages have no Arrow type; the message says why."""


@dataclass(frozen=True)
class ProtoSchema:
    """A compiled .proto file: each message it defines (nested ones too) by its full name as the file
    writes it, the top-level ones in the order of the file, and every one in the order of the Glue
    Schema Registry's message index: sorted by full name (AWS's `MessageIndexFinder`)."""

    messages: Mapping[str, type[Message]]
    top_level: tuple[str, ...]
    gsr_order: tuple[str, ...]

    def gsr_message(self, index: int) -> str:
        """The message a Glue Schema Registry payload's message index names."""
        if not 0 <= index < len(self.gsr_order):
            raise ValueError(f"has message index {index}, but the schema defines {len(self.gsr_order)} messages")
        return self.gsr_order[index]


@functools.cache
def compile_proto(definition: str) -> ProtoSchema:
    """The .proto text compiled; `ProtoCompileError` with protoc's message when protoc refuses it.
    Cached per text: a text's messages are loaded into the default pool once per process."""
    files = _descriptor_set(definition)
    isolated = f"_isolated_{hashlib.sha256(definition.encode()).hexdigest()[:16]}"
    own: descriptor_pb2.FileDescriptorProto | None = None
    for file in files.file:
        if file.name.startswith(_WELL_KNOWN):
            _load_well_known(file)
        else:
            own = file
    assert own is not None and own.name == _FILE_NAME  # protoc was given that one file
    # Adding the same file again (another thread compiling the same text) gives the file added first.
    loaded = descriptor_pool.Default().AddSerializedFile(_isolated_file(own, isolated).SerializeToString())
    prefix = f"{isolated}."
    messages = {
        descriptor.full_name.removeprefix(prefix): message_factory.GetMessageClass(descriptor)
        for descriptor in _all_messages(loaded.message_types_by_name.values())
    }
    top_level = tuple(descriptor.full_name.removeprefix(prefix) for descriptor in loaded.message_types_by_name.values())
    return ProtoSchema(messages, top_level, tuple(sorted(messages)))


def _load_well_known(file: descriptor_pb2.FileDescriptorProto) -> None:
    """A well-known type's file into the default pool, by importing protobuf's module of it, so that
    it is the very file the module has (and later imports of the module find no other); the few
    without a module (protoc's language features) from protoc's own."""
    try:
        importlib.import_module(file.name.removesuffix(".proto").replace("/", ".") + "_pb2")
    except ModuleNotFoundError:
        pool = descriptor_pool.Default()
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            pool.AddSerializedFile(file.SerializeToString())


def _descriptor_set(definition: str) -> descriptor_pb2.FileDescriptorSet:
    """protoc's FileDescriptorSet of the text and the well-known types it imports. protoc runs in a
    process of its own: its errors go to its standard error, which is how they are read."""
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, _FILE_NAME).write_text(definition)
        out = Path(directory, "descriptors.pb")
        command = [sys.executable, "-m", "grpc_tools.protoc", "-I.", f"-I{well_known}"]
        command += [f"--descriptor_set_out={out}", "--include_imports", _FILE_NAME]
        compiled = subprocess.run(command, capture_output=True, text=True, check=False, cwd=directory)
        if compiled.returncode != 0:
            raise ProtoCompileError(f"protoc refuses it: {_protoc_errors(compiled.stderr + compiled.stdout)}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _protoc_errors(output: str) -> str:
    """protoc's errors, which name the file, without the warnings (a missing syntax) it logs first."""
    errors = [line for line in output.splitlines() if line.startswith(f"{_FILE_NAME}:")]
    return "; ".join(errors) if errors else output.strip()


def _isolated_file(file: descriptor_pb2.FileDescriptorProto, isolated: str) -> descriptor_pb2.FileDescriptorProto:
    """The file under the package `isolated.<its package>`, every reference to its own types too."""
    renamed = descriptor_pb2.FileDescriptorProto()
    renamed.CopyFrom(file)
    renamed.name = f"{isolated}/{file.name}"
    renamed.package = f"{isolated}.{file.package}" if file.package else isolated
    own_types = {f".{name}" for name in _type_names(file.message_type, file.enum_type, file.package)}
    messages = list(_all_message_protos(renamed.message_type))
    fields = [*renamed.extension, *(field for message in messages for field in [*message.field, *message.extension])]
    methods = [method for service in renamed.service for method in service.method]
    references = [(field, name) for field in fields for name in ("type_name", "extendee")]
    references += [(method, name) for method in methods for name in ("input_type", "output_type")]
    for holder, attribute in references:
        # Only a reference that is there: setting an absent one, even to "", would make it present.
        if getattr(holder, attribute) in own_types:
            setattr(holder, attribute, f".{isolated}{getattr(holder, attribute)}")
    return renamed


def _type_names(
    messages: Sequence[descriptor_pb2.DescriptorProto], enums: Sequence[descriptor_pb2.EnumDescriptorProto], scope: str
) -> Iterator[str]:
    for enum in enums:
        yield f"{scope}.{enum.name}" if scope else enum.name
    for message in messages:
        name = f"{scope}.{message.name}" if scope else message.name
        yield name
        yield from _type_names(message.nested_type, message.enum_type, name)


def _all_message_protos(messages: Sequence[descriptor_pb2.DescriptorProto]) -> Iterator[descriptor_pb2.DescriptorProto]:
    for message in messages:
        yield message
        yield from _all_message_protos(message.nested_type)


def _all_messages(messages: Any) -> Iterator[Descriptor]:
    # Nested types include the entries protoc makes for map fields, as in AWS's message index.
    for message in messages:
        yield message
        yield from _all_messages(message.nested_types)


def message_name(message_class: type[Message]) -> str:
    """The message's full name as its .proto file writes it."""
    return message_class.DESCRIPTOR.full_name.partition(".")[2]  # after the isolating package


def arrow_schema(message_class: type[Message]) -> pa.Schema:
    """The columns of a message: one per field, each nullable (a later schema version may drop it).
    `ProtoCompileError` for a message with no Arrow type (a recursive one)."""
    try:
        schema = protarrow.message_type_to_schema(message_class, ARROW_CONFIG)
    except TypeError as error:
        raise ProtoCompileError(f"message {message_name(message_class)} has no Arrow type ({error})") from None
    return pa.schema([field.with_nullable(True) for field in schema])


def read_messages(message_class: type[Message], payloads: Sequence[bytes | memoryview]) -> PayloadRows:
    """Each payload parsed as one `message_class`: the table of those that parse, the index of each
    row's payload, and why each other payload was refused."""
    parsed: list[Message] = []
    rows: list[int] = []
    rejected: dict[int, str] = {}
    for index, payload in enumerate(payloads):
        try:
            parsed.append(message_class.FromString(payload))
        except DecodeError as error:
            why = str(error).rpartition("': ")[2]  # upb's message names the type by its isolated name
            rejected[index] = f"is not a {message_name(message_class)} message ({why})"
        else:
            rows.append(index)
    try:
        table = _messages_table(parsed, message_class)
    except _CONVERSION_ERRORS:  # a value with no Arrow form (a Timestamp past year 9999): find its messages
        kept = []
        for message, index in zip(parsed, rows, strict=True):
            try:
                _messages_table([message], message_class)
            except _CONVERSION_ERRORS as error:
                rejected[index] = f"is a {message_name(message_class)} message with a value Arrow cannot hold ({error})"
            else:
                kept.append((message, index))
        parsed, rows = [message for message, _ in kept], [index for _, index in kept]
        table = _messages_table(parsed, message_class)
    return PayloadRows(table, rows, dict(sorted(rejected.items())))


# What converting a parsed message to Arrow raises for a value out of Arrow's range.
_CONVERSION_ERRORS = (ValueError, OverflowError, pa.ArrowInvalid, pa.ArrowTypeError)


def _messages_table(messages: Sequence[Message], message_class: type[Message]) -> pa.Table:
    return protarrow.messages_to_table(messages, message_class, ARROW_CONFIG).cast(arrow_schema(message_class))


def gsr_message_names(schema_definition: str, payloads: Sequence[bytes]) -> frozenset[str]:
    """The messages of the file that Glue Schema Registry Protobuf payloads name by their message
    index (those whose index does not name one left out). `ProtoCompileError` when the definition
    does not compile."""
    schema = compile_proto(schema_definition)
    names = set()
    for payload in payloads:
        try:
            names.add(schema.gsr_message(_varint(payload)[0]))
        except ValueError:
            continue
    return frozenset(names)


def gsr_protobuf_columns(schema_definition: str, messages: Iterable[str]) -> pa.Schema:
    """The columns of the records of `messages` (full names) of a Glue Schema Registry Protobuf schema
    version: one column per field name, in the order of the messages' names then of their fields;
    a name the file does not define gives none (an older version's). `ProtoCompileError` when the
    definition does not compile, or two of the messages give a field name two types."""
    schema = compile_proto(schema_definition)
    columns: dict[str, tuple[pa.Field, str]] = {}
    for name in sorted(set(messages) & set(schema.messages)):
        for column in arrow_schema(schema.messages[name]):
            seen = columns.setdefault(column.name, (column, name))
            if seen[0].type != column.type:
                raise ProtoCompileError(
                    f"field {column.name!r} is {seen[0].type} in message {seen[1]} and {column.type} in message {name}"
                )
    return pa.schema([column for column, _ in columns.values()])


def read_gsr_protobuf(schema_definition: str, payloads: Sequence[bytes]) -> PayloadRows:
    """Glue Schema Registry Protobuf payloads (what follows the registry's header) of a schema version
    whose SchemaDefinition is `schema_definition`: each a message index (an unsigned varint) then the
    message's bytes. The rows of every message the payloads hold, in the payloads' order, with the
    columns of those messages (`gsr_protobuf_columns`: a row of one message has the others' fields
    null). `ProtoCompileError` as `gsr_protobuf_columns`."""
    columns = gsr_protobuf_columns(schema_definition, gsr_message_names(schema_definition, payloads))
    schema = compile_proto(schema_definition)
    by_message: dict[str, list[int]] = {}
    bodies: dict[int, memoryview] = {}
    rejected: dict[int, str] = {}
    for index, payload in enumerate(payloads):
        try:
            message_index, length = _varint(payload)
            name = schema.gsr_message(message_index)
        except ValueError as error:
            rejected[index] = str(error)
            continue
        by_message.setdefault(name, []).append(index)
        bodies[index] = memoryview(payload)[length:]
    tables = [columns.empty_table()]
    rows: list[int] = []
    for name, indices in by_message.items():
        read = read_messages(schema.messages[name], [bodies[index] for index in indices])
        rejected.update((indices[position], why) for position, why in read.rejected.items())
        table = read.table
        for column in columns:
            if column.name not in table.column_names:  # another record message's field
                table = table.append_column(column, pa.nulls(table.num_rows, column.type))
        tables.append(table.select(columns.names))
        rows += [indices[row] for row in read.rows]
    order = pc.sort_indices(pa.array(rows, pa.int64()))  # back in the payloads' order
    return PayloadRows(pa.concat_tables(tables).take(order), sorted(rows), rejected)


def _varint(payload: bytes) -> tuple[int, int]:
    """The unsigned varint at the payload's start (at most 32 bits, as protobuf's `writeUInt32NoTag`
    writes it) and its length in bytes."""
    value = 0
    for position, byte in enumerate(payload[:5]):
        value |= (byte & 0x7F) << (7 * position)
        if byte < 0x80:
            return value, position + 1
    raise ValueError("does not start with a message index (an unsigned varint)")


@dataclass(frozen=True)
class ProtobufDecoder:
    """The built-in `protobuf` decoder: each payload one message of `message`, defined in `definition`."""

    definition: str  # the .proto text
    message: str  # the full name of the payloads' message
    spec: str = NAME

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ProtobufDecoder:
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"the protobuf decoder has no option {unknown[0]!r} (it takes: {', '.join(_OPTIONS)})")
        given = [name for name in ("schema", "schema_file") if options.get(name) is not None]
        if len(given) != 1:
            raise ValueError(f"the protobuf decoder takes exactly one of schema and schema_file, got {given or 'none'}")
        (option,) = given
        definition = _definition(option, options[option])
        try:
            schema = compile_proto(definition)
        except ProtoCompileError as error:
            raise ValueError(f"{option}: {error}") from None
        message = _message_name(schema, options.get("message"))
        try:
            columns = arrow_schema(schema.messages[message])
        except ProtoCompileError as error:
            raise ValueError(f"message: {error}") from None
        clashes = sorted(set(columns.names) & {*POSITION_COLUMNS, *BATCH_COLUMNS})
        if clashes:
            raise ValueError(f"message {message} has a field named {clashes[0]!r}, which the batch has as a column")
        return cls(definition, message)

    def options(self) -> dict[str, Any]:
        return {"schema": self.definition, "message": self.message}

    def columns(self) -> pa.Schema:
        return pa.schema([*POSITION_SCHEMA, *arrow_schema(self._message_class())])

    def decode_batch(self, records: Sequence[KinesisRecord], stream_name: str, shard_id: str) -> DecodedBatch:
        read = read_messages(self._message_class(), payloads_of(records))
        table = positions_of(records, read.rows)
        for field in read.table.schema:
            table = table.append_column(field, read.table.column(field.name))
        return DecodedBatch(table, rejected_records(records, read.rejected, stream_name, shard_id))

    def _message_class(self) -> type[Message]:
        return compile_proto(self.definition).messages[self.message]


def _definition(option: str, value: Any) -> str:
    """The .proto text the `schema` option is, or the `schema_file` option names."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{option} must be a non-empty string, got {value!r}")
    if option == "schema":
        return value
    try:
        return Path(value).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"schema_file: cannot read {value!r} ({error})") from None


def _message_name(schema: ProtoSchema, message: Any) -> str:
    """The `message` option checked, or the file's one top-level message when it is not given."""
    if message is None:
        if len(schema.top_level) != 1:
            defined = ", ".join(schema.top_level) or "none"
            problem = f"the schema defines {len(schema.top_level)} top-level messages ({defined}), not one"
            raise ValueError(f"message is required: {problem}")
        return schema.top_level[0]
    if not isinstance(message, str) or message.removeprefix(".") not in schema.messages:
        raise ValueError(f"message {message!r} is not defined in the schema (it defines: {', '.join(schema.messages)})")
    return message.removeprefix(".")
