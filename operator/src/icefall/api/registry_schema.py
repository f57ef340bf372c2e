"""The table's fields from a registry schema of any format this version decodes.

`fields_from_registry_schema(format, text)` dispatches on `spec.format.type`: Avro (`icefall.api.avro`),
JSON Schema (`icefall.api.json_schema`), Protobuf (`icefall.api.protobuf_schema`: `text` is the schema's
descriptor set; the table holds the message `registry.recordName`, or the schema's first). Its errors are
`ValueError`s naming the field that cannot map.

Pure: no I/O, no pyspark.
"""

from __future__ import annotations

from icefall.api.avro import fields_from_avro
from icefall.api.format import Format, FormatType
from icefall.api.json_schema import fields_from_json_schema
from icefall.api.protobuf_schema import fields_from_protobuf
from icefall.api.schema import SchemaField


def fields_from_registry_schema(fmt: Format, text: str) -> list[SchemaField]:
    """The table fields of the registry schema `text` of `fmt`'s type (a writer's, or a subject's latest)."""
    if fmt.type is FormatType.AVRO:
        return fields_from_avro(text)
    if fmt.type is FormatType.JSON_SCHEMA:
        return fields_from_json_schema(text)
    if fmt.type is FormatType.PROTOBUF:
        return fields_from_protobuf(text, fmt.registry.record_name if fmt.registry is not None else None)
    raise ValueError(f"format {fmt.type.value} has no registry schema this version maps to a table")
