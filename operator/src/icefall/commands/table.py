"""`icefall status` (offsets, lag and freshness of a table against its topic, as text or JSON) and
`icefall reset-offsets` (the explicit, recorded action after the topic was recreated or truncated).

A table of several topics (`spec.source.topics`, or those `topicPattern` matches now) is shown per topic and
partition (each partition row names its topic), and reset per topic: only the topics that were recreated or
truncated are reset, each recorded on its own.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from icefall.commands.common import (
    catalog_for,
    delta_location,
    load_table,
    state_dir,
    unreachable_is_one_line,
)

if TYPE_CHECKING:
    from icefall.api import StreamingTable
    from icefall.api.source import KafkaSource
    from icefall.commands.reset_request import ResetTarget
    from icefall.commit.state import OffsetReset
    from icefall.kafka.admin import TopicView


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


def _topics_now(st: StreamingTable) -> dict[str, tuple[str, dict[int, tuple[int, int]]]]:
    """Each topic's id and watermarks."""
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config

    source = st.spec.source
    seen: dict[str, tuple[str, dict[int, tuple[int, int]]]] = {}
    with TopicView(source.bootstrap_servers, source.first_topic, librdkafka_config(source.security)) as first:
        for name in _names(source, first):
            view = first if name == source.first_topic else first.sibling(name)
            seen[name] = (view.topic_id(), view.watermarks())
    return seen


def _names(source: KafkaSource, first: TopicView) -> tuple[str, ...]:
    """The topics `source` reads now: those named, or those its pattern selects of Kafka's list."""
    return (
        source.select_topics(first.listed_topics())
        if source.topic_pattern is not None
        else source.topic_names
    )


def table_status(args: argparse.Namespace) -> dict[str, Any]:
    """What `icefall status` prints, as a JSON-ready mapping (camelCase keys, as in the StreamingTable's
    status): table, tables (each table it writes, spec.table first then each route's, then each one its
    dynamic route made: table,
    snapshotId, lagRecords from its own committed offsets, freshnessSeconds; `missing` for one not created
    yet), snapshotId, epoch, partitions (partition, committed, high, lag; and topic, in a table of several
    topics), lagRecords, freshnessSeconds (null: unmeasured), lostRecords and problem (null, or why
    ingestion stopped)."""
    from icefall.catalog.tables import dynamic_route_identifiers
    from icefall.commit import read_committed
    from icefall.commit.batch import held_of
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config
    from icefall.plan.lag import freshness_seconds, partition_lag
    from icefall.plan.offsets import resolve_positions, source_change

    st = load_table(args)
    source = st.spec.source
    config = catalog_for(st, state_dir(args))
    marks: dict[str, Mapping[int, tuple[int, int]]] = {}
    ids: dict[str, str] = {}
    oldest: list[int | None] = []  # per topic with records waiting: the oldest one's produce time
    with unreachable_is_one_line(st, config):
        catalog = config.pyiceberg()
        table = catalog.load_table(st.table_identifier)
        committed = read_committed(table)
        kafka_config = librdkafka_config(source.security)
        with TopicView(source.bootstrap_servers, source.first_topic, kafka_config) as first:
            names = _names(source, first)
            for name in names:
                topic = first if name == source.first_topic else first.sibling(name)
                marks[name], ids[name] = topic.watermarks(), topic.topic_id()
                offsets = held_of(committed, name).offsets
                if sum(partition_lag(offsets, marks[name]).values()):
                    oldest.append(topic.oldest_waiting_ms(offsets, marks[name]))
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for name in names:
        held = held_of(committed, name)
        lag = partition_lag(held.offsets, marks[name])
        rows += [
            {**({"topic": name} if source.by_topic else {}), "partition": p,
             "committed": held.offsets.get(p), "high": high, "lag": lag[p]}
            for p, (_, high) in sorted(marks[name].items())
        ]  # fmt: skip
        ahead = resolve_positions(held.offsets, marks[name], source.starting_position.type).offsets_ahead
        problem = source_change(name, held.topic_id, ids[name], ahead)
        problems += [problem] if problem is not None else []
    total = sum(row["lag"] for row in rows)
    # Freshness from the oldest waiting record of all topics; if a topic with records waiting did not
    # answer, the bound from the newest committed record instead (`plan.lag`).
    waiting_ms = min(o for o in oldest if o is not None) if oldest and None not in oldest else None
    behind = freshness_seconds(
        total, committed.max_produce_time_ms, time.time(), oldest_waiting_ms=waiting_ms
    )
    with unreachable_is_one_line(st, config):
        made = dynamic_route_identifiers(catalog, st)  # the tables spec.dynamicRoute made (owner property)
        routes = [_destination(catalog, i, names, marks) for i in (*st.route_identifiers, *made)]
    main = {"table": ".".join(st.table_identifier), "snapshotId": committed.snapshot_id, "lagRecords": total,
            "freshnessSeconds": None if behind is None else round(behind, 1)}  # fmt: skip
    return {
        "table": ".".join(st.table_identifier),
        "tables": [main, *routes],
        "snapshotId": committed.snapshot_id,
        "epoch": committed.epoch,
        "partitions": rows,
        "lagRecords": total,
        "freshnessSeconds": None if behind is None else round(behind, 1),
        "lostRecords": committed.lost_records,
        "problem": "; ".join(problems) or None,
    }


def _destination(
    catalog: Any, identifier: tuple[str, ...], topics: tuple[str, ...], marks: Mapping[str, Any]
) -> dict[str, Any]:
    """A route table's line of `icefall status`: its snapshot, its lag from its own committed offsets
    against the topics' ends, and its freshness bound from its newest record (`plan.lag`); a table not
    created yet says so (`missing`)."""
    from icefall.commit import read_committed
    from icefall.commit.batch import held_of
    from icefall.plan.lag import freshness_seconds, partition_lag

    name = ".".join(identifier)
    if not catalog.table_exists(identifier):
        return {
            "table": name,
            "missing": True,
            "snapshotId": None,
            "lagRecords": None,
            "freshnessSeconds": None,
        }
    committed = read_committed(catalog.load_table(identifier))
    lag = sum(sum(partition_lag(held_of(committed, t).offsets, marks[t]).values()) for t in topics)
    behind = freshness_seconds(lag, committed.max_produce_time_ms, time.time())
    return {"table": name, "snapshotId": committed.snapshot_id, "lagRecords": lag,
            "freshnessSeconds": None if behind is None else round(behind, 1)}  # fmt: skip


def _render_status(report: dict[str, Any]) -> str:
    lines = [f"table {report['table']}  snapshot {report['snapshotId']}  epoch {report['epoch']}"]
    by_topic = any("topic" in row for row in report["partitions"])
    lines.append(
        ("topic " if by_topic else "") + f"{'partition':>9} {'committed':>12} {'high':>12} {'lag':>10}"
    )
    for row in report["partitions"]:
        committed = "-" if row["committed"] is None else row["committed"]
        where = f"{row['topic']} " if by_topic else ""
        lines.append(f"{where}{row['partition']:>9} {committed!s:>12} {row['high']:>12} {row['lag']:>10}")
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
    if len(report.get("tables", ())) > 1:  # a routed table: each destination from its own offsets
        lines.append(f"{'table':<40} {'snapshot':>20} {'lag':>10} {'freshness':>10}")
        for row in report["tables"]:
            fresh = "-" if row["freshnessSeconds"] is None else f"{row['freshnessSeconds']:.1f}s"
            lag = "missing" if row.get("missing") else row["lagRecords"]
            lines.append(f"{row['table']:<40} {row['snapshotId']!s:>20} {lag!s:>10} {fresh:>10}")
    if report["problem"] is not None:
        lines.append(f"INGESTION STOPPED: {report['problem']}")
    return "\n".join(lines)


def reset_offsets(args: argparse.Namespace) -> int:
    """The explicit user action after the topic was recreated or truncated: commit new offsets, recorded.
    (A table in a cluster: `commands.reset_request.request_reset`.)"""
    if not args.file:
        raise SystemExit("give -f <manifest>, or --namespace and --name of a StreamingTable in a cluster")
    st = load_table(args)
    if st.spec.table.format.value == "delta":  # at its location, without a catalog
        done, message = reset_delta_table(st, delta_location(st, state_dir(args)), args.to)
    else:
        done, message = reset_table(st, catalog_for(st, state_dir(args)).pyiceberg(), args.to)
    print(message)
    return 0 if done else 1


def reset_table(st: Any, catalog: Any, to: str, *, request: str | None = None) -> tuple[bool, str]:
    """Reset the committed offsets of `st`'s Iceberg table (and first its route and dead-letter tables) to
    the topic's `to` (earliest | latest) offsets, if the topic was recreated or truncated below them
    (`reset_topics`). Whether it reset, and what to say. `request`: the cluster request's id, recorded with
    the reset (a request recorded already is not applied again: `commit.reset_offsets`)."""
    from icefall.commit import read_committed

    table = catalog.load_table(st.table_identifier)
    return reset_topics(
        st, read_committed(table), to, lambda asked: _reset_both(st, catalog, table, asked), request=request
    )


def iceberg_target(st: StreamingTable, catalog: Any) -> ResetTarget:
    """The Iceberg table of `st` as the target of a cluster's reset request (`commands.reset_request`)."""
    from icefall.commands.reset_request import ResetTarget

    def properties() -> Mapping[str, str] | None:
        exists = catalog.table_exists(st.table_identifier)
        return catalog.load_table(st.table_identifier).properties if exists else None

    return ResetTarget(properties, lambda to, request: reset_table(st, catalog, to, request=request))


def reset_topics(
    st: Any, committed: Any, to: str, reset: Callable[[OffsetReset], None], *, request: str | None = None
) -> tuple[bool, str]:
    """`reset(asked)` for each topic of `st` that was recreated or truncated below the `committed` offsets,
    to its `to` (earliest | latest) offsets; in a table of several topics, each topic that was. Whether
    any was reset, and what to say. Both formats' `reset-offsets` (`reset_table`, `reset_delta_table`)."""
    from icefall.commit.batch import held_of
    from icefall.commit.state import OffsetReset
    from icefall.plan.offsets import resolve_positions, source_change

    source = st.spec.source
    name = ".".join(st.table_identifier)
    said: list[str] = []
    for topic, (topic_id, marks) in _topics_now(st).items():
        held = held_of(committed, topic)
        ahead = resolve_positions(held.offsets, marks, source.starting_position.type).offsets_ahead
        problem = source_change(topic, held.topic_id, topic_id, ahead)
        if problem is None:
            continue
        reason = "topic-recreated" if held.topic_id not in (None, topic_id) else "offsets-ahead"
        offsets = {p: (low if to == "earliest" else high) for p, (low, high) in marks.items()}
        of_topic = topic if committed.topics is not None else None
        reset(OffsetReset(topic_id, offsets, reason, int(time.time() * 1000), of_topic, request))
        said.append(
            f"[reset] {problem.split(';')[0]}\n"
            f"[reset] {name} now follows topic id {topic_id} from its {to} offsets {offsets}; recorded in "
            "the table property icefall.offset-resets. Rows already in the table stay."
        )
    if not said:
        ids = ", ".join(f"{t!r} (id {topic_id})" for t, (topic_id, _) in _topics_now(st).items())
        return (
            False,
            f"nothing to reset: {name} follows topic {ids} and no committed offset is past the topic's end",
        )
    return True, "\n".join(said)


def _reset_both(st: Any, catalog: Any, table: Any, asked: OffsetReset) -> None:
    """Reset `asked.topic` (None: the table's one topic) in the route tables (`spec.routes`, and the tables
    `spec.dynamicRoute` made) and the dead-letter table first, then in the table: the others are never left
    behind the table (a route table behind it stops the writer), nor ahead of it (a destination ahead skips
    the records below its offsets: the new topic's dead letters there would be lost). A request already
    recorded in a table is not applied to it again, so a reset stopped half-way is finished by running it
    again."""
    from icefall.catalog.tables import dynamic_route_identifiers
    from icefall.commit import read_committed, reset_offsets
    from icefall.commit.batch import held_of

    def apply(target: Any) -> None:
        reset_offsets(
            target, topic_id=asked.topic_id, offsets=asked.offsets, reason=asked.reason, now_ms=asked.now_ms,
            request=asked.request, topic=asked.topic,
        )  # fmt: skip

    dead_letter = st.dead_letter_identifier
    dynamic = dynamic_route_identifiers(catalog, st)
    for other in [*st.route_identifiers, *dynamic, *([dead_letter] if dead_letter else [])]:
        if catalog.table_exists(other):
            loaded = catalog.load_table(other)
            if held_of(read_committed(loaded), asked.topic or "").offsets:
                apply(loaded)
    apply(table)


def delta_target(st: Any, location: str) -> Any:
    """The Delta table at `location` as the target of a cluster's reset request (`commands.reset_request`)."""
    from icefall.commands.reset_request import ResetTarget
    from icefall.commit.delta import DeltaLog

    def properties() -> Any:
        snapshot = DeltaLog(location).snapshot()
        return snapshot.configuration if snapshot.exists else None

    return ResetTarget(properties, lambda to, request: reset_delta_table(st, location, to, request=request))


def reset_delta_table(st: Any, location: str, to: str, *, request: str | None = None) -> tuple[bool, str]:
    """`icefall reset-offsets` of the Delta table at `location`: each topic recreated or truncated below its
    committed offsets (`reset_topics`) is reset in the dead-letter table first (if it holds
    offsets of it: it is never left behind the table), then in the table, each by one metadata-only version
    (`commit.delta.reset_offsets`). Whether it reset, and what to say."""
    from icefall.commit.batch import held_of
    from icefall.commit.delta import DeltaLog, reset_offsets
    from icefall.ingest.delta_dead_letters import dead_letter_location

    log = DeltaLog(location)
    snapshot = log.snapshot()
    if not snapshot.exists:
        return False, f"nothing to reset: there is no Delta table at {location} yet"
    dead = dead_letter_location(st, location)

    def reset(asked: Any) -> None:
        if dead is not None:
            dead_log = DeltaLog(dead)
            if held_of(dead_log.snapshot().committed, asked.topic or "").offsets:
                reset_offsets(dead_log, asked)
        reset_offsets(log, asked)

    return reset_topics(st, snapshot.committed, to, reset, request=request)
