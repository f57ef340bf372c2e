"""The inline schema (`spec.format.schema`) as Spark sees it: a DDL string (`to_spark_ddl`) and Spark's JSON
schema (`to_spark_schema_json`, `to_spark_schema_string`), which `from_json` and the Kafka decoders take.

Refused (`ValueError`): types Spark cannot write to an Iceberg table (`time`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from icefall.api.schema import TIME_UNSUPPORTED_MESSAGE, ParsedType, SchemaField, TypeNode

_SPARK_DDL = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "date": "DATE",
    "timestamp": "TIMESTAMP_NTZ",
    "timestamptz": "TIMESTAMP",
    "string": "STRING",
    "uuid": "STRING",
    "binary": "BINARY",
    "fixed": "BINARY",
}
_SPARK_JSON = {
    "boolean": "boolean",
    "int": "integer",
    "long": "long",
    "float": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp_ntz",
    "timestamptz": "timestamp",
    "string": "string",
    "uuid": "string",
    "binary": "binary",
    "fixed": "binary",
}


def _spark_unsupported(parsed: ParsedType) -> ValueError:
    return ValueError(f"Spark has no type for Iceberg {parsed}: {TIME_UNSUPPORTED_MESSAGE}")


def _quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _quote_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ddl_field(field: SchemaField, *, separator: str) -> str:
    out = f"{_quote_ident(field.name)}{separator}{_ddl_type(field)}"
    if field.required:
        out += " NOT NULL"
    if field.doc:
        out += f" COMMENT {_quote_string(field.doc)}"
    return out


def _ddl_type(node: TypeNode) -> str:
    parsed = node.parsed
    if parsed.name == "struct":
        assert node.fields is not None
        return "STRUCT<" + ", ".join(_ddl_field(f, separator=": ") for f in node.fields) + ">"
    if parsed.name == "list":
        assert node.element is not None
        return f"ARRAY<{_ddl_type(node.element)}>"
    if parsed.name == "map":
        assert node.key is not None and node.value is not None
        return f"MAP<{_ddl_type(node.key)}, {_ddl_type(node.value)}>"
    if parsed.name == "decimal":
        return f"DECIMAL({parsed.precision},{parsed.scale})"
    if parsed.name not in _SPARK_DDL:
        raise _spark_unsupported(parsed)
    return _SPARK_DDL[parsed.name]


def to_spark_ddl(fields: Sequence[SchemaField]) -> str:
    """Spark DDL for the schema (`` `id` BIGINT NOT NULL, `tags` ARRAY<STRING> ``), usable by `from_json`.

    Element and value nullability cannot be spelled in DDL; use `to_spark_schema_json` when it matters.
    """
    return ", ".join(_ddl_field(f, separator=" ") for f in fields)


def _json_field(field: SchemaField) -> dict[str, Any]:
    return {
        "name": field.name,
        "type": _json_type(field),
        "nullable": not field.required,
        "metadata": {"comment": field.doc} if field.doc else {},
    }


def _json_type(node: TypeNode) -> Any:
    parsed = node.parsed
    if parsed.name == "struct":
        assert node.fields is not None
        return {"type": "struct", "fields": [_json_field(f) for f in node.fields]}
    if parsed.name == "list":
        assert node.element is not None
        return {
            "type": "array",
            "elementType": _json_type(node.element),
            "containsNull": not node.element_required,
        }
    if parsed.name == "map":
        assert node.key is not None and node.value is not None
        return {
            "type": "map",
            "keyType": _json_type(node.key),
            "valueType": _json_type(node.value),
            "valueContainsNull": not node.value_required,
        }
    if parsed.name == "decimal":
        return f"decimal({parsed.precision},{parsed.scale})"
    if parsed.name not in _SPARK_JSON:
        raise _spark_unsupported(parsed)
    return _SPARK_JSON[parsed.name]


def to_spark_schema_json(fields: Sequence[SchemaField]) -> dict[str, Any]:
    """Spark's JSON form of the schema (`StructType.fromJson` accepts it); docs become column comments."""
    return {"type": "struct", "fields": [_json_field(f) for f in fields]}


def to_spark_schema_string(fields: Sequence[SchemaField]) -> str:
    """`to_spark_schema_json` serialised, as Spark's `DataType.fromJson` and `from_json` accept it."""
    return json.dumps(to_spark_schema_json(fields), separators=(",", ":"))
