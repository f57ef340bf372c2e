"""What a route's condition sees of a record (`icefall.ingest.routes.Routing.routed`): the decoded value's
fields by name, `_kafka` (topic, partition, offset, timestamp, key and headers as text), and the table name
a dynamic route computes from them. Spark column expressions only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from icefall.api import DynamicRoute, NameFrom
from icefall.decode.columns import BAD_COLUMN, ERROR_COLUMN, INTERNAL_PREFIX, KAFKA_KEY_COLUMN, TYPED_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: The routing context's struct of the decoded record's own columns.
RECORD = f"{INTERNAL_PREFIX}record"
#: `_kafka.headers` of a condition: each header's name to its value as text, the first of a repeated name
#: (a map with a repeated key would fail the batch).
_HEADERS_MAP = (
    "map_from_entries(filter(transform(headers, h -> struct(h.key AS key, CAST(h.value AS STRING) AS value)),"
    " (e, i) -> array_position(transform(headers, x -> x.key), e.key) = i + 1))"
)


def value_fields(decoded: DataFrame) -> list[str]:
    """The decoded value's fields a condition names: those of the record as decoded (`TYPED_COLUMN`), so a
    registry format's are the table's columns as they are now (a writer schema's new field included)."""
    from pyspark.sql.types import StructType

    typed = decoded.schema[TYPED_COLUMN].dataType
    assert isinstance(typed, StructType)
    return [name for name in typed.fieldNames() if not name.startswith(INTERNAL_PREFIX)]


def value_field(name: str, key: Sequence[str]) -> Column:
    """A value field as a condition sees it: the row image's; a keyed table's key field (of `key`) from the
    Kafka key where the image has none (a tombstone), as the row written gets it."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    field = F.col(TYPED_COLUMN)[name]
    return F.coalesce(field, F.col(KAFKA_KEY_COLUMN)[name]) if name in key else field


def kafka_context(decoded: DataFrame, first_topic: str) -> Column:
    """`_kafka` of a condition (a record of a one-topic table has `first_topic`)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    topic = F.col("topic") if "topic" in decoded.columns else F.lit(first_topic)
    return F.struct(
        topic.cast("string").alias("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp"),
        F.col("key").cast("string").alias("key"),
        F.expr(_HEADERS_MAP).alias("headers"),
    )


def dynamic_name(route: DynamicRoute | None) -> Column:
    """The table name a record computes (`spec.dynamicRoute`), over the routing context; null when its
    value is null, its pattern does not match or its condition is not true."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    assert route is not None
    value = {
        NameFrom.FIELD: lambda: F.col(f"`{route.name}`").cast("string"),
        NameFrom.HEADER: lambda: F.col("_kafka.headers")[route.name],
        NameFrom.KEY: lambda: F.col("_kafka.key"),
        NameFrom.TOPIC: lambda: F.col("_kafka.topic"),
    }[route.from_]()
    if route.pattern is not None:
        group = 1 if re.compile(route.pattern).groups else 0
        value = F.when(value.rlike(route.pattern), F.regexp_extract(value, route.pattern, group))
    name = F.concat(F.lit(route.prefix), value, F.lit(route.suffix))
    return name if route.when is None else F.when(F.expr(route.when), name)


def judged(names: Sequence[str], own: Column) -> list[Column]:
    """The record's columns (`names`, in the routing context) with a record an own route takes (`own`) not
    bad here: its route's schema judges it (`icefall.decode.route_decoding`)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    record = F.col(RECORD)
    columns = [record[c].alias(c) for c in names if c not in (BAD_COLUMN, ERROR_COLUMN)]
    columns.append((record[BAD_COLUMN] & ~own).alias(BAD_COLUMN))
    if ERROR_COLUMN in names:
        columns.append(F.when(~own, record[ERROR_COLUMN]).alias(ERROR_COLUMN))
    return columns
