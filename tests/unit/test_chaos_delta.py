"""The chaos run's Delta table (e2e/chaos_delta.py) and the audit it shares with the append table
(e2e/chaos_audit.py `compare`).

Proves: the Delta StreamingTable built from the run's append table is a valid append-mode Delta table on
S3 that the operator runs in a cluster (no catalog, a Z-order sort order, its own dead-letter table beside
it and no topic, small target files, the S3 keys from the run's Secret by reference); the arming patch
keeps its pods' S3 variables (a merge patch replaces the env list) and drops only the failpoint variable
when disarmed; its arming names only known failpoints, and none of Iceberg's or of a dead-letter topic;
its pods are told apart from the other tables' (and counted as drivers and compaction pods); the audit
finds nothing on rows that are exactly the topic's records, and counts a duplicate, a missing record, a
wrong value, a good record among the dead letters and a bad one among the rows.
"""

from __future__ import annotations

import importlib
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from icefall.api import streaming_table_from_object
from icefall.ingest.delta_dead_letters import dead_letter_location
from icefall.plan.children import cluster_table_problem
from icefall.runtime.failpoints import CHAOS_ENV_VAR, parse_chaos

pytestmark = pytest.mark.unit

E2E = Path(__file__).resolve().parents[2] / "e2e"
_package = types.ModuleType("chaos_e2e")  # the e2e folder as a package of another name
_package.__path__ = [str(E2E)]
sys.modules.setdefault("chaos_e2e", _package)
delta = importlib.import_module("chaos_e2e.chaos_delta")
data = importlib.import_module("chaos_e2e.chaos_data")
chaos_audit = importlib.import_module("chaos_e2e.chaos_audit")
pods = importlib.import_module("chaos_e2e.chaos_pods")


class Store:
    region, endpoint = "us-east-1", "http://127.0.0.1:9000"


APPEND: dict[str, Any] = {  # the shape of the run's append table (e2e/chaos_run.py `streaming_table`)
    "apiVersion": "icefall.dev/v1alpha1",
    "kind": "StreamingTable",
    "metadata": {"name": "chaos"},
    "spec": {
        "source": {"bootstrapServers": "127.0.0.1:9092", "topic": "chaos"},
        "format": {"type": "json", "schema": data.SCHEMA},
        "table": {
            "namespace": "chaos",
            "name": "events",
            "partitioning": [{"field": "ts", "transform": "day"}],
            "catalog": {"name": "lake", "type": "rest", "uri": "http://127.0.0.1:8181"},
        },
        "deadLetter": {"topic": "chaos-dlq", "maxRecordBytes": data.MAX_RECORD_BYTES},
        "batch": {"maxRecords": 400, "minIntervalSeconds": 1},
        "freshness": {"targetSeconds": 5},
        "compaction": {"minReplicas": 1, "maxReplicas": 1, "maxSnapshotAgeSeconds": 60},
    },
}


def test_the_delta_table_is_an_append_delta_table_on_s3_a_cluster_runs() -> None:
    env = delta.pod_env("lake", Store())
    obj = delta.delta_streaming_table(APPEND, bucket="chaos", env=env)
    st = streaming_table_from_object({**obj, "metadata": {**obj["metadata"], "namespace": "ns"}})
    table = st.spec.table
    assert table.format.value == "delta" and table.catalog is None and not table.partitioning
    assert table.location == "s3://chaos/delta/events_delta"
    assert [s.field for s in table.sort_order] == ["big", "name"]
    assert st.spec.source.topic == "chaos" and st.spec.mode.value == "append"
    assert st.spec.dead_letter.topic is None and st.dead_letter_identifier is not None
    assert dead_letter_location(st, table.location) == "s3://chaos/delta/events_delta_dlq"
    assert st.spec.compaction.target_file_size_bytes == delta.TARGET_FILE_BYTES
    assert cluster_table_problem(st, spark_master="local[*]") is None
    for role in ("driver", "compaction"):
        names = {e["name"]: e for e in obj["spec"]["pods"][role]["env"]}
        assert names["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
            "name": "lake",
            "key": "access-key-id",
        }
        assert names["AWS_ENDPOINT_URL"]["value"] == Store.endpoint
    assert APPEND["spec"]["table"]["name"] == "events"  # the append table's object is left as it was


def test_arming_keeps_the_pods_s3_variables_and_names_only_delta_points() -> None:
    run = importlib.import_module("chaos_e2e.chaos_run")
    env = delta.pod_env("lake", Store())
    arming = delta.arming(1, 0.7)
    on = run.arming_patch(True, arming, env)["spec"]["pods"]
    off = run.arming_patch(False, arming, env)["spec"]["pods"]
    for role in ("driver", "compaction"):
        assert on[role]["env"][:-1] == env and on[role]["env"][-1] == {
            "name": CHAOS_ENV_VAR,
            "value": arming[role],
        }
        assert off[role]["env"] == env
    assert run.arming_patch(False)["spec"]["pods"]["driver"]["env"] is None  # no base env: the list goes
    driver = {name for name, _ in parse_chaos(arming["driver"]).choices}  # known names only
    compaction = {name for name, _ in parse_chaos(arming["compaction"]).choices}
    assert not {p for p in driver if p.startswith("dlq-topic.")} and "main.after-prepare" not in driver
    assert compaction == {"main.mid-rewrite", "main.before-rewrite-commit", "main.after-rewrite"}


def test_the_delta_tables_pods_are_told_apart_and_counted() -> None:
    assert (
        delta.table_of(delta.DELTA_DRIVER) == "delta" == pods.table_of(f"{delta.DELTA_COMPACT_PREFIX}abc-1")
    )
    assert pods.table_of(pods.DRIVER) == "append" and pods.table_of(f"{pods.COMPACT_PREFIX}abc-1") == "append"
    assert delta.table_of(pods.DRIVER) is None
    assert pods.component_of(delta.DELTA_DRIVER) == "driver"
    assert pods.component_of(f"{delta.DELTA_COMPACT_PREFIX}abc-1") == "compaction"


def rows_of(
    records: dict[tuple[int, int], bytes | None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows and dead letters a correct table holds for `records`."""
    rows, dead = [], []
    for (partition, offset), value in records.items():
        want = data.expected(value)
        if want is data.BAD:
            dead.append({"partition": partition, "offset": offset, "value": value})
        else:
            rows.append({**want, "_kafka": {"partition": partition, "offset": offset}})
    return rows, dead


def test_the_audit_finds_nothing_on_exact_rows_and_counts_each_problem() -> None:
    made = list(data.records(random.Random(3), 0, 200))
    records = {(i % 3, i // 3): r.value for i, r in enumerate(made)}
    rows, dead = rows_of(records)
    assert rows and dead
    clean = chaos_audit.compare(records, rows, dead)
    assert (clean.duplicates, clean.missing, clean.wrong) == (0, 0, 0), clean.examples
    assert clean.good == len(rows) and clean.bad == len(dead)

    wrong = dict(rows[1], name="not the record's")
    bad_where = (dead[0]["partition"], dead[0]["offset"])
    broken = chaos_audit.compare(records, [rows[0], rows[0], wrong, *rows[3:]], [*dead[1:]])
    assert broken.duplicates == 1 and broken.wrong == 1
    assert broken.missing == 2  # rows[2] and the dead letter left out
    assert any(str(bad_where) in e for e in broken.examples)
    good = rows[0]["_kafka"]
    good_as_dead = {**good, "value": records[good["partition"], good["offset"]]}
    assert chaos_audit.compare(records, rows, [*dead, good_as_dead]).wrong >= 1
    bad_as_row = {**rows[0], "_kafka": {"partition": bad_where[0], "offset": bad_where[1]}}
    assert chaos_audit.compare(records, [*rows, bad_as_row], dead).wrong >= 1
