"""Delta Lake tables on Google Cloud Storage (`gs://`, fake-gcs-server) and Azure storage (`abfss://`,
Azurite), filled from a real Kafka topic by real Spark, exactly once (commit/DESIGN.md, "Delta tables on S3,
GCS and Azure"). Each test runs once per store.

Proves, with the settings from the environment only (`STORAGE_EMULATOR_HOST`; `AZURE_STORAGE_ENDPOINT` and
`AZURE_STORAGE_ACCOUNT_KEY`):
- the store's create-only write holds on the emulator: of writers creating one log entry at once exactly one
  wins (twice over: the raw `put_if_absent`, and `commit_batch` of two writers planned on one version, the
  loser refused with StaleHeadError), and the entry is the winner's;
- `icefall run` killed (status 137) at a Delta commit failpoint (its files uploaded, its log entry not
  written) and run again, with its upkeep on (the compaction pods' merge and VACUUM), resumes from the table
  and fills it exactly once, by content: read back by delta-rs with the same settings (`icefall verify`),
  the committed offsets the topic's end, and the driver's status reading (`DeltaMeter`) the same; the
  compaction pods' steps merge its small files (an OPTIMIZE commit) and VACUUM past the retention deletes
  the merged-away files and no live one, every row still once;
- `icefall purge`'s deletion (`purge_delta`) removes the table's folder only, with the recorded table id.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icefall.api.manifest import parse_manifest
from icefall.commands.delta import verify_delta_table
from icefall.commands.purge import purge_delta
from icefall.commit import StaleHeadError
from icefall.commit.batch import Batch
from icefall.commit.delta import AddFile, DeltaLog, commit_batch, create_table
from icefall.commit.delta_files import LogFiles
from icefall.commit.delta_storage import delta_rs_options, storage_for
from icefall.commit.lease import FileLease
from icefall.compact.delta_pods import DeltaPodRunner
from icefall.compact.worker import Outcome
from icefall.devstack.azurite import Azurite
from icefall.devstack.gcs import GcsEmulator
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.delta_meter import DeltaMeter
from icefall.plan.delta_maintenance import DeltaPolicy
from icefall.plan.names import table_leases
from icefall.runtime import failpoints
from icefall.testing.delta import delta_ids, delta_manifest
from icefall.testing.live_run import run_until_caught_up
from icefall.testing.streams import produce, watermarks

pytestmark = pytest.mark.integration

BUCKET = "delta-objects"
#: Small files merge at once: any two of them (the test's files are a few KiB).
POLICY = DeltaPolicy(target_file_size_bytes=4 * 2**20, min_files_to_compact=2, retention_ms=3_600_000)
FAR_FUTURE_MS = 10**13
SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


class Store:
    """One emulator as a Delta table sees it: a location's root and the environment that reaches it."""

    def __init__(self, name: str, root: str, env: dict[str, str]) -> None:
        self.name, self.root, self.env = name, root, env

    def location(self, tmp_path: Path, table: str) -> str:
        return f"{self.root}/{tmp_path.name}/{table}"


@pytest.fixture(params=["gcs", "azure"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    if request.param == "gcs":
        gcs: GcsEmulator = request.getfixturevalue("gcs")
        gcs.create_bucket(BUCKET)
        found = Store("GCS", f"gs://{BUCKET}", {"STORAGE_EMULATOR_HOST": gcs.endpoint})
    else:
        azurite: Azurite = request.getfixturevalue("azurite")
        if azurite.filesystem().get_file_info(BUCKET).type.name == "NotFound":
            azurite.create_container(BUCKET)
        env = {
            "AZURE_STORAGE_ENDPOINT": f"{azurite.endpoint}/{azurite.account}",
            "AZURE_STORAGE_ACCOUNT_KEY": azurite.account_key,  # the emulator's published key
        }
        found = Store("Azure", azurite.location(BUCKET), env)
    for key, value in found.env.items():
        monkeypatch.setenv(key, value)  # the test's own reads of the log, as a pod's from its Secret
    yield found


def test_one_of_concurrent_creators_of_a_log_entry_wins(store: Store, tmp_path: Path) -> None:
    storage = storage_for(store.location(tmp_path, "raw"))

    def create(name: str, i: int, results: dict[int, bool]) -> None:
        results[i] = storage.put_if_absent(name, f"writer {i}".encode())

    for version in range(5):
        name = f"_delta_log/{version:020d}.json"
        results: dict[int, bool] = {}
        writers = [threading.Thread(target=create, args=(name, i, results)) for i in range(4)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        [winner] = [i for i, won in results.items() if won]
        assert len(results) == 4 and storage.read(name) == f"writer {winner}".encode()
    assert not storage.put_if_absent("_delta_log/00000000000000000000.json", b"late")
    assert sorted(storage.list("_delta_log")) == [f"{v:020d}.json" for v in range(5)]


def test_two_writers_planned_on_one_version_commit_once(store: Store, tmp_path: Path) -> None:
    location = store.location(tmp_path, "race")
    planned = create_table(DeltaLog(location), SCHEMA, epoch=1)
    batch = Batch(topic="t", start={0: 0}, end={0: 10}, topic_id="tid", max_produce_time_ms=10)
    outcomes: dict[int, object] = {}

    def commit(i: int) -> None:
        try:
            log = DeltaLog(location)  # a writer of its own
            outcomes[i] = commit_batch(log, planned, batch, 1, [AddFile(f"part-{i}.parquet", 10, 10)])
        except StaleHeadError as error:
            outcomes[i] = error

    writers = [threading.Thread(target=commit, args=(i,)) for i in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    [winner] = [i for i, outcome in outcomes.items() if outcome == 1]
    assert [type(o) for i, o in outcomes.items() if i != winner] == [StaleHeadError]
    log = DeltaLog(location)
    assert log.latest_version() == 1
    assert [a["add"]["path"] for a in log.actions(1) if "add" in a] == [f"part-{winner}.parquet"]
    assert log.snapshot().committed.offsets == {0: 10}

    # `icefall purge` (deletionPolicy: Delete) with the recorded id deletes the table's folder, not a sibling.
    sibling = storage_for(f"{location}-eu")
    assert sibling.put_if_absent("_delta_log/00000000000000000000.json", b"{}")
    manifest = delta_manifest("race", "127.0.0.1:9", "unused", location, max_records=10)
    table_id = str((log.snapshot().metadata or {}).get("id"))
    args = argparse.Namespace(table_uuid=table_id, dead_letter_table_uuid=None)
    assert purge_delta(parse_manifest(manifest), location, args, print) == 0
    assert not DeltaLog(location).snapshot().exists and storage_for(location).list_tree() == {}
    assert sibling.list("_delta_log") == ["00000000000000000000.json"]


def test_icefall_run_killed_at_a_commit_point_then_run_again_is_exactly_once(
    kafka: KafkaBroker, store: Store, spark: Any, tmp_path: Path
) -> None:
    topic = f"it-delta-{store.name.lower()}-{tmp_path.name[-24:]}".replace("_", "-")
    kafka.create_topic(topic, partitions=2)
    location = store.location(tmp_path, "orders")
    manifest = tmp_path / "table.yaml"
    manifest.write_text(delta_manifest("orders", kafka.bootstrap, topic, location, max_records=30))
    state = tmp_path / "state"
    produce(kafka, topic, 0, 90)

    killed = run_until_caught_up(
        manifest, state, "main.before-commit=exit@2", env=store.env, maintenance=True
    )
    assert killed.returncode == failpoints.EXIT_STATUS, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert "failpoint main.before-commit triggered" in killed.stderr
    assert DeltaLog(location).snapshot().committed.offsets  # the batch before the kill landed

    done = run_until_caught_up(manifest, state, env=store.env, maintenance=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"upkeep on {store.name}: Icefall's merge and VACUUM" in done.stdout
    assert delta_ids(location, delta_rs_options(location)) == Counter(range(90))  # delta-rs, the emulator
    assert DeltaLog(location).snapshot().committed.offsets == watermarks(kafka, topic)
    st = parse_manifest(manifest.read_text())
    audit = verify_delta_table(st, state, spark=spark)
    assert audit.ok, audit.render()
    assert audit.content_checked and sum(p.in_table for p in audit.partitions) == 90
    # The driver's status report reads the same log (a cluster's `icefall ingest`).
    reading = DeltaMeter(st, location).read_once()
    assert reading is not None and reading.facts.offsets_by_topic == {topic: watermarks(kafka, topic)}
    table_id = (DeltaLog(location).snapshot().metadata or {}).get("id")
    assert reading.table.records == 90 and reading.table_uuid == table_id

    # The compaction pods' upkeep here: the small files merged (by the run's upkeep or these steps), then
    # VACUUM past the retention deletes the merged-away files and no live one.
    def leases(name: str) -> FileLease:
        return FileLease.in_dir(tmp_path / "work-leases", name, "pod-0", duration_seconds=60)

    pods = DeltaPodRunner(location, POLICY, leases, table_leases=table_leases(st), label="orders")
    while (step := pods.step()).result is not None:
        assert step.result.outcome is Outcome.DONE, step.result
    log = DeltaLog(location)
    operations = [
        a["commitInfo"]["operation"]
        for version in range(log.latest_version() + 1)
        for a in log.actions(version)
        if "commitInfo" in a
    ]
    assert "OPTIMIZE" in operations, operations
    files = LogFiles.read(log)
    vacuum = pods.run_item(pods.plan(FAR_FUTURE_MS)[-1], FAR_FUTURE_MS)
    assert vacuum.kind == "Vacuum" and len(vacuum.deleted_paths) >= len(files.removed) > 0, vacuum
    assert not set(vacuum.deleted_paths) & set(files.live)
    assert delta_ids(location, delta_rs_options(location)) == Counter(range(90))
