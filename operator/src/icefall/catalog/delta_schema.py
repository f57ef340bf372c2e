"""How a Delta table's schema follows the spec: `plan_delta_schema(table, wanted, source=...)`.

The rules are `icefall.catalog.evolution`'s, not a second set: both Spark schemas (a Delta table's
`schemaString` is Spark's JSON schema) are read as Iceberg schemas (`spark_struct_to_iceberg`) and compared
by `plan_evolution`, and its changes are then made on the table's Spark JSON:
- a new field (by name, at any depth) is added as optional: the rows already written read it as null (their
  Parquet files lack the column); a new top-level field goes before Icefall's own columns (`_kafka`);
- a required field (list element, map value) becomes optional.

Refused, one line per field with its fix, as for Iceberg: a type changed or narrowed, a new required field
from the spec, a required field the spec dropped, a map's key type. Also refused for Delta: every type
widening (int → long, float → double, a wider decimal, byte/short → int), which Delta can do only with its
`typeWidening` table feature (reader and writer feature, the type history in each column's metadata); Icefall
does not write that feature yet, and a reader without it would misread the old files. And a new field whose
name differs from an existing one only in case (Delta's column names are case-insensitive).

A registry format's table follows the spec's schema (the subject's latest, without an inline one) and each
writer schema its batches meet: `plan_delta_schemas` plans them in turn on one schema.

Pure: JSON in, JSON out. `wanted_schema` builds the schema a writer wants from its batch's Spark schema and
the spec's fields (which carry the spec's `required`; Spark's JSON decoding makes every column nullable).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icefall.catalog.evolution import AddField, Change, MakeOptional, plan_evolution
from icefall.catalog.layout import KAFKA_COLUMN, SEQUENCE_COLUMN, TableLayoutError, spark_struct_to_iceberg

#: Icefall's own columns: last in the table.
OWN_COLUMNS = (KAFKA_COLUMN, SEQUENCE_COLUMN)

NO_WIDENING = (
    "widening a Delta table's column needs Delta's typeWidening table feature, which Icefall does not "
    "support for Delta tables yet: keep the old type in the spec, or write the new values to a new field"
)
#: Spark integer types that Iceberg reads as one (`int`): their order, narrowest first.
_SMALL_INTEGERS = ("byte", "short", "integer")

Json = dict[str, Any]


class DeltaSchemaRefusedError(ValueError):
    """The spec (or a writer schema of its records) asks a change of the Delta table's schema that it cannot
    follow; one line (with fix) each."""

    def __init__(
        self, location: str, refused: Sequence[str], *, of: str = "the spec's schema", then: str = ""
    ) -> None:
        """`of`: whose schema it cannot follow; `then`: a last line (what else to do)."""
        self.location = location
        self.refused = tuple(refused)
        lines = "\n".join(f"  - {line}" for line in self.refused)
        super().__init__(
            f"the Delta table at {location} cannot follow {of} (nothing was written):\n{lines}"
            + (f"\n{then}" if then else "")
        )


@dataclass(frozen=True)
class DeltaSchemaPlan:
    """The table's schema after the change (`schema_string`: the table's own when nothing changes), the
    changes, and what is refused (then nothing changes)."""

    schema_string: str
    changes: tuple[Change, ...] = ()
    refused: tuple[str, ...] = ()

    def describe(self) -> str:
        return "; ".join(str(change) for change in self.changes)


def plan_delta_schema(
    table: str, wanted: str | Mapping[str, Any], *, source: str, relax_required: bool = False
) -> DeltaSchemaPlan:
    """What makes the Delta table's schema `table` (its schemaString) hold `wanted` (a Spark JSON schema);
    `source` names `wanted` in messages (`spec.format.schema`), `relax_required` as `plan_evolution`."""
    have = json.loads(table)
    want: Json = json.loads(wanted) if isinstance(wanted, str) else dict(wanted)
    try:
        evolution = plan_evolution(
            spark_struct_to_iceberg(have),
            spark_struct_to_iceberg(want),
            source=source,
            relax_required=relax_required,
            last=OWN_COLUMNS,
            table_format="Delta Lake",
            no_widening=NO_WIDENING,
        )
    except TableLayoutError as error:
        return DeltaSchemaPlan(table, refused=(f"{source}: {error}",))
    refused = [*evolution.refused, *_small_integer_widenings(have, want, (), source)]
    refused += _case_clashes(have, want, evolution.changes, source)
    if refused:
        return DeltaSchemaPlan(table, refused=tuple(dict.fromkeys(refused)))
    if not evolution.changes:
        return DeltaSchemaPlan(table)
    evolved = copy.deepcopy(have)
    for change in evolution.changes:
        if isinstance(change, AddField):
            _add(evolved, want, change.path, before=evolution.before)
        elif isinstance(change, MakeOptional):
            _make_optional(evolved, change.path)
    return DeltaSchemaPlan(json.dumps(evolved, separators=(",", ":")), evolution.changes)


@dataclass(frozen=True)
class Wanted:
    """A schema the table must hold: `schema` (Spark JSON), `source` naming it in messages
    (`spec.format.schema`, `writer schema id 7`), `relax_required` as `plan_evolution`'s."""

    source: str
    schema: Mapping[str, Any]
    relax_required: bool = False


def plan_delta_schemas(table: str, wanted: Sequence[Wanted]) -> DeltaSchemaPlan:
    """`plan_delta_schema` of each of `wanted` in turn, each on the schema the ones before it made (the
    first to add a field decides its type): the spec's, then a registry format's writer schemas, oldest id
    first. Whatever is refused of any of them, nothing changes."""
    schema, changes, refused = table, list[Change](), list[str]()
    for want in wanted:
        plan = plan_delta_schema(schema, want.schema, source=want.source, relax_required=want.relax_required)
        refused += plan.refused
        schema, changes = plan.schema_string, [*changes, *plan.changes]
    if refused:
        return DeltaSchemaPlan(table, refused=tuple(dict.fromkeys(refused)))
    return DeltaSchemaPlan(schema, tuple(changes)) if changes else DeltaSchemaPlan(table)


def wanted_schema(rows: str | Mapping[str, Any], spec_fields: Mapping[str, Any] | None) -> Json:
    """The schema a writer wants: its batch's Spark schema `rows`, each top-level column the spec declares
    as the spec says it (`icefall.api.to_spark_schema_json` of spec.format.schema: its `required`, at any
    depth); `spec_fields` None (a `transforms.select`): `rows` as they are."""
    data: Json = json.loads(rows) if isinstance(rows, str) else copy.deepcopy(dict(rows))
    if spec_fields is None:
        return data
    declared = {f["name"]: f for f in spec_fields["fields"]}
    data["fields"] = [copy.deepcopy(declared.get(f["name"], f)) for f in data["fields"]]
    return data


def written_schema(rows: str | Mapping[str, Any], table: str) -> Json | None:
    """The schema a batch's rows are written with into a table of schema `table`: the rows' own (`rows`,
    their Spark schema), each value of a type the table holds wider (a narrower type in the spec, which the
    rules accept: every value fits) of the table's type, as Delta's own writer casts; names and
    nullability the rows'. None: the rows have the table's types already (the usual case)."""
    have: Json = json.loads(rows) if isinstance(rows, str) else copy.deepcopy(dict(rows))
    cast = _as_table(have, json.loads(table))
    return None if cast == have else cast


def _as_table(rows: Any, table: Any) -> Any:
    if isinstance(rows, str) or isinstance(table, str):
        both = isinstance(rows, str) and isinstance(table, str)
        return table if both else rows  # a different shape: refused by the plan, left as it is
    kind = rows.get("type")
    if kind != table.get("type"):
        return rows
    if kind == "struct":
        types = {f["name"]: f["type"] for f in table["fields"]}
        fields = [
            {**f, "type": _as_table(f["type"], types[f["name"]])} if f["name"] in types else f
            for f in rows["fields"]
        ]
        return {**rows, "fields": fields}
    if kind == "array":
        return {**rows, "elementType": _as_table(rows["elementType"], table["elementType"])}
    if kind == "map":
        key, value = (
            _as_table(rows["keyType"], table["keyType"]),
            _as_table(rows["valueType"], table["valueType"]),
        )
        return {**rows, "keyType": key, "valueType": value}
    return rows


def spec_schema_against(table: str, spec_fields: Mapping[str, Any]) -> Json:
    """The schema the spec wants, without a batch (`icefall validate`): the spec's fields, then Icefall's
    own columns as the table has them."""
    own = [f for f in json.loads(table)["fields"] if f["name"] in OWN_COLUMNS]
    return {"type": "struct", "fields": [*copy.deepcopy(list(spec_fields["fields"])), *own]}


def _type_at(root: Json, path: Sequence[str]) -> Any:
    """The Spark type at `path` (names in structs, `element` of an array, `value`/`key` of a map)."""
    node: Any = root
    for name in path:
        kind = node.get("type") if isinstance(node, dict) else None
        if kind == "struct":
            node = next(f for f in node["fields"] if f["name"] == name)["type"]
        elif kind == "array":
            node = node["elementType"]
        elif kind == "map":
            node = node["valueType"] if name == "value" else node["keyType"]
        else:
            raise KeyError(f"no field at {'.'.join(path)}")
    return node


def _add(evolved: Json, want: Json, path: Sequence[str], *, before: str | None) -> None:
    parent = _type_at(evolved, path[:-1])
    field = next(f for f in _type_at(want, path[:-1])["fields"] if f["name"] == path[-1])
    added = {**copy.deepcopy(field), "nullable": True}
    names = [f["name"] for f in parent["fields"]]
    at = names.index(before) if len(path) == 1 and before in names else len(names)
    parent["fields"].insert(at, added)


def _make_optional(evolved: Json, path: Sequence[str]) -> None:
    parent = _type_at(evolved, path[:-1])
    if parent.get("type") == "array" and path[-1] == "element":
        parent["containsNull"] = True
    elif parent.get("type") == "map" and path[-1] == "value":
        parent["valueContainsNull"] = True
    else:
        next(f for f in parent["fields"] if f["name"] == path[-1])["nullable"] = True


def _small_integer_widenings(have: Any, want: Any, path: tuple[str, ...], source: str) -> list[str]:
    """Widenings among byte, short and int, which Iceberg's types cannot tell apart (all `int`)."""
    if isinstance(have, str) and isinstance(want, str):
        small = have in _SMALL_INTEGERS and want in _SMALL_INTEGERS
        if small and _SMALL_INTEGERS.index(want) > _SMALL_INTEGERS.index(have):
            return [f"field '{'.'.join(path)}': the table has {have}, {source} has {want}; {NO_WIDENING}"]
        return []
    if not (isinstance(have, dict) and isinstance(want, dict)) or have.get("type") != want.get("type"):
        return []  # a different shape: plan_evolution refuses it
    kind = have["type"]
    if kind == "struct":
        wanted = {f["name"]: f["type"] for f in want["fields"]}
        return [
            line
            for f in have["fields"]
            if f["name"] in wanted
            for line in _small_integer_widenings(f["type"], wanted[f["name"]], (*path, f["name"]), source)
        ]
    if kind == "array":
        return _small_integer_widenings(have["elementType"], want["elementType"], (*path, "element"), source)
    if kind == "map":
        return _small_integer_widenings(have["valueType"], want["valueType"], (*path, "value"), source)
    return []


def _case_clashes(have: Json, want: Json, changes: Sequence[Change], source: str) -> list[str]:
    """New fields whose names differ from a field beside them only in case: one column to Delta."""
    refused = []
    for change in changes:
        if not isinstance(change, AddField):
            continue
        try:
            beside = [f["name"] for f in _type_at(have, change.path[:-1])["fields"]]
        except (KeyError, StopIteration):
            continue  # inside a field that is new itself
        name = change.path[-1]
        clash = next((b for b in beside if b.lower() == name.lower()), None)
        if clash is not None:
            where = ".".join(change.path)
            refused.append(
                f"field '{where}' is new in {source}, and the table has '{clash}': Delta's column names "
                "are case-insensitive, so they would be one column; spell it as the table does, or give it "
                "another name"
            )
    return refused
