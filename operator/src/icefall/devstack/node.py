"""A real Kubernetes node on this machine: containerd (with runc) and the real kubelet, on loopback.

`Node.start()` starts containerd with a configuration of its own (its socket and state in `workdir`, its
image store in the cache folder so the imported image survives between runs), imports the images it is
given from podman's store when containerd lacks them (`podman save | ctr images import`), and starts the
kubelet built from the same Kubernetes version as the API server, registered as node `NODE_NAME` whose
address is 127.0.0.1. Pods run as real containers: the runtime applies their users, read-only roots,
memory and CPU limits, probes, volumes and restart policies. There is no pod network here (traffic to
private-range addresses is not allowed on this machine): pods must use `hostNetwork: true`; the CNI
configuration holds only the loopback plugin, so the runtime reports its network ready.

What the kubelet needs of the host, found by trying: cgroups v1 (`failCgroupV1: false`) through cgroupfs,
swap allowed, containerd's `restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE), and the three
kernel settings it would otherwise change itself (`KERNEL_SETTINGS`, set before it starts and put back
when it stops).

Guarantees: `stop()` stops the kubelet, kills every container this containerd runs, unmounts what the
kubelet mounted under `workdir` and stops containerd, even if one step fails; `start()` first kills,
removes and unmounts what a run that was killed left behind. Not guaranteed: a node shared by two test
runs at once (the image store is locked: the second waits).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.procs import ManagedProcess, StartError, free_port, tail
from icefall.devstack.tools import tool_dir

#: The node's name, and its one address (what `status.hostIP` and a host-network pod's `podIP` say).
NODE_NAME = "127.0.0.1"
NODE_IP = "127.0.0.1"
CNI_BIN_DIR = "/usr/lib/cni"
#: containerd's namespace for Kubernetes' images and containers.
K8S_NAMESPACE = "k8s.io"
#: What the kubelet sets at start (unless it may not touch them, then it refuses to start).
KERNEL_SETTINGS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "icefall"


class Containerd:
    """containerd with the CRI plugin, its image store kept in the cache folder."""

    def __init__(self, workdir: Path, sandbox_image: str) -> None:
        self.workdir = workdir
        self.sandbox_image = sandbox_image
        self.root = cache_dir() / "containerd-root"
        self._lock: IO[str] | None = None
        self._proc: ManagedProcess | None = None

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    def start(self, timeout: float = 60) -> Containerd:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.root.parent / "containerd-root.lock", "w")  # noqa: SIM115 (held until stop)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        cni = self.workdir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-loopback.conflist").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": "icefall-host", "plugins": [{"type": "loopback"}]})
        )
        config = self.workdir / "containerd.toml"
        config.write_text(_containerd_config(self, cni))
        self._proc = ManagedProcess(
            "containerd", ["containerd", "--config", str(config)], self.workdir / "containerd.log"
        ).start()
        self._proc.wait_ready(lambda: self.ctr("version").returncode == 0, timeout, "serving its socket")
        kill_leftover_containers(self.socket)
        self.remove_all_containers()
        return self

    def ctr(self, *args: str, stdin: IO[bytes] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", K8S_NAMESPACE, *args],
            stdin=stdin, capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip

    def has_image(self, ref: str) -> bool:
        listed = self.ctr("images", "list", "--quiet", f"name=={_qualified(ref)}")
        return _qualified(ref) in listed.stdout.split()

    def import_from_podman(self, ref: str, attempts: int = 3) -> None:
        """Copy image `ref` from podman's store (where hack/build-image.sh built it). Tried again on failure:
        an import that finds a layer in the shared store skips it, and containerd's garbage collection
        (at start, of what earlier runs left unreferenced) may delete it before the image names it
        ("content digest ...: not found", seen once in a fresh run); the next import writes it anew."""
        for attempt in range(1, attempts + 1):
            try:
                self._import_from_podman(ref)
                return
            except StartError as error:
                if attempt == attempts:
                    raise
                print(f"[node] {error}; trying again ({attempt + 1}/{attempts})", flush=True)
                self.ctr("images", "remove", _qualified(ref))
                time.sleep(2)

    def _import_from_podman(self, ref: str) -> None:
        env = {**os.environ, "CONTAINERS_CONF": str(_repo_file("hack/node/containers.conf"))}
        with subprocess.Popen(
            ["podman", "save", "--format", "oci-archive", _qualified(ref)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        ) as save:  # fmt: skip
            assert save.stdout is not None
            imported = self.ctr("images", "import", "--index-name", _qualified(ref), "-", stdin=save.stdout)
            save.stdout.close()
            errors = save.stderr.read().decode(errors="replace") if save.stderr else ""
        if save.returncode != 0 or imported.returncode != 0:
            raise StartError(f"importing {ref} into containerd failed: {errors}{imported.stderr}")

    def remove_other_tags(self, ref: str) -> None:
        """Remove the images of `ref`'s repository with another tag (older builds; their disk space)."""
        repository = _qualified(ref).rsplit(":", 1)[0]
        for name in self.ctr("images", "list", "--quiet").stdout.split():
            if name.rsplit(":", 1)[0] == repository and name != _qualified(ref):
                self.ctr("images", "remove", name)

    def pids(self) -> dict[str, int]:
        """Container id → the pid of its process, for every running task."""
        listed = self.ctr("tasks", "list")
        found = {}
        for line in listed.stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[2] == "RUNNING":
                found[fields[0]] = int(fields[1])
        return found

    def remove_all_containers(self) -> None:
        """Kill and remove every container (and its shim), e.g. those a killed test run left."""
        for line in self.ctr("tasks", "list", "--quiet").stdout.split():
            self.ctr("tasks", "kill", "--signal", "SIGKILL", line)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.pids():
            time.sleep(0.2)
        for task in self.ctr("tasks", "list", "--quiet").stdout.split():
            self.ctr("tasks", "delete", "--force", task)
        for container in self.ctr("containers", "list", "--quiet").stdout.split():
            self.ctr("containers", "delete", container)

    def stop(self) -> None:
        try:
            if self._proc is not None and self._proc.running():
                self.remove_all_containers()
        finally:
            if self._proc is not None:
                self._proc.stop(grace=20)
                self._proc = None
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.workdir / "containerd.log", lines)


def kill_leftover_containers(socket: Path) -> None:
    """SIGKILL what a run killed outright left running (called with the store's lock held, so no other run's
    node is up): every process in the kubelet's `kubepods` cgroups, and the shims of another containerd
    socket. The new containerd never knew those (its state folder is new), and they keep running, and
    using the CPU, until the machine stops."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroups = (entry / "cgroup").read_text()
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        stale_shim = (
            Path(args[0]).name.startswith("containerd-shim")
            and "-namespace" in args
            and K8S_NAMESPACE in args
            and str(socket) not in args
        )
        if "/kubepods" in cgroups or stale_shim:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def _containerd_config(runtime: Containerd, cni: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{runtime.root}"
state = "{runtime.workdir / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{runtime.socket}"
[{cri}]
  sandbox_image = "{_qualified(runtime.sandbox_image)}"
  # root lacks CAP_SYS_RESOURCE: a pod asking for a lower oom_score_adj than containerd's would fail.
  restrict_oom_score_adj = true
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni}"
"""


def _qualified(ref: str) -> str:
    """`ref` as containerd names it (podman's `localhost/x:t` stays; a bare `x:t` is docker.io's)."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref if '/' in ref else 'library/' + ref}"


def _repo_file(relative: str) -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / relative).exists():
            return parent / relative
    raise StartError(f"{relative} not found above {__file__}")


class Kubelet:
    """The real kubelet against `api`, on `runtime`, as node `NODE_NAME` (127.0.0.1)."""

    def __init__(self, api: KubeAPIServer, runtime: Containerd, workdir: Path) -> None:
        self.api = api
        self.runtime = runtime
        self.workdir = workdir
        self.port = 0
        self._proc: ManagedProcess | None = None
        self._kernel_before: dict[str, str] = {}

    @property
    def root_dir(self) -> Path:
        return self.workdir / "root"

    @property
    def pod_logs_dir(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def log_path(self) -> Path:
        return self.workdir / "kubelet.log"

    def start(self, timeout: float = 120) -> Kubelet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, healthz = free_port(), free_port()
        config = self.workdir / "kubelet.yaml"
        config.write_text(json.dumps(self._config(healthz), indent=2))
        kubeconfig = self.api.write_kubeconfig(self.workdir / "kubeconfig", self.api.admin_token, "kubelet")
        self._set_kernel_settings()
        self._proc = ManagedProcess(
            "kubelet",
            [
                str(tool_dir("ICEFALL_KUBE_BIN") / "kubelet"), f"--config={config}",
                f"--kubeconfig={kubeconfig}", f"--root-dir={self.root_dir}",
                f"--hostname-override={NODE_NAME}", "--v=1",
            ],
            self.log_path,
        ).start()  # fmt: skip
        url = f"{self.api.url}/api/v1/nodes/{NODE_NAME}"
        self._proc.wait_ready(lambda: self._node_ready(url), timeout, "Ready (its Node's condition)")
        return self

    def _config(self, healthz: int) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": NODE_IP,
            "healthzPort": healthz,
            # Only the API server (and the tests) reach it, on loopback.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.runtime.socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(self.pod_logs_dir),
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            # The machine's disk is shared with everything else: evict only when it is truly full, and
            # never collect the image (it cannot be pulled back: there is no registry).
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "protectKernelDefaults": True,
            "makeIPTablesUtilChains": False,
            "localStorageCapacityIsolation": True,
            "shutdownGracePeriod": "0s",
        }

    def _set_kernel_settings(self) -> None:
        for key, value in KERNEL_SETTINGS.items():
            path = Path("/proc/sys") / key
            self._kernel_before[key] = path.read_text().strip()
            path.write_text(value)

    def _node_ready(self, url: str) -> bool:
        node = http_json(url, self.api)
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        try:
            if self._proc is not None:
                self._proc.stop(grace=15)
                self._proc = None
        finally:
            for key, value in self._kernel_before.items():
                (Path("/proc/sys") / key).write_text(value)
            self._kernel_before = {}

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)


def http_json(url: str, api: KubeAPIServer) -> dict[str, Any] | None:
    """The object at `url` of the API server, as the admin; None when it does not exist (404)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api.admin_token}"})
    context = ssl.create_default_context(cafile=str(api.ca_file))
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            found: dict[str, Any] = json.loads(response.read())
            return found
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def _mounts_under(folder: Path) -> Iterator[str]:
    top = str(folder.resolve())
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == top or point.startswith(top + "/"):
            yield point


def unmount_stale(keep: Path, store: Path) -> None:
    """Unmount what a run killed outright left mounted (with the store's lock held): its containers' root
    filesystems (overlays on `store`'s snapshots), its sandboxes' /dev/shm and its kubelet's mounts,
    anywhere but under `keep`."""
    top = str(keep.resolve())
    stale = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        ours = point == top or point.startswith(top + "/")
        if not ours and (
            str(store) in fields[3]
            or "/containerd/state/io.containerd." in point
            or "/kubelet/pods/" in point
            or point.endswith("/node/kubelet")
        ):
            stale.append(point)
    for point in sorted(stale, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def unmount_under(folder: Path) -> None:
    """Unmount everything mounted at or under `folder`, deepest first: the kubelet's pods' volumes (and its
    root, which it bind-mounts onto itself), the sandboxes' /dev/shm under containerd's state."""
    if not folder.exists():
        return
    for point in sorted(_mounts_under(folder), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


class Node:
    """containerd + the kubelet, with `images` imported; `pod_log(namespace, pod)` reads a container log."""

    def __init__(self, api: KubeAPIServer, workdir: Path, *, images: Sequence[str], pause_image: str) -> None:
        self.api = api
        self.workdir = workdir
        self.images = list(images)
        self.runtime = Containerd(workdir / "containerd", pause_image)
        self.kubelet = Kubelet(api, self.runtime, workdir / "kubelet")

    def start(self) -> Node:
        try:
            self.runtime.start()
            unmount_stale(self.workdir, self.runtime.root)
            for ref in [self.runtime.sandbox_image, *self.images]:
                if not self.runtime.has_image(ref):
                    started = time.monotonic()
                    self.runtime.import_from_podman(ref)
                    self.runtime.remove_other_tags(ref)
                    print(f"[node] imported {ref} in {time.monotonic() - started:.0f}s", flush=True)
            self.kubelet.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self.kubelet.stop()
        finally:
            try:
                self.runtime.stop()
            finally:
                unmount_under(self.workdir)

    def pod_log(self, namespace: str, pod: str, uid: str | None = None) -> str:
        """The container logs of Pod `pod` (its newest incarnation, or the one with `uid`): every container,
        every restart, oldest first; '' if none yet."""
        folders = sorted(
            self.kubelet.pod_logs_dir.glob(f"{namespace}_{pod}_{uid or '*'}"), key=os.path.getmtime
        )
        if not folders:
            return ""
        logs = sorted(folders[-1].glob("*/*.log"), key=os.path.getmtime)
        return "".join(_cri_log_text(path) for path in logs)

    def pod_volume(self, uid: str, volume: str) -> Path:
        """Where the kubelet keeps emptyDir `volume` of the Pod with `uid` on this node."""
        return self.kubelet.root_dir / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / volume

    def container_pid(self, container_id: str) -> int | None:
        """The host pid of a running container's process (`containerStatuses[].containerID`)."""
        return self.runtime.pids().get(container_id.removeprefix("containerd://"))


def _cri_log_text(path: Path) -> str:
    """A CRI log file's text: each line is `<time> <stream> <P|F> <text>` (P: the line goes on)."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4:
                out.append(parts[3] + ("" if parts[2] == "P" else "\n"))
    return "".join(out)
