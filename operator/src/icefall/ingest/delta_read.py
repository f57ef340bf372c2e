"""Fresh reads of a Delta Lake table (`spec.table.format: delta`; `icefall read`): the union read of
`icefall.ingest.union_read` with the table's part taken from its Delta log.

    union read = rows of the table at version V  +  the topic from V's offsets up to a cut

- **V** is the table's newest version; its `icefall.*` offsets come from the same log state as its number
  (`icefall.commit.delta.DeltaSnapshot.committed`) and its rows are read pinned to it (`versionAsOf`), so a
  commit racing the read changes nothing: the result is the topic up to the cut, exactly once.
- **The cut and the tail** are the Iceberg read's (`tail_of`, `with_tail`): one set of end offsets taken
  once, the records decoded with the spec as the Delta writer decodes them, bad and filtered records left
  out and counted; a keyed table's last change per key replaces or deletes the table's row.

Not yet: an older version (`--snapshot`, `--as-of`), refused by `icefall read` with that reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icefall.ingest.union_read import Cut, ReadError, UnionRead, tail_of, with_tail

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from icefall.api import StreamingTable
    from icefall.commit.delta import DeltaLog


def delta_union_read(
    st: StreamingTable, location: str, *, spark: SparkSession, timeout: float = 30
) -> UnionRead:
    """The Delta table at `location` (filled by `st`) at its newest version plus its topic up to a cut
    taken now (module docstring). `spark`: a session with Delta's jars and extensions."""
    from icefall.commit.delta import DeltaLog

    log = DeltaLog(location)
    snapshot = log.snapshot()
    if not snapshot.exists:
        raise ReadError(f"no Delta table at {location} (no _delta_log): run the table's ingestion first")
    cut = Cut(
        table=location,
        topic=st.spec.source.first_topic,
        snapshot_id=snapshot.version,
        snapshot_ms=_committed_ms(log, snapshot.version),
        taken_at_ms=0,
        unit="version",
    )
    ranges, cut = tail_of(st, snapshot.committed, cut, older=False, timeout=timeout)
    rows = spark.read.format("delta").option("versionAsOf", snapshot.version).load(location)
    return with_tail(spark, st, rows, ranges, cut, None)


def _committed_ms(log: DeltaLog, version: int) -> int | None:
    """When `version` was committed (its commitInfo); None once log cleanup removed its file."""
    try:
        actions = log.actions(version)
    except FileNotFoundError:
        return None
    stamps = [a["commitInfo"].get("timestamp") for a in actions if "commitInfo" in a]
    return int(stamps[0]) if stamps and stamps[0] is not None else None
