"""The compaction pod in the cluster shape: `icefall compact --namespace/--name` as the operator renders it,
in the Pod the compaction Deployment's own ReplicaSet makes.

The operator runs as a process; the node (the real kubelet on containerd) runs the driver Pod (small
batches: many small files) and the compaction Pod as containers of the image we ship. The cluster's
kube-controller-manager turns the Deployment `<st>-compact`, scaled by the operator to one replica, into a
ReplicaSet and a Pod (owner references Pod → ReplicaSet → Deployment). The table's
`spec.pods.compaction.nodeSelector` keeps that Pod off the node (Pending, Unschedulable) until the test
gives the node the label, once the driver has caught up. The Pod runs with the projected token of the
ServiceAccount `icefall-<st>-compact`, so the Role the operator rendered is the only thing that lets it read
its StreamingTable and take work Leases. Proves:
- the pod compacts: the partition that had at least `min_files_to_compact` small files has fewer after, and
  main's history has an Iceberg `replace` snapshot;
- the rows as a multiset are the same before and after, and the table equals the topic exactly once
  (record by record, and per the auditor);
- the pod claimed its item with a work Lease of its table's pool (`icefall-<table>-<id>-work-<slot>`) held
  under its own pod name (seen by a watch while it ran, then released and kept: the operator created it)
  and no API call of the pod was refused (no 403/Forbidden in its log: its Role names those Leases);
- `status.table.lastCompactionTime` (what `kubectl get st` reads) shows the rewrite once it happened;
- deleting the Pod stops the worker cleanly (SIGTERM from the kubelet: the loop says it stopped), and the
  ReplicaSet makes a new one in its place.

Not proven here: several compaction pods competing for items (the Lease logic has its own tests), the
Deployment's scale-down, or compaction concurrent with ingestion commits (the driver is idle meanwhile, so
the file counts are exact).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import yaml
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from icefall.api import streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka import KafkaBroker
from icefall.plan.maintenance_items import MaintenancePolicy
from icefall.plan.names import compaction_account_name, compaction_name, table_leases
from icefall.testing.kubeapi import JsonApi, ObjectWatch
from icefall.testing.streams import NAMESPACE as TABLE_NAMESPACE
from icefall.testing.streams import assert_exactly_once, manifest_text

from .conftest import (
    Kubectl,
    Lake,
    NodeView,
    Operator,
    TableStream,
    pod_logs,
    replace_snapshots_on_main,
    table_rows,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.long]

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLE = "e2e_small"  # it.e2e_small: every event has the same `ts`, so one day partition gets every file
NAME = "e2e-small"
TOPIC = "e2e-small"
DRIVER = f"{NAME}-ingest"
DEPLOYMENT = compaction_name(NAME)
#: The node label the compaction pods wait for (spec.pods.compaction.nodeSelector).
HOLD_LABEL = "e2e.icefall.dev/compaction"
#: The admin's pod policy lets tables ask for that node label (the default allows none).
OPERATOR_ENV = {"ICEFALL_POD_POLICY": json.dumps({"nodeSelector": [HOLD_LABEL]})}
WORK_LEASE = re.compile(rf"icefall-{TABLE.replace('_', '-')}-[0-9a-f]{{8}}-work-[0-9]{{2}}")
RECORDS = 120
BATCH_RECORDS = 20  # spec.batch.maxRecords: at least RECORDS / BATCH_RECORDS small commits
BAD_EVERY = 50
#: A partition with this many small files is compacted (the planner's default threshold).
MIN_FILES = MaintenancePolicy().min_files_to_compact
Obj = dict[str, Any]


def work_leases(leases: ObjectWatch) -> list[tuple[str, str, str]]:
    """The work Leases' changes a watch saw: (event type, name, holderIdentity)."""
    return [
        (kind, obj["metadata"]["name"], (obj.get("spec") or {}).get("holderIdentity") or "")
        for kind, obj in leases.events()
        if WORK_LEASE.fullmatch(obj["metadata"]["name"])
    ]


def released(events: list[tuple[str, str, str]]) -> bool:
    """Whether a work Lease the watch saw held was later seen with no holder."""
    held: set[str] = set()
    for _, name, holder in events:
        if holder:
            held.add(name)
        elif name in held:
            return True
    return False


class Setup(TableStream):
    """The StreamingTable's world: clients, catalog, the node and what was produced."""

    def __init__(
        self,
        *,
        rest: JsonApi,
        namespace: str,
        catalog: CatalogConfig,
        kafka: KafkaBroker,
        node: NodeView,
        operator: Operator,
    ) -> None:
        super().__init__(kafka, catalog, topic=TOPIC, table=TABLE, bad_every=BAD_EVERY)
        self.rest = rest
        self.namespace = namespace
        self.node = node
        self.operator = operator

    @property
    def st_path(self) -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}"

    def st(self) -> Obj:
        return self.rest.get(f"{self.st_path}/{NAME}") or {}

    def deployment(self) -> Obj:
        return self.rest.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{DEPLOYMENT}") or {}

    def pod(self, name: str) -> Obj | None:
        return self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")

    def compaction_pods(self) -> list[Obj]:
        """The pods of the compaction Deployment (by its selector), oldest first, none being deleted."""
        selector = ",".join(
            f"{k}={v}" for k, v in self.deployment()["spec"]["selector"]["matchLabels"].items()
        )
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        found: list[Obj] = self.rest.call("GET", path, query=[("labelSelector", selector)])["items"]
        live = [p for p in found if not p["metadata"].get("deletionTimestamp")]
        return sorted(live, key=lambda p: str(p["metadata"]["creationTimestamp"]))

    def owner(self, obj: Obj) -> Obj:
        """The controller owner reference of `obj` (exactly one)."""
        (ref,) = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
        return dict(ref)

    def hold_compaction(self, held: bool) -> None:
        """Label the node so the compaction pods fit on it (`held=False`), or take the label away."""
        (node,) = self.rest.call("GET", "/api/v1/nodes")["items"]
        patch = {"metadata": {"labels": {HOLD_LABEL: None if held else "yes"}}}
        self.rest.call(
            "PATCH", f"/api/v1/nodes/{node['metadata']['name']}", patch,
            content_type="application/merge-patch+json",
        )  # fmt: skip

    def iceberg_table(self) -> Table | None:
        catalog = self.catalog.pyiceberg()
        if not catalog.table_exists((TABLE_NAMESPACE, TABLE)):
            return None
        return catalog.load_table((TABLE_NAMESPACE, TABLE))

    def explain(self) -> str:
        status = yaml.safe_dump(self.st().get("status"))
        compaction = "\n".join(pod_logs(self.node, p["metadata"]["name"]) for p in self.compaction_pods())
        driver = pod_logs(self.node, DRIVER)
        return f"--- status\n{status}{driver}\n{compaction}\n--- operator\n{self.operator.tail()}"


def files_per_partition(table: Table) -> Counter[str]:
    """Data files of the current snapshot, per partition."""
    return Counter(str(task.file.partition) for task in table.scan().plan_files())


@pytest.fixture(scope="module")
def setup(  # noqa: PLR0917 (fixtures)
    rest: JsonApi,
    e2e_namespace: str,
    kafka: KafkaBroker,
    node: NodeView,
    operator: Operator,
    lake: Lake,
) -> Iterator[Setup]:
    catalog = lake.catalog
    kafka.create_topic(TOPIC, partitions=2)
    made = Setup(
        rest=rest, namespace=e2e_namespace, catalog=catalog, kafka=kafka, node=node, operator=operator
    )
    st: Obj = yaml.safe_load(
        manifest_text(
            TABLE, TOPIC, kafka.bootstrap, batch={"maxRecords": BATCH_RECORDS, "minIntervalSeconds": 0}
        )
    )
    st["metadata"]["namespace"] = e2e_namespace
    st["spec"]["table"]["catalog"] = lake.block  # credentials by reference, from the Secret
    # One pod at once, whatever the backlog says; it waits for the node's label (see hold_compaction).
    st["spec"]["compaction"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 1}
    st["spec"]["pods"] = {"compaction": {"nodeSelector": {HOLD_LABEL: "yes"}}}
    made.produce(RECORDS)  # a backlog the driver takes in small batches: one small file (or more) each
    rest.call("POST", made.st_path, st)
    made.started = time.monotonic()
    try:
        yield made
    finally:
        made.hold_compaction(True)  # the label goes with the module


@pytest.fixture(autouse=True)
def operator_log_is_clean(operator: Operator) -> Iterator[None]:
    """No handler of the operator crashed during the test (kopf logs the traceback and retries)."""
    yield
    assert "Traceback" not in operator.log.read_text(errors="replace"), operator.tail()


def _unschedulable(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
        for c in conditions
    )


def test_compaction_pod_compacts_under_its_own_account(
    setup: Setup, kubectl: Kubectl, cluster: LocalCluster
) -> None:
    explain = setup.explain
    high = wait_for("the driver to ingest the backlog", setup.caught_up, timeout=240, details=explain)
    table = setup.iceberg_table()
    assert table is not None
    before_files = files_per_partition(table)
    before_rows = table_rows(table)
    setup.note(f"caught up with {sum(high.values())} records; files per partition {dict(before_files)}")
    hot, hot_files = before_files.most_common(1)[0]
    assert hot_files >= MIN_FILES, f"small batches left only {dict(before_files)}: nothing to compact"
    assert not replace_snapshots_on_main(table)

    deployment = wait_for(
        f"the operator to scale Deployment {DEPLOYMENT} to at least 1",
        lambda: (d := setup.deployment()) and (d["spec"].get("replicas") or 0) >= 1 and d,
        timeout=90,
        details=explain,
    )
    template = deployment["spec"]["template"]
    assert template["spec"]["serviceAccountName"] == compaction_account_name(NAME)
    assert template["spec"]["nodeSelector"] == {HOLD_LABEL: "yes"}  # spec.pods.compaction reached it
    (container,) = template["spec"]["containers"]
    command = [*container.get("command", []), *container.get("args", [])]
    assert command[:-1] == ["icefall", "compact", "--namespace", setup.namespace, "--name", NAME], command
    assert re.fullmatch(r"--metrics-port=\d+", command[-1]), command  # derived per table (host network)

    # The ReplicaSet controller made the pod; it waits, unschedulable, for the node's label.
    (held,) = wait_for(
        "the ReplicaSet's pod, unschedulable",
        lambda: (pods := setup.compaction_pods()) and all(_unschedulable(p) for p in pods) and pods,
        timeout=90,
        details=explain,
    )
    pod_name, pod_uid = held["metadata"]["name"], held["metadata"]["uid"]
    owner = setup.owner(held)
    assert owner["kind"] == "ReplicaSet" and pod_name.startswith(f"{owner['name']}-"), owner
    replica_set = setup.rest.get(f"/apis/apps/v1/namespaces/{setup.namespace}/replicasets/{owner['name']}")
    assert replica_set is not None and replica_set["metadata"]["uid"] == owner["uid"], replica_set
    up = setup.owner(replica_set)
    assert (up["kind"], up["name"], up["uid"]) == ("Deployment", DEPLOYMENT, deployment["metadata"]["uid"])
    assert held["spec"]["serviceAccountName"] == compaction_account_name(NAME)
    setup.note(f"ReplicaSet {owner['name']} made pod {pod_name}; letting it onto the node")

    leases_path = f"/apis/coordination.k8s.io/v1/namespaces/{setup.namespace}/leases"
    with ObjectWatch(setup.rest, leases_path) as leases:
        setup.hold_compaction(False)

        def compacted() -> list[int] | None:
            found = setup.iceberg_table()
            return replace_snapshots_on_main(found) if found is not None else None

        replaced = wait_for("a replace snapshot on main", compacted, timeout=300, every=1, details=explain)
        setup.note(f"replace snapshot(s) {replaced} on main")
        # The Lease is released (and kept: the operator created it) after the commit; give the watch a
        # moment to see it.
        wait_for(
            "the work Lease to be released",
            lambda: released(work_leases(leases)),
            timeout=30,
            details=lambda: f"{work_leases(leases)}\n{explain()}",
        )
    work = work_leases(leases)
    setup.note(f"work Lease events: {work}")
    claims = {(name, holder) for kind, name, holder in work if holder}
    assert claims, f"no work Lease was ever held: {leases.events()}"
    assert {holder for _, holder in claims} == {pod_name}, claims
    pool = table_leases(streaming_table_from_object(setup.st())).work
    assert all(name in pool for name, _ in claims), (claims, pool)

    table = setup.iceberg_table()
    assert table is not None
    after_files = files_per_partition(table)
    setup.note(f"files per partition after: {dict(after_files)}")
    assert after_files[hot] < MIN_FILES, (dict(before_files), dict(after_files))
    assert after_files[hot] < hot_files
    assert table_rows(table) == before_rows, "compaction changed the rows"
    report = assert_exactly_once(setup.catalog, TABLE, high, setup.bad, bootstrap=setup.kafka.bootstrap)
    assert report is not None and report.ok

    # The operator reports the rewrite: status.table.lastCompactionTime at (or after) the replace commit.
    replace_ms = max(
        s.timestamp_ms for s in table.snapshots() if s.summary and s.summary.operation == Operation.REPLACE
    )

    def last_compaction() -> str | None:
        found = kubectl(
            "-n", setup.namespace, "get", "st", NAME, "-o", "jsonpath={.status.table.lastCompactionTime}"
        )
        return found or None

    shown = wait_for("status.table.lastCompactionTime", last_compaction, timeout=60, every=1, details=explain)
    setup.note(f"kubectl get st: lastCompactionTime {shown}")
    shown_ms = datetime.fromisoformat(shown.replace("Z", "+00:00")).timestamp() * 1000
    assert abs(shown_ms - replace_ms) < 1000, (shown, replace_ms)

    # A container of the image we ship, never restarted, whose log shows no refused API call.
    pod = setup.pod(pod_name)
    assert pod is not None and pod["status"]["phase"] == "Running", pod and pod.get("status")
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"] == cluster.images.icefall, status
    assert status["containerID"].startswith("containerd://"), status
    assert status["restartCount"] == 0, status
    # A refused API call: the client's "(403)" / "Reason: Forbidden", the API server's "... is forbidden: User
    # ...", or KubernetesLease's "not allowed to <verb> Lease ...".
    refused = re.compile(r"forbidden|\(403\)|not allowed to", re.IGNORECASE)
    log_text = setup.node.log(pod_name, pod_uid)
    assert not refused.search(log_text), pod_logs(setup.node, pod_name)
    assert re.search(r"^\[compact\] [^\n]* done: ", log_text, re.MULTILINE), pod_logs(setup.node, pod_name)

    # Deleted, it stops cleanly; the ReplicaSet makes another (held off the node again: it would only
    # start Spark for nothing).
    setup.hold_compaction(True)
    kubectl("-n", setup.namespace, "delete", "pod", pod_name, "--wait=false")
    last_line = wait_for(
        "the compaction pod to stop",
        lambda: (
            (lines := setup.node.log(pod_name, pod_uid).splitlines()) and "stopped" in lines[-1] and lines[-1]
        ),
        timeout=60,
        details=explain,
    )
    setup.note(f"the deleted pod's last line: {last_line}")
    wait_for("the deleted pod to go", lambda: setup.pod(pod_name) is None, timeout=60, details=explain)
    (replacement,) = wait_for("the ReplicaSet's new pod", setup.compaction_pods, timeout=60, details=explain)
    assert replacement["metadata"]["uid"] != pod_uid
    assert setup.owner(replacement)["uid"] == replica_set["metadata"]["uid"]
