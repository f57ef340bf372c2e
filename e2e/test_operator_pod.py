"""The chart's probes keep a healthy operator up and restart a hung one.

`helm install` of the packaged chart (`make chart`, as the README installs it) with its default probes, the
image built here and what the e2e's cluster needs (`icefall.testing.harness.local_chart_values`: the host
network, the API server's loopback address, free ports of this machine for the health and metrics endpoints);
the controllers make the operator's Pod and the node (the real kubelet on containerd) runs it as a container;
the kubelet, not the test, probes it and acts.
Proves:
- startup and readiness: the Pod becomes Ready once the operator serves kopf's /healthz (the rollout
  completes); the three probes are on that endpoint;
- a healthy operator stays up: over two liveness periods /healthz answers 200 on the node's port, the
  kubelet probes it (its requests are in the operator's log), the container keeps restartCount 0 and the
  Pod stays Ready, and no liveness or readiness probe fails;
- a hung operator is restarted: with its process frozen (SIGSTOP from the host to the operator's Python
  process, found through the container's pid: from inside the container, PID 1 ignores it), /healthz
  stops answering; the liveness probe fails (Events `Unhealthy` "Liveness probe failed", then
  `Killing`), the kubelet kills the container — SIGTERM stays pending on a stopped process, so the grace
  period ends in SIGKILL (lastState terminated, exit 137) — and starts it again (restartCount 1); the new
  process serves /healthz, the Pod is Ready again, and it takes the operator's leader Lease under a new
  identity.
The probe timings are the chart's defaults, so this is what a hung operator costs in a cluster: about
`failureThreshold x periodSeconds` to notice plus the Pod's grace period to kill.

Not proven here: what the operator does with tables (test_user_path.py runs the same chart through the
whole user path, and checks the operator container never restarted there); several replicas.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.devstack.cluster import LocalCluster
from icefall.devstack.procs import tail
from icefall.plan.names import LEADER_LEASE_NAME as LEASE_NAME
from icefall.testing.harness import Helm, image_args, local_chart_values, packaged_chart
from icefall.testing.kubeapi import JsonApi

from .conftest import REPO, Kubectl, NodeView, pod_logs, wait_for

pytestmark = pytest.mark.e2e

RELEASE = "icefall"
SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
Obj = dict[str, Any]


class OperatorPod:
    """The release's one operator Pod, its container and its /healthz on the node's port."""

    def __init__(self, rest: JsonApi, namespace: str, node: NodeView, health_port: int) -> None:
        self.rest, self.namespace, self.node = rest, namespace, node
        self.health_url = f"http://127.0.0.1:{health_port}/healthz"

    def pod(self) -> Obj:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        pods = self.rest.call("GET", path, query=[("labelSelector", SELECTOR)])["items"]
        live: list[Obj] = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == 1, [p["metadata"]["name"] for p in live]
        return live[0]

    def container(self) -> Obj:
        (status,) = (self.pod().get("status") or {}).get("containerStatuses") or [{}]
        return status

    def ready(self) -> bool:
        conditions = (self.pod().get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def healthz(self, timeout: float = 3) -> int | None:
        """The HTTP status /healthz answers with, None when it does not answer within `timeout`."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=timeout) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            return None

    def process(self) -> int:
        """The host pid of the operator's Python process: the child of the container's init (tini, the
        image's entry point, whose own command line names `icefall operator` too), or init itself."""
        container_id = self.container()["containerID"]
        init = self.node.node.container_pid(container_id)
        assert init is not None, f"no running task for {container_id}"
        children = [pid for pid in _pids() if _parent(pid) == init and _is_operator(pid)]
        found = children or [pid for pid in (init,) if _is_operator(pid)]  # under tini, its child
        assert len(found) == 1, f"{found}: not one `icefall operator` in the container of pid {init}"
        return found[0]

    def events(self, reason: str) -> list[Obj]:
        name = self.pod()["metadata"]["name"]
        path = f"/api/v1/namespaces/{self.namespace}/events"
        query = [("fieldSelector", f"involvedObject.name={name},reason={reason}")]
        found: list[Obj] = self.rest.call("GET", path, query=query)["items"]
        return found

    def leader(self) -> str:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE_NAME}"
        lease = self.rest.get(path) or {}
        holder: str = (lease.get("spec") or {}).get("holderIdentity") or ""
        return holder


def _probes(log: str) -> int:
    """How many kubelet probe requests of /healthz the operator's log shows."""
    return sum(1 for line in log.splitlines() if "GET /healthz" in line and "kube-probe/" in line)


def _is_operator(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"operator" in argv and any(a.endswith(b"icefall") for a in argv)


def _pids() -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _parent(pid: int) -> int | None:
    """The parent pid of `pid` (None if it is gone): field 4 of /proc/<pid>/stat, after the `(comm)`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def operator_pod(  # noqa: PLR0917 (fixtures)
    cluster: LocalCluster,
    node: NodeView,
    kubectl: Kubectl,
    rest: JsonApi,
    e2e_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorPod]:
    home = tmp_path_factory.mktemp("helm-home")
    values = local_chart_values(cluster)
    (home / "values.yaml").write_text(yaml.safe_dump(values))
    helm = Helm(cluster.api.kubeconfig, home)
    started = time.monotonic()
    package = packaged_chart(REPO, home / "dist", home)  # as the README installs it: `make chart`, the .tgz
    helm("install", RELEASE, str(package), "-n", e2e_namespace, "-f", str(home / "values.yaml"),
         *image_args(cluster.images.icefall))  # fmt: skip
    running = OperatorPod(rest, e2e_namespace, node, values["health"]["port"])
    kubectl("-n", e2e_namespace, "rollout", "status", f"deployment/{RELEASE}", "--timeout=300s")
    print(f"[e2e] helm install to a Ready operator pod: {time.monotonic() - started:.1f}s", flush=True)
    yield running
    print(_explain(running, cluster))  # shown when a test failed


def _explain(operator: OperatorPod, cluster: LocalCluster) -> str:
    with contextlib.suppress(AssertionError):
        pod = operator.pod()
        name = pod["metadata"]["name"]
        return (
            f"--- status\n{yaml.safe_dump(pod.get('status'))}{pod_logs(operator.node, name)}\n"
            f"--- kubelet\n{cluster.node.kubelet.log_tail(30)}\n"
            f"--- controller-manager\n{tail(cluster.controller_manager.log_path, 10)}"
        )
    return f"--- kubelet\n{cluster.node.kubelet.log_tail(30)}"


def test_the_pod_is_probed_on_healthz_and_becomes_ready(operator_pod: OperatorPod) -> None:
    pod = operator_pod.pod()
    (container,) = pod["spec"]["containers"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health", "scheme": "HTTP"}, probe
    health = next(p for p in container["ports"] if p["name"] == "health")
    assert operator_pod.health_url == f"http://127.0.0.1:{health['containerPort']}/healthz"
    assert pod["spec"]["hostNetwork"] and health["hostPort"] == health["containerPort"], health
    status = operator_pod.container()
    assert status["started"] and status["ready"] and status["restartCount"] == 0, status
    assert operator_pod.healthz() == 200


def test_a_healthy_operator_stays_up(operator_pod: OperatorPod) -> None:
    pod = operator_pod.pod()
    liveness = pod["spec"]["containers"][0]["livenessProbe"]
    before = operator_pod.container()
    probed_before = _probes(operator_pod.node.log(pod["metadata"]["name"]))
    watched = 2 * liveness["periodSeconds"] + 5
    deadline = time.monotonic() + watched
    answers = []
    while time.monotonic() < deadline:
        answers.append(operator_pod.healthz())
        status = operator_pod.container()
        assert status["restartCount"] == 0 and status["ready"], status
        time.sleep(3)
    assert set(answers) == {200}, answers
    after = operator_pod.container()
    assert after["containerID"] == before["containerID"] and after["restartCount"] == 0, after
    failed = [e for e in operator_pod.events("Unhealthy") if "Startup probe" not in e.get("message", "")]
    assert not failed, failed
    # The kubelet probed it meanwhile (kopf's server logs each request; the kubelet's agent is kube-probe):
    # every liveness period and every readiness period at least once.
    probed = _probes(operator_pod.node.log(pod["metadata"]["name"])) - probed_before
    assert probed >= 2 + 2, f"{probed} probe requests in {watched} s"
    print(f"[e2e] {len(answers)} answers 200, {probed} kubelet probes over {watched} s, restartCount 0")


@pytest.mark.timeout(600)
def test_a_hung_operator_is_restarted(operator_pod: OperatorPod, cluster: LocalCluster) -> None:
    before = operator_pod.container()
    assert before["restartCount"] == 0, before
    leader = wait_for("the operator to hold its leader Lease", operator_pod.leader, timeout=60)
    frozen = operator_pod.process()
    started = time.monotonic()
    os.kill(frozen, signal.SIGSTOP)
    try:
        assert operator_pod.healthz() is None, "a frozen operator still answered /healthz"

        def restarted() -> Obj | None:
            status = operator_pod.container()
            return status if status.get("restartCount", 0) >= 1 else None

        status = wait_for(
            "the kubelet to restart the frozen operator", restarted, timeout=300, every=2,
            details=lambda: _explain(operator_pod, cluster),
        )  # fmt: skip
        print(f"[e2e] restarted {time.monotonic() - started:.0f} s after SIGSTOP", flush=True)
    finally:
        # Should the kubelet not have killed it, let it go on (the namespace's deletion then ends it).
        with contextlib.suppress(ProcessLookupError):
            os.kill(frozen, signal.SIGCONT)
    last = status["lastState"]["terminated"]
    # SIGTERM stays pending on a stopped process: only the SIGKILL at the end of the grace period ends it.
    assert last["exitCode"] == 137, last
    assert last["containerID"] == before["containerID"] != status["containerID"], (before, status)
    unhealthy = operator_pod.events("Unhealthy")
    assert any("Liveness probe failed" in e.get("message", "") for e in unhealthy), unhealthy
    killing = operator_pod.events("Killing")
    assert any("liveness probe" in e.get("message", "") for e in killing), killing

    wait_for("the restarted operator Ready", operator_pod.ready, timeout=300, every=2,
             details=lambda: _explain(operator_pod, cluster))  # fmt: skip
    assert operator_pod.healthz() == 200
    assert operator_pod.process() != frozen
    # The new process takes the leader Lease (once the frozen one's has run out) and reconciles.
    pod_name = operator_pod.pod()["metadata"]["name"]
    new_leader = wait_for(
        "the restarted operator to take the leader Lease",
        lambda: (holder := operator_pod.leader()) != leader and holder.startswith(pod_name) and holder,
        timeout=120,
        details=lambda: _explain(operator_pod, cluster),
    )
    print(
        f"[e2e] Ready again {time.monotonic() - started:.0f} s after SIGSTOP; leader {new_leader}", flush=True
    )
    status = operator_pod.container()
    assert status["restartCount"] == 1 and status["ready"], status
