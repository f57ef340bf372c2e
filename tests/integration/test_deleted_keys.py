"""`icefall.ingest.deleted_keys.Remembering` on real Spark: which changes a remembered delete keeps out, and
which deleted keys are remembered after the batch (the window, tombstones, a newer write forgetting a key),
gathered while the batch's changes are read once."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from icefall.decode.decode import DELETE_COLUMN, SEQUENCE_COLUMN
from icefall.ingest import deleted_keys

pytestmark = pytest.mark.integration

NOW = 10_000_000
HOUR = 3_600_000


def changes(spark: SparkSession, rows: list[tuple[int, str | None, bool]]) -> Any:
    """The batch's last change per key: (id, position or None for a tombstone, deletes)."""
    data = [(i, None if p is None else [p], d) for i, p, d in rows]
    return spark.createDataFrame(data, f"id long, {SEQUENCE_COLUMN} array<string>, {DELETE_COLUMN} boolean")


def remembered(rows: list[tuple[int, str, int]]) -> pa.Table:
    return pa.table(
        {
            deleted_keys.KEY: pa.array([f'{{"id":{i}}}' for i, _, _ in rows], pa.string()),
            SEQUENCE_COLUMN: pa.array([[p] for _, p, _ in rows], pa.list_(pa.string())),
            deleted_keys.DELETED_AT: pa.array([t for _, _, t in rows], pa.int64()),
        }
    )


def kept(remembering: deleted_keys.Remembering) -> list[tuple[str, list[str], int]]:
    rows = remembering.kept().to_pylist()
    return sorted((r[deleted_keys.KEY], r[SEQUENCE_COLUMN], r[deleted_keys.DELETED_AT]) for r in rows)


def test_remembered_deletes_keep_older_changes_out_for_their_window(spark: SparkSession) -> None:
    last = changes(
        spark,
        [
            (1, "5", False),  # older than its remembered delete (7): out
            (2, "9", False),  # newer than its remembered delete: applied, the key forgotten
            (3, None, True),  # a tombstone, against a remembered delete: out
            (4, "5", False),  # its delete is past the window: forgotten, the change applies
            (5, "8", True),  # a new delete: remembered from now
            (6, None, True),  # a tombstone of a key not remembered: passes (the MERGE ignores it)
            (7, "9", True),  # a newer delete of a remembered key: remembered with its position
        ],
    )
    known = remembered(
        [(1, "7", NOW - 1), (2, "7", NOW - 1), (3, "7", NOW - 1), (4, "7", NOW - HOUR - 1), (7, "8", NOW - 1)]
    )
    remembering = deleted_keys.Remembering(known, now_ms=NOW, keep_ms=HOUR)
    filtered = remembering.filter(spark, last, ["id"])
    assert filtered.columns == last.columns
    assert sorted(r.id for r in filtered.collect()) == [2, 4, 5, 6, 7]
    assert kept(remembering) == [
        ('{"id":1}', ["7"], NOW - 1),
        ('{"id":3}', ["7"], NOW - 1),
        ('{"id":5}', ["8"], NOW),
        ('{"id":7}', ["9"], NOW),
    ]


def test_without_remembered_keys_every_change_passes_and_deletes_are_remembered(spark: SparkSession) -> None:
    last = changes(spark, [(1, "5", False), (2, "6", True), (3, None, True)])
    remembering = deleted_keys.Remembering(None, now_ms=NOW, keep_ms=HOUR)
    assert sorted(r.id for r in remembering.filter(spark, last, ["id"]).collect()) == [1, 2, 3]
    assert kept(remembering) == [('{"id":2}', ["6"], NOW)]


def test_a_batch_that_changes_no_remembered_key_leaves_the_set_as_it_is(spark: SparkSession) -> None:
    last = changes(spark, [(1, "5", False), (9, "9", False)])  # 1 older than its delete: out; 9 unknown
    remembering = deleted_keys.Remembering(remembered([(1, "7", NOW - 1)]), now_ms=NOW, keep_ms=HOUR)
    assert sorted(r.id for r in remembering.filter(spark, last, ["id"]).collect()) == [9]
    assert remembering.kept() is None  # nothing to write: the commit keeps the file named now
