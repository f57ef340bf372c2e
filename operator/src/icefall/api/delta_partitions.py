"""A Delta table's partition columns, from `spec.table.partitioning`.

Delta Lake has no partition transforms: a Delta table is partitioned by the values of its columns. So a
field partitioned by `day` (of a timestamp) becomes a column of its own, `<field>_day`, a *generated column*
(its field's metadata `delta.generationExpression`, the `generatedColumns` writer feature): every Delta
reader sees an ordinary column, and Spark's Delta reader derives partition filters from it, so a query on
`ts` reads only the folders of the days it asks for. The expressions are those whose filters Delta derives
(Delta's `OptimizablePartitionExpression`):

| transform | column | expression | type |
|---|---|---|---|
| identity | the field itself | (none) | the field's |
| year | `<field>_year` | ``YEAR(`f`)`` | int |
| month | `<field>_month` | ``DATE_FORMAT(`f`, 'yyyy-MM')`` | string |
| day | `<field>_day` | ``CAST(`f` AS DATE)`` | date |
| hour | `<field>_hour` | ``DATE_FORMAT(`f`, 'yyyy-MM-dd-HH')`` | string |
| truncate[W] of a string | `<field>_trunc` | ``SUBSTRING(`f`, 1, W)`` | string |

Not offered: `bucket[N]` (Delta has no hash partitioning whose filters it derives) and `truncate` of a
number. The time expressions are evaluated in UTC (Icefall's Spark sessions); a Delta writer whose session
is in another time zone computes other values for the same rows (Delta's own rule for generated columns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icefall.api.table import TransformName

if TYPE_CHECKING:
    from collections.abc import Sequence

    from icefall.api.table import PartitionField

#: The metadata key of a generated column's expression in a Delta schema (Delta's PROTOCOL.md).
GENERATION_EXPRESSION = "delta.generationExpression"

#: Transform -> (the column's suffix, its expression over the quoted field, its Spark type).
_GENERATED = {
    TransformName.YEAR: ("year", "YEAR({f})", "integer"),
    TransformName.MONTH: ("month", "DATE_FORMAT({f}, 'yyyy-MM')", "string"),
    TransformName.DAY: ("day", "CAST({f} AS DATE)", "date"),
    TransformName.HOUR: ("hour", "DATE_FORMAT({f}, 'yyyy-MM-dd-HH')", "string"),
}


@dataclass(frozen=True)
class DeltaPartition:
    """One partition column of a Delta table: `source` itself (identity), or a column generated from it."""

    column: str
    source: str
    expression: str | None = None  # Spark SQL over `source`; None: identity
    spark_type: str | None = None  # the generated column's Spark type

    @property
    def generated(self) -> bool:
        return self.expression is not None


def delta_partitions(partitioning: Sequence[PartitionField]) -> list[DeltaPartition]:
    """The Delta partition columns of `partitioning`, in its order. ValueError for a transform Delta cannot
    derive filters from (`delta_transform_problem` says which, for validation)."""
    columns = []
    for part in partitioning:
        problem = delta_transform_problem(part, None)
        if problem is not None:
            raise ValueError(problem)
        columns.append(_partition(part))
    return columns


def delta_transform_problem(part: PartitionField, field_type: str | None) -> str | None:
    """Why `part` cannot partition a Delta table (`field_type`: its field's type name when known), or None."""
    transform = part.parsed_transform
    if transform.name is TransformName.BUCKET:
        return (
            f"{transform}({part.field}): a Delta table has no hash partitioning Delta readers derive filters "
            "from; partition by identity, a time transform (year, month, day, hour) or truncate[W] of a "
            "string, or use format iceberg"
        )
    if transform.name is TransformName.TRUNCATE and field_type not in (None, "string"):
        return (
            f"{transform}({part.field}): {part.field} is a {field_type}; a Delta table truncates strings "
            "only (SUBSTRING); partition by identity, or use format iceberg"
        )
    return None


def _partition(part: PartitionField) -> DeltaPartition:
    transform = part.parsed_transform
    quoted = "`" + part.field.replace("`", "``") + "`"
    if transform.name is TransformName.IDENTITY:
        return DeltaPartition(part.field, part.field)
    if transform.name is TransformName.TRUNCATE:
        expression = f"SUBSTRING({quoted}, 1, {transform.param})"
        return DeltaPartition(f"{part.field}_trunc", part.field, expression, "string")
    suffix, template, spark_type = _GENERATED[transform.name]
    return DeltaPartition(f"{part.field}_{suffix}", part.field, template.format(f=quoted), spark_type)


def without_generated(schema_string: str) -> str:
    """A Delta table's schema (Spark JSON) without its generated columns: the columns records hold."""
    schema = json.loads(schema_string)
    fields = [f for f in schema["fields"] if GENERATION_EXPRESSION not in (f.get("metadata") or {})]
    return json.dumps({**schema, "fields": fields})
