"""`make chaos`'s "spill disk full" resource fault (issue 46 item 3): the keyed driver's Spark local dir full.

The keyed table's running driver container (each upsert batch is a MERGE whose shuffle Spark writes in its
block manager's dirs, `blockmgr-*` under `spark.local.dir`; the append table writes nothing there) gets, in
its own mount namespace (`MOUNTER`, run from the host: setns, then mount), a small tmpfs over each of those
dirs with their contents copied in (Spark caches its subdirectories, so they must still exist), made while
every process of the container is stopped (SIGSTOP, well under a second). The tmpfs holds what was there plus
`HEADROOM`; a filler file (written from the host through `/proc/<pid>/root`) then takes its last byte, and
again, 4 times a second, whatever Spark frees (its cleaner deletes the old shuffle files copied in: without
that, a batch found room 16 s into the fault). The fault lasts `SPILL_SECONDS`, and longer until the driver's
log names the full disk ("local disk <dir> is full": a shuffle write failed with ENOSPC,
icefall.ingest.outages); then the filler is deleted and the tmpfs grown to `GROWN` (tmpfs holds only what is
written), and the run measures the recovery from there. The tmpfs stays mounted until the container ends:
unmounting it under a running Spark would hide the shuffle files and subdirectories Spark made on it
meanwhile, a failure of the fault's own making. The container (one that drew no failpoint, if one comes soon)
is left alone by the random kills while the disk is full (a failpoint may still end it: the fault then just
ends); whether the StreamingTable's status showed `LocalDiskFull` meanwhile is noted.

Proves: a full spill disk under a running driver on the cluster is waited out with one line per attempt,
commits nothing it should not, and recovers by itself once space is freed; exactly once (the run's audit).
Does not prove: a kubelet eviction of a Pod whose emptyDir exceeds its `sizeLimit` (what Kubernetes does
when a disk-backed emptyDir grows too big; the driver is then restarted like after any kill); a write
to the disk in flight when the tmpfs covers its dir (a file opened before) lands on the disk below, and
a rename of such a file then fails (a driver failure, counted among the other exits): a race of the
moment of the container's stop.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client

from icefall.plan.spark_conf import SPARK_LOCAL_DIR

from . import chaos_keyed as keyed
from .chaos_pods import Container, signal_all, stop_all

if TYPE_CHECKING:
    from .chaos_resources import Cluster

#: Seconds the disk stays full at least (longer until the driver's log named it, up to `FULL_TIMEOUT`).
SPILL_SECONDS = (20.0, 90.0)
FULL_TIMEOUT = 300.0
PREFER_UNARMED = 120.0  # seconds to wait for a keyed driver that drew no failpoint
MIB = 1 << 20
HEADROOM = 8 * MIB  # room left on the tmpfs over what Spark had written, for the filler to take
GROWN = "16g"  # the tmpfs's size once the fault ends: the emptyDir's default sizeLimit
FILLER = "icefall-chaos-filler"
FULL_LINE = re.compile(r"local disk \S+ is full[^\n]*")
SPACE_AGAIN = re.compile(r"local disk at \S+ has space again")
BLOCK_MANAGER = re.compile(r"blockmgr-[0-9a-f-]+")

#: Run as root on the host: `MOUNTER <pid> cover <dir> <size>` mounts a tmpfs of `size` bytes over `dir`
#: (a path in the mount namespace of process `pid`) holding a copy of what `dir` holds (owners and modes
#: kept); `MOUNTER <pid> grow <dir> <size>` remounts that tmpfs with a new size. Everything it needs is
#: loaded before it enters the namespace (paths then resolve in the container's filesystem).
MOUNTER = """
import ctypes, os, shutil, sys
libc = ctypes.CDLL("libc.so.6", use_errno=True)
MS_REMOUNT, MS_BIND, MNT_DETACH, CLONE_NEWNS = 32, 4096, 2, 0x00020000

def check(result, what):
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")

def mount(source, target, kind, flags, options):
    encode = lambda s: None if s is None else s.encode()
    check(libc.mount(encode(source), encode(target), encode(kind), flags, encode(options)), f"mount {target}")

def copy(source, target):
    for entry in os.scandir(source):
        to = os.path.join(target, entry.name)
        status = entry.stat(follow_symlinks=False)
        if entry.is_dir(follow_symlinks=False):
            os.mkdir(to)
            copy(entry.path, to)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, to)
        else:
            continue
        os.chown(to, status.st_uid, status.st_gid)
        os.chmod(to, status.st_mode & 0o7777)

pid, action, folder, size = sys.argv[1:5]
check(libc.setns(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY), CLONE_NEWNS), "setns")
if action == "grow":
    mount("tmpfs", folder, "tmpfs", MS_REMOUNT, f"size={size}")
    sys.exit(0)
status = os.stat(folder)
staging = os.path.join(os.path.dirname(folder), ".icefall-chaos-spill")
os.mkdir(staging, 0o700)
try:
    options = f"size={size},mode={status.st_mode & 0o7777:o},uid={status.st_uid},gid={status.st_gid}"
    mount("tmpfs", staging, "tmpfs", 0, options)
    try:
        copy(folder, staging)
        mount(staging, folder, None, MS_BIND, None)
    finally:
        libc.umount2(staging.encode(), MNT_DETACH)
finally:
    os.rmdir(staging)
"""


def tmpfs_size(used: int) -> int:
    """The size of the tmpfs over a dir whose files take `used` bytes: that in whole MiB, plus `HEADROOM`."""
    return -(-used // MIB) * MIB + HEADROOM


def block_manager_dirs(names: list[str]) -> list[str]:
    """The names of Spark's block manager dirs (`blockmgr-<uuid>`) among a local dir's entries, sorted."""
    return sorted(name for name in names if BLOCK_MANAGER.fullmatch(name))


def disk_usage(folder: Path) -> int:
    """Bytes the files under `folder` take (allocated blocks)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def mounter(pid: int, action: str, folder: str, size: int | str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MOUNTER, str(pid), action, folder, str(size)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"spill disk full: {action} {folder}: {done.stderr.strip()[-1500:]}")


def fill(folder: Path) -> int:
    """Append to a filler file in `folder` until its filesystem is full (to the last byte); the bytes
    written (again: what was freed meanwhile)."""
    written = 0
    fd = os.open(folder / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (MIB, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    written += os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return written


@dataclass
class Held:
    """What the driver did while its disk was full (`SpillDiskFull._hold`)."""

    line: str | None = None  # its first "local disk ... is full" line; None: the container ended first
    attempts: int = 0  # its failed attempts (one line each)
    got_through: bool = False  # it logged "has space again" (Spark freed some and won a race for it)
    condition: bool = False  # the StreamingTable's status said `LocalDiskFull`
    topped: int = 0  # bytes the filler took again as Spark freed some
    seconds: float = 0.0


class SpillDiskFull:
    """One "spill disk full" fault on the keyed table's running driver (module doc)."""

    def __init__(self, cluster: Cluster, note: Callable[[str], None]) -> None:
        self.c, self.note = cluster, note

    def make(self, rng: random.Random) -> str:
        container, init = self._keyed_driver()
        seconds = rng.uniform(*SPILL_SECONDS)
        root = Path(f"/proc/{init}/root")
        with self.c.tally.lock:
            spared = container.cid not in self.c.tally.killed
            self.c.tally.killed.add(container.cid)  # the random kills leave it alone while its disk is full
        covered: list[str] = []
        try:
            try:
                self._cover(init, root, covered)
                filled = self._fill(root, covered)
            except (OSError, RuntimeError):
                if self._alive(container, init):
                    raise
                return (
                    f"{container.pod} ended while its spill disk was being covered (the fault ended with it)"
                )
            held = self._hold(container, init, seconds, lambda: self._top_up(root, covered))
        finally:
            self._free(init, root, covered)
            if spared:
                with self.c.tally.lock:
                    self.c.tally.killed.discard(container.cid)
        what = (
            f"{container.pod}: {len(covered)} Spark block manager dir(s) on a tmpfs filled ({filled} B, "
            f"{held.topped} B more as Spark freed some)"
        )
        if held.line is None:
            return (
                f"{what}; the driver ended {held.seconds:.0f} s into the fault, after {held.attempts} failed "
                "attempts (the fault ended with it)"
            )
        shown = "status showed LocalDiskFull" if held.condition else "LocalDiskFull not seen in status"
        through = "an attempt got through while full" if held.got_through else "no attempt got through"
        return (
            f"{what}, full {held.seconds:.0f} s: {held.attempts} failed attempts, {through}; its log: "
            f"{held.line!r}; {shown}; filler deleted"
        )

    def _alive(self, container: Container, init: int) -> bool:
        """Whether the container still runs (its PID 1 too: the Pod watch may not have seen its end yet)."""
        return Path(f"/proc/{init}/root").exists() and any(
            x.cid == container.cid for x in self.c.pods.running()
        )

    def _keyed_driver(self) -> tuple[Container, int]:
        """The keyed table's running driver with a block manager dir (Spark started), and its PID 1; one that
        drew no failpoint if one comes within `PREFER_UNARMED` s (an armed one may exit at its point while
        its disk is full: `lease.renew` and `main.after-prepare` are passed while it waits)."""
        started = time.monotonic()
        while time.monotonic() < started + FULL_TIMEOUT:
            for container in self.c.pods.running("driver"):
                if container.pod != keyed.KEYED_DRIVER:
                    continue
                self.c.pods.read_draw(container)
                init = self.c.cluster.node.container_pid(container.cid)
                if init is None or (container.armed and time.monotonic() < started + PREFER_UNARMED):
                    continue
                with contextlib.suppress(OSError):
                    local = Path(f"/proc/{init}/root{SPARK_LOCAL_DIR}")
                    if block_manager_dirs(os.listdir(local)):
                        return container, init
            time.sleep(1)
        raise AssertionError(
            f"spill disk full: no running keyed driver with Spark started in {FULL_TIMEOUT:.0f} s"
        )

    def _cover(self, init: int, root: Path, covered: list[str]) -> None:
        """Each block manager dir covered with a small tmpfs holding its copy (added to `covered`), every
        process of the container stopped meanwhile."""
        stopped = stop_all(init)
        try:
            for name in block_manager_dirs(os.listdir(root / SPARK_LOCAL_DIR.lstrip("/"))):
                folder = f"{SPARK_LOCAL_DIR}/{name}"
                mounter(init, "cover", folder, tmpfs_size(disk_usage(root / folder.lstrip("/"))))
                covered.append(folder)
        finally:
            signal_all(stopped, signal.SIGCONT)

    @staticmethod
    def _fill(root: Path, covered: list[str]) -> int:
        return sum(fill(root / folder.lstrip("/")) for folder in covered)

    @classmethod
    def _top_up(cls, root: Path, covered: list[str]) -> int:
        """`_fill` again; 0 once the container is gone (its end is the fault's: `_hold` sees it next)."""
        try:
            return cls._fill(root, covered)
        except OSError:
            return 0

    def _hold(self, container: Container, init: int, seconds: float, top_up: Callable[[], int]) -> Held:
        """Wait `seconds`, and on until the driver's log names the full disk, filling again (4 times a
        second) what Spark freed (its cleaner deletes old shuffle files)."""
        started = time.monotonic()
        text = self.c.pods.node.log(container.pod, container.uid)
        before, again = len(FULL_LINE.findall(text)), len(SPACE_AGAIN.findall(text))
        held = Held()
        while held.seconds < FULL_TIMEOUT:
            held.seconds = time.monotonic() - started
            if not self._alive(container, init):
                return held
            held.condition = held.condition or self._local_disk_full()
            text = self.c.pods.node.log(container.pod, container.uid)
            lines = FULL_LINE.findall(text)[before:]
            held.attempts, held.got_through = len(lines), len(SPACE_AGAIN.findall(text)) > again
            if lines and held.seconds >= seconds:
                held.line = lines[0]
                return held
            for _ in range(4):
                time.sleep(0.25)
                held.topped += top_up()
        raise AssertionError(
            f"spill disk full: {container.pod} never logged a full local disk in {FULL_TIMEOUT:.0f} s"
        )

    def _local_disk_full(self) -> bool:
        with contextlib.suppress(Exception):  # status is a note here, never the fault's outcome
            st: dict[str, Any] = client.CustomObjectsApi(
                self.c.pods.core.api_client
            ).get_namespaced_custom_object(
                "icefall.dev", "v1alpha1", self.c.pods.node.namespace, "streamingtables", keyed.KEYED_NAME
            )
            conditions = (st.get("status") or {}).get("conditions") or []
            return any(c.get("reason") == "LocalDiskFull" for c in conditions)
        return False

    def _free(self, init: int, root: Path, covered: list[str]) -> None:
        """The filler deleted and each tmpfs grown to `GROWN` (nothing to do once the container is gone)."""
        for folder in covered:
            with contextlib.suppress(OSError):
                (root / folder.lstrip("/") / FILLER).unlink()
            try:
                mounter(init, "grow", folder, GROWN)
            except RuntimeError as error:
                if Path(f"/proc/{init}").exists():
                    self.note(f"spill disk full: {error}")
