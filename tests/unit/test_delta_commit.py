"""The Delta commit protocol (`icefall.commit.delta`) on a table folder, without Spark: the offsets and the
epoch travel in the Metadata action of the commit that adds the rows; a commit planned on a version that
another ingestion commit followed is refused, one after a commit that leaves `icefall.*` alone lands on top
of it; an older epoch is fenced; the state survives a checkpoint whose older commits are cleaned up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icefall.api.delta_partitions import delta_partitions
from icefall.api.manifest import parse_manifest
from icefall.commit import FencedError, OffsetGapError, StaleHeadError
from icefall.commit.batch import Batch
from icefall.commit.delta import (
    AddFile,
    DeltaLog,
    claim_epoch,
    commit_batch,
    create_table,
    moved_into,
    partition_values,
    protocol_for,
)

pytestmark = pytest.mark.unit

SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


def batch(start: int, end: int, topic_id: str = "tid") -> Batch:
    return Batch(topic="t", start={0: start}, end={0: end}, topic_id=topic_id, max_produce_time_ms=end)


def test_a_commit_holds_rows_offsets_and_epoch_in_one_log_entry(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, SCHEMA, epoch=3)
    assert planned.version == 0 and planned.committed.epoch == 3
    version = commit_batch(log, planned, batch(0, 10), 3, [AddFile("part-1.parquet", 100, 10)])
    assert version == 1
    actions = log.actions(1)
    kinds = [next(iter(a)) for a in actions]
    assert kinds == ["commitInfo", "metaData", "add"]
    config = actions[1]["metaData"]["configuration"]
    assert json.loads(config["icefall.offsets"]) == {"0": 10}
    assert config["icefall.topic-id"] == "tid" and config["icefall.epoch"] == "3"
    assert json.loads(actions[2]["add"]["stats"]) == {"numRecords": 10}
    resumed = log.snapshot().committed
    assert resumed.offsets == {0: 10} and resumed.snapshot_id == 1


def test_a_batch_planned_before_another_ingestion_commit_is_refused(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, SCHEMA, epoch=1)
    commit_batch(log, planned, batch(0, 10), 1, [])
    with pytest.raises(StaleHeadError):
        commit_batch(log, planned, batch(0, 10), 1, [AddFile("part-2.parquet", 1, 1)])
    with pytest.raises(OffsetGapError):
        commit_batch(log, log.snapshot(), batch(5, 12), 1, [])
    assert log.latest_version() == 1


def test_a_commit_that_leaves_icefall_state_alone_is_committed_over(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, SCHEMA, epoch=1)
    # Someone else (OPTIMIZE, say) commits version 1 between planning and committing.
    assert log.try_commit(1, [{"commitInfo": {"operation": "OPTIMIZE"}}])
    assert commit_batch(log, planned, batch(0, 4), 1, [AddFile("p.parquet", 1, 4)]) == 2
    assert log.snapshot().committed.offsets == {0: 4}


def test_a_merge_commits_with_its_offsets_only_on_the_version_it_was_computed_on(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, SCHEMA, epoch=1, deletion_vectors=True)
    assert planned.configuration["delta.enableDeletionVectors"] == "true"
    assert planned.protocol is not None and "deletionVectors" in planned.protocol["writerFeatures"]
    merged = [{"remove": {"path": "a.parquet"}}, {"add": {"path": "a.parquet", "deletionVector": {}}}]
    # An OPTIMIZE landed since: the MERGE's deletion vectors may name files it replaced.
    assert log.try_commit(1, [{"commitInfo": {"operation": "OPTIMIZE"}}])
    with pytest.raises(StaleHeadError, match="MERGE"):
        commit_batch(log, planned, batch(0, 4), 1, [], merged=merged)
    version = commit_batch(log, log.snapshot(), batch(0, 4), 1, [], merged=merged)
    actions = log.actions(version)
    assert [next(iter(a)) for a in actions] == ["commitInfo", "metaData", "remove", "add"]
    assert actions[0]["commitInfo"]["operation"] == "MERGE"
    assert log.snapshot().committed.offsets == {0: 4}


def test_an_older_epoch_is_fenced(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, SCHEMA, epoch=1)
    claim_epoch(log, 2)  # a newer writer took over
    with pytest.raises(FencedError):
        commit_batch(log, planned, batch(0, 4), 1, [])
    with pytest.raises(FencedError):
        claim_epoch(log, 1)
    assert log.snapshot().committed.epoch == 2


def test_the_state_survives_a_checkpoint_and_log_cleanup(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    log = DeltaLog(str(tmp_path))
    commit_batch(log, create_table(log, SCHEMA, epoch=1), batch(0, 7), 1, [])
    metadata = log.actions(1)[1]["metaData"]
    protocol = log.actions(0)[1]["protocol"]
    # A checkpoint at version 2 (as Spark writes one), then the JSON commits up to it cleaned up.
    log.try_commit(2, [{"commitInfo": {"operation": "OPTIMIZE"}}])
    rows = [
        {  # pyarrow writes the maps as key-value pairs, as it reads Spark's
            "metaData": {
                **metadata,
                "format": {"provider": "parquet", "options": [("k", "v")]},
                "configuration": list(metadata["configuration"].items()),
            },
            "protocol": None,
        },
        {"metaData": None, "protocol": protocol},
    ]
    pq.write_table(pa.Table.from_pylist(rows), log.log_dir / f"{2:020d}.checkpoint.parquet")
    for version in (0, 1):
        (log.log_dir / f"{version:020d}.json").unlink()
    (log.log_dir / f"{2:020d}.json").unlink()
    log.try_commit(3, [{"commitInfo": {"operation": "OPTIMIZE"}}])
    snapshot = log.snapshot()
    assert snapshot.version == 3 and snapshot.committed.offsets == {0: 7}
    # A commit carries the Metadata on as Delta's JSON has it: maps as objects (delta-rs refuses lists).
    assert snapshot.metadata is not None and snapshot.metadata["format"]["options"] == {"k": "v"}


def test_protocol_needs_timestamp_ntz_feature_only_for_such_columns() -> None:
    assert protocol_for(SCHEMA) == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert protocol_for('{"type":"timestamp_ntz"}')["readerFeatures"] == ["timestampNtz"]
    keyed = protocol_for(SCHEMA, deletion_vectors=True)
    assert keyed["readerFeatures"] == ["deletionVectors"]
    assert keyed["writerFeatures"] == ["appendOnly", "invariants", "deletionVectors"]
    generated = (
        '{"name":"ts_day","type":"date","metadata":{"delta.generationExpression":"CAST(`ts` AS DATE)"}}'
    )
    assert protocol_for(generated) == {"minReaderVersion": 1, "minWriterVersion": 4}
    both = protocol_for(generated + '{"type":"timestamp_ntz"}')
    assert both["writerFeatures"] == ["appendOnly", "invariants", "generatedColumns", "timestampNtz"]


def test_partition_transforms_map_to_generated_columns_delta_derives_filters_from() -> None:
    from icefall.api import ManifestError
    from icefall.api.table import PartitionField

    fields = [("customer", "identity"), *(("ts", t) for t in ("year", "month", "day", "hour"))]
    parts = [PartitionField(field=f, transform=t) for f, t in [*fields, ("customer", "truncate[3]")]]
    assert [(p.column, p.expression, p.spark_type) for p in delta_partitions(parts)] == [
        ("customer", None, None),
        ("ts_year", "YEAR(`ts`)", "integer"),
        ("ts_month", "DATE_FORMAT(`ts`, 'yyyy-MM')", "string"),
        ("ts_day", "CAST(`ts` AS DATE)", "date"),
        ("ts_hour", "DATE_FORMAT(`ts`, 'yyyy-MM-dd-HH')", "string"),
        ("customer_trunc", "SUBSTRING(`customer`, 1, 3)", "string"),
    ]
    named = PARTITIONED.replace(
        "- {name: ts, type: timestamptz}",
        "- {name: ts, type: timestamptz}\n      - {name: ts_day, type: date}",
    )
    with pytest.raises(ManifestError, match=r"is the Delta column ts_day, which spec\.format\.schema has"):
        parse_manifest(named % ("[{field: ts, transform: day}]", "", ""))


DELTA = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "127.0.0.1:9092", topic: orders}
  format: {type: json, schema: [{name: id, type: long}]}
  table: {format: delta%s}
%s
"""


def problems_of(table_extra: str = "", spec_extra: str = "") -> str:
    from icefall.api import ManifestError

    try:
        parse_manifest(DELTA % (table_extra, spec_extra))
    except ManifestError as error:
        return str(error)
    return ""


def test_delta_spec_refuses_what_is_not_supported_yet() -> None:
    assert problems_of() == ""
    assert "spec.table.catalog" in problems_of(", catalog: {name: c, uri: 'sqlite:////tmp/c.db'}")
    assert problems_of(", partitioning: [{field: id, transform: identity}]") == ""
    assert "spec.mode" not in problems_of(spec_extra="  mode: upsert\n  key: [id]")  # MERGE: delta_keyed
    assert problems_of(", location: gs://bucket/orders") == ""  # tests/unit/test_delta_objectstore_api.py
    assert "spec.table.location" in problems_of(", location: s3://bucket")  # a folder in the bucket
    assert "spec.table.location" in problems_of(", location: https://bucket/orders")
    assert problems_of(", location: /data/orders") == ""
    assert problems_of(", location: s3://lake/tables/orders") == ""


def test_a_delta_table_takes_a_dead_letter_topic_with_or_without_its_dead_letter_table() -> None:
    # At least once, as for an Iceberg table (ingest/delta_dead_letters.py); no longer refused.
    for extra in ("  deadLetter: {topic: bad}", "  deadLetter: {topic: bad, table: {enabled: false}}"):
        assert problems_of(spec_extra=extra) == ""
        st = parse_manifest(DELTA % ("", extra))
        assert st.spec.dead_letter.topic == "bad" and st.spec.dead_letter.enabled
    assert "must differ from the source topic" in problems_of(spec_extra="  deadLetter: {topic: orders}")


def test_keyed_delta_tables_are_taken_on_s3_and_partitioned_not_on_other_stores() -> None:
    from icefall.api.spec import delta_spec_problems

    keyed = "  mode: upsert\n  key: [id]"
    keyed_delta = DELTA.replace("type: long}", "type: long, required: true}")
    for table in (
        ", location: s3://lake/orders",
        ", location: /data/orders",
        ", partitioning: [{field: id}]",
    ):
        assert parse_manifest(keyed_delta % (table, keyed)).spec.key == ["id"]
    spec = parse_manifest(keyed_delta % (", location: s3://lake/orders", keyed)).spec
    elsewhere = spec.model_copy(update={"table": spec.table.model_copy(update={"location": "gs://b/orders"})})
    [(where, problem)] = delta_spec_problems(elsewhere)  # a store the MERGE's S3A cannot read
    assert where == ("table", "location") and "on GCS or Azure are not supported yet; use s3://" in problem


def test_s3_settings_come_from_the_aws_environment_and_reach_delta_rs() -> None:
    from icefall.commit.delta_storage import S3Settings

    minio = S3Settings.from_env(
        {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    )
    assert minio.delta_rs_options() == {
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ALLOW_HTTP": "true",
    }
    assert S3Settings.from_env({"AWS_REGION": "eu-west-1"}).delta_rs_options() == {"AWS_REGION": "eu-west-1"}


def test_location_is_for_delta_only() -> None:
    from icefall.api import ManifestError

    text = DELTA.replace("format: delta", "name: orders") % (", location: /data/orders", "")
    with pytest.raises(ManifestError, match=r"spec\.table\.location.*format delta"):
        parse_manifest(text)


def test_a_deleted_keys_file_outside_the_tables_folder_is_not_read(tmp_path: Path) -> None:
    import pyarrow as pa

    from icefall.ingest.delta_keyed import load_deleted_keys, store_deleted_keys

    log, other = DeltaLog(str(tmp_path / "t")), DeltaLog(str(tmp_path / "other"))
    stored = store_deleted_keys(log, tmp_path / "staging", pa.table({"id": [1, 2]}))
    assert stored.startswith(str(tmp_path / "t" / "_icefall_deleted_keys"))  # a local path, as before
    assert load_deleted_keys(log, stored).num_rows == 2  # type: ignore[union-attr]
    assert load_deleted_keys(log, None) is None
    elsewhere = store_deleted_keys(other, tmp_path / "staging", pa.table({"id": [3]}))
    with pytest.raises(ValueError, match="outside"):
        load_deleted_keys(log, elsewhere)
    with pytest.raises(ValueError, match="outside"):
        load_deleted_keys(log, str(tmp_path / "t" / "_icefall_deleted_keys" / ".." / "x.parquet"))


def test_a_deleted_keys_uri_on_s3_must_be_in_the_tables_own_folder() -> None:
    from icefall.ingest.delta_keyed import deleted_keys_relative

    log = DeltaLog("s3://lake/tables/orders")
    named = "s3://lake/tables/orders/_icefall_deleted_keys/a.parquet"
    assert deleted_keys_relative(log, named) == "_icefall_deleted_keys/a.parquet"
    for outside in (
        "s3://lake/tables/orders-eu/_icefall_deleted_keys/a.parquet",
        "s3://lake/tables/orders/_icefall_deleted_keys/../../x.parquet",
        "s3://lake/tables/orders/_icefall_deleted_keys/",
        "/etc/passwd",
    ):
        with pytest.raises(ValueError, match="outside"):
            deleted_keys_relative(log, outside)


PARTITIONED = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "127.0.0.1:9092", topic: orders}
  format:
    type: json
    schema:
      - {name: id, type: long, required: true}
      - {name: customer, type: string}
      - {name: ts, type: timestamptz}
      - {name: s, type: struct, fields: [{name: a, type: int}]}
  table: {format: delta, partitioning: %s%s}
%s
"""


def partition_problems(partitioning: str, table_extra: str = "", spec_extra: str = "") -> str:
    from icefall.api import ManifestError

    try:
        parse_manifest(PARTITIONED % (partitioning, table_extra, spec_extra))
    except ManifestError as error:
        return str(error)
    return ""


def test_a_delta_table_is_partitioned_by_columns_and_transforms_delta_readers_derive_filters_from() -> None:
    assert partition_problems("[{field: customer}, {field: id}]") == ""
    assert (
        partition_problems("[{field: ts, transform: day}, {field: customer, transform: 'truncate[2]'}]") == ""
    )
    bucket = partition_problems("[{field: id, transform: 'bucket[4]'}]")
    assert (
        "spec.table.partitioning[0].transform: bucket[4](id): a Delta table has no hash partitioning"
        in bucket
    )
    assert "id is a long; a Delta table truncates strings only" in partition_problems(
        "[{field: id, transform: 'truncate[10]'}]"
    )
    assert "columns of type boolean, date, int, long, string" in partition_problems("[{field: ts}]")
    assert "top-level columns only" in partition_problems("[{field: s.a}]")
    assert "OPTIMIZE refuses to Z-order by it" in partition_problems(
        "[{field: customer}]", ", sortOrder: [{field: customer}]"
    )
    assert partition_problems("[{field: customer}]", ", sortOrder: [{field: id}]") == ""
    assert partition_problems("[{field: customer}]", spec_extra="  mode: upsert\n  key: [id]") == ""


def test_partition_values_come_from_sparks_folders_and_travel_in_the_add_action(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert partition_values("c=a%3Ab/d=__HIVE_DEFAULT_PARTITION__/part-0.parquet") == {"c": "a:b", "d": None}
    assert partition_values("part-0.parquet") == {}
    staging = tmp_path / "staging"
    for folder, rows in (("customer=c%3A1", 2), ("customer=c2", 0), ("customer=c3", 1)):
        (staging / folder).mkdir(parents=True)
        pq.write_table(pa.table({"id": list(range(rows))}), staging / folder / "part-0.parquet")
    log = DeltaLog(str(tmp_path / "table"))
    planned = create_table(log, SCHEMA, epoch=1, partition_columns=["customer"])
    assert planned.partition_columns == ["customer"]
    files = moved_into(staging, log)  # the file without rows is dropped
    assert [(f.path, dict(f.partition_values), f.records) for f in files] == [
        ("customer=c%3A1/part-0.parquet", {"customer": "c:1"}, 2),
        ("customer=c3/part-0.parquet", {"customer": "c3"}, 1),
    ]
    assert (tmp_path / "table" / "customer=c%3A1" / "part-0.parquet").is_file()
    commit_batch(log, planned, batch(0, 3), 1, files)
    adds = [a["add"] for a in log.actions(1) if "add" in a]
    # Delta's paths are URIs: the folder's literal %3A is %253A in the log.
    assert [(a["path"], a["partitionValues"]) for a in adds] == [
        ("customer=c%253A1/part-0.parquet", {"customer": "c:1"}),
        ("customer=c3/part-0.parquet", {"customer": "c3"}),
    ]
    assert log.actions(0)[0]["commitInfo"]["operationParameters"]["partitionBy"] == '["customer"]'


def test_a_spec_whose_partitioning_is_not_the_tables_is_refused_at_start() -> None:
    from icefall.commit.delta import DeltaSnapshot
    from icefall.commit.errors import LayoutChangedError
    from icefall.ingest.delta_sink import _check_partitioning

    table = DeltaSnapshot(3, {"partitionColumns": ["customer"]})
    _check_partitioning(table, ["customer"], ["id", "customer"], "/t")
    with pytest.raises(
        LayoutChangedError, match=r"partitioned by \['customer'\], spec.table.partitioning by "
    ):
        _check_partitioning(table, [], ["id", "customer"], "/t")
    with pytest.raises(LayoutChangedError, match=r"names \['region'\], not columns of the table's rows"):
        _check_partitioning(DeltaSnapshot(0, {}), ["region"], ["id"], "/t")


def test_a_commit_reads_only_the_versions_since_the_last_snapshot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a checkpoint the Protocol is only in version 0: a log that walked back to it for every commit
    made each commit cost more than the last. The same answers as a log read from scratch."""
    log = DeltaLog(str(tmp_path))
    create_table(log, SCHEMA, epoch=1)
    read: list[int] = []
    actions = log.actions
    monkeypatch.setattr(log, "actions", lambda version: read.append(version) or actions(version))
    for n in range(30):
        read.clear()
        commit_batch(log, log.snapshot(), batch(n, n + 1), 1, [AddFile(f"f{n}.parquet", 10, 1)])
        assert len(read) <= 2, read  # the version just committed (and at most one more), never back to 0
    fresh = DeltaLog(str(tmp_path)).snapshot()
    assert log.snapshot() == fresh and fresh.committed.offsets == {0: 30}
    # Another table at the location (deleted and created again, same versions reached): read it whole.
    other = DeltaLog(str(tmp_path / "other"))
    create_table(other, SCHEMA.replace('"long"', '"integer"'), epoch=1)
    for n in range(31):
        commit_batch(other, other.snapshot(), batch(n, n + 1), 1, [AddFile(f"g{n}.parquet", 10, 1)])
    monkeypatch.setattr(log, "storage", other.storage)
    assert log.snapshot() == other.snapshot() != fresh
