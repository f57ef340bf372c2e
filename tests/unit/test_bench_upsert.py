"""The upsert benchmark's pure helpers do what bench/upsert.py says.

Proves: the keyed workload inserts every key once, then changes in about the documented shares (89 %
updates of live keys, 10 % inserts of new keys, 1 % tombstones of live keys), never changes a deleted key
again, is seeded, names each key by its id in the Kafka key, and its model is the last value per key with
deleted keys gone; the content check finds missing, unexpected, different and duplicated rows; the samples
are thinned evenly keeping both ends; the keyed manifest is a valid upsert StreamingTable keyed by a
required id; the report puts each system's figures in its column and keeps a failed system's error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from icefall.api import load_manifest

pytestmark = pytest.mark.unit
# bench/upsert.py imports its siblings `common` and `compare` by those names, as when run as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import common  # noqa: E402
import upsert  # noqa: E402


def replay(changes: list[tuple[str, bytes | None, int]]) -> dict[int, bytes]:
    """The last value per key of `changes`, tombstones deleting."""
    state: dict[int, bytes] = {}
    for key, value, _ in changes:
        if value is None:
            state.pop(int(key), None)
        else:
            state[int(key)] = value
    return state


def test_the_workload_loads_every_key_then_changes_in_the_documented_shares() -> None:
    workload = upsert.Workload(seed=1, keys=2_000)
    initial = list(workload.initial())
    assert [int(k) for k, _, _ in initial] == list(range(2_000))
    stream = workload.changes()
    changes = [next(stream) for _ in range(20_000)]
    deletes = [c for c in changes if c[1] is None]
    inserts = {int(k) for k, _, _ in changes if int(k) >= 2_000}  # new keys: 2000, 2001, ...
    assert inserts == set(range(2_000, 2_000 + len(inserts)))
    assert 0.005 < len(deletes) / len(changes) < 0.015
    assert 0.09 < len(inserts) / len(changes) < 0.11
    assert workload.counts == {"load": 2_000, "insert": len(inserts), "delete": len(deletes),
                               "update": 20_000 - len(inserts) - len(deletes)}  # fmt: skip
    assert workload.model == replay(initial + changes)
    for key, value, ts in changes[:100]:
        if value is not None:
            event = json.loads(value)
            assert event["id"] == int(key)  # the Kafka key is the id, so a key stays in one partition
            assert event["ts"] == common.iso_ms(ts)  # the produce time


def test_the_workload_is_seeded() -> None:
    def first(seed: int) -> list[tuple[str, Any]]:
        workload = upsert.Workload(seed=seed, keys=50)
        list(workload.initial())
        stream = workload.changes()
        changes = [next(stream) for _ in range(3_000)]
        return [(key, None if value is None else json.loads(value)["amount"]) for key, value, _ in changes]

    assert first(3) == first(3)
    assert first(3) != first(4)


def test_a_tombstone_deletes_a_live_key_which_is_never_changed_again() -> None:
    workload = upsert.Workload(seed=5, keys=100)
    list(workload.initial())
    stream = workload.changes()
    deleted: set[int] = set()
    for _ in range(10_000):
        key, value, _ = next(stream)
        assert int(key) not in deleted
        if value is None:
            assert int(key) < workload._next_id  # a key that was written
            deleted.add(int(key))
    assert deleted


def test_compare_rows_finds_each_kind_of_difference() -> None:
    workload = upsert.Workload(seed=2, keys=5)
    list(workload.initial())
    rows = [{c: json.loads(workload.model[k])[c] for c in upsert.CONTENT} for k in sorted(workload.model)]
    assert upsert.compare_rows(workload.model, rows) == "exact"
    changed = [dict(rows[0], note="tampered"), rows[1], rows[1], rows[3], dict(rows[4], id=99)]
    assert upsert.compare_rows(workload.model, changed) == (
        "2 missing, 1 unexpected (deleted or never written), 1 differ, 1 duplicates"
    )


def test_thinned_keeps_both_ends_evenly() -> None:
    samples = [upsert.Files(float(i), i, 0, 0, 0) for i in range(25)]
    assert [s.data for s in upsert.thinned(samples, 5)] == [0, 6, 12, 18, 24]
    assert upsert.thinned(samples[:3], 5) == samples[:3]


def test_the_keyed_manifest_is_an_upsert_streaming_table() -> None:
    broker, args = SimpleNamespace(bootstrap="127.0.0.1:9092"), SimpleNamespace(freshness_target=10.0)
    ctx = upsert.Context(broker, args, Path("/nonexistent"), [])
    st = load_manifest(yaml.safe_dump(upsert.keyed_manifest(ctx, "upsert-icefall")))
    assert st.spec.mode.value == "upsert"
    assert list(st.spec.key or []) == ["id"]
    assert st.spec.source.topic == "upsert-icefall"
    assert st.table_identifier == upsert.TABLE
    assert next(f for f in st.spec.format.schema_fields if f.name == "id").required


def test_the_report_puts_the_systems_side_by_side_and_keeps_failures() -> None:
    args = SimpleNamespace(argv=["--quick"], quick=True, keys=50_000, backlog_changes=10_000, rate=300.0,
                           seconds=60.0, freshness_target=10.0, sample_seconds=5.0)  # fmt: skip
    ctx = upsert.Context(SimpleNamespace(bootstrap="x"), args, Path("/nonexistent"), [])
    done = upsert.Result("icefall", load=upsert.Drain(49_000, 10.0, 4_000.0, 3), p50=4.9, p99=10.5)
    done.files = [upsert.Files(0.0, 5, 4, 8_154, 59_034), upsert.Files(10.0, 1, 5, 8_680, 50_922)]
    text = upsert.render(ctx, {"CPU": "test"}, [done, upsert.Result("spark", error="boom")], "now")
    assert "QUICK run" in text
    assert "| initial load: records/s | 4,900 |" in text
    assert "| live: freshness p50 / p99 | 4.9 / 10.5 s |" in text
    assert "| 10 | 1 | 5 | 8,680 | 50,922 |" in text
    assert "## Failures" in text and "boom" in text
    ingest_head = text.split("## Ingest")[1].split("\n")[2]
    assert upsert.LABELS["spark"] not in ingest_head  # nothing measured: no column


def test_a_system_that_failed_after_its_initial_load_keeps_what_was_measured() -> None:
    args = SimpleNamespace(argv=["--quick"], quick=True, keys=50_000, backlog_changes=10_000, rate=300.0,
                           seconds=60.0, freshness_target=10.0, sample_seconds=5.0)  # fmt: skip
    ctx = upsert.Context(SimpleNamespace(bootstrap="x"), args, Path("/nonexistent"), [])
    load = upsert.Drain(49_000, 10.0, 4_000.0, 3)
    failed = upsert.Result("icefall", load=load, p50=4.9, p99=10.5, error="Java heap space")
    text = upsert.render(ctx, {"CPU": "test"}, [failed], "now")
    assert "| initial load: records/s | 4,900 |" in text
    assert "| exact against the model, by content | not checked |" in text
    assert "## Failures" in text and "Java heap space" in text


def test_the_ingest_table_has_cpu_per_gib_and_each_drains_gauges() -> None:
    args = SimpleNamespace(argv=["--sustained"], quick=False, sustained=True, keys=5_000_000,
                           backlog_changes=5_000_000, rate=1_000.0, seconds=60.0, freshness_target=10.0,
                           sample_seconds=10.0)  # fmt: skip
    ctx = upsert.Context(SimpleNamespace(bootstrap="x"), args, Path("/nonexistent"), [])
    start, end = common.Gauge(0.37, "1.00 1.10 1.20"), common.Gauge(0.40, "2.00 1.50 1.30")
    load = upsert.Drain(4_999_000, 500.0, 20_000.0, 90, cpu_s=249.95, payload_bytes=4_999_000 * 256,
                        start=start, end=end)  # fmt: skip
    text = upsert.render(ctx, {"CPU": "test"}, [upsert.Result("icefall", load=load)], "now")
    assert "a sustained run" in text
    per_gib = 249.95 / (4_999_000 * 256 / 2**30)
    assert f"| initial load: CPU-s per GiB | {per_gib:,.0f} |" in text
    assert "| initial load: keys + values produced | 1,220.5 MiB (256 per record) |" in text
    assert "| initial load: CPU probe, start → end | 0.37 → 0.40 s |" in text
    assert "| initial load: load average 1/5/15 min, start → end | 1.00 1.10 1.20 → 2.00 1.50 1.30 |" in text
    assert "| change backlog: CPU-s per GiB | n/a |" in text
