"""The auditor's pure pieces: rows from before an offset reset are taken away as a multiset, the table's
`icefall.lost-records` cannot exceed the offsets below Kafka's low watermark that no table holds, and a
duplicate is an offset one table holds twice: by content, a record in both the table and the dead-letter
table (a spec fixed between a crash and the batch read again) is judged by its row's content instead.

Not proved here: reading rows and records (tests/integration/test_audit.py, test_audit_content.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icefall.audit import ROW_SCHEMA, PartitionAudit
from icefall.audit.rows import DEAD_LETTER, EXPECTED_SCHEMA, GOOD, OFFSETS, subtract
from icefall.audit.table import _audit_partition, _check_lost_records, _Found, _Options, _Range, _wrong_rows
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


def test_a_record_in_both_tables_is_one_wrong_row_by_content_not_a_duplicate() -> None:
    # Offsets 0-4 of partition 0. Record 2 was a dead letter under the old spec (in the DLQ), and is good
    # under the fixed one (in the table too); the table holds offset 3 twice.
    main = rows((0, 0, 10), (0, 1, 11), (0, 2, 12), (0, 3, 13), (0, 3, 13), (0, 4, 14))
    dlq = rows((0, 2, 99))
    expected = pa.Table.from_pylist(
        [{"partition": 0, "offset": o, "kind": GOOD, "digest": 10 + o} for o in range(5)], EXPECTED_SCHEMA
    )
    wrong = _wrong_rows(main, dlq, expected)
    offsets = [pa.array(t.column("offset").to_pylist(), OFFSETS).sort() for t in (main, dlq)]
    kafka = pa.array(range(5), OFFSETS)
    options = _Options(has_dlq_table=True, filter_configured=False, ingesting=False, max_examples=10)
    found = _Found(kafka, offsets[0], offsets[1], expected, wrong[0], before_reset=0)
    audit = _audit_partition(_Range(0, 0, 5, (0, 5)), found, options)
    assert (audit.duplicates, audit.duplicate_examples, audit.duplicate_rows) == (1, (3,), 1)  # offset 3 only
    assert (audit.in_table_and_dlq, audit.wrong, audit.wrong_examples) == (1, 1, (2,))  # the DLQ's row of 2
    assert audit.result == "FAIL: 1 duplicated, 1 wrong"

    # Under the old spec, record 2 is a dead letter: the table's row of it is the wrong one.
    old = expected.set_column(2, "kind", pa.array([GOOD, GOOD, DEAD_LETTER, GOOD, GOOD], pa.int8()))
    old = old.set_column(3, "digest", pa.array([10, 11, 99, 13, 14], pa.int64()))
    found = _Found(kafka, offsets[0], offsets[1], old, _wrong_rows(main, dlq, old)[0], before_reset=0)
    assert _audit_partition(_Range(0, 0, 5, (0, 5)), found, options).wrong_examples == (2,)

    # By offsets only, which row is right cannot be told: an offset in both is a duplicate too.
    found = _Found(kafka, offsets[0], offsets[1], None, pa.array([], OFFSETS), before_reset=0)
    audit = _audit_partition(_Range(0, 0, 5, (0, 5)), found, options)
    assert (audit.duplicates, audit.duplicate_examples, audit.in_table_and_dlq) == (2, (2, 3), 1)
