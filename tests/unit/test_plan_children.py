"""The children a StreamingTable owns, rendered as manifests without a cluster.

Proves: names, labels and owner references are deterministic and valid (<= 63 characters, hashed when long);
no secret value ever reaches a manifest, even when one is smuggled into the spec or the process environment,
and credentials appear only as secretKeyRef env vars; every pod (driver, compaction, executor template) meets
the restricted Pod Security Standard with writable emptyDirs for /tmp and Spark's local dirs; suspend removes
the driver and scales compaction to 0 but keeps the rest; the spec hash moves for restart-worthy changes only;
RBAC is namespaced, names the commit Lease, and shrinks to the Lease alone with a local Spark master; the
table's Leases are owned children with Icefall's durations, created by the operator, never by a pod (no Role
grants `create` on Leases); the driver's Spark configuration targets Kubernetes with dynamic allocation; and
the planning modules import no Kubernetes, kopf or Spark client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from icefall.api import StreamingTable
from icefall.plan.children import ANNOTATION_RESTART, Children, ObjectRef, desired_children
from icefall.plan.env import ENV_POD_IP, ENV_POD_NAME, ENV_SPARK_CONF, secret_env_vars
from icefall.plan.names import LABEL_SPEC_HASH, child_name, table_leases
from icefall.plan.settings import OperatorSettings, Resources
from icefall.plan.spark_conf import (
    ANNOTATION_SPARK_MASTER,
    EXECUTOR_TEMPLATE_KEY,
    KUBERNETES_MASTER,
)
from icefall.plan.workloads import COMPACT_COMMAND, INGEST_COMMAND, POD_METRICS_PORT

pytestmark = pytest.mark.unit

IMAGE = "registry.example/icefall:1.0.0"
UID = "0b9c6a4e-1111-2222-3333-444455556666"
SENTINEL = "s3cr3t-SENTINEL-value-7f3a"


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
        "format": {"schema": [{"name": "id", "type": "long"}, {"name": "ts", "type": "timestamptz"}]},
        "table": {"namespace": "shop"},
    }
    base.update(overrides)
    return base


def table(
    name: str = "orders",
    *,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    **spec_overrides: Any,
) -> StreamingTable:
    body: dict[str, Any] = {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": spec(**spec_overrides),
    }
    if status is not None:
        body["status"] = status
    return StreamingTable.model_validate(body)


def render(
    st: StreamingTable, settings: OperatorSettings | None = None, *, replicas: int = 2, image: str = IMAGE
) -> Children:
    return desired_children(
        st,
        namespace="shop",
        uid=UID,
        generation=7,
        image=image,
        operator_settings=settings or OperatorSettings(),
        compaction_replicas=replicas,
    )


def manifests(children: Children) -> list[dict[str, Any]]:
    return [*children.applied, *([children.driver_pod] if children.driver_pod else [])]


def pod_specs(children: Children) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every pod spec the children define: driver, compaction template, executor template."""
    if children.driver_pod:
        yield "driver", children.driver_pod["spec"]
    deployment = children.get("Deployment", "orders-compact")
    yield "compaction", deployment["spec"]["template"]["spec"]
    for manifest in children.applied:
        if manifest["kind"] == "ConfigMap":
            yield "executor", json.loads(manifest["data"][EXECUTOR_TEMPLATE_KEY])["spec"]


def env_of(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = pod_spec["containers"][0]["env"]
    return env


def spark_conf(children: Children) -> dict[str, str]:
    assert children.driver_pod is not None
    (entry,) = [e for e in env_of(children.driver_pod["spec"]) if e["name"] == ENV_SPARK_CONF]
    conf: dict[str, str] = json.loads(entry["value"])
    return conf


# --- names, labels, owner references ----------------------------------------------------------------------


def test_rendering_is_deterministic_and_every_child_is_labelled_and_owned() -> None:
    first, second = render(table()), render(table())
    assert json.dumps(manifests(first), sort_keys=True) == json.dumps(manifests(second), sort_keys=True)
    others = [m for m in manifests(first) if m["kind"] != "Lease"]  # Leases: their own test below
    kinds = [(m["kind"], m["metadata"]["name"]) for m in others]
    assert kinds == [
        ("ServiceAccount", "icefall-orders-driver"),
        ("Role", "icefall-orders-driver"),
        ("RoleBinding", "icefall-orders-driver"),
        ("ServiceAccount", "icefall-orders-compact"),
        ("Role", "icefall-orders-compact"),
        ("RoleBinding", "icefall-orders-compact"),
        ("ConfigMap", "orders-ingest-executor"),
        ("NetworkPolicy", "icefall-orders-ingress"),
        ("Deployment", "orders-compact"),
        ("Pod", "orders-ingest"),
    ]
    for manifest in others:
        meta = manifest["metadata"]
        assert meta["namespace"] == "shop"
        assert meta["labels"] == {
            "app.kubernetes.io/name": "icefall",
            "app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/component": meta["labels"]["app.kubernetes.io/component"],
            "app.kubernetes.io/managed-by": "icefall-operator",
            "icefall.dev/streamingtable": "orders",
            LABEL_SPEC_HASH: first.spec_hash,
        }
        assert meta["labels"]["app.kubernetes.io/component"] in {"ingest", "compact"}
        assert meta["annotations"] == {"icefall.dev/generation": "7"}
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "icefall.dev/v1alpha1",
                "kind": "StreamingTable",
                "name": "orders",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    assert first.get("Pod", "orders-ingest")["metadata"]["labels"]["app.kubernetes.io/component"] == "ingest"
    assert first.get("Deployment", "orders-compact")["metadata"]["labels"]["app.kubernetes.io/component"] == (
        "compact"
    )


def test_the_operator_creates_the_tables_leases_as_owned_children() -> None:
    """Every Lease the pods take, labelled and owned like the other children, with Icefall's duration and
    no holder fields; unchanged by a spec change; not rendered by a table whose catalog table is claimed."""
    st = table()
    children = render(st)
    leases = table_leases(st)
    found = [m for m in children.applied if m["kind"] == "Lease"]
    assert [m["metadata"]["name"] for m in found] == [leases.commit, leases.rewrite_yield, *leases.work]
    for manifest in found:
        assert manifest["apiVersion"] == "coordination.k8s.io/v1"
        commit = manifest["metadata"]["name"] == leases.commit
        assert manifest["spec"] == {"leaseDurationSeconds": 15 if commit else 60}
        meta = manifest["metadata"]
        assert meta["namespace"] == "shop"
        assert meta["labels"] == {
            "app.kubernetes.io/name": "icefall",
            "app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/component": "ingest" if commit else "compact",
            "app.kubernetes.io/managed-by": "icefall-operator",
            "icefall.dev/streamingtable": "orders",
        }
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "icefall.dev/v1alpha1",
                "kind": "StreamingTable",
                "name": "orders",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    restarted = render(table(annotations={"icefall.dev/restart": "now"}))
    assert restarted.spec_hash != children.spec_hash
    assert [m for m in restarted.applied if m["kind"] == "Lease"] == found  # nothing to apply again
    claimed = desired_children(
        st, namespace="shop", uid=UID, generation=7, image=IMAGE, operator_settings=OperatorSettings(),
        owns_leases=False,
    )  # fmt: skip
    assert not [m for m in claimed.applied if m["kind"] == "Lease"]


def test_the_longest_allowed_name_fits_and_long_names_are_hashed_not_clipped() -> None:
    longest = "t" * 40  # metadata.name is capped at 40 characters by the API
    for m in manifests(render(table(longest))):
        assert len(m["metadata"]["name"]) <= 63
    a = child_name("icefall-", "a" * 60 + "-x", "-driver")
    b = child_name("icefall-", "a" * 60 + "-y", "-driver")
    assert len(a) == len(b) == 63
    assert a != b
    assert a.startswith("icefall-aaa") and a.endswith("-driver")
    assert child_name("icefall-", "orders", "-driver") == "icefall-orders-driver"


def test_the_deployment_selects_by_stable_labels_and_its_pods_carry_the_spec_hash() -> None:
    children = render(table())
    deployment = children.get("Deployment", "orders-compact")
    assert deployment["spec"]["selector"] == {
        "matchLabels": {
            "app.kubernetes.io/name": "icefall",
            "app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/component": "compact",
        }
    }
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert template_labels[LABEL_SPEC_HASH] == children.spec_hash
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= (
        deployment["spec"]["selector"]["matchLabels"].items()
    )
    assert deployment["spec"]["replicas"] == 2


def test_the_uid_is_required_for_owner_references() -> None:
    with pytest.raises(ValueError, match="uid"):
        desired_children(
            table(), namespace="shop", uid="", generation=1, image=IMAGE, operator_settings=OperatorSettings()
        )


# --- secrets ----------------------------------------------------------------------------------------------


def secured_table() -> StreamingTable:
    return table(
        source={
            "bootstrapServers": "kafka:9093",
            "topic": "orders",
            "security": {
                "protocol": "SASL_SSL",
                "saslMechanism": "SCRAM-SHA-512",
                "username": {"secretKeyRef": {"name": "kafka-user", "key": "username"}},
                "password": {"secretKeyRef": {"name": "kafka-user", "key": "password"}},
                "caCert": {"secretKeyRef": {"name": "kafka-ca", "key": "ca.crt"}},
            },
        },
        table={
            "namespace": "shop",
            "catalog": {
                "name": "lake",
                "type": "rest",
                "uri": "https://catalog:8181",
                "secretProperties": {
                    "credential": {"secretKeyRef": {"name": "catalog", "key": "credential"}},
                    "s3.secret-access-key": {"secretKeyRef": {"name": "s3", "key": "secret"}},
                },
            },
        },
    )


def test_credentials_reach_pods_only_as_secret_key_refs() -> None:
    children = render(secured_table())
    specs = dict(pod_specs(children))
    driver_env = {e["name"]: e for e in env_of(specs["driver"])}
    assert driver_env["ICEFALL_KAFKA_PASSWORD"] == {
        "name": "ICEFALL_KAFKA_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "kafka-user", "key": "password"}},
    }
    assert {"ICEFALL_KAFKA_USERNAME", "ICEFALL_KAFKA_CA_CERT", "ICEFALL_CATALOG_CREDENTIAL"} <= set(
        driver_env
    )
    assert driver_env["ICEFALL_CATALOG_S3_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "s3",
        "key": "secret",
    }
    # Compaction talks to the catalog, never to Kafka.
    compaction_env = {e["name"] for e in env_of(specs["compaction"])}
    assert "ICEFALL_CATALOG_CREDENTIAL" in compaction_env
    assert not any(name.startswith("ICEFALL_KAFKA_") for name in compaction_env)
    for pod_spec in specs.values():
        for entry in pod_spec["containers"][0].get("env", []):
            if entry["name"].startswith(("ICEFALL_KAFKA_", "ICEFALL_CATALOG_")):
                assert "value" not in entry
                assert set(entry["valueFrom"]) == {"secretKeyRef"}
        # The one Secret volume: the table's own Spark RPC secret (icefall.plan.isolation).
        secrets = [v["secret"]["secretName"] for v in pod_spec.get("volumes", []) if "secret" in v]
        assert secrets in ([], ["icefall-orders-spark-auth"])
    assert children.problems == ()


def test_no_secret_value_ever_appears_in_any_manifest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", SENTINEL)
    st = secured_table()
    password = st.spec.source.security.password
    assert password is not None
    env_ref = password.model_copy(update={"secret_key_ref": None, "env": "KAFKA_PASSWORD"})
    security = st.spec.source.security.model_copy(update={"password": env_ref})
    # Smuggle the value into every free-form spec field, bypassing validation as a buggy client might.
    source = st.spec.source.model_copy(
        update={"security": security, "properties": {"sasl.jaas.config": SENTINEL, "x": SENTINEL}}
    )
    assert st.spec.table.catalog is not None
    catalog = st.spec.table.catalog.model_copy(update={"properties": {"token": SENTINEL}, "uri": SENTINEL})
    spec_ = st.spec.model_copy(
        update={
            "source": source,
            "table": st.spec.table.model_copy(update={"catalog": catalog, "properties": {"k": SENTINEL}}),
            "transforms": st.spec.transforms.model_copy(update={"filter": SENTINEL}),
        }
    )
    children = render(st.model_copy(update={"spec": spec_}))
    rendered = json.dumps([*manifests(children), [str(p) for p in children.problems]])
    assert SENTINEL not in rendered
    assert "ICEFALL_KAFKA_PASSWORD" not in rendered
    # The env reference cannot be honoured in a cluster: it is a problem, not a silent gap.
    assert [p.path for p in children.problems] == ["spec.source.security.password"]
    assert "secretKeyRef" in children.problems[0].message


def test_catalog_keys_that_collide_as_env_names_get_distinct_names() -> None:
    st = table(
        table={
            "namespace": "shop",
            "catalog": {
                "name": "lake",
                "type": "rest",
                "uri": "https://catalog:8181",
                "secretProperties": {
                    "a.b": {"secretKeyRef": {"name": "s", "key": "one"}},
                    "a-b": {"secretKeyRef": {"name": "s", "key": "two"}},
                    "token": {"secretKeyRef": {"name": "s", "key": "three"}},
                },
            },
        }
    )
    _, catalog, problems = secret_env_vars(st.spec)
    names = [env.name for env in catalog]
    assert len(set(names)) == 3
    assert "ICEFALL_CATALOG_TOKEN" in names
    assert all(name.startswith("ICEFALL_CATALOG_A_B_") for name in names if "TOKEN" not in name)
    assert secret_env_vars(st.spec) == (_, catalog, problems)  # the entry point gets the same names


# --- pod security -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("master", ["kubernetes", "local[2]"])
def test_every_pod_meets_the_restricted_pod_security_standard(master: str) -> None:
    children = render(table(), OperatorSettings(spark_master=master))
    specs = dict(pod_specs(children))
    assert set(specs) == (
        {"driver", "compaction", "executor"} if master == "kubernetes" else {"driver", "compaction"}
    )
    for where, pod_spec in specs.items():
        pod_security = pod_spec["securityContext"]
        assert pod_security["runAsNonRoot"] is True, where
        assert pod_security["runAsUser"] != 0, where
        assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in pod_spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["runAsNonRoot"] is True, where
            assert "ports" not in container or all("hostPort" not in p for p in container["ports"])
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in pod_spec["volumes"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], where
        for volume in pod_spec["volumes"]:
            # No hostPath; the one Secret volume is the table's Spark RPC secret (icefall.plan.isolation).
            spark_auth = volume.get("secret", {}).get("secretName") == "icefall-orders-spark-auth"
            assert set(volume) & {"emptyDir", "configMap"} or spark_auth, where
        assert "hostNetwork" not in pod_spec and "hostPID" not in pod_spec
    for where in ("driver", "compaction"):
        paths = {m["mountPath"] for m in specs[where]["containers"][0]["volumeMounts"]}
        assert "/var/data/spark-local" in paths
    assert specs.get("executor", {}).get("automountServiceAccountToken", False) is False


def test_resources_come_from_operator_settings() -> None:
    settings = OperatorSettings(
        driver_resources=Resources("2", "4Gi", "3", "4Gi"), compaction_resources=Resources(None, "1Gi")
    )
    specs = dict(pod_specs(render(table(), settings)))
    assert specs["driver"]["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "3", "memory": "4Gi"},
    }
    assert specs["compaction"]["containers"][0]["resources"] == {"requests": {"memory": "1Gi"}}


# --- suspend, commands, Spark ------------------------------------------------------------------------------


def test_suspend_removes_the_driver_and_scales_compaction_to_zero_but_keeps_the_rest() -> None:
    running, suspended = render(table(), replicas=3), render(table(suspend=True), replicas=3)
    assert suspended.driver_pod is None
    assert suspended.get("Deployment", "orders-compact")["spec"]["replicas"] == 0
    assert [(m["kind"], m["metadata"]["name"]) for m in suspended.applied] == [
        (m["kind"], m["metadata"]["name"]) for m in running.applied
    ]
    assert suspended.spec_hash == running.spec_hash  # resuming does not count as a spec change


def test_commands_run_the_entry_points_for_this_table() -> None:
    children = render(table())
    assert children.driver_pod is not None
    driver = children.driver_pod["spec"]["containers"][0]
    metrics = f"--metrics-port={POD_METRICS_PORT}"
    assert driver["command"] == ["icefall", "ingest", "--namespace", "shop", "--name", "orders", metrics]
    assert INGEST_COMMAND[:2] == ("icefall", "ingest")
    compact = children.get("Deployment", "orders-compact")["spec"]["template"]["spec"]["containers"][0]
    assert compact["command"] == ["icefall", "compact", "--namespace", "shop", "--name", "orders", metrics]
    # Both serve Prometheus metrics on a port named `metrics` (the chart's PodMonitor scrapes it).
    for container in (driver, compact):
        assert {"name": "metrics", "containerPort": POD_METRICS_PORT, "protocol": "TCP"} in container["ports"]
    assert COMPACT_COMMAND[:2] == ("icefall", "compact")
    assert driver["image"] == compact["image"] == IMAGE
    assert children.driver_pod["spec"]["restartPolicy"] == "Never"
    # The StreamingTable is read from the API, not mounted: the only ConfigMap is the executor template.
    volumes = children.driver_pod["spec"]["volumes"]
    assert [v["configMap"]["name"] for v in volumes if "configMap" in v] == ["orders-ingest-executor"]


def test_the_driver_runs_spark_on_kubernetes_with_dynamic_allocation() -> None:
    settings = OperatorSettings(min_executors=1, max_executors=8, executor_limit_cores="2")
    children = render(table(), settings)
    conf = spark_conf(children)
    assert children.spark_master == conf["spark.master"] == KUBERNETES_MASTER
    assert conf["spark.kubernetes.container.image"] == IMAGE
    assert conf["spark.kubernetes.namespace"] == "shop"
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "icefall-orders-driver"
    assert conf["spark.kubernetes.driver.pod.name"] == f"$({ENV_POD_NAME})"
    assert conf["spark.driver.host"] == f"$({ENV_POD_IP})"
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    assert (
        conf["spark.dynamicAllocation.shuffleTracking.timeout"]
        == conf["spark.dynamicAllocation.executorIdleTimeout"]
    )
    assert (conf["spark.dynamicAllocation.minExecutors"], conf["spark.dynamicAllocation.maxExecutors"]) == (
        "1",
        "8",
    )
    assert conf["spark.kubernetes.executor.limit.cores"] == "2"
    assert conf[f"spark.kubernetes.executor.label.{LABEL_SPEC_HASH}"] == children.spec_hash
    assert conf["spark.kubernetes.executor.label.icefall.dev/streamingtable"] == "orders"
    assert conf["spark.kubernetes.executor.podTemplateFile"].endswith(EXECUTOR_TEMPLATE_KEY)
    # The driver's Role grants pods only: Spark makes no executor ConfigMap and leaves PVCs and Services.
    assert conf["spark.kubernetes.executor.disableConfigMap"] == "true"
    assert conf["spark.kubernetes.driver.ownPersistentVolumeClaim"] == "false"
    assert conf["spark.kubernetes.driver.reusePersistentVolumeClaim"] == "false"
    assert conf["spark.kubernetes.driver.service.deleteOnTermination"] == "false"
    # The kubelet expands $(VAR) only from variables defined earlier in the list.
    assert children.driver_pod is not None
    names = [e["name"] for e in env_of(children.driver_pod["spec"])]
    assert names.index(ENV_POD_NAME) < names.index(ENV_SPARK_CONF)
    assert names.index(ENV_POD_IP) < names.index(ENV_SPARK_CONF)
    pod_name_env = next(e for e in env_of(children.driver_pod["spec"]) if e["name"] == ENV_POD_NAME)
    assert pod_name_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


@pytest.mark.parametrize(
    ("setting", "annotation", "master"),
    [
        ("local[2]", None, "local[2]"),
        ("kubernetes", "local", "local[*]"),
        ("kubernetes", "local[4]", "local[4]"),
        ("local[2]", "kubernetes", KUBERNETES_MASTER),
    ],
)
def test_a_local_master_keeps_spark_in_the_driver_pod(
    setting: str, annotation: str | None, master: str
) -> None:
    annotations = {ANNOTATION_SPARK_MASTER: annotation} if annotation else {}
    children = render(table(annotations=annotations), OperatorSettings(spark_master=setting))
    conf = spark_conf(children)
    assert children.spark_master == conf["spark.master"] == master
    assert children.problems == ()
    if master == KUBERNETES_MASTER:
        return
    assert not any(key.startswith(("spark.kubernetes.", "spark.dynamicAllocation.")) for key in conf)
    assert children.absent == (ObjectRef("v1", "ConfigMap", "orders-ingest-executor"),)
    assert all(m["kind"] != "ConfigMap" for m in children.applied)
    role = children.get("Role", "icefall-orders-driver")
    assert {r["apiGroups"][0] for r in role["rules"]} == {"icefall.dev", "coordination.k8s.io", ""}
    # Of the core group, only Events (an offset reset request's outcome): no pods without executors.
    assert [r["resources"] for r in role["rules"] if r["apiGroups"] == [""]] == [["events"]]
    assert children.driver_pod is not None
    assert children.driver_pod["spec"]["containers"][0]["ports"] == [
        {"name": "metrics", "containerPort": POD_METRICS_PORT, "protocol": "TCP"}
    ]


def test_an_unusable_master_annotation_is_a_problem_and_the_default_is_used() -> None:
    children = render(table(annotations={ANNOTATION_SPARK_MASTER: "yarn"}))
    assert children.spark_master == KUBERNETES_MASTER
    assert [p.path for p in children.problems] == [f"metadata.annotations[{ANNOTATION_SPARK_MASTER}]"]


def test_operator_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="spark_master"):
        OperatorSettings(spark_master="yarn")
    with pytest.raises(ValueError, match="executors"):
        OperatorSettings(min_executors=5, max_executors=2)


# --- RBAC -------------------------------------------------------------------------------------------------


def test_driver_rbac_is_namespaced_least_privilege_and_names_the_commit_lease() -> None:
    st = table("orders-eu", table={"namespace": "shop", "name": "orders_eu_v2"})
    children = render(st)
    role = children.get("Role", "icefall-orders-eu-driver")
    leases = table_leases(st)  # the names the ingestion entry point takes
    by_resource: dict[str, list[dict[str, Any]]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        for resource in rule["resources"]:
            by_resource.setdefault(resource, []).append(rule)
    assert set(by_resource) == {
        "streamingtables",
        "streamingtables/status",
        "leases",
        "pods",
        "events",
    }
    assert by_resource["events"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    rules = by_resource["leases"]
    assert {"resourceNames": [leases.commit], "verbs": ["get", "update"]}.items() <= rules[0].items()
    # An upgrade: the commit Lease of versions before identity-keyed names is taken, then removed.
    assert rules[1]["resourceNames"] == [leases.legacy_commit] == ["icefall-orders-eu-v2-commit"]
    assert rules[1]["verbs"] == ["get", "update", "delete"]
    assert len(rules) == 2
    # No Lease is created by a pod (RBAC cannot restrict `create` by name): the operator creates them.
    for kind in ("driver", "compact"):
        lease_rules = [
            r
            for r in children.get("Role", f"icefall-orders-eu-{kind}")["rules"]
            if r["resources"] == ["leases"]
        ]
        assert lease_rules and all("resourceNames" in r and "create" not in r["verbs"] for r in lease_rules)
    assert by_resource["streamingtables"][0]["resourceNames"] == ["orders-eu"]
    assert by_resource["streamingtables"][0]["verbs"] == ["get"]
    # Its own status only, to report the lag and freshness it measured (status.writer).
    assert by_resource["streamingtables/status"] == [
        {
            "apiGroups": ["icefall.dev"],
            "resources": ["streamingtables/status"],
            "resourceNames": ["orders-eu"],
            "verbs": ["patch"],
        }
    ]
    # Executors: what Spark's scheduler backend calls, no patch (the chart's admission policy confines which).
    assert by_resource["pods"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["create", "get", "list", "watch", "delete", "deletecollection"],
        }
    ]
    binding = children.get("RoleBinding", "icefall-orders-eu-driver")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "icefall-orders-eu-driver", "namespace": "shop"}
    ]
    assert children.driver_pod is not None
    assert children.driver_pod["spec"]["serviceAccountName"] == "icefall-orders-eu-driver"
    assert all(m["kind"] not in {"ClusterRole", "ClusterRoleBinding", "Secret"} for m in manifests(children))
    compact_role = children.get("Role", "icefall-orders-eu-compact")
    assert {r["resources"][0] for r in compact_role["rules"]} == {"streamingtables", "leases"}


# --- the spec hash ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"freshness": {"targetSeconds": 30}},
        {"batch": {"maxRecords": 5000}},
        {"transforms": {"filter": "id > 0"}},
        {"table": {"namespace": "shop", "properties": {"write.target-file-size-bytes": "1048576"}}},
        {
            "source": {
                "bootstrapServers": "kafka:9092",
                "topic": "orders",
                "properties": {"fetch.max.bytes": "1"},
            }
        },
        {"deadLetter": {"table": {"enabled": False}}},
    ],
)
def test_restart_worthy_spec_changes_change_the_hash(change: dict[str, Any]) -> None:
    assert render(table(**change)).spec_hash != render(table()).spec_hash


def test_image_settings_master_and_the_restart_annotation_change_the_hash() -> None:
    base = render(table()).spec_hash
    assert render(table(), image="registry.example/icefall:1.0.1").spec_hash != base
    assert render(table(), OperatorSettings(max_executors=9)).spec_hash != base
    assert render(table(annotations={ANNOTATION_SPARK_MASTER: "local"})).spec_hash != base
    assert render(table(annotations={ANNOTATION_RESTART: "2024-05-01T12:00:00Z"})).spec_hash != base


def test_status_metadata_suspend_and_deletion_policy_do_not_change_the_hash() -> None:
    base = render(table()).spec_hash
    status = {"observedGeneration": 3, "freshness": {"seconds": 4.0, "lagRecords": 10}}
    assert render(table(status=status)).spec_hash == base
    assert render(table(labels={"team": "data"}, annotations={"note": "x"})).spec_hash == base
    assert render(table(suspend=True)).spec_hash == base
    assert render(table(deletionPolicy="Delete")).spec_hash == base
    # Spelling out a default is not a change either.
    assert render(table(freshness={"targetSeconds": 10}, batch={"maxRecords": 1_000_000})).spec_hash == base


# --- purity -----------------------------------------------------------------------------------------------


def test_the_plan_layer_imports_no_client() -> None:
    code = (
        "import sys\n"
        "import icefall.plan.children, icefall.plan.driver, icefall.plan.conditions, icefall.plan.scaling\n"
        "import icefall.plan.names, icefall.plan.env, icefall.plan.rbac, icefall.plan.spark_conf\n"
        "import icefall.plan.workloads, icefall.plan.metadata\n"
        "bad = [m for m in ('kopf', 'kubernetes', 'pyspark', 'confluent_kafka') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_operator_settings_from_the_environment() -> None:
    settings = OperatorSettings.from_environ(
        {"ICEFALL_SPARK_MASTER": "local[2]", "ICEFALL_EXECUTOR_MEMORY": "512m", "ICEFALL_MAX_EXECUTORS": "8"}
    )
    assert (settings.spark_master, settings.executor_memory, settings.max_executors) == (
        "local[2]",
        "512m",
        8,
    )
    assert OperatorSettings.from_environ({}) == OperatorSettings()
    with pytest.raises(ValueError, match="ICEFALL_MAX_EXECUTORS='many': expected a whole number"):
        OperatorSettings.from_environ({"ICEFALL_MAX_EXECUTORS": "many"})
    with pytest.raises(ValueError, match=r"environment: executors: need 0 <= min \(3\) <= max \(2\)"):
        OperatorSettings.from_environ({"ICEFALL_MIN_EXECUTORS": "3", "ICEFALL_MAX_EXECUTORS": "2"})
