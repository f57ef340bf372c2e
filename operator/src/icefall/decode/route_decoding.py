"""Routes that decode their records their own way (`spec.routes[i].schema`, `key`, `sequenceBy`;
`icefall.api.route_specs`): a table per source table of one StreamingTable.

The batch is read and decoded once with spec.format.schema, as every routed batch is; the conditions pick
each record's route over that (`icefall.ingest.routes.Routing.routed`), whether or not the record fits
spec.format.schema: a record an own route takes is judged by its route's schema alone. That route's
records, taken from the cached batch (no second Kafka read), are decoded again with its schema
(`OwnDecoders.rows`: a `Decoder` of its `route_spec`, built once per writer) and written to its table as
a plain table of that spec writes them (append, or its own key's MERGE). A record that does not fit its
route's schema is a dead letter whose reason ends with the route and its table (`route_reason`); the
batch counts them in one Spark job over the cached batch (`bad`), and the dead-letter path decodes them
again with their error text (`bad_rows`).

Not guaranteed: a keyed delete no condition takes (`EVERY`) reaches an own route only when its key fits
that route's key (it is dropped there otherwise, not a dead letter); registry formats (refused by the
spec).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from icefall.api import StreamingTable
from icefall.decode.columns import BAD_COLUMN, ERROR_COLUMN, INTERNAL_PREFIX

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyspark.sql import Column, DataFrame

    from icefall.api import StreamingTableSpec
    from icefall.decode.decode import Decoder


#: `OwnDecoders.taken`'s column naming each record's route.
ROUTE = f"{INTERNAL_PREFIX}own_route"


def route_reason(index: int, label: str) -> str:
    """What a dead letter's reason ends with when its record did not fit route `index`'s own schema."""
    return f" (spec.routes[{index}] schema, table {label})"


class OwnDecoders:
    """The routes of one StreamingTable that decode their own way, by index of `spec.routes`; each one's
    Spark expressions built on first use (they need the running session)."""

    def __init__(self, st: StreamingTable) -> None:
        self.specs: dict[int, StreamingTableSpec] = {}
        for i in range(len(st.spec.routes)):
            spec = st.spec.route_spec(i)
            if spec is not None:
                self.specs[i] = spec
        self.labels = {i: ".".join(st.route_identifiers[i]) for i in self.specs}
        self.st = st
        self._columns: dict[int, Schema] = {}

    def __bool__(self) -> bool:
        return bool(self.specs)

    def __contains__(self, index: object) -> bool:
        return index in self.specs

    def columns(self, index: int) -> Schema:
        """The columns own route `index`'s table holds (its schema's, `_kafka`, `_sequence`)."""
        from icefall.catalog.layout import expected_schema

        if index not in self._columns:
            self._columns[index] = expected_schema(self.st.model_copy(update={"spec": self.specs[index]}))
        return self._columns[index]

    @functools.cached_property
    def good(self) -> Mapping[int, Decoder]:
        """Each own route's decoder without error text (the table's rows)."""
        from icefall.decode.decode import Decoder

        return {i: Decoder(spec, errors=False) for i, spec in self.specs.items()}

    @functools.cached_property
    def with_errors(self) -> Mapping[int, Decoder]:
        """Each own route's decoder with error text (the dead letters), built when first needed."""
        from icefall.decode.decode import Decoder

        return {i: Decoder(spec) for i, spec in self.specs.items()}

    def rows(self, index: int, frame: DataFrame, schema: Schema | None) -> DataFrame:
        """The good rows of route `index` of `frame` (records of the routed batch it takes), decoded with
        its own schema into its table's columns (`schema`: a column the route's schema no longer has is
        null): `_kafka`, and for a keyed table the delete flag."""
        from icefall.decode.decode import with_every_column

        decoder = self.good[index]
        return with_every_column(decoder.good_rows(decoder.decode(frame)), schema)

    def bad(self, routed: DataFrame, route: Column) -> int:
        """How many records of `routed` (the cached batch; `route`: its route column) do not fit the own
        route that takes them: one Spark job over them all."""
        return self.misfits(routed, route).count()

    def misfits(self, routed: DataFrame, route: Column) -> DataFrame:
        """The `partition`, `offset` (and `topic`, where `routed` has it) of the records of `routed`
        (`route`: its route column) that do not fit the own route that takes them."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        where = [c for c in ("partition", "offset", "topic") if c in routed.columns]
        frames = [
            self.good[i].decode(routed.where(route == i)).where(F.col(BAD_COLUMN)).select(*where)
            for i in self.specs
        ]
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    @staticmethod
    def taken(routed: DataFrame, route: Column) -> DataFrame:
        """The Kafka columns of `routed` and its `route` column (`ROUTE`): what an own route decodes. Cache
        it (or checkpoint it) before decoding from it: Spark's optimizer runs out of memory on a route's
        decode stacked on the spec's decode and the conditions."""
        keep = [
            c
            for c in ("partition", "offset", "timestamp", "key", "value", "headers", "topic")
            if c in routed.columns
        ]
        return routed.select(*keep, route.alias(ROUTE))

    def bad_rows(self, routed: DataFrame, route: Column, *, by_topic: bool) -> DataFrame:
        """The dead-letter rows (`icefall.decode.decode.bad_rows`) of the records of `routed` (decoded with
        error text and routed) that do not fit their own route's schema, each reason ending with
        `route_reason`."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from icefall.decode.decode import bad_rows

        frames = []
        for i, decoder in self.with_errors.items():
            decoded = decoder.decode(routed.where(route == i))
            named = F.concat(F.col(ERROR_COLUMN), F.lit(route_reason(i, self.labels[i])))
            frames.append(bad_rows(decoded.withColumn(ERROR_COLUMN, named), by_topic=by_topic))
        return functools.reduce(lambda a, b: a.unionByName(b), frames)
