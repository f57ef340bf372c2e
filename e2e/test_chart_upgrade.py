"""Upgrading the chart with a table running, as docs and NOTES say: the CRD first (Helm never upgrades it),
then `helm upgrade` to a new image; every record exactly once across it.

What a user has and does, on the e2e's cluster (kube-apiserver, controller-manager, scheduler, the real
kubelet on containerd running every pod as a container of the image built here):
- the previous release's CRD, as `helm install` of that release created it (an update by the field
  manager "helm"): tests/fixtures/streamingtables.icefall.dev-5a40850.yaml, whose condition reasons are an
  enum; `helm install` of the chart finds it there and leaves it (Helm installs a CRD only when missing);
- a StreamingTable running against the session's Kafka and the module's PostgreSQL JDBC catalog with its
  files in the object store (the `lake` fixture), its driver a pod the operator (a pod of the chart)
  started, records produced all along;
- `kubectl apply --server-side --force-conflicts -f crds/`, then `helm upgrade` with a new image (the
  same build under another name, as a release's new tag would be: the node has it under both).
Proves:
- the previous CRD refuses a condition reason it does not know and, after the upgrade step, the new one
  stores it (dry runs on the live table's status): a newer operator's reasons pass;
- the StreamingTable keeps its uid, generation and spec; the operator's Deployment rolls to a new pod of
  the new image, which takes the leader Lease and runs without a restart; the table's driver rolls to the
  new image too (a new image changes every table's spec hash) and goes on from the table's offsets;
- with records produced before, during and after the upgrade, the table equals the topic exactly once
  (record by record and per the auditor, bad records in the dead-letter table), and `kubectl get st`
  shows READY True after it.
Not proven here: an upgrade from an older operator build (there is one build here: the previous release's
operator and its chart are stood in for by this one's on the previous CRD); downgrades; compaction
across the upgrade.

Marked `long` (two Spark starts of the driver, a few minutes on 2 cores): `make test-all` and
`make test-e2e` run it, `make test` does not.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from icefall.api.crd import CRD_NAME
from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.names import LEADER_LEASE_NAME
from icefall.testing.harness import Helm, image_args, local_chart_values
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import assert_exactly_once, manifest_text

from .conftest import REPO, Kubectl, Lake, NodeView, TableStream, pod_logs, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.long]

CHART = REPO / "charts" / "icefall"
CRDS = REPO / "crds"
PREVIOUS_CRD = REPO / "tests" / "fixtures" / "streamingtables.icefall.dev-5a40850.yaml"
RELEASE = "icefall"
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLE, NAME, TOPIC = "upgrade_orders", "upgrade-orders", "upgrade-orders"
DRIVER = f"{NAME}-ingest"
BAD_EVERY = 40
NEWER_REASON = "ReasonOfANewerRelease"
Obj = dict[str, Any]


class Upgrade(TableStream):
    """The table's stream, plus what the test reads of the cluster."""

    def __init__(
        self, *, kafka: KafkaBroker, lake: Lake, rest: JsonApi, namespace: str, node: NodeView
    ) -> None:
        super().__init__(kafka, lake.catalog, topic=TOPIC, table=TABLE, bad_every=BAD_EVERY)
        self.lake, self.rest, self.namespace, self.node = lake, rest, namespace, node

    @property
    def st_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"

    def st(self) -> Obj:
        return self.rest.get(f"{self.st_path}/{NAME}") or {}

    def pods(self, selector: str) -> list[Obj]:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        found: list[Obj] = self.rest.call("GET", path, query=[("labelSelector", selector)])["items"]
        return [p for p in found if not p["metadata"].get("deletionTimestamp")]

    def operator(self, image: str) -> Obj | None:
        """The one operator pod, if it runs `image` and is Ready (its readiness probe: kopf's /healthz)."""
        pods = self.pods(OPERATOR_SELECTOR)
        if len(pods) != 1 or pods[0]["spec"]["containers"][0]["image"] != image:
            return None
        conditions = (pods[0].get("status") or {}).get("conditions") or []
        return pods[0] if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    def driver(self, image: str) -> Obj | None:
        """The table's driver pod, if it runs `image` and is not being deleted."""
        pod = self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods/{DRIVER}")
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        running = (pod.get("status") or {}).get("phase") == "Running"
        return pod if running and pod["spec"]["containers"][0]["image"] == image else None

    def newer_reason_stored(self) -> bool:
        """Whether the CRD stores a condition reason this release does not know (a dry run on the live
        table's status: its Ready condition with that reason)."""
        conditions = (self.st().get("status") or {}).get("conditions") or []
        assert conditions, "the table has no conditions yet"
        changed = [{**c, "reason": NEWER_REASON} if c["type"] == "Ready" else c for c in conditions]
        try:
            self.rest.call(
                "PATCH", f"{self.st_path}/{NAME}/status", {"status": {"conditions": changed}},
                query=[("dryRun", "All")], content_type="application/merge-patch+json",
            )  # fmt: skip
        except ApiException as error:
            assert error.status == 422 and NEWER_REASON in str(error.body), error
            return False
        return True

    def ready(self) -> bool:
        conditions = (self.st().get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def leader(self) -> str:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEADER_LEASE_NAME}"
        holder: str = ((self.rest.get(path) or {}).get("spec") or {}).get("holderIdentity") or ""
        return holder

    def explain(self) -> str:
        status = yaml.safe_dump(self.st().get("status"))
        operators = "\n".join(
            pod_logs(self.node, p["metadata"]["name"]) for p in self.pods(OPERATOR_SELECTOR)
        )
        return f"--- status\n{status}{pod_logs(self.node, DRIVER)}\n--- operator\n{operators}"


def reason_schema(kubectl: Kubectl) -> Obj:
    crd = json.loads(kubectl("get", "crd", CRD_NAME, "-o", "json"))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found: Obj = schema["properties"]["status"]["properties"]["conditions"]["items"]["properties"]["reason"]
    return found


def values_file(cluster: LocalCluster, folder: Path) -> Path:
    """What the e2e's cluster needs (`local_chart_values`), Spark inside the driver pod, short intervals."""
    values = local_chart_values(cluster)
    values["spark"] = {"master": "local[1]"}
    values["extraEnv"] = [
        *values["extraEnv"],
        {"name": "ICEFALL_RESYNC_SECONDS", "value": "2"},
        {"name": "ICEFALL_OBSERVE_SECONDS", "value": "1"},
        {"name": "ICEFALL_STATUS_SECONDS", "value": "1"},
        {"name": "ICEFALL_STATUS_REFRESH_SECONDS", "value": "2"},
    ]
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.fixture(scope="module")
def next_image(cluster: LocalCluster) -> Iterator[str]:
    """The image under a second name on the node, as a new release's would be; removed afterwards."""
    repository, _, tag = cluster.images.icefall.rpartition(":")
    image = f"{repository}-next:{tag}"
    tagged = cluster.node.runtime.ctr("images", "tag", "--force", cluster.images.icefall, image)
    assert tagged.returncode == 0, tagged.stderr
    yield image
    cluster.node.runtime.ctr("images", "remove", image)


@pytest.fixture(scope="module")
def previous_crd(kubectl: Kubectl, e2e_namespace: str) -> Iterator[None]:
    """The previous release's CRD in place of this one (e2e_namespace applied this one), as Helm created
    it; this one is back afterwards, whatever happened, for the session's other modules."""
    as_helm = ("replace", "--field-manager=helm", "-f", str(PREVIOUS_CRD))
    # Right after a change the API server writes the CRD's conditions: a replace may meet a conflict.
    wait_for("the previous CRD in place", lambda: kubectl(*as_helm, check=False), timeout=60)
    try:
        yield
    finally:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS), check=False)


@pytest.fixture(scope="module")
def upgrade(  # noqa: PLR0917 (fixtures)
    previous_crd: None,
    rest: JsonApi,
    e2e_namespace: str,
    kafka: KafkaBroker,
    node: NodeView,
    lake: Lake,
) -> Iterator[Upgrade]:
    kafka.create_topic(TOPIC, partitions=2)
    running = Upgrade(kafka=kafka, lake=lake, rest=rest, namespace=e2e_namespace, node=node)
    yield running
    print(running.explain())  # shown when a test failed


def _keep_producing(upgrade: Upgrade, stop: threading.Event) -> None:
    while not stop.is_set():
        upgrade.produce(20)
        time.sleep(0.5)


def _install_the_previous_release(upgrade: Upgrade, helm: Helm, kubectl: Kubectl, install: list[str]) -> Obj:
    """The chart installed on the previous CRD (which it leaves as it is), a table running on it; the
    StreamingTable as created."""
    installed = helm("install", RELEASE, str(CHART), "-n", upgrade.namespace, *install)
    assert "enum" in reason_schema(kubectl), "helm install changed the CRD it found"
    assert "examples/cluster.yaml" in installed, installed
    kubectl("-n", upgrade.namespace, "rollout", "status", f"deployment/{RELEASE}", "--timeout=300s")
    st: Obj = yaml.safe_load(manifest_text(TABLE, TOPIC, upgrade.kafka.bootstrap))
    st["metadata"]["namespace"] = upgrade.namespace
    st["spec"]["table"]["catalog"] = upgrade.lake.block  # credentials by reference, from the Secret
    upgrade.produce(200)
    created: Obj = upgrade.rest.call("POST", upgrade.st_path, st)
    upgrade.started = time.monotonic()
    return created


def _upgrade(upgrade: Upgrade, helm: Helm, kubectl: Kubectl, values: Path, image: str) -> Obj:
    """NOTES.txt's two steps: the CRD, then the chart with the new image; the new operator pod, once the
    table's driver runs that image too and committed."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    assert "enum" not in reason_schema(kubectl)
    wait_for("the new CRD to store a newer operator's reason", upgrade.newer_reason_stored, timeout=60)
    upgrade.note("new CRD applied and served")
    helm("upgrade", RELEASE, str(CHART), "-n", upgrade.namespace, "-f", str(values), *image_args(image))
    kubectl("-n", upgrade.namespace, "rollout", "status", f"deployment/{RELEASE}", "--timeout=300s")
    operator = wait_for(
        "the operator pod of the new image", lambda: upgrade.operator(image), timeout=300,
        details=upgrade.explain,
    )  # fmt: skip
    upgrade.note(f"operator pod {operator['metadata']['name']} runs {image}")
    wait_for(
        "the driver pod of the new image", lambda: upgrade.driver(image), timeout=300, details=upgrade.explain
    )
    resumed = sum(upgrade.committed().values())
    wait_for(
        "the new driver to commit", lambda: sum(upgrade.committed().values()) > resumed, timeout=480,
        details=upgrade.explain,
    )  # fmt: skip
    upgrade.note("the new driver committed")
    return operator


# Two Spark starts of the driver and two operator rollouts: minutes each on a loaded 2-core machine.
@pytest.mark.timeout(1800)
def test_helm_upgrade_with_the_crd_first_keeps_a_running_table_exactly_once(
    upgrade: Upgrade,
    cluster: LocalCluster,
    kubectl: Kubectl,
    next_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    old_image = cluster.images.icefall
    home = tmp_path_factory.mktemp("helm-home")
    values = values_file(cluster, home)
    helm = Helm(cluster.api.kubeconfig, home)
    created = _install_the_previous_release(
        upgrade, helm, kubectl, ["-f", str(values), *image_args(old_image)]
    )
    old_driver = wait_for(
        "the driver pod running", lambda: upgrade.driver(old_image), timeout=300, details=upgrade.explain
    )
    wait_for("the table to catch up", upgrade.caught_up, timeout=480, details=upgrade.explain)
    wait_for("Ready True", upgrade.ready, timeout=120, details=upgrade.explain)
    upgrade.note(f"running on the previous CRD: {sum(upgrade.committed().values())} records committed")
    assert not upgrade.newer_reason_stored(), "the previous CRD stored a reason outside its enum"
    old_operator = upgrade.operator(old_image)
    assert old_operator is not None

    stop = threading.Event()
    producer = threading.Thread(target=_keep_producing, args=(upgrade, stop), name="producer")
    producer.start()
    try:
        new_operator = _upgrade(upgrade, helm, kubectl, values, next_image)
    finally:
        stop.set()
        producer.join(timeout=60)
    high = wait_for("the table to catch up", upgrade.caught_up, timeout=300, details=upgrade.explain)
    upgrade.note(f"caught up with {sum(high.values())} records across the upgrade")
    report = assert_exactly_once(upgrade.catalog, TABLE, high, upgrade.bad, bootstrap=upgrade.kafka.bootstrap)
    assert report is not None and report.ok

    after = upgrade.st()
    assert (after["metadata"]["uid"], after["metadata"]["generation"], after["spec"]) == (
        created["metadata"]["uid"], created["metadata"]["generation"], created["spec"]
    )  # fmt: skip
    driver = upgrade.driver(next_image)
    assert driver is not None and driver["metadata"]["uid"] != old_driver["metadata"]["uid"]
    wait_for("Ready True after the upgrade", upgrade.ready, timeout=120, details=upgrade.explain)
    assert _printed_row(kubectl, upgrade.namespace)["READY"] == "True"
    # The new operator pod leads, never restarted, and logged no traceback.
    assert upgrade.leader().startswith(new_operator["metadata"]["name"]), upgrade.leader()
    (now,) = upgrade.pods(OPERATOR_SELECTOR)
    assert now["metadata"]["uid"] == new_operator["metadata"]["uid"] != old_operator["metadata"]["uid"]
    (status,) = now["status"]["containerStatuses"]
    assert status["restartCount"] == 0 and status["ready"], status
    log = upgrade.node.log(now["metadata"]["name"])
    assert "Traceback" not in log, log[-5000:]


def _printed_row(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """`kubectl get st <name>` as the user sees it: header → value of the one row."""
    header, row = kubectl("-n", namespace, "get", "st", NAME).rstrip().splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}
