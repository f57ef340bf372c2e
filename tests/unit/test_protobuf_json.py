"""A framed Protobuf record becomes the JSON text the JSON path reads into the table's columns.

Proves, with messages built from a descriptor here: the message index picks the message; 64-bit integers
are JSON numbers, bytes base64, enums names (an unknown number stays a number), maps objects with string
keys (int and bool keys too), wrappers their value, Timestamp RFC 3339 text; a field with presence that is
unset is absent, a proto3 field without presence is there with its default; a message that holds itself
nests; the reasons for an index that does not parse, an index naming no message, and bytes that do not
decode (a Timestamp with no RFC 3339 text among them); a batch of values decodes in one call into the
struct column, null where the value or schema id is null or the id unknown. Spark is not involved.
"""

from __future__ import annotations

import base64
import json

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

from icefall.decode.protobuf import decode_batch, to_json
from icefall.kafka.protobuf import descriptor_set_text

pytestmark = pytest.mark.unit


def schema() -> tuple[str, type]:
    file = descriptor_pb2.FileDescriptorProto(
        name="t.proto",
        package="t",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto", "google/protobuf/timestamp.proto"],
    )
    kind = file.enum_type.add(name="Kind")
    kind.value.add(name="A", number=0)
    kind.value.add(name="B", number=1)
    message = file.message_type.add(name="M")
    entry = message.nested_type.add(name="ByIdEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_BOOL, label=F.LABEL_OPTIONAL)
    flags = message.nested_type.add(name="FlagsEntry")
    flags.options.map_entry = True
    flags.field.add(name="key", number=1, type=F.TYPE_BOOL, label=F.LABEL_OPTIONAL)
    flags.field.add(name="value", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    message.oneof_decl.add(name="_maybe")
    fields = [
        ("big", F.TYPE_UINT64, F.LABEL_OPTIONAL, ""),
        ("blob", F.TYPE_BYTES, F.LABEL_OPTIONAL, ""),
        ("kind", F.TYPE_ENUM, F.LABEL_OPTIONAL, ".t.Kind"),
        ("by_id", F.TYPE_MESSAGE, F.LABEL_REPEATED, ".t.M.ByIdEntry"),
        ("flags", F.TYPE_MESSAGE, F.LABEL_REPEATED, ".t.M.FlagsEntry"),
        ("count", F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
        ("raw", F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".google.protobuf.BytesValue"),
        ("zero", F.TYPE_INT32, F.LABEL_OPTIONAL, ""),
        ("when", F.TYPE_MESSAGE, F.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
        ("maybe", F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
    ]
    for number, (name, kind_, label, type_name) in enumerate(fields, start=1):
        added = message.field.add(name=name, number=number, type=kind_, label=label)
        if type_name:
            added.type_name = type_name
    message.field[-1].oneof_index = 0
    message.field[-1].proto3_optional = True
    other = file.message_type.add(name="Other")
    other.field.add(name="x", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    node = file.message_type.add(name="Node")  # message index [2]
    node.field.add(name="child", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".t.Node")
    node.field.add(name="name", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    text = descriptor_set_text(base64.b64encode(file.SerializeToString()).decode())
    pool = descriptor_pool.DescriptorPool()
    for each in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(text)).file:
        pool.Add(each)
    return text, message_factory.GetMessageClass(pool.FindMessageTypeByName("t.M"))


HEADER = b"\x00\x00\x00\x00\x07"


def test_a_message_becomes_json_as_the_columns_read_it() -> None:
    text, cls = schema()
    message = cls(big=2**63 - 1, blob=b"\x00\xff", kind=5)
    message.by_id[3] = True
    message.flags[True] = "yes"
    message.count.value = 7
    message.raw.value = b"ab"
    encoded, problem = to_json(text, 7, HEADER + b"\x00" + message.SerializeToString())
    assert problem is None and encoded is not None
    assert json.loads(encoded) == {
        "big": 2**63 - 1,
        "blob": "AP8=",
        "kind": 5,
        "by_id": {"3": True},
        "flags": {"true": "yes"},
        "count": 7,
        "raw": "YWI=",
        "zero": 0,
    }
    encoded, _ = to_json(text, 7, HEADER + b"\x00" + cls(kind=1, maybe="m").SerializeToString())
    assert {k: v for k, v in json.loads(encoded or "").items() if k in ("kind", "maybe")} == {
        "kind": "B",
        "maybe": "m",
    }


def test_what_does_not_decode_says_why() -> None:
    text, _ = schema()
    assert to_json(text, 7, HEADER + b"\x02\x02\x0a\x01x") == ('{"x": "x"}', None)  # index [1]: Other
    assert to_json(text, 7, HEADER + b"\x02\x06") == (
        None,
        "message index [3] names no message of schema id 7",
    )
    assert to_json(text, 7, HEADER + b"\x02")[1] == (
        "the message index after the schema id does not parse (Confluent's wire format: a count, then that "
        "many indexes, zig-zag varints)"
    )
    assert to_json(text, 7, HEADER + b"\x00\x0f") == (
        None,
        "bytes do not decode as protobuf message t.M of schema id 7",
    )


def test_a_timestamp_is_rfc_3339_text_and_one_without_it_does_not_decode() -> None:
    text, cls = schema()
    message = cls()
    message.when.nanos = 5_000_000
    encoded, _ = to_json(text, 7, HEADER + b"\x00" + message.SerializeToString())
    assert json.loads(encoded or "")["when"] == "1970-01-01T00:00:00.005Z"
    message.when.seconds = 300_000_000_000  # past 9999-12-31
    assert to_json(text, 7, HEADER + b"\x00" + message.SerializeToString()) == (
        None,
        "bytes do not decode as protobuf message t.M of schema id 7",
    )


def test_a_message_that_holds_itself_nests() -> None:
    text, _ = schema()
    inner = b"\x12\x01b"  # name: "b"
    outer = b"\x0a" + bytes([len(inner)]) + inner + b"\x12\x01a"  # child: inner, name: "a"
    encoded, problem = to_json(text, 7, HEADER + b"\x02\x04" + outer)  # index [2]: Node
    assert problem is None
    assert json.loads(encoded or "") == {"child": {"name": "b"}, "name": "a"}


def test_a_batch_decodes_in_one_call() -> None:
    import pyarrow as pa

    text, cls = schema()
    good = HEADER + b"\x00" + cls(zero=3).SerializeToString()
    values = pa.array([good, None, good, HEADER + b"\x02\x06", good], pa.binary())
    ids = pa.array([7, 7, 8, 7, None], pa.int32())
    decoded = decode_batch({7: text}, values, ids)
    assert decoded.type == pa.struct([("json", pa.string()), ("problem", pa.string())])
    assert decoded.to_pylist() == [
        {"json": to_json(text, 7, good)[0], "problem": None},
        None,  # no value
        None,  # schema id 8 is not known
        {"json": None, "problem": "message index [3] names no message of schema id 7"},
        None,  # no schema id (the frame is wrong)
    ]
    assert len(decode_batch({7: text}, pa.array([], pa.binary()), pa.array([], pa.int32()))) == 0
