"""Decode Confluent-framed Protobuf records: `spec.format.type: protobuf`.

A record's value is magic byte 0, the 4-byte schema id, the message index (zig-zag varints: a count, then
that many indexes into the schema's messages and their nested ones; the single byte 0 means [0], the first
message), then the Protobuf binary of that message. `payload(writers)` is a column of struct<json string,
problem string>: the message as JSON text, which the JSON path of `icefall.decode.decode` then reads
into the table's fields with its own checks and reasons, or why it cannot be read:
`the message index after the schema id does not parse (...)`, `message index [3] names no message of
schema id 7`, `bytes do not decode as protobuf message shop.Order of schema id 7`.

How a message becomes JSON (what `icefall.api.protobuf_schema` maps to columns): fields by their .proto
names; a field with presence that is unset is absent (null), a field without presence always has its
value (proto3 defaults included); enums by name (an unknown number as its number); bytes as base64;
64-bit integers as JSON numbers; Timestamp as RFC 3339 text; wrappers as their value; maps as objects.

How it runs: in PySpark's Python workers (spark-protobuf's `from_protobuf` is not served by the package
registry this project builds from), as an Arrow UDF: one call per Arrow batch of records (pyarrow arrays in
and out, no pickled row per record), each message parsed by protobuf's C parser (upb) and walked by a plan
made once per message type and worker. A message that does not turn into JSON (a Timestamp outside
0001-9999) is a dead letter like bytes that do not decode, never a failed batch.

Not guaranteed: the walk and the JSON text are per-record Python: a batch of Protobuf records costs about
twice the CPU of the same records as Avro or JSON, decoded in the JVM (bench/results/protobuf.md). The
driver of a Protobuf table loads pyarrow (PySpark checks an Arrow UDF's return type with it; ~29 MiB of
RSS, bench/results/memory.md), which the drivers of other formats need not. Bytes that happen to parse as
the message (Protobuf has no checksum, and unknown fields are skipped) are taken as that message. Schema
references other than the well-known types are not supported (`icefall.kafka.protobuf`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F  # noqa: N812 - the usual name
from pyspark.sql.pandas.functions import arrow_udf  # pyarrow only (the name says pandas; pandas is not used)

from icefall.decode.framing import HEADER_BYTES, SCHEMA_ID_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa

#: The column `payload` adds: struct<json string, problem string>.
PAYLOAD_COLUMN = "__icefall_protobuf"
PAYLOAD_TYPE = "struct<json: string, problem: string>"


def payload(writers: Mapping[int, str | None]) -> Column:
    """`PAYLOAD_COLUMN` of the records of a batch with `writers` (schema id → base64 descriptor set, from
    `icefall.kafka.registry.WriterSchemas`): null where the id is unknown or the frame is wrong."""
    known = {i: text for i, text in writers.items() if text is not None}
    # An Arrow UDF: one call per Arrow batch of records (`spark.sql.execution.arrow.maxRecordsPerBatch`),
    # not a pickled row each way per record (bench/results/protobuf.md). A lambda has no annotations, so
    # PySpark takes it as the scalar kind (pyarrow arrays in, one out), with no pandas (which
    # `F.udf(useArrow=True)` needs) and no functionType (which its stubs ask for, and it warns about).
    udf = arrow_udf(lambda values, ids: decode_batch(known, values, ids), PAYLOAD_TYPE)  # type: ignore[call-overload]
    column: Column = udf(F.col("value"), F.col(SCHEMA_ID_COLUMN)).alias(PAYLOAD_COLUMN)
    return column


def decode_batch(known: Mapping[int, str], values: pa.Array, ids: pa.Array) -> pa.Array:
    """`PAYLOAD_TYPE`'s struct array of one batch: `to_json` of each value (bytes) whose schema id (int)
    is in `known`; a null struct where the value or id is null or the id unknown."""
    import pyarrow as pa

    texts: list[str | None] = []
    problems: list[str | None] = []
    nulls: list[bool] = []
    for value, schema_id in zip(values.to_pylist(), ids.to_pylist(), strict=True):
        schema = known.get(schema_id) if value is not None and schema_id is not None else None
        if schema is None:
            texts.append(None)
            problems.append(None)
            nulls.append(True)
            continue
        text, problem = to_json(schema, schema_id, value)
        texts.append(text)
        problems.append(problem)
        nulls.append(False)
    return pa.StructArray.from_arrays(
        [pa.array(texts, pa.string()), pa.array(problems, pa.string())],
        names=["json", "problem"],
        mask=pa.array(nulls, pa.bool_()),
    )


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
        # ValueError here: a Timestamp outside 0001-9999 or with nanos out of range (no RFC 3339 text)
        return _ENCODE(_message_plan(schema, name)(message)), None
    except (DecodeError, ValueError, RuntimeError):
        return None, f"bytes do not decode as protobuf message {name} of schema id {schema_id}"


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


#: `json.dumps(..., ensure_ascii=False)` without building an encoder per record.
_ENCODE = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode
_TIMESTAMP = "google.protobuf.Timestamp"
_WRAPPERS = frozenset(
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
)
_TYPE_BYTES = 12  # FieldDescriptor.TYPE_BYTES
_TYPE_BOOL = 8  # FieldDescriptor.TYPE_BOOL
_TYPE_STRING = 9  # FieldDescriptor.TYPE_STRING

#: A field's value (as the message gives it) → its JSON value; None where it is the value itself.
Convert = Callable[[Any], Any] | None


class _Plan:
    """How the messages of one descriptor become JSON objects, worked out once per descriptor (per Python
    worker) rather than per field of each record: per field its name, its converter, and whether it has
    presence (then it is left out when unset)."""

    __slots__ = ("fields",)

    def __init__(self) -> None:
        self.fields: list[tuple[str, Convert, bool]] = []

    def __call__(self, message: Any) -> dict[str, Any]:
        out = {}
        has = message.HasField
        for name, convert, presence in self.fields:
            if presence and not has(name):
                continue
            value = getattr(message, name)  # 3x faster than ListFields() here (upb, protobuf 7)
            out[name] = value if convert is None else convert(value)
        return out


@lru_cache(maxsize=256)
def _message_plan(schema: str, name: str) -> _Plan:
    """The `_Plan` of message `name` of the descriptor set `schema` (cached per Python worker)."""
    return _plan(_message_class(schema, name).DESCRIPTOR, {})


def _plan(descriptor: Any, plans: dict[str, _Plan]) -> _Plan:
    """The `_Plan` of a message descriptor, from `plans` (those of one schema, by full name) or made and
    put there before its fields are filled: a message that holds itself, directly or not, finds its own."""
    plan = plans.get(descriptor.full_name)
    if plan is None:
        plan = plans[descriptor.full_name] = _Plan()
        plan.fields = [
            (field.name, _field(field, plans), not field.is_repeated and field.has_presence)
            for field in descriptor.fields
        ]
    return plan


def _field(field: Any, plans: dict[str, _Plan]) -> Convert:
    """A field's converter: maps as objects, repeated fields as lists, else `_single`."""
    entry = field.message_type
    if field.is_repeated and entry is not None and entry.GetOptions().map_entry:
        key = _map_key(entry.fields_by_name["key"])
        value = _single(entry.fields_by_name["value"], plans)
        return lambda items: {_apply(key, k): _apply(value, v) for k, v in items.items()}
    single = _single(field, plans)
    if field.is_repeated:
        return list if single is None else (lambda items: [single(v) for v in items])
    return single


def _apply(convert: Convert, value: Any) -> Any:
    return value if convert is None else convert(value)


def _map_key(field: Any) -> Convert:
    """JSON object keys are text: bool keys as true/false, integer keys as their digits."""
    if field.type == _TYPE_STRING:
        return None
    if field.type == _TYPE_BOOL:
        return lambda key: "true" if key else "false"
    return str


def _single(field: Any, plans: dict[str, _Plan]) -> Convert:
    """The converter of one value of `field` (an element of a repeated field)."""
    if field.enum_type is not None:
        names = {number: value.name for number, value in field.enum_type.values_by_number.items()}
        return lambda number: names.get(number, number)  # an unknown number stays a number
    if field.message_type is not None:
        full_name = field.message_type.full_name
        if full_name == _TIMESTAMP:
            return lambda timestamp: timestamp.ToJsonString()
        if full_name in _WRAPPERS:
            if full_name == "google.protobuf.BytesValue":
                return lambda wrapper: _base64(wrapper.value)
            return lambda wrapper: wrapper.value
        return _plan(field.message_type, plans)
    if field.type == _TYPE_BYTES:
        return _base64
    return None


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")
