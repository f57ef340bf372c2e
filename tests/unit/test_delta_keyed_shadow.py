"""The keyed Delta MERGE's shadow in the table's terms (`icefall.ingest.delta_keyed`,
`icefall.commit.delta_vectors`), and what the log replay and the pods' upkeep make of a MERGE's version.

Proves: a deletion vector's file is found from its Z85 UUID (texts and names Delta 4.1.0 wrote); the
shadow names each live file by the table's URI (`s3a://` for S3, `file:` locally) with its partition
values, each in-table deletion vector by its file's URI; the MERGE's actions come back with the table's
own paths and deletion vectors, and the files to move in are exactly its new data files and new vector
files; a file outside the table or a vector named by URI is refused; the log replay keeps a file whose
MERGE version adds its new vector before removing the old one (Delta's order), VACUUM keeps the vectors
of live files and of files removed within the retention, and a pods' merge gives up on an input that got
a deletion vector since it was planned; S3A reads with the AWS SDK's environment credentials.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefall.commit.batch import Batch
from icefall.commit.delta import AddFile, DeltaLog, commit_batch, create_table
from icefall.commit.delta_files import LogFiles, RewriteConflictError, commit_rewrite
from icefall.commit.delta_storage import S3Settings
from icefall.commit.delta_vectors import decode_uuid, vector_file, with_absolute_vector
from icefall.compact.delta_pods import vacuum
from icefall.ingest.delta_keyed import s3a_properties, shadow_adds, table_actions, table_uri

pytestmark = pytest.mark.unit

#: Texts and files of two deletion vectors Delta 4.1.0 wrote (its MERGE, here, on MinIO and locally).
WRITTEN = {
    "f[*$ZiRk^MOg5o7i-*)j": "deletion_vector_3185270a-39f4-4666-9c28-6e7e3a5781aa.bin",
    "gBFrGg-]z0VCW08Dbh[7": "deletion_vector_33279193-341f-4c60-b2c4-078979c14487.bin",
}
BASE = "s3a://lake/tables/orders/"
SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)
ENV_CREDENTIALS = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"


def batch(start: int, end: int) -> Batch:
    return Batch(topic="t", start={0: start}, end={0: end}, topic_id="tid", max_produce_time_ms=end)


def table_with_small_files(root: Path) -> DeltaLog:
    """A table of four files f0..f3 of ten rows each, one batch each (test_delta_pod_upkeep's shape)."""
    log = DeltaLog(str(root))
    create_table(log, SCHEMA, epoch=1, deletion_vectors=True)
    for i in range(4):
        path = root / f"f{i}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(10 * i, 10 * i + 10), pa.int64())}), path)
        added = AddFile(path.name, path.stat().st_size, 10)
        assert commit_batch(log, log.snapshot(), batch(10 * i, 10 * i + 10), 1, [added])
    return log


def vector(text: str, offset: int = 1, storage: str = "u") -> dict[str, Any]:
    return {
        "storageType": storage,
        "pathOrInlineDv": text,
        "offset": offset,
        "sizeInBytes": 34,
        "cardinality": 1,
    }


def add(path: str, dv: dict[str, Any] | None = None, **values: str) -> dict[str, Any]:
    body: dict[str, Any] = {"path": path, "partitionValues": values, "size": 10, "dataChange": True}
    return body | ({"deletionVector": dv} if dv else {})


def test_a_deletion_vectors_file_comes_from_its_z85_uuid() -> None:
    for text, name in WRITTEN.items():
        assert vector_file(vector(text)) == name
        assert vector_file(vector("ab" + text)) == f"ab/{name}"  # a random prefix is a folder
    assert str(decode_uuid("00000000000000000000")) == "00000000-0000-0000-0000-000000000000"
    assert vector_file(vector("x", storage="i")) is None and vector_file(None) is None
    assert vector_file(vector("s3a://elsewhere/v.bin", storage="p")) is None
    with pytest.raises(ValueError, match="Z85"):
        vector_file(vector("too short"))


def test_the_table_folders_uri_is_s3a_on_s3_and_file_locally(tmp_path: Path) -> None:
    assert table_uri("s3://lake/tables/orders") == BASE
    assert table_uri("s3://lake/tables/orders/") == BASE
    assert table_uri("s3://lake/a b") == "s3a://lake/a%20b/"
    # `file:/path` as Spark renders a local file: Delta's MERGE matches its rows to `add.path` by that text.
    assert table_uri(str(tmp_path / "a b")) == f"file:{tmp_path}/a%20b/"
    assert table_uri(f"file:{tmp_path}") == table_uri(f"file://{tmp_path}") == f"file:{tmp_path}/"


def test_the_shadow_names_the_tables_files_and_vectors_by_uri() -> None:
    [text] = list(WRITTEN)[:1]
    live = {
        "p=0/a.parquet": add("p=0/a.parquet", vector(text), p="0"),
        "b%20c.parquet": add("b%20c.parquet"),
    }
    names = shadow_adds(live, BASE)
    by_path = {a["add"]["path"]: a["add"] for a in names.adds}
    assert set(by_path) == {BASE + "p=0/a.parquet", BASE + "b%20c.parquet"}
    assert by_path[BASE + "p=0/a.parquet"]["partitionValues"] == {"p": "0"}
    assert by_path[BASE + "p=0/a.parquet"]["deletionVector"] == {
        **vector(text),
        "storageType": "p",
        "pathOrInlineDv": BASE + WRITTEN[text],
    }
    assert "deletionVector" not in by_path[BASE + "b%20c.parquet"]
    assert live["p=0/a.parquet"]["deletionVector"]["storageType"] == "u"  # the table's own untouched
    for outside in ("s3a://other/x.parquet", "/abs/x.parquet", "../x.parquet", "file:/x.parquet"):
        with pytest.raises(ValueError, match="outside its folder"):
            shadow_adds({outside: add(outside)}, BASE)
    with pytest.raises(ValueError, match="by URI"):
        shadow_adds({"x.parquet": add("x.parquet", vector("s3a://v/x.bin", storage="p"))}, BASE)


def test_the_merges_actions_come_back_in_the_tables_terms_with_the_files_to_move_in() -> None:
    old, new = list(WRITTEN)
    live = {
        "p=0/a.parquet": add("p=0/a.parquet", vector(old), p="0"),
        "p=1/b.parquet": add("p=1/b.parquet", p="1"),
    }
    names = shadow_adds(live, BASE)
    shadow_a = next(a["add"] for a in names.adds if a["add"]["path"].endswith("a.parquet"))
    merged = [
        {"commitInfo": {"operation": "MERGE"}},
        {"add": add("p=1/part-new.parquet", p="1")},  # a new data file, relative to the shadow
        {"add": add(BASE + "p=0/a.parquet", vector(new, offset=43), p="0")},  # more rows of a marked deleted
        {
            "remove": {
                **add(BASE + "p=0/a.parquet", shadow_a["deletionVector"], p="0"),
                "deletionTimestamp": 5,
            }
        },
        {"remove": {**add(BASE + "p=1/b.parquet", p="1"), "deletionTimestamp": 5}},  # all of b's rows
    ]
    actions, moved = table_actions(merged, names)
    assert [(next(iter(a)), a[next(iter(a))]["path"]) for a in actions] == [
        ("add", "p=1/part-new.parquet"),
        ("add", "p=0/a.parquet"),
        ("remove", "p=0/a.parquet"),
        ("remove", "p=1/b.parquet"),
    ]
    assert actions[1]["add"]["deletionVector"] == vector(new, offset=43)  # the new one, in the table
    assert actions[2]["remove"]["deletionVector"] == vector(old)  # the table's own: matches its add
    assert "deletionVector" not in actions[3]["remove"]
    assert moved == ["p=1/part-new.parquet", WRITTEN[new]]
    with pytest.raises(RuntimeError, match="did not hold"):
        table_actions([{"remove": add(BASE + "gone.parquet")}], names)
    with pytest.raises(RuntimeError, match="did not hold"):
        table_actions([{"remove": add("p=1/part-new.parquet")}], names)
    local = shadow_adds({"c=a%3Ab/x.parquet": add("c=a%3Ab/x.parquet", c="a:b")}, "file:/t/")
    removed = {"remove": add("file:/t/c=a%3Ab/x.parquet", c="a:b")}  # `file:/`, no `//`: a URI too
    assert table_actions([removed], local) == ([{"remove": add("c=a%3Ab/x.parquet", c="a:b")}], [])
    with pytest.raises(RuntimeError, match="lacks"):
        table_actions([{"remove": add(BASE + "p=0/a.parquet", vector(new))}], names)


def test_an_absolute_vector_keeps_its_offset_size_and_cardinality() -> None:
    text = next(iter(WRITTEN))
    made = with_absolute_vector(add("a.parquet", vector(text, offset=7)), BASE)
    assert made["deletionVector"]["offset"] == 7 and made["deletionVector"]["cardinality"] == 1
    assert with_absolute_vector(add("a.parquet"), BASE) == add("a.parquet")
    from_checkpoint = with_absolute_vector(add("a.parquet", {**vector(text), "maxRowIndex": None}), BASE)
    assert "maxRowIndex" not in from_checkpoint["deletionVector"]


def test_s3a_reads_with_the_sdks_environment_credentials_never_a_secret_in_a_setting() -> None:
    minio = S3Settings("k", "secret", None, "eu-west-1", "http://127.0.0.1:9000")
    properties = s3a_properties(minio)
    assert properties == {
        "fs.s3a.aws.credentials.provider": ENV_CREDENTIALS,
        "fs.s3a.endpoint.region": "eu-west-1",
        "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.path.style.access": "true",
    }
    assert "secret" not in json.dumps(properties) and "k" not in properties.values()
    aws = s3a_properties(S3Settings(None, None, None, "us-east-1", None))
    assert aws == {
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider",
        "fs.s3a.endpoint.region": "us-east-1",
    }


def merge_version(
    log: DeltaLog, path: str, old: dict[str, Any] | None, new: dict[str, Any], removed_at: int = 1
) -> None:
    """A keyed batch's version as Delta's MERGE orders it: the file's add with its new vector first."""
    planned = log.snapshot()
    start = planned.committed.offsets[0]  # the next offset: the batch follows the table's
    marked = {**add(path, new), "size": 1, "stats": json.dumps({"numRecords": 10})}
    removed = {**add(path, old), "deletionTimestamp": removed_at}
    merged = [{"add": marked}, {"remove": removed}]
    assert commit_batch(log, planned, batch(start, start + 1), 1, [], merged=merged)


def test_the_replay_keeps_a_file_whose_merge_adds_its_new_vector_before_removing_the_old(
    tmp_path: Path,
) -> None:
    log = table_with_small_files(tmp_path)
    old, new = (vector(t) for t in WRITTEN)
    merge_version(log, "f0.parquet", None, old)
    files = LogFiles.read(log)
    assert files.live["f0.parquet"]["deletionVector"] == old
    assert files.vector_files() == {WRITTEN[old["pathOrInlineDv"]]}
    before = files.version
    merge_version(log, "f0.parquet", old, new)
    files.advance(log)
    assert files.version == before + 1 and files.live["f0.parquet"]["deletionVector"] == new
    assert set(files.removed_vectors) == {WRITTEN[old["pathOrInlineDv"]]}


def test_vacuum_keeps_the_vectors_of_live_files_and_of_files_removed_within_the_retention(
    tmp_path: Path,
) -> None:
    log = table_with_small_files(tmp_path)
    now = 10 * 3_600_000
    a, b = (vector(t) for t in WRITTEN)
    c, d, unnamed = (vector(f"0000000000000000000{i}") for i in (1, 2, 3))
    merge_version(log, "f0.parquet", None, a)
    merge_version(log, "f0.parquet", a, b, removed_at=now)  # a: removed within the retention
    merge_version(log, "f1.parquet", None, c)
    merge_version(log, "f1.parquet", c, d, removed_at=1)  # c: removed long before it
    for name in (vector_file(v) for v in (a, b, c, d, unnamed)):
        assert name is not None
        (tmp_path / name).write_bytes(b"v")
        os.utime(tmp_path / name, (1, 1))
    deleted = vacuum(log, retention_ms=3_600_000, now_ms=now)
    assert set(deleted) == {vector_file(c), vector_file(unnamed)}
    assert all((tmp_path / str(vector_file(v))).exists() for v in (a, b, d))
    assert LogFiles.read(log).live.keys() == {f"f{i}.parquet" for i in range(4)}


def test_a_pods_merge_gives_up_on_an_input_that_got_a_deletion_vector_since_its_plan(tmp_path: Path) -> None:
    log = table_with_small_files(tmp_path)
    files = LogFiles.read(log)
    paths = sorted(files.live)
    merge_version(log, "f0.parquet", None, vector(next(iter(WRITTEN))))  # a keyed batch marks rows of f0
    merged = tmp_path / "merged.parquet"
    pq.write_table(pa.table({"id": pa.array(list(range(40)), pa.int64())}), merged)
    made = AddFile("merged.parquet", merged.stat().st_size, 40).action()["add"]
    with pytest.raises(RewriteConflictError, match="no longer live"):
        commit_rewrite(log, files, paths, [made])


def test_a_new_table_has_no_vectors(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    create_table(log, SCHEMA, epoch=1, deletion_vectors=True)
    files = LogFiles.read(log)
    assert files.vector_files() == set() and files.removed_vectors == {}
