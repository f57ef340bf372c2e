"""Resource faults under a running `icefall run`: a paused writer racing orphan removal, its spill disk full,
its clock skewed. Exactly once by content after each, with no person in the loop.

Each test starts one `icefall run` process (local Spark, as a user starts it) on a table fed by the `kafka`
fixture, makes the fault happen at a moment it makes sure of (a failpoint, a log line), ends the fault,
and then the table must hold every record exactly once: by offset and by `icefall verify` (the auditor,
by content). Each test prints the time the run took to recover after the fault ended.

Proves:
- a writer held (failpoint `main.before-commit=sleep`) after its cdc batch is staged and its deleted keys
  file written, while orphan removal runs with its clock past the safety window (as if the writer had
  been paused longer than the window, or the maintenance clock ran ahead): the staged data files survive
  (the staging branch references them); the deleted keys file, referenced by nothing until the commit,
  is removed, and the commit is refused for it ("were removed before it committed") and the batch
  written again, never a committed state naming a deleted file;
- Spark's local dirs (`SPARK_LOCAL_DIRS`) on a small tmpfs filled while a cdc table ingests: the MERGE's
  shuffle fails with "No space left on device", the run logs "local disk <dir> is full" once per attempt
  (the driver's status says `local_disk`: condition reason LocalDiskFull), commits nothing, and goes on
  by itself once the filler is deleted. An append batch writes nothing there (no shuffle); in local mode
  Spark copies its jars there at start (about 210 MB), so the disk is sized for them;
- the table's last commit from a host 90 s ahead (a pyiceberg commit with its clock shifted), then the
  writer on the right clock, 90 s behind it: it logs "this host's clock is behind the table" and waits
  until its clock passes that commit (about 30 s), never writing metadata Iceberg Java refuses; a process
  whose clock is 90 s ahead (a `sitecustomize` shifting `time` and `datetime.now`) cannot take the
  lease it holds; freshness is never negative. Not libfaketime: under it CPython 3.11's `time.sleep`
  fails (EINVAL) and a local Spark JVM never registers its block manager;
- (`long`) Spark in local-cluster mode, its executor JVM SIGKILLed (status 137, as the OOM killer ends it)
  while batches run: Spark logs "Lost executor 0 ... exited with code 137", launches another, the batch's
  tasks run again (13 s for that batch), and the table is exactly once: no Icefall change was needed;
- (`long`) a network partition between the driver and its executor (local-cluster mode, Spark's driver RPC
  and block manager ports and the executor's pinned, every packet to or from them dropped on loopback
  with iptables, so connections hang as on a dropped network, never refused) from the moment a batch's
  task runs until past `spark.network.timeout`: Spark logs "Lost executor 0 ...: Executor heartbeat timed
  out"; a task that was running counts as failed (one still launching does not, so a partition that
  starts between batches costs Spark a new executor and nothing more). With `spark.task.maxFailures` 1
  (as a network flapping 4 times within a batch) the job aborts: the run logs "lost its Spark executors"
  once per attempt (status `executors`: condition reason ExecutorsLost), commits nothing, and catches up
  by itself once the partition heals; exactly once. Before, that abort ended `icefall run`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.state import DELETED_KEYS
from icefall.compact.view import canonical_path, read_table_view, to_local_path
from icefall.compact.worker import run_item
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.maintenance import plan_orphans
from icefall.plan.maintenance_items import HOUR_MS, MaintenancePolicy
from icefall.testing.live_run import LiveRun
from icefall.testing.resource_faults import commit_from_a_clock_ahead, dropped
from icefall.testing.streams import NAMESPACE, assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration

BATCH = {"maxRecords": 40, "minIntervalSeconds": 0}
CDC = "  mode: cdc\n  key: [id]\n  sequenceBy: [source.lsn]\n"


@contextmanager
def live_run(
    kafka: KafkaBroker,
    tmp_path: Path,
    name: str,
    env: dict[str, str],
    *,
    extra: str = "",
    records: int = 0,
) -> Iterator[LiveRun]:
    """`icefall run` on a new topic into `it.<name>` of the embedded catalog (`extra` appended to the
    manifest's spec), `records` clean records produced first; stopped on the way out."""
    topic = f"it-res-{name.replace('_', '-')}"
    kafka.create_topic(topic, partitions=2)
    if records:
        produce(kafka, topic, 0, records)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap, batch=BATCH) + extra)
    state = tmp_path / "state"
    config = CatalogConfig.embedded(state)
    assert load_manifest(manifest).spec  # the manifest is valid before a process is started on it
    run = LiveRun(manifest, config=config, kafka=kafka, name=name, topic=topic, state=state, env=env)
    try:
        yield run
    finally:
        run.stop()


def verify(run: LiveRun, env: dict[str, str] | None = None) -> None:
    """`icefall verify` (the auditor, by content) passes on the run's table."""
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "verify", "-f", str(run.manifest),
         "--state-dir", str(run.state)],
        capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "by content: OK" in done.stdout or done.stdout.rstrip().endswith("OK"), done.stdout


def send_cdc(kafka: KafkaBroker, topic: str, start: int, count: int) -> None:
    """`count` Debezium events of 15 keys on both partitions, positioned by `source.lsn`; every 4th a delete
    (so each batch of the table remembers deleted keys in a file of its own)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(start, start + count):
        key = i % 15
        image = {"id": key, "customer": f"c{i}", "amount": round(i * 1.25, 2), "ts": "2026-11-22T10:00:00Z"}
        op, before, after = ("d", image, None) if i % 4 == 0 else ("u", None, image)
        event = {"op": op, "before": before, "after": after, "source": {"lsn": 1000 + i}}
        producer.produce(topic, key=json.dumps({"id": key}), value=json.dumps(event), partition=i % 2)
    assert producer.flush(30) == 0


def staged_data_files(run: LiveRun) -> set[str]:
    """The data files the table's staging branches reference beyond `main` (batches not yet committed)."""
    table = run.config.pyiceberg().load_table((NAMESPACE, run.name))
    view = read_table_view(table, list_storage=False)
    on_main = {f.path for f in view.files}
    staged: set[str] = set()
    for name, ref in table.metadata.refs.items():
        if name.startswith("icefall_stage_"):
            for task in table.scan(snapshot_id=ref.snapshot_id).plan_files():
                staged.add(task.file.file_path)
    return {canonical_path(p) for p in staged} - on_main


def named_deleted_keys(table: Any) -> set[str]:
    """Every deleted keys file a metadata file of the table's history names (each a committed state)."""
    files = [table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)]
    named = set()
    for file in files:
        properties = json.loads(Path(to_local_path(canonical_path(file)) or "").read_text())["properties"]
        if DELETED_KEYS in properties:
            named.add(canonical_path(properties[DELETED_KEYS]))
    assert named, "no committed state named a deleted keys file"
    return named


def test_orphan_removal_while_a_writer_is_paused_before_its_commit(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    name = "res_orphans"
    # Held 30 s before its 2nd main commit: the batch is on its staging branch, its deleted keys written.
    env = {"ICEFALL_FAILPOINTS": "main.before-commit=sleep:30@2"}
    with live_run(kafka, tmp_path, name, env, extra=CDC) as run:
        send_cdc(kafka, run.topic, 0, 160)
        run.wait_for(
            "held before its 2nd commit", lambda: "main.before-commit triggered (hit 2)" in run.text()
        )
        table = run.config.pyiceberg().load_table((NAMESPACE, name))
        staged = staged_data_files(run)
        assert staged, "nothing staged at the held commit"
        # Orphan removal with its clock 2 h ahead: past the 1 h window for every file of the held batch.
        later = int(time.time() * 1000) + 2 * HOUR_MS
        item = plan_orphans(read_table_view(table), MaintenancePolicy(orphan_min_age_ms=HOUR_MS), later)
        assert item is not None, "no orphan planned: the held batch's deleted keys file should look like one"
        result = run_item(cast(Any, None), run.config, (NAMESPACE, name), item)  # orphans need no Spark
        removed = set(result.deleted_paths)
        assert not removed & staged, f"staged data files removed: {sorted(removed & staged)}"
        assert all(Path(to_local_path(p) or "").exists() for p in staged)
        assert any("icefall-deleted-keys-" in p for p in removed), sorted(removed)
        fault_over = time.monotonic()
        run.wait_for("the held commit refused", lambda: "removed before it committed" in run.text(), 120)
        send_cdc(kafka, run.topic, 160, 40)
        run.wait_caught_up()
        recovered = time.monotonic() - fault_over
        run.stop()
        assert "Traceback" not in run.text(), run.tail()
    final = run.config.pyiceberg().load_table((NAMESPACE, name))
    named = named_deleted_keys(final)
    assert not named & removed, f"a committed state named a removed file: {sorted(named & removed)}"
    committed = read_committed(final)
    assert committed.deleted_keys and Path(to_local_path(committed.deleted_keys) or "").exists()
    assert dict(committed.offsets) == watermarks(kafka, run.topic)
    verify(run)
    print(f"\n[orphans] recovered {recovered:.1f}s after the orphan removal ended")


def test_a_batch_staged_longer_ago_than_half_the_orphan_window_is_written_again(tmp_path: Path) -> None:
    """The age floor: a writer held (GC pause, stopped node) longer than MAX_STAGE_SECONDS since its stage
    was made may have had files taken by orphan removal (inside Spark's write they are referenced by
    nothing): its commit is refused, `main` unchanged, and the batch written again lands once."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    from icefall.commit import Batch, StageExpiredError, commit_staged, prepare_stage, stage_branch_name
    from icefall.commit.protocol import MAX_STAGE_SECONDS

    assert MAX_STAGE_SECONDS * 1000 * 2 <= HOUR_MS  # half the orphan window's floor, at most
    (tmp_path / "warehouse").mkdir()
    catalog = load_catalog(
        "icefall",
        type="sql",
        uri=f"sqlite:///{tmp_path / 'c.db'}",
        warehouse=(tmp_path / "warehouse").as_uri(),
    )
    catalog.create_namespace("lake")
    schema = pa.schema([pa.field("partition", pa.int32(), False), pa.field("offset", pa.int64(), False)])
    table = catalog.create_table(("lake", "aged"), schema)

    def staged(attempt: int, *, held: float) -> tuple[Any, Batch]:
        stage = prepare_stage(table, stage_branch_name("w", attempt))
        stage = replace(stage, prepared_at=stage.prepared_at - held)
        batch = Batch("t", start={0: 0}, end={0: 3})
        rows = pa.Table.from_pylist([{"partition": 0, "offset": o} for o in range(3)], schema=schema)
        table.append(rows, branch=stage.branch)
        return stage, batch

    stage, batch = staged(1, held=MAX_STAGE_SECONDS + 1)
    head = table.refresh().metadata.current_snapshot_id
    with pytest.raises(StageExpiredError, match="removed before it committed"):
        commit_staged(table, stage, batch, 1)
    assert table.refresh().metadata.current_snapshot_id == head
    stage, batch = staged(2, held=MAX_STAGE_SECONDS - 60)
    commit_staged(table, stage, batch, 1)
    assert sorted(table.refresh().scan().to_arrow().column("offset").to_pylist()) == [0, 1, 2]
    assert read_committed(table).offsets == {0: 3}


@contextmanager
def small_disk(path: Path, size: str = "300m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (root only), unmounted on the way out."""
    if os.geteuid() != 0:
        pytest.fail("mounting a small filesystem needs root: run the tests as root, as CI does")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Write a file on `disk` until it is full (to the last byte); the file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def test_the_drivers_spill_disk_full(kafka: KafkaBroker, tmp_path: Path) -> None:
    """Spark's local dirs on a small tmpfs, filled while a cdc table (each batch a MERGE, whose shuffle
    Spark writes there; an append batch writes nothing there) ingests: the run waits with one line naming
    the disk, commits nothing meanwhile, and goes on by itself once space is freed; exactly once."""
    with small_disk(tmp_path / "spill") as disk:  # room for Spark's copy of the jars (local mode), no more
        env = {"SPARK_LOCAL_DIRS": str(disk)}
        with live_run(kafka, tmp_path, "res_disk", env, extra=CDC) as run:
            send_cdc(kafka, run.topic, 0, 80)
            run.wait_caught_up()
            filler = fill(disk)
            send_cdc(kafka, run.topic, 80, 80)
            run.wait_for("the full disk named", lambda: f"local disk {disk} is full" in run.text(), 180)
            assert dict(run.committed()) != watermarks(kafka, run.topic)
            filler.unlink()
            freed = time.monotonic()
            run.wait_caught_up()
            recovered = time.monotonic() - freed
            run.stop()
            assert "Traceback" not in run.text(), run.tail()
        assert sum(watermarks(kafka, run.topic).values()) == 160
        verify(run)
    print(f"\n[spill disk] recovered {recovered:.1f}s after space was freed")


SITECUSTOMIZE = """
import datetime as _dt
import time

_SKEW = {seconds}
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _SKEW
time.time_ns = lambda: _time_ns() + _SKEW * 1_000_000_000


class _Skewed(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return super().now(tz) + _dt.timedelta(seconds=_SKEW)

    @classmethod
    def utcnow(cls):
        return super().utcnow() + _dt.timedelta(seconds=_SKEW)


_dt.datetime = _Skewed
"""


def skewed(seconds: int, where: Path) -> dict[str, str]:
    """The environment that runs `icefall run`'s Python side `seconds` off the real clock: a
    `sitecustomize` shifts `time.time`, `time.time_ns` and `datetime.now` (pyiceberg's commits and their
    metadata timestamps, freshness, the leases' renew times, the deleted keys' window). Not libfaketime:
    under it CPython 3.11's `time.sleep` fails with EINVAL (clock_nanosleep, TIMER_ABSTIME; libfaketime
    0.9.10) and a local Spark JVM never registers its block manager, so the JVM keeps the real clock."""
    site = where / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("{seconds}", str(seconds)))
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


FRESHNESS = re.compile(r"\| freshness ([0-9.e+-]+)s \|")


AHEAD = 90  # seconds: 30 s past Iceberg Java's one minute tolerance, so the wait stays short


def test_a_writer_whose_clock_is_behind_the_last_commit(kafka: KafkaBroker, tmp_path: Path) -> None:
    """The table's last commit came from a host 90 s ahead; the writer's host is right (so, 90 s behind
    that commit). Committing at once would stamp metadata 90 s before its log's last entry, which Iceberg
    Java (Spark itself) refuses to read: without the check, the next Spark append did not find its staging
    branch (`TABLE_OR_VIEW_NOT_FOUND`) and the run died. Now it waits with one line until its clock passes
    that commit, then ingests; then a process whose clock is 90 s ahead cannot take the lease it holds;
    freshness is never negative; exactly once."""
    name = "res_skew"
    with live_run(kafka, tmp_path, name, {}, records=120) as run:
        run.wait_caught_up()
    ahead_ms = commit_from_a_clock_ahead(run.config, (NAMESPACE, name), AHEAD)
    assert ahead_ms > time.time() * 1000 + (AHEAD - 10) * 1000
    late = LiveRun(run.manifest, config=run.config, kafka=kafka, name=name, topic=run.topic, state=run.state)
    try:
        produce(kafka, run.topic, 120, 40)
        late.wait_for("waiting for its clock", lambda: "this host's clock is behind the table" in late.text())
        waiting = time.monotonic()
        late.wait_caught_up()
        print(f"\n[clock {AHEAD}s behind] caught up {time.monotonic() - waiting:.1f}s after it began to wait")
        # Once it runs (not while it waits: a start that fails gives the lease back between its tries).
        assert_lease_kept(run, late, skewed(AHEAD, tmp_path / "ahead"))
        late.stop()
        assert "Traceback" not in late.text(), late.tail()
        freshness = [float(f) for f in FRESHNESS.findall(late.text())]
        assert freshness and all(f >= 0 for f in freshness), freshness
    finally:
        late.stop()
    high = watermarks(kafka, run.topic)
    assert sum(high.values()) == 160
    assert_exactly_once(run.config, name, high, set())
    verify(run)


def assert_lease_kept(first: LiveRun, holder: LiveRun, env: dict[str, str]) -> None:
    """A process on another clock (`env`), started while `holder` runs, cannot take its lease."""
    epoch = read_committed(holder.config.pyiceberg().load_table((NAMESPACE, holder.name))).epoch
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "run", "-f", str(first.manifest),
         "--state-dir", str(first.state), "--until-caught-up", "--lease-timeout", "20",
         "--no-maintenance", "--master", "local[1]"],
        capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **env},
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "could not take this table's commit lease" in output, output[-3000:]
    assert read_committed(holder.config.pyiceberg().load_table((NAMESPACE, holder.name))).epoch == epoch


def executors(root: int) -> list[int]:
    """Spark executor JVMs (`CoarseGrainedExecutorBackend`) among the descendants of process `root`."""
    found = []
    for proc in Path("/proc").iterdir():
        with suppress(OSError, ValueError):
            if proc.name.isdigit() and b"CoarseGrainedExecutorBackend" in (proc / "cmdline").read_bytes():
                pid = int(proc.name)
                while pid not in (0, 1, root):
                    pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if pid == root:
                    found.append(int(proc.name))
    return found


@pytest.mark.long  # `make test-all`: a local cluster starts an executor JVM of its own (a minute more)
def test_an_executor_killed_mid_batch(kafka: KafkaBroker, tmp_path: Path) -> None:
    """Spark in local-cluster mode (a worker launching a separate executor JVM): the executor SIGKILLed (as
    the kernel's OOM killer does) while batches run; Spark reports it lost and starts another, the batch
    is retried or planned again, and the table is exactly once."""
    name = "res_executor"
    topic = f"it-res-{name.replace('_', '-')}"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 200)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap, batch=BATCH))
    state = tmp_path / "state"
    config = CatalogConfig.embedded(state)
    run = LiveRun(
        manifest, config=config, kafka=kafka, name=name, topic=topic, state=state,
        master="local-cluster[1,1,1024]",
    )  # fmt: skip
    try:
        run.wait_ingesting()
        (victim,) = executors(run.proc.pid)
        produce(kafka, topic, 200, 400)
        run.wait_for("a batch running", lambda: sum(run.committed().values()) > 200, 120)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        run.wait_for("a new executor", lambda: bool(executors(run.proc.pid)), 180)
        run.wait_caught_up()
        recovered = time.monotonic() - killed
        run.stop()
        assert "Traceback" not in run.text(), run.tail()
    finally:
        run.stop()
    high = watermarks(kafka, topic)
    assert sum(high.values()) == 600
    assert_exactly_once(config, name, high, set())
    verify(run)
    print(f"\n[executor killed] caught up {recovered:.1f}s after the kill")


def free_ports(count: int) -> list[int]:
    """`count` TCP ports free on loopback now (bound together, so distinct)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tasks_started(app: Path) -> int:
    """Tasks the executors of a local cluster's application (its folder in the worker's dir) logged as
    running."""
    return sum(log.read_text(errors="replace").count("Running task") for log in app.glob("*/stderr"))


@pytest.mark.long  # `make test-all`: a local cluster's executor JVM, and a partition longer than its timeout
def test_a_partition_between_the_driver_and_its_executor(kafka: KafkaBroker, tmp_path: Path) -> None:
    """Spark in local-cluster mode, the driver's RPC and block manager ports and the executor's block manager
    ports pinned; every packet between them dropped (iptables, loopback only) from the moment a batch's
    task runs until after `spark.network.timeout` (30 s here): the driver declares the executor lost, the
    running task failed, and with `spark.task.maxFailures` 1 (standing in for a network that flaps as often
    as Spark's default of 4 within one batch) the job aborts; nothing commits meanwhile. Once healed the run
    catches up by itself, having said so in one line; exactly once."""
    name = "res_partition"
    topic = f"it-res-{name.replace('_', '-')}"
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, 0, 200)
    manifest = tmp_path / "table.yaml"
    spark = "  spark: {conf: {spark.task.maxFailures: '1'}}\n"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap, batch={"maxRecords": 4000}) + spark)
    state = tmp_path / "state"
    config = CatalogConfig.embedded(state)
    assert load_manifest(manifest).spec
    driver, block, executor = free_ports(3)
    # Pinned so the rule can name them; a network timeout under the 60 s a table may set (Spark's check
    # interval shortened with it) keeps the test short.
    pinned = {"spark.driver.port": driver, "spark.driver.blockManager.port": block,
              "spark.blockManager.port": executor, "spark.port.maxRetries": 8,
              "spark.network.timeout": "30s", "spark.network.timeoutInterval": "5s"}  # fmt: skip
    submit = " ".join(f"--conf {key}={value}" for key, value in pinned.items())
    run = LiveRun(
        manifest, config=config, kafka=kafka, name=name, topic=topic, state=state,
        master="local-cluster[1,1,1024]", env={"PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell"},
    )  # fmt: skip
    app = None
    try:
        run.wait_caught_up(600)  # a local cluster's first batch took 240 s at load 39
        (victim,) = executors(run.proc.pid)
        app = Path(os.readlink(f"/proc/{victim}/cwd")).parent  # <worker dir>/<app id>/<executor id>
        started = tasks_started(app)
        produce(kafka, topic, 200, 3000)  # one batch, its tasks a few seconds long
        run.wait_for("a task running", lambda: tasks_started(app) > started, 120)
        with dropped(f"{driver},{block},{executor}:{executor + 8}"):
            run.wait_for("the executor lost", lambda: "Lost executor 0" in run.text(), 120)
            run.wait_for("the outage said", lambda: "lost its Spark executors" in run.text(), 60)
            assert sum(run.committed().values()) == 200, "a batch committed through the partition"
        healed = time.monotonic()
        run.wait_caught_up(600)
        recovered = time.monotonic() - healed
        run.stop()
        assert "Traceback" not in run.text(), run.tail()
        assert "it.res_partition: Spark's executors answer again after" in run.text(), run.tail()
    finally:
        run.stop()
        if app is not None:  # the executors' copies of the jars, under Spark's own folder
            shutil.rmtree(app, ignore_errors=True)
    high = watermarks(kafka, topic)
    assert sum(high.values()) == 3200
    assert_exactly_once(config, name, high, set())
    verify(run)
    print(f"\n[partition] caught up {recovered:.1f}s after it healed")
