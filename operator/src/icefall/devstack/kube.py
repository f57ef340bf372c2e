"""A real Kubernetes API server backed by a real etcd, on loopback, like controller-runtime's envtest.

No controllers, scheduler or kubelet run with it: objects are stored, validated, admitted and watched for
real, but Pods never start. `KubeControllerManager` adds the real kube-controller-manager (built from the
same Kubernetes version) with a chosen set of controllers, for tests where Deployments must become Pods.
Authentication is a static token file; `admin_token` is in `system:masters`, and extra users can be given
for least-privilege tests. The serving certificate is self-signed by the API server into `certs/`, and the
kubeconfig trusts exactly that certificate. For fault tests, `kill_apiserver` / `kill_etcd` SIGKILL one of the
two and `restart_apiserver` / `restart_etcd` start it again on the same ports, certificate, tokens and data,
so clients holding the kubeconfig carry on.
"""

from __future__ import annotations

import os
import secrets
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from icefall.devstack.procs import ManagedProcess, StartError, free_port, run_checked
from icefall.devstack.tools import tool_dir


class KubeAPIServer:
    def __init__(
        self, workdir: Path, users: dict[str, str] | None = None, *, service_accounts: bool = False
    ) -> None:
        """`users` maps extra user names to the comma-separated groups they belong to (may be empty).

        `service_accounts`: the ServiceAccount admission plugin is on, as in a cluster (pods get the
        projected token volume; a pod's ServiceAccount must exist). Only with a controller-manager that
        runs the serviceaccount and root-ca-certificate-publisher controllers (`NODE_CONTROLLERS`)."""
        self.workdir = workdir
        self.service_accounts = service_accounts
        self.admin_token = secrets.token_hex(16)
        self.user_tokens = {name: secrets.token_hex(16) for name in users or {}}
        self._user_groups = dict(users or {})
        self.port = 0
        self._etcd_ports: tuple[int, int] | None = None  # client, peer: kept for a restart
        self._etcd: ManagedProcess | None = None
        self._apiserver: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def start(self, timeout: float = 120) -> KubeAPIServer:
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        (self.workdir / "certs").mkdir(parents=True)
        self.port, self._etcd_ports = 0, None  # a fresh folder: fresh keys and ports
        self._start_etcd(timeout)
        self._start_apiserver(timeout)
        self.write_kubeconfig(self.kubeconfig, self.admin_token, "admin")
        return self

    def _start_etcd(self, timeout: float) -> None:
        if self._etcd_ports is None:
            self._etcd_ports = free_port(), free_port()
        client, peer = self._etcd_ports
        etcd = str(tool_dir("ICEFALL_ETCD_BIN") / "etcd")
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._etcd = ManagedProcess(
            "etcd",
            [
                etcd, "--name=default", f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync", "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        ).start()  # fmt: skip
        self._etcd.wait_ready(lambda: http_ok(f"{self.etcd_url}/health"), timeout, "healthy")

    def _start_apiserver(self, timeout: float) -> None:
        certs = self.workdir / "certs"
        sa_key = certs / "sa.key"
        if self.port == 0:
            self._prepare_apiserver(certs, sa_key)
        apiserver = str(tool_dir("ICEFALL_KUBE_BIN") / "kube-apiserver")
        self._apiserver = ManagedProcess(
            "kube-apiserver",
            [
                apiserver, f"--etcd-servers={self.etcd_url}", f"--cert-dir={certs}",
                f"--secure-port={self.port}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                "--service-cluster-ip-range=10.96.0.0/24", "--allow-privileged=true",
                "--authorization-mode=RBAC", f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={certs / 'sa.pub'}",
                f"--service-account-signing-key-file={sa_key}",
                # Without a controller-manager nothing creates the per-namespace "default" ServiceAccount, so
                # the ServiceAccount admission plugin could only reject pods; tests check accounts themselves.
                *([] if self.service_accounts else ["--disable-admission-plugins=ServiceAccount"]),
                "--enable-priority-and-fairness=false", "--v=1",
            ],
            self.workdir / "kube-apiserver.log",
        ).start()  # fmt: skip
        self._apiserver.wait_ready(self._ready, timeout, "ready (/readyz)")

    def _prepare_apiserver(self, certs: Path, sa_key: Path) -> None:
        """The first start's keys, token file and port (a restart keeps them, and its serving certificate)."""
        run_checked(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"], self.workdir / "openssl.log", "openssl genrsa"
        )
        run_checked(
            ["openssl", "rsa", "-in", str(sa_key), "-pubout", "-out", str(certs / "sa.pub")],
            self.workdir / "openssl.log",
            "openssl rsa -pubout",
        )
        tokens = [f'{self.admin_token},admin,admin,"system:masters"']
        for name, token in self.user_tokens.items():
            tokens.append(f'{token},{name},{name},"{self._user_groups[name]}"')
        (self.workdir / "tokens.csv").write_text("\n".join(tokens) + "\n")
        self.port = free_port()

    def _ready(self) -> bool:
        if not self.ca_file.exists():
            return False
        return http_ok(f"{self.url}/readyz", token=self.admin_token, ca_file=self.ca_file)

    def write_kubeconfig(self, path: Path, token: str, user: str, namespace: str = "default") -> Path:
        path.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: icefall-test
  cluster:
    server: {self.url}
    certificate-authority: {self.ca_file}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {user}@icefall-test
  context: {{cluster: icefall-test, user: {user}, namespace: {namespace}}}
current-context: {user}@icefall-test
"""
        )
        return path

    def stop(self) -> None:
        for proc in (self._apiserver, self._etcd):
            if proc is not None:
                proc.stop()
        self._apiserver = self._etcd = None

    # -- faults: each process SIGKILLed and started again on its port, with its data (fault tests) ---------

    def kill_apiserver(self) -> None:
        """SIGKILL kube-apiserver (a crash: no graceful shutdown); etcd and its data stay."""
        if self._apiserver is not None:
            self._apiserver.kill()
            self._apiserver = None

    def restart_apiserver(self, timeout: float = 120) -> None:
        """Start kube-apiserver again on the same port, certificate and tokens (clients keep working)."""
        if self._apiserver is not None:
            raise RuntimeError("kube-apiserver is already running")
        self._start_apiserver(timeout)

    def kill_etcd(self) -> None:
        """SIGKILL etcd (a crash); its data folder stays, kube-apiserver keeps running without it."""
        if self._etcd is not None:
            self._etcd.kill()
            self._etcd = None

    def restart_etcd(self, timeout: float = 60) -> None:
        """Start etcd again on the same ports with its data; kube-apiserver reconnects by itself."""
        if self._etcd is not None:
            raise RuntimeError("etcd is already running")
        self._start_etcd(timeout)

    def ready(self) -> bool:
        """kube-apiserver answers /readyz (which needs etcd)."""
        try:
            return self._apiserver is not None and self._ready()
        except OSError:
            return False


#: Deployments become ReplicaSets and Pods, owner references are honoured, namespaces get their "default"
#: ServiceAccount. Nothing that needs nodes, a cloud or the legacy token Secrets.
DEFAULT_CONTROLLERS = ("deployment-controller", "replicaset-controller", "garbage-collector-controller",
                       "serviceaccount-controller")  # fmt: skip
#: What a cluster with a node needs besides: each namespace's `kube-root-ca.crt` (the projected token volume
#: mounts it), a deleted namespace emptied (its pods stopped), the node's `not-ready` taint lifted once
#: the kubelet reports Ready (the kubelet registers with it), and Jobs run (`deletionPolicy: Delete`'s purge).
NODE_CONTROLLERS = (
    *DEFAULT_CONTROLLERS,
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "node-lifecycle-controller",
    "job-controller",
)


class KubeControllerManager:
    """The real kube-controller-manager against `api`, running only `controllers`, as the admin user.

    `start()` returns once the ServiceAccount controller has given the `default` namespace its `default`
    ServiceAccount (the controllers are running and reach the API). No leader election, no serving port
    (`--secure-port=0`). Not guaranteed: it acts on every namespace of the API server (it has no namespace
    filter), so objects other tests left behind are reconciled too while it runs.
    """

    def __init__(self, api: KubeAPIServer, workdir: Path, controllers: tuple[str, ...] = DEFAULT_CONTROLLERS):
        self.api = api
        self.workdir = workdir
        self.controllers = controllers
        self._proc: ManagedProcess | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "kube-controller-manager.log"

    def start(self, timeout: float = 90) -> KubeControllerManager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = str(tool_dir("ICEFALL_KUBE_BIN") / "kube-controller-manager")
        self._proc = ManagedProcess(
            "kube-controller-manager",
            [
                binary, f"--kubeconfig={self.api.kubeconfig}", f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
                f"--root-ca-file={self.api.ca_file}", "--concurrent-gc-syncs=2", "--v=1",
            ],
            self.log_path,
        ).start()  # fmt: skip
        url = f"{self.api.url}/api/v1/namespaces/default/serviceaccounts/default"
        self._proc.wait_ready(
            lambda: http_ok(url, token=self.api.admin_token, ca_file=self.api.ca_file),
            timeout,
            "running its controllers (the default ServiceAccount of namespace default)",
        )
        return self

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def exit_code(self) -> int | None:
        """The code it exited with by itself (None while it runs, or after `stop()`)."""
        return None if self._proc is None else self._proc.exit_code()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None


class KubeScheduler:
    """The real kube-scheduler against `api`, as the admin user; no leader election, no serving port."""

    def __init__(self, api: KubeAPIServer, workdir: Path) -> None:
        self.api = api
        self.workdir = workdir
        self._proc: ManagedProcess | None = None

    def start(self) -> KubeScheduler:
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = str(tool_dir("ICEFALL_KUBE_BIN") / "kube-scheduler")
        self._proc = ManagedProcess(
            "kube-scheduler",
            [binary, f"--kubeconfig={self.api.kubeconfig}", "--leader-elect=false", "--secure-port=0"],
            self.workdir / "kube-scheduler.log",
        ).start()
        return self

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def exit_code(self) -> int | None:
        """The code it exited with by itself (None while it runs, or after `stop()`)."""
        return None if self._proc is None else self._proc.exit_code()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None


class Supervised(Protocol):
    def start(self) -> object: ...
    def stop(self) -> None: ...
    def exit_code(self) -> int | None: ...


#: Seconds between two looks at the supervised processes (`Restarter`).
SUPERVISE_EVERY = 1.0


class Restarter:
    """Starts control-plane processes (kube-controller-manager, kube-scheduler) again when they exit by
    themselves, as a kubelet restarts a cluster's static pods. kube-scheduler exits by design when it finds
    its cache corrupted ("Pod updated on a different node than previously added to": seen in `make chaos`
    after a kube-apiserver restart, with a Pod deleted and created again under the same name); unsupervised,
    nothing scheduled a Pod again. One line per restart; `restarts` counts them by name."""

    def __init__(self, components: Mapping[str, Supervised], every: float = SUPERVISE_EVERY) -> None:
        self.components = dict(components)
        self.every = every
        self.restarts: Counter[str] = Counter()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="control-plane-restarter", daemon=True)

    def start(self) -> Restarter:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before the components are stopped on purpose)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stopping.wait(self.every):
            for name, component in self.components.items():
                code = component.exit_code()
                if code is None or self._stopping.is_set():
                    continue
                print(f"[cluster] {name} exited with code {code}; starting it again", flush=True)
                component.stop()  # reaped: its exit is not seen twice
                self.restarts[name] += 1
                try:
                    component.start()
                except StartError as error:  # tried again on the next look
                    print(f"[cluster] {name} did not start again: {error}", flush=True)


def http_ok(url: str, token: str | None = None, ca_file: Path | None = None) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    with urllib.request.urlopen(request, timeout=3, context=context) as response:
        return bool(response.status == 200)


def install_crds(kube: KubeAPIServer, crds: Path, namespace: str) -> None:
    """Server-side apply the CRDs in `crds` with kubectl, wait until they are Established, and create
    `namespace`; RuntimeError naming the kubectl call that failed."""
    kubectl = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "HOME": str(kube.workdir)}
    for args in (
        ["apply", "--server-side", "-f", str(crds)],
        ["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"],
        ["create", "namespace", namespace],
    ):
        for _ in range(20):  # `kubectl wait` fails while a just-applied CRD has no status conditions yet
            done = subprocess.run(
                [kubectl, *args], capture_output=True, text=True, env=env, timeout=90, check=False
            )
            if done.returncode == 0 or "accessor error" not in done.stderr:
                break
            time.sleep(0.5)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}")
