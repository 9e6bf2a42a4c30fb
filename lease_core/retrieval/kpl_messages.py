"""KPL's protobuf schema, and views of the same wire bytes that upb reads a whole batch of aggregates with.

An aggregate's message is KPL's `AggregatedRecord` {1: repeated string partition_key_table; 2: repeated
string explicit_hash_key_table; 3: repeated Record records}, a `Record` being {1: required uint64
partition_key_index; 2: optional uint64 explicit_hash_key_index; 3: required bytes data; 4: repeated Tag
tags}. Reading a user record through upb's Python objects costs a wrapper per record and per field
(docs/performance.md); the views below let upb's C parser hand each field of a whole batch over as one
list instead, by two rules of the protobuf wire format:

- Messages written one after the other parse as one message with their repeated fields concatenated:
  the batch's messages, joined, parse as one `Flattened` holding every aggregate's tables in order.
- A singular message field that occurs many times is merged: `Flattened.records` is one `RecordFields`
  whose repeated fields hold the fields of every user record of the batch, in order.

Merging loses where one user record ends: a record might carry a field twice (the last one counts) or
not at all. `Framed` therefore parses the same messages framed one by one (field 1 of a `Framed`) with
KPL's own schema: it counts each aggregate's user records and checks the required fields, and when
every user record has at least one partition key index and one data and the flattened lists hold as many
of each as there are user records, each has exactly one, in order. `FramedWithHashKeys`, whose records
require an explicit hash key index, proves the same for those. Whatever is not proven so is read the
slow way (`lease_core.retrieval.kpl_deaggregation`).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "lease_core.kpl"
_Field = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REQUIRED, _REPEATED = _Field.LABEL_OPTIONAL, _Field.LABEL_REQUIRED, _Field.LABEL_REPEATED


_FieldSpec = tuple[str, int, int, int, str]  # name, number, label, type, message type's name


def _message(file: descriptor_pb2.FileDescriptorProto, name: str, fields: list[_FieldSpec]) -> None:
    message = file.message_type.add(name=name)
    for field_name, number, label, kind, type_name in fields:
        field = message.field.add(name=field_name, number=number, label=label, type=kind)
        if type_name:
            field.type_name = f".{_PACKAGE}.{type_name}"


def _record_fields(hash_key_label: int) -> list[_FieldSpec]:
    return [
        ("partition_key_index", 1, _REQUIRED, _Field.TYPE_UINT64, ""),
        ("explicit_hash_key_index", 2, hash_key_label, _Field.TYPE_UINT64, ""),
        ("data", 3, _REQUIRED, _Field.TYPE_BYTES, ""),
        ("tags", 4, _REPEATED, _Field.TYPE_MESSAGE, "Tag"),
    ]


def _aggregated_fields(record: str) -> list[_FieldSpec]:
    return [
        ("partition_key_table", 1, _REPEATED, _Field.TYPE_STRING, ""),
        ("explicit_hash_key_table", 2, _REPEATED, _Field.TYPE_STRING, ""),
        ("records", 3, _REPEATED, _Field.TYPE_MESSAGE, record),
    ]


def _schema() -> descriptor_pool.DescriptorPool:
    file = descriptor_pb2.FileDescriptorProto(name="lease_core/kpl.proto", package=_PACKAGE, syntax="proto2")
    # KPL's messages.proto, field for field.
    _message(
        file, "Tag", [("key", 1, _REQUIRED, _Field.TYPE_STRING, ""), ("value", 2, _OPTIONAL, _Field.TYPE_STRING, "")]
    )
    _message(file, "Record", _record_fields(_OPTIONAL))
    _message(file, "AggregatedRecord", _aggregated_fields("Record"))
    # The same, with every user record's explicit hash key index required.
    _message(file, "RecordWithHashKey", _record_fields(_REQUIRED))
    _message(file, "AggregatedRecordWithHashKeys", _aggregated_fields("RecordWithHashKey"))
    # A batch of messages framed one by one, read with either.
    _message(file, "Framed", [("aggregates", 1, _REPEATED, _Field.TYPE_MESSAGE, "AggregatedRecord")])
    _message(
        file, "FramedWithHashKeys", [("aggregates", 1, _REPEATED, _Field.TYPE_MESSAGE, "AggregatedRecordWithHashKeys")]
    )
    # A batch of messages joined, its user records' fields merged into one list each.
    _message(
        file,
        "RecordFields",
        [
            ("partition_key_index", 1, _REPEATED, _Field.TYPE_UINT64, ""),
            ("explicit_hash_key_index", 2, _REPEATED, _Field.TYPE_UINT64, ""),
            ("data", 3, _REPEATED, _Field.TYPE_BYTES, ""),
        ],
    )
    _message(
        file,
        "Flattened",
        [
            ("partition_key_table", 1, _REPEATED, _Field.TYPE_STRING, ""),
            ("explicit_hash_key_table", 2, _REPEATED, _Field.TYPE_STRING, ""),
            ("records", 3, _OPTIONAL, _Field.TYPE_MESSAGE, "RecordFields"),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool


_POOL = _schema()


def _class(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


AggregatedRecord = _class("AggregatedRecord")
Framed = _class("Framed")
FramedWithHashKeys = _class("FramedWithHashKeys")
Flattened = _class("Flattened")


def framed(messages: list[memoryview]) -> bytes:
    """`messages` as one `Framed` message's bytes: each as field 1, length-delimited."""
    parts: list[bytes | memoryview] = []
    for message in messages:
        parts.append(_FRAME_TAG)
        parts.append(_varint(len(message)))
        parts.append(message)
    return b"".join(parts)


_FRAME_TAG = bytes([1 << 3 | 2])  # field 1, length-delimited


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    encoded = bytearray()
    while value >= 0x80:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)
