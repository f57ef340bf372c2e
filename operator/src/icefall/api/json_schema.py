"""The table's schema from a JSON Schema document (a registry's schema for `spec.format.type: jsonSchema`).

`fields_from_json_schema` maps an object schema to `spec.format.schema` fields, the way the JSON decoder
(`icefall.decode.decode`, Spark's `from_json`) reads the records that follow it:
- each of `properties`, in order, is a field; `title` or `description` is its doc; a field is required
  when `required` lists it and its type does not admit null;
- null is admitted by `type: [X, "null"]`, or a `oneOf`/`anyOf` of `{type: null}` and one other schema;
- string → string, with `format` date-time → timestamptz, date → date, uuid → uuid; integer → long;
  number → double; boolean → boolean; a string `enum` → string; array → list of its `items`; an object
  with `properties` → struct; an object with only `additionalProperties: {schema}` → map with string keys;
- `$ref` to `#/definitions/...` or `#/$defs/...` of the same document is followed.

Refused with a message naming the field: a type union of several non-null types, a property with no type
(`{}` or `true`), an object with neither `properties` nor an `additionalProperties` schema (e.g.
`patternProperties` only), `allOf`, `$ref`s elsewhere (another document, a path outside the definitions),
references that loop deeper than the table can nest.

Pure: no I/O, no pyspark, no JSON Schema library. Field ids are assigned by `to_iceberg_schema`.
"""

from __future__ import annotations

import json
from typing import Any

from icefall.api.schema import MAX_NESTING_DEPTH, SchemaField, TypeSpec


class JsonSchemaError(ValueError):
    """The JSON Schema cannot become a table schema; the message names the field and why."""


_SCALARS = {"integer": "long", "number": "double", "boolean": "boolean", "string": "string"}
_STRING_FORMATS = {"date-time": "timestamptz", "date": "date", "uuid": "uuid"}
_REF_PREFIXES = ("#/definitions/", "#/$defs/")


def fields_from_json_schema(text: str) -> list[SchemaField]:
    """The table fields of the JSON Schema object schema `text`."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise JsonSchemaError(f"the registry schema is not JSON: {error}") from error
    if not isinstance(document, dict):
        raise JsonSchemaError(
            "the registry schema is not a JSON Schema object schema; a table needs an object"
        )
    mapper = _Mapper(document)
    root, _ = mapper.unwrap_null(document, "the schema", depth=0)
    if _kind(root) != "object" or not isinstance(root.get("properties"), dict) or not root["properties"]:
        raise JsonSchemaError(
            "the registry schema is not an object schema with properties; a table needs "
            '{"type": "object", "properties": {...}}'
        )
    return mapper.fields(root, prefix="", depth=0)


def _kind(schema: dict[str, Any]) -> str | None:
    """The schema's single type name (type may be absent for an object with properties, or a string
    enum)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if kind is None and ("properties" in schema or "additionalProperties" in schema):
        return "object"
    enum = schema.get("enum")
    if kind is None and isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "string"
    return None


class _Mapper:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def resolve(self, schema: Any, path: str, depth: int) -> Any:
        """`schema` with its `$ref` (to this document's definitions) followed."""
        seen = 0
        while isinstance(schema, dict) and "$ref" in schema:
            ref = schema["$ref"]
            prefix = next((p for p in _REF_PREFIXES if isinstance(ref, str) and ref.startswith(p)), None)
            if prefix is None:
                raise JsonSchemaError(
                    f"field '{path}': $ref {ref!r} is not to #/definitions/ or #/$defs/ of the same schema; "
                    "define the type in the schema"
                )
            seen += 1
            if seen > MAX_NESTING_DEPTH or depth > MAX_NESTING_DEPTH:
                raise JsonSchemaError(
                    f"field '{path}': $ref {ref!r} nests deeper than {MAX_NESTING_DEPTH} levels (a recursive "
                    "type?); a table cannot hold it"
                )
            container = self.document.get(prefix[2:-1])
            name = ref[len(prefix) :].replace("~1", "/").replace("~0", "~")
            if not isinstance(container, dict) or name not in container:
                raise JsonSchemaError(f"field '{path}': $ref {ref!r} names no definition of the schema")
            schema = container[name]
        return schema

    def unwrap_null(self, schema: Any, path: str, *, depth: int) -> tuple[dict[str, Any], bool]:
        """(the schema without null, required): null comes from a type list or a oneOf/anyOf branch."""
        schema = self.resolve(schema, path, depth)
        if not isinstance(schema, dict) or not schema:
            raise JsonSchemaError(
                f"field '{path}': {json.dumps(schema)} admits any value and has no column type; "
                "give it a type"
            )
        kind = schema.get("type")
        if isinstance(kind, list):
            others = [t for t in kind if t != "null"]
            if len(others) != 1:
                raise JsonSchemaError(
                    f"field '{path}': a union of {len(others)} non-null types "
                    f"({', '.join(map(str, others))}) has no single column type; use one type, or one type "
                    "and null"
                )
            return {**schema, "type": others[0]}, len(others) == len(kind)
        for key in ("oneOf", "anyOf"):
            if key in schema:
                branches = schema[key]
                if not isinstance(branches, list):
                    raise JsonSchemaError(f"field '{path}': {key} is not a list")
                resolved = [self.resolve(b, path, depth) for b in branches]
                others = [b for b in resolved if not (isinstance(b, dict) and b.get("type") == "null")]
                if len(others) != 1:
                    raise JsonSchemaError(
                        f"field '{path}': {key} of {len(others)} non-null schemas has no single column type; "
                        "use null and one schema"
                    )
                inner, required = self.unwrap_null(others[0], path, depth=depth)
                return inner, required and len(others) == len(resolved)
        if kind == "null":
            raise JsonSchemaError(
                f"field '{path}': type null holds no value; remove the field or give it a type"
            )
        if "allOf" in schema:
            raise JsonSchemaError(f"field '{path}': allOf is not supported; write the merged schema instead")
        return schema, True

    def fields(self, schema: dict[str, Any], *, prefix: str, depth: int) -> list[SchemaField]:
        required = schema.get("required", [])
        required_names = set(required) if isinstance(required, list) else set()
        return [
            self.field(name, sub, path=f"{prefix}{name}", listed=name in required_names, depth=depth + 1)
            for name, sub in schema["properties"].items()
        ]

    def field(self, name: str, schema: Any, *, path: str, listed: bool, depth: int) -> SchemaField:
        inner, non_null = self.unwrap_null(schema, path, depth=depth)
        data: dict[str, Any] = {
            "name": name,
            "required": listed and non_null,
            **self.type(inner, path, depth),
        }
        doc = inner.get("description") or inner.get("title")
        if isinstance(doc, str) and doc:
            data["doc"] = doc[:1024]
        return SchemaField.model_validate(data)

    def type(self, schema: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        """The `type` (and nested parts) of a field or `TypeSpec` for a schema that admits no null."""
        kind = _kind(schema)
        if kind == "string":
            fmt = schema.get("format")
            return {"type": _STRING_FORMATS.get(fmt, "string") if isinstance(fmt, str) else "string"}
        if kind in _SCALARS:
            return {"type": _SCALARS[kind]}
        if kind == "array":
            items = schema.get("items")
            if items is None:
                raise JsonSchemaError(
                    f"field '{path}': an array without items has no element type; add items"
                )
            element, required = self.unwrap_null(items, f"{path}[]", depth=depth + 1)
            return {
                "type": "list",
                "element": TypeSpec.model_validate(self.type(element, f"{path}[]", depth + 1)),
                "elementRequired": required,
            }
        if kind == "object":
            return self.object(schema, path, depth)
        raise JsonSchemaError(
            f"field '{path}': {json.dumps(schema)[:100]} has no column type; give it one of the types "
            "string, integer, number, boolean, array, object"
        )

    def object(self, schema: dict[str, Any], path: str, depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        if isinstance(properties, dict) and properties:
            return {"type": "struct", "fields": self.fields(schema, prefix=f"{path}.", depth=depth)}
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values:
            value, required = self.unwrap_null(values, f"{path}{{}}", depth=depth + 1)
            return {
                "type": "map",
                "key": TypeSpec(type="string"),
                "value": TypeSpec.model_validate(self.type(value, f"{path}{{}}", depth + 1)),
                "valueRequired": required,
            }
        shape = "patternProperties only" if "patternProperties" in schema else "no properties"
        raise JsonSchemaError(
            f"field '{path}': an object with {shape} has no columns; declare its properties, or "
            "additionalProperties: {type: ...} for a map with string keys"
        )
