"""Protobuf payloads to Arrow: .proto text compiled at run time, the Glue Schema Registry's message-index
framing, the built-in protobuf decoder, bad payloads set aside with their reasons."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import Message

from lease_core.errors import ConfigurationError
from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import load_decoder
from spark_jobs.decoders.protobuf_messages import (
    ProtobufDecoder,
    ProtoCompileError,
    compile_proto,
    gsr_protobuf_columns,
    read_gsr_protobuf,
)
from spark_jobs.errors import FunctionLoadError
from spark_jobs.record_processing import RecordProcessing

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
SHOP = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  enum Status { STATUS_UNSPECIFIED = 0; PAID = 1; SHIPPED = 2; }
  message Line { string sku = 1; int32 quantity = 2; }
  string order_id = 1;
  google.protobuf.Timestamp placed_at = 2;
  Status status = 3;
  repeated Line lines = 4;
  map<string, int32> tags = 5;
  oneof payment { string card = 6; int64 cash_cents = 7; }
  optional double discount = 8;
  repeated string notes = 9;
}

message Refund { string order_id = 1; int64 cents = 2; }
"""
# Every message of SHOP, nested ones and the map's entry included, sorted by full name: the index
# AWS's MessageIndexFinder gives each.
GSR_INDEX = {"shop.Order": 0, "shop.Order.Line": 1, "shop.Order.TagsEntry": 2, "shop.Refund": 3}


def messages() -> dict[str, type[Message]]:
    return dict(compile_proto(SHOP).messages)


def an_order() -> Message:
    order = messages()["shop.Order"](
        order_id="o-1", status=1, tags={"gift": 1}, cash_cents=1250, discount=0.0, notes=["leave at door"]
    )
    order.lines.add(sku="tea", quantity=2)
    order.placed_at.FromDatetime(datetime(2026, 11, 29, 1, 2, 3, 456789, tzinfo=UTC))
    return order


def gsr_framed(message: Message) -> bytes:
    """As AWS's ProtobufWireFormatEncoder writes it: `writeUInt32NoTag(messageIndex)`, then the message."""
    name = message.DESCRIPTOR.full_name.partition(".")[2]
    return _VarintBytes(GSR_INDEX[name]) + message.SerializeToString()


def records(*payloads: bytes) -> list[KinesisRecord]:
    return [KinesisRecord(str(100 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]


def test_messages_become_typed_columns_with_timestamps_enums_structs_lists_maps_oneofs_and_optionals():
    decoder = ProtobufDecoder.from_options({"schema": SHOP, "message": "shop.Order"})
    empty = messages()["shop.Order"]()
    decoded = decoder.decode_batch(records(an_order().SerializeToString(), empty.SerializeToString()), "s", "shard-0")
    assert decoded.rejected == ()
    assert decoded.table.schema == decoder.columns()
    columns = decoded.table.schema
    assert columns.field("placed_at").type == pa.timestamp("us", tz="UTC")
    assert columns.field("status").type == pa.string()
    assert columns.field("lines").type.value_type == pa.struct(
        [pa.field("sku", pa.string(), nullable=False), pa.field("quantity", pa.int32(), nullable=False)]
    )
    assert pa.types.is_map(columns.field("tags").type)
    assert decoded.table.column("sequence_number").to_pylist() == ["100", "101"]
    rows = decoded.table.drop_columns(["sequence_number", "sub_sequence_number", "partition_key"]).to_pylist()
    assert rows == [
        {
            "approximate_arrival_timestamp": ARRIVAL,
            "order_id": "o-1",
            "placed_at": datetime(2026, 11, 29, 1, 2, 3, 456789, tzinfo=UTC),
            "status": "PAID",
            "lines": [{"sku": "tea", "quantity": 2}],
            "tags": [("gift", 1)],
            "card": None,  # the oneof's other member
            "cash_cents": 1250,
            "discount": 0.0,  # proto3 optional, set to its default: present
            "notes": ["leave at door"],
        },
        {
            "approximate_arrival_timestamp": ARRIVAL,
            "order_id": "",
            "placed_at": None,  # a message field not set
            "status": "STATUS_UNSPECIFIED",
            "lines": [],
            "tags": [],
            "card": None,
            "cash_cents": None,
            "discount": None,  # proto3 optional, not set
            "notes": [],
        },
    ]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(b"\xff\xff\xff", r"is not a shop.Refund message \(.*corrupt", id="corrupt-wire-format"),
        pytest.param(b"\x0a\x05or", r"is not a shop.Refund message", id="truncated-string"),
        pytest.param(b"\x0a\x02\xff\xfe", r"is not a shop.Refund message \(.*UTF-8", id="string-not-utf8"),
    ],
)
def test_a_payload_that_does_not_parse_is_rejected_naming_the_record_and_the_others_decode(payload, reason):
    decoder = ProtobufDecoder.from_options({"schema": SHOP, "message": "shop.Refund"})
    good = messages()["shop.Refund"](order_id="o-1", cents=300).SerializeToString()
    decoded = decoder.decode_batch(records(good, payload, good), "refunds", "shard-0")
    assert decoded.table.column("sequence_number").to_pylist() == ["100", "102"]
    assert decoded.table.column("cents").to_pylist() == [300, 300]
    [rejection] = decoded.rejected
    assert rejection.record.sequence_number == "101"
    assert rejection.error.startswith("the payload of record 101/0 of refunds/shard-0 is not a shop.Refund message")
    assert re.search(reason, rejection.error)


def test_gsr_payloads_name_their_message_by_the_index_of_its_full_name_among_the_files_sorted_messages():
    refund = messages()["shop.Refund"](order_id="o-1", cents=300)
    read = read_gsr_protobuf(SHOP, [gsr_framed(an_order()), gsr_framed(refund)])
    assert read.rows == [0, 1] and read.rejected == {}
    assert read.table.select(["order_id", "status", "cents"]).to_pylist() == [
        {"order_id": "o-1", "status": "PAID", "cents": None},
        {"order_id": "o-1", "status": None, "cents": 300},
    ]


def test_gsr_message_indices_are_those_of_the_example_in_aws_message_index_finder():
    schema = compile_proto('syntax = "proto3"; message B { message C {} message A { message D {} } }')
    assert [schema.gsr_message(index) for index in range(4)] == ["B", "B.A", "B.A.D", "B.C"]


def test_a_gsr_payload_of_a_nested_message_decodes_as_that_message():
    line = messages()["shop.Order.Line"](sku="tea", quantity=3)
    read = read_gsr_protobuf(SHOP, [gsr_framed(line)])
    assert read.table.to_pylist() == [{"sku": "tea", "quantity": 3}]


ENVELOPED = 'syntax = "proto3"; message Event { string id = 1; } message Envelope { Event event = 1; int32 n = 2; }'


@pytest.mark.parametrize(
    ("definition", "messages", "columns"),
    [
        pytest.param(
            SHOP,
            {"shop.Refund", "shop.Order"},
            ["order_id", "placed_at", "status", "lines", "tags", "card", "cash_cents", "discount", "notes", "cents"],
            id="the-messages-by-name-then-their-fields-one-column-per-name",
        ),
        pytest.param(ENVELOPED, {"Event"}, ["id"], id="a-message-another-has-as-a-field-is-a-record-when-written"),
        pytest.param(SHOP, {"shop.Gone"}, [], id="a-message-an-older-version-lacks-gives-none"),
    ],
)
def test_a_gsr_protobuf_versions_columns_are_those_of_the_messages_its_records_hold(definition, messages, columns):
    assert gsr_protobuf_columns(definition, messages).names == columns


def test_gsr_records_of_a_message_another_has_as_a_field_decode_as_that_message():
    event = compile_proto(ENVELOPED).messages["Event"](id="e-1")
    read = read_gsr_protobuf(ENVELOPED, [b"\x01" + event.SerializeToString()])  # Envelope 0, Event 1
    assert read.table.to_pylist() == [{"id": "e-1"}] and read.rejected == {}


def test_a_message_with_a_value_arrow_cannot_hold_is_rejected_alone():
    decoder = ProtobufDecoder.from_options({"schema": SHOP, "message": "shop.Order"})
    far = an_order()
    far.placed_at.seconds = 2**62  # past year 9999: no Arrow timestamp
    decoded = decoder.decode_batch(records(an_order().SerializeToString(), far.SerializeToString()), "o", "shard-0")
    assert decoded.table.column("sequence_number").to_pylist() == ["100"]
    [rejection] = decoded.rejected
    assert rejection.record.sequence_number == "101" and "a value Arrow cannot hold" in rejection.error


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(b"", "does not start with a message index", id="empty"),
        pytest.param(b"\x80\x80", "does not start with a message index", id="index-cut-short"),
        pytest.param(b"\x04\x0a\x01x", "has message index 4, but the schema defines 4 messages", id="past-end"),
        pytest.param(b"\x03\xff\xff", "is not a shop.Refund message", id="message-corrupt"),
    ],
)
def test_a_gsr_payload_with_a_bad_index_or_message_is_rejected_with_the_reason(payload, reason):
    refund = messages()["shop.Refund"](order_id="o-2", cents=5)
    read = read_gsr_protobuf(SHOP, [payload, gsr_framed(refund)])
    assert read.rows == [1]
    assert read.table.column("order_id").to_pylist() == ["o-2"]
    assert list(read.rejected) == [0] and reason in read.rejected[0]


def test_a_definition_protoc_refuses_is_an_error_carrying_protocs_message():
    with pytest.raises(ProtoCompileError, match=r'protoc refuses it: schema\.proto:1:49: Expected ";"'):
        compile_proto('syntax = "proto3"; message Broken { int32 x = 1 }')


def test_two_versions_defining_the_same_message_names_decode_each_with_its_own_fields():
    version_1 = 'syntax = "proto3"; package shop; message Refund { string order_id = 1; }'
    version_2 = 'syntax = "proto3"; package shop; message Refund { string order_id = 1; string reason = 2; }'
    payload = compile_proto(version_2).messages["shop.Refund"](order_id="o", reason="late").SerializeToString()
    assert read_gsr_protobuf(version_1, [b"\x00" + payload]).table.to_pylist() == [{"order_id": "o"}]
    assert read_gsr_protobuf(version_2, [b"\x00" + payload]).table.to_pylist() == [{"order_id": "o", "reason": "late"}]


def test_the_schema_file_option_reads_the_proto_file_and_the_round_carries_its_text(tmp_path: Path):
    path = tmp_path / "shop.proto"
    path.write_text(SHOP)
    processing = RecordProcessing.from_options(
        {"decode": "protobuf", "decode_options": {"schema_file": str(path), "message": "shop.Refund"}}
    )
    carried = RecordProcessing.from_options(json.loads(json.dumps(processing.to_dict())))
    decoder = load_decoder(carried.decode, carried.decode_options)
    assert decoder == ProtobufDecoder(SHOP, "shop.Refund")


def test_a_file_of_one_top_level_message_needs_no_message_option():
    decoder = ProtobufDecoder.from_options({"schema": 'syntax = "proto3"; message Ping { message Inner {} }'})
    assert decoder.message == "Ping"


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        pytest.param({"schema": SHOP}, r"message is required: the schema defines 2 top-level messages", id="two"),
        pytest.param({"schema": SHOP, "message": "shop.Bill"}, r"message .shop.Bill. is not defined", id="undefined"),
        pytest.param({}, "exactly one of schema and schema_file, got none", id="neither"),
        pytest.param(
            {"schema": SHOP, "schema_file": "/x.proto"}, "exactly one of schema and schema_file", id="both-given"
        ),
        pytest.param({"schema": "message {"}, r"schema: protoc refuses it: schema\.proto:1:9", id="not-compiling"),
        pytest.param({"schema_file": "/no/such.proto"}, r"schema_file: cannot read '/no/such.proto'", id="no-file"),
        pytest.param({"schema": 7}, "schema must be a non-empty string, got 7", id="not-text"),
        pytest.param({"schema": SHOP, "shema": 1}, "has no option 'shema'", id="unknown-option"),
        pytest.param(
            {"schema": 'syntax = "proto3"; message Tree { repeated Tree children = 1; }'},
            "message: message Tree has no Arrow type",
            id="recursive",
        ),
        pytest.param(
            {"schema": 'syntax = "proto3"; message Row { string partition_key = 1; }'},
            "message Row has a field named 'partition_key', which the batch has as a column",
            id="column-clash",
        ),
    ],
)
def test_wrong_options_are_refused_when_the_round_is_planned_and_when_loaded_naming_the_option(options, complaint):
    with pytest.raises(ConfigurationError, match=complaint) as raised:
        RecordProcessing.from_options({"decode": "protobuf", "decode_options": options})
    assert raised.value.key == "decode_options"
    with pytest.raises(FunctionLoadError, match=complaint):
        load_decoder("protobuf", options)


def test_gsr_records_of_two_messages_giving_a_field_two_types_are_refused_naming_both():
    definition = 'syntax = "proto3"; message A { string id = 1; } message B { int64 id = 1; }'
    with pytest.raises(ProtoCompileError, match="field 'id' is string in message A and int64 in message B"):
        read_gsr_protobuf(definition, [b"\x00\x0a\x01x", b"\x01\x08\x05"])


def test_a_file_may_import_a_well_known_file_that_protobuf_has_no_python_module_of():
    definition = 'edition = "2023"; import "google/protobuf/java_features.proto"; message Ping { int32 n = 1; }'
    read = read_gsr_protobuf(definition, [b"\x00\x08\x07"])
    assert read.table.to_pylist() == [{"n": 7}]


def test_an_empty_batch_decodes_to_no_rows_with_the_messages_columns():
    decoder = ProtobufDecoder.from_options({"schema": SHOP, "message": "shop.Refund"})
    decoded = decoder.decode_batch([], "refunds", "shard-0")
    assert decoded.table.num_rows == 0 and decoded.table.schema == decoder.columns()


def test_a_proto2_file_with_extensions_custom_options_and_a_service_decodes_its_own_types():
    definition = """
    syntax = "proto2";
    package svc;
    import "google/protobuf/descriptor.proto";
    extend google.protobuf.FieldOptions { optional Tag tag = 50001; }
    message Tag { optional string v = 1; extensions 100 to 200; }
    message Request { optional Tag t = 1 [(tag) = {v: "x"}]; optional Kind k = 2 [default = B]; }
    extend Tag { optional Request back = 100; }
    enum Kind { A = 0; B = 1; }
    service Calls { rpc Call(Request) returns (Tag); }
    """
    request = compile_proto(definition).messages["svc.Request"]
    decoder = ProtobufDecoder.from_options({"schema": definition, "message": "svc.Request"})
    decoded = decoder.decode_batch(records(request(t={"v": "q"}, k=0).SerializeToString()), "s", "shard-0")
    assert decoded.table.select(["t", "k"]).to_pylist() == [{"t": {"v": "q"}, "k": "A"}]
