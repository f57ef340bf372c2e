"""Routes: a source's records (one topic, `topics` or `topicPattern`; any format) into several tables.
Static routes (`spec.routes`) send each record to the first route whose condition holds; a dynamic route
(`spec.dynamicRoute`) computes a table name from each record the static routes leave; `spec.unrouted`
says where the records no route takes go.

A route's condition (`when`) is a Spark SQL boolean expression over the record as decoded, before
`spec.transforms`: the fields of `spec.format.schema` by name, and `_kafka`, a struct of `topic`,
`partition`, `offset`, `timestamp`, `key` (the Kafka key as UTF-8 text) and `headers` (a map of each
header's name to its value as UTF-8 text; the first of a repeated name). It is checked like a transform
(`icefall.api.sql_expressions`: record-local functions only, no query, no file read); a condition that is
null counts as false. A route's table lives in `spec.table`'s catalog, by default in its namespace, with its
own partitioning, sort order and properties, and the columns of `spec.table`, or its own: a route may give
its table's `schema`, and in keyed modes its `key` and `sequenceBy` (json only; `icefall.api.route_specs`:
a table per source table of a database, each topic routed by `_kafka.topic`). Its condition still sees the
record as spec.format.schema decodes it; its schema then decodes the records it takes.

Keyed tables (`spec.mode` upsert, cdc; static routes only): each route table is keyed by its key (default
`spec.key`) and MERGEs the changes it takes. A condition sees the row image (cdc: `after`, `before` for a
delete; a tombstone only its key fields, from the Kafka key); a delete no condition takes deletes its key in
every destination (`icefall.ingest.routes`).

A dynamic route (kept small on purpose): `from` names the value (a top-level `Field`, a `Header`, the
`Key` or the `Topic`, as text); `pattern` optionally extracts part of it (a regex: its one group, or the
whole match; e.g. a Debezium topic `dbserver1.inventory.customers` to `customers`); `nameTemplate` puts it
in a name (`events_{value}`). A record whose value is null, whose pattern does not match, or whose `when`
is not true has no name and goes where `spec.unrouted` says. The name must be an identifier
(`IDENTIFIER_PATTERN`), checked per batch on the names found (`icefall.plan.routing.dynamic_names`); the
table is created on first use in `namespace` (default spec.table's) with spec.table's columns and the
`table` template's layout, at most `maxTables` of them (at most `MAX_DYNAMIC_TABLES`). A name that is not an
identifier, or one more table past the cap, makes the record a dead letter whose reason quotes the name.

Not guaranteed here: that Spark accepts the conditions (their columns and types are checked when the
pipeline starts, and a failure names the route); that a computed name is a valid identifier (it depends on
the records).
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from icefall.api.base import IDENTIFIER_PATTERN, NAMESPACE_PATTERN, ApiModel, ProblemCollector
from icefall.api.schema import SchemaField, check_fields
from icefall.api.sql_expressions import expression_problem
from icefall.api.table import PartitionField, SortField, layout_duplicates, unreserved_properties
from icefall.api.topic_pattern import costly_problem

#: Most routes one StreamingTable may have: each is a table committed every batch.
MAX_ROUTES = 64
#: Most fields a route's own schema has (PostgreSQL's most columns per table): the API server estimates the
#: cost of the schema's field rules over every route's fields, and refuses a CRD whose total is too high.
MAX_ROUTE_FIELDS = 1600
#: The reason a dead letter of an unrouted record gives (`spec.unrouted: DeadLetter`).
UNROUTED_REASON = "unrouted: no route's condition holds (spec.unrouted: DeadLetter)"


class Unrouted(StrEnum):
    """Where a record goes that no route takes."""

    TABLE = "Table"  # spec.table: the default table
    DEAD_LETTER = "DeadLetter"  # the dead-letter table (and topic), with UNROUTED_REASON


class TableTemplate(ApiModel):
    """A routed table's layout: a route's table, or each table a dynamic route creates."""

    partitioning: list[PartitionField] = Field(
        default_factory=list, description="Partition spec, in order. Empty: unpartitioned.", max_length=16
    )
    sort_order: list[SortField] = Field(
        default_factory=list, description="Sort order of data files. Empty: unsorted.", max_length=16
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Iceberg table properties, as spec.table.properties (not inherited from it).",
    )

    @field_validator("properties")
    @classmethod
    def _unreserved(cls, value: dict[str, str]) -> dict[str, str]:
        return unreserved_properties(value)

    @model_validator(mode="after")
    def _no_duplicates(self) -> TableTemplate:
        layout_duplicates(self.partitioning, self.sort_order)
        return self


class RouteTable(TableTemplate):
    """A route's Iceberg table: in spec.table's catalog, with spec.table's columns."""

    name: str = Field(
        description="Table name. Immutable in effect: a new name is a new table, filled from then on.",
        min_length=1,
        max_length=255,
        pattern=IDENTIFIER_PATTERN,
    )
    namespace: str | None = Field(
        default=None,
        description="Iceberg namespace; default: spec.table.namespace.",
        min_length=1,
        max_length=255,
        pattern=NAMESPACE_PATTERN,
    )


class Route(ApiModel):
    """One destination of a routed topic: its table, and which records it takes."""

    table: RouteTable = Field(description="The table this route writes.")
    when: str = Field(
        min_length=1,
        max_length=4096,
        description=(
            "Spark SQL condition over the decoded record: its schema fields by name, and _kafka.topic, "
            "_kafka.partition, _kafka.offset, _kafka.timestamp, _kafka.key (text) and _kafka.headers "
            "(a map of text), e.g. \"type = 'click'\" or \"_kafka.headers['kind'] = 'audit'\". The first "
            "route whose condition is true takes the record; null is false. Record-local functions only."
        ),
    )

    schema_fields: list[SchemaField] | None = Field(
        default=None,
        alias="schema",
        min_length=1,
        max_length=MAX_ROUTE_FIELDS,
        description=(
            "The columns of this route's table, as spec.format.schema (json only): the records this route "
            "takes are decoded with them; one that does not fit is a dead letter naming the table. "
            "Default: spec.format.schema. The condition still sees the record as spec.format.schema "
            "decodes it."
        ),
    )
    key: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description=(
            "mode upsert, cdc: the columns that identify a row of this route's table, as spec.key (required "
            "top-level fields of this route's schema). Default: spec.key."
        ),
    )
    sequence_by: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description="mode cdc: this route's table's spec.sequenceBy. Default: spec.sequenceBy.",
    )

    @field_validator("when")
    @classmethod
    def _record_local(cls, value: str) -> str:
        problem = expression_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _whole_schema(self) -> Route:
        problems = ProblemCollector()
        problems.extend(("schema",), check_fields(self.schema_fields or [], json_format=True))
        problems.raise_if_any()
        return self

    @property
    def decodes_own(self) -> bool:
        """Whether its records decode otherwise than spec.table's: it gives a schema, key or sequenceBy."""
        return (self.schema_fields, self.key, self.sequence_by) != (None, None, None)


#: Most tables one dynamic route may create (`maxTables` is at most this): every one of them is committed
#: every batch (its offsets move with the batch's range), so each costs a catalog commit per batch.
MAX_DYNAMIC_TABLES = 100
#: `maxTables` when not given.
DEFAULT_MAX_TABLES = 20
#: The placeholder of `nameTemplate`: the value the name is computed from.
PLACEHOLDER = "{value}"
#: Longest computed value quoted in a dead letter's reason.
QUOTED_CHARS = 64
#: The table property a created table carries: the table (`spec.table`) whose dynamic route made it. A
#: restart finds its dynamic tables by it (`icefall.catalog.tables.dynamic_route_tables`).
DYNAMIC_OWNER_PROPERTY = "icefall.dynamic-route-of"

#: Constructs Python's `re` accepts but Java's `Pattern` (what Spark's `regexp_extract` runs) does not, or
#: reads otherwise: named groups and backreferences `(?P...)`, conditionals, comments, the flags a, L and u.
_PYTHON_ONLY = re.compile(r"(?<!\\)\(\?(?:P|\(|#|[imsx-]*[aLu])")

#: How a dynamic route's dead-letter reasons start (`icefall.ingest.routes`).
DYNAMIC_REASON_PREFIX = "dynamic route: "


class NameFrom(StrEnum):
    """What a dynamic route computes its table name from."""

    FIELD = "Field"  # a top-level field of the decoded value (spec.format.schema), as text
    HEADER = "Header"  # a Kafka header's value as UTF-8 text (the first of a repeated name)
    KEY = "Key"  # the Kafka key as UTF-8 text
    TOPIC = "Topic"  # the record's topic (_kafka.topic)


class DynamicRoute(ApiModel):
    """A table per value: the table name computed from each record, the table created on first use."""

    from_: NameFrom = Field(
        alias="from", description="What the name is computed from: Field, Header, Key or Topic."
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="With from Field: the field's name (a top-level field of spec.format.schema); with from "
        "Header: the header's name. Not set otherwise.",
    )
    pattern: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description=(
            "Optional regex (the syntax Java and Python share: Spark runs it) searched in the value; its "
            "first group (or the whole match when it has no group) "
            "becomes the value, e.g. '^dbserver1\\.inventory\\.(.+)$' for a Debezium topic. No match: the "
            "record has no name and goes where spec.unrouted says."
        ),
    )
    name_template: str = Field(
        default=PLACEHOLDER,
        min_length=1,
        max_length=255,
        description="The table name, with {value} standing for the value, e.g. 'events_{value}'.",
    )
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        pattern=NAMESPACE_PATTERN,
        description="Iceberg namespace of the created tables; default: spec.table.namespace.",
    )
    when: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Optional Spark SQL condition, as a static route's: records it is not true for have no "
        "name and go where spec.unrouted says.",
    )
    max_tables: int = Field(
        default=DEFAULT_MAX_TABLES,
        ge=1,
        le=MAX_DYNAMIC_TABLES,
        description=(
            "Most tables this route creates. A record whose name would make one more is a dead letter "
            "(reason 'dynamic route: ... past maxTables'). Each table commits every batch."
        ),
    )
    table: TableTemplate = Field(
        default_factory=TableTemplate,
        description="Partitioning, sort order and properties of every table it creates.",
    )

    @field_validator("when")
    @classmethod
    def _record_local(cls, value: str | None) -> str | None:
        problem = None if value is None else expression_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DynamicRoute:
        problems = dynamic_route_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def prefix(self) -> str:
        """The template's text before `{value}`."""
        return self.name_template.partition(PLACEHOLDER)[0]

    @property
    def suffix(self) -> str:
        """The template's text after `{value}`."""
        return self.name_template.partition(PLACEHOLDER)[2]


def dynamic_route_problems(route: DynamicRoute) -> list[str]:
    """What is wrong in a dynamic route on its own (each names the field and the fix)."""
    problems = []
    needs_name = route.from_ in (NameFrom.FIELD, NameFrom.HEADER)
    if needs_name and route.name is None:
        problems.append(f"name: from {route.from_.value} needs the field's or header's name; set name")
    if not needs_name and route.name is not None:
        problems.append(f"name: from {route.from_.value} takes no name; remove it")
    if route.name_template.count(PLACEHOLDER) != 1:
        problems.append("nameTemplate: use {value} exactly once, e.g. 'events_{value}'")
    else:
        fixed = route.prefix + route.suffix
        if re.fullmatch(r"[A-Za-z0-9_]*", fixed) is None or (route.prefix[:1].isdigit()):
            problems.append(
                f"nameTemplate: {route.name_template!r}: the text around {{value}} must be letters, digits "
                "and '_', not starting with a digit"
            )
    if route.pattern is not None:
        try:
            compiled = re.compile(route.pattern)
        except re.error as error:
            problems.append(f"pattern: {route.pattern!r} is not a regex ({error}); fix it")
        else:
            if (costly := costly_problem(route.pattern)) is not None:
                problems.append(f"pattern: {costly}")
            if (python_only := _PYTHON_ONLY.search(route.pattern)) is not None:
                problems.append(
                    f"pattern: {python_only.group(0)!r} is Python's syntax, not Java's (Spark runs the "
                    "pattern): use a plain group, '(?:...)' or the inline flags i, m, s, x"
                )
            if compiled.groups > 1:
                problems.append(
                    f"pattern: {route.pattern!r} has {compiled.groups} groups; use one (the value)"
                )
    return problems
