"""The chaos run's resource faults (e2e/chaos_resources.py): what is pure in them.

Proves: the resource kinds are drawn by default with the infrastructure kinds and can be asked for alone
(`ICEFALL_CHAOS_INFRA_KINDS`); the memory cgroup of a container is found in `/proc/<pid>/cgroup` on cgroup v1
(the `memory` hierarchy, also when it shares a line with other controllers) and on v2 (the unified line),
and a process with neither is refused; the squeezed limit is just over the usage (a limit under it is
refused); the OOM kill count is read on v1 and v2 (0 once the cgroup is gone); an OOM kill of a squeezed
container counts as a kill of its component at its own point, an exit of a container never squeezed does
not; the iptables rule drops (never rejects) loopback TCP both ways; the spill disk's tmpfs holds what Spark
wrote plus a little room, over Spark's block manager dirs only, and the driver's full-disk line is found.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from icefall.ingest.outages import Outages, Unavailable
from icefall.plan.outages import Service
from icefall.testing.resource_faults import partition_rule

pytestmark = pytest.mark.unit

E2E = Path(__file__).resolve().parents[2] / "e2e"
_package = types.ModuleType("chaos_e2e")  # the e2e folder as a package of another name
_package.__path__ = [str(E2E)]
sys.modules.setdefault("chaos_e2e", _package)
infra = importlib.import_module("chaos_e2e.chaos_infra")
resources = importlib.import_module("chaos_e2e.chaos_resources")
pods = importlib.import_module("chaos_e2e.chaos_pods")
spill = importlib.import_module("chaos_e2e.chaos_spill")

MIB = 1 << 20


def test_resource_kinds_are_drawn_by_default_and_alone() -> None:
    assert set(infra.RESOURCE_KINDS) == {
        "network partition", "OOM kill", "clock skew", "orphan race", "spill disk full",
    }  # fmt: skip
    assert set(infra.RESOURCE_KINDS) <= set(infra.drawn_kinds(""))
    assert infra.drawn_kinds("OOM kill,orphan race") == ("OOM kill", "orphan race")
    assert infra.drawn_kinds("spill disk full") == ("spill disk full",)


def test_the_memory_cgroup_of_a_container_on_v1_and_v2() -> None:
    v1 = "12:pids:/kubepods/pod1/abc\n4:memory:/kubepods/besteffort/pod1/abc\n1:name=systemd:/x\n"
    assert resources.memory_cgroup(v1) == ("/kubepods/besteffort/pod1/abc", True)
    assert resources.memory_cgroup("3:cpu,memory:/k/c\n") == ("/k/c", True)
    assert resources.memory_cgroup("0::/kubepods.slice/c.scope\n") == ("/kubepods.slice/c.scope", False)
    with pytest.raises(ValueError, match="no memory cgroup"):
        resources.memory_cgroup("2:cpu:/x\n")


def test_the_squeezed_limit_leaves_little_room() -> None:
    assert resources.squeezed(500 * MIB) == 508 * MIB


def test_oom_kills_are_read_from_the_cgroup(tmp_path: Path) -> None:
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert resources.oom_kills(tmp_path, True) == 3
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    assert resources.oom_kills(tmp_path, False) == 1
    assert resources.oom_kills(tmp_path / "gone", True) == 0


def ended(cid: str, code: int, reason: str) -> object:
    container = pods.Container(
        pod=pods.DRIVER, uid="u", name="driver", restart=0, cid=cid, seen=0.0, spec_armed=False
    )
    container.exit_code, container.reason = code, reason
    return container


def test_an_oom_kill_of_a_squeezed_container_counts_as_a_kill() -> None:
    watch = types.SimpleNamespace(ended=[ended("a", 137, "OOMKilled"), ended("b", 137, "OOMKilled")])
    watch.read_draw = lambda container: "nothing"
    tally = pods.Tally()
    tally.oom.add("a")
    pods.count_exits(watch, tally)
    assert tally.by_point == {("driver", pods.OOM_KILLED): 1}
    assert tally.other_exits == {("driver", 137, "OOMKilled"): 1}  # "b" was no fault of this run


def test_a_partition_drops_loopback_tcp_both_ways() -> None:
    rule = partition_rule("9000", "tag")
    assert rule[:3] == ["INPUT", "-i", "lo"] and rule[-2:] == ["-j", "DROP"]
    assert rule[rule.index("--ports") + 1] == "9000" and "tag" in rule


def test_the_spill_disk_holds_what_spark_wrote_and_a_little_room() -> None:
    assert spill.tmpfs_size(0) == spill.HEADROOM
    assert spill.tmpfs_size(1) == MIB + spill.HEADROOM
    assert spill.tmpfs_size(3 * MIB) == 3 * MIB + spill.HEADROOM
    assert spill.HEADROOM <= 16 * MIB  # the filler takes it all: host memory while the fault lasts


def test_only_sparks_block_manager_dirs_are_covered() -> None:
    names = [
        "spark-6f1c",
        "blockmgr-9e2d4c1a-0b7f-4a8e-9c3d-5f6a7b8c9d0e",
        ".icefall-chaos-spill",
        "blockmgr-x",
    ]
    assert spill.block_manager_dirs(names) == ["blockmgr-9e2d4c1a-0b7f-4a8e-9c3d-5f6a7b8c9d0e"]
    assert spill.block_manager_dirs(["spark-6f1c"]) == []


def test_the_drivers_full_disk_line_is_found() -> None:
    outages = Outages("chaos-keyed", {Service.LOCAL_DISK: spill.SPARK_LOCAL_DIR})
    line = outages.describe(Unavailable(Service.LOCAL_DISK, "java.io.IOException: No space left on device"))
    log = f"INFO a batch\nWARNING chaos-keyed: {line} (No space left on device); attempt 1 failed\n"
    assert spill.FULL_LINE.findall(log) == [f"{line} (No space left on device); attempt 1 failed"]
    assert spill.FULL_LINE.findall("cannot reach the object store at http://127.0.0.1:9000") == []


def test_recoveries_are_awaited_alongside_later_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next fault waits for the last one's recovery only `SETTLE` seconds; each recovery is recorded when
    the tables reach the offsets of its moment, and the loop ends once every fault recovered."""
    monkeypatch.setenv("ICEFALL_CHAOS_INFRA_KINDS", "clock skew")
    monkeypatch.setattr(infra, "EVERY", (0.0, 0.0))
    monkeypatch.setattr(infra, "SETTLE", 0.1)
    offsets, committed, notes = itertools.count(10, 10), [0], []
    faults = infra.InfraFaults(
        cast(Any, None), count=3, seed=1, topics=("t",), partitions=1,
        high=lambda: {0: next(offsets)}, caught_up_with=lambda high: committed[0] >= high[0],
        revive_operator=lambda: None, lock=threading.Lock(), calm=threading.Event(), done=threading.Event(),
        note=notes.append, resources=lambda kind, rng: "made",
    )  # fmt: skip
    loop = threading.Thread(target=faults.loop, daemon=True)
    loop.start()
    try:
        _until(lambda: len(faults.faults) == 3)
        assert [f.recovered_after for f in faults.faults] == [None, None, None]
        committed[0] = 20  # the tables reached the first two faults' offsets, not the third's
        _until(lambda: len(faults.pending) == 1)
        assert faults.faults[0].recovered_after is not None and faults.faults[1].recovered_after is not None
        assert loop.is_alive()
        committed[0] = 30
        loop.join(5)
        assert not loop.is_alive()
        assert all(f.recovered_after is not None for f in faults.faults)
        assert notes[-1].startswith("infrastructure fault 3/3: clock skew (made); recovered")
    finally:
        faults.done.set()
        loop.join(5)


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within 5 s"
        time.sleep(0.01)
