"""Continuous ingestion and the compaction worker, side by side as separate processes, never fight: real
Kafka, Spark and catalog, for a minute or two.

The deployment shape, locally: `icefall run --no-maintenance` ingests (a batch about every second: the
freshness target is 2 s) while `icefall compact` — the compaction pods' entry point, with file work Leases
and its own Spark — plans and runs maintenance on the same table and catalog. A producer streams into a
3-partition topic the whole time, so every batch adds up to 3 files to the table's one hot day partition.
Left alone, the worker sees a partition's 5th file right after the commit that adds it and is done before
the next batch stages, so the two would never overlap. So that compactions land between a batch's stage and
its commit (what has to be absorbed), both processes run with a failpoint that stalls them there: the
ingestion process `main.after-stage=sleep:3` (each staged batch waits 3 s before its compare-and-swap), the
worker `main.mid-rewrite=sleep:3` (its rewritten files wait 3 s before their commit). A compaction committed
while a batch waits makes that batch re-stage. Proves:
- the number of data files in the partition stays bounded (far below the files the commits added);
- every compaction commit kept the rows: the multiset of rows of each `replace` snapshot on `main` equals
  its parent's (time travel to both);
- no ingestion commit failed because of compaction: the ingestion process's own counters
  `icefall_ingest_commits_failed_by_maintenance_total` and `icefall_commits_refused_total` stay 0 (read
  from its metrics endpoint), and some commits were re-staged over a compaction
  (`icefall_ingest_commits_restaged_total` > 0);
- both processes stop cleanly on SIGTERM to their process groups (their JVMs get it too), and the table
  holds every record of the topic exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.manifest import ManifestContent
from pyiceberg.table.snapshots import ancestors_of

from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.procs import free_port
from icefall.testing.streams import assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration

# The stream runs until the evidence is there (at least MIN_SECONDS, at most MAX_SECONDS: the machine is
# shared, and a loaded one needs longer): MIN_COMPACTIONS compactions, a re-staged commit, and more files
# added than the bound.
MIN_SECONDS, MAX_SECONDS = 30.0, 300.0
MIN_COMPACTIONS = 2
RECORDS_PER_TICK = 12  # every 0.5 s: ~24 records/s over 3 Kafka partitions
# Files the partition may hold: below the compaction threshold (5 small files) plus the size tiers
# compaction leaves (each at least double the one below: a handful over ~100 commits), plus what commits
# add while a rewrite runs, with margin. Without compaction it grows by up to 3 with every commit.
MAX_FILES_PER_PARTITION = 14


def files_per_partition(table: Any) -> dict[str, int]:
    """Live data files of `main`'s head, per partition (read from its manifests)."""
    counts: dict[str, int] = defaultdict(int)
    snapshot = table.current_snapshot()
    for manifest in snapshot.manifests(table.io) if snapshot is not None else []:
        if manifest.content == ManifestContent.DATA:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                counts[repr(entry.data_file.partition)] += 1
    return dict(counts)


def files_added(table: Any) -> int:
    """What the partition would hold without compaction: every data file an ingestion commit added."""
    return sum(
        int(snapshot.summary.get("added-data-files") or 0)
        for snapshot in table.snapshots()
        if snapshot.summary is not None and snapshot.summary.operation.value == "append"
    )


def rows(table: Any, snapshot_id: int) -> Counter[str]:
    data = table.scan(snapshot_id=snapshot_id, selected_fields=("id", "customer", "amount", "_kafka"))
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in data.to_arrow().to_pylist())


def scrape(port: int) -> dict[str, float]:
    """The ingestion process's counters (`<name>{label=...}` → value) from its metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def counter(samples: dict[str, float], name: str, **labels: str) -> float:
    return samples.get(name + json.dumps(labels, sort_keys=True), 0.0)


def icefall(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "icefall.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: `stop` signals the group, as a supervisor does
        )


def stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the process group (the Spark JVM too); the batch or item in flight finishes first. SIGKILL
    to the group after a minute. Never raises: the caller's `finally` must stop every process."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def assert_stopped_cleanly(code: int | None, log: Path) -> None:
    """A clean exit on SIGTERM, without a traceback."""
    assert code == 0, f"exit {code}:\n{log.read_text()[-3000:]}"
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]


def test_ingestion_and_the_compaction_worker_side_by_side(
    kafka: KafkaBroker, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    topic, name = "it-compaction-continuous", "compaction_continuous"
    kafka.create_topic(topic, partitions=3)
    document = yaml.safe_load(manifest_text(name, topic, kafka.bootstrap, batch={"minIntervalSeconds": 0}))
    document["spec"]["table"]["catalog"] = {  # the session's catalog, so the checks below read the same
        "name": catalog_config.name,
        "type": "sql",
        "uri": catalog_config.uri,
        "warehouse": catalog_config.warehouse,
    }
    manifest = tmp_path / "table.yaml"
    manifest.write_text(yaml.safe_dump(document))
    identifier = ("it", name)
    label = "it." + name
    common = ("-f", str(manifest), "--state-dir", str(tmp_path), "--master", "local[1]")
    metrics_port = free_port()
    ingest_log, compact_log = tmp_path / "run.log", tmp_path / "compact.log"
    produce(kafka, topic, 0, RECORDS_PER_TICK)  # the table exists once the first batch commits
    ingestion = icefall(
        "run", *common, "--no-maintenance", "--metrics-port", str(metrics_port),
        log=ingest_log, env={"ICEFALL_FAILPOINTS": "main.after-stage=sleep:3"},
    )  # fmt: skip
    worker: subprocess.Popen[bytes] | None = None
    producing = threading.Event()
    producing.set()
    next_id = [RECORDS_PER_TICK]

    def producer() -> None:
        while producing.is_set():
            produce(kafka, topic, next_id[0], RECORDS_PER_TICK)
            next_id[0] += RECORDS_PER_TICK
            time.sleep(0.5)

    feeder = threading.Thread(target=producer, name="producer", daemon=True)
    try:
        deadline = time.monotonic() + 180
        while not catalog_config.pyiceberg().table_exists(identifier):
            assert ingestion.poll() is None, ingest_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "ingestion made no table:\n" + ingest_log.read_text()[-3000:]
            time.sleep(1)
        worker = icefall(
            "compact", *common, "--idle-seconds", "1",
            log=compact_log, env={"ICEFALL_FAILPOINTS": "main.mid-rewrite=sleep:3"},
        )  # fmt: skip
        feeder.start()
        started, peak = time.monotonic(), 0
        while True:
            assert ingestion.poll() is None, ingest_log.read_text()[-3000:]
            assert worker.poll() is None, compact_log.read_text()[-3000:]
            table = catalog_config.pyiceberg().load_table(identifier)
            peak = max(peak, *files_per_partition(table).values(), 0)
            compactions = replace_snapshots(table)
            restaged = counter(scrape(metrics_port), "icefall_ingest_commits_restaged_total", table=label)
            elapsed = time.monotonic() - started
            added = files_added(table)
            evidence = (
                len(compactions) >= MIN_COMPACTIONS and restaged > 0 and added > MAX_FILES_PER_PARTITION
            )
            if elapsed > MAX_SECONDS or (elapsed > MIN_SECONDS and evidence and added > 2 * peak):
                break
            time.sleep(1)
        producing.clear()
        feeder.join(30)
        high = watermarks(kafka, topic)
        # every batch still sleeps 3 s at main.after-stage, so catching up takes a while on a busy machine:
        # fail only when ingestion stops making progress
        committed, stalled_since = None, time.monotonic()
        while (offsets := read_committed(catalog_config.pyiceberg().load_table(identifier)).offsets) != high:
            if offsets != committed:
                committed, stalled_since = offsets, time.monotonic()
            assert ingestion.poll() is None, ingest_log.read_text()[-3000:]
            assert time.monotonic() - stalled_since < 90, (
                "ingestion stopped before catching up:\n" + ingest_log.read_text()[-3000:]
            )
            time.sleep(0.5)
        samples = scrape(metrics_port)
    finally:
        producing.clear()
        processes = ((worker, compact_log), (ingestion, ingest_log))
        codes = {log: stop(process) for process, log in processes if process is not None}
    for log, code in codes.items():
        assert_stopped_cleanly(code, log)

    table = catalog_config.pyiceberg().load_table(identifier)
    final, added, compactions = files_per_partition(table), files_added(table), replace_snapshots(table)
    restaged = counter(samples, "icefall_ingest_commits_restaged_total", table=label)
    failed = counter(samples, "icefall_ingest_commits_failed_by_maintenance_total", table=label)
    refused = sum(v for k, v in samples.items() if k.startswith("icefall_commits_refused_total"))
    summary = (
        f"{added} files added by ingestion, {len(compactions)} compaction commits by the worker; files per "
        f"partition: peak {peak}, at the end {final}; ingestion commits re-staged over maintenance "
        f"{restaged:.0f}, failed because of it {failed:.0f}, refused {refused:.0f}"
    )
    print("\n" + summary)  # shown with -s: the numbers behind the assertions

    assert failed == 0 and refused == 0, summary
    assert restaged > 0 and len(compactions) >= MIN_COMPACTIONS, summary
    assert len(final) == 1, summary
    assert peak <= MAX_FILES_PER_PARTITION < added, summary
    assert "CompactPartition done" in compact_log.read_text(), compact_log.read_text()[-3000:]
    assert_exactly_once(catalog_config, name, high, set(), bootstrap=kafka.bootstrap)
    for snapshot in compactions:
        assert snapshot.parent_snapshot_id is not None
        assert rows(table, snapshot.snapshot_id) == rows(table, snapshot.parent_snapshot_id), snapshot


def replace_snapshots(table: Any) -> list[Any]:
    """Compaction commits (`replace`) on `main`."""
    return [
        s
        for s in ancestors_of(table.current_snapshot(), table.metadata)
        if s.summary is not None and s.summary.operation.value == "replace"
    ]
