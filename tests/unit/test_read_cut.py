"""What `icefall read` reports: the cut's lines and counts, and the rows as aligned text.

Proves: the cut names the table, the snapshot (a Delta table's version), every partition's tail range and
the counts (bad records left out, records the filter dropped, data loss only when there is some);
`Cut.offsets` is the end of each range; a table of several topics gives its cut per topic and partition;
`--format table` prints a header, a rule, one line per row (nested values as JSON) and the count.
Not proved here: that the reads are right (tests/integration/test_union_read.py, against real Kafka).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from icefall.cli import build_parser
from icefall.commands.read import table_text
from icefall.ingest.union_read import Cut

pytestmark = pytest.mark.unit


def test_the_cut_names_the_snapshot_the_ranges_and_the_counts() -> None:
    cut = Cut(
        table="shop.orders",
        topic="orders",
        snapshot_id=42,
        snapshot_ms=1_764_000_000_000,
        taken_at_ms=1_764_000_005_250,
        partitions={1: (90, 95), 0: (100, 130)},
        tail_records=35,
        tail_rows=30,
        bad_records=2,
    )
    assert cut.offsets == {0: 130, 1: 95}
    assert cut.filtered_records == 3
    lines = cut.render()
    assert lines == [
        "[read] shop.orders at snapshot 42 (committed 2025-11-24T16:00:00.000Z) + topic orders up to the cut "
        "taken 2025-11-24T16:00:05.250Z",
        "[read] cut, per partition tail from..to: 0: 100..130, 1: 90..95",
        "[read] tail: 35 records, 30 rows, 2 bad records left out, 3 filtered out",
    ]
    lossy = Cut(table="t", topic="x", snapshot_id=None, snapshot_ms=None, taken_at_ms=0, lost_records=7)
    assert "no snapshot yet" in lossy.render()[0]
    assert lossy.render()[-1].startswith("[read] DATA LOSS: 7 records")
    assert cut.to_dict()["partitions"] == {"0": [100, 130], "1": [90, 95]}
    delta = Cut(
        table="/data/orders", topic="orders", snapshot_id=7, snapshot_ms=None, taken_at_ms=0, unit="version"
    )
    assert delta.render()[0].startswith("[read] /data/orders at version 7 + topic orders")


def test_the_cut_of_several_topics_is_per_topic_and_partition() -> None:
    topics = {"orders-us": {0: (5, 9)}, "orders-eu": {1: (0, 2), 0: (7, 7)}}
    cut = Cut(
        table="t", topic="orders-eu, orders-us", snapshot_id=1, snapshot_ms=None, taken_at_ms=0, topics=topics
    )
    assert (
        cut.render()[1] == "[read] cut, per topic/partition tail from..to: "
        "orders-eu/0: 7..7, orders-eu/1: 0..2, orders-us/0: 5..9"
    )
    assert cut.to_dict()["topics"] == {"orders-eu": {"0": [7, 7], "1": [0, 2]}, "orders-us": {"0": [5, 9]}}


def test_rows_as_aligned_text() -> None:
    rows = pa.table({"id": [1, 22], "_kafka": [{"partition": 0, "offset": 5}, None]})
    assert table_text(rows) == [
        "id | _kafka",
        "---+-" + "-" * 26,
        '1  | {"partition":0,"offset":5}',
        "22 | null",
        "(2 rows)",
    ]


def test_read_takes_one_snapshot_choice() -> None:
    parser = build_parser()
    args = parser.parse_args(["read", "-f", "t.yaml", "--snapshot", "7", "--format", "csv", "--limit", "3"])
    assert (args.snapshot, args.as_of, args.format, args.limit) == (7, None, "csv", 3)
    with pytest.raises(SystemExit):
        parser.parse_args(["read", "-f", "t.yaml", "--snapshot", "7", "--as-of", "2026-01-01T00:00:00"])
