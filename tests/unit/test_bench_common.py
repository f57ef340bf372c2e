"""The benchmarks' pure helpers measure what they claim.

Proves: percentiles interpolate between ranks (and are NaN for nothing); the bench events have the 9
documented fields, match the schema every system is given, carry the Kafka timestamp in `ts`, and come
in the two documented sizes; the Avro writer schema has the same 9 columns and an event encoded with it
reads back as the same event; the JSON Schema events are the JSON events framed with their id and valid
against their JSON Schema, which has the same 9 fields; a process tree's CPU at a moment is interpolated
between samples; the icefall manifests the comparison writes (JSON, and Avro, Protobuf and JSON Schema
through a registry) are valid StreamingTables over that schema, and so are the executor pods' table (in its
catalog, compaction off) and the keyed profile's (bench/upsert.py's keyed table); the audit by content counts
duplicates, missing and changed events, from rows streamed one at a time, with the same digest for an
event and for its row read back; CPU-s per GiB is the CPU over the GiB of keys and values, the reciprocal of
records per CPU-s times the bytes of a record, and `Tally` counts those bytes as produced (a tombstone its
key only); a spooled backlog reads back as produced and leaves no file; the Protobuf events decode with
Icefall's own decoder into the JSON events; the sustained report carries CPU-s per GiB, each drain's probe
and load averages, and Icefall / Spark per format.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import random
import sys
from datetime import datetime
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
    for kind in ("avro", "protobuf", "jsonSchema"):
        topic = f"small-icefall-{kind}"
        st = load_manifest(yaml.safe_dump(compare.icefall_manifest(ctx, topic, format_type=kind)))
        assert st.spec.format.type.value == kind
        assert st.spec.format.registry is not None and st.spec.format.registry.url == Registry.url
        assert st.spec.format.registry.subject(topic) == f"{topic}-value"
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
    unknown = {**rows[3], "id": 4}  # not a backlog id
    assert compare.audit_rows(iter([*rows, unknown]), 4, seed=5, note_words=5) != "exact"  # other events
    assert (
        compare.audit_rows(iter([*rows, unknown]), 4, seed=5, note_words=2)
        == "0 duplicates, 0 missing, 1 differ"
    )


def test_an_event_and_its_row_read_back_have_one_digest() -> None:
    compare = _load("compare")
    events = common.bench_records(seed=8, note_words=common.LARGE_NOTE_WORDS)
    rows = []
    for _ in range(20):
        event = json.loads(next(events)[1])
        row = {c: event[c] for c in reversed(compare.CONTENT)}
        row["shipping"] = dict(reversed(row["shipping"].items()))  # a struct's order is not its content
        rows.append(row)
    expected = compare.expected_digests(20, 8, common.LARGE_NOTE_WORDS)
    assert [compare.digest(row) for row in rows] == list(expected)
    assert compare.digest({**rows[0], "tags": ["other"]}) != expected[0]


def test_cpu_per_gib_is_the_reciprocal_of_records_per_cpu_second_times_record_bytes() -> None:
    assert common.cpu_per_gib(2.0, common.GIB) == 2.0
    assert common.cpu_per_gib(1.5, common.GIB // 2) == 3.0
    records, cpu, per_record = 1_000_000, 40.0, 250
    per_cpu = records / cpu
    assert common.cpu_per_gib(cpu, records * per_record) == pytest.approx(common.GIB / (per_cpu * per_record))
    assert math.isnan(common.cpu_per_gib(1.0, 0)) and math.isnan(common.cpu_per_gib(0.0, 100))


def test_tally_counts_keys_and_values_as_produced() -> None:
    produced = [("k1", b"abc", 1), ("ключ", None, 2), ("k3", b"", 3)]
    tally = common.Tally(iter(produced))
    assert list(tally) == produced
    assert (tally.records, tally.key_bytes, tally.value_bytes) == (3, 2 + 8 + 2, 3)  # UTF-8 key bytes
    assert tally.bytes == 15


def test_a_spooled_backlog_reads_back_as_produced_and_leaves_no_file(tmp_path: Path) -> None:
    source = iter([("a", b"\x00\x01", 10), ("ключ", None, 11), ("c", b"x" * 70_000, 12), ("d", b"", 13)])
    spool = tmp_path / "backlog.spool"
    records = common.spooled(source, 3, spool)
    assert spool.exists() and next(source) == ("d", b"", 13)  # written up front: only `count` taken
    assert list(records) == [("a", b"\x00\x01", 10), ("ключ", None, 11), ("c", b"x" * 70_000, 12)]
    assert not spool.exists()


def test_the_protobuf_events_decode_with_icefalls_decoder_into_the_json_events() -> None:
    from icefall.decode.protobuf import to_json
    from icefall.kafka.protobuf import descriptor_set_text

    descriptors = descriptor_set_text(common.PROTOBUF_EVENT_SCHEMA)
    as_json = common.bench_records(seed=5, note_words=common.SMALL_NOTE_WORDS)
    as_protobuf = common.bench_records(
        seed=5, note_words=common.SMALL_NOTE_WORDS, encode=common.protobuf_encoder(descriptors, 42)
    )
    for _ in range(30):
        (key, text, _), (protobuf_key, value, ts_ms) = next(as_json), next(as_protobuf)
        assert value[:6] == b"\x00\x00\x00\x00\x2a\x00"  # magic byte, schema id 42, message index [0]
        decoded, problem = to_json(descriptors, 42, value)
        assert problem is None and decoded is not None and protobuf_key == key
        event, back = json.loads(text), json.loads(decoded)
        assert datetime.fromisoformat(back.pop("ts")).timestamp() * 1000 == ts_ms  # the produce time
        del event["ts"]
        assert back == event


def test_the_json_schema_events_are_the_json_events_framed_and_valid_against_their_schema() -> None:
    import jsonschema

    validator = jsonschema.Draft7Validator(common.JSON_SCHEMA_EVENT_SCHEMA)
    as_json = common.bench_records(seed=5, note_words=common.SMALL_NOTE_WORDS)
    framed = common.bench_records(seed=5, note_words=common.SMALL_NOTE_WORDS,
                                  encode=common.json_schema_encoder(42))  # fmt: skip
    for _ in range(30):
        (key, text, _), (framed_key, value, ts_ms) = next(as_json), next(framed)
        assert value[:5] == b"\x00\x00\x00\x00\x2a" and framed_key == key  # magic byte, schema id 42
        event, framed_event = json.loads(text), json.loads(value[5:])
        validator.validate(framed_event)
        assert datetime.fromisoformat(framed_event.pop("ts")).timestamp() * 1000 == ts_ms
        del event["ts"]
        assert framed_event == event
    properties = common.JSON_SCHEMA_EVENT_SCHEMA["properties"]
    assert isinstance(properties, dict)
    assert list(properties) == [f["name"] for f in common.EVENT_SCHEMA]


def _throughput(compare: ModuleType, records: int, cpu: float, value_bytes: int) -> object:
    gauge = common.Gauge(0.37, "1.00 1.20 1.30")
    return compare.Throughput(
        records=records, commits=4, startup_s=20.0, drain_s=records / 20_000, rate=20_000.0,
        per_cpu=records / cpu, peak_rss=2**30, files=5, audit="exact", cpu_s=cpu,
        payload_bytes=records * value_bytes, start=gauge, end=common.Gauge(0.39, "1.90 1.40 1.35"),
    )  # fmt: skip


def test_the_sustained_report_has_cpu_per_gib_the_gauges_and_icefall_over_spark() -> None:
    from types import SimpleNamespace

    compare = _load("compare")
    args = SimpleNamespace(argv=["--sustained", "--records", "60000"], records=60_000, large_records=0,
                           warmup_records=10_000, trickle=5.0, freshness_target=10.0, spark_max_offsets=0,
                           systems=["icefall", "spark", "icefall-protobuf"])  # fmt: skip
    ctx = compare.Context(broker=None, args=args, state=Path("/nonexistent"), pin=[])
    results = compare.Results()
    results.small["icefall"] = _throughput(compare, 60_000, 2.0, 256)  # 30,000 records per CPU-s
    results.small["spark"] = _throughput(compare, 60_000, 6.0, 256)
    results.small["icefall-protobuf"] = "boom"
    text = compare.render_sustained(ctx, {"CPU": "test"}, results, "now")
    assert "reduced-scale run" in text and "CPU-s per GiB" in text
    per_gib = common.GIB / (30_000 * 256)  # 2 CPU-s over 60,000 records of 256 bytes
    assert f"| 30,000 | {per_gib:,.0f} | 3.0 s |" in text
    assert "| 14.6 MiB | 256 | 2.0 | 0.37 → 0.39 s | 1.00 1.20 1.30 → 1.90 1.40 1.35 |" in text
    assert "| JSON | 3.00 | 0.33 | 1.00 |" in text
    assert "## Failures" in text and "boom" in text


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
