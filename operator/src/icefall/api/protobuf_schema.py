"""The table's schema from a Protobuf schema (a registry's schema for `spec.format.type: protobuf`).

A Protobuf schema arrives here as a serialized `FileDescriptorSet` (base64 text; the registry adapter,
`icefall.kafka.protobuf`, makes it from what the registry holds). Its last file is the schema itself; the
files before it are what it imports (well-known types such as google/protobuf/timestamp.proto).

`fields_from_protobuf(text, message)` maps one message of the schema to `spec.format.schema` fields, the
way the Protobuf decoder (`icefall.decode.protobuf`) writes its records as JSON for the JSON path:
- scalars: int32/sint32/sfixed32 → int; int64/sint64/sfixed64, uint32/fixed32, uint64/fixed64 → long;
  float, double, bool, string; bytes → binary; enums → string (the value's name);
- a message → struct; repeated → list; map<K, V> → map with string keys (JSON object keys);
- google.protobuf.Timestamp → timestamptz; the wrappers (StringValue, Int64Value, ...) → their scalar;
- required: a field that always has a value on the wire's reading: a proto3 scalar or enum without
  presence, a proto2 `required` field, and repeated and map fields (empty when absent); a field with
  presence (a message, `optional`, a oneof member, a proto2 optional field) is optional.

Refused with a message naming the field: google.protobuf.Any, Struct, Value, ListValue and other
well-known types with no column type, a message with no fields, recursion deeper than the table can nest.

`message_name(text, indexes)` is the message a record's message index (Confluent's wire format) names.

Pure: no I/O, no pyspark. Field ids are assigned by `to_iceberg_schema`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from icefall.api.schema import MAX_NESTING_DEPTH, SchemaField, TypeSpec

if TYPE_CHECKING:
    from google.protobuf.descriptor_pb2 import DescriptorProto, FieldDescriptorProto, FileDescriptorSet


class ProtobufSchemaError(ValueError):
    """The Protobuf schema cannot become a table schema; the message names the field and why."""


# FieldDescriptorProto.Type numbers (descriptor.proto)
_DOUBLE, _FLOAT, _INT64, _UINT64, _INT32, _FIXED64, _FIXED32, _BOOL, _STRING = 1, 2, 3, 4, 5, 6, 7, 8, 9
_GROUP, _MESSAGE, _BYTES, _UINT32, _ENUM, _SFIXED32, _SFIXED64, _SINT32, _SINT64 = range(10, 19)
_LABEL_REQUIRED, _LABEL_REPEATED = 2, 3
_SCALARS = {
    _DOUBLE: "double",
    _FLOAT: "float",
    _INT64: "long",
    _UINT64: "long",
    _INT32: "int",
    _FIXED64: "long",
    _FIXED32: "long",
    _BOOL: "boolean",
    _STRING: "string",
    _BYTES: "binary",
    _UINT32: "long",
    _ENUM: "string",
    _SFIXED32: "int",
    _SFIXED64: "long",
    _SINT32: "int",
    _SINT64: "long",
}
#: Well-known message types that are one value in a record.
WRAPPERS = {
    ".google.protobuf.DoubleValue": "double",
    ".google.protobuf.FloatValue": "float",
    ".google.protobuf.Int64Value": "long",
    ".google.protobuf.UInt64Value": "long",
    ".google.protobuf.Int32Value": "int",
    ".google.protobuf.UInt32Value": "long",
    ".google.protobuf.BoolValue": "boolean",
    ".google.protobuf.StringValue": "string",
    ".google.protobuf.BytesValue": "binary",
    ".google.protobuf.Timestamp": "timestamptz",
}


def descriptor_set(text: str) -> FileDescriptorSet:
    """The `FileDescriptorSet` of base64 `text`."""
    from google.protobuf.descriptor_pb2 import FileDescriptorSet
    from google.protobuf.message import DecodeError

    try:
        return FileDescriptorSet.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, DecodeError, ValueError) as error:
        raise ProtobufSchemaError(f"the schema is not a serialized FileDescriptorSet: {error}") from error


class _Index:
    """The messages of a descriptor set by full name (with a leading dot, as `type_name` spells them)."""

    def __init__(self, files: FileDescriptorSet) -> None:
        if not files.file:
            raise ProtobufSchemaError("the Protobuf schema holds no file")
        self.main = files.file[-1]
        self.messages: dict[str, DescriptorProto] = {}
        for file in files.file:
            prefix = f".{file.package}" if file.package else ""
            for message in file.message_type:
                self._add(prefix, message)

    def _add(self, prefix: str, message: DescriptorProto) -> None:
        name = f"{prefix}.{message.name}"
        self.messages[name] = message
        for nested in message.nested_type:
            self._add(name, nested)

    def top_level(self) -> list[str]:
        """The full names (without the leading dot) of the main file's messages, in order."""
        prefix = f"{self.main.package}." if self.main.package else ""
        return [f"{prefix}{m.name}" for m in self.main.message_type]


def message_name(text: str, indexes: Sequence[int]) -> str | None:
    """The full name of the message of the schema's main file that a record's message index names
    ([0]: its first message; [1, 0]: the first nested message of the second); None when there is none."""
    main = _Index(descriptor_set(text)).main
    if not indexes:
        return None
    names = [main.package] if main.package else []
    messages: Sequence[DescriptorProto] = main.message_type
    for index in indexes:
        if not 0 <= index < len(messages):
            return None
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join(names)


def table_message(text: str, record_name: str | None) -> str:
    """The message the table holds: `record_name` (the record and topic-record strategies), or the first
    message of the schema's main file."""
    index = _Index(descriptor_set(text))
    if record_name is not None:
        if f".{record_name}" not in index.messages:
            raise ProtobufSchemaError(
                f"the Protobuf schema has no message {record_name} (spec.format.registry.recordName); it has "
                + ", ".join(index.top_level())
            )
        return record_name
    names = index.top_level()
    if not names:
        raise ProtobufSchemaError("the Protobuf schema's file declares no message; a table needs one")
    return names[0]


def fields_from_protobuf(text: str, record_name: str | None = None) -> list[SchemaField]:
    """The table fields of the message `table_message(text, record_name)` of the schema `text`."""
    index = _Index(descriptor_set(text))
    name = table_message(text, record_name)
    return _Mapper(index).fields(index.messages[f".{name}"], prefix="", depth=0)


class _Mapper:
    def __init__(self, index: _Index) -> None:
        self.index = index

    def fields(self, message: DescriptorProto, *, prefix: str, depth: int) -> list[SchemaField]:
        if not message.field:
            raise ProtobufSchemaError(
                f"field '{prefix.rstrip('.') or message.name}': message {message.name} has no fields; a "
                "struct needs one"
            )
        if depth > MAX_NESTING_DEPTH:
            raise ProtobufSchemaError(
                f"field '{prefix.rstrip('.')}': messages nest deeper than {MAX_NESTING_DEPTH} levels (a "
                "recursive message?); a table cannot hold it"
            )
        return [self.field(f, path=f"{prefix}{f.name}", depth=depth) for f in message.field]

    def field(self, field: FieldDescriptorProto, *, path: str, depth: int) -> SchemaField:
        entry = self._map_entry(field)
        if entry is not None:
            key, value = entry.field[0], entry.field[1]
            key_type = self.type(key, f"{path}{{}}", depth)  # checked, though JSON keys are strings
            del key_type
            data: dict[str, Any] = {
                "type": "map",
                "key": TypeSpec(type="string"),
                "value": TypeSpec.model_validate(self.type(value, f"{path}{{}}", depth)),
                "valueRequired": True,
            }
            required = True
        elif field.label == _LABEL_REPEATED:
            data = {
                "type": "list",
                "element": TypeSpec.model_validate(self.type(field, f"{path}[]", depth)),
                "elementRequired": True,
            }
            required = True
        else:
            data = self.type(field, path, depth)
            required = field.label == _LABEL_REQUIRED or not _has_presence(field, self.index.main.syntax)
        return SchemaField.model_validate({"name": field.name, "required": required, **data})

    def _map_entry(self, field: FieldDescriptorProto) -> DescriptorProto | None:
        if field.label != _LABEL_REPEATED or field.type != _MESSAGE:
            return None
        message = self.index.messages.get(field.type_name)
        return message if message is not None and message.options.map_entry else None

    def type(self, field: FieldDescriptorProto, path: str, depth: int) -> dict[str, Any]:
        """The type of one value of `field` (an element, for a repeated field)."""
        if field.type in _SCALARS:
            return {"type": _SCALARS[field.type]}
        if field.type not in (_MESSAGE, _GROUP):
            raise ProtobufSchemaError(f"field '{path}': Protobuf type {field.type} is not supported")
        if field.type_name in WRAPPERS:
            return {"type": WRAPPERS[field.type_name]}
        if field.type_name.startswith(".google.protobuf."):
            raise ProtobufSchemaError(
                f"field '{path}': {field.type_name[1:]} has no column type; use a message of your own"
            )
        message = self.index.messages.get(field.type_name)
        if message is None:
            raise ProtobufSchemaError(
                f"field '{path}': message {field.type_name[1:]} is not in the schema (an import that is not "
                "a well-known type?)"
            )
        return {"type": "struct", "fields": self.fields(message, prefix=f"{path}.", depth=depth + 1)}


def _has_presence(field: FieldDescriptorProto, syntax: str) -> bool:
    """Whether an unset value of a singular field is told apart from its default (then it may be null)."""
    if field.type in (_MESSAGE, _GROUP) or field.HasField("oneof_index") or field.proto3_optional:
        return True
    return syntax != "proto3"  # proto2 (and editions' default): explicit presence
