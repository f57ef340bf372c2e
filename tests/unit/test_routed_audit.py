"""`icefall verify` and `icefall read` per destination of a routed table (`spec.routes`): the pure parts.

Proves: each destination sees its own records as re-decoding says (good, filtered, dead letters for
`spec.table` with its dead-letter table) and every other destination's as ELSEWHERE; a partition's audit
counts a row of another destination's record as in the wrong table (not as wrong content), never counts
another destination's record as missing, and still counts its own absent records missing; the decoded
records are cut to each destination's ranges and decoded again only for ranges not held yet; the report
is one table per destination, failing naming the destination; `read --table` accepts only the tables the
StreamingTable writes and names them; the cut counts records routed elsewhere apart from filtered ones.
Not proved here: reading and routing real records (tests/integration/test_routes_audit.py).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from icefall.api import load_manifest
from icefall.audit import AuditReport, PartitionAudit
from icefall.audit.report import report_json
from icefall.audit.routed import (
    DEAD,
    DEFAULT,
    RECORDS_SCHEMA,
    DestinationAudit,
    RoutedAuditReport,
    covering,
    destination_view,
    within,
)
from icefall.audit.rows import DEAD_LETTER, ELSEWHERE, EXPECTED_SCHEMA, FILTERED, GOOD, OFFSETS
from icefall.audit.table import _audit_partition, _Found, _Options, _Range
from icefall.ingest.union_read import Cut, ReadError, read_identifier

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).parents[2] / "examples" / "routed-events.yaml"


def records(*rows: tuple[int, int, int, int, int | None]) -> pa.Table:
    names = ("partition", "offset", "dest", "kind", "digest")
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows], RECORDS_SCHEMA)


RECORDS = records(
    (0, 0, 0, GOOD, 10),  # routes[0]
    (0, 1, 1, GOOD, 11),  # routes[1]
    (0, 2, DEFAULT, GOOD, 12),  # no route: spec.table
    (0, 3, DEAD, DEAD_LETTER, 13),  # malformed (or unrouted with DeadLetter)
    (0, 4, 0, FILTERED, None),  # routes[0]'s, dropped by the filter
)


def kinds(table: pa.Table) -> list[tuple[int, int, int | None]]:
    return [(r["offset"], r["kind"], r["digest"]) for r in table.to_pylist()]


def test_each_destination_sees_its_own_records_and_the_others_elsewhere() -> None:
    assert destination_view(RECORDS, 0).schema == EXPECTED_SCHEMA
    assert kinds(destination_view(RECORDS, 0)) == [
        (0, GOOD, 10), (1, ELSEWHERE, None), (2, ELSEWHERE, None), (3, ELSEWHERE, None), (4, FILTERED, None)
    ]  # fmt: skip
    # spec.table is audited with the dead-letter table: the dead letters are its own.
    assert kinds(destination_view(RECORDS, DEFAULT)) == [
        (0, ELSEWHERE, None), (1, ELSEWHERE, None), (2, GOOD, 12), (3, DEAD_LETTER, 13), (4, ELSEWHERE, None)
    ]  # fmt: skip


def test_records_are_cut_to_a_destinations_ranges_and_decoded_again_only_past_what_is_held() -> None:
    assert within(RECORDS, {0: (1, 3)}).column("offset").to_pylist() == [1, 2]
    assert within(RECORDS, {1: (0, 9)}).num_rows == 0
    assert covering({0: (0, 10)}, {0: (2, 8)}) is None
    # A destination ahead (a crash between commits): the union of both ranges is decoded once.
    assert covering({0: (0, 10)}, {0: (5, 14), 1: (3, 4)}) == {0: (0, 14), 1: (3, 4)}
    assert covering(None, {0: (0, 5)}) == {0: (0, 5)}


def audit(table: list[int], expected: list[tuple[int, int]], wrong: list[int]) -> PartitionAudit:
    """One partition holding offsets 0..5 in Kafka, committed to 6, audited by content."""
    found = _Found(
        kafka=pa.array(range(6), OFFSETS),
        table=pa.array(table, OFFSETS),
        dlq=pa.array([], OFFSETS),
        expected=pa.Table.from_pylist(
            [{"partition": 0, "offset": o, "kind": k, "digest": None} for o, k in expected], EXPECTED_SCHEMA
        ),
        wrong=pa.array(wrong, OFFSETS),
        before_reset=0,
    )
    options = _Options(has_dlq_table=False, filter_configured=False, ingesting=False, max_examples=10)
    return _audit_partition(_Range(0, 0, 6, (0, 6)), found, options)


ROUTE_0 = [(0, GOOD), (1, ELSEWHERE), (2, GOOD), (3, ELSEWHERE), (4, FILTERED), (5, ELSEWHERE)]


def test_a_row_of_another_destinations_record_is_in_the_wrong_table_not_missing_elsewhere() -> None:
    good = audit([0, 2], ROUTE_0, [])
    assert good.ok and good.missing == 0 and good.routed_elsewhere == 3 and good.filtered == 1
    assert good.result == "ok (1 filtered, 3 routed elsewhere)"
    # Offset 3 belongs to another table (the content check called it wrong: its kind is ELSEWHERE).
    copied = audit([0, 2, 3], ROUTE_0, [3])
    assert (copied.wrong_table, copied.wrong_table_examples, copied.wrong) == (1, (3,), 0)
    assert not copied.ok and copied.result.startswith("FAIL: 1 in the wrong table")
    # A changed row of its own record stays wrong content.
    changed = audit([0, 2], ROUTE_0, [2])
    assert (changed.wrong, changed.wrong_table) == (1, 0)
    deleted = audit([0], ROUTE_0, [])
    assert (deleted.missing, deleted.missing_examples) == (1, (2,))


def report(table: str, *partitions: PartitionAudit) -> AuditReport:
    return AuditReport(
        table=table, dlq_table=None, topic="events", snapshot_id=7, filter_configured=False,
        ingesting=False, partitions=partitions, content_checked=True,
    )  # fmt: skip


def test_the_report_is_one_table_per_destination_and_fails_naming_it() -> None:
    ok = audit([0, 2], ROUTE_0, [])
    copied = audit([0, 2, 3], ROUTE_0, [3])
    routed = RoutedAuditReport(
        (
            DestinationAudit("spec.table", report("web.events_other", ok)),
            DestinationAudit("routes[0]", report("web.clicks", copied)),
        )
    )
    assert not routed.ok
    assert routed.destination("web.clicks").wrong_table == 1
    assert routed.destination("routes[0]") is routed.destination("web.clicks")
    text = routed.render()
    assert (
        "[spec.table] web.events_other (no DLQ table) vs topic events at snapshot 7, by content: OK" in text
    )
    assert "[routes[0]] web.clicks (no DLQ table) vs topic events at snapshot 7, by content: FAILED" in text
    assert "partition 0: rows of records another destination takes, at offsets 3" in text
    assert text.endswith("routed table, 2 destinations: FAILED: routes[0]")
    data = report_json(routed)
    assert data["ok"] is False
    assert [(d["destination"], d["table"], d["ok"]) for d in data["destinations"]] == [
        ("spec.table", "web.events_other", True),
        ("routes[0]", "web.clicks", False),
    ]
    assert data["destinations"][1]["partitions"][0]["wrongTable"] == 1


def test_read_table_is_one_of_the_tables_the_streamingtable_writes() -> None:
    st = load_manifest(EXAMPLE.read_text())
    assert read_identifier(st, None) == ("shop", "events")
    assert read_identifier(st, "shop.events") == ("shop", "events")
    assert read_identifier(st, "shop.orders") == ("shop", "orders")
    assert st.route_of("shop.payments") == 1 and st.route_of("shop.events") is None
    with pytest.raises(ReadError, match=r"--table 'shop.nope' is not a table events writes; choose one of "
                       r"shop.events, shop.orders, "):  # fmt: skip
        read_identifier(st, "shop.nope")


def test_the_cut_counts_records_routed_elsewhere_apart_from_filtered_ones() -> None:
    cut = Cut(
        table="web.clicks", topic="events", snapshot_id=None, snapshot_ms=None, taken_at_ms=0,
        tail_records=10, tail_rows=4, bad_records=1, routed_elsewhere=4,
    )  # fmt: skip
    assert cut.filtered_records == 1
    assert cut.render()[2] == (
        "[read] tail: 10 records, 4 rows, 1 bad records left out, 1 filtered out, "
        "4 routed to other destinations"
    )
    assert cut.to_dict()["routed_elsewhere"] == 4
