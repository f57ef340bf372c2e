"""A test run killed outright (SIGKILL, a session cut off) leaves its containers running: their shims
outlive containerd, and the next run's containerd, with a new state folder, never sees them. The next node
to start kills them (they would take the CPU from every test after it).

Proves, on this machine's real cgroups, with the node store's lock held as `Containerd.start` holds it:
- a process in a `kubepods` cgroup (where the kubelet puts every container) is killed;
- a process outside those cgroups is not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from icefall.devstack.node import cache_dir, kill_leftover_containers

pytestmark = pytest.mark.integration  # in the node's group of workers (icefall.testing.plugin)

PIDS = Path("/sys/fs/cgroup/pids")


def test_processes_left_in_the_kubelets_cgroups_are_killed() -> None:
    assert PIDS.is_dir(), "this test needs the cgroup v1 pids controller the node runs on"
    cache_dir().mkdir(parents=True, exist_ok=True)
    cgroup = PIDS / "kubepods" / f"icefall-leftover-test-{os.getpid()}"
    with open(cache_dir() / "containerd-root.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # no node of another run is up while this is held
        left = subprocess.Popen(["sleep", "600"], start_new_session=True)
        bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
        try:
            cgroup.mkdir(parents=True, exist_ok=True)
            (cgroup / "cgroup.procs").write_text(str(left.pid))
            kill_leftover_containers(Path("/nonexistent/containerd.sock"))
            assert left.wait(10) == -9, "the process in a kubepods cgroup was killed"
            assert bystander.poll() is None, "a process outside kubepods was left alone"
        finally:
            for process in (left, bystander):
                process.kill()
                process.wait()
            with contextlib.suppress(OSError):
                cgroup.rmdir()
