"""Helpers for tests of Delta Lake tables: their manifests (`delta_manifest`), writers (`start_writer`,
`drain`), and their rows read by Spark's Delta reader, in a process of its own.

A test process's Spark session is an Iceberg table's (no Delta jars, extension or catalog), so
`read_with_sparks_delta_reader` starts a Delta table's session (`table_format` delta) in a child process
that copies the table's rows with Spark's Delta reader into Parquet files, which pyarrow reads back.
`plain` makes those rows and delta-rs's comparable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from icefall.api import StreamingTable
    from icefall.devstack.objectstore import ObjectStore
    from icefall.ingest.delta_sink import DeltaIngestor

#: The columns of the orders the tests' JSON records carry (`icefall.testing.streams.produce`).
ORDERS_FORMAT = """  format:
    type: json
    schema:
      - {name: id, type: long, required: true}
      - {name: customer, type: string}
      - {name: amount, type: "decimal(10,2)"}
      - {name: ts, type: timestamptz, required: true}
"""


def delta_manifest(
    name: str,
    bootstrap: str,
    topic: str,
    location: str,
    *,
    max_records: int,
    table: str = "",
    spec: str = "",
    format_lines: str = ORDERS_FORMAT,
) -> str:
    """A StreamingTable of a Delta table at `location` reading `topic`: `format_lines` (the orders' JSON by
    default), batches of at most `max_records` at once, embedded upkeep without pauses. `table`: more of
    `spec.table`'s flow mapping (", partitioning: [...]"); `spec`: more lines of the spec, indented two."""
    lines = [
        "apiVersion: icefall.dev/v1alpha1",
        "kind: StreamingTable",
        f"metadata: {{name: {name}}}",
        "spec:",
        f'  source: {{bootstrapServers: "{bootstrap}", topic: {topic}}}',
        format_lines.rstrip(),
        f'  table: {{format: delta, location: "{location}"{table}}}',
        *([spec.rstrip()] if spec else []),
        "  compaction: {embeddedIntervalSeconds: 0}",
        "  freshness: {targetSeconds: 2}",
        f"  batch: {{maxRecords: {max_records}, minIntervalSeconds: 0}}",
    ]
    return "\n".join(lines) + "\n"


def aws_env(store: ObjectStore) -> dict[str, str]:
    """The AWS SDK's environment names the Delta writer reads (`icefall.commit.delta_storage`), for `store`:
    what a pod takes from a Secret."""
    return {
        "AWS_ACCESS_KEY_ID": store.access_key,
        "AWS_SECRET_ACCESS_KEY": store.secret_key,
        "AWS_REGION": store.region,
        "AWS_ENDPOINT_URL": store.endpoint,
    }


def start_writer(
    st: StreamingTable, spark: Any, location: str, leases: Path, holder: str, **options: Any
) -> DeltaIngestor:
    """A started `DeltaIngestor` of `st` at `location`; its commit lease a file in `leases`, held by
    `holder`."""
    from icefall.commit.lease import FileLease
    from icefall.ingest.delta_sink import DeltaIngestor

    lease = FileLease.in_dir(leases, "commit", holder, duration_seconds=30)
    ingestor = DeltaIngestor(st, spark, lease, location=location, **options)
    ingestor.start(lease_timeout=5)
    return ingestor


def drain(writer: DeltaIngestor) -> list[Any]:
    """`writer`'s batches until it is caught up: the report of each that landed."""
    reports = []
    while (report := writer.run_batch()) is not None:
        reports.append(report)
    return reports


def delta_ids(location: str, storage_options: Mapping[str, str] | None = None) -> Counter[int]:
    """How often each `id` is in the Delta table at `location`, read with delta-rs."""
    from deltalake import DeltaTable

    table = DeltaTable(location, storage_options=dict(storage_options or {}))
    return Counter(table.to_pyarrow_table().column("id").to_pylist())


SPARK_DELTA_READER = """
import sys
from icefall.api import TableFormat
from icefall.spark.session import build_spark_session

spark = build_spark_session(
    [], master="local[1]", app_name="delta-read", table_format=TableFormat.DELTA,
    extra_conf={"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"},
)
assert "DeltaCatalog" in spark.conf.get("spark.sql.catalog.spark_catalog")
spark.read.format("delta").load(sys.argv[1]).write.parquet(sys.argv[2])
spark.stop()
"""


def plain(value: Any) -> Any:
    """`value` with every timestamp as a naive UTC datetime (delta-rs gives aware ones, Spark naive ones in
    the session's time zone, UTC) and nested rows as dicts."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def in_delta_session(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`script` run by a Python child with `args`, where a Delta table's Spark session can start (the Delta
    jars of the dev stack named in its environment); its output captured, not checked."""
    from icefall.devstack.tools import tool_dir
    from icefall.spark.session import DELTA_JARS_VARIABLE

    env = {**os.environ, DELTA_JARS_VARIABLE: str(tool_dir(DELTA_JARS_VARIABLE))}
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def read_with_sparks_delta_reader(location: str, out: Path) -> list[dict[str, Any]]:
    """The rows of the Delta table at `location`, read by Spark's Delta reader (`SPARK_DELTA_READER`)."""
    import pyarrow.parquet as pq

    done = in_delta_session(SPARK_DELTA_READER, location, str(out), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows: list[dict[str, Any]] = pq.read_table(out).to_pylist()
    return rows
