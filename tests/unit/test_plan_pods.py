"""Pod templates (`spec.pods` and the operator's chart-wide `pods`) on the pods a StreamingTable owns.

Proves: the layers merge as documented (maps per key, env/volumes/pull secrets by name, mounts by path,
tolerations appended, scalars replaced, the table over the chart over the built-in resources, an inherited
request lowered to a new limit); every field of a template reaches each of the three pod kinds (driver
pod, executor pod template, compaction Deployment) after the operator's own env, volumes and labels,
which it cannot replace; ServiceAccount annotations reach the driver's and compaction's ServiceAccounts;
executor cpu and memory become Spark settings; host-network pods get dnsPolicy ClusterFirstWithHostNet,
no fixed Spark ports (conf or containerPorts), executors a free block manager port and no host-local
shuffle reads, the compaction Deployment a replace-first rollout, and a metrics port derived per table
and role within the configured range, declared as `metrics` and passed to the process; the spec hash
moves with `spec.pods` and the chart-wide template; `ICEFALL_POD_TEMPLATE` and
`ICEFALL_HOST_NETWORK_PORTS` parse, and their errors name the variable.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from icefall.api import PodTemplate, PodTemplates, StreamingTable
from icefall.api.pods import reserved_env
from icefall.plan import pods
from icefall.plan.children import Children, desired_children
from icefall.plan.env import ENV_SPARK_CONF
from icefall.plan.purge import purge_job
from icefall.plan.settings import OperatorSettings
from icefall.plan.spark_conf import BLOCK_MANAGER_PORT, DRIVER_PORT, EXECUTOR_TEMPLATE_KEY
from icefall.plan.workloads import POD_METRICS_PORT, pod_plans

pytestmark = pytest.mark.unit

UID = "0b9c6a4e-1111-2222-3333-444455556666"


def table(name: str = "orders", *, pods_: dict[str, Any] | None = None, **spec: Any) -> StreamingTable:
    body: dict[str, Any] = {
        "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
        "format": {"schema": [{"name": "id", "type": "long"}]},
        **spec,
    }
    if pods_ is not None:
        body["pods"] = pods_
    return StreamingTable.model_validate({"metadata": {"name": name}, "spec": body})


def render(
    st: StreamingTable, settings: OperatorSettings | None = None, *, namespace: str = "shop"
) -> Children:
    return desired_children(
        st, namespace=namespace, uid=UID, generation=3, image="img:1",
        operator_settings=settings or OperatorSettings(), compaction_replicas=1,
    )  # fmt: skip


def driver_spec(children: Children) -> dict[str, Any]:
    assert children.driver_pod is not None
    spec: dict[str, Any] = children.driver_pod["spec"]
    return spec


def compaction(children: Children, name: str = "orders") -> dict[str, Any]:
    return children.get("Deployment", f"{name}-compact")


def executor_pod(children: Children, name: str = "orders") -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        children.get("ConfigMap", f"{name}-ingest-executor")["data"][EXECUTOR_TEMPLATE_KEY]
    )
    return body


def pod_specs(children: Children) -> dict[str, dict[str, Any]]:
    return {
        "driver": driver_spec(children),
        "executor": executor_pod(children)["spec"],
        "compaction": compaction(children)["spec"]["template"]["spec"],
    }


def spark_conf(children: Children) -> dict[str, str]:
    (entry,) = [e for e in driver_spec(children)["containers"][0]["env"] if e["name"] == ENV_SPARK_CONF]
    conf: dict[str, str] = json.loads(entry["value"])
    return conf


def template(**fields: Any) -> PodTemplate:
    return PodTemplate.model_validate(fields)


# --- merging --------------------------------------------------------------------------------------------


def test_maps_merge_per_key_and_lists_replace_by_name_or_append() -> None:
    low = template(
        labels={"team": "data", "tier": "low"},
        nodeSelector={"pool": "a"},
        env=[{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        volumes=[{"name": "certs", "secret": {"secretName": "old"}}],
        volumeMounts=[{"name": "certs", "mountPath": "/certs"}],
        imagePullSecrets=[{"name": "registry"}],
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
        affinity={"nodeAffinity": {"old": True}, "podAntiAffinity": {"keep": True}},
        priorityClassName="low",
        hostNetwork=True,
    )
    high = template(
        labels={"tier": "high"},
        env=[{"name": "B", "value": "two"}, {"name": "C", "value": "3"}],
        volumes=[{"name": "certs", "secret": {"secretName": "new"}}, {"name": "data", "emptyDir": {}}],
        volumeMounts=[{"name": "data", "mountPath": "/certs", "readOnly": True}],
        imagePullSecrets=[{"name": "registry"}, {"name": "mirror"}],
        tolerations=[{"key": "dedicated", "operator": "Exists"}, {"key": "gpu", "operator": "Exists"}],
        affinity={"nodeAffinity": {"new": True}},
        hostNetwork=False,
    )
    merged = pods.merge([low, high])
    assert merged.labels == {"team": "data", "tier": "high"}
    assert merged.node_selector == {"pool": "a"}
    assert [(e.name, e.value) for e in merged.env] == [("A", "1"), ("B", "two"), ("C", "3")]
    assert [(v.name, v.model_extra) for v in merged.volumes] == [
        ("certs", {"secret": {"secretName": "new"}}),
        ("data", {"emptyDir": {}}),
    ]
    assert [(m.name, m.mount_path, m.read_only) for m in merged.volume_mounts] == [("data", "/certs", True)]
    assert [s.name for s in merged.image_pull_secrets] == ["registry", "mirror"]
    assert [t.key for t in merged.tolerations] == ["dedicated", "gpu"]  # appended, the same one once
    assert merged.affinity is not None
    assert (merged.affinity.node_affinity, merged.affinity.pod_anti_affinity) == (
        {"new": True},
        {"keep": True},
    )
    assert (merged.priority_class_name, merged.host_network) == ("low", False)  # unset inherits; set replaces
    assert pods.merge([high, template()]) == pods.merge([high])  # an empty layer changes nothing


def test_resources_merge_per_name_and_an_inherited_request_follows_a_new_limit() -> None:
    base = template(resources={"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}})
    lower = pods.merge([base, template(resources={"limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}})])
    assert lower.resources is not None
    assert lower.resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert lower.resources.limits == {"memory": "1Gi", "nvidia.com/gpu": "1"}
    higher = pods.merge([base, template(resources={"requests": {"memory": "3Gi"}})])
    assert higher.resources is not None
    assert higher.resources.limits == {"memory": "3Gi"}  # the inherited limit rises to the new request
    both = pods.merge(
        [base, template(resources={"requests": {"memory": "1Gi"}, "limits": {"memory": "8Gi"}})]
    )
    assert both.resources is not None and both.resources.requests["memory"] == "1Gi"


def test_the_table_wins_over_the_chart_and_the_role_over_common() -> None:
    chart = PodTemplates.model_validate(
        {
            "common": {"labels": {"a": "chart-common", "b": "chart-common", "c": "chart-common"}},
            "driver": {"labels": {"a": "chart-driver", "b": "chart-driver", "c": "chart-driver"}},
        }
    )
    spec = PodTemplates.model_validate(
        {
            "common": {"labels": {"b": "table-common", "c": "table-common"}},
            "driver": {"labels": {"c": "table"}},
        }
    )
    driver = pods.effective(pods.DRIVER, base=template(), chart=chart, table=spec)
    assert driver.labels == {"a": "chart-driver", "b": "table-common", "c": "table"}
    compaction_ = pods.effective(pods.COMPACTION, base=template(), chart=chart, table=spec)
    assert compaction_.labels == {"a": "chart-common", "b": "table-common", "c": "table-common"}


def test_built_in_resources_are_the_lowest_layer() -> None:
    settings = OperatorSettings(
        pod_template=PodTemplates.model_validate({"driver": {"resources": {"limits": {"cpu": "4"}}}})
    )
    children = render(table(pods_={"common": {"resources": {"requests": {"memory": "3Gi"}}}}), settings)
    assert driver_spec(children)["containers"][0]["resources"] == {
        "requests": {"cpu": "1", "memory": "3Gi"},
        "limits": {"cpu": "4", "memory": "3Gi"},
    }
    assert compaction(children)["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "3Gi"},
        "limits": {"memory": "3Gi"},
    }


# --- every field reaches every pod ------------------------------------------------------------------------

EVERYTHING: dict[str, Any] = {
    "labels": {"team": "data"},
    "annotations": {"example.com/owner": "data"},
    "imagePullSecrets": [{"name": "registry"}],
    "nodeSelector": {"pool": "ingest"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "data", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "priorityClassName": "data-high",
    "env": [
        {"name": "AWS_REGION", "value": "eu-west-1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
    ],
    "volumes": [{"name": "certs", "secret": {"secretName": "kafka-ca"}}],
    "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs", "readOnly": True}],
}


@pytest.mark.parametrize("where", ["common", "driver", "executor", "compaction"])
def test_every_field_reaches_its_pods_after_the_operators_own(where: str) -> None:
    children = render(table(pods_={where: EVERYTHING}))
    roles = ("driver", "executor", "compaction") if where == "common" else (where,)
    for role, spec in pod_specs(children).items():
        container = spec["containers"][0]
        reached = role in roles
        assert (spec.get("imagePullSecrets") == [{"name": "registry"}]) is reached, role
        assert (spec.get("nodeSelector") == {"pool": "ingest"}) is reached, role
        assert (spec.get("tolerations") == EVERYTHING["tolerations"]) is reached, role
        assert (spec.get("affinity") == EVERYTHING["affinity"]) is reached, role
        assert (spec.get("priorityClassName") == "data-high") is reached, role
        assert (container.get("env", [])[-2:] == EVERYTHING["env"]) is reached, role
        assert (spec["volumes"][-1] == EVERYTHING["volumes"][0]) is reached, role
        assert (container["volumeMounts"][-1] == EVERYTHING["volumeMounts"][0]) is reached, role
        assert spec["volumes"][0]["name"] == "tmp" and container["volumeMounts"][0]["name"] == "tmp", role
    metadata = {
        "driver": children.driver_pod["metadata"] if children.driver_pod else {},
        "executor": executor_pod(children).get("metadata", {}),
        "compaction": compaction(children)["spec"]["template"]["metadata"],
    }
    for role, meta in metadata.items():
        reached = role in roles
        assert (meta.get("labels", {}).get("team") == "data") is reached, role
        assert (meta.get("annotations", {}).get("example.com/owner") == "data") is reached, role
        if role != "executor":  # the operator's labels stay (selectors, the spec hash)
            assert meta["labels"]["app.kubernetes.io/instance"] == "orders"
            assert meta["labels"]["icefall.dev/spec-hash"] == children.spec_hash


def test_resources_reach_the_driver_and_compaction_containers() -> None:
    resources = {"requests": {"cpu": "3", "memory": "6Gi"}, "limits": {"memory": "6Gi"}}
    children = render(
        table(pods_={"driver": {"resources": resources}, "compaction": {"resources": resources}})
    )
    assert driver_spec(children)["containers"][0]["resources"] == resources
    assert compaction(children)["spec"]["template"]["spec"]["containers"][0]["resources"] == resources


def test_executor_cpu_and_memory_become_spark_settings_and_the_rest_stays_on_the_container() -> None:
    resources = {"requests": {"cpu": "1500m"}, "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}}
    children = render(table(pods_={"executor": {"resources": resources}}))
    conf = spark_conf(children)
    assert conf["spark.kubernetes.executor.request.cores"] == "1500m"
    assert conf["spark.kubernetes.executor.limit.cores"] == "2"
    heap, overhead = int(conf["spark.executor.memory"][:-1]), int(conf["spark.executor.memoryOverhead"][:-1])
    assert heap + overhead == 4096 and overhead == 409  # max(384 MiB, 10 %)
    assert executor_pod(children)["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert children.problems == ()
    # Without a template, the operator's Spark settings apply and the container has no resources.
    plain = render(table())
    assert spark_conf(plain)["spark.executor.memory"] == "2g"
    assert "spark.executor.memoryOverhead" not in spark_conf(plain)
    assert "resources" not in executor_pod(plain)["spec"]["containers"][0]


def test_too_little_executor_memory_from_the_layers_is_a_problem_and_the_setting_stays() -> None:
    settings = OperatorSettings(
        pod_template=PodTemplates.model_validate({"common": {"resources": {"limits": {"memory": "512Mi"}}}})
    )
    children = render(table(), settings)
    assert [p.path for p in children.problems] == ["spec.pods.executor.resources"]
    assert "896Mi" in children.problems[0].message
    assert spark_conf(children)["spark.executor.memory"] == "2g"


def test_service_account_annotations_reach_the_driver_and_compaction_accounts() -> None:
    irsa = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/ingest"}
    gke = {"iam.gke.io/gcp-service-account": "compact@project.iam.gserviceaccount.com"}
    children = render(
        table(pods_={"common": {"serviceAccountAnnotations": {"x": "common"}},
                     "driver": {"serviceAccountAnnotations": irsa},
                     "compaction": {"serviceAccountAnnotations": gke}})
    )  # fmt: skip
    driver = children.get("ServiceAccount", "icefall-orders-driver")["metadata"]["annotations"]
    compact = children.get("ServiceAccount", "icefall-orders-compact")["metadata"]["annotations"]
    assert driver == {"x": "common", **irsa, "icefall.dev/generation": "3"}
    assert compact == {"x": "common", **gke, "icefall.dev/generation": "3"}
    role = children.get("Role", "icefall-orders-driver")["metadata"]["annotations"]
    assert role == {"icefall.dev/generation": "3"}  # only the ServiceAccounts
    # The executors run as the driver's account, so the IRSA role reaches them too.
    assert spark_conf(children)["spark.kubernetes.authenticate.executor.serviceAccountName"] == (
        "icefall-orders-driver"
    )


def test_every_env_var_the_operator_sets_is_refused_in_a_template() -> None:
    st = table(
        source={
            "bootstrapServers": "kafka:9093",
            "topic": "orders",
            "security": {
                "protocol": "SASL_SSL",
                "saslMechanism": "PLAIN",
                "username": {"secretKeyRef": {"name": "k", "key": "u"}},
                "password": {"secretKeyRef": {"name": "k", "key": "p"}},
            },
        },
        table={
            "catalog": {
                "name": "lake", "type": "rest", "uri": "https://catalog:8181",
                "secretProperties": {"credential": {"secretKeyRef": {"name": "c", "key": "c"}}},
            }
        },
    )  # fmt: skip
    names = {
        e["name"] for spec in pod_specs(render(st)).values() for e in spec["containers"][0].get("env", [])
    }
    assert {"ICEFALL_SPARK_CONF", "ICEFALL_KAFKA_PASSWORD", "ICEFALL_CATALOG_CREDENTIAL"} <= names
    assert all(reserved_env(name) for name in names), sorted(n for n in names if not reserved_env(n))


def node_identity_values(children: Children, st: StreamingTable, settings: OperatorSettings) -> list[Any]:
    """AWS_EC2_METADATA_DISABLED in the driver, executor, compaction and purge pods (None: not set)."""
    job = purge_job(
        st, namespace="shop", uid=UID, image="img:1", settings=settings, table_uuid="u",
        dead_letter_table_uuid=None, active_seconds=60,
    )  # fmt: skip
    specs = [*pod_specs(children).values(), job["spec"]["template"]["spec"]]
    return [
        {e["name"]: e.get("value") for e in spec["containers"][0].get("env", [])}.get(
            "AWS_EC2_METADATA_DISABLED"
        )
        for spec in specs
    ]


def test_no_table_pod_may_borrow_the_nodes_aws_role_unless_the_operator_allows_it() -> None:
    st = table()
    assert node_identity_values(render(st), st, OperatorSettings()) == ["true"] * 4
    allowed = OperatorSettings.from_environ({"ICEFALL_ALLOW_NODE_IDENTITY": "true"})
    assert node_identity_values(render(st, allowed), st, allowed) == [None] * 4
    with pytest.raises(ValueError, match="AWS_EC2_METADATA_DISABLED"):  # a table cannot turn it back on
        template(env=[{"name": "AWS_EC2_METADATA_DISABLED", "value": "false"}])


# --- host network ---------------------------------------------------------------------------------------

HOST = {"common": {"hostNetwork": True}}


def test_host_network_pods_use_the_nodes_network_and_dns() -> None:
    children = render(table(pods_=HOST))
    for role, spec in pod_specs(children).items():
        assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet"), role
    for role, spec in pod_specs(render(table())).items():
        assert "hostNetwork" not in spec and "dnsPolicy" not in spec, role


def test_a_host_network_driver_fixes_no_spark_port() -> None:
    children = render(table(pods_={"driver": {"hostNetwork": True}}))
    conf = spark_conf(children)
    assert "spark.driver.port" not in conf and "spark.driver.blockManager.port" not in conf
    ports = driver_spec(children)["containers"][0]["ports"]
    assert [p["name"] for p in ports] == ["metrics"]
    assert not {DRIVER_PORT, BLOCK_MANAGER_PORT} & {p["containerPort"] for p in ports}
    # On the pod network the fixed ports stay (executors reach the driver at them).
    conf = spark_conf(render(table()))
    assert (conf["spark.driver.port"], conf["spark.driver.blockManager.port"]) == ("7078", "7079")
    assert "spark.shuffle.readHostLocalDisk" not in conf and "spark.blockManager.port" not in conf


def test_host_network_executors_pick_free_ports_and_never_read_shuffle_files_from_the_node_disk() -> None:
    conf = spark_conf(render(table(pods_={"executor": {"hostNetwork": True}})))
    assert conf["spark.shuffle.readHostLocalDisk"] == "false"
    assert conf["spark.blockManager.port"] == "0"  # Spark then declares no executor port either
    assert conf["spark.driver.port"] == "7078"  # the driver is still on the pod network


def test_host_network_metrics_ports_are_derived_per_table_and_role_and_reach_the_process() -> None:
    settings = OperatorSettings(host_network_ports=(21000, 21999))
    seen: dict[tuple[str, str], int] = {}
    for name in ("orders", "payments"):
        children = render(table(name, pods_=HOST), settings)
        driver = driver_spec(children)["containers"][0]
        compact = compaction(children, name)["spec"]["template"]["spec"]["containers"][0]
        for role, container in (("driver", driver), ("compaction", compact)):
            (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
            number = port["containerPort"]
            assert 21000 <= number <= 21999 and port["hostPort"] == number
            assert container["command"][-1] == f"--metrics-port={number}"
            seen[(name, role)] = number
    assert len(set(seen.values())) == 4, seen  # two tables, two roles: four ports
    again = render(table("orders", pods_=HOST), settings)
    assert (
        driver_spec(again)["containers"][0]["command"][-1] == f"--metrics-port={seen[('orders', 'driver')]}"
    )
    elsewhere = render(table("orders", pods_=HOST), settings, namespace="staging")
    assert (
        driver_spec(elsewhere)["containers"][0]["command"][-1]
        != f"--metrics-port={seen[('orders', 'driver')]}"
    )
    # Off the host network: the usual port, no hostPort.
    plain = driver_spec(render(table(), settings))["containers"][0]
    assert plain["ports"][0] == {"name": "metrics", "containerPort": POD_METRICS_PORT, "protocol": "TCP"}
    assert plain["command"][-1] == f"--metrics-port={POD_METRICS_PORT}"


def test_driver_and_compaction_ports_differ_even_in_a_two_port_range() -> None:
    for name in ("a", "b", "c", "d", "e", "f", "g", "h"):
        ports = {
            pods.host_network_port("ns", name, role, (30000, 30001))
            for role in (pods.DRIVER, pods.COMPACTION)
        }
        assert ports == {30000, 30001}, name
    plans = pod_plans(table(pods_=HOST), OperatorSettings(), namespace="shop")
    assert plans[pods.DRIVER].metrics_port != plans[pods.COMPACTION].metrics_port


def test_a_host_network_compaction_deployment_replaces_a_pod_before_starting_the_next() -> None:
    assert compaction(render(table(pods_=HOST)))["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert "strategy" not in compaction(render(table()))["spec"]


# --- the spec hash and the operator's settings ------------------------------------------------------------


def test_the_spec_hash_moves_with_the_table_and_the_chart_templates() -> None:
    base = render(table()).spec_hash
    assert render(table(pods_={"common": {"nodeSelector": {"pool": "a"}}})).spec_hash != base
    assert render(table(pods_={"executor": {"hostNetwork": True}})).spec_hash != base
    chart = PodTemplates.model_validate({"compaction": {"labels": {"team": "x"}}})
    assert render(table(), OperatorSettings(pod_template=chart)).spec_hash != base
    assert render(table(), OperatorSettings(host_network_ports=(20000, 20999))).spec_hash != base
    assert render(table(pods_={})).spec_hash == base  # spelling out the default is no change


def test_operator_settings_read_the_pod_template_and_port_range_from_the_environment() -> None:
    chart = {"common": {"nodeSelector": {"pool": "a"}}, "driver": {"hostNetwork": True}, "executor": {}}
    settings = OperatorSettings.from_environ(
        {"ICEFALL_POD_TEMPLATE": json.dumps(chart), "ICEFALL_HOST_NETWORK_PORTS": "25000-25099"}
    )
    assert settings.pod_template == PodTemplates.model_validate(chart)
    assert settings.host_network_ports == (25000, 25099)
    empty: dict[str, dict[str, Any]] = {
        "common": {},
        "driver": {},
        "executor": {},
        "compaction": {},
    }  # the chart's default
    assert OperatorSettings.from_environ({"ICEFALL_POD_TEMPLATE": json.dumps(empty)}) == OperatorSettings()


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"ICEFALL_POD_TEMPLATE": "{common: {}}"}, r"^ICEFALL_POD_TEMPLATE: not JSON"),
        (
            {
                "ICEFALL_POD_TEMPLATE": json.dumps(
                    {"driver": {"env": [{"name": "ICEFALL_POD_IP", "value": "x"}]}}
                )
            },
            r"^ICEFALL_POD_TEMPLATE: pods\.driver\.env\[0\]\.name: ICEFALL_POD_IP is set by the operator",
        ),
        (
            {"ICEFALL_POD_TEMPLATE": json.dumps({"common": {"nodeSelecter": {}}})},
            r"^ICEFALL_POD_TEMPLATE: pods\.common\.nodeSelecter: unknown field.*did you mean 'nodeSelector'",
        ),
        (
            {"ICEFALL_HOST_NETWORK_PORTS": "20000"},
            r"^ICEFALL_HOST_NETWORK_PORTS='20000': expected a port range",
        ),
        (
            {"ICEFALL_HOST_NETWORK_PORTS": "9000-8000"},
            r"environment: host_network_ports 9000-8000: need 1024",
        ),
        ({"ICEFALL_HOST_NETWORK_PORTS": "80-90"}, r"host_network_ports 80-90: need 1024 <= first"),
    ],
)
def test_bad_settings_from_the_environment_name_the_variable_or_setting(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorSettings.from_environ(environ)
