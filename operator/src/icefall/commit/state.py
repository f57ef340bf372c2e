"""The committed state: what the table says it already holds, read from its `icefall.*` properties.

The properties are table properties, set by `commit_staged` in the same metadata commit that moves `main`
to the batch's snapshot. They belong to no snapshot, so any later commit that does not touch them
(compaction, file rewrites, snapshot expiry, schema changes, by pyiceberg or Spark) carries them forward
unchanged, and expiring old snapshots cannot remove them. Resume uses `read_committed`, never a Kafka
consumer group or a Spark checkpoint.

Not guaranteed: if someone rolls `main` back by hand, the properties still describe the newer commit, so
the rolled-back records are not ingested again (the rollback wins, no duplicates); edit
`icefall.offsets` as part of such a repair if the records should come back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from icefall.commit.errors import CorruptStateError

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

TOPIC = "icefall.topic"  # the one-topic form only
# Kafka's id of the topic the offsets belong to: a topic deleted and created again keeps its name, not its id.
# The topics form: JSON {"<topic>": "<id>"}.
TOPIC_ID = "icefall.topic-id"
# JSON {"<partition>": <next offset to read>}; the topics form: {"<topic>": {"<partition>": <offset>}}.
OFFSETS = "icefall.offsets"
EPOCH = "icefall.epoch"
MAX_EVENT_TIME_MS = "icefall.max-event-time-ms"
MAX_PRODUCE_TIME_MS = "icefall.max-produce-time-ms"
START_OFFSETS = "icefall.start-offsets"  # JSON {"<partition>": <first offset ever read>}, for the audit
LOST_RECORDS = "icefall.lost-records"  # records Kafka's retention deleted before they were ingested, in total
# JSON list of the offset resets a user asked for (`icefall reset-offsets`), newest last: the explicit action
# that lets ingestion go on after the topic was recreated or its log truncated.
OFFSET_RESETS = "icefall.offset-resets"
# cdc with spec.sequenceBy: the Parquet file of the keys whose last change was a delete, with its position
# (`icefall.ingest.deleted_keys`); written before the commit that names it, so it lands with the offsets.
DELETED_KEYS = "icefall.deleted-keys"
# JSON list of the schema changes ingestion made (`icefall.commit.evolve_schema`), newest last, each with the
# committed offsets when it landed: `[{"schema-id": 3, "offsets": {"0": 120}}]`. Rows below those offsets
# were written before the change, and read the fields it added as null (the audit needs to know). Not part
# of the committed state: it changes in a commit that does not move `main`, and resume never reads it.
SCHEMA_CHANGES = "icefall.schema-changes"
MAX_SCHEMA_CHANGES_KEPT = 100
PROPERTIES = (
    TOPIC,
    TOPIC_ID,
    OFFSETS,
    EPOCH,
    MAX_EVENT_TIME_MS,
    MAX_PRODUCE_TIME_MS,
    START_OFFSETS,
    LOST_RECORDS,
    OFFSET_RESETS,
    DELETED_KEYS,
    SCHEMA_CHANGES,
)
MAIN = "main"


@dataclass(frozen=True)
class TopicState:
    """What the table holds of one topic."""

    topic_id: str | None = None  # None until the first commit that knew it (tables of older versions)
    offsets: Mapping[int, int] = field(default_factory=dict)  # next offset to read, per partition
    start_offsets: Mapping[int, int] = field(default_factory=dict)  # where each partition was first read


NO_TOPIC = TopicState()


@dataclass(frozen=True)
class CommittedState:
    """What the table holds: `main`'s head and the Kafka position reached by the last ingestion commit.

    Two forms. The one-topic form (`spec.source.topic`) keeps `topic`, `topic_id`, `offsets` and
    `start_offsets`, as every table did before the topics form. The topics form (`spec.source.topics`)
    keeps `topics`, one `TopicState` per topic, and the one-topic fields empty. `by_topic()` is the view
    of either form by topic; code that serves both forms reads that.
    """

    snapshot_id: int | None  # main's head; None for a table without snapshots
    topic: str | None = None  # None until the first ingestion commit
    topic_id: str | None = None  # None until the first commit that knew it (tables of older versions)
    offsets: Mapping[int, int] = field(default_factory=dict)  # next offset to read, per partition
    epoch: int = 0  # lease epoch of the last ingestion commit; 0 before any
    max_event_time_ms: int | None = None  # newest event time committed so far
    max_produce_time_ms: int | None = None  # newest Kafka (produce) timestamp committed so far
    start_offsets: Mapping[int, int] = field(default_factory=dict)  # where each partition was first read
    # Offsets Kafka's retention deleted past the committed ones before they could be read, over the table's
    # life: each batch that skips such a gap (`Batch.retention_gaps`) adds its width in the same commit.
    lost_records: int = 0
    deleted_keys: str | None = None  # cdc with spec.sequenceBy: the file of deleted keys remembered
    #: The topics form: per topic, what the table holds of it (None: the one-topic form).
    topics: Mapping[str, TopicState] | None = None

    def __post_init__(self) -> None:
        if self.topics is not None and (self.topic or self.topic_id or self.offsets or self.start_offsets):
            raise ValueError("a state of the topics form keeps its offsets by topic only")

    def by_topic(self) -> Mapping[str, TopicState]:
        """What the table holds of each topic, in either form (empty before the first ingestion commit)."""
        if self.topics is not None:
            return self.topics
        if self.topic is None and not self.offsets:
            return {}
        return {self.topic or "": TopicState(self.topic_id, self.offsets, self.start_offsets)}

    def of_topic(self, topic: str) -> TopicState:
        """What the table holds of `topic` (nothing: `NO_TOPIC`)."""
        return self.by_topic().get(topic, NO_TOPIC)

    @property
    def has_offsets(self) -> bool:
        """Whether any offset was ever committed, of any topic."""
        return any(t.offsets for t in self.by_topic().values())

    def with_topics(self, topics: Mapping[str, TopicState], *, by_topic: bool) -> CommittedState:
        """This state holding `topics`: in the topics form if `by_topic` or if this state is in it already
        (a table never goes back), else in the one-topic form (`topics` then names at most one topic)."""
        if by_topic or self.topics is not None:
            return replace(self, topics=dict(topics), topic=None, topic_id=None, offsets={}, start_offsets={})
        if len(topics) > 1:
            raise ValueError(f"a table of one topic cannot hold several: {sorted(topics)}")
        topic, held = next(iter(topics.items())) if topics else (self.topic, NO_TOPIC)
        return replace(
            self, topic=topic, topic_id=held.topic_id, offsets=held.offsets, start_offsets=held.start_offsets
        )

    def to_properties(self) -> dict[str, str]:
        """The `icefall.*` table properties describing this state."""
        if self.topics is not None:
            props = _topic_properties(self.topics)
        else:
            props = {OFFSETS: encode_offsets(self.offsets)}
            if self.topic is not None:
                props[TOPIC] = self.topic
            if self.topic_id is not None:
                props[TOPIC_ID] = self.topic_id
            if self.start_offsets:
                props[START_OFFSETS] = encode_offsets(self.start_offsets)
        props[EPOCH] = str(self.epoch)
        if self.max_event_time_ms is not None:
            props[MAX_EVENT_TIME_MS] = str(self.max_event_time_ms)
        if self.max_produce_time_ms is not None:
            props[MAX_PRODUCE_TIME_MS] = str(self.max_produce_time_ms)
        if self.lost_records:
            props[LOST_RECORDS] = str(self.lost_records)
        if self.deleted_keys is not None:
            props[DELETED_KEYS] = self.deleted_keys
        return props


def _topic_properties(topics: Mapping[str, TopicState]) -> dict[str, str]:
    """The topics form: `icefall.offsets`, `icefall.start-offsets` and `icefall.topic-id` keyed by topic
    (JSON objects of objects), never `icefall.topic`. A version that knows only the one-topic form refuses
    such offsets (CorruptStateError) instead of reading them as partitions."""

    def by_topic(value: Callable[[TopicState], object]) -> str:
        return json.dumps({t: value(topics[t]) for t in sorted(topics)}, separators=(",", ":"))

    props = {OFFSETS: by_topic(lambda t: _offsets_object(t.offsets))}
    if any(t.start_offsets for t in topics.values()):
        props[START_OFFSETS] = by_topic(lambda t: _offsets_object(t.start_offsets))
    ids = {name: t.topic_id for name, t in topics.items() if t.topic_id is not None}
    if ids:
        props[TOPIC_ID] = json.dumps(dict(sorted(ids.items())), separators=(",", ":"))
    return props


def _offsets_object(offsets: Mapping[int, int]) -> dict[str, int]:
    return {str(p): offsets[p] for p in sorted(offsets)}


def encode_offsets(offsets: Mapping[int, int]) -> str:
    return json.dumps(_offsets_object(offsets), separators=(",", ":"))


def decode_offsets(text: str, key: str = OFFSETS) -> dict[int, int]:
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        return _partition_offsets(raw, key, text)
    except (TypeError, ValueError) as e:
        raise CorruptStateError(f"{key} is not a JSON object of partition → offset: {text!r} ({e})") from e


def _partition_offsets(raw: Mapping[str, Any], key: str, text: str) -> dict[int, int]:
    offsets = {int(p): int(o) for p, o in raw.items()}
    if any(p < 0 or o < 0 for p, o in offsets.items()):
        raise CorruptStateError(f"{key} holds a negative partition or offset: {text!r}")
    return offsets


def is_by_topic(properties: Mapping[str, str]) -> bool:
    """Whether `properties` hold the topics form (offsets keyed by topic, `spec.source.topics`)."""
    try:
        raw = json.loads(properties.get(OFFSETS, "{}"))
    except ValueError:
        return False  # decode_offsets says what is wrong
    return isinstance(raw, dict) and any(isinstance(v, dict) for v in raw.values())


def decode_topic_offsets(text: str, key: str = OFFSETS) -> dict[str, dict[int, int]]:
    """`{"<topic>": {"<partition>": offset}}` (the topics form) as `{topic: {partition: offset}}`."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise TypeError("not a JSON object of topic → object")
        return {str(topic): _partition_offsets(value, key, text) for topic, value in raw.items()}
    except (TypeError, ValueError) as e:
        raise CorruptStateError(
            f"{key} is not a JSON object of topic → partition → offset: {text!r} ({e})"
        ) from e


def _topics_from_properties(properties: Mapping[str, str]) -> dict[str, TopicState]:
    offsets = decode_topic_offsets(properties[OFFSETS])
    starts = (
        decode_topic_offsets(properties[START_OFFSETS], START_OFFSETS) if START_OFFSETS in properties else {}
    )
    try:
        ids = json.loads(properties.get(TOPIC_ID, "{}"))
        if not isinstance(ids, dict) or not all(isinstance(v, str) for v in ids.values()):
            raise TypeError("not a JSON object of topic → id")
    except (TypeError, ValueError) as e:
        raise CorruptStateError(f"{TOPIC_ID} of a table of several topics is not {{topic: id}}: {e}") from e
    names = set(offsets) | set(starts) | set(ids)
    return {t: TopicState(ids.get(t), offsets.get(t, {}), starts.get(t, {})) for t in sorted(names)}


def state_from_properties(properties: Mapping[str, str], snapshot_id: int | None) -> CommittedState:
    """The committed state described by table properties (pure: usable on properties read by Spark too)."""

    def integer(key: str) -> int | None:
        value = properties.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError as e:
            raise CorruptStateError(f"{key} is not an integer: {value!r}") from e

    lost = integer(LOST_RECORDS) or 0
    if lost < 0:
        raise CorruptStateError(f"{LOST_RECORDS} is negative: {lost}")
    common = CommittedState(
        snapshot_id=snapshot_id,
        epoch=integer(EPOCH) or 0,
        max_event_time_ms=integer(MAX_EVENT_TIME_MS),
        max_produce_time_ms=integer(MAX_PRODUCE_TIME_MS),
        lost_records=lost,
        deleted_keys=properties.get(DELETED_KEYS),
    )
    if is_by_topic(properties):
        return replace(common, topics=_topics_from_properties(properties))
    return replace(
        common,
        topic=properties.get(TOPIC),
        topic_id=properties.get(TOPIC_ID),
        offsets=decode_offsets(properties[OFFSETS]) if OFFSETS in properties else {},
        start_offsets=(
            decode_offsets(properties[START_OFFSETS], START_OFFSETS) if START_OFFSETS in properties else {}
        ),
    )


@dataclass(frozen=True)
class SchemaChange:
    """A schema change ingestion made: the schema it made current, and the offsets committed then (a table
    of several topics: `topics`, the offsets of each, and `offsets` empty)."""

    schema_id: int
    offsets: Mapping[int, int]
    topics: Mapping[str, Mapping[int, int]] | None = None

    def offsets_of(self, topic: str | None) -> Mapping[int, int]:
        """The offsets of `topic` committed then (`offsets` in a table of one topic)."""
        if self.topics is None or topic is None:
            return self.offsets
        return self.topics.get(topic, {})


def schema_change_at(schema_id: int, committed: CommittedState) -> SchemaChange:
    """The schema change to `schema_id` made when `committed` was the table's state."""
    if committed.topics is None:
        return SchemaChange(schema_id, committed.offsets)
    return SchemaChange(schema_id, {}, {t: held.offsets for t, held in committed.topics.items()})


def schema_changes(properties: Mapping[str, str]) -> list[SchemaChange]:
    """The schema changes `SCHEMA_CHANGES` records, oldest first."""
    try:
        entries = json.loads(properties.get(SCHEMA_CHANGES, "[]"))
        return [
            SchemaChange(
                int(e["schema-id"]),
                {int(p): int(o) for p, o in e["offsets"].items()},
                (
                    {t: {int(p): int(o) for p, o in by.items()} for t, by in e["topic-offsets"].items()}
                    if "topic-offsets" in e
                    else None
                ),
            )
            for e in entries
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CorruptStateError(f"{SCHEMA_CHANGES} is not a list of schema changes: {error}") from error


def with_schema_change(properties: Mapping[str, str], change: SchemaChange) -> str:
    """`SCHEMA_CHANGES` with `change` added (the newest `MAX_SCHEMA_CHANGES_KEPT` kept)."""
    entries = []
    for c in [*schema_changes(properties), change][-MAX_SCHEMA_CHANGES_KEPT:]:
        entry: dict[str, object] = {"schema-id": c.schema_id, "offsets": _offsets_object(c.offsets)}
        if c.topics is not None:
            entry["topic-offsets"] = {t: _offsets_object(c.topics[t]) for t in sorted(c.topics)}
        entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


MAX_RESETS_KEPT = 20


@dataclass(frozen=True)
class OffsetReset:
    """An offset reset a user asked for (`icefall reset-offsets`): the topic's new id and offsets, why, when,
    which topic of a table of several (None: its one topic), and the cluster request it applies (if any)."""

    topic_id: str
    offsets: Mapping[int, int]
    reason: str
    now_ms: int
    topic: str | None = None
    request: str | None = None


def planned_reset(
    committed: CommittedState, properties: Mapping[str, str], asked: OffsetReset, name: str
) -> tuple[CommittedState, dict[str, str]] | None:
    """The state after `asked` and the `icefall.*` properties that say it (`OFFSET_RESETS` with the reset
    appended, the newest `MAX_RESETS_KEPT` kept), for a table `name` whose state is `committed` and whose
    properties are `properties`; None when its request is recorded already (a request is applied once).
    The epoch is kept. ValueError: the table has no committed offsets of that topic, or `asked.topic` does
    not fit the table's form. Pure: both formats' commits use it (`commit.direct`, `commit.delta`)."""
    by_topic = committed.topics is not None
    if by_topic != (asked.topic is not None):
        need = "name one of its topics" if by_topic else "name no topic: it has one"
        raise ValueError(f"{name}: a reset of its offsets must {need}")
    held = committed.of_topic(asked.topic) if asked.topic is not None else committed
    if not held.offsets:
        raise ValueError(f"{name} has no committed offsets: there is nothing to reset")
    if asked.request is not None and reset_recorded(properties, asked.request, asked.topic):
        return None
    entry: dict[str, object] = {
        "time_ms": asked.now_ms,
        "reason": asked.reason,
        "from_topic_id": held.topic_id,
        "to_topic_id": asked.topic_id,
        "from_offsets": {str(p): o for p, o in sorted(held.offsets.items())},
        "to_offsets": {str(p): o for p, o in sorted(asked.offsets.items())},
    }
    if asked.request is not None:
        entry["request"] = asked.request
    new = TopicState(asked.topic_id, dict(asked.offsets), dict(asked.offsets))
    if asked.topic is None:
        reset = replace(
            committed, topic_id=new.topic_id, offsets=new.offsets, start_offsets=new.start_offsets
        )
    else:
        entry["topic"] = asked.topic
        reset = committed.with_topics({**committed.by_topic(), asked.topic: new}, by_topic=True)
    history = [*json.loads(properties.get(OFFSET_RESETS, "[]")), entry]
    recorded = json.dumps(history[-MAX_RESETS_KEPT:], separators=(",", ":"))
    return reset, {**reset.to_properties(), OFFSET_RESETS: recorded}


def reset_recorded(properties: Mapping[str, str], request: str, topic: str | None = None) -> bool:
    """Whether `OFFSET_RESETS` records a reset made for the cluster request `request`
    (`icefall.plan.offset_reset`); with `topic` (a table of several topics), a reset of that topic."""
    try:
        history = json.loads(properties.get(OFFSET_RESETS, "[]"))
    except ValueError:
        return False
    return isinstance(history, list) and any(
        isinstance(entry, dict)
        and entry.get("request") == request
        and (topic is None or entry.get("topic") == topic)
        for entry in history
    )


def state_of(metadata: TableMetadata) -> CommittedState:
    ref = metadata.refs.get(MAIN)
    return state_from_properties(metadata.properties, ref.snapshot_id if ref else None)


def read_committed(table: Table) -> CommittedState:
    """Refresh `table` from its catalog and return its committed state: where ingestion resumes."""
    table.refresh()
    return state_of(table.metadata)


def committed_at(table: Table, snapshot_id: int) -> CommittedState | None:
    """The committed state of the table when `main` was at `snapshot_id` (as loaded: no refresh), or None
    when no metadata file kept by the table shows `main` there.

    The `icefall.*` properties change only in the metadata commit that moves `main` (DESIGN.md), so every
    metadata file whose `main` is at `snapshot_id` holds the same ones: the offsets of exactly the records
    that snapshot holds. They are found in the current metadata or the files of its metadata log, newest
    first; the table keeps `write.metadata.previous-versions-max` of them (about two per batch), so an
    older snapshot's state is gone even while the snapshot itself is still there.
    """
    from pyiceberg.serializers import FromInputFile

    if state_of(table.metadata).snapshot_id == snapshot_id:
        return state_of(table.metadata)
    for entry in reversed(table.metadata.metadata_log):
        try:
            metadata = FromInputFile.table_metadata(table.io.new_input(entry.metadata_file))
        except (FileNotFoundError, OSError):
            continue  # deleted with write.metadata.delete-after-commit.enabled
        state = state_of(metadata)
        if state.snapshot_id == snapshot_id:
            return state
    return None
