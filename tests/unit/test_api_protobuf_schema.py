"""A Protobuf message becomes the table's fields the way the Protobuf decoder writes its records.

Proves, on descriptor sets built here (as confluent-kafka's serializer registers them, with the well-known
types added as `icefall.kafka.protobuf` adds them): scalars and their column types, proto3 fields without
presence required and with presence (optional, oneof, messages) not; nested messages as structs, repeated
as lists, maps as maps with string keys, enums as strings; Timestamp as timestamptz and wrappers as their
scalars; proto2 required; the message a record's message index names and the message the table holds
(recordName, else the first); refusals that name the field (Any, an empty message, recursion, a message
not in the schema). The wire format's message index parses as Confluent writes it. No registry here.
"""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

from icefall.api import to_iceberg_schema
from icefall.api.protobuf_schema import ProtobufSchemaError, fields_from_protobuf, message_name, table_message
from icefall.decode.protobuf import message_index
from icefall.kafka.protobuf import descriptor_set_text

pytestmark = pytest.mark.unit

OPTIONAL, REPEATED, REQUIRED = F.LABEL_OPTIONAL, F.LABEL_REPEATED, F.LABEL_REQUIRED


def field(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    kind: int,
    *,
    label: int = OPTIONAL,
    type_name: str = "",
    oneof: int | None = None,
    proto3_optional: bool = False,
) -> None:
    f = message.field.add(name=name, number=len(message.field) + 1, type=kind, label=label)
    if type_name:
        f.type_name = type_name
    if oneof is not None:
        f.oneof_index = oneof
    if proto3_optional:
        f.proto3_optional = True


def order_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto",
        package="shop",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"],
    )
    status = file.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    order = file.message_type.add(name="Order")
    item = order.nested_type.add(name="Item")
    field(item, "sku", F.TYPE_STRING)
    field(item, "qty", F.TYPE_INT32)
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    field(entry, "key", F.TYPE_INT32)
    field(entry, "value", F.TYPE_STRING)
    order.oneof_decl.add(name="payment")
    order.oneof_decl.add(name="_note")
    field(order, "id", F.TYPE_INT64)
    field(order, "amount", F.TYPE_DOUBLE)
    field(order, "small", F.TYPE_INT32)
    field(order, "unsigned", F.TYPE_UINT32)
    field(order, "ratio", F.TYPE_FLOAT)
    field(order, "paid", F.TYPE_BOOL)
    field(order, "blob", F.TYPE_BYTES)
    field(order, "status", F.TYPE_ENUM, type_name=".shop.Status")
    field(order, "ts", F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    field(order, "coupon", F.TYPE_MESSAGE, type_name=".google.protobuf.StringValue")
    field(order, "item", F.TYPE_MESSAGE, type_name=".shop.Order.Item")
    field(order, "items", F.TYPE_MESSAGE, label=REPEATED, type_name=".shop.Order.Item")
    field(order, "tags", F.TYPE_STRING, label=REPEATED)
    field(order, "attrs", F.TYPE_MESSAGE, label=REPEATED, type_name=".shop.Order.AttrsEntry")
    field(order, "card", F.TYPE_STRING, oneof=0)
    field(order, "cash", F.TYPE_BOOL, oneof=0)
    field(order, "note", F.TYPE_STRING, oneof=1, proto3_optional=True)
    other = file.message_type.add(name="Refund")
    field(other, "order_id", F.TYPE_INT64)
    return file


def as_text(file: descriptor_pb2.FileDescriptorProto) -> str:
    """The descriptor set text of `file`, made as the registry adapter makes it from what the Python
    serializer registers (a base64 FileDescriptorProto)."""
    return descriptor_set_text(base64.b64encode(file.SerializeToString()).decode())


def dumped(text: str, record_name: str | None = None) -> list[dict[str, object]]:
    return [
        f.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
        for f in fields_from_protobuf(text, record_name)
    ]


def test_a_message_becomes_fields_with_types_and_presence() -> None:
    item = [
        {"name": "sku", "type": "string", "required": True},
        {"name": "qty", "type": "int", "required": True},
    ]
    assert dumped(as_text(order_file())) == [
        {"name": "id", "type": "long", "required": True},
        {"name": "amount", "type": "double", "required": True},
        {"name": "small", "type": "int", "required": True},
        {"name": "unsigned", "type": "long", "required": True},
        {"name": "ratio", "type": "float", "required": True},
        {"name": "paid", "type": "boolean", "required": True},
        {"name": "blob", "type": "binary", "required": True},
        {"name": "status", "type": "string", "required": True},
        {"name": "ts", "type": "timestamptz"},
        {"name": "coupon", "type": "string"},
        {"name": "item", "type": "struct", "fields": item},
        {
            "name": "items",
            "type": "list",
            "required": True,
            "element": {"type": "struct", "fields": item},
            "elementRequired": True,
        },
        {
            "name": "tags",
            "type": "list",
            "required": True,
            "element": {"type": "string"},
            "elementRequired": True,
        },
        {
            "name": "attrs",
            "type": "map",
            "required": True,
            "key": {"type": "string"},
            "value": {"type": "string"},
            "valueRequired": True,
        },
        {"name": "card", "type": "string"},
        {"name": "cash", "type": "boolean"},
        {"name": "note", "type": "string"},
    ]
    assert to_iceberg_schema(fields_from_protobuf(as_text(order_file()))).find_field("item.sku").required


def test_proto2_required_and_optional() -> None:
    file = descriptor_pb2.FileDescriptorProto(name="p2.proto", package="p2", syntax="proto2")
    message = file.message_type.add(name="M")
    field(message, "id", F.TYPE_INT64, label=REQUIRED)
    field(message, "name", F.TYPE_STRING)
    assert dumped(as_text(file)) == [
        {"name": "id", "type": "long", "required": True},
        {"name": "name", "type": "string"},
    ]


def test_the_message_index_and_the_record_name_choose_the_message() -> None:
    text = as_text(order_file())
    assert table_message(text, None) == "shop.Order"
    assert table_message(text, "shop.Refund") == "shop.Refund"
    assert dumped(text, "shop.Refund") == [{"name": "order_id", "type": "long", "required": True}]
    assert message_name(text, [0]) == "shop.Order"
    assert message_name(text, [1]) == "shop.Refund"
    assert message_name(text, [0, 0]) == "shop.Order.Item"
    assert message_name(text, [2]) is None
    with pytest.raises(
        ProtobufSchemaError, match=r"no message shop.Nope \(spec.format.registry.recordName\)"
    ):
        table_message(text, "shop.Nope")


@pytest.mark.parametrize(
    ("value", "indexes", "end"),
    [
        (b"\x00" * 5 + b"\x00\x08\x01", [0], 6),  # the single byte 0: the first message
        (b"\x00" * 5 + b"\x02\x02\x08", [1], 7),  # count 1, index 1
        (b"\x00" * 5 + b"\x04\x00\x06", [0, 3], 8),  # count 2: [0, 3]
        (b"\x00" * 5 + b"\x02", None, 5),  # a count without its index
        (b"\x00" * 5 + b"\x01", None, 5),  # a negative count
    ],
)
def test_the_message_index_parses_as_confluent_writes_it(
    value: bytes, indexes: list[int] | None, end: int
) -> None:
    assert message_index(value, 5) == (indexes, end)


def refused(kind: int, type_name: str = "", *, imports: tuple[str, ...] = ()) -> str:
    file = descriptor_pb2.FileDescriptorProto(
        name="r.proto", package="r", syntax="proto3", dependency=imports
    )
    message = file.message_type.add(name="M")
    field(message, "ok", F.TYPE_STRING)
    field(message, "bad", kind, type_name=type_name)
    file.message_type.add(name="Empty")
    node = file.message_type.add(name="Node")
    field(node, "next", F.TYPE_MESSAGE, type_name=".r.Node")
    with pytest.raises(ProtobufSchemaError) as raised:
        fields_from_protobuf(as_text(file))
    return str(raised.value)


def test_what_cannot_map_is_refused_with_the_field_named() -> None:
    any_type = refused(F.TYPE_MESSAGE, ".google.protobuf.Any", imports=("google/protobuf/any.proto",))
    assert "field 'bad': google.protobuf.Any has no column type" in any_type
    assert "field 'bad': message Empty has no fields" in refused(F.TYPE_MESSAGE, ".r.Empty")
    assert "nest deeper than 8 levels" in refused(F.TYPE_MESSAGE, ".r.Node")
    assert "message x.Gone is not in the schema" in refused(F.TYPE_MESSAGE, ".x.Gone")


def test_imports_other_than_well_known_types_are_refused() -> None:
    file = descriptor_pb2.FileDescriptorProto(name="i.proto", package="i", dependency=["other/thing.proto"])
    file.message_type.add(name="M").field.add(name="x", number=1, type=F.TYPE_STRING, label=OPTIONAL)
    with pytest.raises(ProtobufSchemaError, match=r"imports other/thing\.proto: only well-known types"):
        as_text(file)
    with pytest.raises(ProtobufSchemaError, match="not a serialized FileDescriptorSet"):
        fields_from_protobuf("not base64!")
