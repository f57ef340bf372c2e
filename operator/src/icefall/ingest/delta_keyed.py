"""A keyed batch (`spec.mode` upsert or cdc) of a Delta table: Delta's own MERGE, committed by Icefall.

Icefall writes a Delta table's log entries itself (`icefall.commit.delta`), so that the batch's offsets
travel in the same commit as its rows. Spark's Delta MERGE commits on its own, and Delta's Scala API,
which could hand back a MERGE's actions uncommitted, does not load against this Spark. So the MERGE runs
on a shadow of the table: a local staging folder whose `_delta_log` holds ONE synthesized version 0 — the
Protocol and Metadata of the version V the batch was planned on and an `add` of each of its live files,
named by absolute URI (`s3a://bucket/table/...` on S3, `file:/...` locally: Delta reads a URI in
`add.path` as it is), each `u` deletion vector as a `p` one by the URI of its file
(`icefall.commit.delta_vectors`). Spark reads the table's files where they are (through S3A on S3); the
MERGE commits version 1 of the shadow only, and its new files (rows, deletion vectors) are written in the
shadow folder. `ShadowMerge.apply` puts them into the table's folder (`DeltaStorage.move_in`: uploaded on
S3; invisible until a log entry names them) and returns the MERGE's `add` and `remove` actions in the
table's terms (`table_actions`: absolute URIs back to the table's own paths, the deletion vectors of
removed files the table's own descriptors); the batch's commit (`commit_batch`, `merged=`) puts them in
the table's version V+1 beside the offsets, or nothing (any other commit since V, StaleHeadError: the
batch is planned again). The live files come from a replay of the log (`LogFiles`) kept by the writer and
advanced by the commits since: no link, no copy, no listing of the table's folder; partitioned tables
alike (the adds carry their partition values).

The MERGE is the Iceberg path's (`icefall.ingest.writer.merge` on `icefall.decode.decode.last_changes`):
the batch's last change per key by (sequence,) partition, offset; a delete (tombstone, cdc op d) removes
the key; with `spec.sequenceBy` a change older than the row's `_sequence` is skipped, and deleted keys are
remembered (`icefall.ingest.deleted_keys.Remembering`) in a Parquet file under `_icefall_deleted_keys`
that the commit names (`icefall.deleted-keys`: a local path, or an `s3://` URI). Replaced rows are marked
in deletion vectors (`delta.enableDeletionVectors`): no file is rewritten.

A batch that changes the table's schema (`icefall.catalog.delta_schema`: a new optional field) has the
shadow's version 1 change it first (a Metadata action only), the MERGE commits version 2 there, and the
table's V+1 holds the new schema, the MERGE's actions and the offsets: one log entry, as for an append.

Not guaranteed / not done: deletion vectors another writer named by absolute URI (`p`) are refused, not
read; the shadow's log holds every live file of the table (compaction keeps the count small); executors
on other machines (the shadow is the driver's folder).
"""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlparse

from icefall.commit import StaleHeadError
from icefall.commit.delta import LOG_DIR, DeltaLog, DeltaSnapshot, protocol_after
from icefall.commit.delta_storage import S3Settings, is_s3
from icefall.commit.delta_vectors import IN_TABLE, vector_file, with_absolute_vector

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from icefall.api import StreamingTableSpec
    from icefall.commit.delta_files import LogFiles

DELETED_KEYS_DIR = "_icefall_deleted_keys"  # under the table's folder; `_` names are not table data
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # RFC 3986's scheme, then its colon


def deleted_keys_relative(log: DeltaLog, path: str) -> str:
    """The table-relative path of the deleted keys file `path` the table's log names: only a file this
    writer stores (`store_deleted_keys`) — the path comes from the table's log, which is not trusted to
    name another file of the host or another prefix of the bucket."""
    if is_s3(log.location):
        folder = f"{log.location.rstrip('/')}/{DELETED_KEYS_DIR}/"
        name = path[len(folder) :] if path.startswith(folder) else ""
        inside = bool(name) and "/" not in name and name not in (".", "..")
    else:
        local = (log.root / DELETED_KEYS_DIR).resolve()
        name = Path(path).name
        inside = Path(path).resolve().parent == local
    if not inside:
        raise ValueError(
            f"the table's icefall.deleted-keys names {path}, outside {log.location}/{DELETED_KEYS_DIR}: not "
            "read. Written by hand? Restore the value the last Icefall commit wrote"
        )
    return f"{DELETED_KEYS_DIR}/{name}"


def load_deleted_keys(log: DeltaLog, path: str | None) -> pa.Table | None:
    """The deleted keys file the committed state names (None: none)."""
    if not path:
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_table(pa.BufferReader(log.storage.read(deleted_keys_relative(log, path))))


def store_deleted_keys(log: DeltaLog, staging: Path, keys: pa.Table) -> str:
    """Write `keys` to a new file under the table's folder (through the local `staging` folder); its path
    (local) or URI (S3), for the commit to name."""
    import pyarrow.parquet as pq

    relative = f"{DELETED_KEYS_DIR}/{uuid.uuid4()}.parquet"
    staging.mkdir(parents=True, exist_ok=True)
    written = staging / f"deleted-keys-{uuid.uuid4().hex}.parquet"
    pq.write_table(keys, written)
    log.storage.move_in(written, relative)
    return f"{log.location.rstrip('/')}/{relative}" if is_s3(log.location) else str(log.root / relative)


def table_uri(location: str) -> str:
    """The table folder's URI as Spark's Hadoop file systems read and render it, ending in '/': `s3a://`
    for S3 (S3A, `spark_images/delta/pom.xml`), `file:` for a local folder."""
    if is_s3(location):
        parsed = urlparse(location)
        prefix = parsed.path.strip("/")
        return f"s3a://{parsed.netloc}/" + (f"{quote(prefix)}/" if prefix else "")
    from icefall.commit.delta_storage import local_path

    # `file:/path`, as Hadoop's Path renders a local file (Spark's `_metadata.file_path`): Delta's MERGE
    # matches the rows it marks deleted to `add.path` by that text, and `file:///path` does not match.
    return "file:" + quote(local_path(location).resolve().as_posix().rstrip("/")) + "/"


def s3a_properties(settings: S3Settings) -> dict[str, str]:
    """The Hadoop settings with which S3A reads the table's files: credentials from the AWS SDK's
    environment names (the JVM inherits the pod's environment; no secret in any setting), the region,
    and an S3-compatible endpoint path-style."""
    provider = (
        "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
        if settings.access_key
        else "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    )
    properties = {"fs.s3a.aws.credentials.provider": provider, "fs.s3a.endpoint.region": settings.region}
    if settings.endpoint:
        properties |= {"fs.s3a.endpoint": settings.endpoint, "fs.s3a.path.style.access": "true"}
    return properties


def use_s3a(spark: SparkSession, location: str) -> None:
    """Let this session's Hadoop file systems read the S3 table at `location` (`s3a_properties`); set on
    the running JVM, never on a command line."""
    if not is_s3(location):
        return
    jsc = spark.sparkContext._jsc
    assert jsc is not None
    hadoop = jsc.hadoopConfiguration()
    for key, value in s3a_properties(S3Settings.from_env()).items():
        hadoop.set(key, value)


@dataclass(frozen=True)
class ShadowFiles:
    """The table's live files as the shadow's version 0 names them (`shadow_adds`): its `add` actions, and
    for each absolute path the table's own add and the shadow's."""

    base: str
    adds: list[dict[str, Any]]
    originals: dict[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)


def shadow_adds(live: Mapping[str, Mapping[str, Any]], base: str) -> ShadowFiles:
    """The shadow's adds of the table's `live` files (path → add body), each path the absolute URI under
    `base` (the table's, `table_uri`), each `u` deletion vector a `p` one under it. A path that is a URI or
    absolute already, or a `p` deletion vector, is refused (ValueError): not written here."""
    adds, originals = [], {}
    for path, add in live.items():
        if _absolute(path) or ".." in unquote(path).split("/"):
            raise ValueError(f"the table names a file outside its folder ({path}): keyed batches refuse it")
        vector = add.get("deletionVector") or {}
        if vector and vector.get("storageType") != IN_TABLE and vector.get("storageType") != "i":
            raise ValueError(f"the table names a deletion vector by URI (file {path}): not written here")
        absolute = with_absolute_vector({**add, "path": base + path}, base)
        originals[absolute["path"]] = (dict(add), absolute)
        adds.append({"add": absolute})
    return ShadowFiles(base, adds, originals)


def table_actions(
    actions: Sequence[Mapping[str, Any]], files: ShadowFiles
) -> tuple[list[dict[str, Any]], list[str]]:
    """The shadow MERGE's `add` and `remove` actions in the table's terms, and the files (decoded
    table-relative paths) the shadow wrote that they name, to move into the table's folder: a new data
    file (a relative path) and a new `u` deletion vector's file. An absolute path becomes the table's own
    path, and a file's deletion vector as the shadow held it the table's own descriptor (a remove matches
    the table's add by path and vector). RuntimeError for an action naming a file the shadow did not hold."""
    kept: list[dict[str, Any]] = []
    new_files: list[str] = []
    for action in actions:
        kind = "add" if "add" in action else "remove" if "remove" in action else None
        if kind is None:
            continue  # commitInfo
        body = dict(action[kind])
        path, vector = body["path"], body.get("deletionVector")
        if _absolute(path):
            table_add, shadow_add = _original(files, path)
            body["path"] = table_add["path"]
            if vector == shadow_add.get("deletionVector"):  # the file as the table holds it
                body.pop("deletionVector", None)
                body |= (
                    {"deletionVector": table_add["deletionVector"]} if table_add.get("deletionVector") else {}
                )
            elif kind == "remove":
                raise RuntimeError(f"the MERGE removed {path} with a deletion vector the table's file lacks")
            else:
                new_files += [f for f in [vector_file(vector)] if f is not None]
        elif kind == "remove":
            raise RuntimeError(f"the MERGE removed {path}, a file the shadow of the table did not hold")
        else:
            new_files += [unquote(path), *(f for f in [vector_file(vector)] if f is not None)]
        kept.append({kind: body})
    return kept, list(dict.fromkeys(new_files))


def _absolute(path: str) -> bool:
    """Whether a log's `path` is a URI (`s3a://...`, `file:/...`) or an absolute path, not one relative to
    the table's folder (whose first segment, `column=value` or a file name, has no `scheme:`)."""
    return path.startswith("/") or _SCHEME.match(path) is not None


def _original(files: ShadowFiles, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    found = files.originals.get(path)
    if found is None:  # the same URI, encoded otherwise
        found = next((v for k, v in files.originals.items() if unquote(k) == unquote(path)), None)
    if found is None:
        raise RuntimeError(f"the MERGE names {path}, a file the shadow of the table did not hold")
    return found


@dataclass(frozen=True)
class Merged:
    """A MERGE's outcome: the `add` and `remove` actions its commit carries, and the rows it wrote."""

    actions: list[dict[str, Any]]
    written: int


class ShadowMerge:
    """One keyed batch's MERGE on a shadow of version `planned.version` of the table, whose live files are
    `files` (a replay at that version; module doc); with `schema_string` (the batch changes the table's
    schema) the shadow's version 1 changes it first."""

    def __init__(
        self,
        log: DeltaLog,
        staging: Path,
        planned: DeltaSnapshot,
        files: LogFiles,
        *,
        schema_string: str | None = None,
    ) -> None:
        if files.version != planned.version:
            raise StaleHeadError(
                f"the table's files were read at version {files.version}, the batch planned on "
                f"{planned.version}"
            )
        self.log, self.planned, self.files = log, planned, files
        self.shadow = staging / f"merge-{uuid.uuid4().hex}"
        self.schema_string = schema_string
        self.merged_version = 1 if schema_string is None else 2

    def __enter__(self) -> ShadowMerge:
        self.names = shadow_adds(self.files.live, table_uri(self.log.location))
        assert self.planned.metadata is not None and self.planned.protocol is not None
        actions = [{"protocol": self.planned.protocol}, {"metaData": self.planned.metadata}, *self.names.adds]
        self._write_version(0, actions)
        if self.schema_string is not None:
            self._evolve(self.schema_string)
        return self

    def _write_version(self, version: int, actions: Sequence[Mapping[str, Any]]) -> None:
        (self.shadow / LOG_DIR).mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(a) + "\n" for a in actions)
        (self.shadow / LOG_DIR / f"{version:020d}.json").write_text(text, encoding="utf-8")

    def _evolve(self, schema_string: str) -> None:
        """The shadow's version 1: only the new schema (and the protocol it needs), so the MERGE
        (version 2) writes the new columns. Never the table's: its V+1 carries the same Metadata change
        with the MERGE's actions (`commit_batch(schema_string=...)`)."""
        assert self.planned.metadata is not None
        actions: list[dict[str, Any]] = [
            {"metaData": {**self.planned.metadata, "schemaString": schema_string}}
        ]
        upgraded = protocol_after(self.planned.protocol, schema_string)
        actions += [{"protocol": upgraded}] if upgraded is not None else []
        self._write_version(1, actions)

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.shadow, ignore_errors=True)  # the shadow's own files only: never the table's

    def apply(self, spark: SparkSession, changes: DataFrame, key: Sequence[str], *, view: str) -> Merged:
        """MERGE `changes` (the batch's last change per key) into the shadow; its new files moved into the
        table's folder; the `add` and `remove` actions to commit and the rows the MERGE wrote."""
        from icefall.ingest.writer import merge

        use_s3a(spark, self.log.location)
        target = f"{view}_target"
        spark.read.format("delta").load(str(self.shadow)).createOrReplaceTempView(target)
        try:
            merge(changes, target, key, view=view)
        finally:
            spark.catalog.dropTempView(target)
            spark.catalog.dropTempView(view)
            jvm = spark.sparkContext._jvm
            if jvm is not None:  # the shadow's cached DeltaLog: never read again
                jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
        made = self.shadow / LOG_DIR / f"{self.merged_version:020d}.json"
        actions = [json.loads(line) for line in made.read_text(encoding="utf-8").splitlines() if line]
        if any("metaData" in a or "protocol" in a for a in actions):
            raise RuntimeError("the MERGE changed the table's schema or protocol: not committed")
        kept, new_files = table_actions(actions, self.names)
        for relative in new_files:  # invisible until the commit names them; touched now (VACUUM spares)
            self.log.storage.move_in(self.shadow / relative, relative)
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        metrics = info.get("operationMetrics") or {}
        return Merged(kept, _written(metrics))


def _written(metrics: Mapping[str, str]) -> int:
    return int(metrics.get("numTargetRowsInserted", 0)) + int(metrics.get("numTargetRowsUpdated", 0))


def merge_batch(
    spark: SparkSession,
    spec: StreamingTableSpec,
    shadow: ShadowMerge,
    rows: DataFrame,
    *,
    deleted_keys: str | None,
    view: str,
) -> tuple[Merged, str | None]:
    """MERGE the last change per key of a keyed batch's good `rows` on `shadow`: its outcome, and the
    deleted keys file the commit names (None: the committed one stays)."""
    import time

    from icefall.decode.decode import last_changes
    from icefall.ingest.deleted_keys import Remembering

    key = list(spec.key or [])
    if not spec.sequence_by:
        return shadow.apply(spark, last_changes(rows, key), key, view=view), None
    remembering = Remembering(
        load_deleted_keys(shadow.log, deleted_keys),
        now_ms=int(time.time() * 1000),
        keep_ms=1000 * spec.deletes_remembered_seconds,
    )
    changes = remembering.filter(spark, last_changes(rows, key), key)
    merged = shadow.apply(spark, changes, key, view=view)
    kept = remembering.kept()
    return merged, None if kept is None else store_deleted_keys(shadow.log, shadow.shadow, kept)
