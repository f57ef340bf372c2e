"""`ensure_tables` creates the table and its dead-letter table on a real SqlCatalog, checks existing ones, and
what Spark writes into them (rows decoded by `prepare`) reads back through pyiceberg unchanged."""

from __future__ import annotations

import base64
import threading
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, LongType, NestedField, StringType, StructType
from pyspark.sql import SparkSession

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.catalog.layout import (
    DEAD_LETTER_SCHEMA,
    TableLayoutError,
    describe_type,
    expected_schema,
    spark_struct_to_iceberg,
)
from icefall.catalog.tables import TableMismatchError, ensure_tables
from icefall.decode.decode import prepare
from icefall.testing.streams import kafka_source_frame

pytestmark = pytest.mark.integration

PRODUCED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

SCHEMA = """
      - {name: id, type: long, required: true}
      - {name: name, type: string}
      - {name: amount, type: "decimal(10,2)"}
      - {name: ts, type: timestamptz, required: true}
      - {name: local, type: timestamp}
      - {name: day, type: date}
      - {name: ref, type: uuid}
      - {name: blob, type: binary}
      - {name: hash, type: "fixed[4]"}
      - name: customer
        type: struct
        fields:
          - {name: id, type: long, required: true}
          - {name: country, type: string}
      - name: items
        type: list
        element:
          type: struct
          fields:
            - {name: sku, type: string, required: true}
            - {name: qty, type: int}
      - {name: tags, type: list, element: {type: string}, elementRequired: true}
      - {name: attrs, type: map, key: {type: string}, value: {type: long}}
"""


def make_st(
    namespace: str, name: str, table: str = "", extra: str = "", dead_letter: str = ""
) -> StreamingTable:
    return load_manifest(
        f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: {name.replace("_", "-")}}}
spec:
  source: {{bootstrapServers: "localhost:9092", topic: orders}}
  format:
    type: json
    schema:
{SCHEMA}
  table:
    namespace: {namespace}
    name: {name}
{table}
{dead_letter}
{extra}
"""
    )


@pytest.fixture
def catalog(catalog_config: CatalogConfig) -> Catalog:
    return catalog_config.pyiceberg()


@pytest.fixture
def ns() -> str:
    return f"t_{uuid.uuid4().hex[:8]}"


ALL_TRANSFORMS = """
    partitioning:
      - {field: name, transform: identity}
      - {field: ts, transform: hour}
      - {field: local, transform: day}
      - {field: day, transform: month}
      - {field: customer.country, transform: "truncate[2]"}
      - {field: id, transform: "bucket[8]"}
    sortOrder:
      - {field: id}
      - {field: ts, direction: desc}
    properties: {write.target-file-size-bytes: "1048576"}
"""


def test_creates_the_tables_with_every_transform(catalog: Catalog, ns: str) -> None:
    st = make_st(ns, "orders", table=ALL_TRANSFORMS)
    table, dead_letter = ensure_tables(catalog, st)
    assert dead_letter is not None

    expected_columns = [f.name for f in st.spec.format.schema_fields] + ["_kafka"]
    assert [f.name for f in table.schema().fields] == expected_columns
    assert table.schema().find_field("customer.id").required
    kafka = table.schema().find_field("_kafka")
    assert describe_type(kafka.field_type) == "struct<partition: int, offset: long, timestamp: timestamptz>"
    assert [f.required for f in kafka.field_type.fields] == [True, True, False]  # type: ignore[attr-defined]
    schema = table.schema()
    assert [
        (f.name, str(f.transform), schema.find_column_name(f.source_id)) for f in table.spec().fields
    ] == [
        ("name", "identity", "name"),
        ("ts_hour", "hour", "ts"),
        ("local_day", "day", "local"),
        ("day_month", "month", "day"),
        ("customer.country_trunc", "truncate[2]", "customer.country"),
        ("id_bucket", "bucket[8]", "id"),
    ]
    assert [
        (schema.find_column_name(f.source_id), str(f.direction), str(f.null_order))
        for f in table.sort_order().fields
    ] == [
        ("id", "ASC", "NULLS FIRST"),
        ("ts", "DESC", "NULLS LAST"),
    ]
    assert table.properties["write.target-file-size-bytes"] == "1048576"
    assert table.format_version == 2

    assert dead_letter.name() == (ns, "orders_dlq")
    assert dead_letter.schema().as_struct() == DEAD_LETTER_SCHEMA.as_struct()
    assert [(str(f.transform), f.name) for f in dead_letter.spec().fields] == [("day", "ingested_at_day")]

    again = ensure_tables(catalog, st)
    assert again.table.metadata.table_uuid == table.metadata.table_uuid
    assert (
        again.dead_letter is not None
        and again.dead_letter.metadata.table_uuid == dead_letter.metadata.table_uuid
    )
    assert again.warnings == ()
    assert len(again.table.metadata.metadata_log) == len(table.metadata.metadata_log)  # nothing was written


def test_no_dead_letter_table_when_disabled(catalog: Catalog, ns: str) -> None:
    st = make_st(ns, "plain", dead_letter="  deadLetter: {table: {enabled: false}}")
    table, dead_letter = ensure_tables(catalog, st)
    assert dead_letter is None
    assert not catalog.table_exists((ns, "plain_dlq"))
    assert table.spec().is_unpartitioned()


def test_frequent_commits_keep_only_the_newest_metadata_files(catalog: Catalog, ns: str) -> None:
    keep_10 = '    properties: {write.metadata.previous-versions-max: "10"}'
    table, dead_letter = ensure_tables(catalog, make_st(ns, "busy", table=keep_10))
    assert dead_letter is not None
    assert dead_letter.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert table.properties["write.metadata.previous-versions-max"] == "10"  # the spec wins
    for n in range(30):  # a commit every few seconds, compressed
        table.transaction().set_properties({"icefall.test-commit": str(n)}).commit_transaction()
    folder = Path(table.metadata_location.removeprefix("file:")).parent
    assert len(list(folder.glob("*.metadata.json"))) == 11  # the current one and the 10 before it
    assert len(table.refresh().metadata.metadata_log) == 10


def test_a_lost_creation_race_loads_the_winners_table(catalog: Catalog, ns: str) -> None:
    st = make_st(ns, "raced")
    winner = ensure_tables(catalog, st)

    class LateCatalog:
        """Answers the first load as if the table did not exist yet, then behaves as the real catalog."""

        def __init__(self) -> None:
            self.misses = 1

        def load_table(self, identifier: Any) -> Any:
            if self.misses:
                self.misses -= 1
                raise NoSuchTableError(str(identifier))
            return catalog.load_table(identifier)

        def __getattr__(self, name: str) -> Any:
            return getattr(catalog, name)

    loser = ensure_tables(LateCatalog(), st)  # type: ignore[arg-type]
    assert loser.table.metadata.table_uuid == winner.table.metadata.table_uuid


def test_concurrent_first_runs_agree_on_one_table(catalog_config: CatalogConfig, ns: str) -> None:
    st = make_st(ns, "concurrent")
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(ensure_tables(catalog_config.pyiceberg(), st).table.metadata.table_uuid)
        except Exception as exc:  # pragma: no cover - reported by the assertion
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1, results
    assert isinstance(results[0], uuid.UUID)


def test_an_existing_table_is_refused_for_what_iceberg_cannot_follow(catalog: Catalog, ns: str) -> None:
    st = make_st(ns, "orders")
    expected = ensure_tables(catalog, st).table.schema()
    catalog.drop_table((ns, "orders"))
    changed = []
    for field in expected.fields:
        if field.name == "amount":
            changed.append(NestedField(field.field_id, "amount", DecimalType(12, 2), required=False))
        elif field.name == "name":
            continue
        elif field.name == "id":
            changed.append(NestedField(field.field_id, "id", LongType(), required=False))
        elif field.name == "customer":
            changed.append(
                NestedField(
                    field.field_id,
                    "customer",
                    StructType(NestedField(100, "id", StringType(), required=True)),
                    required=False,
                )
            )
        else:
            changed.append(field)
    changed.append(NestedField(200, "extra", StringType(), required=False))
    catalog.create_table((ns, "orders"), Schema(*changed))

    with pytest.raises(TableMismatchError) as caught:
        ensure_tables(catalog, st)
    the_table = f"the table {ns}.orders"
    # What Iceberg can follow (a new optional field, a narrower type, a column the spec no longer has) is
    # left to the writer's first batch (catalog/evolution.py); a changed type is refused.
    assert caught.value.differences == (
        f"{the_table}: field 'customer.id': the table has string, spec.format.schema has long; Iceberg "
        "cannot change it (it widens only int to long, float to double and a decimal's precision): keep the "
        "type, or write the new values to a new field",
    )
    assert str(caught.value).startswith(f"{the_table} does not match the StreamingTable:\n  - ")


def test_an_existing_dead_letter_table_with_other_columns_is_refused(catalog: Catalog, ns: str) -> None:
    st = make_st(ns, "orders")
    catalog.create_namespace(ns)
    catalog.create_table((ns, "orders_dlq"), Schema(NestedField(1, "error", StringType(), required=False)))
    with pytest.raises(TableMismatchError) as caught:
        ensure_tables(catalog, st)
    assert caught.value.differences[0] == (
        f"the table {ns}.orders_dlq has no column partition but Icefall's dead-letter layout (partition) "
        "defines it as int; a dead-letter table must have Icefall's layout — drop or rename that table, "
        "or set spec.deadLetter.table.name to a new table"
    )
    assert (
        f"the table {ns}.orders_dlq has column error as optional but Icefall's dead-letter layout (error) "
        "says required" in str(caught.value)
    )


def test_other_partitioning_and_sort_order_only_warn(catalog: Catalog, ns: str) -> None:
    st = make_st(ns, "orders", table=ALL_TRANSFORMS)
    schema = ensure_tables(catalog, make_st(ns, "orders")).table.schema()  # unpartitioned, unsorted
    assert schema is not None
    result = ensure_tables(catalog, st)
    fix = (
        "Icefall does not change the layout of an existing table — change the spec, or evolve the table "
        "yourself (e.g. Spark's ALTER TABLE ... ADD/DROP PARTITION FIELD, WRITE ORDERED BY)"
    )
    assert result.warnings == (
        f"the table {ns}.orders is partitioned by [nothing] but spec.table.partitioning says "
        "[identity(name), hour(ts), day(local), month(day), truncate[2](customer.country), "
        f"bucket[8](id)]; {fix}",
        f"the table {ns}.orders is sorted by [nothing] but spec.table.sortOrder says "
        f"[id asc nulls first, ts desc nulls last]; {fix}",
    )


def test_layout_on_a_missing_column_is_a_clear_error(catalog: Catalog, ns: str) -> None:
    st = make_st(
        ns, "orders", extra='  transforms: {select: ["id", "ts"]}', table="    partitioning: [{field: name}]"
    )
    override = Schema(
        NestedField(1, "id", LongType(), required=False), NestedField(2, "ts", StringType(), required=False)
    )
    with pytest.raises(
        TableLayoutError,
        match=r"spec.table.partitioning\[0\].field: no column 'name' in the table's columns "
        r"\(id, ts, _kafka\)",
    ):
        ensure_tables(catalog, st, schema_override=override)


# --- round trip ------------------------------------------------------------------------------------------

RECORDS: list[dict[str, Any]] = [
    {
        "id": 1,
        "name": "alpha",
        "amount": "12.5",
        "ts": "2025-12-31T23:59:59.999999Z",
        "local": "2025-12-31T23:00:00",
        "day": "2025-12-31",
        "ref": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
        "blob": base64.b64encode(b"\x00\xffbin").decode(),
        "hash": base64.b64encode(b"abcd").decode(),
        "customer": {"id": 10, "country": "Norway"},
        "items": [{"sku": "a-1", "qty": 2}, {"sku": "b-2"}],
        "tags": ["new"],
        "attrs": {"weight": 3, "size": None},
    },
    {
        "id": 2,
        "name": "beta",
        "amount": -0.5,
        "ts": 1767225600,
        "local": "2026-01-01T00:00:00",
        "day": "2026-02-01",
        "customer": {"id": 11},
        "items": [],
        "tags": [],
        "attrs": {},
    },
    {"id": 3, "ts": "2026-06-15T10:30:00+02:00"},
]

EXPECTED: list[dict[str, Any]] = [
    {
        "id": 1,
        "name": "alpha",
        "amount": Decimal("12.50"),
        "ts": datetime(2025, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        "local": datetime(2025, 12, 31, 23, 0, 0),
        "day": date(2025, 12, 31),
        "ref": uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8"),
        "blob": b"\x00\xffbin",
        "hash": b"abcd",
        "customer": {"id": 10, "country": "Norway"},
        "items": [{"sku": "a-1", "qty": 2}, {"sku": "b-2", "qty": None}],
        "tags": ["new"],
        "attrs": [("weight", 3), ("size", None)],
    },
    {
        "id": 2,
        "name": "beta",
        "amount": Decimal("-0.50"),
        "ts": datetime(2026, 1, 1, tzinfo=UTC),
        "local": datetime(2026, 1, 1),
        "day": date(2026, 2, 1),
        "ref": None,
        "blob": None,
        "hash": None,
        "customer": {"id": 11, "country": None},
        "items": [],
        "tags": [],
        "attrs": [],
    },
    {
        "id": 3,
        "name": None,
        "amount": None,
        "ts": datetime(2026, 6, 15, 8, 30, tzinfo=UTC),
        "local": None,
        "day": None,
        "ref": None,
        "blob": None,
        "hash": None,
        "customer": None,
        "items": None,
        "tags": None,
        "attrs": None,
    },
]


def kafka_frame(spark: SparkSession, records: list[Any]) -> Any:
    """Records as Spark's Kafka source returns them: no key or headers, partition 1, from offset 100."""
    return kafka_source_frame(spark, records, produced=PRODUCED, partition=1, first_offset=100, keyed=False)


def read_back(catalog: Catalog, identifier: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = catalog.load_table(identifier).scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda row: row["id"])


@pytest.mark.parametrize(
    "partitioning",
    [
        "{field: name, transform: identity}",
        "{field: ts, transform: hour}",
        "{field: ts, transform: day}",
        "{field: day, transform: month}",
        "{field: local, transform: year}",
        '{field: id, transform: "bucket[4]"}',
        '{field: customer.country, transform: "truncate[3]"}',
    ],
    ids=["identity", "hour", "day", "month", "year", "bucket", "truncate"],
)
def test_spark_writes_decoded_rows_and_pyiceberg_reads_them_back(
    spark: SparkSession, catalog_config: CatalogConfig, ns: str, partitioning: str
) -> None:
    catalog = catalog_config.pyiceberg()
    st = make_st(ns, "trip", table=f"    partitioning: [{partitioning}]\n    sortOrder: [{{field: id}}]")
    table, dead_letter = ensure_tables(catalog, st)
    assert len(table.spec().fields) == 1

    prepared = prepare(kafka_frame(spark, [*RECORDS, "not json"]), st.spec)
    prepared.good.writeTo(f"{catalog_config.name}.{ns}.trip").append()
    prepared.bad.writeTo(f"{catalog_config.name}.{ns}.trip_dlq").append()

    rows = read_back(catalog, (ns, "trip"))
    kafka = [row.pop("_kafka") for row in rows]
    # pyiceberg 0.12 reads a null list<struct> as [] (apache/iceberg-python#3833); the file holds null.
    assert rows[2]["items"] == []
    rows[2]["items"] = None
    null_items = spark.sql(f"SELECT items IS NULL AS n FROM {catalog_config.name}.{ns}.trip WHERE id = 3")
    assert null_items.collect()[0]["n"] is True
    assert rows == EXPECTED
    assert kafka == [{"partition": 1, "offset": 100 + i, "timestamp": PRODUCED} for i in range(3)]
    assert dead_letter is not None
    (bad,) = dead_letter.refresh().scan().to_arrow().to_pylist()
    assert (bad["offset"], bad["value"], bad["error"]) == (103, b"not json", "malformed JSON: 'not json'")


def test_transformed_columns_make_the_table_schema(
    spark: SparkSession, catalog_config: CatalogConfig, ns: str
) -> None:
    catalog = catalog_config.pyiceberg()
    st = make_st(
        ns,
        "shaped",
        extra='  transforms: {select: ["id", "amount * 2 AS doubled", "customer.country AS country", '
        '"size(items) AS n_items"]}',
        table="    partitioning: [{field: country, transform: identity}]",
    )
    prepared = prepare(kafka_frame(spark, RECORDS), st.spec)
    override = spark_struct_to_iceberg(prepared.good.schema.json())
    assert describe_type(override.as_struct()) == (
        "struct<id: long, doubled: decimal(12,2), country: string, n_items: int, "
        "_kafka: struct<partition: int, offset: long, timestamp: timestamptz>>"
    )
    table, _ = ensure_tables(catalog, st, schema_override=override)
    assert [f.name for f in table.schema().fields] == ["id", "doubled", "country", "n_items", "_kafka"]
    assert table.schema().find_field("_kafka.offset").required

    prepared.good.writeTo(f"{catalog_config.name}.{ns}.shaped").append()
    rows = [{k: v for k, v in row.items() if k != "_kafka"} for row in read_back(catalog, (ns, "shaped"))]
    assert rows == [
        {"id": 1, "doubled": Decimal("25.00"), "country": "Norway", "n_items": 2},
        {"id": 2, "doubled": Decimal("-1.00"), "country": None, "n_items": 0},
        {"id": 3, "doubled": None, "country": None, "n_items": None},
    ]
    # The same select again finds the table it made.
    assert ensure_tables(catalog, st, schema_override=override).warnings == ()


def test_spark_types_iceberg_cannot_store_are_named() -> None:
    struct = {
        "type": "struct",
        "fields": [{"name": "nothing", "type": "void", "nullable": True, "metadata": {}}],
    }
    with pytest.raises(TableLayoutError, match="column 'nothing' has Spark type void"):
        spark_struct_to_iceberg(struct)


def test_the_expected_schema_is_the_one_the_catalog_stores(catalog: Catalog, ns: str) -> None:
    """Same fresh ids as the catalog assigns: pyiceberg's and Spark's ids agree with `expected_schema`."""
    st = make_st(ns, "ids")
    table, _ = ensure_tables(catalog, st)
    assert table.schema().as_struct() == expected_schema(st).as_struct()


def test_a_keyed_table_has_its_key_as_identifier_fields_and_is_merge_on_read(
    catalog: Catalog, ns: str
) -> None:
    keyed = make_st(ns, "customers", extra="  mode: upsert\n  key: [id]")
    table = ensure_tables(catalog, keyed).table
    assert table.schema().identifier_field_names() == {"id"}
    assert table.properties["write.merge.mode"] == "merge-on-read"
    assert table.properties["write.delete.mode"] == "merge-on-read"
    assert ensure_tables(catalog, keyed).table.schema() == table.schema()  # an existing keyed table fits

    # The same table name for an append spec (no key), and a keyed spec for an append table: refused.
    with pytest.raises(TableMismatchError) as caught:
        ensure_tables(catalog, make_st(ns, "customers"))
    assert "has key (identifier fields) [id], spec.key says []" in str(caught.value)
    ensure_tables(catalog, make_st(ns, "events"))
    with pytest.raises(TableMismatchError) as caught:
        ensure_tables(catalog, make_st(ns, "events", extra="  mode: upsert\n  key: [id]"))
    assert "has key (identifier fields) [], spec.key says [id]" in str(caught.value)


def test_a_key_the_select_does_not_produce_is_a_clear_error(ns: str) -> None:
    st = make_st(ns, "keyed_select", extra="  mode: upsert\n  key: [id]")
    without_key = Schema(NestedField(1, "name", StringType(), required=False))
    with pytest.raises(TableLayoutError) as caught:
        expected_schema(st, without_key)
    assert "spec.key names 'id', which spec.transforms.select does not produce" in str(caught.value)
    with_key = Schema(NestedField(1, "id", LongType(), required=False))
    assert expected_schema(st, with_key).find_field("id").required  # a key column is required
