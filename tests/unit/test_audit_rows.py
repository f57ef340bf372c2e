"""The auditor's pure pieces: rows from before an offset reset are taken away as a multiset, and the table's
`icefall.lost-records` cannot exceed the offsets below Kafka's low watermark that no table holds.

Not proved here: reading rows and records (tests/integration/test_audit.py, test_audit_content.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icefall.audit import ROW_SCHEMA, PartitionAudit
from icefall.audit.rows import subtract
from icefall.audit.table import _check_lost_records
from icefall.commit.state import CommittedState

pytestmark = pytest.mark.unit


def rows(*triples: tuple[int, int, int | None]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"partition": p, "offset": o, "digest": d} for p, o, d in triples], ROW_SCHEMA
    )


def as_set(table: pa.Table) -> list[tuple[int, int, int]]:
    return sorted((r["partition"], r["offset"], r["digest"]) for r in table.to_pylist())


def test_rows_of_the_old_topic_are_taken_away_by_content_and_count() -> None:
    # Offset 5 holds an old row (digest 1) and a new one (digest 2); offset 6 the same old content twice
    # (once before the reset, once after); offset 7 an old row that table retention deleted since.
    now = rows((0, 5, 1), (0, 5, 2), (0, 6, 3), (0, 6, 3), (1, 5, 9))
    before = rows((0, 5, 1), (0, 6, 3), (0, 7, 4))
    kept, removed = subtract(now, before)
    assert as_set(kept) == [(0, 5, 2), (0, 6, 3), (1, 5, 9)]
    assert as_set(removed) == [(0, 5, 1), (0, 6, 3)]


def test_offsets_only_rows_are_taken_away_by_count() -> None:
    kept, removed = subtract(rows((0, 1, None), (0, 1, None), (0, 2, None)), rows((0, 1, None)))
    assert [(r["partition"], r["offset"]) for r in kept.to_pylist()] == [(0, 1), (0, 2)]
    assert removed.num_rows == 1


def audit_with(absent_below_low: int) -> PartitionAudit:
    return PartitionAudit(
        partition=0, start=0, committed=10, low_watermark=4, high_watermark=10, expected=6, in_table=6,
        in_dlq=0, in_table_and_dlq=0, duplicates=0, duplicate_rows=0, missing=0, filtered=0, unexpected=0,
        lost_to_retention=4, unverified=4 - absent_below_low, absent_below_low=absent_below_low,
    )  # fmt: skip


def test_lost_records_cannot_exceed_the_offsets_nobody_holds() -> None:
    state = CommittedState(snapshot_id=1, offsets={0: 10}, lost_records=3)
    assert _check_lost_records(state, [audit_with(3)], reset=False) is None
    problem = _check_lost_records(state, [audit_with(2)], reset=False)
    assert problem is not None and "says 3 records were lost" in problem and "only 2 offsets" in problem
    assert _check_lost_records(state, [audit_with(2)], reset=True) is None, "spans topics after a reset"
