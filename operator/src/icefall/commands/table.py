"""`icefall status` (offsets, lag and freshness of a table against its topic) and `icefall reset-offsets`
(the explicit, recorded action after the topic was recreated or truncated).
"""

from __future__ import annotations

import argparse
import time

from icefall.commands.common import catalog_for, load_table, state_dir, unreachable_is_one_line


def show_status(args: argparse.Namespace) -> int:
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
    print(f"table {'.'.join(st.table_identifier)}  snapshot {committed.snapshot_id}  epoch {committed.epoch}")
    print(f"{'partition':>9} {'committed':>12} {'high':>12} {'lag':>10}")
    lag = partition_lag(committed.offsets, marks)
    for partition, (_, high) in sorted(marks.items()):
        print(f"{partition:>9} {committed.offsets.get(partition, '-')!s:>12} {high:>12} {lag[partition]:>10}")
    total = sum(lag.values())
    behind = freshness_seconds(
        total, committed.max_produce_time_ms, time.time(), oldest_waiting_ms=oldest_waiting_ms
    )
    freshness = "unmeasured" if behind is None else f"{behind:.1f}s"
    lost = committed.lost_records
    print(f"lag {total} records, freshness {freshness}, lost to retention {lost} records")
    if lost:
        print(
            f"DATA LOSS: {lost} records were deleted by Kafka retention before they were "
            "ingested (table property icefall.lost-records)"
        )
    ahead = resolve_positions(committed.offsets, marks, st.spec.source.starting_position.type).offsets_ahead
    problem = source_change(st.spec.source.topic, committed.topic_id, topic_id, ahead)
    if problem is not None:
        print(f"INGESTION STOPPED: {problem}")
        return 1
    return 0


def reset_offsets(args: argparse.Namespace) -> int:
    """The explicit user action after the topic was recreated or truncated: commit new offsets, recorded."""
    from icefall.commit import read_committed, reset_offsets
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config
    from icefall.plan.offsets import resolve_positions, source_change

    st = load_table(args)
    catalog = catalog_for(st, state_dir(args)).pyiceberg()
    table = catalog.load_table(st.table_identifier)
    committed = read_committed(table)
    source = st.spec.source
    with TopicView(source.bootstrap_servers, source.topic, librdkafka_config(source.security)) as topic:
        topic_id = topic.topic_id()
        marks = topic.watermarks()
    ahead = resolve_positions(committed.offsets, marks, source.starting_position.type).offsets_ahead
    problem = source_change(source.topic, committed.topic_id, topic_id, ahead)
    if problem is None:
        print(
            f"nothing to reset: {'.'.join(st.table_identifier)} follows topic {source.topic!r} "
            f"(id {topic_id}) and no committed offset is past the topic's end"
        )
        return 1
    reason = "topic-recreated" if committed.topic_id not in (None, topic_id) else "offsets-ahead"
    offsets = {p: (low if args.to == "earliest" else high) for p, (low, high) in marks.items()}
    print(f"[reset] {problem.split(';')[0]}")
    dead_letter = st.dead_letter_identifier
    # The dead-letter table first: left ahead of the main table, its rows past the new offsets would be
    # taken for leftovers of a failed batch and deleted.
    if dead_letter and catalog.table_exists(dead_letter):
        dlq = catalog.load_table(dead_letter)
        if read_committed(dlq).offsets:
            reset_offsets(
                dlq, topic_id=topic_id, offsets=offsets, reason=reason, now_ms=int(time.time() * 1000)
            )
    reset_offsets(table, topic_id=topic_id, offsets=offsets, reason=reason, now_ms=int(time.time() * 1000))
    print(
        f"[reset] {'.'.join(st.table_identifier)} now follows topic id {topic_id} from its {args.to} offsets "
        f"{offsets}; recorded in the table property icefall.offset-resets. Rows already in the table stay."
    )
    return 0
