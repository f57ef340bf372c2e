"""`spec.table`: which Iceberg table to write, in which catalog, and how it is laid out.

Guarantees:
- Partition transforms are checked for syntax here (`hour`, `bucket[16]`, ...); whether a column exists and
  its type suits the transform is checked against the inline schema by `layout_problems`, which the spec
  calls when the table columns are known statically (no `transforms.select`).
- Catalog credentials are references only (`secretProperties`); a password in the URI or a secret-looking
  key in the plain `properties` is rejected.
- No catalog or table property names code to load (`py-io-impl`, `io-impl`, `*-impl`, `*.class`,
  `client.factory`, `hadoop.*`, `write.location-provider.impl`, ...; `icefall.api.code_properties`): each
  is rejected with the field and the reason, in `properties` and `secretProperties` alike.
- Table properties under `icefall.` are reserved: the commit protocol stores its offsets and epoch there.

Not guaranteed: that the catalog is reachable or the table absent/compatible; that is observed at run time
and reported as a condition.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from icefall.api.base import (
    FIELD_PATH_PATTERN,
    IDENTIFIER_PATTERN,
    NAMESPACE_PATTERN,
    PROPERTY_KEY_PATTERN,
    ApiModel,
    Loc,
    ProblemCollector,
    SecretRef,
    looks_secret,
)
from icefall.api.code_properties import code_property_problem
from icefall.api.schema import SchemaField, resolve_column

RESERVED_PROPERTY_PREFIX = "icefall."
TRANSFORM_PATTERN = r"^(identity|year|month|day|hour|bucket\[[1-9][0-9]*\]|truncate\[[1-9][0-9]*\])$"
TRANSFORM_CHOICES = "identity, hour, day, month, year, bucket[N], truncate[W]"
MAX_TRANSFORM_PARAM = 2**31 - 1


class TransformName(StrEnum):
    IDENTITY = "identity"
    YEAR = "year"
    MONTH = "month"
    DAY = "day"
    HOUR = "hour"
    BUCKET = "bucket"
    TRUNCATE = "truncate"

    @property
    def is_time(self) -> bool:
        return self in (TransformName.YEAR, TransformName.MONTH, TransformName.DAY, TransformName.HOUR)


_TIME_TYPES = frozenset({"date", "timestamp", "timestamptz"})
#: Source column types each transform accepts (Iceberg spec, "Partition Transforms").
TRANSFORM_SOURCE_TYPES: dict[TransformName, frozenset[str]] = {
    TransformName.IDENTITY: frozenset(
        {
            "boolean",
            "int",
            "long",
            "float",
            "double",
            "decimal",
            "date",
            "time",
            "timestamp",
            "timestamptz",
            "string",
            "uuid",
            "fixed",
            "binary",
        }
    ),
    TransformName.YEAR: _TIME_TYPES,
    TransformName.MONTH: _TIME_TYPES,
    TransformName.DAY: _TIME_TYPES,
    TransformName.HOUR: frozenset({"timestamp", "timestamptz"}),
    TransformName.BUCKET: frozenset(
        {
            "int",
            "long",
            "decimal",
            "date",
            "time",
            "timestamp",
            "timestamptz",
            "string",
            "uuid",
            "fixed",
            "binary",
        }
    ),
    TransformName.TRUNCATE: frozenset({"int", "long", "decimal", "string", "binary"}),
}

_TRANSFORM_SUGGESTIONS = {
    "hourly": "hour",
    "hours": "hour",
    "daily": "day",
    "days": "day",
    "date": "day",
    "monthly": "month",
    "months": "month",
    "yearly": "year",
    "years": "year",
    "bucket": "bucket[N]",
    "truncate": "truncate[W]",
    "identical": "identity",
    "none": "identity",
}
_PARAM_RE = re.compile(r"^(bucket|truncate)\s*[\[(]\s*(-?\d+)\s*[\])]$")


@dataclass(frozen=True)
class ParsedTransform:
    """A parsed partition transform: its name and, for bucket/truncate, its parameter."""

    name: TransformName
    param: int | None = None

    def __str__(self) -> str:
        return f"{self.name.value}[{self.param}]" if self.param is not None else self.name.value


def parse_transform(text: str) -> ParsedTransform:
    """Parse `identity|hour|day|month|year|bucket[N]|truncate[W]`; `ValueError` says what to write instead."""
    value = text.strip()
    if value in {t.value for t in TransformName} - {"bucket", "truncate"}:
        return ParsedTransform(TransformName(value))
    if m := _PARAM_RE.match(value):
        name, param = m.group(1), int(m.group(2))
        spelled = f"{name}[{param}]"
        if not 1 <= param <= MAX_TRANSFORM_PARAM:
            what = "bucket count N" if name == "bucket" else "truncate width W"
            raise ValueError(f"{text!r}: the {what} must be between 1 and {MAX_TRANSFORM_PARAM}")
        if value != spelled:
            raise ValueError(f"{text!r} is not a transform; write {spelled!r}")
        return ParsedTransform(TransformName(name), param)
    lowered = value.lower()
    hint = _TRANSFORM_SUGGESTIONS.get(lowered)
    if hint is None:
        close = difflib.get_close_matches(lowered, [t.value for t in TransformName], n=1)
        hint = close[0] if close else None
    suffix = f" (did you mean '{hint}'?)" if hint else ""
    raise ValueError(f"{text!r} is not a transform; use one of {TRANSFORM_CHOICES}{suffix}")


class PartitionField(ApiModel):
    """One partition field: a source column and the transform applied to it."""

    field: str = Field(
        description="Source column, dotted for struct members (e.g. shipping.country).",
        min_length=1,
        max_length=1024,
        pattern=FIELD_PATH_PATTERN,
    )
    transform: str = Field(
        default="identity",
        description=(
            "Iceberg partition transform: identity, hour, day, month, year (timestamps and dates), bucket[N] "
            "(hash into N buckets) or truncate[W] (truncate to width W)."
        ),
        json_schema_extra={"pattern": TRANSFORM_PATTERN},
        max_length=32,
    )

    @field_validator("transform")
    @classmethod
    def _valid_transform(cls, value: str) -> str:
        return str(parse_transform(value))

    @property
    def parsed_transform(self) -> ParsedTransform:
        return parse_transform(self.transform)


class SortDirection(StrEnum):
    ASC = "asc"
    DESC = "desc"


class NullOrder(StrEnum):
    FIRST = "first"
    LAST = "last"


class SortField(ApiModel):
    """One key of the table's sort order, used when writing and compacting data files."""

    field: str = Field(
        description="Column to sort by, dotted for struct members.",
        min_length=1,
        max_length=1024,
        pattern=FIELD_PATH_PATTERN,
    )
    direction: SortDirection = Field(default=SortDirection.ASC, description="asc or desc.")
    nulls: NullOrder | None = Field(
        default=None, description="Where nulls go: first or last. Default: first for asc, last for desc."
    )

    @property
    def null_order(self) -> NullOrder:
        if self.nulls is not None:
            return self.nulls
        return NullOrder.FIRST if self.direction is SortDirection.ASC else NullOrder.LAST


class CatalogType(StrEnum):
    SQL = "sql"
    REST = "rest"


# Shared with api/crd_rules.py, which turns them into the CRD's CEL rules (one definition for both checks).
SQL_URI_RE = re.compile(r"^(jdbc:)?(sqlite|postgresql|postgres|mysql)(\+[a-z0-9]+)?:")
URI_PASSWORD_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.:-]*://[^/@\s]*:[^/@\s]*@|[?&;]password=", re.IGNORECASE)


class CatalogSpec(ApiModel):
    """An Iceberg catalog. Ingestion (Spark) and the operator (pyiceberg) both open it from this config."""

    name: str = Field(
        description=(
            "Catalog name. A sql catalog stores it in the catalog database, so every writer and reader "
            "of the same tables must use the same name."
        ),
        min_length=1,
        max_length=128,
        pattern=IDENTIFIER_PATTERN,
    )
    type: CatalogType = Field(
        default=CatalogType.SQL, description="sql (JDBC database) or rest (Iceberg REST)."
    )
    uri: str = Field(
        description=(
            "sql: database URL, e.g. postgresql://db:5432/iceberg or sqlite:////var/lib/icefall/catalog.db "
            "(no password; use secretProperties). rest: the REST endpoint, e.g. https://catalog:8181."
        ),
        min_length=1,
        max_length=4096,
    )
    warehouse: str | None = Field(
        default=None,
        description="Root location for table files (e.g. s3://bucket/warehouse); required for sql.",
        max_length=4096,
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra non-secret catalog properties, e.g. s3.endpoint or s3.region. Properties that name code "
            "to load (py-io-impl, io-impl, *-impl, *.class, client.factory, hadoop.*, ...) are refused."
        ),
    )
    secret_properties: dict[str, SecretRef] = Field(
        default_factory=dict,
        description=(
            "Catalog properties whose values are secrets, each a reference, e.g. password, credential, token "
            "or s3.secret-access-key."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> CatalogSpec:
        problems = ProblemCollector()
        if URI_PASSWORD_RE.search(self.uri):
            problems.add(
                ("uri",),
                "the URI carries a password; remove it and reference the password in "
                "secretProperties.password",
            )
        if self.type is CatalogType.REST and not self.uri.startswith(("http://", "https://")):
            problems.add(("uri",), "a rest catalog URI starts with http:// or https://")
        if self.type is CatalogType.SQL:
            if not SQL_URI_RE.match(self.uri):
                problems.add(
                    ("uri",),
                    "a sql catalog URI is a database URL such as postgresql://host:5432/db "
                    "or sqlite:////path/catalog.db",
                )
            if self.warehouse is None:
                problems.add(("warehouse",), "a sql catalog needs a warehouse location; add warehouse")
        problems.extend((), _catalog_property_problems(self.properties, self.secret_properties))
        problems.raise_if_any()
        return self


def _catalog_property_problems(
    properties: dict[str, str], secret_properties: dict[str, SecretRef]
) -> list[tuple[Loc, str]]:
    """Problems of the keys of a catalog's `properties` and `secretProperties` (paths relative to it)."""
    problems: list[tuple[Loc, str]] = []
    for key, value in properties.items():
        if (problem := code_property_problem(key, value)) is not None:
            problems.append((("properties", key), problem))
        elif looks_secret(key):
            problems.append(
                (("properties", key), f"{key} looks secret; move it to secretProperties as a reference")
            )
        elif re.fullmatch(PROPERTY_KEY_PATTERN, key) is None:
            problems.append((("properties", key), "property names use letters, digits, '.', '_' and '-'"))
    for key in secret_properties:
        if (problem := code_property_problem(key)) is not None:
            problems.append((("secretProperties", key), problem))
        if key in properties:
            problems.append((("secretProperties", key), f"{key} is also in properties; keep it in one place"))
        if re.fullmatch(PROPERTY_KEY_PATTERN, key) is None:
            problems.append(
                (("secretProperties", key), "property names use letters, digits, '.', '_' and '-'")
            )
    return problems


class TableFormat(StrEnum):
    ICEBERG = "iceberg"
    DELTA = "delta"


#: Where a Delta table may live: the local file system (the embedded default), S3, GCS or Azure, each a
#: folder below a bucket (a container), not the bucket itself.
DELTA_LOCATION_RE = re.compile(
    r"^(/|file:/"
    r"|s3a?://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^/]"
    r"|gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]/[^/]"
    r"|abfss?://[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}@[a-z0-9]{3,24}\.[a-z0-9.-]*[a-z0-9](?::[0-9]+)?/[^/])"
)
#: The fix for a malformed Delta location, by its scheme (`delta_location_problem`).
_DELTA_LOCATION_FORMS = (
    (("s3://", "s3a://"), "an S3 location is s3://<bucket>/<folder>, e.g. s3://lake/tables/orders"),
    (
        ("gs://",),
        "a GCS location is gs://<bucket>/<folder> (a bucket of 3-63 lowercase letters, digits, '-', '_' "
        "and '.'), e.g. gs://lake/tables/orders",
    ),
    (
        ("abfs://", "abfss://"),
        "an Azure location is abfss://<container>@<account>.dfs.core.windows.net/<folder> (a container of "
        "3-63 lowercase letters, digits and single '-', an account of 3-24 lowercase letters and digits), "
        "e.g. abfss://lake@myaccount.dfs.core.windows.net/tables/orders",
    ),
    (
        ("wasb://", "wasbs://"),
        "write an Azure location as abfss://<container>@<account>.dfs.core.windows.net/<folder> (wasb(s):// "
        "is not supported for a Delta table)",
    ),
)


class TableSpec(ApiModel):
    """The Iceberg (or Delta Lake) table the topic is written to."""

    format: TableFormat = Field(
        default=TableFormat.ICEBERG,
        description=(
            "Table format: iceberg (a table in spec.table.catalog) or delta (a Delta Lake table at "
            "spec.table.location). Immutable."
        ),
    )
    location: str | None = Field(
        default=None,
        description=(
            "format delta: where the table lives, an absolute path, a file:/ URI, s3://bucket/path (S3 or "
            "an S3 server with conditional writes; credentials from the AWS_* environment), gs://bucket/path "
            "(Google's default credentials; STORAGE_EMULATOR_HOST) or "
            "abfss://container@account.dfs.core.windows.net/path (AZURE_STORAGE_ACCOUNT_KEY or "
            "AZURE_STORAGE_SAS_TOKEN; AZURE_STORAGE_ENDPOINT), the environment e.g. from a Secret. Default: "
            "the local runner's warehouse folder plus <namespace>/<name>. Immutable."
        ),
        min_length=1,
        max_length=1024,
    )
    catalog: CatalogSpec | None = Field(
        default=None,
        description=(
            "The catalog holding the table. When absent, the local runner uses its embedded SQLite catalog; "
            "in a cluster it is required (the embedded catalog is pod-local). Immutable."
        ),
    )
    namespace: str = Field(
        default="default",
        description="Iceberg namespace; dots separate levels (e.g. sales.eu). Immutable.",
        min_length=1,
        max_length=255,
        pattern=NAMESPACE_PATTERN,
    )
    name: str | None = Field(
        default=None,
        description="Table name. Default: metadata.name with '-' replaced by '_'. Immutable.",
        min_length=1,
        max_length=255,
        pattern=IDENTIFIER_PATTERN,
    )
    partitioning: list[PartitionField] = Field(
        default_factory=list,
        description=(
            "Partition spec, in order. Empty: unpartitioned. Format delta: identity fields of top-level "
            "boolean, int, long, date or string columns (Delta's partitionColumns)."
        ),
        max_length=16,
    )
    sort_order: list[SortField] = Field(
        default_factory=list,
        description=(
            "Sort order of data files. Empty: unsorted. Format delta: the columns compaction Z-orders the "
            "table by (top-level columns, ascending; batches are written unsorted)."
        ),
        max_length=16,
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Iceberg table properties, e.g. write.target-file-size-bytes. Keys under icefall. are reserved."
        ),
    )

    @field_validator("properties")
    @classmethod
    def _unreserved(cls, value: dict[str, str]) -> dict[str, str]:
        return unreserved_properties(value)

    @model_validator(mode="after")
    def _format_supports(self) -> TableSpec:
        problems = ProblemCollector()
        problems.extend((), delta_table_problems(self))
        problems.raise_if_any()
        return self

    @model_validator(mode="after")
    def _no_duplicates(self) -> TableSpec:
        layout_duplicates(self.partitioning, self.sort_order)
        return self


def unreserved_properties(value: dict[str, str]) -> dict[str, str]:
    """`value` (a table's `properties`), or the problems of its keys raised: reserved, malformed, or naming
    code to load."""
    problems = ProblemCollector()
    for key, text in value.items():
        if key.startswith(RESERVED_PROPERTY_PREFIX):
            problems.add((key,), "properties under 'icefall.' are written by Icefall's commits; remove it")
        elif re.fullmatch(PROPERTY_KEY_PATTERN, key) is None:
            problems.add((key,), "property names use letters, digits, '.', '_' and '-'")
        elif (problem := code_property_problem(key, text)) is not None:
            problems.add((key,), problem)
    problems.raise_if_any()
    return value


def layout_duplicates(partitioning: Sequence[PartitionField], sort_order: Sequence[SortField]) -> None:
    """Raise the problems of a table's layout that need no schema: a partition or sort field twice, two
    time transforms of one column."""
    problems = ProblemCollector()
    time_fields: dict[str, int] = {}
    seen: dict[tuple[str, str], int] = {}
    for i, part in enumerate(partitioning):
        transform = part.parsed_transform
        key = (part.field, transform.name.value)
        if key in seen:
            problems.add(
                ("partitioning", i),
                f"{transform.name.value}({part.field}) is already partitioning[{seen[key]}]; remove one",
            )
            continue
        seen[key] = i
        if transform.name.is_time:
            if part.field in time_fields:
                problems.add(
                    ("partitioning", i, "transform"),
                    f"{part.field} already has a time transform at [{time_fields[part.field]}]; "
                    "use one of hour, day, month or year per column",
                )
            else:
                time_fields[part.field] = i
    sorted_fields: dict[str, int] = {}
    for i, key_field in enumerate(sort_order):
        if key_field.field in sorted_fields:
            problems.add(
                ("sortOrder", i, "field"),
                f"{key_field.field} is already sortOrder[{sorted_fields[key_field.field]}]; remove one",
            )
        else:
            sorted_fields[key_field.field] = i
    problems.raise_if_any()


def layout_problems(
    fields: Sequence[SchemaField],
    partitioning: Sequence[PartitionField],
    sort_order: Sequence[SortField],
) -> list[tuple[Loc, str]]:
    """Check partition and sort columns against the table's columns.

    Paths are relative to `spec.table` (`("partitioning", 0, "field")`). Pure; callers with a schema known
    only at run time (after `transforms.select`) call it with that schema.
    """
    problems: list[tuple[Loc, str]] = []
    for i, part in enumerate(partitioning):
        resolved = resolve_column(fields, part.field)
        if resolved.field is None:
            problems.append((("partitioning", i, "field"), resolved.problem or "unknown column"))
            continue
        column_type = resolved.field.parsed
        transform = part.parsed_transform
        accepted = TRANSFORM_SOURCE_TYPES[transform.name]
        if column_type.name not in accepted:
            problems.append(
                (
                    ("partitioning", i, "transform"),
                    f"{transform} cannot partition {part.field!r} of type {column_type}; "
                    f"{transform.name.value} needs one of {', '.join(sorted(accepted))}",
                )
            )
    for i, key in enumerate(sort_order):
        resolved = resolve_column(fields, key.field)
        if resolved.field is None:
            problems.append((("sortOrder", i, "field"), resolved.problem or "unknown column"))
        elif resolved.field.parsed.is_nested:
            problems.append(
                (
                    ("sortOrder", i, "field"),
                    f"{key.field!r} is a {resolved.field.parsed.name}; sort by a primitive column",
                )
            )
    return problems


#: Column types a Delta table may be partitioned by: those whose value is written the same by Spark's
#: partition folders and Delta's `partitionValues` (no time zone, no precision, no escaping that differs).
DELTA_PARTITION_TYPES = frozenset({"boolean", "int", "long", "date", "string"})


def delta_partition_problems(table: TableSpec) -> list[tuple[Loc, str]]:
    """`spec.table.partitioning` of a Delta table: top-level columns, none of them Z-ordered (paths relative
    to `spec.table`; transforms and column types: `delta_spec_problems`)."""
    problems: list[tuple[Loc, str]] = []
    for i, part in enumerate(table.partitioning):
        if "." in part.field:
            problems.append(
                (("partitioning", i, "field"), "a Delta table is partitioned by top-level columns only")
            )
    partitioned = {p.field for p in table.partitioning if p.parsed_transform.name is TransformName.IDENTITY}
    for i, key in enumerate(table.sort_order):
        if key.field in partitioned:
            problems.append(
                (
                    ("sortOrder", i, "field"),
                    f"{key.field} is a partition column: each file holds one value of it, and Delta's "
                    "OPTIMIZE refuses to Z-order by it; remove it from sortOrder",
                )
            )
    return problems


def delta_location_problem(location: str) -> str | None:
    """What is wrong with a Delta table's `spec.table.location` (None: nothing), with the form to write."""
    if DELTA_LOCATION_RE.match(location):
        return None
    for schemes, form in _DELTA_LOCATION_FORMS:
        if location.lower().startswith(schemes):
            return f"{location!r} is not a Delta table location: {form}"
    return (
        "a Delta table's location is an absolute local path, a file:/ URI, s3://<bucket>/<folder>, "
        "gs://<bucket>/<folder> or abfss://<container>@<account>.dfs.core.windows.net/<folder>: e.g. "
        "/data/tables/orders or gs://lake/tables/orders"
    )


def delta_table_problems(table: TableSpec) -> list[tuple[Loc, str]]:
    """What `spec.table` asks that a Delta table does not support yet (paths relative to `spec.table`);
    refused rather than ignored, so no setting silently does nothing."""
    if table.format is not TableFormat.DELTA:
        if table.location is not None:
            return [
                (
                    ("location",),
                    "location applies to format delta; an Iceberg table lives where its catalog puts it: "
                    "remove it, or set format: delta",
                )
            ]
        return []
    problems: list[tuple[Loc, str]] = []
    unsupported = "is not supported with format delta yet"
    if table.location is not None and (problem := delta_location_problem(table.location)):
        problems.append((("location",), problem))
    if table.catalog is not None:
        problems.append(
            (
                ("catalog",),
                f"a catalog {unsupported}: a Delta table is named by its location; remove spec.table.catalog "
                "and set spec.table.location",
            )
        )
    problems += delta_partition_problems(table)
    for i, key in enumerate(table.sort_order):
        if "." in key.field:
            problems.append(
                (("sortOrder", i), f"Z-order by a struct member {unsupported}; name a top-level column")
            )
        if key.direction is not SortDirection.ASC or key.nulls is not None:
            problems.append(
                (
                    ("sortOrder", i),
                    "a Delta table's sort order is the Z-order of compaction, which has no direction or "
                    "null order: remove direction and nulls",
                )
            )
    if table.properties:
        problems.append((("properties",), f"table properties {unsupported}; remove them"))
    return problems
