"""Confluent-framed Avro decodes in Spark with spark-avro's `from_avro`, one writer schema per schema id.

Proves, on the real Spark session with the spark-avro jar the project fetches: records encoded by fastavro
(the maintained encoder confluent-kafka's AvroSerializer uses) and framed as the Confluent wire format
decode into the table's columns by content, logical types included; one batch holding two writer schema
versions (the later one adds an optional field) decodes each record with its own writer schema, projected
onto the table's fields; a wrong magic byte, an unknown schema id, bytes that do not decode, a value too
short for the header and a missing required field go to the dead-letter rows with their precise reasons.

Not proved here: the registry lookup itself — the writer schemas are handed to the decoder as the lookup a
registry client answers (`icefall.kafka.registry.WriterSchemas.lookup` in production); no registry server
could be installed from the package registries this project reaches (see the session report).
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from pyspark.sql import SparkSession

from icefall.api import StreamingTableSpec, load_manifest
from icefall.ingest.decode import DEAD_LETTER_COLUMNS, KAFKA_COLUMN, Decoder, split
from icefall.testing.streams import kafka_source_frame

pytestmark = pytest.mark.integration

PRODUCED = datetime(2026, 3, 1, 12, 0, 0)

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}],
}

TABLE_SCHEMA = """
      - {name: id, type: long, required: true}
      - {name: amount, type: "decimal(10,2)"}
      - {name: ts, type: timestamptz}
      - {name: day, type: date}
      - {name: ref, type: uuid}
      - {name: status, type: string}
      - {name: note, type: string}
      - {name: coupon, type: string}
"""


def make_spec() -> StreamingTableSpec:
    manifest = f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: orders}}
spec:
  source: {{bootstrapServers: "localhost:9092", topic: orders}}
  format:
    type: avro
    registry: {{url: "http://127.0.0.1:1"}}
    schema:
{TABLE_SCHEMA}
  deadLetter: {{maxRecordBytes: 1000}}
"""
    return load_manifest(manifest).spec


class Schemas:
    """The writer schemas by id, as a registry client's lookup answers them; records the ids asked."""

    def __init__(self, known: Mapping[int, dict[str, Any]]) -> None:
        self.known = {i: json.dumps(s) for i, s in known.items()}
        self.asked: list[list[int]] = []

    def __call__(self, ids: Iterable[int]) -> dict[int, str | None]:
        wanted = list(ids)
        self.asked.append(wanted)
        return {i: self.known.get(i) for i in wanted}


def framed(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": i,
        "amount": Decimal(f"{i}.25"),
        "ts": datetime(2026, 3, 1, 10, i, 0, tzinfo=UTC),
        "day": date(2026, 3, i),
        "ref": str(uuid.UUID(int=i)),
        "status": "PAID" if i % 2 else "NEW",
        "note": None if i % 2 else f"note {i}",
        **extra,
    }


def decode_batch(spark: SparkSession, values: list[bytes], schemas: Schemas) -> tuple[list[Any], list[Any]]:
    spec = make_spec()
    decoded = Decoder(spec, schemas=schemas).decode(kafka_source_frame(spark, values, produced=PRODUCED))
    prepared = split(decoded, spec)
    good = sorted(prepared.good.collect(), key=lambda r: r[KAFKA_COLUMN]["offset"])
    bad = sorted(prepared.bad.collect(), key=lambda r: r["offset"])
    return good, bad


def test_avro_records_decode_by_content_with_logical_types(spark: SparkSession) -> None:
    schemas = Schemas({7: V1})
    good, bad = decode_batch(spark, [framed(7, V1, order(i)) for i in (1, 2)], schemas)
    assert bad == []
    assert schemas.asked == [[7]]
    rows = [{k: v for k, v in r.asDict().items() if k != KAFKA_COLUMN} for r in good]
    assert rows == [
        {
            "id": i,
            "amount": Decimal(f"{i}.25"),
            "ts": datetime(2026, 3, 1, 10, i, 0),  # the session's time zone is UTC
            "day": date(2026, 3, i),
            "ref": str(uuid.UUID(int=i)),
            "status": "PAID" if i % 2 else "NEW",
            "note": None if i % 2 else f"note {i}",
            "coupon": None,
        }
        for i in (1, 2)
    ]
    assert [r[KAFKA_COLUMN]["offset"] for r in good] == [0, 1]


def test_a_batch_with_two_schema_versions_reads_each_record_with_its_writer_schema(
    spark: SparkSession,
) -> None:
    schemas = Schemas({7: V1, 8: V2})
    values = [
        framed(7, V1, order(1)),
        framed(8, V2, order(2, coupon="SPRING")),
        framed(7, V1, order(3)),
        framed(8, V2, order(4, coupon=None)),
    ]
    good, bad = decode_batch(spark, values, schemas)
    assert bad == []
    assert schemas.asked == [[7, 8]]
    assert [(r["id"], r["coupon"], r["amount"]) for r in good] == [
        (1, None, Decimal("1.25")),
        (2, "SPRING", Decimal("2.25")),
        (3, None, Decimal("3.25")),
        (4, None, Decimal("4.25")),
    ]


def test_bad_records_are_dead_lettered_with_precise_reasons(spark: SparkSession) -> None:
    no_id: dict[str, Any] = {**V1, "fields": [f for f in V1["fields"] if f["name"] != "id"]}
    schemas = Schemas({7: V1, 9: no_id})
    good_record = framed(7, V1, order(1))
    no_id_record = {k: v for k, v in order(5).items() if k != "id"}
    values = [
        good_record,  # 0: good
        b"\x01" + good_record[1:],  # 1: wrong magic byte
        framed(7, V1, order(2))[:1] + (42).to_bytes(4, "big") + good_record[5:],  # 2: unknown id 42
        b"\x00" + (7).to_bytes(4, "big") + b"\xff\xff\xff",  # 3: bytes that do not decode
        b"\x00\x00",  # 4: too short for the header
        framed(9, no_id, no_id_record),  # 5: the writer has no required field id
        b"{" + b"x" * 1200,  # 6: over maxRecordBytes
    ]
    good, bad = decode_batch(spark, values, schemas)
    assert [r["id"] for r in good] == [1]
    assert list(bad[0].asDict()) == list(DEAD_LETTER_COLUMNS)
    reasons = {r["offset"]: r["error"] for r in bad}
    assert reasons == {
        1: "wrong magic byte 0x01: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)",
        2: "unknown schema id 42 (the registry has no Avro schema with this id)",
        3: "bytes do not decode as Avro with writer schema id 7",
        4: "too short for the Confluent wire format: 2 bytes "
        "(a magic byte and a 4-byte schema id come first)",
        5: "required field 'id' is missing or null, and writer schema id 9 has no such field",
        6: "record is 1201 bytes, over the limit of 1000 (spec.deadLetter.maxRecordBytes)",
    }
    assert sorted(schemas.asked[0]) == [7, 9, 42]
    assert bad[0]["value"] == values[1]
    assert bad[0]["key"] == b"k1"


def test_a_writer_value_that_does_not_fit_the_table_type_is_named(spark: SparkSession) -> None:
    wide: dict[str, Any] = {
        **V1,
        "fields": [{"name": "id", "type": "string"} if f["name"] == "id" else f for f in V1["fields"]],
    }
    schemas = Schemas({11: wide})
    good, bad = decode_batch(spark, [framed(11, wide, order(1, id="not-a-number"))], schemas)
    assert good == []
    assert [r["error"] for r in bad] == ["field 'id': the writer's value does not fit long"]
