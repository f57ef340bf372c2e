"""Helpers for tests of Delta Lake tables: their rows read by Spark's Delta reader, in a process of its own.

A test process's Spark session is an Iceberg table's (no Delta jars, extension or catalog), so
`read_with_sparks_delta_reader` starts a Delta table's session (`table_format` delta) in a child process
that copies the table's rows with Spark's Delta reader into Parquet files, which pyarrow reads back.
`plain` makes those rows and delta-rs's comparable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


def read_with_sparks_delta_reader(location: str, out: Path) -> list[dict[str, Any]]:
    """The rows of the Delta table at `location`, read by Spark's Delta reader (`SPARK_DELTA_READER`)."""
    import pyarrow.parquet as pq

    from icefall.devstack.tools import tool_dir
    from icefall.spark.session import DELTA_JARS_VARIABLE

    env = {**os.environ, DELTA_JARS_VARIABLE: str(tool_dir(DELTA_JARS_VARIABLE))}
    done = subprocess.run(
        [sys.executable, "-c", SPARK_DELTA_READER, location, str(out)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows: list[dict[str, Any]] = pq.read_table(out).to_pylist()
    return rows
