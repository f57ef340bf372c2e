"""The table's schema from an Avro record schema (a registry's latest schema for `spec.format.type: avro`).

`fields_from_avro` maps an Avro record schema (JSON text) to `spec.format.schema` fields, the way
spark-avro's `from_avro` reads the same schema, so the decoded rows fit the table:
- names and `doc`s are kept; a field is required unless its type is a union with null (or null itself);
- primitives: boolean, int, long, float, double, string; bytes → binary; fixed(N) → fixed[N];
- logical types: decimal(P,S) (on bytes or fixed) → decimal(P,S); date → date; timestamp-millis and
  timestamp-micros → timestamptz; local-timestamp-millis/micros → timestamp; uuid → uuid;
- enum → string; record → struct; array → list; map → map with string keys.

Refused with a message naming the field: unions of several non-null types, time-millis/time-micros (the
Iceberg Spark runtime cannot write `time`), nesting deeper than `MAX_NESTING_DEPTH`.

`row_schema` is the row record of a Debezium change event's Avro envelope (`spec.mode: cdc`): the record
of its `after` field (or `before`), a named reference resolved, as a schema of its own; the table's columns
come from it, not from the envelope.

Pure: no I/O, no pyspark. Field ids are not chosen here: `to_iceberg_schema` assigns them at creation.
"""

from __future__ import annotations

import json
from typing import Any

from icefall.api.schema import SchemaField, TypeSpec


class AvroSchemaError(ValueError):
    """The Avro schema cannot become a table schema; the message names the field and why."""


def fields_from_avro(text: str) -> list[SchemaField]:
    """The table fields of the Avro record schema `text`."""
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise AvroSchemaError(f"the registry schema is not JSON: {error}") from error
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise AvroSchemaError("the registry schema is not an Avro record; a table needs a record")
    return [_field(f, path=str(f.get("name"))) for f in parsed.get("fields", [])]


#: The fields of a Debezium envelope that hold the row.
IMAGE_FIELDS = ("after", "before")


def row_schema(text: str) -> str:
    """The row record of the Debezium envelope `text` (JSON text of an Avro record with `op`, `before` and
    `after`), as the JSON text of a record schema: the type of `after`, or of `before`, a nullable union
    unwrapped and a reference to a record named elsewhere in the envelope resolved."""
    try:
        envelope = json.loads(text)
    except ValueError as error:
        raise AvroSchemaError(f"the registry schema is not JSON: {error}") from error
    record = envelope_row(envelope)
    if record is None:
        raise AvroSchemaError(
            "the registry schema is not a Debezium change event envelope (a record with op, and before "
            "or after holding the row's record); mode cdc needs one"
        )
    return json.dumps(record)


def envelope_row(envelope: Any) -> dict[str, Any] | None:
    """The row record (a parsed Avro record schema) of a parsed Debezium envelope; None when `envelope` is
    not a record with an `op` field and a record in `after` or `before`."""
    if not isinstance(envelope, dict) or envelope.get("type") != "record":
        return None
    fields = {f.get("name"): f for f in envelope.get("fields", []) if isinstance(f, dict)}
    if "op" not in fields:
        return None
    named = named_records(envelope)
    for name in IMAGE_FIELDS:
        if name not in fields:
            continue
        kind = fields[name].get("type")
        if isinstance(kind, list):
            others = [t for t in kind if t != "null"]
            kind = others[0] if len(others) == 1 else None
        if isinstance(kind, str):
            kind = named.get(kind)
        if isinstance(kind, dict) and kind.get("type") == "record":
            return kind
    return None


def named_records(schema: Any, namespace: str = "") -> dict[str, dict[str, Any]]:
    """Every record defined in the parsed Avro `schema`, by its name and by its full name."""
    found: dict[str, dict[str, Any]] = {}
    if isinstance(schema, list):
        for branch in schema:
            found.update(named_records(branch, namespace))
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record" and isinstance(schema.get("name"), str):
            name = schema["name"]
            space = schema.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
            found[name.rsplit(".", 1)[-1]] = schema
            found[f"{space}.{name.rsplit('.', 1)[-1]}" if space else name] = schema
            for field in schema.get("fields", []):
                if isinstance(field, dict):
                    found.update(named_records(field.get("type"), space))
        elif kind in ("array", "map"):
            found.update(named_records(schema.get("items", schema.get("values")), namespace))
        elif isinstance(kind, dict | list):
            found.update(named_records(kind, namespace))
    return found


def _field(field: dict[str, Any], *, path: str) -> SchemaField:
    avro_type, required = _unwrap_null(field.get("type"), path)
    spec = _type(avro_type, path)
    data: dict[str, Any] = {"name": field["name"], "required": required, **spec}
    if isinstance(field.get("doc"), str) and field["doc"]:
        data["doc"] = field["doc"][:1024]
    return SchemaField.model_validate(data)


def _unwrap_null(avro_type: Any, path: str) -> tuple[Any, bool]:
    """(the type without null, required)."""
    if isinstance(avro_type, list):
        others = [t for t in avro_type if t != "null"]
        if len(others) != 1:
            raise AvroSchemaError(
                f"field '{path}': a union of {len(others)} non-null types has no single column type; "
                "use a union of null and one type"
            )
        return others[0], len(others) == len(avro_type)
    if avro_type == "null":
        raise AvroSchemaError(f"field '{path}': type null holds no value; remove the field or give it a type")
    return avro_type, True


_PRIMITIVES = {
    "boolean": "boolean",
    "int": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "bytes": "binary",
}
_LOGICAL = {
    "date": "date",
    "timestamp-millis": "timestamptz",
    "timestamp-micros": "timestamptz",
    "local-timestamp-millis": "timestamp",
    "local-timestamp-micros": "timestamp",
    "uuid": "uuid",
}


def _type(avro_type: Any, path: str) -> dict[str, Any]:  # noqa: C901 (one branch per Avro type)
    """The `type` (and nested parts) of a schema field or `TypeSpec` for a non-null Avro type."""
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return {"type": _PRIMITIVES[avro_type]}
        raise AvroSchemaError(
            f"field '{path}': type {avro_type!r} is a named reference; define the type inline in the record"
        )
    if not isinstance(avro_type, dict):
        raise AvroSchemaError(f"field '{path}': {avro_type!r} is not an Avro type")
    kind, logical = avro_type.get("type"), avro_type.get("logicalType")
    if logical == "decimal":
        return {"type": f"decimal({int(avro_type['precision'])},{int(avro_type.get('scale', 0))})"}
    if logical in ("time-millis", "time-micros"):
        raise AvroSchemaError(
            f"field '{path}': {logical} has no column type the Iceberg Spark runtime writes; use a long"
        )
    if logical in _LOGICAL:
        return {"type": _LOGICAL[logical]}
    if kind == "enum":
        return {"type": "string"}
    if kind == "fixed":
        return {"type": f"fixed[{int(avro_type['size'])}]"}
    if kind == "record":
        return {
            "type": "struct",
            "fields": [_field(f, path=f"{path}.{f.get('name')}") for f in avro_type.get("fields", [])],
        }
    if kind == "array":
        element, required = _unwrap_null(avro_type.get("items"), f"{path}[]")
        return {
            "type": "list",
            "element": TypeSpec.model_validate(_type(element, f"{path}[]")),
            "elementRequired": required,
        }
    if kind == "map":
        value, required = _unwrap_null(avro_type.get("values"), f"{path}{{}}")
        return {
            "type": "map",
            "key": TypeSpec(type="string"),
            "value": TypeSpec.model_validate(_type(value, f"{path}{{}}")),
            "valueRequired": required,
        }
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return {"type": _PRIMITIVES[kind]}
    raise AvroSchemaError(f"field '{path}': Avro type {kind!r} is not supported")
