"""A local kubelet for e2e tests: runs the Pods of one namespace as local processes, the way a kubelet would.

No container runtime exists here, so `LocalKubelet` stands in for kubelet + runtime on one pretend node. It
watches Pods in its namespace and, for each new one:

1. binds it to its node (the `binding` subresource sets `spec.nodeName`; there is no scheduler);
2. builds the container's environment the way the kubelet does: `value` with `$(VAR)` expansion from the
   variables defined before it, `valueFrom.secretKeyRef` / `configMapKeyRef` read from the API (a missing
   one keeps the container waiting in `CreateContainerConfigError`, retried), `fieldRef` (metadata.name,
   namespace, uid, labels, annotations, spec.nodeName, spec.serviceAccountName, status.podIP/hostIP),
   `envFrom`; on top of the *image's* environment (`image_env`: a `PATH` starting with the folder holding
   the venv's `icefall`, `HOME=/` unless the image says otherwise, plus what the caller passes, e.g. the
   Dockerfile's HOME=/tmp and the Spark jars folder). Nothing else of the test process's environment
   leaks in: no HOME, TMPDIR or KUBECONFIG of the test;
3. runs `containers[0].command + args`, or the image's entry point + args when there is no command
   (argv[0] resolved on that PATH: the image is replaced by the local install) in its own session with a
   parent-death signal and in its own mount namespace (below), in the container's `workingDir` or the
   image's (`image_workdir`, default `/`), its output in
   `<workdir>/<namespace>_<name>_<uid>/container.log`;
4. writes status through the status subresource as it goes: Pending (ContainerCreating, or
   CreateContainerConfigError) → Running (podIP: `pod_ip`, containerStatuses started/ready, restartCount)
   → Succeeded/Failed with the exit code, `terminated.reason` Completed/Error and start/finish times.
   `restartPolicy` Always/OnFailure restart the container in place (restartCount + 1, 1 s backoff);
5. when the Pod is deleted with a grace period (it gets a deletionTimestamp), sends SIGTERM to the main
   process, SIGKILL to the whole process group after `deletionGracePeriodSeconds`, writes the terminated
   status, and finishes the deletion (delete with grace 0 and a uid precondition) — without a kubelet a
   Pod with a grace period stays Terminating forever. A Pod removed outright (grace 0) gets SIGTERM and
   2 s. When the main process exits, what is left of its process group is killed (a container's PID
   namespace ends with its PID 1).
6. records every container run that ended in `exits` (`ContainerExit`: pod, exit code, its part of the
   log), and, as a test hook, adds `container_env(pod, restart_count)` to the environment of each start
   (the chaos run arms a random failpoint in each new process that way).

The file system each container sees (so the harness cannot hide a shared disk): the container starts in
a private mount namespace of its own (`unshare(CLONE_NEWNS)`, the kubelet runs as root) where
- every mount of the host is read-only (the root, /dev, /sys, ...; /proc stays as it is), so a write
  anywhere outside the pod's volumes fails with EROFS, exactly as with `readOnlyRootFilesystem: true`;
- each volume is mounted for real at its `mountPath`: an `emptyDir` is a folder
  `<pod dir>/volumes/<name>` bind-mounted read-write; `configMap` and `secret` volumes are folders
  holding their keys as files (read once, at start), mounted read-only, as is any mount with
  `readOnly: true`; `subPath` mounts that sub-folder. A mount point that does not exist yet is created
  in the volume mounted above it (as a runtime does), else on the host (the kubelet removes the empty
  folders it created there when it stops, unless another local kubelet still runs: `HOST_LOCK`). Env
  values and paths are passed through unchanged;
- the image's folders (the venv and the checkout: `image_paths`) stay visible where a volume
  covers them (a checkout under /tmp, where every pod mounts an emptyDir), bind-mounted back read-only;
- /dev/shm is a fresh tmpfs, and the folders in `hidden` (the test's temporary folders: the stack's
  state, catalogs and warehouses, other pods' volumes) are covered by an empty read-only tmpfs: a pod
  cannot even read them. The rest of the host stays READABLE (the venv, the checkout's source, the JDK,
  the jar cache, /etc): that is this kubelet's "image". So the other components (Kafka, the API server,
  a catalog, the object store) are only reachable over the network, on loopback, as from a real pod:
  a SQLite catalog or a `file://` warehouse in the test's folders cannot be shared with a pod.
- With `automountServiceAccountToken` (the pod's field, else the ServiceAccount's, default true), the
  kubelet asks the TokenRequest API for a token of the pod's ServiceAccount bound to this Pod and mounts
  token, ca.crt and namespace read-only at /var/run/secrets/kubernetes.io/serviceaccount (what the
  projected `kube-api-access` volume holds; the ServiceAccount admission plugin that adds that volume is
  disabled on the test API server), and sets KUBERNETES_SERVICE_HOST/PORT to the API server's loopback
  address, so in-cluster configuration works: the process talks to the API as its ServiceAccount, under
  the RBAC the operator rendered — not as the test's admin.

Not done (other components' jobs, or out of scope): no Node object is registered and no node heartbeats
or evictions; no probes, resource limits (an emptyDir's sizeLimit included), security contexts (the
process runs as the test's user, root: a read-only root is enforced whatever the pod asks, and a pod
could remount it, which no code of ours does), image pulls, init or sidecar containers (only
`containers[0]` runs), ports or networking (no network namespace: everything is on the host's
loopback, each pod with a loopback address of its own, `pod_ip`), PID or user namespaces, pod-level
garbage collection by owner references
(kube-controller-manager's job; see e2e/README.md). It never creates, changes or deletes anything but
the Pods it runs and their status.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from kubernetes import watch
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client.exceptions import ApiException

from icefall.devstack.procs import _die_with_parent

log = logging.getLogger(__name__)

Obj = dict[str, Any]

NODE_NAME = "icefall-local-kubelet"
#: The node's address (`status.hostIP`); each pod has a loopback address of its own (`pod_ip`).
HOST_IP = "127.0.0.1"
#: Grace after SIGTERM for a pod removed without one (deleted with gracePeriodSeconds=0).
FORCED_GRACE_SECONDS = 2.0
CONFIG_RETRY_SECONDS = 2.0
RESTART_BACKOFF_SECONDS = 1.0
SERVICE_ACCOUNT_TOKEN_SECONDS = 3600
WATCH_TIMEOUT_SECONDS = 5
#: Where a container finds its ServiceAccount's token, CA and namespace (in-cluster configuration).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: The exit code of a container whose file system could not be set up (a runtime's StartError).
START_ERROR_EXIT_CODE = 128
#: Every local kubelet on this machine holds a shared lock on this file while it runs; one that stops
#: removes the mount points it created on the host only if it can then take the lock exclusively (no
#: other kubelet, of this test run or another, may be using them: removing a folder that is a mount
#: point in another pod's mount namespace detaches that pod's mount).
HOST_LOCK = Path("/tmp/icefall-local-kubelet.lock")
_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class PodConfigError(RuntimeError):
    """A Secret, ConfigMap or key the container needs is missing: CreateContainerConfigError, retried."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class JsonApi:
    """Plain JSON calls on one ApiClient: no model classes, so objects read exactly as the server sends them.

    Also what the e2e tests use to read Pods, Events and StreamingTables as dicts."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Sequence[tuple[str, str]] = (),
        content_type: str = "application/json",
    ) -> Any:
        """The decoded response; ApiException for any status outside 2xx."""
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=30)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        return json.loads(response.data or b"{}")

    def get(self, path: str) -> Obj | None:
        """The object at `path`, or None if there is none (404)."""
        try:
            found: Obj = self.call("GET", path)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found


@dataclass(frozen=True)
class _Mount:
    """One mount of the container: the local folder (or file) `source` at `path`, the container's path."""

    path: str
    source: Path
    read_only: bool


@dataclass(frozen=True)
class _Container:
    """What starts the container, worked out once per Pod (restarts reuse it, as a kubelet does)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    mounts: list[_Mount]
    #: The JSON file the mount namespace's entry script reads (argv, cwd, mounts, hidden folders).
    spec_file: Path


@dataclass(frozen=True)
class ContainerExit:
    """One container run that ended: its Pod, exit code (128 + N when killed by signal N) and where its
    output is (`log_path` from byte `log_offset` on: the log holds every restart of the container)."""

    name: str
    uid: str
    pid: int  # also its process group: the container ran in a session of its own
    exit_code: int
    log_path: Path
    log_offset: int

    def output(self) -> str:
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")


#: A test hook: extra environment for one container start, from the Pod and its restart count.
ContainerEnv = Callable[[Obj, int], Mapping[str, str]]


@dataclass
class _PodRun:
    """One Pod this kubelet runs: its worker thread, its process and what it knows about the Pod."""

    namespace: str
    name: str
    uid: str
    folder: Path
    thread: threading.Thread | None = None
    process: subprocess.Popen[bytes] | None = None
    #: Set to stop the container within `grace` seconds: the Pod is being deleted, or the kubelet stops.
    stop: threading.Event = field(default_factory=threading.Event)
    grace: float = FORCED_GRACE_SECONDS
    #: The Pod is being deleted (not just the kubelet stopping): finish the deletion once stopped.
    deleting: bool = False
    #: Set when the Pod no longer exists in the API (nothing left to finalise or report).
    gone: threading.Event = field(default_factory=threading.Event)
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)


class LocalKubelet:
    """Runs the Pods of `namespace` as local processes; `start()` it, `stop()` it (kills what it runs).

    `bin_dir` is the folder of the local install's executables (the venv's `bin`): it leads the PATH the
    processes see. `image_env` is the rest of the "image's" environment (e.g. HOME, ICEFALL_SPARK_JARS,
    a PYTHONPATH that puts the checkout's code first), `image_workdir` its working folder, `entrypoint` its
    ENTRYPOINT (a container without `command` runs `entrypoint + args`, as a runtime does). `server` and
    `ca_file` are the API server pods reach in-cluster. `hidden` are the host folders no pod may see
    (covered by an empty read-only tmpfs in each pod's mount namespace); `workdir`, where the pods'
    folders are, should be under one of them.
    """

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        workdir: Path,
        *,
        bin_dir: Path,
        server: str,
        ca_file: Path,
        image_env: Mapping[str, str] | None = None,
        image_workdir: str = "/",
        entrypoint: Sequence[str] = (),
        hidden: Sequence[Path] = (),
    ) -> None:
        self.api = JsonApi(api)
        self.core = CoreV1Api(api)
        self.namespace = namespace
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.server = server
        self.ca_file = ca_file
        self.image_env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": "/", **(image_env or {})}
        self.image_workdir = image_workdir
        self.entrypoint = list(entrypoint)
        self.hidden = [str(path) for path in hidden]
        #: The "image": the venv and the checkout (this module lives in one: operator/src/icefall/testing).
        #: Where a pod's volume covers one (a checkout under /tmp, which pods get as an emptyDir), it is
        #: mounted back, read-only, over the volume.
        self.image_paths = sorted({str(bin_dir.resolve().parent), str(Path(__file__).resolve().parents[4])})
        api_address = urlsplit(server)
        if api_address.hostname is None:
            raise ValueError(f"server {server!r} has no host")
        self._api_host = api_address.hostname
        self._api_port = str(api_address.port or 443)
        #: Mount points this kubelet created on the host (removed, if empty, when it stops).
        self._made_on_host: list[Path] = []
        self._host_lock: Any = None
        self._runs: dict[str, _PodRun] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watch: watch.Watch | None = None
        self._watcher: threading.Thread | None = None
        #: Every pod uid this kubelet started a container for, in order (tests read restarts from it).
        self.started: list[str] = []
        #: Every container run that ended, in order (the chaos run counts kills from them).
        self.exits: list[ContainerExit] = []
        #: Test hook (the chaos run arms a random failpoint per start): called before each start of a
        #: container, its result added to the container's environment. None: the Pod's environment only.
        self.container_env: ContainerEnv | None = None

    # --- lifecycle of the kubelet itself ------------------------------------------------------------------

    def start(self) -> LocalKubelet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._host_lock = HOST_LOCK.open("a")
        fcntl.flock(self._host_lock, fcntl.LOCK_SH)
        self._watcher = threading.Thread(target=self._watch_pods, name="local-kubelet-watch", daemon=True)
        self._watcher.start()
        return self

    def stop(self) -> None:
        """Stop watching and kill every process this kubelet started (SIGTERM, then SIGKILL after 10 s)."""
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.grace = 10.0
            run.stop.set()
        for run in runs:
            if run.thread is not None:
                run.thread.join(timeout=30)
        if self._watcher is not None:
            self._watcher.join(timeout=WATCH_TIMEOUT_SECONDS + 5)
        self._remove_mount_points()

    def _remove_mount_points(self) -> None:
        """Remove the mount points this kubelet made on the host, unless another local kubelet runs."""
        with self._lock:
            made, self._made_on_host = self._made_on_host, []
        lock, self._host_lock = self._host_lock, None
        if lock is None:
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("local kubelet: another one runs; leaving the mount points %s", [str(p) for p in made])
        else:
            for path in reversed(made):  # deepest first; another program's content stays
                with contextlib.suppress(OSError):
                    path.unlink() if path.is_file() else path.rmdir()
        finally:
            lock.close()

    def running_pids(self) -> dict[str, int]:
        """Pod name → pid of its running container (also its process group), for pods running now."""
        with self._lock:
            runs = list(self._runs.values())
        found: dict[str, int] = {}
        for run in runs:
            process = run.process
            if process is not None and process.poll() is None and not run.stop.is_set():
                found[run.name] = process.pid
        return found

    def log_path(self, name: str, uid: str | None = None) -> Path | None:
        """The container log of the newest run of Pod `name` (or of that very `uid`), if any."""
        with self._lock:
            runs = [r for r in self._runs.values() if r.name == name and (uid is None or r.uid == uid)]
        if runs:
            return runs[-1].folder / "container.log"
        found = sorted(self.workdir.glob(f"{self.namespace}_{name}_{uid or '*'}/container.log"))
        return found[-1] if found else None

    # --- the watch ----------------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        resource_version: str | None = None
        while not self._stopping.is_set():
            self._watch = watch.Watch()  # type: ignore[no-untyped-call]
            kwargs: dict[str, Any] = {"timeout_seconds": WATCH_TIMEOUT_SECONDS, "deserialize": False}
            if resource_version:
                kwargs["resource_version"] = resource_version
            try:
                events = self._watch.stream(  # type: ignore[no-untyped-call]
                    self.core.list_namespaced_pod, self.namespace, **kwargs
                )
                for event in events:  # plain JSON (deserialize=False); errors arrive as ApiException
                    pod: Obj = event["object"]
                    resource_version = (pod.get("metadata") or {}).get("resourceVersion") or resource_version
                    if event["type"] == "DELETED":
                        self._pod_removed(pod)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self._pod_seen(pod)
            except ApiException as error:
                if error.status == 410:
                    resource_version = None
                    self._resync()
                else:
                    log.warning("watching pods in %s failed: %s", self.namespace, error.reason)
                    time.sleep(1)
            except Exception as error:  # the connection dropped: watch again
                if not self._stopping.is_set():
                    log.warning("watching pods in %s failed: %r", self.namespace, error)
                    time.sleep(1)

    def _resync(self) -> None:
        """After a lost watch: pods we run that are gone from the API are stopped."""
        pods = self.api.call("GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        alive = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            runs = [r for uid, r in self._runs.items() if uid not in alive]
        for run in runs:
            run.gone.set()
            run.deleting = True
            run.stop.set()
        for pod in pods:
            self._pod_seen(pod)

    def _pod_seen(self, pod: Obj) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        deleting = bool(meta.get("deletionTimestamp"))
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node != NODE_NAME:
            return  # another node's (none exist here, but a Pod may name one)
        with self._lock:
            run = self._runs.get(uid)
            ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            idle = run is None or run.thread is None or not run.thread.is_alive()
            if idle and (deleting or ended):
                # Nothing runs for it (it ended, or was deleted before it started): a deletion only needs
                # finishing, which is what a node does for a Pod whose containers are all gone.
                finish = deleting
            elif run is None:
                folder = self.workdir / f"{self.namespace}_{meta['name']}_{uid}"
                run = _PodRun(self.namespace, meta["name"], uid, folder)
                run.thread = threading.Thread(
                    target=self._run_pod, args=(run, pod), name=f"pod-{meta['name']}", daemon=True
                )
                self._runs[uid] = run
                run.thread.start()
                return
            else:
                finish = False
                if deleting and not run.deleting:
                    run.grace = float(meta.get("deletionGracePeriodSeconds") or 0) or FORCED_GRACE_SECONDS
                    run.deleting = True
                    run.stop.set()
        if finish:
            self._finalise_deletion(meta["name"], uid)

    def _pod_removed(self, pod: Obj) -> None:
        with self._lock:
            run = self._runs.get(pod["metadata"]["uid"])
        if run is not None:
            run.gone.set()
            if not run.deleting:
                run.grace = FORCED_GRACE_SECONDS
                run.deleting = True
                run.stop.set()

    # --- one pod ------------------------------------------------------------------------------------------

    def _run_pod(self, run: _PodRun, pod: Obj) -> None:
        """The worker of one Pod. It owns the process until it ends: the parent-death signal is per thread."""
        try:
            self._bind(run, pod)
            self._set_status(run, self._waiting_status(pod, "ContainerCreating", ""))
            container = self._prepare(run, pod)
            policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
            while True:
                started = _now()
                code = self._run_container(run, pod, container, started=started)
                run.exit_codes.append(code)
                again = not run.stop.is_set() and (policy == "Always" or (policy == "OnFailure" and code))
                if not again:
                    if not self._stopping.is_set():  # a kubelet going away leaves the status as it was
                        self._set_status(run, self._terminated_status(pod, run, code, started))
                    break
                run.restarts += 1
                if run.stop.wait(RESTART_BACKOFF_SECONDS):
                    break
        except Exception as error:
            log.exception("local kubelet: pod %s/%s failed to run", run.namespace, run.name)
            self._set_status(run, self._failed_to_start_status(pod, str(error)))
        finally:
            if run.deleting and not run.gone.is_set():
                self._finalise_deletion(run.name, run.uid)

    def _bind(self, run: _PodRun, pod: Obj) -> None:
        if (pod.get("spec") or {}).get("nodeName"):
            return
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": run.name, "namespace": run.namespace, "uid": run.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
        }
        with contextlib.suppress(ApiException):  # deleted meanwhile, or bound already: the status says
            self.api.call("POST", f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/binding", binding)

    def _prepare(self, run: _PodRun, pod: Obj) -> _Container:
        """argv, env, working folder and mounts of the container; waits (CreateContainerConfigError) for
        config."""
        while True:
            try:
                container = self._container_config(run, pod)
                self._make_mount_points(container.mounts)
                return container
            except PodConfigError as error:
                self._set_status(run, self._waiting_status(pod, "CreateContainerConfigError", str(error)))
                if run.stop.wait(CONFIG_RETRY_SECONDS):
                    raise RuntimeError(f"deleted before it could start: {error}") from None

    def _container_config(self, run: _PodRun, pod: Obj) -> _Container:
        spec = pod["spec"]
        container = spec["containers"][0]
        mounts = self._volumes(run, pod, container)
        env: dict[str, str] = dict(self.image_env)
        account = self._service_account_credentials(run, pod)
        if account is not None:
            mounts.append(_Mount(SERVICE_ACCOUNT_DIR, account, read_only=True))
            env["KUBERNETES_SERVICE_HOST"] = self._api_host
            env["KUBERNETES_SERVICE_PORT"] = self._api_port
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            data = self._env_from(run.namespace, source)
            env.update({f"{prefix}{key}": value for key, value in data.items()})
        for var in container.get("env") or []:
            if "valueFrom" in var:
                value = self._value_from(run.namespace, pod, var["name"], var["valueFrom"])
                if value is None:
                    continue
            else:
                value = _expand(var.get("value", ""), env)
            env[var["name"]] = value
        command = [_expand(part, env) for part in container.get("command") or []]
        args = [_expand(part, env) for part in container.get("args") or []]
        if not command:
            command = list(self.entrypoint)
        if not command:
            raise RuntimeError(
                "containers[0].command is empty: this kubelet has no image entry point to fall back on"
            )
        argv = [*command, *args]
        resolved = shutil.which(argv[0], path=env["PATH"])
        if resolved is None:
            raise RuntimeError(f"{argv[0]!r} is not in the local install's PATH {env['PATH']}")
        argv[0] = resolved
        cwd = container.get("workingDir") or self.image_workdir
        # Parents before children: a mount point inside another mount is made in (and mounted over) it.
        mounts.sort(key=lambda mount: len(PurePosixPath(mount.path).parts))
        spec_file = run.folder / "container.json"
        entry = {
            "argv": argv,
            "cwd": cwd,
            "hidden": self.hidden,
            "image": self.image_paths,
            "mounts": [{"path": m.path, "source": str(m.source), "readOnly": m.read_only} for m in mounts],
        }
        spec_file.write_text(json.dumps(entry, indent=2))
        return _Container(argv, env, cwd, mounts, spec_file)

    def _make_mount_points(self, mounts: Sequence[_Mount]) -> None:
        """Create each mount point that is missing, as a runtime does: inside the volume mounted above it,
        else on the host (remembered, to be removed when the kubelet stops)."""
        for mount in mounts:
            path = PurePosixPath(mount.path)
            above = [m for m in mounts if m is not mount and PurePosixPath(m.path) in path.parents]
            if above:
                parent = max(above, key=lambda m: len(m.path))
                _make_point(parent.source / path.relative_to(parent.path), is_dir=mount.source.is_dir())
                continue
            made = _make_point(Path(path), is_dir=mount.source.is_dir())
            with self._lock:
                self._made_on_host.extend(p for p in made if p not in self._made_on_host)

    def _volumes(self, run: _PodRun, pod: Obj, container: Obj) -> list[_Mount]:
        """The container's mounts, each with its local folder (or file, for a subPath onto a key)."""
        folders: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            folder = run.folder / "volumes" / volume["name"]
            folder.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume or "secret" in volume:
                self._fill_volume(run.namespace, volume, folder)
            elif "emptyDir" not in volume:
                raise RuntimeError(
                    f"volume {volume['name']}: only emptyDir, configMap and secret are supported"
                )
            folders[volume["name"]] = folder
        mounts: list[_Mount] = []
        for mount in container.get("volumeMounts") or []:
            name = mount["name"]
            if name not in folders:
                raise PodConfigError(f"volumeMounts: no volume named {name}")
            source = folders[name]
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            path = mount["mountPath"].rstrip("/") or "/"
            if not path.startswith("/") or path == "/":
                raise RuntimeError(f"volumeMounts {name}: mountPath {mount['mountPath']!r} is not allowed")
            volume = next(v for v in pod["spec"]["volumes"] if v["name"] == name)
            read_only = bool(mount.get("readOnly")) or "configMap" in volume or "secret" in volume
            mounts.append(_Mount(path, source, read_only))
        return mounts

    def _fill_volume(self, namespace: str, volume: Obj, folder: Path) -> None:
        if "configMap" in volume:
            source, kind = volume["configMap"], "configmaps"
        else:
            source, kind = volume["secret"], "secrets"
        name = source.get("name") or source.get("secretName")
        found = self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if found is None:
            if source.get("optional"):
                return
            raise PodConfigError(f"volume {volume['name']}: {kind[:-1]} {name!r} not found")
        data = _decoded(found, secret=kind == "secrets")
        items = source.get("items")
        pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
        for key, path in pairs:
            if key not in data:
                raise PodConfigError(f"volume {volume['name']}: key {key!r} not in {kind[:-1]} {name!r}")
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[key])

    def _service_account_credentials(self, run: _PodRun, pod: Obj) -> Path | None:
        """A folder with a token bound to this Pod for its ServiceAccount, the CA and the namespace (or
        None: no token for this Pod)."""
        spec = pod["spec"]
        account_name = spec.get("serviceAccountName") or "default"
        automount = spec.get("automountServiceAccountToken")
        account = self.api.get(f"/api/v1/namespaces/{run.namespace}/serviceaccounts/{account_name}")
        if account is None:
            raise PodConfigError(f"serviceaccount {account_name!r} not found")
        if automount is None:
            automount = account.get("automountServiceAccountToken", True)
        if not automount:
            return None
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": SERVICE_ACCOUNT_TOKEN_SECONDS,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": run.name, "uid": run.uid},
            },
        }
        path = f"/api/v1/namespaces/{run.namespace}/serviceaccounts/{account_name}/token"
        token = self.api.call("POST", path, request)["status"]["token"]
        folder = run.folder / "serviceaccount"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "token").write_text(token)
        (folder / "namespace").write_text(run.namespace)
        shutil.copyfile(self.ca_file, folder / "ca.crt")
        return folder

    def _env_from(self, namespace: str, source: Obj) -> dict[str, str]:
        if "configMapRef" in source:
            ref, kind = source["configMapRef"], "configmaps"
        else:
            ref, kind = source["secretRef"], "secrets"
        found = self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{ref['name']}")
        if found is None:
            if ref.get("optional"):
                return {}
            raise PodConfigError(f"envFrom: {kind[:-1]} {ref['name']!r} not found")
        return _decoded(found, secret=kind == "secrets")

    def _value_from(self, namespace: str, pod: Obj, name: str, source: Obj) -> str | None:
        for kind, key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
            if key not in source:
                continue
            ref = source[key]
            found = self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{ref['name']}")
            data = _decoded(found, secret=kind == "secrets") if found else None
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    return None
                what = f"{kind[:-1]} {ref['name']!r}" + (
                    "" if data is None else f" has no key {ref['key']!r}"
                )
                raise PodConfigError(f"env {name}: {what}" + (" not found" if data is None else ""))
            return data[ref["key"]]
        if "fieldRef" in source:
            return _field(pod, source["fieldRef"]["fieldPath"])
        raise RuntimeError(f"env {name}: only secretKeyRef, configMapKeyRef and fieldRef are supported")

    def _run_container(self, run: _PodRun, pod: Obj, container: _Container, *, started: str) -> int:
        """Start the process, report Running, wait for its exit or for a stop; the exit code.

        The process is this venv's Python running `_ENTER_POD` (isolated: -I -S), which makes the pod's
        mount namespace and then execs the container's command in place: same pid and session."""
        log_path = run.folder / "container.log"
        env = dict(container.env)
        if self.container_env is not None:
            env.update(self.container_env(pod, run.restarts))
        with log_path.open("ab") as out:
            offset = out.tell()
            out.write(f"--- {started} local kubelet: {' '.join(container.argv)}\n".encode())
            out.flush()
            run.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _ENTER_POD, str(container.spec_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd="/",
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (only prctl runs before exec)
            )
        with self._lock:
            self.started.append(run.uid)
        self._set_status(run, self._running_status(pod, run, started))
        process = run.process
        while process.poll() is None:
            if run.stop.wait(0.2):
                self._terminate(process, run.grace)
                break
        code = process.wait()
        # The container ends with its main process: nothing it started outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, like a container runtime
        with self._lock:
            self.exits.append(ContainerExit(run.name, run.uid, process.pid, code, log_path, offset))
        return code

    @staticmethod
    def _terminate(process: subprocess.Popen[bytes], grace: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def _finalise_deletion(self, name: str, uid: str) -> None:
        """Remove a Pod whose containers are gone (what the kubelet's status manager does)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        with contextlib.suppress(ApiException):  # gone already (404) or another pod by now (409)
            self.api.call("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}", body)

    # --- status -------------------------------------------------------------------------------------------

    def _set_status(self, run: _PodRun, status: Obj) -> None:
        """Merge-patch the Pod's status; the uid in the patch keeps a stale worker off a newer namesake."""
        patch = {"metadata": {"uid": run.uid}, "status": status}
        path = f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status"
        try:
            self.api.call("PATCH", path, patch, content_type="application/merge-patch+json")
        except ApiException as error:
            if error.status not in (404, 409, 422):
                log.warning("pod %s/%s: status not written: %s", run.namespace, run.name, error.reason)

    def _container_status(self, pod: Obj, run: _PodRun, state: Obj, *, ready: bool) -> Obj:
        container = pod["spec"]["containers"][0]
        status: Obj = {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": f"local://{self.bin_dir}",
            "ready": ready,
            "started": "running" in state,
            "restartCount": run.restarts,
            "state": state,
        }
        if run.process is not None:
            status["containerID"] = f"local://{run.process.pid}"
        return status

    @staticmethod
    def _conditions(*, ready: bool) -> list[Obj]:
        now = _now()
        flag = "True" if ready else "False"
        return [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ]

    def _base(self, pod: Obj, phase: str, *, ready: bool) -> Obj:
        address = pod_ip(pod["metadata"]["uid"])
        return {
            "phase": phase,
            "hostIP": HOST_IP,
            "podIP": address,
            "podIPs": [{"ip": address}],
            "conditions": self._conditions(ready=ready),
        }

    def _waiting_status(self, pod: Obj, reason: str, message: str) -> Obj:
        run = _PodRun(self.namespace, pod["metadata"]["name"], pod["metadata"]["uid"], Path())
        waiting = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        return {
            **self._base(pod, "Pending", ready=False),
            "startTime": _now(),
            "containerStatuses": [self._container_status(pod, run, waiting, ready=False)],
        }

    def _running_status(self, pod: Obj, run: _PodRun, started: str) -> Obj:
        state = {"running": {"startedAt": started}}
        return {
            **self._base(pod, "Running", ready=True),
            "containerStatuses": [self._container_status(pod, run, state, ready=True)],
        }

    def _terminated_status(self, pod: Obj, run: _PodRun, code: int, started: str) -> Obj:
        state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started,
                "finishedAt": _now(),
                **({"containerID": f"local://{run.process.pid}"} if run.process else {}),
            }
        }
        return {
            **self._base(pod, "Succeeded" if code == 0 else "Failed", ready=False),
            "containerStatuses": [self._container_status(pod, run, state, ready=False)],
        }

    def _failed_to_start_status(self, pod: Obj, message: str) -> Obj:
        run = _PodRun(self.namespace, pod["metadata"]["name"], pod["metadata"]["uid"], Path())
        state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message[:1000]}}
        return {
            **self._base(pod, "Failed", ready=False),
            "containerStatuses": [self._container_status(pod, run, state, ready=False)],
        }


# --- helpers ------------------------------------------------------------------------------------------------


def _decoded(obj: Obj, *, secret: bool) -> dict[str, str]:
    if secret:
        return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()} | dict(
            obj.get("stringData") or {}
        )
    return dict(obj.get("data") or {})


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`, others stay."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(replace, value)


def _make_point(path: Path, *, is_dir: bool) -> list[Path]:
    """Create the mount point `path` (a folder, or an empty file to mount a file on) and its missing
    parents; the paths created, outermost first."""
    made: list[Path] = []
    for parent in reversed(path.parents):
        if not parent.exists():
            parent.mkdir()
            made.append(parent)
    if not path.exists():
        if is_dir:
            path.mkdir()
        else:
            path.touch()
        made.append(path)
    return made


#: Runs as the container's process before its command: makes the pod's mount namespace, then execs the
#: command in place. Only the standard library (it runs with -I -S); argv[1] is the `container.json` the
#: kubelet wrote. Order matters: the volumes' folders are opened before anything covers them (they live
#: under a hidden folder, and /tmp may be a mount point), binds copy their source mount's flags (so they
#: are made before the root turns read-only), and every mount is made read-only last, except /proc, the
#: fresh /dev/shm and the writable volumes.
_ENTER_POD = r"""
import ctypes, json, os, re, sys

CLONE_NEWNS, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x20000, 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 32, 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

def call(what, result):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")

def mount(source, target, fstype, flags, data=None):
    enc = lambda v: v.encode() if v is not None else None
    done = libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data))
    call(f"mount {source or ''} on {target}", done)

def under(path, folders):
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)

try:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    call("unshare(CLONE_NEWNS)", libc.unshare(CLONE_NEWNS))
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    sources = [os.open(m["source"], os.O_PATH | os.O_CLOEXEC) for m in spec["mounts"]]
    image = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in spec["image"]]
    for folder in spec["hidden"]:
        mount("pod-hidden", folder, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
    mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    writable, covered = ["/dev/shm", "/proc"], list(spec["hidden"])
    for m, fd in zip(spec["mounts"], sources):
        mount(f"/proc/self/fd/{fd}", m["path"], None, MS_BIND)
        path = os.path.realpath(m["path"])
        covered.append(path)
        if not m["readOnly"]:
            writable.append(path)
    for path, fd in image:  # the image's folders under a volume (a checkout in /tmp) stay visible, read-only
        if under(path, [m["path"] for m in spec["mounts"]]):
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4:6] for line in f]
    for point, options in points:
        # mountinfo writes a space, tab, newline or backslash in a path as an octal escape (\040)
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
        if point in writable or under(point, ["/proc"]):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        flags |= sum(KEPT[o] for o in set(options.split(",")) & KEPT.keys())
        try:
            mount(None, point, None, flags)
        except OSError:
            if not under(point, covered):  # a host mount under a pod's mount is out of reach anyway
                raise
    os.chdir(spec["cwd"])
    argv = spec["argv"]
except Exception as error:
    print(f"local kubelet: cannot set up the container's file system: {error!r}", file=sys.stderr, flush=True)
    sys.exit(START_ERROR_EXIT_CODE)
os.execve(argv[0], argv, os.environ)
""".replace("START_ERROR_EXIT_CODE", str(START_ERROR_EXIT_CODE))


def pod_ip(uid: str) -> str:
    """The pod's own address: one of loopback's 127.0.0.0/8, fixed by its uid. Pods share the host's network
    (no network namespace), but as in a cluster no two pods have the same IP, so a program that treats
    "same IP" as "same machine" (Spark reads a same-host executor's shuffle files from its disk) sees pods
    as the separate machines they are."""
    digest = hashlib.sha256(uid.encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{1 + digest[2] % 254}"


def _field(pod: Obj, path: str) -> str:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName") or NODE_NAME,
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP") or pod_ip(meta["uid"]),
        "status.hostIP": status.get("hostIP") or HOST_IP,
    }
    if path in simple:
        return str(simple[path] or "")
    keyed = _FIELD_KEY.match(path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise RuntimeError(f"fieldRef {path!r} is not supported by the local kubelet")
