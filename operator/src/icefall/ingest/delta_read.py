"""Fresh reads of a Delta Lake table (`spec.table.format: delta`; `icefall read`): the union read of
`icefall.ingest.union_read` with the table's part taken from its Delta log.

    union read = rows of the table at version V  +  the topic from V's offsets up to a cut

- **V** is the table's newest version, or an older one (`version`, or `as_of`: the newest version committed
  at or before that time, by Delta's own commit times: `icefall.commit.delta_history`). Its `icefall.*`
  offsets come from the Metadata in force at V (`icefall.commit.delta.DeltaLog.snapshot`) and its rows are
  read pinned to it (`versionAsOf`), so a commit racing the read changes nothing: the result is the topic
  up to the cut, exactly once. As for Iceberg, an older V gives the same records with more of them from
  the tail; what differs is what others did to the table (a user's DELETE) after V.
- **V is resolved here, not by Spark's `timestampAsOf`**: the offsets must be V's, so V must be known
  before its rows are read, and Spark does not say which version a time chose; and a time after the newest
  commit means the newest version (Iceberg's `--as-of`), which `timestampAsOf` refuses.
- **The cut and the tail** are the Iceberg read's (`tail_of`, `with_tail`): one set of end offsets taken
  once, the records decoded with the spec as the Delta writer decodes them, bad and filtered records left
  out and counted; a keyed table's last change per key replaces or deletes the table's row.

A table on S3 is read through S3A (`s3a://`, the AWS_* environment: `icefall.ingest.delta_keyed.use_s3a`).

Refused (`ReadError`, before any Spark work where it can be): a version that never was, one log cleanup
removed (`delta.logRetentionDuration`), a time before the oldest version the log keeps, and an older
version whose data files VACUUM deleted (`delta.deletedFileRetentionDuration`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icefall.ingest.union_read import Cut, ReadError, UnionRead, tail_of, with_tail

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from icefall.api import StreamingTable, StreamingTableSpec
    from icefall.commit.delta import DeltaLog


def delta_version(location: str, *, version: int | None = None, as_of: datetime | None = None) -> int | None:
    """The version a read of the Delta table at `location` starts from: `version`, the newest committed at
    or before `as_of` (naive: UTC), or None (neither: the newest). ReadError: no such table, or a version
    or time the log does not keep (`icefall.commit.delta_history`)."""
    from icefall.commit.delta import DeltaLog
    from icefall.commit.delta_history import VersionNotKeptError

    if version is not None and as_of is not None:
        raise ValueError("give version or as_of, not both")
    log = DeltaLog(location)
    history = log.history()
    if history.latest < 0:
        raise ReadError(f"no Delta table at {location} (no _delta_log): run the table's ingestion first")
    if version is None and as_of is None:
        return None
    try:
        if as_of is not None:
            moment = as_of if as_of.tzinfo is not None else as_of.replace(tzinfo=UTC)
            return history.version_at(int(moment.timestamp() * 1000))
        assert version is not None
        return history.check(version)
    except VersionNotKeptError as error:
        raise ReadError(f"{location}: {error}") from None


def delta_union_read(
    st: StreamingTable,
    location: str,
    *,
    spark: SparkSession,
    version: int | None = None,
    as_of: datetime | None = None,
    timeout: float = 30,
) -> UnionRead:
    """The Delta table at `location` (filled by `st`) at its newest version (or `version`, or the one
    committed at or before `as_of`: `delta_version`) plus its topic up to a cut taken now (module
    docstring). `spark`: a session with Delta's jars and extensions."""
    from icefall.commit.delta import DeltaLog

    older = version is not None or as_of is not None
    chosen = delta_version(location, version=version, as_of=as_of)
    log = DeltaLog(location)
    snapshot = log.snapshot(chosen)
    if not snapshot.exists:
        raise ReadError(f"no Delta table at {location} (no _delta_log): run the table's ingestion first")
    cut = Cut(
        table=location,
        topic=st.spec.source.first_topic,
        snapshot_id=snapshot.version,
        snapshot_ms=log.history().committed_ms().get(snapshot.version),
        taken_at_ms=0,
        unit="version",
    )
    from icefall.commit.delta_storage import is_s3
    from icefall.ingest.delta_keyed import table_uri, use_s3a

    use_s3a(spark, location)  # a table on S3: Spark's Delta reader reads it through S3A (s3a://)
    where = table_uri(location) if is_s3(location) else location
    rows = spark.read.format("delta").option("versionAsOf", snapshot.version).load(where)
    if older:  # the newest version's files are never VACUUM's: an older one's may be gone
        _check_files(log, snapshot.version, rows.inputFiles())
    ranges, cut = tail_of(st, snapshot.committed, cut, older=older, timeout=timeout)
    return with_tail(
        spark, st, rows, ranges, cut, None, add_columns=lambda tail: with_partition_columns(tail, st.spec)
    )


def with_partition_columns(rows: DataFrame, spec: StreamingTableSpec) -> DataFrame:
    """`rows` with the Delta table's generated partition columns (`icefall.api.delta_partitions`) after
    their columns, each with its expression in its field's metadata, as the table's schema names it."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    from icefall.api.delta_partitions import GENERATION_EXPRESSION, delta_partitions

    generated = [
        F.expr(p.expression)
        .cast(p.spark_type)
        .alias(p.column, metadata={GENERATION_EXPRESSION: p.expression})
        for p in delta_partitions(spec.table.partitioning)
        if p.expression is not None and p.spark_type is not None
    ]
    return rows.select("*", *generated) if generated else rows


def _check_files(log: DeltaLog, version: int, uris: list[str]) -> None:
    """ReadError if a data file of `version` (`uris`, as Spark lists them) is no longer in the store."""
    from urllib.parse import urlparse

    from pyarrow.fs import FileType, LocalFileSystem

    filesystem, _ = log.storage.arrow()
    paths = [
        parsed.path if filesystem is None else f"{parsed.netloc}{parsed.path}"
        for parsed in map(urlparse, uris)
    ]
    infos = (filesystem or LocalFileSystem()).get_file_info(paths) if paths else []
    gone = [path for path, info in zip(paths, infos, strict=True) if info.type == FileType.NotFound]
    if gone:
        raise ReadError(
            f"{log.location}: version {version} cannot be read: {len(gone)} of its {len(paths)} data files "
            f"are gone (e.g. {gone[0].rsplit('/', 1)[-1]}), deleted by VACUUM once they had left the table "
            "longer than delta.deletedFileRetentionDuration (compaction.maxSnapshotAgeSeconds); read a newer "
            "version"
        )
