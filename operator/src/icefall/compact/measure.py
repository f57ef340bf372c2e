"""A table's figures from its metadata, and its compaction backlog: what status shows and compaction is
scaled on. Read by the table's own driver, with the table's credentials (`icefall.ingest.table_meter`):
the operator reads no table itself.

`table_facts` reads only the metadata the `Table` was loaded with (no manifest, no data file);
`compaction_backlog` reads the manifests of main's head (`icefall.compact.view.read_table_view`, without
listing storage) and runs the maintenance planner on them.

Not guaranteed: that the figures are current (they are the loaded metadata's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from icefall.api import StreamingTable
from icefall.commit.protocol import EPOCH_CLAIM_PROPERTY, RESET_PROPERTY
from icefall.commit.state import state_of
from icefall.plan.table_status import TableFacts

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icefall.compact.view import ManifestCache

LAST_EXPIRY_PROPERTY = "icefall.last-expiry-time-ms"


def table_facts(table: Table) -> TableFacts:
    """The figures `plan.table_status` needs, from the table's metadata and its head's summary."""
    from pyiceberg.table.snapshots import Operation, ancestors_of

    metadata = table.metadata
    state = state_of(metadata)
    head = table.current_snapshot()
    summary: Mapping[str, str] = head.summary if head is not None and head.summary is not None else {}

    def number(key: str) -> int:
        try:
            return int(summary.get(key, 0) or 0)
        except ValueError:
            return 0

    last_append = last_replace = None
    for snapshot in ancestors_of(head, metadata) if head is not None else ():
        operation = snapshot.summary.operation if snapshot.summary is not None else None
        # An epoch claim or an offset reset is an empty append that commits no records.
        bookkeeping = snapshot.summary is not None and any(
            key in snapshot.summary.additional_properties for key in (EPOCH_CLAIM_PROPERTY, RESET_PROPERTY)
        )
        if operation is Operation.APPEND and last_append is None and not bookkeeping:
            last_append = snapshot
        elif operation is Operation.REPLACE and last_replace is None:
            last_replace = snapshot
        if last_append is not None and last_replace is not None:
            break
    expiry = metadata.properties.get(LAST_EXPIRY_PROPERTY)
    return TableFacts(
        offsets_by_topic={topic: dict(held.offsets) for topic, held in state.by_topic().items()},
        topic_id=state.topic_id,
        max_produce_time_ms=state.max_produce_time_ms,
        lost_records=state.lost_records,
        last_commit_ms=last_append.timestamp_ms if last_append is not None else None,
        last_commit_snapshot_id=last_append.snapshot_id if last_append is not None else None,
        data_files=number("total-data-files"),
        total_file_bytes=number("total-files-size"),
        records=number("total-records"),
        snapshots=len(metadata.snapshots),
        last_compaction_ms=last_replace.timestamp_ms if last_replace is not None else None,
        last_expiry_ms=int(expiry) if expiry and expiry.isdigit() else None,
    )


def compaction_backlog(
    table: Table, st: StreamingTable, now_ms: int, cache: ManifestCache | None = None
) -> tuple[int, float | None]:
    """(work items the maintenance planner finds now, share of small data files or None). `cache`: the
    manifests read before (a reader that measures repeatedly keeps one: only new manifests are read)."""
    from icefall.compact.view import read_table_view
    from icefall.plan.maintenance import backlog, plan_maintenance, policy_from_spec
    from icefall.plan.table_view import FileContent

    view = read_table_view(table, list_storage=False, cache=cache)
    policy = policy_from_spec(st.spec)
    data = [f for f in view.files if f.content is FileContent.DATA]
    small = policy.small_file_ratio * policy.target_size(view.properties)
    ratio = sum(1 for f in data if f.size_bytes < small) / len(data) if data else None
    return backlog(plan_maintenance(view, policy, now_ms)), ratio
