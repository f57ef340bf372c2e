"""The chaos run's keyed-table helpers (e2e/chaos_keyed.py) and its infrastructure kinds (e2e/chaos_infra.py).

Proves: the reference keeps the last change per Kafka key by offset (a tombstone deletes, input order does
not matter) and refuses a key met in two partitions; the comparison finds nothing on a table that holds
exactly the reference, and counts a duplicate, a missing key, a row of a tombstoned key and a wrong value;
the producer's changes stay within the key set, carry their key as `id`, include tombstones, and decode to
the columns the schema names; the keyed StreamingTable built from the run's append table is a valid upsert
table without a dead-letter table; its pods are told apart from the append table's; the run's arming of
the keyed driver names no `dlq.*` point; `ICEFALL_CHAOS_INFRA_KINDS` restricts the draw, refuses a kind it
does not know, and the new Kafka kinds are among `KINDS`.
"""

from __future__ import annotations

import importlib
import json
import random
import sys
import types
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from icefall.api import load_manifest

pytestmark = pytest.mark.unit

E2E = Path(__file__).resolve().parents[2] / "e2e"
# The e2e folder as a package of another name (its modules import each other relatively).
_package = types.ModuleType("chaos_e2e")
_package.__path__ = [str(E2E)]
sys.modules.setdefault("chaos_e2e", _package)
keyed = importlib.import_module("chaos_e2e.chaos_keyed")
infra = importlib.import_module("chaos_e2e.chaos_infra")


def value(key: int, seq: int, balance: str = "1.50") -> bytes:
    return json.dumps({
        "id": key, "name": f"c{key}", "tier": "gold", "balance": balance, "seq": seq,
        "updated_at": "2026-11-28T10:00:00Z",
    }).encode()  # fmt: skip


def row(key: int, seq: int, balance: str = "1.50") -> dict[str, Any]:
    expected: dict[str, Any] = keyed.expected_row(value(key, seq, balance))
    return expected


def test_the_reference_keeps_the_last_change_per_key_by_offset() -> None:
    records = [
        (0, 5, b"1", value(1, 5)),
        (0, 2, b"1", value(1, 2)),  # older, read later: ignored
        (1, 3, b"2", value(2, 3)),
        (1, 4, b"2", None),  # deleted
        (2, 0, b"3", None),
        (2, 1, b"3", value(3, 9)),  # deleted, then back
    ]
    assert keyed.latest(records) == {1: value(1, 5), 2: None, 3: value(3, 9)}
    with pytest.raises(AssertionError, match="key 1 is in partitions 0 and 2"):
        keyed.latest([(0, 1, b"1", value(1, 1)), (2, 2, b"1", value(1, 2))])


def test_compare_is_clean_on_exactly_the_reference() -> None:
    last = {1: value(1, 5), 2: None, 3: value(3, 9)}
    result = keyed.compare(last, [row(1, 5), row(3, 9)], records=6)
    assert result.clean and result.examples == []
    assert (result.keys, result.tombstones, result.rows) == (2, 1, 2)


def test_compare_counts_every_kind_of_problem() -> None:
    last = {1: value(1, 5), 2: None, 3: value(3, 9), 4: value(4, 1)}
    rows = [
        row(1, 5),
        row(1, 5),  # duplicate
        row(2, 1),  # its last change is a tombstone: extra
        row(3, 9, balance="1.51"),  # wrong
        row(7, 1),  # never in the topic: extra
    ]  # key 4 missing
    result = keyed.compare(last, rows, records=9)
    assert (result.duplicates, result.missing, result.extra, result.wrong) == (1, 1, 2, 1)
    assert not result.clean
    assert any("key 3 differs" in e and "balance" in e for e in result.examples)
    assert any("key 2 is a row (its last change is a tombstone)" in e for e in result.examples)


def test_changes_stay_in_the_key_set_and_include_tombstones() -> None:
    made = keyed.changes(random.Random(4), 100, 500)
    assert len(made) == 500
    keys = {int(k) for k, _ in made}
    assert keys <= set(range(keyed.KEYS))
    assert 20 < sum(v is None for _, v in made) < 100  # ~10 % tombstones
    seqs = []
    for key, data in made:
        if data is not None:
            expected = keyed.expected_row(data)
            assert expected["id"] == int(key) and set(expected) == set(keyed.COLUMNS)
            assert isinstance(expected["balance"], Decimal)
            seqs.append(expected["seq"])
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_the_keyed_table_is_a_valid_upsert_table_of_its_own(tmp_path: Path) -> None:
    run = importlib.import_module("chaos_e2e.chaos_run")
    kafka = types.SimpleNamespace(bootstrap="127.0.0.1:9092")
    catalog = types.SimpleNamespace(uri="http://127.0.0.1:8181")
    store = types.SimpleNamespace(
        properties=lambda: {"s3.endpoint": "http://127.0.0.1:9000", "s3.region": "us-east-1"}
    )
    append = run.streaming_table(kafka, catalog, store)
    obj = keyed.keyed_streaming_table(append)
    path = tmp_path / "keyed.yaml"
    path.write_text(json.dumps(obj))
    st = load_manifest(path)
    assert st.spec.mode == "upsert" and list(st.spec.key) == ["id"]
    assert st.spec.dead_letter.topic is None  # its dead-letter table is the default one, no topic
    assert st.spec.source.topic == keyed.KEYED_TOPIC != append["spec"]["source"]["topic"]
    assert "deadLetter" in append["spec"]  # the append table's object is untouched
    assert run.table_of(keyed.KEYED_DRIVER) == "keyed" and run.table_of(run.DRIVER) == "append"
    assert run.table_of(f"{keyed.KEYED_COMPACT_PREFIX}abc") == "keyed"
    assert run.table_of(f"{run.COMPACT_PREFIX}abc") == "append"
    pods = importlib.import_module("chaos_e2e.chaos_pods")  # the pod watch, moved out of the run
    assert pods.component_of(f"{keyed.KEYED_COMPACT_PREFIX}abc") == "compaction"
    assert "dlq." not in run.KEYED_ARMING["driver"] and "dlq." in run.ARMING["driver"]


def test_the_infrastructure_draw_can_be_restricted() -> None:
    assert infra.drawn_kinds("") == infra.KINDS + infra.RESOURCE_KINDS
    assert {"Kafka controller", "Kafka unclean restart", "Kafka rolling restart"} <= set(infra.KINDS)
    assert infra.drawn_kinds("Kafka controller, etcd") == ("Kafka controller", "etcd")
    with pytest.raises(ValueError, match="ICEFALL_CHAOS_INFRA_KINDS: unknown kinds \\['Kafka'\\]"):
        infra.drawn_kinds("Kafka")
