"""The local kubelet does what a kubelet does for a Pod, on plain Pods (no operator, no Spark).

Proves, against the real kube-apiserver, with `python` from this venv as the container's command:
- a Pod is bound to the kubelet's node and moves Pending → Running with podIP, started/ready container
  status and restartCount 0; its environment is the kubelet's: `$(VAR)` expansion with `$$` escapes,
  secretKeyRef, configMapKeyRef and fieldRef values, and nothing of the test's own environment (no
  KUBECONFIG of the admin); its emptyDir and configMap volumes are mounted at their mount paths (the
  process writes into the emptyDir's sub-folder, which lands in the pod's volume folder, and reads the
  configMap's key as a file) and it starts in the image's working folder, /;
- the process talks to the API in-cluster (the ServiceAccount files at their fixed path) as the Pod's
  ServiceAccount with a token bound to the Pod: what the Role grants works (get a ConfigMap), what it
  does not is Forbidden (list Secrets);
- a Pod whose Secret is missing waits in CreateContainerConfigError and starts once the Secret exists;
  a process exiting with 3 leaves the Pod Failed, exitCode 3, reason Error; deleting that ended Pod
  (with a grace period) removes it at once, as a node does for a Pod with no running containers;
- deleting a Pod with a grace period sends SIGTERM (the process sees it and exits), and the kubelet then
  removes the Pod from the API well before the grace period ends, as a node does; the process and
  what it started are gone;
- a pod cannot write outside its volumes, as with a read-only root filesystem: writing to /, into the
  checkout (visible, read-only) or into a SQLite database in the test's folder (not even visible) fails,
  and the pod that tries it last without catching the error fails with "Read-only file system" in its
  log and exit code 1; HOME is the image's (/tmp, an emptyDir here), not the test's, and no TMPDIR
  leaks; a checkout under /tmp stays visible (read-only) in the pods despite that emptyDir; two pods
  running at once with emptyDirs at the same mount paths each see only their own files, which land in
  their own volume folders and nowhere on the host.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from icefall.testing.kubelet import NODE_NAME, JsonApi, LocalKubelet, pod_ip

from .conftest import Kubectl, pod_logs, wait_for

pytestmark = pytest.mark.e2e

PROBE = r"""
import json, os, signal, subprocess, sys, time
from pathlib import Path
from kubernetes import client, config
config.load_incluster_config()
core = client.CoreV1Api()
ns = os.environ["POD_NAMESPACE"]
settings = core.read_namespaced_config_map("settings", ns).data
try:
    core.list_namespaced_secret(ns)
    secrets = "allowed"
except client.ApiException as error:
    secrets = error.status
Path(os.environ["SCRATCH"]).mkdir(parents=True, exist_ok=True)
(Path(os.environ["SCRATCH"]) / "written").write_text("by the probe")
child = subprocess.Popen(["sleep", "600"])
keys = ("A", "B", "POD_NAME", "POD_NAMESPACE", "POD_IP", "PASSWORD", "MODE", "SCRATCH", "KUBECONFIG_ADMIN",
        "KUBECONFIG")
report = {k: os.environ.get(k) for k in keys}
report |= {"settings": settings, "secrets": secrets, "child": child.pid,
           "mounted_mode": (Path(os.environ["CONF_DIR"]) / "mode").read_text(), "cwd": os.getcwd()}
print("REPORT " + json.dumps(report), flush=True)
def stop(*_):
    print("got SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.1)
"""

Obj = dict[str, Any]


def _pod(name: str, namespace: str, args: list[str], env: list[Obj], **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serviceAccountName": "probe",
            "automountServiceAccountToken": True,
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "probe:local", "command": ["python"], "args": args, "env": env}
            ],
            **spec,
        },
    }


def _ref(kind: str, name: str, key: str) -> Obj:
    return {"valueFrom": {kind: {"name": name, "key": key}}}


def _field(path: str) -> Obj:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


@pytest.fixture(scope="module")
def accounts(e2e_namespace: str, kubectl: Kubectl) -> str:
    """ServiceAccount `probe` may get ConfigMaps and nothing else; a ConfigMap and a Secret for env."""
    ns = e2e_namespace
    kubectl("-n", ns, "create", "serviceaccount", "probe")
    kubectl("-n", ns, "create", "role", "probe", "--verb=get", "--resource=configmaps")
    kubectl("-n", ns, "create", "rolebinding", "probe", "--role=probe", f"--serviceaccount={ns}:probe")
    kubectl("-n", ns, "create", "configmap", "settings", "--from-literal=mode=fast")
    kubectl("-n", ns, "create", "secret", "generic", "probe-secret", "--from-literal=password=s3cret")
    return "probe"


def _alive(pid: int) -> bool:
    """True while `pid` runs (a killed process whose new parent has not reaped it yet is a zombie: dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def test_pod_runs_with_its_env_mounts_and_service_account_then_stops_on_delete(
    rest: JsonApi, accounts: str, kubelet: LocalKubelet, e2e_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = e2e_namespace
    monkeypatch.setenv("KUBECONFIG_ADMIN", "leaks")  # the test's environment must not reach the pod
    env = [
        {"name": "A", "value": "alpha"},
        {"name": "B", "value": "$(A)-beta $$(A) $(MISSING)"},
        {"name": "POD_NAME", **_field("metadata.name")},
        {"name": "POD_NAMESPACE", **_field("metadata.namespace")},
        {"name": "POD_IP", **_field("status.podIP")},
        {"name": "PASSWORD", **_ref("secretKeyRef", "probe-secret", "password")},
        {"name": "MODE", **_ref("configMapKeyRef", "settings", "mode")},
        {"name": "SCRATCH", "value": "/scratch/sub"},
        {"name": "CONF_DIR", "value": "/etc/probe"},
    ]
    pod = _pod(
        "probe",
        ns,
        ["-c", PROBE],
        env,
        terminationGracePeriodSeconds=30,
        volumes=[
            {"name": "scratch", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "conf", "configMap": {"name": "settings"}},
        ],
    )
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/scratch"},
        # The kubelet's folders are under /tmp too: a folder put in for /scratch is not rewritten again.
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "conf", "mountPath": "/etc/probe", "readOnly": True},
    ]
    uid = rest.call("POST", _pods(ns), pod)["metadata"]["uid"]

    def report() -> Obj | None:
        path = kubelet.log_path("probe", uid)
        text = path.read_text() if path and path.exists() else ""
        line = next((x for x in text.splitlines() if x.startswith("REPORT ")), None)
        return json.loads(line.removeprefix("REPORT ")) if line else None

    seen = wait_for("the probe's report", report, timeout=60, details=lambda: pod_logs(kubelet, "probe"))
    status = rest.get(f"{_pods(ns)}/probe")
    assert status is not None
    assert status["spec"]["nodeName"] == NODE_NAME
    assert status["status"]["phase"] == "Running"
    address = pod_ip(status["metadata"]["uid"])  # a loopback address of its own
    assert status["status"]["podIP"] == address and address.startswith("127.") and address != "127.0.0.1"
    (container,) = status["status"]["containerStatuses"]
    assert (container["ready"], container["started"], container["restartCount"]) == (True, True, 0)
    assert "running" in container["state"]
    assert seen["A"] == "alpha"
    assert seen["B"] == "alpha-beta $(A) $(MISSING)"
    assert (seen["POD_NAME"], seen["POD_NAMESPACE"], seen["POD_IP"]) == ("probe", ns, address)
    assert (seen["PASSWORD"], seen["MODE"], seen["mounted_mode"]) == ("s3cret", "fast", "fast")
    assert seen["KUBECONFIG_ADMIN"] is None
    assert seen["settings"] == {"mode": "fast"}
    assert seen["secrets"] == 403  # the ServiceAccount's RBAC, not the admin's
    assert seen["KUBECONFIG"] is None  # in-cluster configuration, as in a real pod
    log_path = kubelet.log_path("probe", uid)
    assert log_path is not None
    assert seen["SCRATCH"] == "/scratch/sub"  # passed as written: the mount is really there
    assert (log_path.parent / "volumes" / "scratch" / "sub" / "written").read_text() == "by the probe"
    assert not Path("/scratch/sub").exists()  # the host's mount point stays empty
    assert seen["cwd"] == "/"

    deleted_at = time.monotonic()
    rest.call("DELETE", f"{_pods(ns)}/probe")  # grace period 30 s, from the pod
    wait_for(
        "the kubelet to remove the deleted pod", lambda: rest.get(f"{_pods(ns)}/probe") is None, timeout=25
    )
    assert time.monotonic() - deleted_at < 25
    assert "got SIGTERM" in log_path.read_text()
    assert not _alive(seen["child"])  # what the process started died with it


def test_missing_secret_waits_then_exit_code_is_reported(
    rest: JsonApi, accounts: str, kubelet: LocalKubelet, e2e_namespace: str, kubectl: Kubectl
) -> None:
    ns = e2e_namespace
    env = [{"name": "TOKEN", **_ref("secretKeyRef", "late-secret", "token")}]
    rest.call("POST", _pods(ns), _pod("exits", ns, ["-c", "import sys; sys.exit(3)"], env))

    def waiting_reason() -> str | None:
        status = rest.get(f"{_pods(ns)}/exits") or {}
        statuses = (status.get("status") or {}).get("containerStatuses") or [{}]
        return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")

    assert wait_for("CreateContainerConfigError", waiting_reason) == "CreateContainerConfigError"
    assert (rest.get(f"{_pods(ns)}/exits") or {})["status"]["phase"] == "Pending"
    kubectl("-n", ns, "create", "secret", "generic", "late-secret", "--from-literal=token=t")

    def failed() -> Obj | None:
        status = rest.get(f"{_pods(ns)}/exits") or {}
        return status if (status.get("status") or {}).get("phase") == "Failed" else None

    status = wait_for("the pod to fail", failed, timeout=60, details=lambda: pod_logs(kubelet, "exits"))
    terminated = status["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert terminated["startedAt"] and terminated["finishedAt"]
    # Deleting a Pod whose container ended (what the operator does with a failed driver) completes at once.
    rest.call("DELETE", f"{_pods(ns)}/exits")
    wait_for("the ended pod to be removed", lambda: rest.get(f"{_pods(ns)}/exits") is None, timeout=20)


#: Run by two pods at once: writes into its HOME and its emptyDir, reports what it sees and what the
#: file system refused; `SECOND` then writes to / without catching the error, as a careless program would.
ISOLATION_PROBE = r"""
import json, os, sqlite3, sys, time
from pathlib import Path
me = os.environ["POD_NAME"]
Path(os.environ["HOME"], f"home-{me}").write_text(me)
Path("/scratch", f"scratch-{me}").write_text(me)

def refused(write):
    try:
        write()
    except (OSError, sqlite3.Error) as error:
        return str(error)
    return "written"

report = {
    "HOME": os.environ.get("HOME"), "TMPDIR": os.environ.get("TMPDIR"),
    "tmp": sorted(os.listdir("/tmp")), "scratch": sorted(os.listdir("/scratch")),
    "checkout": refused(lambda: Path(os.environ["CHECKOUT"], f"from-{me}").write_text(me)),
    "test_folder": refused(lambda: Path(os.environ["TEST_FOLDER"], f"from-{me}").write_text(me)),
    "catalog": refused(lambda: sqlite3.connect(os.environ["CATALOG"]).execute("create table t (x)")),
}
print("REPORT " + json.dumps(report), flush=True)
if os.environ.get("SECOND"):
    Path("/icefall-test-file").write_text(me)  # not caught: the pod fails as on a read-only root
while True:
    time.sleep(0.1)
"""


def test_pods_write_only_into_their_own_volumes(  # noqa: PLR0917 (fixtures)
    rest: JsonApi,
    accounts: str,
    kubelet: LocalKubelet,
    e2e_namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ns = e2e_namespace
    monkeypatch.setenv("HOME", str(tmp_path))  # neither may reach a pod
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    catalog = tmp_path / "catalog.db"
    sqlite3.connect(catalog).close()  # a SQLite catalog the test could share through the disk
    checkout = Path(__file__).resolve().parent
    uids: dict[str, str] = {}
    for name in ("first", "second"):
        env = [
            {"name": "POD_NAME", **_field("metadata.name")},
            {"name": "CHECKOUT", "value": str(checkout)},
            {"name": "TEST_FOLDER", "value": str(tmp_path)},
            {"name": "CATALOG", "value": str(catalog)},
            *([{"name": "SECOND", "value": "1"}] if name == "second" else []),
        ]
        pod = _pod(
            name,
            ns,
            ["-c", ISOLATION_PROBE],
            env,
            terminationGracePeriodSeconds=2,
            volumes=[{"name": "tmp", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}],
        )
        pod["spec"]["containers"][0]["volumeMounts"] = [
            {"name": "tmp", "mountPath": "/tmp"},  # HOME, from the image
            {"name": "scratch", "mountPath": "/scratch"},
        ]
        uids[name] = rest.call("POST", _pods(ns), pod)["metadata"]["uid"]
        # The first keeps running while the second starts: both have their volumes mounted at once.
        wait_for(f"{name}'s report", lambda n=name: _report(kubelet, n, uids[n]), timeout=60)

    first = _report(kubelet, "first", uids["first"])
    second = _report(kubelet, "second", uids["second"])
    assert first is not None and second is not None
    # A checkout under /tmp: the image's folders are mounted back over the emptyDir (their mount points show).
    image = {Path(p).parts[2] for p in kubelet.image_paths if Path(p).parts[1:2] == ("tmp",)}
    for name, seen in (("first", first), ("second", second)):
        assert (seen["HOME"], seen["TMPDIR"]) == ("/tmp", None), seen
        own = [entry for entry in seen["tmp"] if entry not in image]
        assert own == [f"home-{name}"], seen  # its own emptyDir, not the host's /tmp
        assert seen["scratch"] == [f"scratch-{name}"], seen
        assert "Read-only file system" in seen["checkout"], seen
        assert "No such file or directory" in seen["test_folder"], seen  # the test's folders are hidden
        assert "unable to open database file" in seen["catalog"], seen
        volumes = kubelet.log_path(name, uids[name])
        assert volumes is not None
        assert (volumes.parent / "volumes" / "scratch" / f"scratch-{name}").read_text() == name
        assert (volumes.parent / "volumes" / "tmp" / f"home-{name}").read_text() == name
    assert not list(tmp_path.glob("from-*")) and not list(checkout.glob("from-*"))
    assert not Path("/icefall-test-file").exists()
    assert not Path("/scratch").exists() or not any(Path("/scratch").iterdir())

    def failed() -> Obj | None:
        status = rest.get(f"{_pods(ns)}/second") or {}
        return status if (status.get("status") or {}).get("phase") == "Failed" else None

    status = wait_for(
        "the second pod to fail", failed, timeout=30, details=lambda: pod_logs(kubelet, "second")
    )
    terminated = status["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (1, "Error")
    log = kubelet.log_path("second", uids["second"])
    assert log is not None
    assert "OSError: [Errno 30] Read-only file system: '/icefall-test-file'" in log.read_text()
    for name in ("first", "second"):
        rest.call("DELETE", f"{_pods(ns)}/{name}")
    for name in ("first", "second"):
        wait_for(f"{name} to be removed", lambda n=name: rest.get(f"{_pods(ns)}/{n}") is None, timeout=20)


def _report(kubelet: LocalKubelet, name: str, uid: str) -> Obj | None:
    """The REPORT line a probe printed, decoded (None before it printed one)."""
    path = kubelet.log_path(name, uid)
    text = path.read_text() if path and path.exists() else ""
    line = next((x for x in text.splitlines() if x.startswith("REPORT ")), None)
    report: Obj | None = json.loads(line.removeprefix("REPORT ")) if line else None
    return report
