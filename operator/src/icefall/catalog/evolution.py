"""How a table's schema follows the schema its records have now: `plan_evolution(actual, wanted, source)`.

Iceberg changes a schema without rewriting a data file when it
- adds a field, matched by name at any depth (Iceberg gives it a new id, and rows already written read it
  as null), so the field must be optional;
- widens a primitive: int → long, float → double, decimal(P,S) → decimal(P',S) with P' > P;
- makes a required field (or a list element, a map value) optional.

Everything else is refused, one line per field that says what it was and what to do: a type narrowed or
changed (string → int), a field renamed (seen as a new field: the old one stays), a new required field from
the spec, a map's key type changed. A field the table has and `wanted` lacks stays as it is: the rows
written from now on hold null in it (a required one is refused: no new row could be written).

`wanted` comes from the spec (`spec.format.schema` changed by a `kubectl apply`: `relax_required=False`,
a new required field is refused) or from a registry's writer schemas (`relax_required=True`: a producer's
new field is added as optional, whatever the writer says, as every table that outlives its producers must).

Pure: compares pyiceberg schemas; `Evolution.apply` only records the changes on a pyiceberg `UpdateSchema`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
)

from icefall.catalog.layout import describe_type

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table.update.schema import UpdateSchema

Path = tuple[str, ...]


@dataclass(frozen=True)
class AddField:
    path: Path
    type: IcebergType
    doc: str | None = None

    def __str__(self) -> str:
        return f"add optional field '{_dotted(self.path)}' {describe_type(self.type)}"


@dataclass(frozen=True)
class WidenType:
    path: Path
    old: IcebergType
    new: IcebergType

    def __str__(self) -> str:
        return f"widen '{_dotted(self.path)}' from {describe_type(self.old)} to {describe_type(self.new)}"


@dataclass(frozen=True)
class MakeOptional:
    path: Path

    def __str__(self) -> str:
        return f"make '{_dotted(self.path)}' optional"


Change = AddField | WidenType | MakeOptional


@dataclass(frozen=True)
class Evolution:
    """What to change in the table's schema, and what cannot be changed (with its fix)."""

    changes: tuple[Change, ...] = ()
    refused: tuple[str, ...] = ()
    #: A new top-level field goes before this column (Icefall's own columns stay last).
    before: str | None = None

    def apply(self, update: UpdateSchema) -> None:
        """Record the changes on `update` (committed by whoever owns it)."""
        for change in self.changes:
            if isinstance(change, AddField):
                update.add_column(change.path, change.type, doc=change.doc, required=False)
                if len(change.path) == 1 and self.before is not None:
                    update.move_before(change.path, self.before)
            elif isinstance(change, WidenType):
                update.update_column(change.path, field_type=change.new)
            else:
                update.make_column_optional(change.path)

    def describe(self) -> str:
        return "; ".join(str(change) for change in self.changes)


def plan_evolution(
    actual: Schema,
    wanted: Schema,
    *,
    source: str,
    relax_required: bool,
    last: Sequence[str] = (),
    table_format: str = "Iceberg",
    no_widening: str | None = None,
) -> Evolution:
    """The changes that make `actual` (the table's schema) hold what `wanted` describes. `source` names
    `wanted` in messages (`spec.format.schema`, `writer schema id 7`); new top-level fields go before the
    first of the `last` columns the table has. `table_format` names the table's format in messages;
    `no_widening`: the format cannot widen a type (why, and what to do): each widening is refused with it
    (Delta Lake, `icefall.catalog.delta_schema`)."""
    planner = _Planner(source, relax_required, table_format, no_widening)
    planner.struct(actual.as_struct(), wanted.as_struct(), ())
    before = next((f.name for f in actual.fields if f.name in last), None)
    return Evolution(tuple(planner.changes), tuple(planner.refused), before)


class _Planner:
    def __init__(
        self, source: str, relax_required: bool, table_format: str = "Iceberg", no_widening: str | None = None
    ) -> None:
        self.source = source
        self.relax_required = relax_required
        self.table_format = table_format
        self.no_widening = no_widening
        self.changes: list[Change] = []
        self.refused: list[str] = []

    def struct(self, actual: StructType, wanted: StructType, at: Path) -> None:
        for field in wanted.fields:
            path = (*at, field.name)
            have = _field_named(actual, field.name)
            if have is None:
                self.added(field, path)
                continue
            if have.required and not field.required:
                self.changes.append(MakeOptional(path))
            self.type(have.field_type, field.field_type, path)
        if not self.relax_required:
            wanted_names = {f.name for f in wanted.fields}
            for have in actual.fields:
                if have.name not in wanted_names and have.required:
                    self.refused.append(
                        f"field '{_dotted((*at, have.name))}' is required in the table and {self.source} no "
                        "longer has it: no new row could be written; add it back, or make the column "
                        "optional (Spark: ALTER TABLE ... ALTER COLUMN ... DROP NOT NULL)"
                    )

    def added(self, field: NestedField, path: Path) -> None:
        if field.required and not self.relax_required:
            self.refused.append(
                f"field '{_dotted(path)}' is new in {self.source} and required, but the rows already in the "
                "table have no value for it: make it optional (required: false)"
            )
            return
        self.changes.append(AddField(path, field.field_type, field.doc))

    def type(self, have: IcebergType, want: IcebergType, path: Path) -> None:
        if isinstance(have, StructType) and isinstance(want, StructType):
            self.struct(have, want, path)
        elif isinstance(have, ListType) and isinstance(want, ListType):
            element = (*path, "element")
            if have.element_required and not want.element_required:
                self.changes.append(MakeOptional(element))
            self.type(have.element_type, want.element_type, element)
        elif isinstance(have, MapType) and isinstance(want, MapType):
            if not _same_shape(have.key_type, want.key_type):
                self.mismatch(have, want, path, why="a map's key type cannot change")
                return
            value = (*path, "value")
            if have.value_required and not want.value_required:
                self.changes.append(MakeOptional(value))
            self.type(have.value_type, want.value_type, value)
        elif have.is_primitive and want.is_primitive:
            if have == want or _widens(want, have):
                return  # the same, or narrower: every value fits the column as it is
            if _widens(have, want) and self.no_widening is not None:
                self.refused.append(
                    f"field '{_dotted(path)}': the table has {describe_type(have)}, {self.source} has "
                    f"{describe_type(want)}; {self.no_widening}"
                )
            elif _widens(have, want):
                self.changes.append(WidenType(path, have, want))
            else:
                why = _WIDENINGS if self.no_widening is None else "a column's type stays as it is"
                self.mismatch(have, want, path, why=why)
        else:
            self.mismatch(
                have, want, path, why="a column cannot change between struct, list, map and a value"
            )

    def mismatch(self, have: IcebergType, want: IcebergType, path: Path, *, why: str) -> None:
        self.refused.append(
            f"field '{_dotted(path)}': the table has {describe_type(have)}, {self.source} has "
            f"{describe_type(want)}; {self.table_format} cannot change it ({why}): keep the type, or write "
            "the new values to a new field"
        )


_WIDENINGS = "it widens only int to long, float to double and a decimal's precision"


def _widens(old: IcebergType, new: IcebergType) -> bool:
    """Whether Iceberg can change a column of type `old` to `new` in place."""
    if isinstance(old, IntegerType):
        return isinstance(new, LongType)
    if isinstance(old, FloatType):
        return isinstance(new, DoubleType)
    if isinstance(old, DecimalType) and isinstance(new, DecimalType):
        return new.scale == old.scale and new.precision > old.precision
    return False


def _same_shape(a: IcebergType, b: IcebergType) -> bool:
    """Equal types, ignoring field ids."""
    return describe_type(a) == describe_type(b)


def _field_named(struct: StructType, name: str) -> NestedField | None:
    return next((f for f in struct.fields if f.name == name), None)


def _dotted(path: Path) -> str:
    return ".".join(path)
