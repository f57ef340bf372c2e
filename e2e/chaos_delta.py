"""The chaos run's Delta Lake table: a third StreamingTable on the append table's topic, written as an
append-mode Delta table on the run's object store (`s3://`, MinIO), and its audit.

Its spec is the append table's (`delta_streaming_table`: the same topic, JSON schema and batches) with
`spec.table` a Delta table on S3 (unpartitioned; `sortOrder` big, name: the compaction pods' merges
Z-order their rows), its own Delta dead-letter table beside it (no dead-letter topic: the append table's
is not audited anyway), small target files (so merges keep coming and a merge holds a few MiB), and the S3
credentials in its driver and compaction pods from the run's Secret by reference (`pod_env`: the arming
patch must carry them too — a merge patch replaces the env list). Its driver (Spark in the pod, its own
put-if-absent log writer) and compaction pods (Icefall's merge and VACUUM, no Spark) are killed from the
run's loops and count against the same quotas, armed with the points they pass (`DRIVER_POINTS`,
`COMPACTION_POINTS`).

The audit (`audit`), with none of the ingestion code: the topic's records (read_committed) decoded by the
reference decoder (`chaos_data`) against the table's rows and its dead-letter table's, both read with
delta-rs, by `_kafka` (partition, offset) and every value — the append table's comparison
(`chaos_audit.compare`). `icefall verify` runs on it as well. The run's faults converge (and
infrastructure faults recover) once it, too, committed the topic's records (`committed`: the Delta log's
`icefall.*` offsets).

Not covered: the dead-letter topic (none); partitioning and keyed modes of Delta tables.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any

from icefall.plan.names import compaction_name, driver_pod_name

from . import chaos_data as data
from .chaos_audit import Audit, compare, topic_records, watermarks

if TYPE_CHECKING:
    from collections import Counter

    from icefall.devstack.kafka_cluster import KafkaCluster

Obj = dict[str, Any]

DELTA_NAME, DELTA_TABLE = "chaos-delta", "events_delta"
DELTA_DRIVER = driver_pod_name(DELTA_NAME)
DELTA_COMPACT_PREFIX = f"{compaction_name(DELTA_NAME)}-"
SORT_ORDER = ("big", "name")
#: Small merged files: merges keep coming while the run lasts, and each holds a few MiB in a pod.
TARGET_FILE_BYTES = 8 * 1024 * 1024
#: The points a Delta driver passes on a table with malformed records and a dead-letter table (its log
#: writer, `icefall.commit.delta`, and its sink); `AT_START`: once per process.
DRIVER_POINTS = (
    "main.after-stage", "main.before-commit", "main.after-commit", "dlq.before-commit", "dlq.after-commit",
    "main.after-claim", "lease.renew",
)  # fmt: skip
AT_START = {"main.after-claim"}
#: The compaction pods' merge (`icefall.compact.delta_pods`, `icefall.commit.delta_files`).
COMPACTION_POINTS = ("main.mid-rewrite", "main.before-rewrite-commit", "main.after-rewrite")


def location(bucket: str) -> str:
    return f"s3://{bucket}/delta/{DELTA_TABLE}"


def pod_env(secret: str, store: Any) -> list[Obj]:
    """The AWS SDK's variables of a Delta pod (`icefall.commit.delta_storage`): the keys from `secret`
    (access-key-id, secret-access-key, as the run's Secret holds them), region and endpoint as values."""
    return [
        {
            "name": "AWS_ACCESS_KEY_ID",
            "valueFrom": {"secretKeyRef": {"name": secret, "key": "access-key-id"}},
        },
        {
            "name": "AWS_SECRET_ACCESS_KEY",
            "valueFrom": {"secretKeyRef": {"name": secret, "key": "secret-access-key"}},
        },
        {"name": "AWS_REGION", "value": store.region},
        {"name": "AWS_ENDPOINT_URL", "value": store.endpoint},
    ]


def delta_streaming_table(append: Obj, *, bucket: str, env: list[Obj]) -> Obj:
    """The Delta StreamingTable, from the append one (`append`: same topic, schema and batches)."""
    st = copy.deepcopy(append)
    st["metadata"] = {"name": DELTA_NAME}
    spec = st["spec"]
    spec["deadLetter"] = {"maxRecordBytes": data.MAX_RECORD_BYTES}  # its Delta dead-letter table only
    spec["table"] = {
        "format": "delta",
        "namespace": append["spec"]["table"]["namespace"],
        "name": DELTA_TABLE,
        "location": location(bucket),
        "sortOrder": [{"field": f} for f in SORT_ORDER],
    }
    spec["compaction"] = {"minReplicas": 1, "maxReplicas": 1, "targetFileSizeBytes": TARGET_FILE_BYTES}
    spec["pods"] = {"driver": {"env": copy.deepcopy(env)}, "compaction": {"env": copy.deepcopy(env)}}
    return st


def arming(seed: int, chance: float) -> dict[str, str]:
    """`ICEFALL_FAILPOINTS_CHAOS` of the Delta table's pods, as the run's `ARMING` for the others."""
    driver = ",".join(p if p in AT_START else f"{p}@3" for p in DRIVER_POINTS)
    return {
        "driver": f"{seed}:{chance}:{driver}",
        "compaction": f"{seed}:{chance}:" + ",".join(COMPACTION_POINTS),
    }


def table_of(pod: str) -> str | None:
    """ "delta" for the Delta table's driver or compaction pod, else None."""
    return "delta" if pod == DELTA_DRIVER or pod.startswith(DELTA_COMPACT_PREFIX) else None


class DeltaOffsets:
    """The Delta table's committed offsets, read from its log (one `DeltaLog`, which keeps the newest
    snapshot it read: a read walks only the versions since), from any of the run's threads."""

    def __init__(self, table_location: str) -> None:
        self.location = table_location
        self.lock = threading.Lock()
        self.log: Any = None

    def committed(self) -> dict[int, int]:
        """{} while the store cannot be read or the table does not exist yet."""
        from icefall.commit.delta import DeltaLog

        try:
            with self.lock:
                if self.log is None:
                    self.log = DeltaLog(self.location)  # S3 from the AWS_* environment
                if self.log.latest_version() < 0:
                    return {}
                return dict(self.log.snapshot().committed.offsets)
        except Exception:  # an outage of the store: not known now
            return {}


def rows(table_location: str, options: dict[str, str]) -> list[dict[str, Any]]:
    """Every row of the Delta table at `table_location`, read with delta-rs."""
    from deltalake import DeltaTable

    found: list[dict[str, Any]] = (
        DeltaTable(table_location, storage_options=options).to_pyarrow_table().to_pylist()
    )
    return found


def audit(
    kafka: KafkaCluster, topic: str, partitions: int, tables: tuple[str, str], options: dict[str, str]
) -> Audit:
    """The Delta table and its dead-letter table (`tables`: their locations) against every record of `topic`
    (module doc)."""
    records = topic_records(kafka, topic, watermarks(kafka, topic, partitions))
    table, dead = tables
    return compare(records, rows(table, options), rows(dead, options))


def report(result: Audit | None, verify: str, kills: Counter[tuple[str, str]]) -> list[str]:
    """The report's section on the Delta table (`kills`: (table, component) → kills observed)."""
    observed = ", ".join(f"{c} {n}" for (t, c), n in sorted(kills.items()) if t == "delta") or "none"
    lines = [
        "## Delta table (append, on S3)",
        "",
        f"`{DELTA_NAME}`: the append table's topic into a Delta table on the run's MinIO (its own log "
        f"writer, put-if-absent), its dead-letter table beside it, merges Z-ordered by "
        f"{', '.join(SORT_ORDER)}. Its pods share the driver and compaction kill quotas; kills observed: "
        f"{observed}. Audit: the topic (read_committed, the reference decoder) against the table and its "
        "dead-letter table read with delta-rs, by offset and every value.",
        "",
    ]
    if result is not None:
        lines += [
            f"- records {result.records} ({result.good} good, {result.bad} malformed); table rows "
            f"{result.rows}, dead-letter rows {result.dead_rows}",
            "",
            "| duplicates | missing | wrong values |",
            "|---:|---:|---:|",
            f"| {result.duplicates} | {result.missing} | {result.wrong} |",
        ]
        if result.examples:
            lines += ["", "First problems:", "", *[f"- {e}" for e in result.examples]]
    else:
        lines.append("- not audited (the run ended before)")
    return [*lines, "", f"`icefall verify` (Delta): {verify}", ""]
