"""The Helm chart charts/icefall against helm and a real kube-apiserver.

Proves:
- `helm lint` (also `--strict`) passes with the default values and with clusterWide + ServiceMonitor +
  PrometheusRule;
- `helm template` renders both: a Role/RoleBinding in the release namespace by default, a ClusterRole/
  ClusterRoleBinding and `--all-namespaces` with `rbac.clusterWide`, a ServiceMonitor, a PodMonitor and a
  PrometheusRule only when enabled;
- the PodMonitor selects the driver pod and the compaction pods `plan.children` renders (not the operator)
  on their port `metrics`, in the release namespace or, cluster-wide, in every namespace;
- the Grafana dashboard ConfigMap carries the sidecar's label (name and value configurable) and the
  generated dashboard file byte for byte, and disappears when disabled;
- values.schema.json rejects a bad value (`replicas: "two"`, an unknown key, an env name the operator sets
  in `pods`);
- the operator's startup, liveness and readiness probes are on kopf's /healthz at `health.port` with the
  timings of `health.*Probe`; `health.port` equal to `metrics.port`, or (with `hostNetwork`) either inside
  `hostNetworkPorts`, is refused at render time with a message naming the values;
- `cloudIdentity` (EKS role ARN, GKE service account, AKS client id) annotates the operator's ServiceAccount
  and every table's driver and compaction ServiceAccount, and labels every pod for AKS; bad values are
  refused at render time;
- `pods` and `hostNetworkPorts` reach the operator as its settings (ICEFALL_POD_TEMPLATE,
  ICEFALL_HOST_NETWORK_PORTS), and `hostNetwork` puts the operator's own pod on the node's network with
  ClusterFirstWithHostNet DNS (off by default);
- the chart's CRD is byte for byte crds/ (refresh it with `make chart-crds`);
- every rendered object, the CRD included, passes `kubectl apply --server-side --dry-run=server` (a minimal
  ServiceMonitor, PodMonitor and PrometheusRule CRD are installed first: prometheus-operator is not here);
- the operator can grant what drivers and compaction pods need: the rendered Role holds every rule of
  `driver_rules` and `compaction_rules`, statically and on the API server, which refuses a Role (or a
  RoleBinding to it) granting more than its creator holds, while the operator has no `escalate`/`bind`;
- the operator pod satisfies the `restricted` Pod Security Standard;
- `networkPolicy` gives the operator's pod a NetworkPolicy admitting only `metricsNamespace` to its metrics
  port (none at all without metrics), reaches the operator's settings, and the per-table NetworkPolicy and
  Spark RPC Secret the operator sends pass the server-side dry run; the operator creates Secrets but never
  lists, watches or updates them.
Not proved: that a network plugin enforces the NetworkPolicies (none here does); that the operator starts
(its `icefall operator` command and the image are tested elsewhere).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.api import PodTemplate, PodTemplates, load_manifest
from icefall.api.pod_policy import PodPolicy
from icefall.controller.reconcile import Config, with_secret_value
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir
from icefall.plan.children import desired_children
from icefall.plan.names import driver_account_name, network_policy_name
from icefall.plan.pods import effective
from icefall.plan.rbac import compaction_rules, driver_rules
from icefall.plan.settings import SETTINGS_ENV, OperatorSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "icefall"
CRD_FILE = "streamingtables.icefall.dev.yaml"
VALUES_POD_POLICY = yaml.safe_load((CHART / "values.yaml").read_text())["podPolicy"]
RELEASE = "icefall"
CLUSTER_WIDE = (
    "--set",
    "rbac.clusterWide=true",
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "metrics.prometheusRule.enabled=true",
    "--set",
    "metrics.podMonitor.enabled=true",
)


def _monitoring_crd(kind: str) -> dict[str, Any]:
    """Just enough of a prometheus-operator CRD for the API server to accept a `kind` object."""
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


MONITORING_CRDS = [_monitoring_crd(kind) for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")]
#: templates/admission-policies.yaml (cluster-scoped): the pod policy's and the executors'.
ADMISSION = ["ValidatingAdmissionPolicy"] * 2 + ["ValidatingAdmissionPolicyBinding"] * 2


def _run(
    tool: str,
    *args: str,
    home: Path,
    kube: KubeAPIServer | None = None,
    stdin: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}
    if kube is not None:
        env["KUBECONFIG"] = str(kube.kubeconfig)
    result = subprocess.run(
        [tool, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if check:
        assert result.returncode == 0, f"{tool} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def helm(*args: str, home: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(str(tool_dir("ICEFALL_HELM_BIN") / "helm"), *args, home=home, check=check)


def kubectl(*args: str, kube: KubeAPIServer, home: Path, stdin: str | None = None) -> str:
    return _run(
        str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl"), *args, home=home, kube=kube, stdin=stdin
    ).stdout


def render(home: Path, namespace: str, *values: str, crds: bool = False) -> list[dict[str, Any]]:
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, *values]
    out = helm(*args, *(["--include-crds"] if crds else []), home=home).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def only(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def kinds(docs: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(doc["kind"] for doc in docs)


@pytest.mark.parametrize("values", [(), CLUSTER_WIDE], ids=["default", "cluster-wide"])
def test_helm_lint(home: Path, values: tuple[str, ...]) -> None:
    helm("lint", str(CHART), *values, home=home)
    helm("lint", "--strict", str(CHART), *values, home=home)


def test_default_render_is_namespaced(home: Path) -> None:
    docs = render(home, "icefall-system")
    assert kinds(docs) == [
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        *ADMISSION,
    ]
    namespaced = [doc for doc in docs if doc["kind"] not in ADMISSION]
    assert {doc["metadata"]["namespace"] for doc in namespaced} == {"icefall-system"}
    for binding in (doc for doc in docs if doc["kind"] == "ValidatingAdmissionPolicyBinding"):
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        assert selector == {"matchLabels": {"kubernetes.io/metadata.name": "icefall-system"}}
    container = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container, "the image's entry point (tini as PID 1) stays"
    assert container["args"][:2] == ["icefall", "operator"]
    assert "--namespace=icefall-system" in container["args"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ICEFALL_IMAGE"] == container["image"] == "ghcr.io/icefall-dev/icefall:0.1.0"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    # A hung operator is restarted after about a minute; a slow start is not mistaken for a hang.
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 15,
        "timeoutSeconds": 5,
        "failureThreshold": 4,
    }
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 300
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert only(docs, "Deployment")["spec"]["replicas"] == 1


def test_cluster_wide_render(home: Path) -> None:
    docs = render(home, "ops", *CLUSTER_WIDE)
    assert kinds(docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodMonitor",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        *ADMISSION,
    ]
    assert "namespace" not in only(docs, "ClusterRole")["metadata"]
    for binding in (doc for doc in docs if doc["kind"] == "ValidatingAdmissionPolicyBinding"):
        assert "matchResources" not in binding["spec"], "every namespace the operator watches"
    binding = only(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": "ops"}]
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args
    assert not any(arg.startswith("--namespace") for arg in args)
    monitor = only(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= only(docs, "Service")["metadata"]["labels"].items()
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set-string", "replicas=two"), "/replicas"),
        (("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy"),
        (("--set", "podSecurityContext.runAsUser=0"), "/podSecurityContext/runAsUser"),
        (("--set", "rbac.clusterwide=true"), "clusterwide"),
        (("--set", "spark.master=yarn"), "/spark/master"),
        (("--set", "spark.executorMemory=2GB"), "/spark/executorMemory"),
        (("--set", "hostNetwork=yes"), "/hostNetwork"),
        (("--set-json", 'pods={"driver":{"env":[{"name":"HOME","value":"/x"}]}}'), "/pods/driver/env/0/name"),
        (("--set", "hostNetworkPorts.first=80"), "/hostNetworkPorts/first"),
        (("--set-json", 'podPolicy.reservedEnv=["JAVA_*_OPTS"]'), "/podPolicy/reservedEnv/0"),
        (("--set-json", 'podPolicy.mountPaths=["/mnt/../opt"]'), "/podPolicy/mountPaths/0"),
        (("--set", "podPolicy.privileged=true"), "privileged"),
        (("--set", "health.livenessProbe.periodSeconds=0"), "/health/livenessProbe/periodSeconds"),
        (("--set", "health.readinessProbe.initialDelaySeconds=5"), "initialDelaySeconds"),
    ],
)
def test_schema_rejects_bad_values(home: Path, values: tuple[str, ...], message: str) -> None:
    result = helm("template", RELEASE, str(CHART), *values, home=home, check=False)
    assert result.returncode != 0
    assert "schema" in result.stderr and message in result.stderr, result.stderr


def test_probe_values_reach_the_deployment(home: Path) -> None:
    values = ("--set", "health.port=18080", "--set", "health.livenessProbe.periodSeconds=5")
    values += ("--set", "health.livenessProbe.failureThreshold=2")
    values += ("--set", "health.startupProbe.timeoutSeconds=3")
    container = only(render(home, "ops", *values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--liveness=http://0.0.0.0:18080/healthz" in container["args"]
    assert {"name": "health", "containerPort": 18080, "protocol": "TCP"} in container["ports"]
    liveness = container["livenessProbe"]
    assert (liveness["periodSeconds"], liveness["failureThreshold"]) == (5, 2)
    assert container["startupProbe"]["timeoutSeconds"] == 3


HOST = ("--set", "hostNetwork=true", "--set")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("--set", "metrics.port=8080"), "health.port and metrics.port are both 8080"),
        ((*HOST, "health.port=20000"), "health.port 20000 is inside hostNetworkPorts"),
        ((*HOST, "metrics.port=29999"), "metrics.port 29999 is inside hostNetworkPorts"),
    ],
)  # fmt: skip
def test_colliding_ports_are_refused(home: Path, values: tuple[str, ...], message: str) -> None:
    """The operator's two ports differ; on the node's network they stay out of the table pods' range."""
    result = helm("template", RELEASE, str(CHART), *values, home=home, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_ports_that_do_not_collide_are_accepted(home: Path) -> None:
    """Off the host network the operator's ports are its pod's own; a disabled metrics port is not served."""
    for values in (
        ("--set", "health.port=20000"),
        ("--set", "hostNetwork=true", "--set", "metrics.enabled=false", "--set", "metrics.port=20000"),
        ("--set", "metrics.enabled=false", "--set", "metrics.port=8080"),
        ("--set", "hostNetwork=true", "--set", "health.port=30000", "--set", "metrics.port=30001"),
    ):
        assert only(render(home, "ops", *values), "Deployment")


def test_spark_values_reach_the_operator_settings(home: Path) -> None:
    """What `spark.*` says is what the operator renders into every table's Spark configuration."""
    values = ("--set", "spark.master=kubernetes", "--set", "spark.executorMemory=3g")
    values += ("--set", "spark.minExecutors=1", "--set", "spark.maxExecutors=6")
    container = only(render(home, "ops", *values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
    assert set(SETTINGS_ENV.values()) <= env.keys(), "a setting the chart cannot set"
    settings = OperatorSettings.from_environ(env)
    assert (settings.spark_master, settings.executor_memory) == ("kubernetes", "3g")
    assert (settings.min_executors, settings.max_executors) == (1, 6)
    defaults = render(home, "ops")
    env = {var["name"]: var["value"] for var in only(defaults, "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["env"] if "value" in var}  # fmt: skip
    assert OperatorSettings.from_environ(env) == OperatorSettings(), "the chart's defaults are the operator's"


def test_network_policies_admit_only_the_monitoring_namespace_to_metrics(home: Path) -> None:
    """The operator's pod takes connections on its `metrics` port from `networkPolicy.metricsNamespace`
    only; the same values reach the operator, which renders each table's NetworkPolicy from them
    (tests/unit/test_plan_isolation.py). Enforcement needs a network plugin that implements
    NetworkPolicies: none runs here."""
    docs = render(home, "ops", "--set", "networkPolicy.metricsNamespace=prometheus")
    policy = only(docs, "NetworkPolicy")
    pod_labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prometheus"}}}],
            "ports": [{"protocol": "TCP", "port": "metrics"}],
        }
    ]
    container = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
    settings = OperatorSettings.from_environ(env)
    assert (settings.network_policy, settings.metrics_namespace) == (True, "prometheus")
    quiet = only(render(home, "ops", "--set", "metrics.enabled=false"), "NetworkPolicy")
    assert quiet["spec"]["ingress"] == []  # nothing to scrape: no one gets in
    off = render(home, "ops", "--set", "networkPolicy.enabled=false")
    assert "NetworkPolicy" not in kinds(off)
    env = {var["name"]: var["value"] for var in only(off, "Deployment")["spec"]["template"]["spec"][
        "containers"][0]["env"] if "value" in var}  # fmt: skip
    assert OperatorSettings.from_environ(env).network_policy is False
    refused = helm(
        "template", RELEASE, str(CHART), "--set", "networkPolicy.metricsNamespace=Not_One", home=home,
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "/networkPolicy/metricsNamespace" in refused.stderr, refused.stderr


def test_pod_templates_and_host_network_reach_the_operator(home: Path) -> None:
    pods = {
        "common": {"nodeSelector": {"pool": "data"}, "imagePullSecrets": [{"name": "registry"}]},
        "driver": {"hostNetwork": True, "resources": {"limits": {"memory": "4Gi"}}},
    }
    values = ("--set-json", f"pods={json.dumps(pods)}", "--set", "hostNetwork=true")
    values += ("--set", "hostNetworkPorts.first=30000", "--set", "hostNetworkPorts.last=30999")
    pod = only(render(home, "ops", *values), "Deployment")["spec"]["template"]["spec"]
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    env = {var["name"]: var["value"] for var in pod["containers"][0]["env"] if "value" in var}
    settings = OperatorSettings.from_environ(env)
    assert settings.pod_template == PodTemplates.model_validate(pods)
    assert settings.host_network_ports == (30000, 30999)
    default = only(render(home, "ops"), "Deployment")["spec"]["template"]["spec"]
    assert "hostNetwork" not in default and "dnsPolicy" not in default


def test_pod_policy_reaches_the_operator_and_the_admission_policies(home: Path) -> None:
    """`podPolicy` is what the operator checks (ICEFALL_POD_POLICY) and what the admission policy's CEL
    lists say; the defaults are the operator's; `admissionPolicies.enabled=false` ships none."""
    policy = {"hostNetwork": True, "secrets": ["shared-*"], "tolerations": ["dedicated"]}
    docs = render(home, "ops", "--set-json", f"podPolicy={json.dumps(policy)}")
    env = {
        e["name"]: e.get("value")
        for e in only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    config = Config.from_env(env)
    assert config.pod_policy == PodPolicy.model_validate({**VALUES_POD_POLICY, **policy})
    table_pods = next(d for d in docs if d["metadata"]["name"] == "icefall-ops-table-pods")["spec"]
    cel = {v["name"]: v["expression"] for v in table_pods["variables"]}
    assert (json.loads(cel["hostNetwork"]), json.loads(cel["secrets"])) == (True, ["shared-*"])
    assert json.loads(cel["reservedEnv"]) == list(PodPolicy().reserved_env)
    defaults = render(home, "ops")
    env = {
        e["name"]: e.get("value")
        for e in only(defaults, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert Config.from_env(env).pod_policy == PodPolicy(), "the chart's defaults are the operator's"
    off = render(home, "ops", "--set", "admissionPolicies.enabled=false")
    assert not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & set(kinds(off))


ROLE_ARN = "arn:aws:iam::123456789012:role/icefall"
GCP_ACCOUNT = "icefall@lake-project.iam.gserviceaccount.com"
AZURE_CLIENT = "11111111-2222-3333-4444-555555555555"
DRIVER_ROLE = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/driver"}


def test_cloud_identity_reaches_every_service_account_and_pod(home: Path) -> None:
    """Workload identity without static keys: one value per cloud annotates the operator's ServiceAccount
    and, through the operator's pod template, every table's driver and compaction ServiceAccount; AKS's
    label goes on the operator pod and on every table pod (executors too). Explicit annotations win."""
    values = (
        "--set", f"cloudIdentity.awsRoleArn={ROLE_ARN}",
        "--set", f"cloudIdentity.gcpServiceAccount={GCP_ACCOUNT}",
        "--set", f"cloudIdentity.azureClientId={AZURE_CLIENT}",
        "--set-json", f"pods={json.dumps({'driver': {'serviceAccountAnnotations': DRIVER_ROLE}})}",
    )  # fmt: skip
    docs = render(home, "ops", *values)
    wanted = {
        "eks.amazonaws.com/role-arn": ROLE_ARN,
        "iam.gke.io/gcp-service-account": GCP_ACCOUNT,
        "azure.workload.identity/client-id": AZURE_CLIENT,
    }
    assert only(docs, "ServiceAccount")["metadata"]["annotations"] == wanted
    pod = only(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    env = {var["name"]: var["value"] for var in pod["spec"]["containers"][0]["env"] if "value" in var}
    settings = OperatorSettings.from_environ(env)
    st = load_manifest(ROOT / "examples" / "orders.yaml")
    children = desired_children(
        st, namespace="ops", uid="u", generation=1, image="i", operator_settings=settings,
        compaction_replicas=1,
    )  # fmt: skip
    accounts = {m["metadata"]["name"]: m for m in children.applied if m["kind"] == "ServiceAccount"}
    driver_account = accounts.pop(driver_account_name(st.metadata.name))
    assert driver_account["metadata"]["annotations"].items() >= {**wanted, **DRIVER_ROLE}.items()
    (compaction_account,) = accounts.values()
    assert compaction_account["metadata"]["annotations"].items() >= wanted.items()
    assert children.driver_pod is not None
    compaction = next(m for m in children.applied if m["kind"] == "Deployment")["spec"]["template"]
    for table_pod in (children.driver_pod, compaction):
        assert table_pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    executor = effective("executor", base=PodTemplate(), chart=settings.pod_template, table=PodTemplates())
    assert executor.labels["azure.workload.identity/use"] == "true"
    # No identity set: nothing added anywhere.
    plain = render(home, "ops")
    assert "annotations" not in only(plain, "ServiceAccount")["metadata"]
    assert (
        "azure.workload.identity/use"
        not in only(plain, "Deployment")["spec"]["template"]["metadata"]["labels"]
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [("awsRoleArn", "icefall-role"), ("gcpServiceAccount", "icefall"), ("azureClientId", "not-a-guid")],
)
def test_cloud_identity_values_are_checked(home: Path, key: str, value: str) -> None:
    result = helm(
        "template", RELEASE, str(CHART), "--set", f"cloudIdentity.{key}={value}", home=home, check=False
    )
    assert result.returncode != 0
    assert f"/cloudIdentity/{key}" in result.stderr, result.stderr


def test_pod_monitor_selects_the_pods_the_operator_runs(home: Path) -> None:
    st = load_manifest(ROOT / "examples" / "orders.yaml")
    children = desired_children(
        st, namespace="ops", uid="u", generation=1, image="i", operator_settings=OperatorSettings(),
        compaction_replicas=1,
    )  # fmt: skip
    assert children.driver_pod is not None
    compaction = next(m for m in children.applied if m["kind"] == "Deployment")["spec"]["template"]
    for values, namespaces in ((CLUSTER_WIDE, {"any": True}), (("--set", "metrics.podMonitor.enabled=true"), {
        "matchNames": ["ops"]})):  # fmt: skip
        monitor = only(render(home, "ops", *values), "PodMonitor")["spec"]
        assert monitor["namespaceSelector"] == namespaces
        (endpoint,) = monitor["podMetricsEndpoints"]
        for pod in (children.driver_pod, compaction):
            assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
            ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
            assert endpoint["port"] in {p["name"] for p in ports}
    operator_pod = only(render(home, "ops"), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not monitor["selector"]["matchLabels"].items() <= operator_pod.items(), "the ServiceMonitor's job"


def test_dashboard_configmap_for_the_grafana_sidecar(home: Path) -> None:
    configmap = only(render(home, "ops"), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "ops"
    assert configmap["data"] == {"icefall.json": (CHART / "dashboards" / "icefall.json").read_text()}
    json.loads(configmap["data"]["icefall.json"])
    values = (
        "--set",
        "grafana.dashboards.label=team/dashboards",
        "--set-string",
        "grafana.dashboards.labelValue=yes",
    )
    values += ("--set", "grafana.dashboards.annotations.grafana_folder=Icefall")
    relabelled = only(render(home, "ops", *values), "ConfigMap")["metadata"]
    assert (
        relabelled["labels"]["team/dashboards"] == "yes" and "grafana_dashboard" not in relabelled["labels"]
    )
    assert relabelled["annotations"] == {"grafana_folder": "Icefall"}
    assert "ConfigMap" not in kinds(render(home, "ops", "--set", "grafana.dashboards.enabled=false"))


def test_chart_crd_is_the_generated_one() -> None:
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [CRD_FILE]
    chart_crd = (CHART / "crds" / CRD_FILE).read_bytes()
    assert chart_crd == (ROOT / "crds" / CRD_FILE).read_bytes(), "run `make chart-crds`"


def test_pods_are_restricted(home: Path) -> None:
    for values in ((), CLUSTER_WIDE):
        pod = only(render(home, "icefall-system", *values), "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["runAsNonRoot"] is True
            assert container["resources"]["requests"] and container["resources"]["limits"]
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        assert all("hostPath" not in volume for volume in pod["volumes"])


def _covers(held: list[dict[str, Any]], wanted: dict[str, Any]) -> bool:
    """Whether `held` grants everything `wanted` does (no wildcards are used on either side)."""
    for group in wanted["apiGroups"]:
        for resource in wanted["resources"]:
            for verb in wanted["verbs"]:
                if not any(
                    group in rule["apiGroups"]
                    and resource in rule["resources"]
                    and verb in rule["verbs"]
                    and (
                        not rule.get("resourceNames")
                        or set(wanted.get("resourceNames") or ["*"]) <= set(rule["resourceNames"])
                    )
                    for rule in held
                ):
                    return False
    return True


def _granted_rules() -> list[dict[str, Any]]:
    rules = []
    for example in ("orders.yaml", "customers.yaml"):  # an append and a keyed table (the yield Lease)
        st = load_manifest(ROOT / "examples" / example)
        rules += [
            *driver_rules(st, executors=True),
            *driver_rules(st, executors=False),
            *compaction_rules(st),
        ]
    return rules


@pytest.mark.parametrize(("values", "kind"), [((), "Role"), (CLUSTER_WIDE, "ClusterRole")])
def test_operator_holds_every_permission_it_grants(home: Path, values: tuple[str, ...], kind: str) -> None:
    rules = only(render(home, "icefall-system", *values), kind)["rules"]
    for wanted in _granted_rules():
        assert _covers(rules, wanted), f"the operator cannot grant {wanted}"
    for rule in rules:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
        # Secrets: create (each table's Spark RPC secret, icefall.plan.isolation) and get (a referenced
        # Secret's grant label, metadata only: icefall.plan.grants); no list, watch or write.
        if "secrets" in rule["resources"]:
            assert (rule["resources"], sorted(rule["verbs"])) == (["secrets"], ["create", "get"]), rule


def test_manifests_pass_server_side_dry_run_and_rbac_escalation_checks(
    kube: KubeAPIServer, home: Path
) -> None:
    namespace = "icefall-chart"
    kubectl("create", "namespace", namespace, kube=kube, home=home)
    for crd in MONITORING_CRDS:
        kubectl("apply", "--server-side", "-f", "-", kube=kube, home=home, stdin=json.dumps(crd))
        kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", kube=kube, home=home)
    for values in ((), CLUSTER_WIDE):
        docs = render(home, namespace, *values, crds=True)
        assert "CustomResourceDefinition" in kinds(docs)
        stream = yaml.safe_dump_all(docs)
        applied = kubectl(
            "apply", "--server-side", "--dry-run=server", "-f", "-", kube=kube, home=home, stdin=stream
        )
        for doc in docs:
            assert f"{doc['metadata']['name']} serverside-applied (server dry run)" in applied, doc["kind"]

    # The per-table children that are not pods, as the operator sends them: its NetworkPolicy (applied) and
    # its Spark RPC Secret (created with its value).
    children = desired_children(
        load_manifest(ROOT / "examples" / "orders.yaml"), namespace=namespace, uid="uid-orders",
        generation=1, image="icefall:test", operator_settings=OperatorSettings(),
    )  # fmt: skip
    for manifest in (children.get("NetworkPolicy", network_policy_name("orders")), *children.created):
        sent = with_secret_value(manifest) if manifest["kind"] == "Secret" else manifest
        applied = kubectl(
            "apply", "--server-side", "--dry-run=server", "-f", "-",
            kube=kube, home=home, stdin=json.dumps(sent),
        )  # fmt: skip
        assert "serverside-applied (server dry run)" in applied, manifest["kind"]

    # Install the namespaced operator's RBAC for real, then act as its ServiceAccount: the API server
    # refuses a Role granting what the creator lacks (no escalate), and a binding to it (no bind).
    docs = render(home, namespace)
    rbac = [doc for doc in docs if doc["kind"] in {"ServiceAccount", "Role", "RoleBinding"}]
    kubectl("apply", "--server-side", "-f", "-", kube=kube, home=home, stdin=yaml.safe_dump_all(rbac))
    account = f"system:serviceaccount:{namespace}:{only(docs, 'ServiceAccount')['metadata']['name']}"
    st = load_manifest(ROOT / "examples" / "orders.yaml")
    for name, rules in (
        (driver_account_name(st.metadata.name), driver_rules(st, executors=True)),
        (f"{st.metadata.name}-compaction-check", compaction_rules(st)),
    ):
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": rules,
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
        for obj in (role, binding):
            kubectl(
                "apply",
                "--server-side",
                f"--as={account}",
                "-f",
                "-",
                kube=kube,
                home=home,
                stdin=json.dumps(obj),
            )

    # And the check has teeth: a rule the operator does not hold is refused.
    beyond = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "beyond", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
    }
    refused = _run(
        str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl"),
        "apply",
        "--server-side",
        f"--as={account}",
        "-f",
        "-",
        home=home,
        kube=kube,
        stdin=json.dumps(beyond),
        check=False,
    )
    assert refused.returncode != 0 and "permissions not currently held" in refused.stderr, refused.stderr


def test_leader_election_allows_standby_replicas(home: Path) -> None:
    docs = render(home, "icefall-system", "--set", "replicas=3")
    deployment = only(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--leader-lease-seconds=15" in args
    alone = render(home, "icefall-system", "--set", "leaderElection.enabled=false")
    args = only(alone, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-leader-elect" in args
    refused = helm(
        "template", RELEASE, str(CHART), "--set", "leaderElection.enabled=false", "--set", "replicas=2",
        home=home, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "/replicas" in refused.stderr, refused.stderr


#: What the operator process itself calls (controller/, commit/kube_lease.py for its leader Lease, kopf's
#: watches, events and finalizer patches), beyond what it grants to drivers and compaction pods.
OPERATOR_CALLS: list[dict[str, Any]] = [
    {
        "apiGroups": ["icefall.dev"],
        "resources": ["streamingtables"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {"apiGroups": ["icefall.dev"], "resources": ["streamingtables/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # The leader Lease (get, create, update) and each table's Leases (server-side apply: create, patch).
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "update", "patch"],
    },
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch", "delete"]},
    # A referenced Secret's labels (metadata only: icefall.plan.grants), each table's Spark RPC secret,
    # and deletionPolicy Delete's Job.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create", "delete"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "list", "watch", "patch", "delete"],
    },
]


@pytest.mark.parametrize(("values", "kind"), [((), "Role"), (CLUSTER_WIDE, "ClusterRole")])
def test_operator_rbac_covers_its_own_calls(home: Path, values: tuple[str, ...], kind: str) -> None:
    rules = only(render(home, "icefall-system", *values), kind)["rules"]
    for wanted in OPERATOR_CALLS:
        assert _covers(rules, wanted), f"the operator's role lacks {wanted}"
    # It creates each table's Spark RPC Secret; it never lists or watches Secrets.
    secret_verbs = {verb for rule in rules if "secrets" in rule["resources"] for verb in rule["verbs"]}
    assert not secret_verbs & {"list", "watch", "update", "patch"}, secret_verbs
