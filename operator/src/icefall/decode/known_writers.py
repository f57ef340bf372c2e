"""The writer schemas one ingestion writer has met, by schema id: those of record values and, for a keyed
Avro table, those of Kafka keys. Pure: no Spark, no registry.

A batch is decoded with every writer schema remembered here, not with a lookup of its own ids first (that
lookup read the batch from Kafka once more, in a Spark job of its own); before the first batch, what is
remembered is the latest writer schema of each of the spec's subjects
(`icefall.ingest.writer.BatchWriter.writers_for`). The write's observation collects the batch's schema ids;
`unseen` names the ones not remembered when it was decoded, and `learn` takes the registry's answer for them.
A record of an unseen id was decoded as an unknown id (a dead letter, or for a key: read as a plain key),
which is right only if the registry has no schema for it either: `learn` returns True when an unseen id has
one, and the batch is then written again with it (`plan.pipelining`: REWRITE), never committed as first
written.

Guarantees: a writer schema, once learnt, is never forgotten or changed (registry ids are immutable), so a
batch's good rows and its dead letters, decoded at different times, decide every record alike. An id the
registry has no schema for is not remembered: it is asked for again in the next batch that holds it (a
registry that lags behind its producer, or one restored, may know it by then), as before this memory.
Not guaranteed: a bound on what is remembered (a writer meets few writer schemas).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class KnownWriters:
    """Writer schemas by id (None: the registry has no schema of the format with this id)."""

    def __init__(self) -> None:
        self.values: dict[int, str] = {}
        self.keys: dict[int, str] = {}
        self._learnt = False

    @property
    def empty(self) -> bool:
        """Nothing learnt yet: before the writer's first batch, the subjects' latest schemas are."""
        return not self._learnt

    def unseen(self, values: Iterable[int], keys: Iterable[int] = ()) -> tuple[list[int], list[int]]:
        """The value and key schema ids of a batch that are not remembered, each sorted."""
        return sorted(set(values) - self.values.keys()), sorted(set(keys) - self.keys.keys())

    def learn(self, values: Mapping[int, str | None], keys: Mapping[int, str | None] | None = None) -> bool:
        """Remember the writer schemas of the registry's answers (None: it has none, not remembered); True
        when an id not remembered before has one (a batch decoded without it must be decoded again). A
        remembered id keeps its schema."""
        self._learnt = True
        new_schema = False
        for known, found in ((self.values, values), (self.keys, keys or {})):
            for schema_id, text in found.items():
                if schema_id not in known and text is not None:
                    known[schema_id] = text
                    new_schema = True
        return new_schema

    def of_values(self, ids: Iterable[int]) -> dict[int, str | None]:
        """The value writer schemas of `ids` (a batch's), oldest id first; None for one not remembered."""
        return {i: self.values.get(i) for i in sorted(ids)}
