"""The node runs pods as real containers from the image we ship, and the runtime, not our code, applies the
pod spec.

Proves, each on Pods of the image hack/build-image.sh built, on the real kubelet + containerd + runc:
- the restricted security context the operator renders: the process runs as uid 10001, the root file
  system is read-only (a write fails with EROFS), an emptyDir is writable, nothing of the host is there
  (no checkout, no virtualenv, none of the test's variables), and the image's own `icefall` runs;
- Secrets and ConfigMaps reach the container as variables and as files; the projected ServiceAccount token
  works for in-cluster clients (the Pod reads itself) under RBAC (reading Secrets is refused);
- a memory limit is enforced by the kernel: a process above it is OOM-killed (exit 137, OOMKilled);
- a failing liveness probe restarts the container; readiness gates the Ready condition;
- `restartPolicy: OnFailure` restarts a container that exits non-zero;
- two pods never share an emptyDir.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from icefall.devstack.cluster import LocalCluster
from icefall.testing.kubeapi import JsonApi

from .conftest import REPO, Kubectl, NodeView, wait_for

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]
UID = 10001


@pytest.fixture(scope="module")
def make_pod(cluster: LocalCluster, rest: JsonApi, e2e_namespace: str) -> Callable[..., Obj]:
    wait_for(
        "the namespace's default ServiceAccount",
        lambda: rest.get(f"/api/v1/namespaces/{e2e_namespace}/serviceaccounts/default"),
    )

    def make(name: str, script: str, **overrides: Any) -> Obj:
        container: Obj = {
            "name": "main",
            "image": cluster.images.icefall,
            "imagePullPolicy": "Never",
            "command": ["bash", "-c", script],
            "env": cluster.api_env(),
            "securityContext": {
                "runAsNonRoot": True,
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            **overrides.pop("container", {}),
        }
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": e2e_namespace},
            "spec": {
                "hostNetwork": True,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 2,
                "securityContext": {"runAsUser": UID, "runAsGroup": UID, "fsGroup": UID},
                "containers": [container],
                "volumes": [{"name": "tmp", "emptyDir": {}}],
                **overrides,
            },
        }
        created: Obj = rest.call("POST", f"/api/v1/namespaces/{e2e_namespace}/pods", pod)
        return created

    return make


def _pod(rest: JsonApi, namespace: str, name: str) -> Obj:
    found = rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert found is not None, name
    return found


def _terminated(rest: JsonApi, namespace: str, name: str, node: NodeView, timeout: float = 120) -> Obj:
    def done() -> Obj | None:
        statuses = _pod(rest, namespace, name).get("status", {}).get("containerStatuses") or [{}]
        state: Obj | None = statuses[0].get("state", {}).get("terminated")
        return state

    found: Obj = wait_for(f"pod {name} to finish", done, timeout=timeout, details=lambda: node.log(name))
    return found


def test_restricted_pod_runs_as_the_image_user_with_nothing_of_the_host(
    make_pod: Callable[..., Obj], rest: JsonApi, e2e_namespace: str, node: NodeView
) -> None:
    script = f"""
        id -u; id -g
        touch /written 2>&1 || true
        echo scratch > /tmp/scratch && cat /tmp/scratch
        test -e {REPO} && echo "checkout visible" || echo "no checkout"
        env | grep -E '^(ICEFALL_SPARK_JARS|PYTHONPATH|KUBECONFIG)=' || echo "no host variables"
        icefall --version
        python -c 'import pyspark, icefall, sys; print(pyspark.__version__, icefall.__file__, sys.prefix)'
        ls /opt/spark/jars | grep -c iceberg-spark-runtime
    """
    make_pod("restricted", script)
    state = _terminated(rest, e2e_namespace, "restricted", node)
    log = node.log("restricted")
    assert state["exitCode"] == 0, log
    lines = log.splitlines()
    assert lines[:2] == [str(UID), str(UID)], log
    assert "touch: cannot touch '/written': Read-only file system" in log
    assert "scratch" in lines
    assert "no checkout" in lines and "no host variables" in lines, log
    assert any(line.startswith("icefall ") for line in lines), log
    assert any("/opt/icefall/lib/python3" in line and line.endswith("/opt/icefall") for line in lines), log
    assert lines[-1] == "1", "Icefall's jars are in Spark's jar folder"


def test_secrets_configmaps_and_the_service_account_token(
    make_pod: Callable[..., Obj], cluster: LocalCluster, rest: JsonApi, e2e_namespace: str, node: NodeView
) -> None:
    ns = e2e_namespace
    rest.call("POST", f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
        "stringData": {"password": "s3cr3t"},
    })  # fmt: skip
    rest.call("POST", f"/api/v1/namespaces/{ns}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"level": "debug"},
    })  # fmt: skip
    rest.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "read-pods"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    })  # fmt: skip
    rest.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "read-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
    })  # fmt: skip
    client = f"""
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
config.load_incluster_config()
api = client.CoreV1Api()
print("self", api.read_namespaced_pod("identity", "{ns}").spec.service_account_name)
try:
    api.read_namespaced_secret("creds", "{ns}")
    print("secret read")
except ApiException as error:
    print("secret refused", error.status)
"""
    script = f"""
        echo "env $PASSWORD $LEVEL"
        echo "files $(cat /etc/creds/password) $(cat /etc/settings/level)"
        python -c '{client}'
    """
    make_pod(
        "identity",
        script,
        container={
            "env": [
                *cluster.api_env(),
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
            ],
            "volumeMounts": [
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
                {"name": "settings", "mountPath": "/etc/settings", "readOnly": True},
            ],
        },
        volumes=[
            {"name": "tmp", "emptyDir": {}},
            {"name": "creds", "secret": {"secretName": "creds"}},
            {"name": "settings", "configMap": {"name": "settings"}},
        ],
    )
    state = _terminated(rest, ns, "identity", node)
    log = node.log("identity")
    assert state["exitCode"] == 0, log
    assert "env s3cr3t debug" in log and "files s3cr3t debug" in log, log
    assert "self default" in log, log
    assert "secret refused 403" in log, log


def test_memory_limit_is_an_oom_kill(
    make_pod: Callable[..., Obj], rest: JsonApi, e2e_namespace: str, node: NodeView
) -> None:
    make_pod(
        "hungry",
        "python -c 'x = bytearray(400 * 1024 * 1024); print(\"survived\")'",
        container={"resources": {"limits": {"memory": "128Mi"}}},
    )
    state = _terminated(rest, e2e_namespace, "hungry", node)
    assert (state["exitCode"], state["reason"]) == (137, "OOMKilled"), state
    assert "survived" not in node.log("hungry")


def test_probes_restart_a_failing_container_and_gate_readiness(
    make_pod: Callable[..., Obj], rest: JsonApi, e2e_namespace: str, node: NodeView, kubectl: Kubectl
) -> None:
    make_pod(
        "probed",
        "touch /tmp/alive; sleep 3600",
        restartPolicy="Always",
        container={
            # Alive while /tmp/alive exists; ready once /tmp/ready does.
            "livenessProbe": {"exec": {"command": ["test", "-e", "/tmp/alive"]}, "periodSeconds": 1,
                              "failureThreshold": 2},
            "readinessProbe": {"exec": {"command": ["test", "-e", "/tmp/ready"]}, "periodSeconds": 1},
        },
    )  # fmt: skip

    def status() -> Obj:
        found: Obj = _pod(rest, e2e_namespace, "probed").get("status", {})
        return found

    def ready() -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in status().get("conditions", []))

    wait_for(
        "probed running", lambda: (status().get("containerStatuses") or [{}])[0].get("started"), timeout=60
    )
    assert not ready(), "not ready before /tmp/ready exists"
    kubectl("exec", "-n", e2e_namespace, "probed", "--", "touch", "/tmp/ready")
    wait_for("probed Ready", ready, timeout=30)
    kubectl("exec", "-n", e2e_namespace, "probed", "--", "rm", "/tmp/alive")
    restarted = wait_for(
        "the liveness probe to restart probed",
        lambda: (status().get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 1,
        timeout=60,
    )
    assert restarted
    last = status()["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] in (137, 143), last  # killed by the kubelet, not exited by itself


def test_on_failure_restarts_and_pods_share_no_disk(
    make_pod: Callable[..., Obj], rest: JsonApi, e2e_namespace: str, node: NodeView
) -> None:
    # The first run writes a marker into its emptyDir and fails; the restart finds it (same pod, same
    # volume) and succeeds. The other pod's emptyDir never has it.
    make_pod(
        "retrying",
        "if [ -e /tmp/marker ]; then echo second; exit 0; fi; touch /tmp/marker; echo first; exit 3",
        restartPolicy="OnFailure",
    )
    make_pod("neighbour", "sleep 5; test -e /tmp/marker && echo shared || echo alone")
    wait_for(
        "retrying to succeed",
        lambda: _pod(rest, e2e_namespace, "retrying")["status"].get("phase") == "Succeeded",
        timeout=120,
        details=lambda: node.log("retrying"),
    )
    status = _pod(rest, e2e_namespace, "retrying")["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1 and status["lastState"]["terminated"]["exitCode"] == 3, json.dumps(
        status
    )
    assert _terminated(rest, e2e_namespace, "neighbour", node)["exitCode"] == 0
    assert node.log("neighbour").strip() == "alone"
