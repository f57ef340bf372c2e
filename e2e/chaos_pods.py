"""The chaos run's pods: which table and component each is, a watch of every container start and exit, the
kills it observed (`Tally`, `count_exits`), and the host-side signals the run sends to a container.

A kill is counted only when its exit was seen in the Pod's status (`PodWatch`, a watch on the namespace's
Pods): status 137 with the termination message `failpoint <name> triggered`, or 137 of a container this
run SIGKILLed (`sigkill`: to its PID 1, tini, so the kernel kills every process of the container).

Not guaranteed: a container whose whole life fell in a gap of the watch (the API server expired it) is not
seen; what a container drew is unknown once its log went with its Pod.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from icefall.devstack.cluster import LocalCluster
from icefall.devstack.procs import free_port
from icefall.plan.names import compaction_name, driver_pod_name
from icefall.runtime.failpoints import CHAOS_ENV_VAR

from . import chaos_delta as delta
from . import chaos_keyed as keyed
from .conftest import NodeView, wait_for

NAME = "chaos"  # the append table's StreamingTable
DRIVER = driver_pod_name(NAME)
COMPACT_PREFIX = f"{compaction_name(NAME)}-"
SECOND_WRITER = f"{NAME}-second-writer"
#: What a container start drew (icefall.runtime.failpoints logs it at import): `nothing` or
#: `<point>=exit@<hit>`.
DRAW_LINE = re.compile(rf"{CHAOS_ENV_VAR} drew (\S+)")
NOTHING = "nothing"
#: A container whose log has not said what it drew after this long is treated as unarmed.
DRAW_UNKNOWN_AFTER = 90.0
RANDOM = "random moment"
FAILPOINT_LINE = re.compile(r"failpoint (\S+) triggered")
SIGKILL_STATUS = 137
OOM_KILLED = "OOMKilled (cgroup limit lowered)"
Obj = dict[str, Any]


def component_of(pod: str) -> str | None:
    """The component of any table's driver or compaction pod (they share the kill quotas), else None."""
    if pod in (DRIVER, keyed.KEYED_DRIVER, delta.DELTA_DRIVER):
        return "driver"
    if pod.startswith((COMPACT_PREFIX, keyed.KEYED_COMPACT_PREFIX, delta.DELTA_COMPACT_PREFIX)):
        return "compaction"
    return None


def table_of(pod: str) -> str | None:
    return delta.table_of(pod) or keyed.table_of(pod, DRIVER, COMPACT_PREFIX)


@dataclass
class Container:
    """One container the node ran (one start: a container id), as the Pod status showed it."""

    pod: str
    uid: str
    name: str
    restart: int
    cid: str  # containerd's id, without the `containerd://` prefix
    seen: float  # monotonic, when the run first saw it
    spec_armed: bool  # its Pod's spec has ICEFALL_FAILPOINTS_CHAOS
    draw: str | None = None  # what its failpoints drew (NOTHING or `<point>=exit@<hit>`), once its log said
    exit_code: int | None = None
    reason: str = ""
    message: str = ""

    @property
    def component(self) -> str | None:
        return component_of(self.pod)

    @property
    def armed(self) -> bool:
        return self.draw not in (None, NOTHING)


class PodWatch:
    """Every container start and exit of the namespace's Pods, from a watch (what the kubelet reported to
    the API server): `running()` now, `ended` in the order seen. An expired watch (410) is listed again and
    counted in `gaps`: what ended during a gap and whose Pod is gone was not seen."""

    def __init__(self, api: client.ApiClient, node: NodeView) -> None:
        self.core = client.CoreV1Api(api)
        self.node = node
        self.lock = threading.Lock()
        self.pods: dict[str, Obj] = {}  # name → the Pod as last seen
        self._running: dict[str, Container] = {}  # container id → container
        self.ended: list[Container] = []
        self._ended_ids: set[str] = set()
        self.gaps = 0
        self.listed = False
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="chaos-pod-watch", daemon=True)
        self.reader = threading.Thread(target=self._read_draws, name="chaos-draws", daemon=True)

    def start(self) -> PodWatch:
        self.thread.start()
        wait_for("the Pod watch to list", lambda: self.listed, timeout=60)
        self.reader.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)
        self.reader.join(60)

    def _read_draws(self) -> None:
        """What each running container drew, read from its log as soon as it says (a driver's log goes
        with its Pod, which the operator deletes right after the container ended)."""
        while not self.stopped.wait(1):
            for container in self.running():
                self.read_draw(container)

    def running(self, component: str | None = None) -> list[Container]:
        with self.lock:
            found = list(self._running.values())
        return [c for c in found if component is None or c.component == component]

    def pod(self, name: str) -> Obj | None:
        with self.lock:
            return self.pods.get(name)

    def backing_off(self, component: str) -> list[str]:
        """The component's Pods whose container waits out the kubelet's CrashLoopBackOff."""
        with self.lock:
            pods = list(self.pods.values())
        return [
            pod["metadata"]["name"]
            for pod in pods
            if component_of(pod["metadata"]["name"]) == component
            and any(
                (status.get("state") or {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
                for status in (pod.get("status") or {}).get("containerStatuses") or []
            )
        ]

    def _watch(self) -> None:
        version: str | None = None
        while not self.stopped.is_set():
            try:
                if version is None:
                    version = self._relist()
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod, self.node.namespace, resource_version=version,
                    timeout_seconds=30, allow_watch_bookmarks=True,
                )  # fmt: skip
                for event in stream:
                    obj: Obj = event["raw_object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._see(obj, deleted=event["type"] == "DELETED")
                    if self.stopped.is_set():
                        break
            except ApiException as error:
                if error.status == 410:
                    version = None
                    self.gaps += 1
                else:
                    time.sleep(1)
            except Exception as error:  # the API server restarting, a dropped connection: watch again
                print(f"[chaos] pod watch: {type(error).__name__}: {error}"[:300], flush=True)
                time.sleep(1)

    def _relist(self) -> str:
        response = self.core.list_namespaced_pod(self.node.namespace, _preload_content=False)
        listed: Obj = json.loads(response.data)
        names = {pod["metadata"]["name"] for pod in listed["items"]}
        with self.lock:
            for name in set(self.pods) - names:
                self._forget(self.pods.pop(name))
        for pod in listed["items"]:
            self._see(pod, deleted=False)
        self.listed = True
        version: str = listed["metadata"]["resourceVersion"]
        return version

    def _see(self, pod: Obj, *, deleted: bool) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        with self.lock:
            for container in status.get("containerStatuses") or []:
                restarts = container.get("restartCount", 0)
                last, now = container.get("lastState") or {}, container.get("state") or {}
                if "terminated" in last:
                    self._ended(pod, container, last["terminated"], restarts - 1)
                if "terminated" in now:
                    self._ended(pod, container, now["terminated"], restarts)
                running_id = _cid(container.get("containerID"))
                if "running" in now and running_id and running_id not in self._ended_ids:
                    self._running.setdefault(
                        running_id, self._container(pod, container, running_id, restarts)
                    )
            if deleted:
                self._forget(pod)
                self.pods.pop(meta["name"], None)
            else:
                self.pods[meta["name"]] = pod

    def _container(self, pod: Obj, status: Obj, cid: str, restart: int) -> Container:
        meta = pod["metadata"]
        return Container(
            meta["name"], meta["uid"], status["name"], restart, cid, time.monotonic(), pod_armed(pod)
        )

    def _ended(self, pod: Obj, status: Obj, terminated: Obj, restart: int) -> None:
        cid = _cid(terminated.get("containerID"))
        if not cid or cid in self._ended_ids:
            return
        self._ended_ids.add(cid)
        ended = self._running.pop(cid, None) or self._container(pod, status, cid, max(restart, 0))
        ended.exit_code = terminated.get("exitCode")
        ended.reason = terminated.get("reason") or ""
        ended.message = terminated.get("message") or ""
        self.read_draw(ended)  # its log is still on the node now; once its Pod is gone, it is not
        self.ended.append(ended)

    def _forget(self, pod: Obj) -> None:
        """A Pod gone: its containers run no more (any exit was recorded from its statuses)."""
        for cid in [c for c, run in self._running.items() if run.uid == pod["metadata"]["uid"]]:
            self._running.pop(cid)

    def read_draw(self, container: Container) -> str | None:
        """What `container` drew, from its own log file on the node (None until it said)."""
        if container.draw is None:
            folder = f"{self.node.namespace}_{container.pod}_{container.uid}"
            path = self.node.node.kubelet.pod_logs_dir / folder / container.name / f"{container.restart}.log"
            with contextlib.suppress(OSError):
                found = DRAW_LINE.search(path.read_text(errors="replace"))
                if found:
                    container.draw = found.group(1)
        return container.draw


def pod_armed(pod: Obj) -> bool:
    """Whether this Pod's container gets `ICEFALL_FAILPOINTS_CHAOS`."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(e["name"] == CHAOS_ENV_VAR for c in containers for e in c.get("env") or [])


def _cid(container_id: str | None) -> str:
    return (container_id or "").removeprefix("containerd://")


def container_processes(init_pid: int) -> list[int]:
    """Host pids of every process in the PID namespace of `init_pid` (a container's processes)."""
    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "pid") == namespace:
                    found.append(int(entry.name))
    return found


@dataclass
class Tally:
    """Kills observed, per component and per crash point; what the containers drew; what the run SIGKILLed."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    killed: set[str] = field(default_factory=set)  # container ids this run SIGKILLed
    oom: set[str] = field(default_factory=set)  # container ids whose memory this run squeezed (OOM kill)
    by_component: Counter[str] = field(default_factory=Counter)
    by_point: Counter[tuple[str, str]] = field(default_factory=Counter)  # (component, point)
    by_table: Counter[tuple[str, str]] = field(default_factory=Counter)  # (table, component)
    #: Exits that were no kill of ours: (component, exit code, reason).
    other_exits: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    draws: Counter[str] = field(default_factory=Counter)  # point (or NOTHING, or "unknown") → starts
    seen_exits: int = 0

    def kill(self, component: str, point: str, table: str | None = None) -> None:
        with self.lock:
            self.by_component[component] += 1
            self.by_point[component, point] += 1
            if table is not None:
                self.by_table[table, component] += 1

    def total(self) -> int:
        with self.lock:
            return sum(self.by_component.values())

    def of(self, component: str) -> int:
        with self.lock:
            return self.by_component[component]


def count_exits(pods: PodWatch, tally: Tally) -> None:
    """Turn the new container exits of the Pod watch into kills (status 137 that this run caused, or an OOM
    kill of a container whose memory it squeezed)."""
    ended = pods.ended[tally.seen_exits :]
    tally.seen_exits += len(ended)
    for container in ended:
        component = container.component
        if component is None:
            continue
        drew = pods.read_draw(container)  # its log may be gone with its Pod: then "unknown"
        point = FAILPOINT_LINE.search(container.message) if container.exit_code == SIGKILL_STATUS else None
        with tally.lock:
            tally.draws[(drew or "unknown").partition("=")[0]] += 1
        table = table_of(container.pod)
        if container.reason == "OOMKilled" and container.cid in tally.oom:
            tally.kill(component, OOM_KILLED, table)
        elif point is not None:
            tally.kill(component, point.group(1), table)
        elif container.exit_code == SIGKILL_STATUS and container.cid in tally.killed:
            tally.kill(component, RANDOM, table)
        else:
            with tally.lock:
                tally.other_exits[component, container.exit_code or 0, container.reason] += 1


def sigkill(cluster: LocalCluster, tally: Tally, container: Container) -> None:
    """SIGKILL the container's PID 1 (tini): the kernel then kills all its processes; status 137."""
    pid = cluster.node.container_pid(container.cid)
    if pid is None:
        return  # it ended meanwhile
    with tally.lock:
        tally.killed.add(container.cid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def stop_all(init: int) -> list[int]:
    """SIGSTOP every process of the container whose PID 1 is `init`, again until no new one appears."""
    stopped: list[int] = []
    while new := [pid for pid in container_processes(init) if pid not in stopped]:
        signal_all(new, signal.SIGSTOP)
        stopped += new
    return stopped


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def second_writer_pod(driver: Obj) -> Obj:
    """The driver Pod's spec under another name, as a driver rescheduled during a partition would run: its own
    ServiceAccount token volume (admission adds it), another metrics port on the host network, no arming,
    none of the operator's labels (the operator must not take it for its driver)."""
    spec = copy.deepcopy(driver["spec"])
    for key in ("nodeName", "priority"):
        spec.pop(key, None)
    token = {v["name"] for v in spec.get("volumes", []) if v["name"].startswith("kube-api-access-")}
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in token]
    (container,) = spec["containers"]
    container["volumeMounts"] = [m for m in container.get("volumeMounts", []) if m["name"] not in token]
    container["env"] = [e for e in container.get("env", []) if e["name"] != CHAOS_ENV_VAR]
    port = free_port()
    container["command"] = [
        f"--metrics-port={port}" if arg.startswith("--metrics-port=") else arg for arg in container["command"]
    ]
    container.pop("ports", None)  # the driver's metrics port is a host port the paused driver still holds
    metadata = {"name": SECOND_WRITER, "labels": {"app.kubernetes.io/name": SECOND_WRITER}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
