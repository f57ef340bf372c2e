"""`make e2e-kind`: examples/cluster.yaml, applied unchanged to a real cluster, fills its table exactly once.

Proves, on the kind cluster hack/kind/e2e-kind.sh prepares (the image of spark_images/Dockerfile,
`helm install charts/icefall`, Kafka, MinIO and Iceberg's REST catalog server from hack/kind/*.yaml under
the Service names examples/cluster.yaml uses):
- `kubectl -n icefall apply -f examples/cluster.yaml`, as a user runs it, starts the operator (whose
  credentials come from that file's Secret) and its driver pod; the driver runs Spark on Kubernetes (the
  chart's default `k8s://` master, executors as pods of the same image);
- records produced to the topic become rows of `shop.orders` exactly once: `icefall verify`'s audit, run in
  a pod of the image on a read-only root (hack/kind/table_probe.py), reads the table through the REST
  catalog and its files from the object store, and finds no duplicates, gaps or unexpected rows, with every
  partition committed up to Kafka's high watermark;
- `kubectl get st orders` shows READY True.

Not proven here: compaction pods, recovery from a deleted pod, the PostgreSQL catalog (e2e/ covers them on
the local kubelet). It needs Docker, so `make test` never collects it: pyproject.toml's `testpaths` leave
hack/ out. The cluster is named only by ICEFALL_E2E_KUBECONFIG; without it the module fails, never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from icefall.api import load_manifest
from icefall.devstack.tools import tool_dir
from icefall.plan.children import secret_env_vars

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cluster.yaml"
PROBE = Path(__file__).resolve().parent / "table_probe.py"
NAMESPACE = "icefall"  # the README's: helm install -n icefall, kubectl -n icefall apply
IMAGE = "icefall:e2e"
RECORDS = 500
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, details: Callable[[], str]) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what`, with `details()`, after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{details()}")
        time.sleep(2)


class Kubectl:
    """kubectl (the one `make setup` builds) against the cluster of ICEFALL_E2E_KUBECONFIG."""

    def __init__(self, kubeconfig: str) -> None:
        self.binary = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
        self.env = {**os.environ, "KUBECONFIG": kubeconfig}

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 300) -> str:
        done = subprocess.run(
            [self.binary, *args],
            input=stdin, capture_output=True, text=True, env=self.env, timeout=timeout, check=False,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def diagnostics(self) -> str:
        """What a person would look at first: the table's status and Events, the pods, the operator's log."""
        return "\n".join(
            self(*args, check=False, timeout=60)
            for args in (
                ("-n", NAMESPACE, "describe", "streamingtable", "orders"),
                ("-n", NAMESPACE, "get", "pods", "-o", "wide"),
                ("-n", NAMESPACE, "logs", "deployment/icefall", "--tail=60"),
            )
        )


@pytest.fixture(scope="module")
def kubectl() -> Kubectl:
    kubeconfig = os.environ.get("ICEFALL_E2E_KUBECONFIG")
    if not kubeconfig:
        pytest.fail("ICEFALL_E2E_KUBECONFIG is not set: run this module through `make e2e-kind`")
    return Kubectl(kubeconfig)


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    """The StreamingTable of examples/cluster.yaml, as the API reads it."""
    (st,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "StreamingTable"]
    return dict(st)


def kafka_tool(kubectl: Kubectl, tool: str, *args: str, stdin: str | None = None) -> str:
    """A Kafka command-line tool inside the broker's pod, against the broker itself."""
    return kubectl(
        "-n", "kafka", "exec", "-i", "deployment/kafka", "--",
        f"/opt/kafka/bin/{tool}", "--bootstrap-server", "localhost:9092", *args,
        stdin=stdin,
    )  # fmt: skip


def produce_orders(kubectl: Kubectl, topic: str, count: int) -> None:
    """`count` order events (examples/cluster.yaml's schema), ids unique across runs on one cluster."""
    base = int(time.time()) * 1_000_000
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000+00:00", time.gmtime())
    lines = [
        json.dumps(
            {"id": base + i, "customer": f"customer-{i % 97:05d}", "amount": i % 500 + 0.25, "ts": now}
        )
        for i in range(count)
    ]
    kafka_tool(kubectl, "kafka-console-producer.sh", "--topic", topic, stdin="\n".join(lines) + "\n")


def probe_pod(name: str) -> dict[str, Any]:
    """A pod of the image running hack/kind/table_probe.py on examples/cluster.yaml, with the catalog's
    secrets in the variables `icefall run -f` reads (ICEFALL_CATALOG_<KEY>) from the file's own Secret."""
    _, catalog_env, problems = secret_env_vars(load_manifest(EXAMPLE).spec)
    assert problems == []
    env = [
        {"name": e.name, "valueFrom": {"secretKeyRef": {"name": e.secret, "key": e.key}}} for e in catalog_env
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "icefall-e2e"},
        },
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
            "containers": [
                {
                    "name": "probe",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "/probe/table_probe.py", "/probe/cluster.yaml", "900"],
                    "env": env,
                    "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
                    "volumeMounts": [
                        {"name": "probe", "mountPath": "/probe", "readOnly": True},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }
            ],
            "volumes": [
                {"name": "probe", "configMap": {"name": "kind-e2e-probe"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }


def run_probe(kubectl: Kubectl) -> dict[str, Any]:
    """Run the probe pod to its end; its last JSON line, and its log on failure."""
    configmap = kubectl(
        "-n", NAMESPACE, "create", "configmap", "kind-e2e-probe",
        f"--from-file=cluster.yaml={EXAMPLE}", f"--from-file=table_probe.py={PROBE}",
        "--dry-run=client", "-o", "yaml",
    )  # fmt: skip
    kubectl("apply", "-f", "-", stdin=configmap)
    name = f"kind-e2e-probe-{int(time.time())}"
    kubectl("apply", "-f", "-", stdin=json.dumps(probe_pod(name)))

    def phase() -> str | None:
        found = kubectl("-n", NAMESPACE, "get", "pod", name, "-o", "jsonpath={.status.phase}").strip()
        return found if found in ("Succeeded", "Failed") else None

    ended = wait_for(f"pod {name} to end", phase, 1200, kubectl.diagnostics)
    log = kubectl("-n", NAMESPACE, "logs", name)
    assert ended == "Succeeded", f"the table did not catch up exactly once:\n{log}\n{kubectl.diagnostics()}"
    last: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
    return last


def ready(kubectl: Kubectl) -> bool:
    jsonpath = '{.status.conditions[?(@.type=="Ready")].status}'
    return kubectl("-n", NAMESPACE, "get", "st", "orders", "-o", f"jsonpath={jsonpath}").strip() == "True"


def test_the_cluster_example_applied_as_it_is_fills_the_table_exactly_once(
    kubectl: Kubectl, example: dict[str, Any]
) -> None:
    topic = example["spec"]["source"]["topic"]
    kafka_tool(
        kubectl, "kafka-topics.sh", "--create", "--if-not-exists", "--topic", topic,
        "--partitions", "3", "--replication-factor", "1",
    )  # fmt: skip
    kubectl("-n", NAMESPACE, "apply", "-f", str(EXAMPLE))
    kubectl("-n", NAMESPACE, "rollout", "status", "deployment/icefall", "--timeout=300s")
    produce_orders(kubectl, topic, RECORDS)

    outcome = run_probe(kubectl)
    assert outcome["ok"] and outcome["caught_up"], outcome["report"]
    assert outcome["dead_letters"] == 0, outcome["report"]
    assert outcome["rows"] == outcome["records"] >= RECORDS, outcome["report"]

    wait_for("kubectl get st orders: READY True", lambda: ready(kubectl), 300, kubectl.diagnostics)
    table = kubectl("-n", NAMESPACE, "get", "st", "orders").splitlines()
    header, row = table[0].split(), table[1].split()
    assert row[header.index("READY")] == "True", "\n".join(table)
