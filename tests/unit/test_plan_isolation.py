"""One table's Spark kept to itself (`icefall.plan.isolation`, as `plan.children` renders it).

Proves, on the rendered manifests:
- Spark on Kubernetes: the driver's conf turns on authenticated, encrypted RPC (`spark.authenticate`,
  `spark.network.crypto.enabled`, no SASL fall-back) with the secret read from a file in the driver and
  in the executors, so Spark puts it in no executor env; the driver pod and the executors' pod template
  mount the table's own Secret there, read-only, by name; the Secret is rendered without a value,
  immutable, for creation only (`Children.created`), with metadata that does not change with the spec;
  nothing rendered carries Spark's secret settings or variable (`spark.authenticate.secret`,
  `_SPARK_AUTH_SECRET`); a table cannot turn any of it off (`spec.spark.conf` refuses the keys);
- a local master (no executors) gets none of it;
- the NetworkPolicy selects the table's driver, executors and compaction pods and not the chart's operator
  pod; it admits the table's driver and executors (not its compaction pods) to each other, and the
  monitoring namespace to the `metrics` port only; without that setting it is absent; its settings come
  from the operator's environment and restart no driver.
Enforcement is not tested here (no network plugin that enforces NetworkPolicies runs in these tests).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from icefall.api import StreamingTable
from icefall.plan.children import Children, ObjectRef, desired_children
from icefall.plan.env import ENV_SPARK_CONF
from icefall.plan.isolation import SPARK_AUTH_DIR, SPARK_AUTH_FILE
from icefall.plan.settings import OperatorSettings
from icefall.plan.spark_conf import EXECUTOR_TEMPLATE_KEY

pytestmark = pytest.mark.unit

SECRET = "icefall-orders-spark-auth"


def table(**spark: Any) -> StreamingTable:
    return StreamingTable.model_validate(
        {
            "apiVersion": "icefall.dev/v1alpha1",
            "kind": "StreamingTable",
            "metadata": {"name": "orders"},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
                "table": {"namespace": "shop"},
                **({"spark": spark} if spark else {}),
            },
        }
    )


def render(settings: OperatorSettings | None = None, st: StreamingTable | None = None) -> Children:
    return desired_children(
        st or table(),
        namespace="shop",
        uid="uid-1",
        generation=3,
        image="icefall:1",
        operator_settings=settings or OperatorSettings(),
        compaction_replicas=1,
    )


def driver_conf(children: Children) -> dict[str, str]:
    assert children.driver_pod is not None
    env = children.driver_pod["spec"]["containers"][0]["env"]
    conf: dict[str, str] = json.loads(next(e["value"] for e in env if e["name"] == ENV_SPARK_CONF))
    return conf


def executor_pod(children: Children) -> dict[str, Any]:
    template: dict[str, Any] = json.loads(
        children.get("ConfigMap", "orders-ingest-executor")["data"][EXECUTOR_TEMPLATE_KEY]
    )
    return template


def auth_mounts(pod_spec: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    return [
        (volumes[m["name"]], m)
        for m in pod_spec["containers"][0]["volumeMounts"]
        if m["mountPath"] == SPARK_AUTH_DIR
    ]


def test_spark_rpc_is_authenticated_and_encrypted_with_the_tables_secret_file() -> None:
    children = render()
    conf = driver_conf(children)
    assert {
        key: conf[key] for key in conf if key.startswith(("spark.authenticate", "spark.network.crypto"))
    } == {
        "spark.authenticate": "true",
        "spark.authenticate.secret.file": SPARK_AUTH_FILE,
        "spark.authenticate.secret.driver.file": SPARK_AUTH_FILE,
        "spark.authenticate.secret.executor.file": SPARK_AUTH_FILE,
        "spark.network.crypto.enabled": "true",
        "spark.network.crypto.saslFallback": "false",
    }
    assert children.driver_pod is not None
    for pod_spec in (children.driver_pod["spec"], executor_pod(children)["spec"]):
        ((volume, mount),) = auth_mounts(pod_spec)
        assert volume["secret"] == {"secretName": SECRET, "defaultMode": 0o440}
        assert mount["readOnly"] is True
    (secret,) = children.created
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == SECRET
    assert secret["immutable"] is True and "data" not in secret and "stringData" not in secret
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # Nothing carries the value or the settings that would hold it.
    rendered = json.dumps([*children.applied, children.driver_pod, *children.created])
    assert '"spark.authenticate.secret"' not in rendered and "_SPARK_AUTH_SECRET" not in rendered


def test_the_secret_is_created_once_whatever_the_spec_becomes() -> None:
    other = table(conf={"spark.sql.shuffle.partitions": "7"})
    assert render().spec_hash != render(st=other).spec_hash
    assert render().created == render(st=other).created  # no create attempt per spec change


def test_a_table_cannot_turn_rpc_authentication_off() -> None:
    for key in (
        "spark.authenticate",
        "spark.network.crypto.enabled",
        "spark.authenticate.secret.driver.file",
    ):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            table(conf={key: "false"})


def test_a_local_master_has_no_executors_to_authenticate() -> None:
    children = render(OperatorSettings(spark_master="local[2]"))
    assert children.created == ()
    assert not any(key.startswith(("spark.authenticate", "spark.network")) for key in driver_conf(children))
    assert children.driver_pod is not None
    assert auth_mounts(children.driver_pod["spec"]) == []


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_network_policy_admits_only_the_tables_spark_pods_and_the_scrapers() -> None:
    children = render()
    policy = children.get("NetworkPolicy", "icefall-orders-ingress")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec
    selected = spec["podSelector"]["matchLabels"]
    assert children.driver_pod is not None
    driver = children.driver_pod["metadata"]["labels"]
    compaction = children.get("Deployment", "orders-compact")["spec"]["template"]["metadata"]["labels"]
    prefix = "spark.kubernetes.executor.label."
    executor = {k.removeprefix(prefix): v for k, v in driver_conf(children).items() if k.startswith(prefix)}
    operator = {  # the chart's operator pod (templates/_helpers.tpl), whatever its release is called
        "app.kubernetes.io/name": "icefall",
        "app.kubernetes.io/instance": "orders",
        "app.kubernetes.io/component": "operator",
        "app.kubernetes.io/managed-by": "Helm",
    }
    assert [matches(selected, labels) for labels in (driver, executor, compaction, operator)] == [
        True,
        True,
        True,
        False,
    ]
    peers, scrapers = spec["ingress"]
    (peer,) = peers["from"]
    assert "ports" not in peers  # Spark picks its executors' ports
    assert [
        matches(peer["podSelector"]["matchLabels"], labels) for labels in (driver, executor, compaction)
    ] == [
        True,
        True,
        False,
    ]
    assert scrapers == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": "metrics"}],
    }


def test_network_policy_settings_come_from_the_environment_and_restart_nothing() -> None:
    settings = OperatorSettings.from_environ(
        {"ICEFALL_NETWORK_POLICY": "false", "ICEFALL_METRICS_NAMESPACE": "prometheus"}
    )
    assert (settings.network_policy, settings.metrics_namespace) == (False, "prometheus")
    off = render(settings)
    assert ObjectRef("networking.k8s.io/v1", "NetworkPolicy", "icefall-orders-ingress") in off.absent
    assert all(m["kind"] != "NetworkPolicy" for m in off.applied)
    assert off.spec_hash == render().spec_hash
    elsewhere = render(OperatorSettings(metrics_namespace="prometheus")).get(
        "NetworkPolicy", "icefall-orders-ingress"
    )
    assert elsewhere["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "prometheus"
    }
    with pytest.raises(ValueError, match="ICEFALL_NETWORK_POLICY"):
        OperatorSettings.from_environ({"ICEFALL_NETWORK_POLICY": "yes"})
    with pytest.raises(ValueError, match="metrics_namespace"):
        OperatorSettings.from_environ({"ICEFALL_METRICS_NAMESPACE": "Not_A_Namespace"})
