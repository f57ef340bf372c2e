"""`make chaos`'s resource faults (issue 46 item 3), drawn with the infrastructure faults (chaos_infra.py).

Each is one kind of `chaos_infra.RESOURCE_KINDS`, made by `ResourceFaults.make` on the e2e cluster (driver and
compaction Pods on the host network, Spark local mode inside them, the services on loopback); the run then
waits, as for the other infrastructure kinds, until both tables committed every record that was in their
topics when the fault ended (its time to recover).

- "network partition": every loopback TCP packet to or from one service's port (the object store, the REST
  catalog, or one Kafka broker) dropped with iptables (DROP, not REJECT: connections hang, new ones time
  out) for `PARTITION_SECONDS`; the rule is always removed. Proves that the writers and compaction ride out
  a hung service by themselves and stay exactly once. Does not prove: a partition between the driver and
  Spark executors (local mode has none here; tests/integration/test_resource_faults.py covers it), nor a
  partition of the API server.
- "OOM kill": a real kernel OOM kill of a running driver or compaction container (either table): its memory
  cgroup's limit (cgroup v1 here: `memory.limit_in_bytes`; v2: `memory.max`) set just over its usage and a
  process the OOM killer never picks moved into that cgroup to allocate (`oom_kill_in`: a limit under what
  the kernel cannot reclaim is refused, and an idle container never grows), so the kernel kills the
  container's own largest process; the Pod's status must say `OOMKilled`, and the run
  counts it as a kill of its component at the point `OOM_KILLED`. Proves a container killed by the kernel
  for memory mid-batch recovers with no person (the operator restarts a driver, the kubelet a compaction
  container). Does not prove: a limit too small for the work (e2e/test_driver_memory.py), nor an executor's
  OOM under a cluster manager.
- "clock skew": a commit on one of the tables from a clock `CLOCK_AHEAD` seconds ahead (a table property
  set by pyiceberg with its clock shifted): the writers are then behind the table's last update; they must
  wait until their clock passes it, never write metadata Iceberg Java refuses (the final `icefall verify`
  reads every table with Spark), and recover by themselves. Freshness cannot be negative: the status
  schema refuses it (`minimum: 0`), so an operator writing it would fail loudly.
- "orphan race": the append table's driver SIGSTOPped (every process of its container) right after it staged
  a batch (its stage branch ahead of `main`), orphan removal run on that table with a clock two hours
  ahead (past its one-hour safety window, as a paused writer or a clock ahead would make it), then the
  driver resumed (SIGCONT). None of its staged data files may be removed, and no snapshot of `main` may
  name a removed file afterwards (its commit lands with its files, or is refused); the run's final audit
  and `icefall verify` must pass. The table's compaction containers are SIGKILLed first (kills the run
  counts): the clock ahead makes every unreferenced file look old, so a rewrite in flight would lose its
  new files, which in production are minutes old, far inside the window; a killed rewrite never commits.
  Does not prove: orphan removal racing a compaction rewrite.
- "spill disk full": the keyed table's driver's Spark block manager dirs put on a small tmpfs (in the
  container's mount namespace) and filled to ENOSPC, until its log names the full disk; then space freed
  (e2e/chaos_spill.py says how, and what it proves).
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icefall.catalog import CatalogConfig
from icefall.compact.view import canonical_path, read_table_view
from icefall.compact.worker import run_item
from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka_cluster import KafkaCluster
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.plan.maintenance import plan_orphans
from icefall.plan.maintenance_items import HOUR_MS, MaintenancePolicy
from icefall.testing.resource_faults import commit_from_a_clock_ahead, dropped

from .chaos_pods import Container, PodWatch, Tally, container_processes, sigkill, signal_all, stop_all
from .chaos_spill import SpillDiskFull

#: Seconds a network partition lasts.
PARTITION_SECONDS = (20.0, 90.0)
#: Seconds ahead of the writers' clock of the skewed commit (Iceberg Java tolerates one minute).
CLOCK_AHEAD = (90, 240)
OOM_TIMEOUT = 180.0  # seconds for the kernel to OOM-kill a squeezed container
MIB = 1 << 20
ORPHAN_CLOCK_AHEAD_MS = 2 * HOUR_MS
STAGED_TIMEOUT = 300.0  # seconds to catch the driver with a staged batch
COMMITTED_TIMEOUT = 300.0  # seconds for the resumed driver's stage to be committed or dropped
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


@dataclass
class Cluster:
    """What the resource faults act on: the services, the Pods and the tables."""

    kafka: KafkaCluster
    store: ObjectStore
    catalog_server: RESTCatalogServer
    cluster: LocalCluster
    pods: PodWatch
    tally: Tally
    catalog: CatalogConfig
    tables: tuple[tuple[str, str], ...]  # the append table first
    driver: str  # the append table's driver Pod
    compact_prefix: str  # the append table's compaction Pods' name prefix
    topics: tuple[str, ...]


def memory_cgroup(proc_cgroup: str) -> tuple[str, bool]:
    """From `/proc/<pid>/cgroup`: the memory cgroup's path and whether it is cgroup v1's `memory` hierarchy
    (else the v2 unified one)."""
    unified = ""
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path, True
        if controllers == "":
            unified = path
    if not unified:
        raise ValueError(f"no memory cgroup in {proc_cgroup!r}")
    return unified, False


def squeezed(usage: int) -> int:
    """The limit that leaves a cgroup little room: 8 MiB over its usage (a limit under what the kernel cannot
    reclaim is refused, EBUSY, and changes nothing)."""
    return usage + 8 * MIB


def cgroup_folder(pid: int) -> Path:
    """The memory cgroup folder of process `pid` (cgroup v1's `memory` hierarchy, or v2's)."""
    path, v1 = memory_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    return (CGROUP_V1_MEMORY if v1 else CGROUP_V2) / path.lstrip("/")


#: A process that allocates (and touches) 8 MiB every 20 ms once told to, and that the OOM killer never
#: picks (oom_score_adj -1000): moved into a container's cgroup, it makes the kernel kill the container's
#: own processes, as their own growth would.
ALLOCATOR = """
import sys, time
open("/proc/self/oom_score_adj", "w").write("-1000")
print("ready", flush=True)
sys.stdin.readline()
held = []
while True:
    held.append(bytearray(b"x") * (8 << 20))
    time.sleep(0.02)
"""


def oom_kill_in(folder: Path, done: Callable[[], bool], timeout: float) -> int:
    """A kernel OOM kill in the memory cgroup `folder`: its limit set just over its usage and an allocator
    (`ALLOCATOR`) moved into it, until the cgroup's OOM kill count grows or `done()`; the allocator always
    killed on the way out. The OOM kills counted (0 if none in `timeout` seconds)."""
    v1 = folder.is_relative_to(CGROUP_V1_MEMORY)
    usage = folder / ("memory.usage_in_bytes" if v1 else "memory.current")
    limit = folder / ("memory.limit_in_bytes" if v1 else "memory.max")
    before = oom_kills(folder, v1)
    allocator = subprocess.Popen(
        [sys.executable, "-c", ALLOCATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert allocator.stdout is not None and allocator.stdin is not None
        allocator.stdout.readline()
        (folder / "cgroup.procs").write_text(str(allocator.pid))
        limit.write_text(str(squeezed(int(usage.read_text()))))
        allocator.stdin.write("go\n")
        allocator.stdin.flush()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not done():
            killed = oom_kills(folder, v1) - before
            if killed > 0:
                return killed
            time.sleep(0.2)
        return 0
    finally:
        allocator.kill()
        allocator.wait(30)


def oom_kills(folder: Path, v1: bool) -> int:
    """The OOM kills the kernel made in the memory cgroup `folder` so far (0 once it is gone)."""
    name = "memory.oom_control" if v1 else "memory.events"
    with contextlib.suppress(OSError):
        for line in (folder / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def wait_until(found: Callable[[], Container | None], timeout: float) -> Container | None:
    deadline = time.monotonic() + timeout
    while (result := found()) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return result


class ResourceFaults:
    """Makes one resource fault of a kind (module doc) and says what happened, in a few words."""

    def __init__(self, cluster: Cluster, note: Callable[[str], None]) -> None:
        self.c, self.note = cluster, note

    def make(self, kind: str, rng: random.Random) -> str:
        made: dict[str, Callable[[random.Random], str]] = {
            "network partition": self.partition,
            "OOM kill": self.oom_kill,
            "clock skew": self.clock_skew,
            "orphan race": self.orphan_race,
            "spill disk full": SpillDiskFull(self.c, self.note).make,
        }
        return made[kind](rng)

    # --- network partition ---

    def partition(self, rng: random.Random) -> str:
        c = self.c
        node = rng.choice(sorted(c.kafka.nodes))
        what, port = rng.choice([
            ("object store", c.store.port),
            ("REST catalog", c.catalog_server.port),
            (f"Kafka broker {node}", c.kafka.nodes[node].port),
        ])  # fmt: skip
        seconds = rng.uniform(*PARTITION_SECONDS)
        with dropped(str(port), tag=f"icefall-chaos-partition-{port}"):
            time.sleep(seconds)
        if what.startswith("Kafka"):
            c.kafka.wait_in_sync(c.topics, timeout=300)
        return f"{what} (port {port}) partitioned {seconds:.0f} s (packets dropped)"

    # --- OOM kill ---

    def oom_kill(self, rng: random.Random) -> str:
        """A running driver or compaction container OOM-killed by the kernel (an exit of another cause, such
        as a failpoint, is not one: another container is squeezed, up to 3 times)."""
        for _ in range(3):
            running = [x for x in self.c.pods.running() if x.component in ("driver", "compaction")]
            if not running:
                time.sleep(5)
                continue
            container = rng.choice(running)
            ended = self._squeeze_until_ended(container)
            if ended.reason == "OOMKilled":
                return (
                    f"{container.pod} OOM-killed (exit {ended.exit_code}) after its memory limit was lowered"
                )
            self.note(f"OOM kill: {container.pod} ended by other means ({ended.exit_code} {ended.reason})")
        raise AssertionError("OOM kill: 3 containers in a row ended before the kernel OOM-killed them")

    def _squeeze_until_ended(self, container: Container) -> Container:
        pid = self.c.cluster.node.container_pid(container.cid)
        if pid is None:
            return container  # ended meanwhile
        with self.c.tally.lock:
            self.c.tally.killed.add(container.cid)  # the random kills leave it alone
            self.c.tally.oom.add(container.cid)

        def ended() -> Container | None:
            return next((x for x in self.c.pods.ended if x.cid == container.cid), None)

        oom_kill_in(cgroup_folder(pid), lambda: ended() is not None, OOM_TIMEOUT)
        found = wait_until(ended, 120)
        if found is None:
            raise AssertionError(
                f"OOM kill: {container.pod} did not end {OOM_TIMEOUT:.0f} s into its squeeze"
            )
        return found

    # --- clock skew ---

    def clock_skew(self, rng: random.Random) -> str:
        identifier = rng.choice(self.c.tables)
        ahead = rng.randint(*CLOCK_AHEAD)
        commit_from_a_clock_ahead(self.c.catalog, identifier, ahead)
        return f"{'.'.join(identifier)}: a commit from a clock {ahead} s ahead"

    # --- orphan race ---

    def orphan_race(self, rng: random.Random) -> str:
        """The append table's driver paused with a staged batch while orphan removal runs (module doc)."""
        table_id = self.c.tables[0]
        for _ in range(5):
            killed = self._kill_compaction()
            driver = next((x for x in self.c.pods.running("driver") if x.pod == self.c.driver), None)
            init = self.c.cluster.node.container_pid(driver.cid) if driver else None
            if driver is None or init is None:
                time.sleep(2)
                continue
            with self.c.tally.lock:
                self.c.tally.killed.add(driver.cid)  # the random kills leave the paused one alone
            stopped = self._stop_when_staged(init)
            if not stopped:
                continue
            try:
                staged, removed = self._remove_orphans(table_id)
            finally:
                signal_all(stopped + container_processes(init), signal.SIGCONT)
            self._check_main(table_id, removed, staged)
            return (
                f"{killed} compaction containers SIGKILLed; the driver paused with {len(staged)} staged "
                f"data files while orphan removal (clock +2 h) removed {len(removed)} files (none staged); "
                "resumed; no snapshot of main names a removed file"
            )
        raise AssertionError("orphan race: the driver was never caught with a staged batch")

    def _stop_when_staged(self, init: int) -> list[int]:
        """SIGSTOP the driver's container once its stage branch is ahead of `main` (still so once stopped);
        [] if that did not happen in `STAGED_TIMEOUT`."""
        deadline = time.monotonic() + STAGED_TIMEOUT
        while time.monotonic() < deadline:
            if self._staged_files(self.c.tables[0]):
                stopped = stop_all(init)
                if self._staged_files(self.c.tables[0]):
                    return stopped
                signal_all(stopped, signal.SIGCONT)  # it committed meanwhile: catch the next batch
            time.sleep(0.2)
        return []

    def _kill_compaction(self) -> int:
        """SIGKILL the append table's compaction containers (kills the run counts) and wait until they ended:
        a rewrite in flight never commits, so its files are true orphans."""
        mine = [x for x in self.c.pods.running("compaction") if x.pod.startswith(self.c.compact_prefix)]
        for container in mine:
            sigkill(self.c.cluster, self.c.tally, container)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ended = {x.cid for x in self.c.pods.ended}
            if all(x.cid in ended for x in mine):
                break
            time.sleep(0.5)
        return len(mine)

    def _table(self, identifier: tuple[str, str]) -> Any:
        return self.c.catalog.pyiceberg().load_table(identifier)

    def _staged_files(self, identifier: tuple[str, str]) -> set[str]:
        """Data files of the table's stage branches that `main` does not have (a batch not committed)."""
        with contextlib.suppress(Exception):  # an outage of the catalog or the store: none known now
            table = self._table(identifier)
            main = table.metadata.refs.get("main")
            ancestors = _ancestors(table, main.snapshot_id if main else None)
            staged: set[str] = set()
            for name, ref in table.metadata.refs.items():
                if name != "main" and ref.snapshot_id not in ancestors:
                    staged |= {t.file.file_path for t in table.scan(snapshot_id=ref.snapshot_id).plan_files()}
            on_main = {t.file.file_path for t in table.scan().plan_files()} if main else set()
            return {canonical_path(p) for p in staged - on_main}
        return set()

    def _remove_orphans(self, identifier: tuple[str, str]) -> tuple[set[str], set[str]]:
        staged = self._staged_files(identifier)
        table = self._table(identifier)
        later = int(time.time() * 1000) + ORPHAN_CLOCK_AHEAD_MS
        item = plan_orphans(read_table_view(table), MaintenancePolicy(orphan_min_age_ms=HOUR_MS), later)
        removed: set[str] = set()
        if item is not None:
            result = run_item(None, self.c.catalog, identifier, item)  # type: ignore[arg-type]  # no Spark
            removed = {canonical_path(p) for p in result.deleted_paths}
        if removed & staged:
            raise AssertionError(f"orphan race: staged data files removed: {sorted(removed & staged)[:5]}")
        return staged, removed

    def _check_main(self, identifier: tuple[str, str], removed: set[str], staged: set[str]) -> None:
        """Once the resumed driver's stage was committed (or dropped), `main` names no removed file."""
        deadline = time.monotonic() + COMMITTED_TIMEOUT
        while self._staged_files(identifier) & staged and time.monotonic() < deadline:
            time.sleep(1)
        table = self._table(identifier)
        named = {canonical_path(t.file.file_path) for t in table.scan().plan_files()}
        if named & removed:
            raise AssertionError(f"orphan race: main names removed files: {sorted(named & removed)[:5]}")


def _ancestors(table: Any, snapshot_id: int | None) -> set[int]:
    found: set[int] = set()
    while snapshot_id is not None and snapshot_id not in found:
        found.add(snapshot_id)
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        snapshot_id = snapshot.parent_snapshot_id if snapshot else None
    return found
