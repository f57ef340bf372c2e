"""Fresh reads (`icefall read`): the table at a snapshot plus the topic after it, decoded as ingestion would.

An Iceberg table is as fresh as its last commit, and the records after it are already in Kafka. The table
stores, with each commit, the next offset per partition it holds (`icefall.offsets`), so

    union read = rows of the table at snapshot S  +  the topic from S's offsets up to a cut

is every record of the topic up to the cut exactly once, fresh to the moment the cut is taken:

- **S** is `main`'s head by default (its offsets read from the same metadata as its id), or an older
  snapshot (`snapshot_id`, or `as_of`: the one `main` was at then), whose offsets come from the metadata
  file that had `main` at S (`icefall.commit.state.committed_at`; a table keeps about fifty batches of
  them). The cut is "now" either way: an older snapshot gives the same records, more of them from the tail.
- **The cut** is one set of end offsets taken once, after S was chosen: each partition's high watermark as
  a read_committed consumer sees it (the last stable offset: never inside an open transaction), asked
  partition after partition in one pass. The tail is
  read with exactly those end offsets, so a commit racing the read changes nothing: the result is the
  topic up to the cut, whatever landed in the table meanwhile. The cut is reported (`Cut`).
- **The tail** is read by Spark's Kafka source as ingestion reads it (`icefall.ingest.engine.read_kafka`:
  read_committed, the spec's source properties) from where ingestion would go on (`icefall.plan.offsets.
  resolve_positions`: committed offsets, new partitions from their first record, the spec's starting
  position before the first commit), decoded with the spec's format, schema and transforms
  (`icefall.decode.decode`). Bad records are left out and counted, as ingestion sends them to the
  dead-letter path; records the filter drops are left out.
- **Routed tables** (`spec.routes`, `spec.dynamicRoute`): `table` chooses a destination (`spec.table` by
  default; a dynamic route's table is one the catalog holds with its owner property), read from its own
  committed offsets; the tail keeps the records the writer routes there (`icefall.ingest.routes.
  Routing.routed`, the writer's own code): a route's, a dynamic table's (the records computing its name),
  or for `spec.table` those no route takes and that compute no name (none with `unrouted: DeadLetter`).
  The others are counted (`Cut.routed_elsewhere`). A dynamic table created but never committed is read
  from `spec.table`'s offsets, where its first batch starts.
- **Keyed tables** (`spec.mode` upsert, cdc): the tail's last change per key (`last_changes`, the rule
  ingestion's MERGE applies) replaces the table's row for that key, or deletes it.

- **Several topics** (`spec.source.topics`, `topicPattern`): each topic the source reads now (a pattern's
  from Kafka's list) has its tail from what the table holds of it (a topic it never read: from its first
  record once the table holds offsets, as ingestion); the cut is per topic and partition (`Cut.topics`).

Refused (`ReadError`): a topic other than the one the table was filled from, a topic deleted and created
again or truncated below the committed offsets (`source_change`: the offsets no longer point into it), an
unknown snapshot, or one whose offsets the table no longer keeps.

Not guaranteed: records deleted by Kafka retention after S's commit and before the read are in neither part
(counted as `Cut.lost_records`); a spec changed since the table was written decodes the tail differently
from the rows; keys changed in several partitions have no order between partitions (as in ingestion).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from icefall.commit.state import CommittedState, committed_at, read_committed
from icefall.decode.schemas import decoding_spec, schema_at

if TYPE_CHECKING:
    import pyarrow as pa
    from duckdb import DuckDBPyConnection, DuckDBPyRelation
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame, SparkSession

    from icefall.api import KafkaSource, StreamingTable
    from icefall.api.source import StartingPositionType
    from icefall.catalog import CatalogConfig
    from icefall.ingest.routes import Routing
    from icefall.kafka.admin import TopicView
    from icefall.plan.offsets import OffsetRange


class ReadError(RuntimeError):
    """The union read cannot be made exactly (says why and what to do)."""


@dataclass(frozen=True)
class Cut:
    """Where a union read stands: the table's snapshot and the topic's offsets it was read up to."""

    table: str
    topic: str
    snapshot_id: int | None  # the table's part: its rows at this snapshot (None: no snapshot yet)
    snapshot_ms: int | None  # when that snapshot was committed
    taken_at_ms: int  # when the end offsets were taken
    unit: str = "snapshot"  # what `snapshot_id` numbers: an Iceberg snapshot, a Delta table's "version"
    # partition -> (first offset of the tail, the cut: next offset not read); every partition of the topic
    partitions: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    # A table of several topics: `partitions` of each topic it reads (`partitions` is then empty)
    topics: Mapping[str, Mapping[int, tuple[int, int]]] = field(default_factory=dict)
    tail_records: int = 0  # records read from the tail
    tail_rows: int = (
        0  # good rows they decode to (a keyed table's changes, deletes too, before the last per key)
    )
    bad_records: int = 0  # records left out as dead letters
    routed_elsewhere: int = 0  # a routed table: good records another destination takes, left out
    lost_records: int = 0  # offsets past the snapshot's that retention deleted before this read

    @property
    def offsets(self) -> dict[int, int]:
        """The cut: per partition, the next offset not in the result."""
        return {p: end for p, (_, end) in self.partitions.items()}

    @property
    def filtered_records(self) -> int:
        """Tail records the spec's filter dropped."""
        return self.tail_records - self.tail_rows - self.bad_records - self.routed_elsewhere

    def render(self) -> list[str]:
        """A few lines for people (what `icefall read` prints to stderr)."""
        at = f"{self.unit} {self.snapshot_id}" if self.snapshot_id is not None else f"no {self.unit} yet"
        if self.snapshot_ms is not None:
            at += f" (committed {_iso(self.snapshot_ms)})"
        ranges = ", ".join(f"{p}: {start}..{end}" for p, (start, end) in sorted(self.partitions.items()))
        ranges += ", ".join(
            f"{t}/{p}: {start}..{end}"
            for t, parts in sorted(self.topics.items())
            for p, (start, end) in sorted(parts.items())
        )
        where = "partition" if not self.topics else "topic/partition"
        lines = [
            f"[read] {self.table} at {at} + topic {self.topic} up to the cut taken {_iso(self.taken_at_ms)}",
            f"[read] cut, per {where} tail from..to: {ranges or 'no partitions'}",
            f"[read] tail: {self.tail_records} records, {self.tail_rows} rows, {self.bad_records} bad "
            f"records left out, {self.filtered_records} filtered out"
            + (f", {self.routed_elsewhere} routed to other destinations" if self.routed_elsewhere else ""),
        ]
        if self.lost_records:
            lines.append(
                f"[read] DATA LOSS: {self.lost_records} records past the snapshot were deleted by retention "
                "before they were read: in neither part"
            )
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "topic": self.topic,
            "snapshot_id": self.snapshot_id,
            "snapshot_ms": self.snapshot_ms,
            "taken_at_ms": self.taken_at_ms,
            "partitions": {str(p): [s, e] for p, (s, e) in sorted(self.partitions.items())},
            **(
                {
                    "topics": {
                        t: {str(p): [s, e] for p, (s, e) in sorted(parts.items())}
                        for t, parts in sorted(self.topics.items())
                    }
                }
                if self.topics
                else {}
            ),
            "tail_records": self.tail_records,
            "tail_rows": self.tail_rows,
            "bad_records": self.bad_records,
            "routed_elsewhere": self.routed_elsewhere,
            "lost_records": self.lost_records,
        }


@dataclass
class UnionRead:
    """The result of `union_read`: a Spark DataFrame of the table's columns and the cut it was read at.

    The tail is cached in Spark until `close` (or the end of a `with` block); the frame is deterministic
    anyway (a fixed snapshot, fixed offsets), so reading it again gives the same rows.
    """

    frame: DataFrame
    cut: Cut
    _cached: list[DataFrame] = field(default_factory=list, repr=False)

    def to_spark(self) -> DataFrame:
        return self.frame

    def to_arrow(self) -> pa.Table:
        return self.frame.toArrow()

    def to_duckdb(self, con: DuckDBPyConnection | None = None) -> DuckDBPyRelation:
        """The rows as a DuckDB relation (on `con`, else a new in-memory connection)."""
        import duckdb

        connection = con if con is not None else duckdb.connect()
        return connection.from_arrow(self.to_arrow())

    def close(self) -> None:
        for frame in self._cached:
            frame.unpersist()
        self._cached.clear()

    def __enter__(self) -> UnionRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def union_read(
    st: StreamingTable,
    catalog_config: CatalogConfig,
    *,
    snapshot_id: int | None = None,
    as_of: datetime | None = None,
    spark: SparkSession | None = None,
    timeout: float = 30,
    table_name: str | None = None,
) -> UnionRead:
    """The table of `st` at a snapshot plus its topic up to a cut taken now (module docstring).

    `snapshot_id` or `as_of` (a time; naive means UTC) choose an older snapshot than `main`'s head.
    `spark`: a session with `catalog_config`'s catalog; by default a local one is started. `table_name`
    (`namespace.name`): a routed table's destination to read (`read_identifier`); default `spec.table`.
    """
    if snapshot_id is not None and as_of is not None:
        raise ValueError("give snapshot_id or as_of, not both")
    catalog = catalog_config.pyiceberg()
    dynamic = _dynamic_tables(st, catalog, table_name)
    identifier = read_identifier(st, table_name, dynamic)
    label = ".".join(identifier)
    table = catalog.load_table(identifier)
    if spark is None:  # before the snapshot and the cut are taken: a Spark start takes seconds
        spark = _local_spark(st, catalog_config)
    state = _state(table, label, snapshot_id, as_of)
    older = snapshot_id is not None or as_of is not None
    route: int | str | None = identifier[-1] if identifier in dynamic else None
    if route is not None and not older and not state.by_topic():
        # Created, never committed: its first batch is planned from spec.table's offsets.
        state = replace(read_committed(catalog.load_table(st.table_identifier)), snapshot_id=None)
    snapshot = table.metadata.snapshot_by_id(state.snapshot_id) if state.snapshot_id is not None else None
    cut = Cut(
        table=label,
        topic=st.spec.source.first_topic,
        snapshot_id=state.snapshot_id,
        snapshot_ms=snapshot.timestamp_ms if snapshot is not None else None,
        taken_at_ms=0,
    )
    ranges, cut = tail_of(st, state, cut, older=older, timeout=timeout)
    rows = _table_rows(spark, identifier, catalog_config.name, state.snapshot_id)
    if st.spec.routes and route is None:
        route = st.route_of(label)
    return with_tail(spark, st, rows, ranges, cut, schema_at(table, state.snapshot_id), route=route)


def tail_of(
    st: StreamingTable, state: CommittedState, cut: Cut, *, older: bool, timeout: float
) -> tuple[tuple[OffsetRange, ...], Cut]:
    """The tail after `state` (the table's committed offsets) up to a cut taken now, once: its ranges and
    `cut` with the offsets it was read up to."""
    if st.spec.source.by_topic:
        return _topics_tail(st, state, cut, older=older, timeout=timeout)
    _check_topic(state, st.spec.source, cut.table)
    topic = _TopicNow.read(st.spec.source, state, timeout)
    ranges, lost = _tail_ranges(st, state, topic, label=cut.table, older=older)
    partitions = {r.partition: (r.start, r.end) for r in ranges}
    return ranges, replace(cut, taken_at_ms=topic.taken_at_ms, partitions=partitions, lost_records=lost)


def read_identifier(
    st: StreamingTable, table_name: str | None, dynamic: Sequence[tuple[str, ...]] = ()
) -> tuple[str, ...]:
    """The identifier of the table `table_name` names (`namespace.name`: `spec.table`, a route's, or one
    of `dynamic`: the tables the dynamic route created), `spec.table`'s by default; ReadError naming the
    choices for any other."""
    if table_name is None:
        return st.table_identifier
    for identifier in dynamic:
        if ".".join(identifier) == table_name:
            return identifier
    try:
        route = st.route_of(table_name)
    except ValueError as error:
        more = "".join(f", {'.'.join(identifier)}" for identifier in dynamic)
        raise ReadError(f"--table {error}{more}") from None
    return st.table_identifier if route is None else st.route_identifiers[route]


def _dynamic_tables(st: StreamingTable, catalog: Catalog, table_name: str | None) -> list[tuple[str, ...]]:
    """The tables the dynamic route created (`icefall.catalog.tables.dynamic_route_identifiers`, as the
    writer finds them), when `table_name` names none of the spec's own tables."""
    static = {".".join(identifier) for identifier in st.destination_identifiers}
    if st.spec.dynamic_route is None or table_name is None or table_name in static:
        return []
    from icefall.catalog.tables import dynamic_route_identifiers

    return dynamic_route_identifiers(catalog, st)


def _local_spark(st: StreamingTable, catalog_config: CatalogConfig) -> SparkSession:
    from icefall.plan.spark_conf import tool_conf
    from icefall.spark.session import build_spark_session

    return build_spark_session([catalog_config], extra_conf=tool_conf(st.metadata.name, "read"))


def _check_topic(state: CommittedState, source: KafkaSource, label: str) -> None:
    """ReadError if the table was filled from another topic than the manifest's."""
    if state.topic is not None and state.topic != source.topic:
        raise ReadError(
            f"{label} was filled from topic {state.topic!r}, the manifest names {source.topic!r}: "
            "its offsets say nothing about that topic"
        )


@dataclass(frozen=True)
class _TopicNow:
    """The topic at the cut: its id, its watermarks, when they were read, and (for a table that has never
    committed and starts at a time) the offsets that time starts at."""

    topic_id: str
    marks: Mapping[int, tuple[int, int]]
    taken_at_ms: int
    starts_at: Mapping[int, int] | None

    @classmethod
    def read(cls, source: KafkaSource, state: CommittedState, timeout: float) -> _TopicNow:
        from icefall.kafka.admin import TopicView
        from icefall.kafka.security import librdkafka_config

        with TopicView(
            source.bootstrap_servers, source.first_topic, librdkafka_config(source.security)
        ) as view:
            return cls.of(view, source, fresh=not state.offsets, timeout=timeout)

    @classmethod
    def of(cls, view: TopicView, source: KafkaSource, *, fresh: bool, timeout: float) -> _TopicNow:
        """`view`'s topic now; `fresh`: the table has no offsets yet (a starting time is looked up)."""
        topic_id = view.topic_id(timeout=timeout)
        marks = view.watermarks(timeout=timeout)
        taken_at_ms = int(time.time() * 1000)
        timestamp = source.starting_position.timestamp_ms
        starts_at = view.offsets_for_time(timestamp, timeout) if timestamp is not None and fresh else None
        return cls(topic_id, marks, taken_at_ms, starts_at)


def _topics_tail(
    st: StreamingTable, state: CommittedState, cut: Cut, *, older: bool, timeout: float
) -> tuple[tuple[OffsetRange, ...], Cut]:
    """A table of several topics: the tail of each topic the source reads now (a pattern's: Kafka's list),
    from what the table holds of it, as ingestion goes on (a topic new to a table that holds offsets: from
    its first record); the ranges (each naming its topic) and the cut. ReadError: a topic the table holds
    that the source does not read."""
    from icefall.api.source import StartingPositionType
    from icefall.commit.batch import held_of
    from icefall.kafka.admin import TopicView
    from icefall.kafka.security import librdkafka_config

    source = st.spec.source
    held = state.by_topic()
    strays = [t for t in held if not source.reads(t)]
    if strays:
        raise ReadError(
            f"{cut.table} holds topics {strays} the manifest does not read ({source.topics_text}): its "
            "offsets say nothing about them; read with the spec the table is filled with"
        )
    fresh = not held
    starting = source.starting_position.type if fresh else StartingPositionType.EARLIEST
    ranges: list[OffsetRange] = []
    topics: dict[str, dict[int, tuple[int, int]]] = {}
    lost, taken_at_ms = 0, 0
    with TopicView(source.bootstrap_servers, source.first_topic, librdkafka_config(source.security)) as first:
        names = (
            source.select_topics(first.listed_topics(timeout)) if source.topic_pattern else source.topic_names
        )
        for name in names:
            now = _TopicNow.of(first.sibling(name), source, fresh=fresh, timeout=timeout)
            of = held_of(state, name)
            one = CommittedState(
                state.snapshot_id, name, of.topic_id, of.offsets, start_offsets=of.start_offsets
            )
            found, gone = _tail_ranges(
                st, one, now, label=cut.table, older=older, topic=name, starting=starting
            )
            ranges += [replace(r, topic=name) for r in found]
            topics[name] = {r.partition: (r.start, r.end) for r in found}
            lost, taken_at_ms = lost + gone, max(taken_at_ms, now.taken_at_ms)
    text = ", ".join(names) if names else source.topics_text
    return tuple(ranges), replace(cut, topic=text, topics=topics, taken_at_ms=taken_at_ms, lost_records=lost)


def _state(table: Table, label: str, snapshot_id: int | None, as_of: datetime | None) -> CommittedState:
    """The committed state of the snapshot the read starts from."""
    if snapshot_id is None and as_of is None:
        return read_committed(table)
    table.refresh()
    if as_of is not None:
        moment = as_of if as_of.tzinfo is not None else as_of.replace(tzinfo=UTC)
        found = table.snapshot_as_of_timestamp(int(moment.timestamp() * 1000))
        if found is None:
            raise ReadError(f"{label} had no snapshot on main at {moment.isoformat()}")
        snapshot_id = found.snapshot_id
    assert snapshot_id is not None
    if table.metadata.snapshot_by_id(snapshot_id) is None:
        raise ReadError(f"{label} has no snapshot {snapshot_id} (never was one, or expired)")
    state = committed_at(table, snapshot_id)
    if state is None:
        raise ReadError(
            f"{label}: no metadata file the table still keeps shows main at snapshot {snapshot_id} (a "
            "snapshot of another branch, or one older than write.metadata.previous-versions-max commits), "
            "so its committed offsets are unknown; read a newer snapshot"
        )
    return state


def _tail_ranges(
    st: StreamingTable,
    state: CommittedState,
    now: _TopicNow,
    *,
    label: str,
    older: bool,
    topic: str | None = None,
    starting: StartingPositionType | None = None,
) -> tuple[tuple[OffsetRange, ...], int]:
    """Per partition of the topic (`topic`, default the source's one) as it is `now`, the tail `[where
    ingestion goes on, the cut)` (`starting`: where a partition the table never read starts; default the
    spec's), and the records lost to retention in between."""
    from icefall.plan.offsets import OffsetRange, resolve_positions, source_change

    topic_id, marks, starts_at = now.topic_id, now.marks, now.starts_at

    source = st.spec.source
    topic = topic or source.first_topic
    starting = starting or source.starting_position.type
    positions = resolve_positions(state.offsets, marks, starting, timestamp_offsets=starts_at)
    problem = source_change(topic, state.topic_id, topic_id, positions.offsets_ahead)
    if problem is not None and older and state.topic_id not in (None, topic_id):
        raise ReadError(
            f"{label}: snapshot {state.snapshot_id} holds records of topic {topic!r} before it was "
            f"deleted and created again (topic id {state.topic_id}, now {topic_id}): its offsets do not "
            "point into the topic there is now; read a snapshot committed after the offset reset"
        )
    if problem is not None:
        raise ReadError(f"{label}: {problem}")
    ranges = tuple(
        OffsetRange(p, positions.starts[p], max(positions.starts[p], high))
        for p, (_, high) in sorted(marks.items())
    )
    return ranges, sum(loss.lost for loss in positions.data_loss)


def _table_rows(
    spark: SparkSession, identifier: tuple[str, ...], catalog_name: str, snapshot_id: int | None
) -> DataFrame:
    name = ".".join(f"`{part}`" for part in (catalog_name, *identifier))
    if snapshot_id is None:
        return spark.table(name)  # no snapshot: no rows, the table's columns
    return spark.sql(f"SELECT * FROM {name} VERSION AS OF {int(snapshot_id)}")


def with_tail(  # noqa: PLR0917 (the parts of one read)
    spark: SparkSession,
    st: StreamingTable,
    rows: DataFrame,
    ranges: tuple[OffsetRange, ...],
    cut: Cut,
    schema: Schema | None,
    *,
    route: int | str | None = None,
    add_columns: Callable[[DataFrame], DataFrame] | None = None,
) -> UnionRead:
    """`rows` (the table at the snapshot, whose Iceberg schema is `schema`; None: a Delta table's, decoded
    with the spec as its writer does, with `add_columns` as it adds them) with the decoded tail applied,
    and the cut with its counts. The tail decodes as ingestion would write it now: into the table's columns (a
    column the spec no longer has is null); a routed table's, only the records its destination (`route`:
    an index of `spec.routes`, a dynamic table's name, None for `spec.table`) takes."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    from icefall.decode.decode import BAD_COLUMN, DELETE_COLUMN, Decoder, last_changes, with_every_column
    from icefall.ingest.engine import read_kafka
    from icefall.kafka.security import spark_kafka_options

    reading = tuple(r for r in ranges if r.records)
    if not reading:
        return UnionRead(frame=rows, cut=cut)
    decoder = Decoder(decoding_spec(st.spec, schema) if schema is not None else st.spec, errors=False)
    routing = _routing(st)
    headers = routing is not None and routing.headers
    kafka = read_kafka(spark, st.spec, reading, spark_kafka_options(st.spec.source.security), headers=headers)
    decoded = decoder.decode(kafka)
    mine = F.lit(True)
    if routing is not None:
        decoded, mine = routing.routed(decoded), _taken_by(st, route)
    decoded = decoded.persist()
    elsewhere = F.sum((~F.col(BAD_COLUMN) & ~mine).cast("long"))
    counts = decoded.agg(
        F.count(F.lit(1)).alias("records"),
        F.sum(F.col(BAD_COLUMN).cast("long")).alias("bad"),
        elsewhere.alias("elsewhere"),
    ).first()
    assert counts is not None
    key, bad, cached = list(st.spec.key or []), int(counts["bad"] or 0), [decoded]
    if routing is not None and isinstance(route, int) and route in routing.own:
        # A route with its own schema and key: its records decoded with them, as its writer does.
        own = routing.own.specs[route]
        key, decoder = list(own.key or []), Decoder(own, errors=False)
        decoded = decoder.decode(decoded.where(mine)).persist()
        cached.append(decoded)
        bad += decoded.where(F.col(BAD_COLUMN)).count()
        mine = F.lit(True)
    good = with_every_column(decoder.good_rows(decoded.where(mine)), schema)
    good = add_columns(good) if add_columns is not None else good
    missing = [c for c in rows.columns if c not in good.columns]
    if missing:
        raise ReadError(
            f"{cut.table}: the spec's rows lack the table's columns {missing}: the spec changed since the "
            "table was made; read with the spec the table is filled with"
        )
    extra = [DELETE_COLUMN] if key else []
    # The table's columns are the good rows' (ingestion wrote them): the union widens only nullability.
    tail = good.select(*[F.col(f"`{c}`") for c in rows.columns], *extra)
    if key:
        changes = last_changes(tail, key)
        kept = rows.join(changes.select(*key), key, "left_anti")
        frame = kept.unionByName(changes.where(~F.col(DELETE_COLUMN)).drop(DELETE_COLUMN))
    else:
        frame = rows.unionByName(tail)
    tail_rows = tail.count()
    counted = replace(
        cut,
        tail_records=int(counts["records"]),
        tail_rows=tail_rows,
        bad_records=bad,
        routed_elsewhere=int(counts["elsewhere"] or 0),
    )
    return UnionRead(
        frame=frame.select(*[F.col(f"`{c}`") for c in rows.columns]), cut=counted, _cached=cached
    )


def _routing(st: StreamingTable) -> Routing | None:
    """The writer's routing of a routed table (`spec.routes`, `spec.dynamicRoute`), else None."""
    if not st.spec.routed:
        return None
    from icefall.ingest.routes import Routing

    def no_branch(identifier: tuple[str, ...], branch: str) -> str:
        raise AssertionError(f"a read stages nothing ({'.'.join(identifier)} branch {branch})")

    return Routing(st, no_branch)


def _taken_by(st: StreamingTable, route: int | str | None) -> Column:
    """Whether a routed record (`Routing.routed`) goes to `route` (a route's index, a dynamic table's name;
    None: spec.table) as a good row."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    from icefall.api import Unrouted
    from icefall.ingest.routes import EVERY, NAME_COLUMN, ROUTE_COLUMN

    if isinstance(route, str):  # the table exists with the owner property: the writer takes its name there
        return F.col(ROUTE_COLUMN).isNull() & F.coalesce(F.col(NAME_COLUMN) == F.lit(route), F.lit(False))
    every = F.coalesce(F.col(ROUTE_COLUMN) == F.lit(EVERY), F.lit(False))  # a keyed delete no route takes
    if route is not None:
        return F.coalesce(F.col(ROUTE_COLUMN) == F.lit(route), F.lit(False)) | every
    if st.spec.unrouted_to is Unrouted.DEAD_LETTER:
        return F.lit(False)  # spec.table gets no rows: the records no route takes are dead letters
    unrouted = F.col(ROUTE_COLUMN).isNull() | every
    # A record that computes a name goes to that dynamic table, or is a dead letter: never spec.table.
    return unrouted & F.col(NAME_COLUMN).isNull() if st.spec.dynamic_route is not None else unrouted


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
