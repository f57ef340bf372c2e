"""What keeps one table's Spark to itself besides RBAC: the Secret its driver and executors authenticate and
encrypt Spark's RPC with, and the NetworkPolicy around its pods. Pure: no client, no I/O.

| object | name | when |
|---|---|---|
| Secret | `icefall-<st>-spark-auth` (`spark_auth_secret`) | Spark on Kubernetes (executors are pods) |
| NetworkPolicy | `icefall-<st>-ingress` (`network_policy`) | the operator setting `network_policy` |

Spark RPC: on the Kubernetes master the driver's conf sets `spark.authenticate` and
`spark.network.crypto.enabled` (`icefall.plan.spark_conf`), with the secret read from a file in both the
driver and the executors (`spark.authenticate.secret.driver.file` / `.executor.file`): Spark then puts it
in no executor pod's env (it does without the files: `_SPARK_AUTH_SECRET`, in the pod spec) and the
secret is in no pod spec, ConfigMap or command line (only the file's path is). The Secret is rendered
without its value: the operator creates it once with random bytes (`icefall.controller.reconcile`), never
reads or updates it (immutable), and the garbage collector removes it with its StreamingTable. Local
masters run no executors and need none.

NetworkPolicy: ingress to the table's pods (driver, executors, compaction) only from the table's own
driver and executors (Spark's RPC and block transfers between them), and to their `metrics` port from
the namespace the operator setting `metrics_namespace` names (where Prometheus runs). Egress is left open:
Kafka, the catalog, the object store and the API server are wherever the table says. Labels alone cannot
say "the same table" in a chart-wide policy, hence one per table. Not guaranteed: that the cluster
enforces NetworkPolicies (that takes a CNI that does), nor that they apply to pods on the host network
(they never do).
"""

from __future__ import annotations

from typing import Any

from icefall.plan import names
from icefall.plan.metadata import ChildMeta

Manifest = dict[str, Any]

#: Where the driver and executor pods mount the table's Spark RPC secret, and its key (file) there.
SPARK_AUTH_DIR = "/etc/icefall/spark-auth"
SPARK_AUTH_KEY = "secret"
SPARK_AUTH_FILE = f"{SPARK_AUTH_DIR}/{SPARK_AUTH_KEY}"
SPARK_AUTH_VOLUME = "spark-auth"
#: Bytes of randomness in a table's Spark RPC secret (Spark's own generated secrets have 256 bits).
SPARK_AUTH_BYTES = 32
#: The label every namespace carries with its own name (Kubernetes sets it).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def spark_auth_secret(meta: ChildMeta) -> Manifest:
    """The table's Spark RPC Secret, without its value (the act layer adds `data[SPARK_AUTH_KEY]`). Created
    once and never updated, so its metadata leaves out what changes with the spec (the spec hash label,
    the generation annotation)."""
    metadata = meta.metadata(names.spark_auth_secret_name(meta.name), names.COMPONENT_INGEST)
    metadata["labels"] = names.labels(meta.name, names.COMPONENT_INGEST)
    del metadata["annotations"]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque", "immutable": True}


def spark_auth_volume(table: str) -> tuple[Manifest, Manifest]:
    """The volume of the table's Spark RPC Secret, readable by the pod's group only, and its mount."""
    volume = {
        "name": SPARK_AUTH_VOLUME,
        "secret": {"secretName": names.spark_auth_secret_name(table), "defaultMode": 0o440},
    }
    return volume, {"name": SPARK_AUTH_VOLUME, "mountPath": SPARK_AUTH_DIR, "readOnly": True}


def spark_auth_conf() -> dict[str, str]:
    """The driver's Spark conf for authenticated, encrypted RPC with its executors (read by them too: Spark
    passes `spark.auth*` and `spark.network*` settings to executors at their start)."""
    return {
        "spark.authenticate": "true",
        # An executor fetches the driver's conf first with a SecurityManager that reads only this key (and
        # only with a k8s:// master: `icefall.spark.entrypoint` gives the executor JVM one).
        "spark.authenticate.secret.file": SPARK_AUTH_FILE,
        "spark.authenticate.secret.driver.file": SPARK_AUTH_FILE,
        "spark.authenticate.secret.executor.file": SPARK_AUTH_FILE,
        "spark.network.crypto.enabled": "true",
        # No fall back to SASL's DIGEST-MD5 when the AES handshake fails: both ends run one Spark.
        "spark.network.crypto.saslFallback": "false",
    }


def network_policy(meta: ChildMeta, *, metrics_namespace: str) -> Manifest:
    """The NetworkPolicy of the table's pods (module doc); without `metrics_namespace`, no one scrapes."""
    table_pods = {
        names.LABEL_NAME: names.APP_NAME,
        names.LABEL_INSTANCE: meta.name,
        names.LABEL_MANAGED_BY: names.MANAGED_BY,  # never the chart's operator pod (managed by Helm)
    }
    ingest_pods = {**table_pods, names.LABEL_COMPONENT: names.COMPONENT_INGEST}
    ingress: list[Manifest] = [{"from": [{"podSelector": {"matchLabels": ingest_pods}}]}]
    if metrics_namespace:
        monitoring = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: metrics_namespace}}}
        ingress.append({"from": [monitoring], "ports": [{"protocol": "TCP", "port": "metrics"}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta.metadata(names.network_policy_name(meta.name), names.COMPONENT_INGEST),
        "spec": {"podSelector": {"matchLabels": table_pods}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
