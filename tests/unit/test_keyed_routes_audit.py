"""`icefall verify` of keyed routes (`icefall.audit.keyed_routes`): the pure parts.

Proves: a table's committed ranges in the topics form name their topic (each partition from where it was
first read, nothing for a partition read to where it started); the records read once cover every
destination's ranges of each (topic, partition), whichever is ahead; the report is a keyed report per
destination, failing naming the destination, and its JSON lists each destination's keyed counts.
Not proved here: reading, routing and comparing real records (tests/integration/test_routes_schemas.py).
"""

from __future__ import annotations

import pytest

from icefall.audit.keyed import KeyedAuditReport, committed_ranges
from icefall.audit.keyed_routes import _spanning
from icefall.audit.report import report_json
from icefall.audit.routed import DestinationAudit, RoutedAuditReport
from icefall.commit.state import CommittedState, TopicState
from icefall.plan.offsets import OffsetRange

pytestmark = pytest.mark.unit


def test_committed_ranges_of_the_topics_form_name_their_topic() -> None:
    state = CommittedState(
        snapshot_id=1,
        topics={
            "db.orders": TopicState(offsets={0: 7, 1: 3}, start_offsets={1: 3}),
            "db.customers": TopicState(offsets={0: 5}, start_offsets={0: 2}),
        },
    )
    assert committed_ranges(state) == (
        OffsetRange(0, 2, 5, "db.customers"),
        OffsetRange(0, 0, 7, "db.orders"),
    )
    one = CommittedState(snapshot_id=1, topic="t", offsets={0: 4, 1: 0})
    assert committed_ranges(one) == (OffsetRange(0, 0, 4),)


def test_the_records_read_span_every_destinations_ranges() -> None:
    behind = [OffsetRange(0, 0, 10, "a"), OffsetRange(1, 0, 4, "a"), OffsetRange(0, 0, 6, "b")]
    ahead = [OffsetRange(0, 0, 14, "a"), OffsetRange(1, 2, 4, "a"), OffsetRange(0, 0, 9, "b")]
    assert _spanning([*behind, *ahead]) == (
        OffsetRange(0, 0, 14, "a"),
        OffsetRange(1, 0, 4, "a"),
        OffsetRange(0, 0, 9, "b"),
    )
    assert _spanning([OffsetRange(1, 3, 5), OffsetRange(0, 0, 2), OffsetRange(1, 0, 4)]) == (
        OffsetRange(0, 0, 2),
        OffsetRange(1, 0, 5),
    )


def keyed(table: str, **problems: int) -> KeyedAuditReport:
    return KeyedAuditReport(table=table, snapshot_id=3, records=10, keys=4, rows=4, **problems)


def test_the_report_is_a_keyed_report_per_destination() -> None:
    report = RoutedAuditReport(
        (
            DestinationAudit("spec.table", keyed("inv.changes", dead_letters_missing=1)),
            DestinationAudit("routes[0]", keyed("inv.customers")),
            DestinationAudit("routes[1]", keyed("inv.orders", duplicates=1)),
        )
    )
    assert not report.ok
    assert report.destination("inv.customers").ok and report.destination("routes[1]").duplicates == 1
    text = report.render()
    assert "[routes[1]] table inv.orders (keyed) at snapshot 3" in text
    assert text.endswith("routed table, 3 destinations: FAILED: spec.table, routes[1]"), text
    data = report_json(report)
    assert [(d["destination"], d["ok"], d["keys"]) for d in data["destinations"]] == [
        ("spec.table", False, 4),
        ("routes[0]", True, 4),
        ("routes[1]", False, 4),
    ]
    assert data["destinations"][0]["deadLettersMissing"] == 1
