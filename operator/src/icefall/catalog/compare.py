"""How an existing table differs from the layout Icefall expects: `schema_differences` (names, types,
requiredness; field ids and docs are ignored), one line each with its fix, and `layout_warnings`
(partitioning and sort order: data stays correct, so a warning, not an error).

Pure: compares pyiceberg objects, reads no catalog.
"""

from __future__ import annotations

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import IcebergType, ListType, MapType, StructType

from icefall.catalog.layout import KAFKA_COLUMN, describe_type

LAYOUT_FIX = (
    "Icefall does not change the layout of an existing table — change the spec, or evolve the table "
    "yourself (e.g. Spark's ALTER TABLE ... ADD/DROP PARTITION FIELD, WRITE ORDERED BY)"
)


def _required(flag: bool) -> str:
    return "required" if flag else "optional"


class ExpectedAt:
    """Names the place that defines an expected column, for messages."""

    def __init__(self, indexed: str | None, label: str, kafka_label: str | None = None) -> None:
        self.indexed = indexed  # e.g. "spec.format.schema": top-level columns by index
        self.label = label  # e.g. "spec.transforms.select": columns by path
        self.kafka_label = kafka_label

    def top(self, index: int, name: str) -> str:
        if name == KAFKA_COLUMN and self.kafka_label is not None:
            return f"{self.kafka_label} ({name})"
        if self.indexed is not None:
            return f"{self.indexed}[{index}]"
        return f"{self.label} ({name})"


def schema_differences(
    identifier: str, actual: Schema, expected: Schema, where: ExpectedAt, fix: str
) -> list[str]:
    """Every difference of `actual` from `expected` (names, types, requiredness; not ids), one line each."""
    comparer = _Comparer(identifier, where, fix)
    comparer.structs(actual.as_struct(), expected.as_struct(), "", None)
    return comparer.out


class _Comparer:
    def __init__(self, table: str, where: ExpectedAt, fix: str) -> None:
        self.table = table
        self.where = where
        self.fix = fix
        self.out: list[str] = []

    def nested_where(self, parent: str, suffix: str, path: str) -> str:
        indexed = self.where.indexed
        if indexed is not None and parent.startswith(indexed):
            return parent + suffix
        head = parent.split(" (", 1)[0]
        return f"{head} ({path})"

    def requiredness(self, path: str, actual: bool, expected: bool, here: str) -> None:
        if actual != expected:
            self.out.append(
                f"the table {self.table} has column {path} as {_required(actual)} but {here} says "
                f"{_required(expected)}; {self.fix}"
            )

    def structs(
        self, actual: StructType, expected: StructType, prefix: str, parent_where: str | None
    ) -> None:
        actual_by_name = {f.name: f for f in actual.fields}
        for i, field in enumerate(expected.fields):
            path = f"{prefix}{field.name}"
            if parent_where is None:
                here = self.where.top(i, field.name)
            else:
                here = self.nested_where(parent_where, f".fields[{i}]", path)
            found = actual_by_name.get(field.name)
            if found is None:
                self.out.append(
                    f"the table {self.table} has no column {path} but {here} defines it as "
                    f"{describe_type(field.field_type)}; {self.fix}"
                )
                continue
            self.requiredness(path, found.required, field.required, here)
            self.types(found.field_type, field.field_type, path, here)
        source = (self.where.indexed or self.where.label) if parent_where is None else parent_where
        expected_names = {f.name for f in expected.fields}
        for field in actual.fields:
            if field.name not in expected_names:
                self.out.append(
                    f"the table {self.table} has column {prefix}{field.name} "
                    f"({describe_type(field.field_type)}) that {source} does not define; {self.fix}"
                )

    def types(self, actual: IcebergType, expected: IcebergType, path: str, here: str) -> None:
        if isinstance(actual, StructType) and isinstance(expected, StructType):
            self.structs(actual, expected, f"{path}.", here)
        elif isinstance(actual, ListType) and isinstance(expected, ListType):
            element = f"{path}.element"
            element_where = self.nested_where(here, ".element", element)
            self.requiredness(element, actual.element_required, expected.element_required, element_where)
            self.types(actual.element_type, expected.element_type, element, element_where)
        elif isinstance(actual, MapType) and isinstance(expected, MapType):
            key, value = f"{path}.key", f"{path}.value"
            value_where = self.nested_where(here, ".value", value)
            self.types(actual.key_type, expected.key_type, key, self.nested_where(here, ".key", key))
            self.requiredness(value, actual.value_required, expected.value_required, value_where)
            self.types(actual.value_type, expected.value_type, value, value_where)
        elif actual != expected:
            self.out.append(
                f"the table {self.table} has column {path} as {describe_type(actual)} but {here} says "
                f"{describe_type(expected)}; {self.fix}"
            )


def _describe_partitioning(spec: PartitionSpec, schema: Schema) -> list[str]:
    return [f"{f.transform}({schema.find_column_name(f.source_id)})" for f in spec.fields]


def _describe_sort(order: SortOrder, schema: Schema) -> list[str]:
    out = []
    for f in order.fields:
        name = schema.find_column_name(f.source_id)
        column = name if isinstance(f.transform, IdentityTransform) else f"{f.transform}({name})"
        direction = "asc" if f.direction == SortDirection.ASC else "desc"
        nulls = "first" if f.null_order == NullOrder.NULLS_FIRST else "last"
        out.append(f"{column} {direction} nulls {nulls}")
    return out


def layout_warnings(
    identifier: str,
    *,
    table: Table,
    spec: PartitionSpec,
    order: SortOrder,
    schema: Schema,
    source: str,
) -> list[str]:
    warnings = []
    current = table.schema()
    actual = _describe_partitioning(table.spec(), current)
    wanted = _describe_partitioning(spec, schema)
    if actual != wanted:
        warnings.append(
            f"the table {identifier} is partitioned by [{', '.join(actual) or 'nothing'}] but "
            f"{source}.partitioning says [{', '.join(wanted) or 'nothing'}]; {LAYOUT_FIX}"
        )
    actual_sort = _describe_sort(table.sort_order(), current)
    wanted_sort = _describe_sort(order, schema)
    if actual_sort != wanted_sort:
        warnings.append(
            f"the table {identifier} is sorted by [{', '.join(actual_sort) or 'nothing'}] but "
            f"{source}.sortOrder says [{', '.join(wanted_sort) or 'nothing'}]; {LAYOUT_FIX}"
        )
    return warnings
