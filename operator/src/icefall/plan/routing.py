"""What each destination of a routed batch takes (`spec.routes`): pure, no I/O.

A routed StreamingTable writes several tables from one read of Kafka. Each table's commit records the
offsets it has taken, so the tables may stand at different offsets after a crash between their commits.
The batch is planned from `spec.table`'s offsets (the table committed LAST: every other destination stands
at or past it), and read once; `destination_take` says which part of it one destination takes: from its own
committed offset on, so a table that is ahead skips the records it already holds and never gets one twice.

Guarantees: a take starts each partition exactly at the destination's committed offset (or, for a
partition it has never committed, where the batch starts, with the batch's retention gap), so the commit
protocol's offset check holds; a destination that holds everything the batch reads takes nothing (None)
and is not committed. A destination behind the batch's start (it would lose records) raises
`DestinationBehindError` instead of skipping them, unless it is *sparse*: the dead-letter table is
committed only by batches with bad records, so it is behind after batches that had none, and takes from
its own offset (the records in between held nothing for it).

Several topics (`spec.source.topics`, `topicPattern`): `destination_takes` does the same per topic, against
what the destination holds of each; a topic it has never committed (a topic new to the pattern, a table
created later) takes the batch's range of it.

Dynamic routes (`spec.dynamicRoute`): `dynamic_names` sorts the names a batch computed into the tables to
create (sorted, up to `maxTables`) and those refused with their dead letters' reason (not an identifier, a
table written otherwise, past the cap). A created table is one more destination with no offsets: it takes
the range of the batch that created it, like any destination that never committed.

Driver memory (`driver_collects`): the route tables' rows of a batch are collected to the driver (one Spark
job, `icefall.ingest.arrow_append`) only when the batch's estimated size is at most
`spec.batch.maxCollectBytes`; a larger batch is appended by Spark route table by route table.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icefall.api.base import IDENTIFIER_PATTERN
from icefall.api.routes import DYNAMIC_REASON_PREFIX, QUOTED_CHARS

if TYPE_CHECKING:
    from icefall.api import StreamingTable

#: Longest table name a dynamic route creates (as a route table's `name`).
MAX_NAME_CHARS = 255

#: What `collected_bytes` counts per record besides its Kafka value: its Kafka columns (partition, offset,
#: timestamp, key) and Arrow's offsets and validity bits.
ROW_OVERHEAD_BYTES = 64
#: A decoded value may take more room than its bytes in Kafka (a binary format's integers widen to 8 bytes;
#: a JSON value shrinks), so its bytes count this many times.
VALUE_EXPANSION = 2


class DestinationBehindError(RuntimeError):
    """A destination's committed offsets are below the batch's start: the batch would skip records of it."""


@dataclass(frozen=True)
class Take:
    """One destination's part of a batch: its commit's range per partition, and where its rows start.

    `start`/`end`/`gaps` are what its commit records (`icefall.commit.Batch`); `skip_below[p]` is set where
    the destination is ahead of the batch's start: the rows of partition p below that offset are already in
    its table, and are not written again.
    """

    start: Mapping[int, int]
    end: Mapping[int, int]
    gaps: Mapping[int, int] = field(default_factory=dict)
    skip_below: Mapping[int, int] = field(default_factory=dict)


def destination_take(
    start: Mapping[int, int],
    end: Mapping[int, int],
    gaps: Mapping[int, int],
    held: Mapping[int, int],
    *,
    name: str,
    sparse: bool = False,
) -> Take | None:
    """The part of a batch (`start`, `end`, `gaps`: the commit range of the table planned from) that a
    destination holding offsets `held` takes; None when it already holds all of it.

    Per partition, with `from_` the offset the batch was planned from (its retention gap, else its start):
    a partition the destination never committed, or committed up to `from_`, takes the batch's range as it
    is; one committed past the end takes nothing; one committed inside the range takes the rest of it (from
    its own offset: inside a retention gap, from the batch's start with the gap from its own offset).
    Committed below `from_`: refused, unless `sparse` (a destination only the batches with records for it
    commit: the dead-letter table), which takes `[own, end)` with no gap, its rows all of the batch's.
    """
    take_start: dict[int, int] = {}
    take_end: dict[int, int] = {}
    take_gaps: dict[int, int] = {}
    skip: dict[int, int] = {}
    for p in sorted(start):
        s, e = start[p], end[p]
        from_ = gaps.get(p, s)
        own = held.get(p)
        if own is not None and own < from_ and sparse:
            take_start[p], take_end[p] = own, e  # `[own, from_)` was read by batches with none of its rows
            continue
        if own is not None and own < from_:
            raise DestinationBehindError(
                f"{name}: partition {p} is committed up to {own}, behind the batch's start {from_}: its "
                "records in between would be lost; reset its offsets with the table's (icefall reset-offsets)"
            )
        if own is None or own == from_:
            take_start[p], take_end[p] = s, e
            if p in gaps:
                take_gaps[p] = gaps[p]
            continue
        if own >= e:
            continue  # it holds the whole range of this partition
        take_end[p] = e
        if own >= s:
            take_start[p] = own
            skip[p] = own
        else:  # inside a retention gap: the records from `own` to `s` are gone for it too
            take_start[p] = s
            take_gaps[p] = own
    if not take_start:
        return None
    return Take(take_start, take_end, take_gaps, skip)


@dataclass(frozen=True)
class TopicRange:
    """One topic's part of a batch, as the table planned it: its commit range and retention gaps."""

    topic: str
    start: Mapping[int, int]
    end: Mapping[int, int]
    gaps: Mapping[int, int] = field(default_factory=dict)


def destination_takes(
    ranges: Iterable[TopicRange],
    held: Mapping[str, Mapping[int, int]],
    *,
    name: str,
    by_topic: bool,
    sparse: bool = False,
) -> dict[str, Take]:
    """`destination_take` of each topic of a batch against what the destination holds of that topic
    (`held`, by topic; a topic it never committed is missing), by topic; the topics it holds all of are
    left out (empty: it takes nothing). `by_topic`: the topics form, whose errors name the topic."""
    takes: dict[str, Take] = {}
    for r in ranges:
        label = f"{name} (topic {r.topic})" if by_topic else name
        take = destination_take(r.start, r.end, r.gaps, held.get(r.topic, {}), name=label, sparse=sparse)
        if take is not None:
            takes[r.topic] = take
    return takes


def same_takes(takes: Iterable[tuple[int, Mapping[str, Take]]]) -> list[tuple[Mapping[str, Take], list[int]]]:
    """The destinations (`(index, its takes)`) grouped by equal takes, in first-seen order: the driver's
    one job filters the batch by one condition per group (in the steady state there is one group: every
    destination takes the whole batch)."""
    groups: list[tuple[Mapping[str, Take], list[int]]] = []
    for index, taken in takes:
        group = next((indexes for seen, indexes in groups if seen == taken), None)
        if group is None:
            groups.append((taken, [index]))
        else:
            group.append(index)
    return groups


def collected_bytes(records: int, value_bytes: int) -> int:
    """Estimated bytes, in the driver, of a batch's rows collected to Arrow: `records` records holding
    `value_bytes` bytes of Kafka values (the read's observation). Every record counts, whichever table it
    goes to: an upper bound of what the route tables take."""
    return value_bytes * VALUE_EXPANSION + records * ROW_OVERHEAD_BYTES


def driver_collects(records: int, value_bytes: int, max_bytes: int) -> bool:
    """Whether the route tables' rows of a batch are collected to the driver in one Spark job and written
    from there (cheap per table), rather than appended by Spark one route table at a time (memory bounded
    by Spark, a job per table): when `collected_bytes` is at most `max_bytes` (`spec.batch.maxCollectBytes`;
    0: never). So the driver holds at most about `max_bytes` of rows (and its JVM as much again while
    handing them over), however large the backlog makes a batch."""
    return max_bytes > 0 and collected_bytes(records, value_bytes) <= max_bytes


def reads_headers(conditions: list[str], *, dynamic_from_header: bool = False) -> bool:
    """Whether a batch must read the records' headers for these route conditions (they name `headers`), or
    for a dynamic route's name (`from: Header`)."""
    return dynamic_from_header or any("headers" in condition.lower() for condition in conditions)


@dataclass(frozen=True)
class DynamicNames:
    """The names a batch's records computed (`spec.dynamicRoute`), sorted out: the tables to create now, in
    order, and the names refused with the reason their records' dead letters give."""

    new: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)


def quoted(name: str) -> str:
    """A computed name as a reason quotes it: at most `QUOTED_CHARS` characters."""
    return repr(name if len(name) <= QUOTED_CHARS else f"{name[:QUOTED_CHARS]}...")


def dynamic_names(
    found: Iterable[str], known: Collection[str], reserved: Mapping[str, str], *, max_tables: int
) -> DynamicNames:
    """Sort the distinct names a batch computed (`found`) against the dynamic tables there are (`known`):
    a known one is written to; one that is not an identifier, or names a table the StreamingTable writes
    otherwise (`reserved`: name to what it is), is refused; the others are created in sorted order (the
    same order on every writer) while fewer than `max_tables` exist, and refused past the cap."""
    new: list[str] = []
    refused: dict[str, str] = {}
    count = len(known)
    for name in sorted(set(found) - set(known)):
        if (why := name_refusal(name, reserved)) is not None:
            refused[name] = why
        elif count >= max_tables:
            refused[name] = past_cap_reason(name, count, max_tables)
        else:
            new.append(name)
            count += 1
    return DynamicNames(tuple(new), refused)


def name_refusal(name: str, reserved: Mapping[str, str]) -> str | None:
    """The reason a computed name is refused whatever tables exist (not an identifier, or a table the
    StreamingTable writes otherwise: `reserved`), or None."""
    if re.fullmatch(IDENTIFIER_PATTERN, name) is None or len(name) > MAX_NAME_CHARS:
        return (
            f"{DYNAMIC_REASON_PREFIX}the computed table name {quoted(name)} is not a valid identifier "
            f"(letters, digits and '_', not starting with a digit, at most {MAX_NAME_CHARS} characters)"
        )
    if name in reserved:
        return (
            f"{DYNAMIC_REASON_PREFIX}the computed table name {quoted(name)} is {reserved[name]}, which the "
            "route does not write"
        )
    return None


def past_cap_reason(name: str, count: int, max_tables: int) -> str:
    """The reason of a name refused because `count` dynamic tables exist already (at least `max_tables`)."""
    return (
        f"{DYNAMIC_REASON_PREFIX}the computed table name {quoted(name)} would be table {count + 1}, past "
        f"maxTables {max_tables}"
    )


def not_created_reason(name: str) -> str:
    """The reason of a name that is a table the route did not create (no owner property naming it)."""
    return (
        f"{DYNAMIC_REASON_PREFIX}the computed table name {name!r} is a table the route did not create (no "
        "icefall.dynamic-route-of property); rename it or change nameTemplate"
    )


def dynamic_candidate(st: StreamingTable, identifier: Sequence[str]) -> bool:
    """Whether `identifier` may be a table `st`'s dynamic route made: in its namespace, named by its
    template around a value, and no table `st` writes otherwise. Whether it is one is its owner property's
    to say (`icefall.catalog.tables.owned_dynamic_tables`)."""
    route = st.spec.dynamic_route
    if route is None or tuple(identifier[:-1]) != st.dynamic_namespace:
        return False
    name = identifier[-1]
    return (
        len(name) > len(route.prefix) + len(route.suffix)
        and name.startswith(route.prefix)
        and name.endswith(route.suffix)
        and name not in st.dynamic_reserved
    )
