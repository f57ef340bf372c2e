"""Delta Lake tables on S3 (`spec.table.location: s3://...`), on the test stack's MinIO, filled from a real
Kafka topic by real Spark, exactly once (commit/DESIGN.md, "Delta tables on S3").

Proves: `icefall run` killed (status 137) at a Delta commit failpoint (its files uploaded, its log entry
not written) and run again, with its upkeep on (the compaction pods' merge and VACUUM), fills the table on
MinIO exactly once, by content (`icefall verify`, read with
delta-rs), credentials from the AWS_* environment only; and a paused writer whose replacement — another
process, another JVM (`icefall run`) — takes over and commits between the paused writer's prepare (epoch
checked, files uploaded) and its PUT of the log entry is refused: its PUT of the same version loses
(`If-None-Match`), the replacement's entry stays as written, and the paused writer raises FencedError;
`icefall purge` deletes a table's folders only when their logs' ids are the recorded ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from icefall.api.manifest import parse_manifest
from icefall.commands.delta import verify_delta_table
from icefall.commit import FencedError
from icefall.commit.delta import DeltaLog, create_table
from icefall.commit.delta_storage import S3Settings
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.ingest.delta_dead_letters import dead_letter_location
from icefall.ingest.delta_sink import DeltaIngestor
from icefall.plan.purge import EXIT_REFUSED
from icefall.runtime import failpoints
from icefall.testing.delta import aws_env, delta_ids, delta_manifest
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import produce, watermarks

pytestmark = pytest.mark.integration

BUCKET = "delta-lake"
SCHEMA_STRING = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


class S3Table:
    def __init__(self, kafka: KafkaBroker, store: ObjectStore, tmp_path: Path, name: str) -> None:
        store.filesystem().create_dir(BUCKET)
        self.kafka, self.store, self.topic = kafka, store, f"it-delta-s3-{name}"
        kafka.create_topic(self.topic, partitions=2)
        self.location = f"s3://{BUCKET}/{tmp_path.name}/{name}"
        self.manifest = tmp_path / "table.yaml"
        self.manifest.write_text(
            delta_manifest(name, kafka.bootstrap, self.topic, self.location, max_records=30)
        )
        self.st = parse_manifest(self.manifest.read_text())
        self.state = tmp_path / "state"

    def run(self, armed: str | None) -> subprocess.CompletedProcess[str]:
        return run_until_caught_up(
            self.manifest, self.state, armed, env=aws_env(self.store), maintenance=True
        )

    def ids(self) -> Counter[int]:
        return delta_ids(self.location, S3Settings.from_env(aws_env(self.store)).delta_rs_options())


@pytest.fixture
def s3_env(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for key, value in aws_env(object_store).items():
        monkeypatch.setenv(key, value)
    return object_store


def test_icefall_run_on_minio_killed_at_a_commit_point_then_run_again_is_exactly_once(
    kafka: KafkaBroker, s3_env: ObjectStore, spark: Any, tmp_path: Path
) -> None:
    table = S3Table(kafka, s3_env, tmp_path, "cli")
    produce(kafka, table.topic, 0, 90)
    killed = table.run("main.before-commit=exit@2")  # its files uploaded, its log entry not written
    assert killed.returncode == failpoints.EXIT_STATUS, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "failpoint main.before-commit triggered" in killed.stderr
    assert DeltaLog(table.location).snapshot().committed.offsets  # the batch before the kill landed
    done = table.run(None)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "upkeep on S3: Icefall's merge, checkpoints" in done.stdout  # not Delta Spark's (not conditional)
    assert table.ids() == Counter(range(90))
    assert DeltaLog(table.location).snapshot().committed.offsets == watermarks(kafka, table.topic)
    audit = verify_delta_table(table.st, table.state, spark=spark)
    assert audit.ok, audit.render()
    assert audit.content_checked and sum(p.in_table for p in audit.partitions) == 90
    assert not (tmp_path / "s3:").exists()  # nothing staged under a path named after the URI


def test_a_paused_writer_loses_the_put_of_a_version_another_process_committed(
    kafka: KafkaBroker, s3_env: ObjectStore, spark: Any, tmp_path: Path
) -> None:
    table = S3Table(kafka, s3_env, tmp_path, "fenced")
    produce(kafka, table.topic, 0, 20)
    lease = FileLease.in_dir(tmp_path / "old-lease", "commit", "paused", duration_seconds=30)
    old = DeltaIngestor(table.st, spark, lease, location=table.location)
    old.start(lease_timeout=5)
    claimed = DeltaLog(table.location).snapshot().version
    took_over: list[subprocess.CompletedProcess[str]] = []

    def replacement_commits(name: str) -> None:  # the old writer checked its epoch, uploaded its files
        took_over.append(table.run(None))  # another process and JVM: claims a higher epoch, commits all

    try:
        with failpoints.armed("main.before-commit", replacement_commits, hit=1), pytest.raises(FencedError):
            old.run_batch()
    finally:
        old.close()
    [replacement] = took_over
    assert replacement.returncode == 0, replacement.stdout[-3000:] + replacement.stderr[-3000:]
    # The version the old writer tried to create is the replacement's epoch claim, not overwritten.
    [entry] = [a for a in DeltaLog(table.location).actions(claimed + 1) if "metaData" in a]
    epoch = int(entry["metaData"]["configuration"]["icefall.epoch"])
    assert epoch > old.epoch, json.dumps(entry)
    assert table.ids() == Counter(range(20))
    assert DeltaLog(table.location).snapshot().committed.offsets == watermarks(kafka, table.topic)


def test_purge_deletes_the_folders_whose_log_ids_were_recorded_and_nothing_else(
    kafka: KafkaBroker, s3_env: ObjectStore, tmp_path: Path
) -> None:
    """`icefall purge` of a Delta table (`deletionPolicy: Delete`'s Job command, here with `-f`): refused with
    another id, nothing deleted; with the ids its driver reported, the table's and its dead-letter table's
    folders go, a sibling folder sharing the name's prefix stays."""
    table = S3Table(kafka, s3_env, tmp_path, "purged")
    dead = dead_letter_location(table.st, table.location)
    assert dead is not None
    ids = {}
    for folder in (table.location, dead):
        ids[folder] = create_table(DeltaLog(folder), SCHEMA_STRING, epoch=1).metadata["id"]
    fs = s3_env.filesystem()
    prefix = table.location.removeprefix("s3://")
    for key in (f"{prefix}/part-0.parquet", f"{prefix}-eu/_delta_log/00000000000000000000.json"):
        with fs.open_output_stream(key) as out:
            out.write(b"x")

    def purge(table_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "icefall.cli", "purge", "-f", str(table.manifest), "--state-dir",
             str(table.state), "--table-uuid", table_id, "--dead-letter-table-uuid", ids[dead]],
            capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **aws_env(s3_env)},
        )  # fmt: skip

    refused = purge("another-table")
    assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
    assert "nothing was deleted" in refused.stdout
    assert DeltaLog(table.location).snapshot().exists and DeltaLog(dead).snapshot().exists

    done = purge(ids[table.location])
    assert done.returncode == 0, done.stdout + done.stderr
    assert not DeltaLog(table.location).snapshot().exists and not DeltaLog(dead).snapshot().exists
    assert fs.get_file_info(f"{prefix}/part-0.parquet").type.name == "NotFound"
    assert fs.get_file_info(f"{prefix}-eu/_delta_log/00000000000000000000.json").type.name == "File"
