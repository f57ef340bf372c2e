"""Decode Confluent-framed Protobuf records: `spec.format.type: protobuf`.

A record's value is magic byte 0, the 4-byte schema id, the message index (zig-zag varints: a count, then
that many indexes into the schema's messages and their nested ones; the single byte 0 means [0], the first
message), then the Protobuf binary of that message. `payload(writers)` is a column of struct<json string,
problem string>: the message as JSON text, which the JSON path of `icefall.ingest.decode` then reads
into the table's fields with its own checks and reasons, or why it cannot be read:
`the message index after the schema id does not parse (...)`, `message index [3] names no message of
schema id 7`, `bytes do not decode as protobuf message shop.Order of schema id 7`.

How a message becomes JSON (what `icefall.api.protobuf_schema` maps to columns): fields by their .proto
names; a field with presence that is unset is absent (null), a field without presence always has its
value (proto3 defaults included); enums by name (an unknown number as its number); bytes as base64;
64-bit integers as JSON numbers; Timestamp as RFC 3339 text; wrappers as their value; maps as objects.

Not guaranteed: the decoding runs in a Python UDF (spark-protobuf's `from_protobuf` is not served by the
package registry this project builds from), so each record crosses to a Python worker and back: slower
than the JVM decoders of Avro and JSON. Bytes that happen to parse as the message (Protobuf has no
checksum, and unknown fields are skipped) are taken as that message. Schema references other than the
well-known types are not supported (`icefall.kafka.protobuf`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F  # noqa: N812 - the usual name

from icefall.ingest.framing import HEADER_BYTES, SCHEMA_ID_COLUMN

#: The column `payload` adds: struct<json string, problem string>.
PAYLOAD_COLUMN = "__icefall_protobuf"
PAYLOAD_TYPE = "struct<json: string, problem: string>"


def payload(writers: Mapping[int, str | None]) -> Column:
    """`PAYLOAD_COLUMN` of the records of a batch with `writers` (schema id → base64 descriptor set, from
    `icefall.kafka.registry.WriterSchemas`): null where the id is unknown or the frame is wrong."""
    known = {i: text for i, text in writers.items() if text is not None}

    def decode(value: bytes | None, schema_id: int | None) -> tuple[str | None, str | None] | None:
        if value is None or schema_id is None or schema_id not in known:
            return None
        return to_json(known[schema_id], schema_id, bytes(value))

    udf = F.udf(decode, PAYLOAD_TYPE, useArrow=False)  # Arrow would need pandas
    return udf(F.col("value"), F.col(SCHEMA_ID_COLUMN)).alias(PAYLOAD_COLUMN)


def to_json(schema: str, schema_id: int, value: bytes) -> tuple[str | None, str | None]:
    """(the JSON text of the framed record `value`, None) or (None, why it does not decode)."""
    from google.protobuf.message import DecodeError

    indexes, end = message_index(value, HEADER_BYTES)
    if indexes is None:
        return None, (
            "the message index after the schema id does not parse (Confluent's wire format: a count, then "
            "that many indexes, zig-zag varints)"
        )
    name = _message_name(schema, tuple(indexes))
    if name is None:
        return None, f"message index {indexes} names no message of schema id {schema_id}"
    try:
        message = _message_class(schema, name).FromString(value[end:])
    except (DecodeError, ValueError, RuntimeError):
        return None, f"bytes do not decode as protobuf message {name} of schema id {schema_id}"
    return json.dumps(_message(message), ensure_ascii=False), None


def message_index(value: bytes, start: int) -> tuple[list[int] | None, int]:
    """The message index at `start` of `value` and where the message begins; (None, start) when it does
    not parse. A count of 0 means [0]."""
    count, at = _zigzag(value, start)
    if count is None or count < 0 or count > 100:
        return None, start
    if count == 0:
        return [0], at
    indexes = []
    for _ in range(count):
        index, at = _zigzag(value, at)
        if index is None or index < 0:
            return None, start
        indexes.append(index)
    return indexes, at


def _zigzag(value: bytes, at: int) -> tuple[int | None, int]:
    result = shift = 0
    while at < len(value) and shift < 64:
        byte = value[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7
    return None, at


@lru_cache(maxsize=1024)
def _message_name(schema: str, indexes: tuple[int, ...]) -> str | None:
    from icefall.api.protobuf_schema import message_name

    return message_name(schema, indexes)


@lru_cache(maxsize=256)
def _message_class(schema: str, name: str) -> Any:
    """The message class of `name` in the descriptor set `schema` (cached per Python worker)."""
    from google.protobuf import descriptor_pool, message_factory

    from icefall.api.protobuf_schema import descriptor_set

    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_set(schema).file:
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = frozenset(
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
)


def _message(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.is_repeated:
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                value_field = entry.fields_by_name["value"]
                out[field.name] = {_key(k): _single(value_field, v) for k, v in value.items()}
            else:
                out[field.name] = [_single(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            continue
        else:
            out[field.name] = _single(field, value)
    return out


def _key(key: Any) -> str:
    return ("true" if key else "false") if isinstance(key, bool) else str(key)


def _single(field: Any, value: Any) -> Any:
    if field.enum_type is not None:
        number = field.enum_type.values_by_number.get(value)
        return number.name if number is not None else value
    if field.message_type is not None:
        full_name = field.message_type.full_name
        if full_name == _TIMESTAMP:
            return value.ToJsonString()
        if full_name in _WRAPPERS:
            inner = value.value
            return base64.b64encode(inner).decode("ascii") if isinstance(inner, bytes) else inner
        return _message(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value
