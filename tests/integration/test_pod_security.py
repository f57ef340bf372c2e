"""Every pod Icefall renders for a table is admitted by the Pod Security `restricted` standard, enforced by
the real kube-apiserver's PodSecurity admission on the table's namespace.

The e2e cluster's own namespaces cannot enforce `restricted` (its pods need the host network: there is no
pod network on these machines, docs/security.md), so this is where it is enforced: the operator (a real
process) renders a table's children in a namespace labelled `pod-security.kubernetes.io/enforce:
restricted`; the driver Pod it creates is admitted there, and the pod templates that other controllers turn
into pods (the compaction Deployment's, the executors' template Spark's driver creates pods from) are
admitted as Pods by a server-side dry run. A hostNetwork pod is refused there (PodSecurity is on).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.plan import names
from icefall.plan.spark_conf import ANNOTATION_SPARK_MASTER, EXECUTOR_TEMPLATE_KEY
from icefall.testing.e2e import Operator, wait_for
from icefall.testing.kubeapi import JsonApi

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "restricted-tables"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> JsonApi:
    install_crds(kube, REPO / "crds", NAMESPACE)
    client = JsonApi(config.new_client_from_config(config_file=str(kube.kubeconfig)))
    labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}
    client.call(
        "PATCH",
        f"/api/v1/namespaces/{NAMESPACE}",
        {"metadata": {"labels": labels}},
        content_type="application/merge-patch+json",
    )
    return client


@pytest.fixture(scope="module")
def operator(
    kube: KubeAPIServer, api: JsonApi, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    running = Operator(kube, NAMESPACE, tmp_path_factory.mktemp("operator") / "operator.log")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def dry_run_pod(api: JsonApi, name: str, template: Obj) -> None:
    """Create `template` as a Pod with `dryRun=All`: admission (PodSecurity too) runs, nothing is kept."""
    body = {"apiVersion": "v1", "kind": "Pod", **template}
    body["metadata"] = {**(template.get("metadata") or {}), "name": name}
    api.call("POST", PODS, body, query=[("dryRun", "All")])


def test_every_pod_a_table_gets_is_admitted_under_enforced_restricted(
    api: JsonApi, operator: Operator
) -> None:
    with pytest.raises(Exception, match="violates PodSecurity"):
        dry_run_pod(api, "host-network", {"spec": {"hostNetwork": True, "containers": [
            {"name": "c", "image": "localhost/icefall:any"}]}})  # fmt: skip

    table = {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "orders", "namespace": NAMESPACE,
                     "annotations": {ANNOTATION_SPARK_MASTER: "kubernetes"}},
        "spec": {
            "source": {"bootstrapServers": "127.0.0.1:1", "topic": "orders"},
            "format": {"type": "json", "schema": [{"name": "id", "type": "long", "required": True}]},
            "table": {"namespace": "shop", "name": "orders",
                      "catalog": {"name": "lake", "type": "rest", "uri": "http://127.0.0.1:1"}},
        },
    }  # fmt: skip
    api.call("POST", f"/apis/icefall.dev/v1alpha1/namespaces/{NAMESPACE}/streamingtables", table)

    # The driver Pod is created by the operator itself: PodSecurity enforces on it directly.
    driver = wait_for(
        "the driver Pod, admitted", lambda: api.get(f"{PODS}/{names.driver_pod_name('orders')}"),
        timeout=60, details=operator.tail,
    )  # fmt: skip
    assert not driver["spec"].get("hostNetwork")

    # Templates that become pods later, through the Deployment controller and Spark's driver.
    apps = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{names.compaction_name('orders')}"
    deployment = wait_for(
        "the compaction Deployment", lambda: api.get(apps), timeout=30, details=operator.tail
    )
    dry_run_pod(api, "compaction", deployment["spec"]["template"])
    configmap = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{names.executor_template_name('orders')}"
    template = wait_for(
        "the executors' template", lambda: api.get(configmap), timeout=30, details=operator.tail
    )
    executor: Obj = json.loads(template["data"][EXECUTOR_TEMPLATE_KEY])
    for container in executor["spec"]["containers"]:  # Spark fills in the image and command itself
        container.setdefault("image", driver["spec"]["containers"][0]["image"])
    dry_run_pod(api, "executor", executor)
