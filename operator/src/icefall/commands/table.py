"""`icefall status` (offsets, lag and freshness of a table against its topic) and `icefall reset-offsets`
(the explicit, recorded action after the topic was recreated or truncated). A table of several topics
(`spec.source.topics`) is shown per topic and partition, and reset per topic: only the topics that were
recreated or truncated are reset, each recorded on its own.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from icefall.commands.common import catalog_for, load_table, state_dir, unreachable_is_one_line

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from icefall.api import StreamingTable
    from icefall.commit import CommittedState


def _topics_now(st: StreamingTable) -> dict[str, tuple[str, dict[int, tuple[int, int]]]]:
    """Each topic's id and watermarks."""
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config

    source = st.spec.source
    seen: dict[str, tuple[str, dict[int, tuple[int, int]]]] = {}
    with TopicView(source.bootstrap_servers, source.first_topic, librdkafka_config(source.security)) as first:
        for name in source.topic_names:
            view = first if name == source.first_topic else first.sibling(name)
            seen[name] = (view.topic_id(), view.watermarks())
    return seen


def show_status(args: argparse.Namespace) -> int:
    from icefall.commit import read_committed
    from icefall.commit.batch import held_of
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config
    from icefall.plan.lag import freshness_seconds, partition_lag
    from icefall.plan.offsets import resolve_positions, source_change

    st = load_table(args)
    source = st.spec.source
    config = catalog_for(st, state_dir(args))
    oldest: list[int | None] = []  # per topic with records waiting: the oldest one's produce time
    marks: dict[str, Mapping[int, tuple[int, int]]] = {}
    ids: dict[str, str] = {}
    with unreachable_is_one_line(st, config):
        table = config.pyiceberg().load_table(st.table_identifier)
        committed = read_committed(table)
        kafka_config = librdkafka_config(source.security)
        with TopicView(source.bootstrap_servers, source.first_topic, kafka_config) as first:
            for name in source.topic_names:
                topic = first if name == source.first_topic else first.sibling(name)
                marks[name], ids[name] = topic.watermarks(), topic.topic_id()
                offsets = held_of(committed, name).offsets
                if sum(partition_lag(offsets, marks[name]).values()):
                    oldest.append(topic.oldest_waiting_ms(offsets, marks[name]))
    print(f"table {'.'.join(st.table_identifier)}  snapshot {committed.snapshot_id}  epoch {committed.epoch}")
    by_topic = source.by_topic
    print(("topic " if by_topic else "") + f"{'partition':>9} {'committed':>12} {'high':>12} {'lag':>10}")
    total, problems = 0, []
    for name in source.topic_names:
        offsets = held_of(committed, name).offsets
        lag = partition_lag(offsets, marks[name])
        for partition, (_, high) in sorted(marks[name].items()):
            where = f"{name} " if by_topic else ""
            print(
                f"{where}{partition:>9} {offsets.get(partition, '-')!s:>12} {high:>12} {lag[partition]:>10}"
            )
        total += sum(lag.values())
        ahead = resolve_positions(offsets, marks[name], source.starting_position.type).offsets_ahead
        problem = source_change(name, held_of(committed, name).topic_id, ids[name], ahead)
        problems += [problem] if problem is not None else []
    # Freshness from the oldest waiting record of all topics; if a topic with records waiting did not
    # answer, the bound from the newest committed record instead (`plan.lag`).
    waiting_ms = min(oldest) if oldest and None not in oldest else None  # type: ignore[type-var]
    behind = freshness_seconds(
        total, committed.max_produce_time_ms, time.time(), oldest_waiting_ms=waiting_ms
    )
    freshness = "unmeasured" if behind is None else f"{behind:.1f}s"
    lost = committed.lost_records
    print(f"lag {total} records, freshness {freshness}, lost to retention {lost} records")
    if lost:
        print(
            f"DATA LOSS: {lost} records were deleted by Kafka retention before they were "
            "ingested (table property icefall.lost-records)"
        )
    for problem in problems:
        print(f"INGESTION STOPPED: {problem}")
    return 1 if problems else 0


def reset_offsets(args: argparse.Namespace) -> int:
    """The explicit user action after a topic was recreated or truncated: commit new offsets, recorded."""
    from icefall.commit import read_committed
    from icefall.commit.batch import held_of
    from icefall.plan.offsets import resolve_positions, source_change

    st = load_table(args)
    catalog = catalog_for(st, state_dir(args)).pyiceberg()
    table = catalog.load_table(st.table_identifier)
    committed = read_committed(table)
    source = st.spec.source
    reset = 0
    for name, (topic_id, marks) in _topics_now(st).items():
        held = held_of(committed, name)
        ahead = resolve_positions(held.offsets, marks, source.starting_position.type).offsets_ahead
        problem = source_change(name, held.topic_id, topic_id, ahead)
        if problem is None:
            continue
        reason = "topic-recreated" if held.topic_id not in (None, topic_id) else "offsets-ahead"
        offsets = {p: (low if args.to == "earliest" else high) for p, (low, high) in marks.items()}
        print(f"[reset] {problem.split(';')[0]}")
        _reset(st, catalog, table, committed, name, topic_id, offsets, reason)
        print(
            f"[reset] {'.'.join(st.table_identifier)} now follows topic id {topic_id} from its {args.to} "
            f"offsets {offsets}; recorded in the table property icefall.offset-resets. Rows already in the "
            "table stay."
        )
        reset += 1
    if not reset:
        print(
            f"nothing to reset: {'.'.join(st.table_identifier)} follows topic {source.topics_text} "
            f"and no committed offset is past the topic's end"
        )
        return 1
    return 0


def _reset(  # noqa: PLR0917 (one topic's reset, of both tables)
    st: StreamingTable,
    catalog: Catalog,
    table: Table,
    committed: CommittedState,
    name: str,
    topic_id: str,
    offsets: Mapping[int, int],
    reason: str,
) -> None:
    from icefall.commit import read_committed, reset_offsets
    from icefall.commit.batch import held_of

    topic = name if committed.topics is not None else None
    now_ms = int(time.time() * 1000)
    dead_letter = st.dead_letter_identifier
    # The dead-letter table first: left ahead of the main table, its rows past the new offsets would be
    # taken for leftovers of a failed batch and deleted.
    if dead_letter and catalog.table_exists(dead_letter):
        dlq = catalog.load_table(dead_letter)
        if held_of(read_committed(dlq), name).offsets:
            reset_offsets(dlq, topic_id=topic_id, offsets=offsets, reason=reason, now_ms=now_ms, topic=topic)
    reset_offsets(table, topic_id=topic_id, offsets=offsets, reason=reason, now_ms=now_ms, topic=topic)
