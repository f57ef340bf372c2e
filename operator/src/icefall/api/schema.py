"""The inline record schema (`spec.format.schema`); its conversions to Iceberg and Spark live in
`icefall.api.iceberg_schema` and `icefall.api.spark_schema`.

A schema is a list of fields; each field has a `name`, an Iceberg `type`, `required` (default false) and
an optional `doc`. Types are Iceberg type names: the primitives `boolean int long float double date time
timestamp timestamptz string uuid binary fixed[N] decimal(P,S)`, and the nested `struct` (with `fields`),
`list` (with `element` and `elementRequired`) and `map` (with `key`, `value` and `valueRequired`).
List elements and map keys/values are type objects (`{type: string}`), so every level has one shape.

Guarantees:
- `to_iceberg_schema` is pure and deterministic: field ids are assigned exactly as Iceberg assigns fresh
  ids when a table is created (each struct's fields first, in order, then their nested types, depth first),
  so the schema we compute equals the one the catalog stores for a new table.
- `to_spark_ddl` / `to_spark_schema_json` follow the Iceberg Spark runtime's type mapping
  (`timestamptz` → `timestamp`, `timestamp` → `timestamp_ntz`, `uuid` → `string`, `fixed` → `binary`).
  They only build strings and dicts; pyspark is not imported.
- `time` parses (`parse_type`) and converts to Iceberg (`iceberg_type`), but a spec may not use it: the
  Iceberg Spark runtime cannot write it.
- Nesting is limited to `MAX_NESTING_DEPTH` levels so that the CRD's structural schema can spell it out.

Not guaranteed: that the data in Kafka matches the schema — that is checked per record at ingestion,
and records that do not match go to the dead-letter destination.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Self

from pydantic import Field, field_validator, model_validator

from icefall.api.base import FIELD_NAME_PATTERN, ApiModel, Loc, ProblemCollector

#: Deepest nesting of struct/list/map a schema may use (top-level fields are depth 1).
MAX_NESTING_DEPTH = 8

PRIMITIVE_TYPES = (
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "string",
    "uuid",
    "binary",
)
NESTED_TYPES = ("struct", "list", "map")
TYPE_CHOICES = "boolean, int, long, float, double, date, timestamp, timestamptz, string, uuid, binary, " + (
    "fixed[N], decimal(P,S), struct, list, map"
)
MAX_DECIMAL_PRECISION = 38

_DECIMAL_RE = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_FIXED_RE = re.compile(r"^fixed\[\s*(\d+)\s*\]$")

# Names people reach for from other systems, and the Iceberg type they mean.
_TYPE_SUGGESTIONS = {
    "integer": "int",
    "int32": "int",
    "smallint": "int",
    "tinyint": "int",
    "short": "int",
    "bigint": "long",
    "int64": "long",
    "number": "double",
    "real": "float",
    "float32": "float",
    "float64": "double",
    "bool": "boolean",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "str": "string",
    "bytes": "binary",
    "datetime": "timestamptz",
    "timestamp_tz": "timestamptz",
    "timestamp_ltz": "timestamptz",
    "timestamp_ntz": "timestamp",
    "array": "list",
    "object": "struct",
    "record": "struct",
    "row": "struct",
    "decimal": "decimal(P,S)",
    "numeric": "decimal(P,S)",
    "fixed": "fixed[N]",
}

TIME_UNSUPPORTED_MESSAGE = (
    "'time' cannot be written by the Iceberg Spark runtime; "
    "use 'string' or 'long' (microseconds since midnight) instead"
)


@dataclass(frozen=True)
class ParsedType:
    """A parsed type string: `name` is a primitive or nested type name; `precision`/`scale`/`length`."""

    name: str
    precision: int | None = None
    scale: int | None = None
    length: int | None = None

    @property
    def is_nested(self) -> bool:
        return self.name in NESTED_TYPES

    @property
    def is_primitive(self) -> bool:
        return not self.is_nested

    def __str__(self) -> str:
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.name == "fixed":
            return f"fixed[{self.length}]"
        return self.name


def parse_type(text: str) -> ParsedType:
    """Parse an Iceberg type string; raise `ValueError` with an instruction when it is not one."""
    value = text.strip()
    if value in PRIMITIVE_TYPES or value in NESTED_TYPES:
        return ParsedType(value)
    if m := _DECIMAL_RE.match(value):
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise ValueError(f"decimal precision must be between 1 and 38, got {precision}")
        if scale > precision:
            raise ValueError(f"decimal scale ({scale}) must not exceed its precision ({precision})")
        return ParsedType("decimal", precision=precision, scale=scale)
    if m := _FIXED_RE.match(value):
        length = int(m.group(1))
        if length < 1:
            raise ValueError("fixed length must be at least 1, e.g. fixed[16]")
        return ParsedType("fixed", length=length)
    lowered = value.lower()
    if lowered != value and (lowered in PRIMITIVE_TYPES or lowered in NESTED_TYPES):
        raise ValueError(f"{text!r} is not an Iceberg type; type names are lowercase: use '{lowered}'")
    hint = _TYPE_SUGGESTIONS.get(lowered.split("(")[0].split("[")[0])
    if hint is None:
        close = difflib.get_close_matches(lowered, [*PRIMITIVE_TYPES, *NESTED_TYPES], n=1)
        hint = close[0] if close else None
    did_you_mean = f"did you mean '{hint}'? " if hint else ""
    raise ValueError(f"{text!r} is not an Iceberg type; {did_you_mean}use one of {TYPE_CHOICES}")


def _spec_type(text: str) -> str:
    """Validate a type written in a spec: any Iceberg type Spark can write, normalised."""
    parsed = parse_type(text)
    if parsed.name == "time":
        raise ValueError(TIME_UNSUPPORTED_MESSAGE)
    return str(parsed)


_TYPE_DESCRIPTION = (
    "Iceberg type: boolean, int, long, float, double, date, timestamp (without zone), timestamptz "
    "(with zone, stored as UTC), string, uuid, binary, fixed[N], decimal(P,S), or struct "
    "(set fields), list (set element) or map (set key and value)."
)


class TypeSpec(ApiModel):
    """An Iceberg type without a name: a list element or a map key/value."""

    type: str = Field(description=_TYPE_DESCRIPTION, min_length=1, max_length=64)
    fields: list[SchemaField] | None = Field(
        default=None, description="Fields of a struct; only for type struct.", min_length=1
    )
    element: TypeSpec | None = Field(default=None, description="Element type of a list; only for type list.")
    element_required: bool = Field(
        default=False, description="Whether list elements are never null; only for type list."
    )
    key: TypeSpec | None = Field(default=None, description="Key type of a map; only for type map.")
    value: TypeSpec | None = Field(default=None, description="Value type of a map; only for type map.")
    value_required: bool = Field(
        default=False, description="Whether map values are never null; only for type map."
    )

    @field_validator("type")
    @classmethod
    def _valid_type(cls, value: str) -> str:
        return _spec_type(value)

    @property
    def parsed(self) -> ParsedType:
        return parse_type(self.type)

    @model_validator(mode="after")
    def _parts_match_type(self) -> Self:
        _check_parts(self)
        return self


class SchemaField(TypeSpec):  # a TypeSpec with a name: its type's parts are TypeSpec's
    """One named field of a record or struct: a name, a type, and whether it is required."""

    name: str = Field(
        description="Field name, as the key appears in the JSON record. No '.' or backtick.",
        min_length=1,
        max_length=255,
        pattern=FIELD_NAME_PATTERN,
    )
    required: bool = Field(
        default=False,
        description="Whether the field is always present and non-null; records without it are dead-lettered.",
    )
    doc: str | None = Field(
        default=None, description="Documentation stored with the Iceberg column.", max_length=1024
    )


TypeNode = TypeSpec | SchemaField
TypeSpec.model_rebuild()
SchemaField.model_rebuild()


def _check_parts(node: TypeNode) -> None:
    """The parts of a type (fields, element, key, value) must match its kind."""
    problems = ProblemCollector()
    kind = node.parsed.name
    parts = {
        "fields": ("struct", node.fields is not None),
        "element": ("list", node.element is not None),
        "elementRequired": ("list", node.element_required),
        "key": ("map", node.key is not None),
        "value": ("map", node.value is not None),
        "valueRequired": ("map", node.value_required),
    }
    for part, (owner, present) in parts.items():
        if present and kind != owner:
            problems.add((part,), f"only a {owner} has {part}; remove it or set type: {owner}")
    if kind == "struct" and node.fields is None:
        problems.add(("fields",), "a struct needs fields; add a list of {name, type} entries")
    if kind == "list" and node.element is None:
        problems.add(("element",), "a list needs an element type, e.g. element: {type: string}")
    if kind == "map":
        if node.key is None:
            problems.add(("key",), "a map needs a key type, e.g. key: {type: string}")
        elif not node.key.parsed.is_primitive:
            problems.add(("key", "type"), "map keys must be a primitive type, e.g. string")
        if node.value is None:
            problems.add(("value",), "a map needs a value type, e.g. value: {type: string}")
    if node.fields is not None:
        problems.extend(("fields",), _duplicate_names(node.fields))
    problems.raise_if_any()


def _duplicate_names(fields: Sequence[SchemaField]) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    seen: dict[str, int] = {}
    for i, field in enumerate(fields):
        folded = field.name.lower()
        if folded in seen:
            problems.append(
                (
                    (i, "name"),
                    f"duplicate field name {field.name!r} (Spark compares names case-insensitively; "
                    f"it clashes with the field at index {seen[folded]}); rename one",
                )
            )
        else:
            seen[folded] = i
    return problems


def check_fields(fields: Sequence[SchemaField], *, json_format: bool) -> list[tuple[Loc, str]]:
    """Checks that need the whole schema: unique names, nesting depth, JSON-readable map keys.

    Returns `(relative path, message)` pairs; paths start at the schema list (e.g. `(2, "element", "type")`).
    """
    problems = _duplicate_names(fields)
    for i, field in enumerate(fields):
        for loc, node, depth in _walk(field, (i,), 1):
            parsed = node.parsed
            if depth > MAX_NESTING_DEPTH:
                problems.append(
                    (
                        (*loc, "type"),
                        f"nesting deeper than {MAX_NESTING_DEPTH} levels is not supported; "
                        "flatten the record or store the deep part as a JSON string",
                    )
                )
                break
            key = node.key
            if json_format and parsed.name == "map" and key is not None and key.parsed.name != "string":
                problems.append(
                    ((*loc, "key", "type"), "JSON object keys are strings; use key: {type: string}")
                )
    return problems


def _walk(node: TypeNode, loc: Loc, depth: int) -> Iterator[tuple[Loc, TypeNode, int]]:
    yield loc, node, depth
    if node.fields is not None:
        for i, child in enumerate(node.fields):
            yield from _walk(child, (*loc, "fields", i), depth + 1)
    if node.element is not None:
        yield from _walk(node.element, (*loc, "element"), depth + 1)
    if node.key is not None:
        yield from _walk(node.key, (*loc, "key"), depth + 1)
    if node.value is not None:
        yield from _walk(node.value, (*loc, "value"), depth + 1)


@dataclass(frozen=True)
class ResolvedColumn:
    """A dotted column path resolved against a schema: the field, or why it does not resolve."""

    field: SchemaField | None
    problem: str | None = None


def resolve_column(fields: Sequence[SchemaField], path: str) -> ResolvedColumn:
    """Find the field named by a dotted path (`shipping.city`), descending through structs only."""
    parts = path.split(".")
    current: Sequence[SchemaField] = fields
    walked: list[str] = []
    for depth, part in enumerate(parts):
        found = next((f for f in current if f.name == part), None)
        if found is None:
            names = [f.name for f in current]
            close = difflib.get_close_matches(part, names, n=1)
            where = f"in {'.'.join(walked)}" if walked else "in the schema"
            hint = f"did you mean {'.'.join([*walked, close[0]])!r}? " if close else ""
            return ResolvedColumn(None, f"no column {path!r} {where}; {hint}use one of: {', '.join(names)}")
        walked.append(part)
        last = depth == len(parts) - 1
        if last:
            return ResolvedColumn(found)
        kind = found.parsed.name
        if kind in ("list", "map"):
            return ResolvedColumn(
                None, f"{'.'.join(walked)!r} is a {kind}; use a column outside lists and maps"
            )
        if kind != "struct" or found.fields is None:
            return ResolvedColumn(
                None, f"{'.'.join(walked)!r} is a {kind}, not a struct; remove {parts[depth + 1]!r}"
            )
        current = found.fields
    return ResolvedColumn(None, f"empty column path {path!r}")  # pragma: no cover - split never yields []
