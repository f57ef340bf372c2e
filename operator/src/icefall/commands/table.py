"""`icefall status` (offsets, lag and freshness of a table against its topic, as text or JSON) and
`icefall reset-offsets` (the explicit, recorded action after the topic was recreated or truncated).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from icefall.commands.common import catalog_for, load_table, state_dir, unreachable_is_one_line


def show_status(args: argparse.Namespace) -> int:
    """`icefall status`: the table's committed offsets against the topic, as text or JSON (`--output`);
    exit code 0, or `EXIT_SOURCE_CHANGED` when the topic is not the one the offsets were committed on."""
    from icefall.commands.run import EXIT_SOURCE_CHANGED

    report = table_status(args)
    if getattr(args, "output", "text") == "json":
        print(json.dumps(report, indent=2))
    else:
        print(_render_status(report))
    return 0 if report["problem"] is None else EXIT_SOURCE_CHANGED


def table_status(args: argparse.Namespace) -> dict[str, Any]:
    """What `icefall status` prints, as a JSON-ready mapping (camelCase keys, as in the StreamingTable's
    status): table, snapshotId, epoch, partitions (partition, committed, high, lag), lagRecords,
    freshnessSeconds (null: unmeasured), lostRecords and problem (null, or why ingestion stopped)."""
    from icefall.commit import read_committed
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config
    from icefall.plan.lag import freshness_seconds, partition_lag
    from icefall.plan.offsets import resolve_positions, source_change

    st = load_table(args)
    config = catalog_for(st, state_dir(args))
    with unreachable_is_one_line(st, config):
        table = config.pyiceberg().load_table(st.table_identifier)
        committed = read_committed(table)
        kafka_config = librdkafka_config(st.spec.source.security)
        with TopicView(st.spec.source.bootstrap_servers, st.spec.source.topic, kafka_config) as topic:
            marks = topic.watermarks()
            topic_id = topic.topic_id()
            oldest_waiting_ms = topic.oldest_waiting_ms(committed.offsets, marks)
    lag = partition_lag(committed.offsets, marks)
    total = sum(lag.values())
    behind = freshness_seconds(
        total, committed.max_produce_time_ms, time.time(), oldest_waiting_ms=oldest_waiting_ms
    )
    ahead = resolve_positions(committed.offsets, marks, st.spec.source.starting_position.type).offsets_ahead
    return {
        "table": ".".join(st.table_identifier),
        "snapshotId": committed.snapshot_id,
        "epoch": committed.epoch,
        "partitions": [
            {"partition": p, "committed": committed.offsets.get(p), "high": high, "lag": lag[p]}
            for p, (_, high) in sorted(marks.items())
        ],
        "lagRecords": total,
        "freshnessSeconds": None if behind is None else round(behind, 1),
        "lostRecords": committed.lost_records,
        "problem": source_change(st.spec.source.topic, committed.topic_id, topic_id, ahead),
    }


def _render_status(report: dict[str, Any]) -> str:
    lines = [f"table {report['table']}  snapshot {report['snapshotId']}  epoch {report['epoch']}"]
    lines.append(f"{'partition':>9} {'committed':>12} {'high':>12} {'lag':>10}")
    for row in report["partitions"]:
        committed = "-" if row["committed"] is None else row["committed"]
        lines.append(f"{row['partition']:>9} {committed!s:>12} {row['high']:>12} {row['lag']:>10}")
    behind = report["freshnessSeconds"]
    freshness = "unmeasured" if behind is None else f"{behind:.1f}s"
    lost = report["lostRecords"]
    lines.append(
        f"lag {report['lagRecords']} records, freshness {freshness}, lost to retention {lost} records"
    )
    if lost:
        lines.append(
            f"DATA LOSS: {lost} records were deleted by Kafka retention before they were "
            "ingested (table property icefall.lost-records)"
        )
    if report["problem"] is not None:
        lines.append(f"INGESTION STOPPED: {report['problem']}")
    return "\n".join(lines)


def reset_offsets(args: argparse.Namespace) -> int:
    """The explicit user action after the topic was recreated or truncated: commit new offsets, recorded.
    (A table in a cluster: `commands.reset_request.request_reset`.)"""
    if not args.file:
        raise SystemExit("give -f <manifest>, or --namespace and --name of a StreamingTable in a cluster")
    st = load_table(args)
    catalog = catalog_for(st, state_dir(args)).pyiceberg()
    done, message = reset_table(st, catalog, args.to)
    print(message)
    return 0 if done else 1


def reset_table(st: Any, catalog: Any, to: str, *, request: str | None = None) -> tuple[bool, str]:
    """Reset the committed offsets of `st`'s table (and first its dead-letter table) to the topic's `to`
    (earliest | latest) offsets, if the topic was recreated or truncated below them; else nothing. Whether
    it reset, and what to say. `request`: the cluster request's id, recorded with the reset (a request
    recorded already is not applied again: `commit.reset_offsets`)."""
    from icefall.commit import read_committed, reset_offsets
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config
    from icefall.plan.offsets import resolve_positions, source_change

    table = catalog.load_table(st.table_identifier)
    committed = read_committed(table)
    source = st.spec.source
    with TopicView(source.bootstrap_servers, source.topic, librdkafka_config(source.security)) as topic:
        topic_id = topic.topic_id()
        marks = topic.watermarks()
    ahead = resolve_positions(committed.offsets, marks, source.starting_position.type).offsets_ahead
    problem = source_change(source.topic, committed.topic_id, topic_id, ahead)
    name = ".".join(st.table_identifier)
    if problem is None:
        return False, (
            f"nothing to reset: {name} follows topic {source.topic!r} (id {topic_id}) and no committed "
            "offset is past the topic's end"
        )
    reason = "topic-recreated" if committed.topic_id not in (None, topic_id) else "offsets-ahead"
    offsets = {p: (low if to == "earliest" else high) for p, (low, high) in marks.items()}
    now_ms = int(time.time() * 1000)
    dead_letter = st.dead_letter_identifier
    # The dead-letter table first: left ahead of the main table, its rows past the new offsets would be
    # taken for leftovers of a failed batch and deleted.
    if dead_letter and catalog.table_exists(dead_letter):
        dlq = catalog.load_table(dead_letter)
        if read_committed(dlq).offsets:
            reset_offsets(
                dlq, topic_id=topic_id, offsets=offsets, reason=reason, now_ms=now_ms, request=request
            )
    reset_offsets(table, topic_id=topic_id, offsets=offsets, reason=reason, now_ms=now_ms, request=request)
    return True, (
        f"[reset] {problem.split(';')[0]}\n"
        f"[reset] {name} now follows topic id {topic_id} from its {to} offsets {offsets}; recorded in the "
        "table property icefall.offset-resets. Rows already in the table stay."
    )
