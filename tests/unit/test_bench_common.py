"""The benchmarks' pure helpers measure what they claim.

Proves: percentiles interpolate between ranks (and are NaN for nothing); the bench events have the 9
documented fields, match the schema every system is given, carry the Kafka timestamp in `ts`, and come
in the two documented sizes; the Avro writer schema has the same 9 columns and an event encoded with it
reads back as the same event; a process tree's CPU at a moment is interpolated between samples; the
icefall manifests the comparison writes (JSON, and Avro through a registry) are valid StreamingTables over
that schema, and so are the executor pods' table (in its catalog, compaction off) and the keyed profile's
(bench/upsert.py's keyed table); the audit by content
counts duplicates, missing and changed events.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from icefall.api import load_manifest

pytestmark = pytest.mark.unit
BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # compare.py imports `common` by that name, as when run as a script
    spec.loader.exec_module(module)
    return module


common = _load("common")


def test_percentile_interpolates_between_ranks() -> None:
    assert common.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert common.percentile([5.0], 99) == 5.0
    assert common.percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert math.isnan(common.percentile([], 50))


def test_events_have_the_documented_fields_sizes_and_timestamp() -> None:
    names = [f["name"] for f in common.EVENT_SCHEMA]
    for words, low, high in ((common.SMALL_NOTE_WORDS, 200, 260), (common.LARGE_NOTE_WORDS, 900, 1100)):
        records = common.bench_records(seed=1, note_words=words)
        sizes = []
        for i in range(300):
            key, value, ts_ms = next(records)
            event = json.loads(value)
            assert list(event) == names and len(names) == 9
            assert event["id"] == i and event["key"] == key
            assert event["ts"] == common.iso_ms(ts_ms)
            assert set(event["shipping"]) == {"street", "city", "country"}
            sizes.append(len(value))
        assert low <= sum(sizes) / len(sizes) <= high


def test_events_are_seeded() -> None:
    first = common.bench_event(7, random.Random(3), 0, 2)
    again = common.bench_event(7, random.Random(3), 0, 2)
    assert first == again


def test_the_avro_events_are_the_json_events_in_the_same_columns() -> None:
    import fastavro
    from pyspark.sql.types import StructType

    from icefall.api import to_spark_schema_json
    from icefall.api.avro import fields_from_avro
    from icefall.api.schema import SchemaField

    def columns(fields: list[SchemaField]) -> str:  # types and nesting; nullability aside
        return str(StructType.fromJson(to_spark_schema_json(fields)).simpleString())

    avro_fields = fields_from_avro(json.dumps(common.AVRO_EVENT_SCHEMA))
    assert columns(avro_fields) == columns([SchemaField.model_validate(f) for f in common.EVENT_SCHEMA])

    schema = fastavro.parse_schema(common.AVRO_EVENT_SCHEMA)

    def encode(event: dict[str, object], ts_ms: int) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema, common.avro_datum(event, ts_ms))
        return out.getvalue()

    as_json = common.bench_records(seed=5, note_words=common.SMALL_NOTE_WORDS)
    as_avro = common.bench_records(seed=5, note_words=common.SMALL_NOTE_WORDS, encode=encode)
    for _ in range(50):
        (key, text, _), (avro_key, value, ts_ms) = next(as_json), next(as_avro)
        decoded = fastavro.schemaless_reader(io.BytesIO(value), schema, schema)
        assert isinstance(decoded, dict)
        assert decoded.pop("ts").timestamp() * 1000 == ts_ms
        assert avro_key == key and decoded == {k: v for k, v in json.loads(text).items() if k != "ts"}


def test_cpu_at_interpolates_between_samples() -> None:
    monitor = common.TreeMonitor(root=0)
    monitor.samples = [common.TreeSample(10.0, 1.0, 100), common.TreeSample(12.0, 3.0, 300)]
    assert monitor.cpu_at(11.0) == 2.0
    assert monitor.cpu_at(5.0) == 1.0
    assert monitor.cpu_at(20.0) == 3.0
    assert monitor.peak_rss == 300


def test_the_icefall_manifest_is_a_valid_streaming_table() -> None:
    import yaml

    compare = _load("compare")

    class Broker:
        bootstrap = "127.0.0.1:9092"

    class Args:
        freshness_target = 10.0

    ctx = compare.Context(broker=Broker(), args=Args(), state=Path("/nonexistent"), pin=[])
    st = load_manifest(yaml.safe_dump(compare.icefall_manifest(ctx, "events-small")))
    assert st.spec.source.topic == "events-small"
    assert st.table_identifier == compare.TABLE
    assert [f.name for f in st.spec.format.schema_fields] == [f["name"] for f in common.EVENT_SCHEMA]


def test_the_avro_manifest_reads_the_registry_into_the_same_columns() -> None:
    import yaml

    compare = _load("compare")

    class Broker:
        bootstrap = "127.0.0.1:9092"

    class Args:
        freshness_target = 10.0

    class Registry:
        url = "http://127.0.0.1:8080/apis/ccompat/v7"

    ctx = compare.Context(
        broker=Broker(), args=Args(), state=Path("/nonexistent"), pin=[], registry=Registry()
    )
    st = load_manifest(yaml.safe_dump(compare.icefall_manifest(ctx, "small-icefall-avro", avro=True)))
    assert st.spec.format.type.value == "avro"
    assert st.spec.format.registry is not None and st.spec.format.registry.url == Registry.url
    assert st.spec.format.registry.subject("small-icefall-avro") == "small-icefall-avro-value"
    assert [f.name for f in st.spec.format.schema_fields] == [f["name"] for f in common.EVENT_SCHEMA]


def test_the_audit_finds_a_duplicate_a_missing_and_a_changed_event() -> None:
    compare = _load("compare")
    events = common.bench_records(seed=5, note_words=common.SMALL_NOTE_WORDS)
    produced = [json.loads(next(events)[1]) for _ in range(4)]
    rows = [{c: event[c] for c in compare.CONTENT} for event in produced]
    assert compare.audit_rows(rows, 4, seed=5, note_words=common.SMALL_NOTE_WORDS) == "exact"
    changed = {**rows[2], "amount": rows[2]["amount"] + 0.01}
    found = compare.audit_rows([rows[0], rows[0], changed], 4, seed=5, note_words=common.SMALL_NOTE_WORDS)
    assert found == "1 duplicates, 2 missing, 1 differ"  # events 1 and 3 missing


def test_the_executors_bench_table_is_valid_in_its_catalog_without_compaction() -> None:
    import yaml

    executors = _load("executors")
    catalog = {"name": "lake", "type": "sql", "uri": "postgresql://icefall@127.0.0.1:5432/lake",
               "warehouse": "s3://lake/warehouse"}  # fmt: skip
    st = load_manifest(yaml.safe_dump(executors.manifest("127.0.0.1:9092", "executors-1-2", "ns", catalog)))
    assert st.spec.source.topic == "executors-1-2"
    assert st.spec.table.catalog is not None and st.spec.table.catalog.uri == catalog["uri"]
    assert not st.spec.compaction.enabled
    assert [f.name for f in st.spec.format.schema_fields] == [f["name"] for f in common.EVENT_SCHEMA]


def test_the_keyed_profile_table_is_bench_upserts() -> None:
    import yaml

    profile = _load("profile_drain")
    st = load_manifest(yaml.safe_dump(profile.manifest("127.0.0.1:9092", "profile-small", keyed=True)))
    assert (st.spec.mode.value, st.spec.key, st.spec.table.partitioning) == ("upsert", ["id"], [])
    plain = load_manifest(yaml.safe_dump(profile.manifest("127.0.0.1:9092", "profile-small")))
    assert plain.spec.mode.value == "append" and plain.spec.key is None
