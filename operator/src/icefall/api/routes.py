"""Static routes (`spec.routes`): one topic into several tables, each record to the first route whose
condition holds; `spec.unrouted` says where the records no route takes go.

A route's condition (`when`) is a Spark SQL boolean expression over the record as decoded, before
`spec.transforms`: the fields of `spec.format.schema` by name, and `_kafka`, a struct of `topic`,
`partition`, `offset`, `timestamp`, `key` (the Kafka key as UTF-8 text) and `headers` (a map of each
header's name to its value as UTF-8 text; the first of a repeated name). It is checked like a transform
(`icefall.api.sql_expressions`: record-local functions only, no query, no file read); a condition that is
null counts as false. A route's table lives in `spec.table`'s catalog, by default in its namespace, with its
own partitioning, sort order and properties, and the columns of `spec.table`.

Not guaranteed here: that Spark accepts the condition (its columns and types are checked when the pipeline
starts, and a failure names the route).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from icefall.api.base import IDENTIFIER_PATTERN, NAMESPACE_PATTERN, ApiModel
from icefall.api.sql_expressions import expression_problem
from icefall.api.table import PartitionField, SortField, layout_duplicates, unreserved_properties

#: Most routes one StreamingTable may have: each is a table committed every batch.
MAX_ROUTES = 64
#: The reason a dead letter of an unrouted record gives (`spec.unrouted: DeadLetter`).
UNROUTED_REASON = "unrouted: no route's condition holds (spec.unrouted: DeadLetter)"


class Unrouted(StrEnum):
    """Where a record goes that no route takes."""

    TABLE = "Table"  # spec.table: the default table
    DEAD_LETTER = "DeadLetter"  # the dead-letter table (and topic), with UNROUTED_REASON


class RouteTable(ApiModel):
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
    def _no_duplicates(self) -> RouteTable:
        layout_duplicates(self.partitioning, self.sort_order)
        return self


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

    @field_validator("when")
    @classmethod
    def _record_local(cls, value: str) -> str:
        problem = expression_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value
