"""A route's own columns, key and order (`spec.routes[i].schema`, `key`, `sequenceBy`): a table per source
table of one StreamingTable (a Debezium topic per table of a database, each with its own columns and key).

A route that gives any of them is its own table in every respect the record's meaning touches: its records
are decoded with its schema (json only: a registry format decodes every route with one schema), keyed by
its key, ordered by its sequenceBy; what it does not give is spec's. `StreamingTableSpec.route_spec` is the
spec a plain StreamingTable of the route's table would have (`route_update`), which the writer, the table's
creation and `icefall read --table` use for it. Its condition still sees the record as spec.format.schema
decodes it (and `_kafka`): the route is known before its schema applies.

Guarantees: a route that validates has a schema Spark writes, a key of required primitive fields of that
schema (not float or double), partition and sort columns of that schema. Not guaranteed here: that the
records fit (each one that does not is a dead letter naming the route's table).
"""

from __future__ import annotations

from typing import Any

from icefall.api.base import Loc
from icefall.api.format import Format, FormatType, Transforms
from icefall.api.mode import TableMode, key_problems, sequence_problems
from icefall.api.routes import Route
from icefall.api.table import layout_problems


def route_update(
    route: Route, fmt: Format, key: list[str] | None, sequence_by: list[str] | None
) -> dict[str, Any] | None:
    """What route `route`'s table changes of the spec (`fmt`, `key`, `sequence_by`: spec's) when the route
    decodes its records its own way (its schema, key or sequenceBy; what it does not give is spec's): a
    `model_copy` update making a plain spec, without routes, of it; None when it decodes them as spec.table
    does (`StreamingTableSpec.route_spec`)."""
    if not route.decodes_own:
        return None
    if route.schema_fields is not None:
        fmt = fmt.model_copy(update={"schema_fields": route.schema_fields})
    return {
        "format": fmt,
        "key": route.key if route.key is not None else key,
        "sequence_by": route.sequence_by if route.sequence_by is not None else sequence_by,
        "routes": [],
        "dynamic_route": None,
        "unrouted": None,
    }


def own_route_problems(
    routes: list[Route], fmt: Format, mode: TableMode, key: list[str] | None, transforms: Transforms
) -> list[tuple[Loc, str]]:
    """Each route's own schema, key and sequenceBy against the rest of the spec (its `format`, `mode`,
    `key`, `transforms`); paths relative to `spec`."""
    problems: list[tuple[Loc, str]] = []
    for i, route in enumerate(routes):
        if route.decodes_own:
            found = _problems(route, fmt, mode, key, transforms)
            problems += [(("routes", i, *loc), message) for loc, message in found]
    return problems


def _problems(
    route: Route, spec_format: Format, mode: TableMode, spec_key: list[str] | None, transforms: Transforms
) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    own = "schema" if route.schema_fields is not None else "key" if route.key is not None else "sequenceBy"
    if spec_format.type is not FormatType.JSON:
        problems.append(
            (
                (own,),
                f"a route's own {own} is for json records for now: format {spec_format.type.value} decodes "
                "every route with one schema (the registry's); remove it, or route json records",
            )
        )
        return problems
    if transforms.select is not None or transforms.filter is not None:
        problems.append(
            (
                (own,),
                "spec.transforms apply to spec.format.schema's columns, not a route's own: remove "
                "spec.transforms, or this route's schema, key and sequenceBy",
            )
        )
    fields = route.schema_fields if route.schema_fields is not None else spec_format.schema_fields
    fmt = spec_format.model_copy(update={"schema_fields": fields})
    key = route.key if route.key is not None else spec_key
    where = "this route's schema" if route.schema_fields is not None else "spec.format.schema"
    for loc, message in key_problems(mode, key, fmt):
        text = message.replace("format.schema", where)
        if route.key is None:  # spec.key, checked against this route's schema
            problems.append((("schema",), f"spec.key: {text}; or set key here"))
        else:
            problems.append((loc, text))
    if route.sequence_by is not None:
        problems += sequence_problems(mode, route.sequence_by, None)
    table = route.table
    for loc, message in layout_problems(fields, table.partitioning, table.sort_order):
        problems.append((("table", *loc), message))
    return problems
