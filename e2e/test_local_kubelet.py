"""The local kubelet does what a kubelet does for a Pod, on plain Pods (no operator, no Spark).

Proves, against the real kube-apiserver, with `python` from this venv as the container's command:
- a Pod is bound to the kubelet's node and moves Pending → Running with podIP, started/ready container
  status and restartCount 0; its environment is the kubelet's: `$(VAR)` expansion with `$$` escapes,
  secretKeyRef, configMapKeyRef and fieldRef values, emptyDir and configMap mount paths mapped to local
  folders (the process writes into the emptyDir, reads the configMap's key as a file), and nothing of
  the test's own environment (no KUBECONFIG of the admin);
- the process talks to the API as the Pod's ServiceAccount with a token bound to the Pod: what the Role
  grants works (get a ConfigMap), what it does not is Forbidden (list Secrets);
- a Pod whose Secret is missing waits in CreateContainerConfigError and starts once the Secret exists;
  a process exiting with 3 leaves the Pod Failed, exitCode 3, reason Error; deleting that ended Pod
  (with a grace period) removes it at once, as a node does for a Pod with no running containers;
- deleting a Pod with a grace period sends SIGTERM (the process sees it and exits), and the kubelet then
  removes the Pod from the API well before the grace period ends, as a node does; the process and
  what it started are gone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from icefall.testing.kubelet import NODE_NAME, JsonApi, LocalKubelet

from .conftest import Kubectl, pod_logs, wait_for

pytestmark = pytest.mark.e2e

PROBE = r"""
import json, os, signal, subprocess, sys, time
from pathlib import Path
from kubernetes import client, config
config.load_kube_config()
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
keys = ("A", "B", "POD_NAME", "POD_NAMESPACE", "POD_IP", "PASSWORD", "MODE", "SCRATCH", "KUBECONFIG_ADMIN")
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
    assert status["status"]["podIP"] == "127.0.0.1"
    (container,) = status["status"]["containerStatuses"]
    assert (container["ready"], container["started"], container["restartCount"]) == (True, True, 0)
    assert "running" in container["state"]
    assert seen["A"] == "alpha"
    assert seen["B"] == "alpha-beta $(A) $(MISSING)"
    assert (seen["POD_NAME"], seen["POD_NAMESPACE"], seen["POD_IP"]) == ("probe", ns, "127.0.0.1")
    assert (seen["PASSWORD"], seen["MODE"], seen["mounted_mode"]) == ("s3cret", "fast", "fast")
    assert seen["KUBECONFIG_ADMIN"] is None
    assert seen["settings"] == {"mode": "fast"}
    assert seen["secrets"] == 403  # the ServiceAccount's RBAC, not the admin's
    log_path = kubelet.log_path("probe", uid)
    assert log_path is not None
    scratch = log_path.parent / "volumes" / "scratch" / "sub"
    assert seen["SCRATCH"] == str(scratch)
    assert (scratch / "written").read_text() == "by the probe"
    assert seen["cwd"] == str(log_path.parent / "root")

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
