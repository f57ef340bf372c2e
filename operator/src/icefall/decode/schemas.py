"""The table's schema follows the records' schema: the spec's columns, and each writer schema a batch holds.

`SchemaFollower.evolution(table schema, writers)` is what the table must change before a batch is
written (`icefall.catalog.evolution`): the spec's expected schema (`spec.format.schema`, or what
`transforms.select` produces; changed by a `kubectl apply`), then, for a registry format without
`transforms.select`, the fields of every writer schema the batch is decoded with (those the writer has
met, `icefall.decode.known_writers`), oldest id first (for `mode: cdc` the fields of the row record inside
each Debezium envelope, `icefall.api.avro.row_schema`: the envelope itself is not the row).
`icefall.ingest.batches` commits the changes (`icefall.commit.evolve_schema`) before it writes the batch,
and the writer then decodes into the table's columns (`decode_fields`): a writer's new field lands in the
batch that first carries it (a batch that meets a new writer schema is written again with it), old rows
read it as null.

`SchemaFollower.plan(table schema, writers)`, after the write with the writer schemas of the batch's own
records: what the table cannot follow is logged once per message, counted in
`icefall_schema_changes_refused` and kept in `refused` for the writer's status; the batch is written all
the same: a value that does not fit its column sends its record to the dead-letter table with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from icefall.api import Format, SchemaField, TableMode, fields_from_iceberg, to_iceberg_schema
from icefall.api.avro import row_schema
from icefall.api.registry_schema import fields_from_registry_schema
from icefall.catalog.evolution import AddField, Change, Evolution, plan_evolution
from icefall.catalog.layout import KAFKA_COLUMN, SEQUENCE_COLUMN
from icefall.runtime import metrics

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from icefall.api import StreamingTableSpec

log = logging.getLogger(__name__)

#: Icefall's own columns: last in the table, never decoded from a record.
OWN_COLUMNS = (KAFKA_COLUMN, SEQUENCE_COLUMN)

Writers = Mapping[int, str | None]
#: Plans remembered per (table schema, writer ids); a writer rarely sees more than a few combinations.
MAX_PLANS_KEPT = 256


class SchemaFollower:
    """What one writer's table must change to hold its records; built once per writer."""

    def __init__(self, spec: StreamingTableSpec, expected: Schema, label: str) -> None:
        """`expected`: the table's schema as the spec says (`icefall.catalog.layout.expected_schema`)."""
        self.expected = expected
        self.label = label
        self.format = spec.format
        self.relax_required = spec.format.type.uses_registry
        self.follow_writers = follows_table(spec)
        self.envelopes = spec.mode is TableMode.CDC
        self.refused: tuple[str, ...] = ()
        self._planned: dict[tuple[int, frozenset[int]], Evolution] = {}
        self._logged: set[str] = set()

    def plan(self, actual: Schema, writers: Writers | None) -> Evolution:
        """The changes `actual` needs for the spec and `writers` (those of a batch's records), and what
        of them it cannot follow is reported (`refused`)."""
        evolution = self.evolution(actual, writers)
        self._report(evolution)
        return evolution

    def evolution(self, actual: Schema, writers: Writers | None) -> Evolution:
        """`plan` without the report: for the writer schemas a batch is decoded with, which may be more
        than its records have (memoized: most batches change nothing)."""
        ids = frozenset(i for i, text in (writers or {}).items() if text is not None)
        key = (actual.schema_id, ids if self.follow_writers else frozenset())
        if key not in self._planned:
            if len(self._planned) >= MAX_PLANS_KEPT:
                self._planned.clear()
            self._planned[key] = self._plan(actual, writers or {})
        return self._planned[key]

    def _plan(self, actual: Schema, writers: Writers) -> Evolution:
        plans = [
            plan_evolution(
                actual,
                self.expected,
                source="spec.format.schema",
                relax_required=self.relax_required,
                last=OWN_COLUMNS,
            )
        ]
        refused: list[str] = []
        for schema_id, text in sorted(writers.items()) if self.follow_writers else ():
            if text is None:
                continue  # an unknown id: its records are dead letters
            try:
                wanted = to_iceberg_schema(writer_fields(self.format, text, cdc=self.envelopes))
            except ValueError as error:  # the mapping's errors (AvroSchemaError, ...) are ValueErrors
                refused.append(f"writer schema id {schema_id}: {error}")
                continue
            source = f"writer schema id {schema_id}"
            plans.append(plan_evolution(actual, wanted, source=source, relax_required=True, last=OWN_COLUMNS))
        changes: dict[tuple[str, tuple[str, ...]], Change] = {}
        for plan in plans:
            for change in plan.changes:
                key = (type(change).__name__, change.path)
                if isinstance(change, AddField) and key in changes:
                    continue  # the first to add a field decides its type; a later widening wins
                changes[key] = change
            refused.extend(plan.refused)
        return Evolution(tuple(changes.values()), tuple(dict.fromkeys(refused)), plans[0].before)

    def _report(self, evolution: Evolution) -> None:
        """What this batch's records need and the table cannot follow (each message logged once)."""
        for message in evolution.refused:
            if message not in self._logged:
                self._logged.add(message)
                log.warning("%s: the table cannot follow a schema change: %s", self.label, message)
        self.refused = evolution.refused
        metrics.SCHEMA_CHANGES_REFUSED.labels(self.label).set(len(evolution.refused))

    def committed(self, evolution: Evolution) -> None:
        """`evolution` is in the table now."""
        log.info("%s: schema changed: %s", self.label, evolution.describe())
        metrics.SCHEMA_CHANGES.labels(self.label).inc()


def writer_fields(fmt: Format, text: str, *, cdc: bool) -> list[SchemaField]:
    """The row fields of writer schema `text` (of `fmt`'s type), for `cdc` those of the row record inside
    Debezium's envelope (`row_schema`). ValueError (AvroSchemaError, ...) for one that does not map."""
    return fields_from_registry_schema(fmt, row_schema(text) if cdc else text)


def decode_fields(table_schema: Schema) -> list[SchemaField]:
    """The fields a registry format decodes into: the table's columns but Icefall's own."""
    return [f for f in fields_from_iceberg(table_schema.as_struct()) if f.name not in OWN_COLUMNS]


def follows_table(spec: StreamingTableSpec) -> bool:
    """Whether records decode into the table's columns (a registry format without `transforms.select`,
    whose table follows its writer schemas) rather than into the spec's fields."""
    return spec.format.type.uses_registry and not spec.transforms.select


def decoding_spec(spec: StreamingTableSpec, table_schema: Schema) -> StreamingTableSpec:
    """`spec` as records are decoded into a table with `table_schema`: by ingestion, audit and union reads."""
    if not follows_table(spec):
        return spec
    fields = decode_fields(table_schema)
    return spec.model_copy(update={"format": spec.format.model_copy(update={"schema_fields": fields})})


def schema_at(table: Table, snapshot_id: int | None) -> Schema:
    """The table's schema when `snapshot_id` was written (the current one without a snapshot)."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
    if snapshot is not None and snapshot.schema_id is not None:
        for schema in table.metadata.schemas:
            if schema.schema_id == snapshot.schema_id:
                return schema
    return table.schema()
