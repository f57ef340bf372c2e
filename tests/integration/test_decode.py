"""`prepare` splits a batch from Spark's Kafka source into good rows and dead-letter rows, with exact reasons.

Input DataFrames are built in the Kafka source's schema (no broker needed); Spark is the real session.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the usual name

from icefall.api import StreamingTableSpec, load_manifest
from icefall.decode.columns import BYTES_COLUMN, TEXT_COLUMN
from icefall.decode.decode import (
    BAD_COLUMN,
    DEAD_LETTER_COLUMNS,
    ERROR_COLUMN,
    KAFKA_COLUMN,
    OTHER_REASON,
    REASON_KINDS,
    decode,
    good_rows,
    prepare,
    reason_kind,
)
from icefall.ingest.writer import Decoders
from icefall.testing.streams import kafka_source_frame

pytestmark = pytest.mark.integration

PRODUCED = datetime(2026, 3, 1, 12, 0, 0)

SCHEMA = """
      - {name: id, type: long, required: true}
      - {name: amount, type: "decimal(10,2)"}
      - {name: ts, type: timestamptz}
      - {name: local, type: timestamp}
      - {name: day, type: date}
      - {name: blob, type: binary}
      - {name: ref, type: uuid}
      - {name: hash, type: "fixed[4]"}
      - name: customer
        type: struct
        fields:
          - {name: id, type: long, required: true}
          - {name: name, type: string}
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


def make_spec(schema: str = SCHEMA, extra: str = "") -> StreamingTableSpec:
    manifest = f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: orders}}
spec:
  source: {{bootstrapServers: "localhost:9092", topic: orders}}
  format:
    type: json
    schema:
{schema}
  deadLetter: {{maxRecordBytes: 1000}}
{extra}
"""
    return load_manifest(manifest).spec


def kafka_frame(spark: SparkSession, values: list[Any], partition: int = 0) -> DataFrame:
    """Records as Spark's Kafka source returns them, keyed, from offset 0."""
    return kafka_source_frame(spark, values, produced=PRODUCED, partition=partition)


def errors_by_offset(frame: DataFrame) -> dict[int, str]:
    return {row["offset"]: row["error"] for row in frame.collect()}


GOOD = {
    "id": 1,
    "amount": "12.5",
    "ts": "2026-01-02T03:04:05.123456Z",
    "local": "2026-01-02T03:04:05",
    "day": "2026-01-02",
    "blob": base64.b64encode(b"\x00\x01binary").decode(),
    "ref": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
    "hash": base64.b64encode(b"abcd").decode(),
    "customer": {"id": 7, "name": "Ada"},
    "items": [{"sku": "a-1", "qty": 2}, {"sku": "b-2"}],
    "tags": ["new", "gift"],
    "attrs": {"weight": 3, "size": None},
}


def good(**changes: Any) -> dict[str, Any]:
    record = dict(GOOD)
    for name, value in changes.items():
        if value is ...:
            del record[name]
        else:
            record[name] = value
    return record


DEAD_LETTERS: list[tuple[str, Any, str]] = [
    ("tombstone", None, "tombstone: the record's value is null"),
    # Bytes, not characters; an oversized value is not parsed, so its other problems are not reported.
    ("oversized", "é" * 501, "record is 1002 bytes, over the limit of 1000 (spec.deadLetter.maxRecordBytes)"),
    ("at the limit", "é" * 500, "malformed JSON: '" + "é" * 100 + "...'"),
    ("malformed", '{"id": 1, "amount": ', """malformed JSON: '{"id": 1, "amount": '"""),
    ("empty", "  ", "malformed JSON: the value is empty"),
    ("not json", "hello", "malformed JSON: 'hello'"),
    ("array", '[{"id": 1}]', """not a JSON object (got an array): '[{"id": 1}]'"""),
    ("number", "42", "not a JSON object (got a number): '42'"),
    ("string", '"id"', """not a JSON object (got a string): '"id"'"""),
    ("json null", "null", "not a JSON object (got null): 'null'"),
    (
        "decimal overflow",
        good(amount=123456789012.5),
        "field 'amount': '1.234567890125E11' does not fit decimal(10,2)",
    ),
    ("long overflow", good(id=2**70), "field 'id': '1180591620717411303424' does not fit long"),
    ("int text", good(id="seven"), "field 'id': 'seven' does not fit long"),
    (
        "long raw value is truncated",
        good(day="x" * 100),
        "field 'day': '" + "x" * 64 + "...' does not fit date",
    ),
    (
        "ntz with zone",
        good(local="2026-01-02T03:04:05Z"),
        "field 'local': '2026-01-02T03:04:05Z' does not fit timestamp",
    ),
    ("ntz number", good(local=1700000000), "field 'local': '1700000000' does not fit timestamp"),
    (
        "epoch millis",
        good(ts=1700000000123),
        "field 'ts': '+55840-11-08 22:15:23' is outside the years 1 to 9999 (a number is read as epoch "
        "seconds: millis?)",
    ),
    (
        "before year 1",
        good(ts=-62135596801),
        "field 'ts': '0000-12-31 23:59:59' is outside the years 1 to 9999 (a number is read as epoch "
        "seconds: millis?)",
    ),
    ("bad base64", good(blob="!!!"), "field 'blob': '!!!' does not fit binary"),
    (
        "list of wrong type",
        good(tags="red"),
        "field 'tags': 'red' does not fit list<string>",
    ),
    (
        "struct of wrong type",
        good(customer=[1, 2]),
        "field 'customer': '[1,2]' does not fit struct<id: long, name: string>",
    ),
    (
        "two fields",
        good(amount="lots", day="monday"),
        "field 'amount': 'lots' does not fit decimal(10,2); field 'day': 'monday' does not fit date",
    ),
    (
        "nested mismatch",
        good(customer={"id": 7, "name": "Ada", "extra": 1}, items=[{"sku": "a", "qty": "many"}]),
        "a nested value does not fit the schema: '" + json.dumps(GOOD)[:100] + "...'",
    ),
    ("required missing", good(id=...), "required field 'id' is missing or null"),
    ("required null", good(id=None), "required field 'id' is missing or null"),
    (
        "required nested missing",
        good(customer={"name": "Ada"}),
        "required field 'customer.id' is missing or null",
    ),
    (
        "required in list",
        good(items=[{"sku": "a"}, {"qty": 1}]),
        "required field 'items[].sku' is missing or null",
    ),
    (
        "null element",
        good(tags=["a", None]),
        "list 'tags' holds a null element, but spec says elementRequired",
    ),
    ("bad uuid", good(ref="not-a-uuid"), "field 'ref': 'not-a-uuid' does not fit uuid"),
    (
        "short fixed",
        good(hash=base64.b64encode(b"ab").decode()),
        "field 'hash': 'YWI=' does not fit fixed[4]",
    ),
    (
        "several reasons",
        good(id=..., amount="x", customer={"name": "Ada"}, ref="nope"),
        "field 'amount': 'x' does not fit decimal(10,2); required field 'id' is missing or null; "
        "field 'ref': 'nope' does not fit uuid; required field 'customer.id' is missing or null",
    ),
]


def test_each_bad_record_is_dead_lettered_with_its_exact_reasons(spark: SparkSession) -> None:
    """One batch holding every kind of bad record between good ones: each gets exactly its own reasons."""
    values = [v for _, v, _ in DEAD_LETTERS]
    frame = kafka_frame(spark, [GOOD, *values, GOOD])
    prepared = prepare(frame, make_spec())
    expected = {i + 1: reason for i, (_, _, reason) in enumerate(DEAD_LETTERS)}
    assert errors_by_offset(prepared.bad) == expected
    assert prepared.good.count() == 2


KEYED_AND_AVRO_REASONS = {
    "tombstone (null value): the Kafka key gives no value for key field 'id' (...)": "delete_without_key",
    "delete (op d, or a tombstone): the before image nor the Kafka key gives ...": "delete_without_key",
    "not a Debezium change event: it has no op (nor payload.op)": "not_a_change_event",
    "Debezium op 't' is not one of c, r, u, d": "not_a_change_event",
    "too short for the Confluent wire format: 3 bytes (...)": "wire_format",
    "wrong magic byte 0x01: not the Confluent wire format (...)": "wire_format",
    "unknown schema id 42 (the registry has no Avro schema with this id)": "unknown_schema_id",
    "bytes do not decode as Avro with writer schema id 7": "undecodable",
    "unknown schema id 42 (the registry has no Protobuf schema with this id)": "unknown_schema_id",
    "bytes do not decode as protobuf message shop.Order of schema id 7": "undecodable",
    "message index [3] names no message of schema id 7": "undecodable",
    "the message index after the schema id does not parse (...)": "undecodable",
    "the value is not valid UTF-8 text, as JSON must be; its first bytes after the header: 0xFF": "not_utf8",
    "field 'amount': the writer's value does not fit decimal(10,2)": "type_mismatch",
    "something new": OTHER_REASON,
}


def test_each_dead_letter_reason_has_a_bounded_kind(spark: SparkSession) -> None:
    """The metric label of a dead letter (`reason_kind`) is the kind of its first message: every message
    the decoders write has one (none is "other")."""
    expected = {
        "tombstone": "tombstone",
        "oversized": "too_large",
        "at the limit": "malformed_json",
        "array": "malformed_json",
        "decimal overflow": "type_mismatch",
        "nested mismatch": "type_mismatch",
        "required missing": "required_missing",
        "null element": "null_element",
        "several reasons": "type_mismatch",
    }
    cases = [(name, reason) for name, _, reason in DEAD_LETTERS]
    cases.append(("not utf8", "the value is not valid UTF-8 text, as JSON must be; its first bytes: 0xFF"))
    texts = [*{reason for _, reason in cases}, *KEYED_AND_AVRO_REASONS]
    rows = spark.createDataFrame([(t,) for t in texts], "error string")
    kinds = {
        r["error"]: r["kind"]
        for r in rows.select("error", reason_kind(F.col("error")).alias("kind")).collect()
    }
    by_case = {name: kinds[reason] for name, reason in cases}
    assert {case: by_case[case] for case in expected} == expected
    assert by_case["not utf8"] == "not_utf8"
    assert OTHER_REASON not in by_case.values(), by_case
    assert {t: kinds[t] for t in KEYED_AND_AVRO_REASONS} == KEYED_AND_AVRO_REASONS
    assert {kind for kind, _ in REASON_KINDS} >= set(kinds.values()) - {OTHER_REASON}


def test_the_bad_flag_is_exactly_having_an_error_text(spark: SparkSession) -> None:
    """Ingestion's one-pass write filters on the flag alone (no error text): it must pick the same rows."""
    frame = kafka_frame(spark, [GOOD, *(v for _, v, _ in DEAD_LETTERS), GOOD])
    spec = make_spec()
    flags = decode(frame, spec).select(
        "offset", BAD_COLUMN, F.col(ERROR_COLUMN).isNotNull().alias("has_error")
    )
    rows = flags.collect()
    assert len(rows) == len(DEAD_LETTERS) + 2
    assert all(row[BAD_COLUMN] is row["has_error"] for row in rows), rows
    without_text = decode(frame, spec, errors=False)
    assert ERROR_COLUMN not in without_text.columns
    assert sorted(good_rows(without_text, spec).collect()) == sorted(prepare(frame, spec).good.collect())


def test_dead_letter_rows_keep_the_record(spark: SparkSession) -> None:
    frame = kafka_frame(spark, [GOOD, "oops"], partition=5)
    now = datetime(2026, 3, 2, 8, 0, 0)
    bad = prepare(frame, make_spec(), now_expr=F.lit(now)).bad
    assert tuple(bad.columns) == DEAD_LETTER_COLUMNS
    assert bad.schema.simpleString() == (
        "struct<partition:int,offset:bigint,timestamp:timestamp,key:binary,value:binary,"
        "headers:array<struct<key:string,value:binary>>,error:string,ingested_at:timestamp>"
    )
    (row,) = bad.collect()
    assert row.asDict(recursive=True) == {
        "partition": 5,
        "offset": 1,
        "timestamp": PRODUCED,
        "key": bytearray(b"k1"),
        "value": bytearray(b"oops"),
        "headers": [{"key": "trace", "value": bytearray(b"t-1")}],
        "error": "malformed JSON: 'oops'",
        "ingested_at": now,
    }


def test_good_rows_are_decoded_with_their_types(spark: SparkSession) -> None:
    epoch = good(ts=1767323045, amount=0.126, attrs={})
    frame = kafka_frame(spark, [GOOD, epoch], partition=2)
    prepared = prepare(frame, make_spec())
    assert prepared.bad.count() == 0
    assert prepared.good.schema.simpleString() == (
        "struct<id:bigint,amount:decimal(10,2),ts:timestamp,local:timestamp_ntz,day:date,blob:binary,"
        "ref:string,hash:binary,customer:struct<id:bigint,name:string>,"
        "items:array<struct<sku:string,qty:int>>,tags:array<string>,attrs:map<string,bigint>,"
        "_kafka:struct<partition:int,offset:bigint,timestamp:timestamp>>"
    )
    # Read timestamps as UTC epoch microseconds: collect() would convert them to the local zone.
    rows = prepared.good.withColumn("ts_us", F.unix_micros("ts")).orderBy(F.col("_kafka.offset")).collect()
    first = rows[0].asDict(recursive=True)
    assert first["ts_us"] == int(datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC).timestamp() * 10**6)
    del first["ts"], first["ts_us"]
    assert first == {
        "id": 1,
        "amount": Decimal("12.50"),
        "local": datetime(2026, 1, 2, 3, 4, 5),
        "day": date(2026, 1, 2),
        "blob": bytearray(b"\x00\x01binary"),
        "ref": str(uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")),
        "hash": bytearray(b"abcd"),
        "customer": {"id": 7, "name": "Ada"},
        "items": [{"sku": "a-1", "qty": 2}, {"sku": "b-2", "qty": None}],
        "tags": ["new", "gift"],
        "attrs": {"weight": 3, "size": None},
        KAFKA_COLUMN: {"partition": 2, "offset": 0, "timestamp": PRODUCED},
    }
    second = rows[1]
    assert second["ts_us"] == 1767323045 * 10**6  # JSON numbers are epoch seconds
    assert second["amount"] == Decimal("0.13")  # rounded half-up to the scale
    assert second["attrs"] == {}


def test_select_and_filter(spark: SparkSession) -> None:
    spec = make_spec(
        extra="""
  transforms:
    select: ["id", "amount * 100 AS cents", "customer.name AS who"]
    filter: "cents > 1000"
"""
    )
    values = [
        good(id=1, amount=5),
        good(id=2, amount=20),
        good(id=3, amount=None),
        "bad",
        good(id=4, amount=11),
    ]
    prepared = prepare(kafka_frame(spark, values), spec)
    assert prepared.good.columns == ["id", "cents", "who", KAFKA_COLUMN]
    rows = prepared.good.orderBy("id").collect()
    assert [(r["id"], r["cents"], r["who"], r[KAFKA_COLUMN]["offset"]) for r in rows] == [
        (2, Decimal("2000.00"), "Ada", 1),
        (4, Decimal("1100.00"), "Ada", 4),
    ]
    assert errors_by_offset(prepared.bad) == {3: "malformed JSON: 'bad'"}


def test_select_may_keep_kafka_itself(spark: SparkSession) -> None:
    spec = make_spec(extra='  transforms: {select: ["*", "_kafka.offset AS kafka_offset"]}\n')
    prepared = prepare(kafka_frame(spark, [GOOD]), spec)
    assert prepared.good.columns[-3:] == ["attrs", KAFKA_COLUMN, "kafka_offset"]


def test_every_record_is_good_bad_or_filtered(spark: SparkSession) -> None:
    spec = make_spec(extra='  transforms: {filter: "id % 3 != 0"}\n')
    values: list[Any] = []
    for i in range(300):
        if i % 7 == 0:
            values.append(good(id=i, amount="oops"))
        elif i % 11 == 0:
            values.append(None)
        else:
            values.append(good(id=i))
    prepared = prepare(kafka_frame(spark, values), spec)
    good_offsets = {r[KAFKA_COLUMN]["offset"] for r in prepared.good.collect()}
    bad_offsets = {r["offset"] for r in prepared.bad.collect()}
    filtered = {i for i, v in enumerate(values) if isinstance(v, dict) and i % 7 != 0 and i % 3 == 0}
    assert good_offsets.isdisjoint(bad_offsets)
    assert bad_offsets == {i for i in range(300) if i % 7 == 0 or i % 11 == 0}
    assert good_offsets | bad_offsets | filtered == set(range(300))
    assert good_offsets.isdisjoint(filtered)


def test_required_values_inside_maps(spark: SparkSession) -> None:
    schema = """
      - {name: id, type: long}
      - {name: scores, type: map, key: {type: string}, value: {type: int}, valueRequired: true}
      - name: people
        type: map
        key: {type: string}
        value:
          type: struct
          fields: [{name: id, type: uuid, required: true}]
"""
    person = {"id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"}
    values = [
        {"id": 1, "scores": {"a": 1}, "people": {"ada": person}},
        {"id": 2, "scores": {"a": None}},
        {"id": 3, "people": {"ada": person, "bob": {}}},
        {"id": 4, "people": {"bob": {"id": "x"}}},
    ]
    prepared = prepare(kafka_frame(spark, values), make_spec(schema))
    assert errors_by_offset(prepared.bad) == {
        1: "map 'scores' holds a null value, but spec says valueRequired",
        2: "required field 'people{}.id' is missing or null",
        3: "field 'people{}.id': a value does not fit uuid",
    }
    assert [row["id"] for row in prepared.good.collect()] == [1]


def test_values_that_are_not_utf8_get_a_valid_utf8_reason(spark: SparkSession) -> None:
    """Invalid UTF-8 (a Latin-1 byte, a truncated sequence) is dead-lettered with a reason that is itself
    valid UTF-8, naming the bytes in hex, so readers of the dead-letter table never fail on it."""
    latin1 = b'{"id": 1, "customer": {"id": 2, "name": "Caf\xe9"}}'
    truncated = b"\xe2\x82"
    bad = prepare(kafka_frame(spark, [latin1, truncated]), make_spec()).bad
    errors = errors_by_offset(bad)
    assert (
        errors[0]
        == "the value is not valid UTF-8 text, as JSON must be; its first bytes: 0x"
        + latin1[:32].hex().upper()
    )
    assert errors[1] == "the value is not valid UTF-8 text, as JSON must be; its first bytes: 0xE282"
    # The Arrow round trip a reader does fails on invalid UTF-8 in a string column.
    assert bad.select("error", "value").toArrow().column("error").to_pylist() == [errors[0], errors[1]]


def test_a_batch_carries_neither_the_value_nor_its_text_past_the_parse(spark: SparkSession) -> None:
    """The write's plan (decode, observation, good rows) keeps only the value's length once it is parsed:
    each step after the parse copies its rows, and the value and its text are most of a row's bytes."""
    values: list[Any] = [good(), good(id=2, tags=["x" * 200]), "not json", b"\xff\xfe", None]
    decoders = Decoders(make_spec())
    observation = Observation()
    decoded = decoders.good.decode(kafka_frame(spark, values)).observe(observation, *decoders.observed)
    rows = decoders.good.good_rows(decoded)

    plan = rows._jdf.queryExecution().optimizedPlan()
    found = [node for node in plan_nodes(plan) if node.nodeName() == "CollectMetrics"]
    assert len(found) == 1, plan.toString()
    output = found[0].child().output()
    carried = {output.apply(i).name() for i in range(output.size())}
    assert "value" not in carried and TEXT_COLUMN not in carried, plan.toString()

    assert sorted(row["id"] for row in rows.collect()) == [1, 2]
    sizes = [len(json.dumps(v).encode() if isinstance(v, dict) else v.encode() if isinstance(v, str) else v)
             for v in values if v is not None]  # fmt: skip
    seen = observation.get
    assert (seen["records"], seen["bytes"], seen["bad"]) == (5, sum(sizes), 3)
    assert BYTES_COLUMN not in rows.columns


def plan_nodes(plan: Any) -> list[Any]:
    """A Catalyst plan (a py4j object) and every node below it."""
    children = plan.children()
    return [plan, *(node for i in range(children.size()) for node in plan_nodes(children.apply(i)))]
