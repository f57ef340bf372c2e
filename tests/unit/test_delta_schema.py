"""Which spec changes a Delta table's schema follows (`icefall.catalog.delta_schema`), by the rules of
`icefall.catalog.evolution`, on Spark's JSON schemas, and how a commit carries the change.

Proves: a new optional field is added as nullable (top level before `_kafka`, inside a struct, inside a
list's struct element), a required field becomes nullable; nothing changes when the spec matches (the
spec's `required` on a column the table holds as nullable changes nothing); refused with the field named
and the fix, nothing changed: a new required field, a changed type, every widening (int → long, short →
int: Delta's typeWidening is not supported), a name that differs only in case; `wanted_schema` takes the
spec's nullability; the commit of a batch with a new schema holds it in the same log entry as the rows and
the offsets, upgrades the protocol for a new timestamp_ntz column, and a batch planned on an older schema
is refused. A registry format's table: the spec's schema and each writer schema planned in turn on one
schema (the first to add a field decides its type, a later writer's other type refuses the whole plan), a
writer schema's required field added as optional; the refusal names whose schema it is and the fix; the
writer's schema source is named by the subject without an inline schema; the registry is one of the
services an outage may name, without its credentials.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from icefall.api import SchemaField, to_spark_schema_json
from icefall.catalog.delta_schema import (
    DeltaSchemaRefusedError,
    Wanted,
    plan_delta_schema,
    plan_delta_schemas,
    spec_schema_against,
    wanted_schema,
    written_schema,
)
from icefall.catalog.evolution import AddField, MakeOptional
from icefall.commit import StaleHeadError
from icefall.commit.batch import Batch
from icefall.commit.delta import AddFile, DeltaLog, commit_batch, create_table, protocol_after

pytestmark = pytest.mark.unit


def field(name: str, kind: Any, nullable: bool = True) -> dict[str, Any]:
    return {"name": name, "type": kind, "nullable": nullable, "metadata": {}}


KAFKA = field(
    "_kafka",
    {
        "type": "struct",
        "fields": [field("partition", "integer"), field("offset", "long"), field("timestamp", "timestamp")],
    },
    nullable=False,
)
ITEMS = {
    "type": "array",
    "elementType": {"type": "struct", "fields": [field("sku", "string")]},
    "containsNull": False,
}


def struct(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "fields": list(fields)}


TABLE = struct(field("id", "long"), field("qty", "integer"), field("items", ITEMS), KAFKA)


def plan(wanted: dict[str, Any], table: dict[str, Any] = TABLE):  # type: ignore[no-untyped-def]
    return plan_delta_schema(json.dumps(table), wanted, source="spec.format.schema")


def names(schema_string: str) -> list[str]:
    return [f["name"] for f in json.loads(schema_string)["fields"]]


def test_the_same_schema_changes_nothing() -> None:
    same = plan(TABLE)
    assert (same.changes, same.refused) == ((), ())
    assert same.schema_string == json.dumps(TABLE)
    # The spec says id is required; the table (from Spark's JSON decoding) has it nullable: nothing to do.
    required_id = struct(field("id", "long", nullable=False), *TABLE["fields"][1:])
    assert plan(required_id).changes == ()


def test_a_new_optional_field_is_added_before_kafka_and_nested_ones_in_place() -> None:
    items = {**ITEMS, "elementType": struct(field("sku", "string"), field("size", "integer"))}
    wanted = struct(
        field("id", "long"), field("qty", "integer"), field("items", items), field("note", "string"), KAFKA
    )
    evolved = plan(wanted)
    assert evolved.refused == ()
    assert all(isinstance(c, AddField) for c in evolved.changes)
    assert {c.path for c in evolved.changes} == {("note",), ("items", "element", "size")}
    new = json.loads(evolved.schema_string)
    assert names(evolved.schema_string) == ["id", "qty", "items", "note", "_kafka"]
    assert new["fields"][3] == field("note", "string")
    element = new["fields"][2]["type"]["elementType"]
    assert element["fields"] == [field("sku", "string"), field("size", "integer")]
    assert "add optional field 'note' string" in evolved.describe()


def test_a_new_field_the_spec_marks_required_is_refused_from_the_spec_and_added_from_a_writer() -> None:
    wanted = struct(*TABLE["fields"][:3], field("region", "string", nullable=False), KAFKA)
    refused = plan(wanted)
    assert refused.changes == () and refused.schema_string == json.dumps(TABLE)
    [line] = refused.refused
    assert "'region' is new in spec.format.schema and required" in line and "required: false" in line
    relaxed = plan_delta_schema(json.dumps(TABLE), wanted, source="writer", relax_required=True)
    assert relaxed.refused == () and json.loads(relaxed.schema_string)["fields"][3]["nullable"] is True


def test_required_becomes_nullable() -> None:
    table = struct(field("id", "long", nullable=False), field("items", ITEMS), KAFKA)
    items = {**ITEMS, "containsNull": True}
    evolved = plan(struct(field("id", "long"), field("items", items), KAFKA), table)
    assert set(evolved.changes) == {MakeOptional(("id",)), MakeOptional(("items", "element"))}
    new = json.loads(evolved.schema_string)
    assert new["fields"][0]["nullable"] is True and new["fields"][1]["type"]["containsNull"] is True


@pytest.mark.parametrize(
    ("have", "want", "says"),
    [
        ("long", "string", "Delta Lake cannot change it"),
        ("integer", "long", "typeWidening"),
        ("float", "double", "typeWidening"),
        ("decimal(10,2)", "decimal(12,2)", "typeWidening"),
        ("short", "integer", "typeWidening"),
        ("integer", "date", "Delta Lake cannot change it"),
    ],
)
def test_a_changed_or_widened_type_is_refused_naming_the_field(have: str, want: str, says: str) -> None:
    table = struct(field("id", "long"), field("qty", have), KAFKA)
    refused = plan(struct(field("id", "long"), field("qty", want), KAFKA), table)
    assert refused.changes == () and len(refused.refused) == 1
    [line] = refused.refused
    assert line.startswith("field 'qty': the table has ") and says in line
    assert "a new field" in line  # the fix


def test_a_narrower_type_fits_and_changes_nothing() -> None:
    table = struct(field("id", "long"), KAFKA)
    assert plan(struct(field("id", "integer"), KAFKA), table).changes == ()
    assert plan(struct(field("id", "integer"), KAFKA), table).refused == ()


def test_a_name_that_differs_only_in_case_is_refused() -> None:
    refused = plan(struct(*TABLE["fields"][:3], field("ID", "long"), KAFKA))
    [line] = refused.refused
    assert "'ID' is new" in line and "'id'" in line and "case-insensitive" in line


def test_wanted_schema_takes_the_specs_nullability_and_keeps_own_columns() -> None:
    spec = to_spark_schema_json(
        [SchemaField(name="id", type="long", required=True), SchemaField(name="note", type="string")]
    )
    rows = struct(field("id", "long"), field("note", "string"), KAFKA)
    wanted = wanted_schema(json.dumps(rows), spec)
    assert [f["nullable"] for f in wanted["fields"]] == [False, True, False]
    assert wanted_schema(rows, None) == rows  # transforms.select: the rows as they are
    against = spec_schema_against(json.dumps(TABLE), spec)
    assert [f["name"] for f in against["fields"]] == ["id", "note", "_kafka"]


def batch(start: int, end: int) -> Batch:
    return Batch(topic="t", start={0: start}, end={0: end}, topic_id="tid", max_produce_time_ms=end)


def test_a_new_schema_lands_in_the_batchs_own_log_entry(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, json.dumps(TABLE), epoch=1)
    wider = struct(*TABLE["fields"][:3], field("seen", "timestamp_ntz"), KAFKA)
    evolved = plan(wider)
    version = commit_batch(
        log, planned, batch(0, 5), 1, [AddFile("p.parquet", 1, 5)], schema_string=evolved.schema_string
    )
    actions = log.actions(version)
    assert [next(iter(a)) for a in actions] == ["commitInfo", "protocol", "metaData", "add"]
    assert actions[1]["protocol"]["readerFeatures"] == ["timestampNtz"]
    assert actions[1]["protocol"]["writerFeatures"] == ["appendOnly", "invariants", "timestampNtz"]
    snapshot = log.snapshot()
    assert snapshot.schema_string == evolved.schema_string and snapshot.committed.offsets == {0: 5}
    assert names(snapshot.schema_string) == ["id", "qty", "items", "seen", "_kafka"]
    # The next batch changes nothing: the Metadata keeps the schema.
    again = commit_batch(log, snapshot, batch(5, 7), 1, [], schema_string=None)
    assert log.snapshot().schema_string == evolved.schema_string and again == version + 1
    assert [next(iter(a)) for a in log.actions(again)] == ["commitInfo", "metaData"]
    # Someone else changes the schema (an ALTER TABLE, icefall.* left alone): a batch planned before it is
    # refused, as its files and its own schema change were planned on the schema it replaced.
    planned = log.snapshot()
    assert planned.metadata is not None
    altered = {**planned.metadata, "schemaString": json.dumps(struct(*TABLE["fields"], field("x", "string")))}
    assert log.try_commit(again + 1, [{"metaData": altered}])
    with pytest.raises(StaleHeadError, match="schema changed"):
        commit_batch(log, planned, batch(7, 9), 1, [], schema_string=None)


def test_the_protocol_only_grows() -> None:
    plain = json.dumps(TABLE)
    assert protocol_after({"minReaderVersion": 1, "minWriterVersion": 2}, plain) is None
    ntz = json.dumps(struct(field("t", "timestamp_ntz")))
    keyed = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["appendOnly", "invariants", "deletionVectors"],
    }
    assert protocol_after(keyed, ntz) == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors", "timestampNtz"],
        "writerFeatures": ["appendOnly", "invariants", "deletionVectors", "timestampNtz"],
    }
    assert protocol_after({**keyed, "readerFeatures": ["timestampNtz"]}, ntz) is None


MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "127.0.0.1:9092", topic: orders}
  format: {type: json, schema: [%s]}
  table: {format: delta, location: "%s"}
"""


def test_validate_checks_the_spec_against_an_existing_local_delta_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from icefall import cli
    from icefall.commands.common import EXIT_INVALID

    location = tmp_path / "orders"
    manifest = tmp_path / "orders.yaml"

    def validate(fields: str) -> tuple[int, str]:
        manifest.write_text(MANIFEST % (fields, location))
        code = cli.main(["validate", "-f", str(manifest)])
        return code, capsys.readouterr().out

    base = "{name: id, type: long, required: true}, {name: amount, type: 'decimal(10,2)'}"
    assert validate(base) == (0, f"{manifest}: valid (StreamingTable orders)\n")  # no table yet
    create_table(
        DeltaLog(str(location)),
        json.dumps(struct(field("id", "long"), field("amount", "decimal(10,2)"), KAFKA)),
        1,
    )
    assert validate(base)[0] == 0
    code, said = validate(base + ", {name: region, type: string}")
    assert code == 0 and "changes with the next batch: add optional field 'region' string" in said
    code, said = validate("{name: id, type: long}, {name: amount, type: string}")
    assert code == EXIT_INVALID
    assert (
        "spec.format.schema: the Delta table at" in said
        and "field 'amount': the table has decimal(10,2)" in said
    )
    code, said = validate(base + ", {name: region, type: string, required: true}")
    assert code == EXIT_INVALID and "'region' is new in spec.format.schema and required" in said


def test_rows_of_a_narrower_type_are_written_as_the_tables() -> None:
    table = json.dumps(
        struct(field("id", "long"), field("items", ITEMS), field("amount", "decimal(10,2)"), KAFKA)
    )
    same = struct(field("id", "long"), field("items", ITEMS), field("amount", "decimal(10,2)"), KAFKA)
    assert written_schema(same, table) is None
    narrow_items = {**ITEMS, "elementType": struct(field("sku", "string"), field("n", "byte"))}
    rows = struct(
        field("id", "integer", nullable=False),
        field("items", narrow_items),
        field("amount", "decimal(8,2)"),
        KAFKA,
    )
    cast = written_schema(json.dumps(rows), table)
    assert cast is not None
    assert [f["type"] for f in cast["fields"]][0::2] == ["long", "decimal(10,2)"]
    assert cast["fields"][0]["nullable"] is False  # the rows' own nullability
    # A field the table does not have yet (added by this batch's commit) is written as it is.
    assert cast["fields"][1]["type"]["elementType"]["fields"][1] == field("n", "byte")


def test_the_specs_and_each_writer_schemas_changes_are_planned_in_turn() -> None:
    spec = Wanted("the latest schema of subject 'orders-value'", TABLE, relax_required=True)
    v2 = struct(field("id", "long"), field("qty", "integer"), field("note", "string", nullable=False))
    v3 = struct(field("id", "long"), field("note", "string"), field("tags", ITEMS))
    writers = [Wanted("writer schema id 7", v2, True), Wanted("writer schema id 9", v3, True)]
    evolved = plan_delta_schemas(json.dumps(TABLE), [spec, *writers])
    assert evolved.refused == ()
    assert [c.path for c in evolved.changes] == [("note",), ("tags",)]  # note once: v3 finds it there
    assert names(evolved.schema_string) == ["id", "qty", "items", "note", "tags", "_kafka"]
    assert json.loads(evolved.schema_string)["fields"][3] == field("note", "string")  # optional
    assert plan_delta_schemas(json.dumps(TABLE), [spec]).changes == ()

    # A later writer schema with another type for the field the first added: nothing changes at all.
    other = struct(field("id", "long"), field("note", "long"))
    refused = plan_delta_schemas(
        json.dumps(TABLE), [spec, *writers, Wanted("writer schema id 11", other, True)]
    )
    assert refused.changes == () and refused.schema_string == json.dumps(TABLE)
    [line] = refused.refused
    assert line.startswith("field 'note': the table has string, writer schema id 11 has long")


def test_a_refusal_names_whose_schema_it_cannot_follow_and_what_else_to_do() -> None:
    spec = DeltaSchemaRefusedError("/t", ["field 'a': ..."])
    assert (
        str(spec)
        == "the Delta table at /t cannot follow the spec's schema (nothing was written):\n  - field 'a': ..."
    )
    writers = DeltaSchemaRefusedError("/t", ["field 'a': ..."], of="its records' schemas", then="Do this.")
    assert str(writers).startswith("the Delta table at /t cannot follow its records' schemas (nothing")
    assert str(writers).endswith("\n  - field 'a': ...\nDo this.") and writers.refused == ("field 'a': ...",)


REGISTRY_MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "127.0.0.1:9092", topic: orders}
  format: {type: avro, registry: {url: "http://user:secret@registry:8081"}%s}
  table: {format: delta, location: /tables/orders}
"""


def test_a_registry_formats_columns_and_registry_are_named_in_messages() -> None:
    from icefall.api.manifest import parse_manifest
    from icefall.ingest.delta_sink import columns_source, delta_services
    from icefall.plan.outages import Service

    latest = parse_manifest(REGISTRY_MANIFEST % "").spec
    assert columns_source(latest) == "the latest schema of subject 'orders-value'"
    inline = parse_manifest(REGISTRY_MANIFEST % ", schema: [{name: id, type: long}]").spec
    assert columns_source(inline) == "spec.format.schema"
    services = delta_services(latest, "/tables/orders")
    assert services[Service.REGISTRY] == "http://registry:8081"  # no credentials in outage lines
    assert services[Service.OBJECT_STORE] == "/tables/orders"
