"""The chart's ValidatingAdmissionPolicies (charts/icefall/templates/admission-policies.yaml) on a real
kube-apiserver with RBAC on, as `helm template` renders them.

Proves, for `<release>-<ns>-table-pods` (the chart's `podPolicy` at admission), acting as a user who holds
only `create streamingtables` in the namespace (`limited`):
- with the default policy, every attack of issue 41 through spec.pods is refused (hostPath, a
  persistentVolumeClaim, hostNetwork, a Secret the table does not reference, as a volume, a projected
  source or a variable, JAVA_TOOL_OPTIONS, PYSPARK_SUBMIT_ARGS, LD_PRELOAD, KUBERNETES_SERVICE_HOST, a
  mount over the image's code, an annotation, a ServiceAccount annotation (a cloud role), tolerations
  with and without a key, a node selector, node affinity, a priority class), and the refusal says, word
  for word, every problem the operator's own check (`plan.pod_policy.violations`) names;
- a table using what the default policy allows (a Secret its spec references, a ConfigMap under /mnt/,
  resources, labels, AWS_REGION) is admitted, and so is, under a wider policy of another release, each
  of the things that policy allows; the operator's check agrees on both; every Secret a spec references
  outside spec.pods (Kafka's five fields, the registry's two, the catalog's secretProperties) counts as
  its own, the same as for the operator;
- a table that broke the policy before it existed is not stuck: writes that leave its spec alone (the
  operator's annotations) are admitted, a spec change is refused; a namespace the release does not
  watch is not affected.
And for `<release>-<ns>-executors` (drivers confined to their executors), with a token of a driver's
ServiceAccount (TokenRequest) and the Role `plan.rbac.driver_rules` renders:
- it creates an executor pod as Spark builds it (the operator's executor template, with its table's own
  Spark RPC secret `icefall-<st>-spark-auth`, plus Spark's name, labels, image, argument and Secret of its
  own table), lists and deletes its own;
- it is refused a pod labelled or named for another table, with hostPath, the node's network,
  privilege, another image, a command, another ServiceAccount or an API token, or another table's
  Secret or Spark RPC secret; it cannot delete or patch a neighbour's pod or delete them by label, and
  cannot create PersistentVolumeClaims, Services or ConfigMaps (RBAC);
- the purge Job's pod (deletionPolicy Delete, under the driver's ServiceAccount) is not the driver's:
  created by the Job controller it is admitted, while the driver's own token may not create it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from icefall.api import streaming_table_from_object
from icefall.api.pod_policy import PodPolicy
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir
from icefall.plan.children import desired_children
from icefall.plan.names import spark_auth_secret_name
from icefall.plan.pod_policy import referenced_secrets, violations
from icefall.plan.purge import JOB_NAME_LABEL, purge_job
from icefall.plan.settings import OperatorSettings
from icefall.plan.spark_conf import EXECUTOR_TEMPLATE_KEY
from icefall.testing.kubeapi import JsonApi

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "icefall"
NAMESPACE = "vap-default"  # the release with the default podPolicy
WIDE = "vap-wide"  # a release whose podPolicy allows more
UNWATCHED = "vap-unwatched"  # no release: no policy
ST_PATH = "/apis/icefall.dev/v1alpha1/namespaces/{ns}/streamingtables"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
WIDE_POLICY: dict[str, Any] = {
    "hostNetwork": True,
    "volumeTypes": ["configMap", "secret", "emptyDir", "hostPath"],
    "mountPaths": ["/mnt/", "/data"],
    "secrets": ["shared-*"],
    "reservedEnv": ["LD_*"],
    "annotations": ["prometheus.io/*"],
    "serviceAccountAnnotations": ["eks.amazonaws.com/role-arn"],
    "tolerations": ["*"],
    "nodeSelector": ["pool"],
    "priorityClasses": ["data-high"],
}
Obj = dict[str, Any]


def table(name: str, pods: Obj | None = None, **metadata: Any) -> Obj:
    """A StreamingTable referencing the Secret `<name>-kafka` (its SASL password) and `<name>-user`."""
    spec: Obj = {
        "source": {
            "bootstrapServers": "kafka:9092",
            "topic": name,
            "security": {
                "protocol": "SASL_SSL",
                "saslMechanism": "PLAIN",
                "username": {"secretKeyRef": {"name": f"{name}-user", "key": "u"}},
                "password": {"secretKeyRef": {"name": f"{name}-kafka", "key": "p"}},
            },
        },
        "format": {"schema": [{"name": "id", "type": "long"}]},
        "table": {"name": name.replace("-", "_")},
    }
    if pods is not None:
        spec["pods"] = pods
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": name, **metadata},
        "spec": spec,
    }


def _tool(name: str, *args: str, kube: KubeAPIServer, stdin: str | None = None) -> str:
    env = {**os.environ, "HOME": str(kube.workdir), "KUBECONFIG": str(kube.kubeconfig)}
    binary = tool_dir("ICEFALL_HELM_BIN" if name == "helm" else "ICEFALL_KUBE_BIN") / name
    done = subprocess.run(
        [str(binary), *args], input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, f"{name} {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def render_policies(kube: KubeAPIServer, namespace: str, *values: str) -> list[Obj]:
    out = _tool(
        "helm", "template", "icefall", str(CHART), "--namespace", namespace, *values,
        "--show-only", "templates/admission-policies.yaml", kube=kube,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refusal(call: Any) -> str:
    """The message of the refusal `call()` must raise (403 from an admission policy or RBAC)."""
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status in (403, 422), refused.value
    return str(json.loads(refused.value.body)["message"])


def as_client(kube: KubeAPIServer, *, token: str | None = None) -> JsonApi:
    """The API as the admin, or as the owner of `token`."""
    if token is None:
        return JsonApi(config.new_client_from_config(config_file=str(kube.kubeconfig)))
    path = kube.write_kubeconfig(
        kube.workdir / f"kubeconfig-{hashlib.sha256(token.encode()).hexdigest()[:8]}", token, "someone"
    )
    return JsonApi(config.new_client_from_config(config_file=str(path)))


def wait_until_refused(call: Any, timeout: float = 20) -> None:
    """Admission policies take effect a moment after they are created: until `call()` is refused."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            call()
        except ApiException as error:
            if error.status in (403, 422) and "ValidatingAdmissionPolicy" in str(error.body):
                return
            raise
        assert time.monotonic() < deadline, "the admission policy never took effect"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def admin(kube: KubeAPIServer) -> Iterator[JsonApi]:
    """The CRD, the namespaces, a table that broke the policy before there was one, the `limited` user's
    Role (create streamingtables only), then the two releases' policies in effect; all removed after."""
    _tool("kubectl", "apply", "--server-side", "-f", str(ROOT / "crds"), kube=kube)
    _tool("kubectl", "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", kube=kube)
    api = as_client(kube)
    for namespace in (NAMESPACE, WIDE, UNWATCHED):
        api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    api.call("POST", ST_PATH.format(ns=NAMESPACE), table("legacy", {"driver": {"hostNetwork": True}}))
    role = {"apiGroups": ["icefall.dev"], "resources": ["streamingtables"], "verbs": ["create"]}
    for namespace in (NAMESPACE, WIDE):
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        api.call("POST", f"{rbac}/roles", {"metadata": {"name": "tables"}, "rules": [role]})
        api.call("POST", f"{rbac}/rolebindings", {
            "metadata": {"name": "tables"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tables"},
            "subjects": [{"kind": "User", "name": "limited", "apiGroup": "rbac.authorization.k8s.io"}],
        })  # fmt: skip
    docs = render_policies(kube, NAMESPACE)
    docs += render_policies(kube, WIDE, "--set-json", f"podPolicy={json.dumps(WIDE_POLICY)}")
    _tool("kubectl", "apply", "--server-side", "-f", "-", kube=kube, stdin=yaml.safe_dump_all(docs))
    bad = table("probe", {"driver": {"env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}})
    for namespace in (NAMESPACE, WIDE):
        wait_until_refused(lambda ns=namespace: create_table(api, ns, bad))
    try:
        yield api
    finally:
        for doc in docs:
            path = POLICIES if doc["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
            api.call("DELETE", f"{path}/{doc['metadata']['name']}")


def create_table(api: JsonApi, namespace: str, body: Obj, *, dry_run: bool = True) -> Obj:
    query = [("dryRun", "All")] if dry_run else []
    created: Obj = api.call("POST", ST_PATH.format(ns=namespace), body, query=query)
    return created


@pytest.fixture(scope="module")
def limited(kube: KubeAPIServer, admin: JsonApi) -> JsonApi:
    return as_client(kube, token=kube.user_tokens["limited"])


# --- spec.pods: the pod policy ----------------------------------------------------------------------------

SECRET = {"secretKeyRef": {"name": "other-app", "key": "token"}}
CODE = {"name": "code", "configMap": {"name": "evil"}}
OVER_CODE = [
    {"name": "code", "mountPath": "/opt/icefall/lib", "subPath": "x"},
    {"name": "code", "mountPath": "/mnt/../etc/ld.so.preload"},
]
HOSTNAME = "kubernetes.io/hostname"
TERMS = [{"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": ["control-plane"]}]}]
AFFINITY = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": TERMS}}
TOLERATIONS = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}, {"operator": "Exists"}]
PROJECTED = {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "other-app"}}]}
ROLE = {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/admin"}


def env(*pairs: tuple[str, str]) -> list[Obj]:
    return [{"name": name, "value": value} for name, value in pairs]


ATTACKS: dict[str, Obj] = {
    "hostPath": {
        "driver": {
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "volumeMounts": [{"name": "root", "mountPath": "/mnt/root"}],
        }
    },
    "pvc": {"compaction": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "db"}}]}},
    "hostNetwork": {"executor": {"hostNetwork": True}},
    "secret-volume": {"common": {"volumes": [{"name": "s", "secret": {"secretName": "other-app"}}]}},
    "projected-secret": {"driver": {"volumes": [{"name": "p", "projected": PROJECTED}]}},
    "secret-env": {"driver": {"env": [{"name": "TOKEN", "valueFrom": SECRET}]}},
    "reserved-env": {
        "driver": {
            "env": env(
                ("AWS_REGION", "eu-west-1"),
                ("JAVA_TOOL_OPTIONS", "-javaagent:/mnt/a.jar"),
                ("PYSPARK_SUBMIT_ARGS", "--jars x"),
            )
        },
        "executor": {
            "env": env(("LD_PRELOAD", "/mnt/x.so"), ("KUBERNETES_SERVICE_HOST", "attacker.example"))
        },
    },
    "mount-over-code": {"driver": {"volumes": [CODE], "volumeMounts": OVER_CODE}},
    "annotations": {
        "common": {"annotations": {"sidecar.istio.io/inject": "false"}, "serviceAccountAnnotations": ROLE}
    },
    "scheduling": {
        "compaction": {
            "tolerations": TOLERATIONS,
            "nodeSelector": {HOSTNAME: "control-plane"},
            "affinity": {"nodeAffinity": AFFINITY},
            "priorityClassName": "system-node-critical",
        }
    },
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_default_policy_refuses_each_attack_with_the_operators_words(
    limited: JsonApi, attack: str
) -> None:
    body = table(f"attack-{attack.lower()}", ATTACKS[attack])
    problems = violations(PodPolicy(), streaming_table_from_object(body))
    assert problems, "the operator's own check must refuse it too"
    message = refusal(lambda: create_table(limited, NAMESPACE, body))
    assert "spec.pods breaks the operator's pod policy" in message, message
    for problem in problems:
        assert str(problem) in message, f"{problem}\nnot in\n{message}"


def test_what_the_default_policy_allows_is_admitted(limited: JsonApi) -> None:
    pods = {
        "common": {
            "labels": {"team": "payments"},
            "resources": {"requests": {"cpu": "500m"}},
            "env": [
                {"name": "AWS_REGION", "value": "eu-west-1"},
                {"name": "KAFKA_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "ok-kafka", "key": "p"}}},
            ],
            "volumes": [
                {"name": "ca", "secret": {"secretName": "ok-user"}},
                {"name": "conf", "configMap": {"name": "settings"}},
                {"name": "scratch", "emptyDir": {}},
            ],
            "volumeMounts": [{"name": "ca", "mountPath": "/mnt/ca"}, {"name": "conf", "mountPath": "/mnt"}],
        }
    }
    body = table("ok", pods)
    assert violations(PodPolicy(), streaming_table_from_object(body)) == []
    assert create_table(limited, NAMESPACE, body)["metadata"]["name"] == "ok"


def test_every_secret_the_spec_references_elsewhere_may_be_used(limited: JsonApi) -> None:
    """The admission policy's list of the spec's Secret references is the operator's (`secret_env_vars`):
    Kafka's five, the registry's two, the catalog's secretProperties."""
    body = table("all-refs")
    spec = body["spec"]
    for field in ("caCert", "clientCert", "clientKey"):
        spec["source"]["security"][field] = {"secretKeyRef": {"name": f"s-{field.lower()}", "key": "k"}}
    refs = {"username": {"secretKeyRef": {"name": "r-user", "key": "k"}}}
    refs["password"] = {"secretKeyRef": {"name": "r-pass", "key": "k"}}
    spec["format"] = {"type": "avro", "registry": {"url": "http://registry:8081", **refs}}
    token = {"token": {"secretKeyRef": {"name": "c-token", "key": "k"}}}
    spec["table"]["catalog"] = {
        "name": "lake",
        "type": "rest",
        "uri": "http://rest:8181",
        "secretProperties": token,
    }
    names = sorted(referenced_secrets(streaming_table_from_object(body)))
    assert len(names) == 8
    spec["pods"] = {
        "driver": {"volumes": [{"name": f"v{i}", "secret": {"secretName": n}} for i, n in enumerate(names)]}
    }
    assert violations(PodPolicy(), streaming_table_from_object(body)) == []
    create_table(limited, NAMESPACE, body)
    spec["pods"]["driver"]["volumes"].append({"name": "other", "secret": {"secretName": "unrelated"}})
    assert "Secret unrelated is neither referenced" in refusal(lambda: create_table(limited, NAMESPACE, body))


def test_a_wider_policy_admits_what_it_lists_and_only_that(limited: JsonApi) -> None:
    allowed = {
        "driver": {
            "hostNetwork": True,
            "annotations": {"prometheus.io/scrape": "true"},
            "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/orders"},
            "tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"pool": "data"},
            "priorityClassName": "data-high",
            "env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-Xss4m"}],
            "volumes": [
                {"name": "host", "hostPath": {"path": "/var/data"}},
                {"name": "shared", "secret": {"secretName": "shared-ca"}},
            ],
            "volumeMounts": [
                {"name": "host", "mountPath": "/data"},
                {"name": "shared", "mountPath": "/mnt/s"},
            ],
        }
    }
    policy = PodPolicy.model_validate(WIDE_POLICY)
    body = table("wide", allowed)
    assert violations(policy, streaming_table_from_object(body)) == []
    create_table(limited, WIDE, body)
    beyond = table("beyond", {"driver": {"env": [{"name": "LD_PRELOAD", "value": "/x"}],
                                         "nodeSelector": {"zone": "a"}}})  # fmt: skip
    problems = violations(policy, streaming_table_from_object(beyond))
    assert [p.path for p in problems] == [
        "spec.pods.driver.env[0].name",
        "spec.pods.driver.nodeSelector[zone]",
    ]
    message = refusal(lambda: create_table(limited, WIDE, beyond))
    assert all(str(problem) in message for problem in problems), message


def test_a_table_from_before_the_policy_is_not_stuck(admin: JsonApi) -> None:
    path = f"{ST_PATH.format(ns=NAMESPACE)}/legacy"
    merge = "application/merge-patch+json"
    # The operator's own writes (annotations, finalizers) leave the spec alone: admitted.
    admin.call(
        "PATCH", path, {"metadata": {"annotations": {"icefall.dev/driver-history": "{}"}}}, content_type=merge
    )
    message = refusal(lambda: admin.call("PATCH", path, {"spec": {"suspend": True}}, content_type=merge))
    assert "spec.pods.driver.hostNetwork: host networking is not allowed" in message, message
    # A namespace no release watches has no policy.
    create_table(admin, UNWATCHED, table("free", {"driver": {"hostNetwork": True}}))


# --- drivers confined to their executors ------------------------------------------------------------------


class Drivers:
    """Tables `orders` and `clicks` of one namespace with their accounts and Roles as the operator renders
    them (Spark on Kubernetes), and executor pods as Spark builds them for a table."""

    def __init__(self, kube: KubeAPIServer, admin: JsonApi, namespace: str, image: str) -> None:
        self.kube, self.admin, self.namespace, self.image = kube, admin, namespace, image
        self.children: dict[str, Any] = {}
        self.tokens: dict[str, str] = {}
        for name in ("orders", "clicks"):
            body = table(name)
            admin.call("POST", ST_PATH.format(ns=namespace), body)
            children = desired_children(
                streaming_table_from_object(body), namespace=namespace, uid=f"uid-{name}", generation=1,
                image=image, operator_settings=OperatorSettings(),
            )  # fmt: skip
            for manifest in children.applied:
                if manifest["kind"] in {"ServiceAccount", "Role", "RoleBinding"}:
                    kind = manifest["kind"].lower() + "s"
                    group = "/api/v1" if kind == "serviceaccounts" else "/apis/rbac.authorization.k8s.io/v1"
                    admin.call("POST", f"{group}/namespaces/{namespace}/{kind}", manifest)
            self.children[name] = children

    def driver(self, name: str) -> JsonApi:
        """The API as the driver pod of table `name`: a token of its ServiceAccount (TokenRequest), as the
        kubelet would project into the pod."""
        if name not in self.tokens:
            path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/icefall-{name}-driver/token"
            request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
            self.tokens[name] = self.admin.call("POST", path, request)["status"]["token"]
        return as_client(self.kube, token=self.tokens[name])

    def executor(self, name: str, number: int = 1) -> Obj:
        """Executor pod `number` of table `name` as Spark creates it: the operator's executor pod template,
        the executor labels of the driver's Spark conf, Spark's own labels, name, image and argument."""
        children = self.children[name]
        configmap = children.get("ConfigMap", f"{name}-ingest-executor")
        pod: Obj = json.loads(configmap["data"][EXECUTOR_TEMPLATE_KEY])
        env = {e["name"]: e.get("value") for e in children.driver_pod["spec"]["containers"][0]["env"]}
        conf = json.loads(env["ICEFALL_SPARK_CONF"])
        prefix = "spark.kubernetes.executor.label."
        labels = {key[len(prefix) :]: value for key, value in conf.items() if key.startswith(prefix)}
        labels |= {"spark-role": "executor", "spark-app-selector": "spark-0123", "spark-exec-id": str(number)}
        pod["metadata"] = {
            "name": f"{conf['spark.kubernetes.executor.podNamePrefix']}-exec-{number}",
            "labels": labels,
        }
        pod["spec"]["serviceAccountName"] = conf["spark.kubernetes.authenticate.executor.serviceAccountName"]
        container = pod["spec"]["containers"][0]
        container |= {"image": conf["spark.kubernetes.container.image"], "args": ["executor"]}
        container["env"] = [{"name": "SPARK_EXECUTOR_ID", "value": str(number)}]
        return pod

    def create(self, api: JsonApi, pod: Obj, *, dry_run: bool = True) -> Obj:
        query = [("dryRun", "All")] if dry_run else []
        created: Obj = api.call("POST", f"/api/v1/namespaces/{self.namespace}/pods", pod, query=query)
        return created


def chart_image(kube: KubeAPIServer, *values: str) -> str:
    out = _tool(
        "helm",
        "template",
        "icefall",
        str(CHART),
        *values,
        "--show-only",
        "templates/deployment.yaml",
        kube=kube,
    )
    env = yaml.safe_load(out)["spec"]["template"]["spec"]["containers"][0]["env"]
    return str(next(e["value"] for e in env if e["name"] == "ICEFALL_IMAGE"))


def admitted_drivers(kube: KubeAPIServer, admin: JsonApi, namespace: str) -> Drivers:
    found = Drivers(kube, admin, namespace, chart_image(kube))
    own = found.executor("orders")
    deadline = time.monotonic() + 20
    while True:  # the policy sees the new StreamingTables (its params) a moment after they are created
        try:
            found.create(found.driver("orders"), own)
            return found
        except ApiException:
            assert time.monotonic() < deadline, "the driver's own executor was never admitted"
            time.sleep(0.3)


@pytest.fixture(scope="module")
def drivers(kube: KubeAPIServer, admin: JsonApi) -> Drivers:
    return admitted_drivers(kube, admin, NAMESPACE)


def changed(pod: Obj, **spec: Any) -> Obj:
    """`pod` with `spec` fields set (a container's: `container={...}`; `volumes` are added)."""
    pod = copy.deepcopy(pod)
    container = spec.pop("container", {})
    pod["spec"]["volumes"] += spec.pop("volumes", [])
    pod["spec"] |= spec
    pod["spec"]["containers"][0] |= container
    return pod


def foreign(drivers: Drivers) -> Obj:
    """Executor 1 of `clicks`, as the `orders` driver would have to forge it."""
    return drivers.executor("clicks")


def renamed(pod: Obj, name: str) -> Obj:
    return {**pod, "metadata": {**pod["metadata"], "name": name}}


def with_volume(pod: Obj, volume: Obj) -> Obj:
    return changed(pod, volumes=[volume])


ROOT_VOLUME = {"name": "root", "hostPath": {"path": "/"}}
CLICKS_SECRET = {"name": "s", "secret": {"secretName": "clicks-kafka"}}
CLICKS_AUTH = {"name": "a", "secret": {"secretName": "icefall-clicks-spark-auth"}}
REFUSED_PODS: dict[str, tuple[Any, str]] = {
    "another table's labels": (foreign, "may create only its own executor pods"),
    "another table's name": (
        lambda d: renamed(d.executor("orders"), "clicks-ingest-exec-9"),
        "named orders-ingest-exec-*",
    ),
    "hostPath": (lambda d: with_volume(d.executor("orders"), ROOT_VOLUME), "not hostPath"),
    "host network": (lambda d: changed(d.executor("orders"), hostNetwork=True), "namespaces (hostNetwork"),
    "hostPID": (lambda d: changed(d.executor("orders"), hostPID=True), "hostPID"),
    "privileged": (
        lambda d: changed(d.executor("orders"), container={"securityContext": {"privileged": True}}),
        "privilege",
    ),
    "another image": (
        lambda d: changed(d.executor("orders"), container={"image": "attacker/tools:latest"}),
        "only from the image ghcr.io/icefall-dev/icefall:",
    ),
    "a command": (
        lambda d: changed(d.executor("orders"), container={"command": ["sh", "-c", "cat /mnt/s/*"]}),
        "no command",
    ),
    "another account": (
        lambda d: changed(d.executor("orders"), serviceAccountName="icefall-clicks-driver"),
        "only as icefall-orders-driver",
    ),
    "an API token": (
        lambda d: changed(d.executor("orders"), automountServiceAccountToken=True),
        "without an API token",
    ),
    "another table's Secret": (
        lambda d: with_volume(d.executor("orders"), CLICKS_SECRET),
        "Secrets its StreamingTable references (or podPolicy.secrets allows) and its own "
        "icefall-orders-spark-auth, not clicks-kafka",
    ),
    "another table's Spark RPC secret": (
        lambda d: with_volume(d.executor("orders"), CLICKS_AUTH),
        "and its own icefall-orders-spark-auth, not icefall-clicks-spark-auth",
    ),
    "another table's Secret as a variable": (
        lambda d: changed(
            d.executor("orders"), container={"envFrom": [{"secretRef": {"name": "clicks-user"}}]}
        ),
        "not clicks-user",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_PODS))
def test_a_driver_creates_only_its_own_executors(drivers: Drivers, case: str) -> None:
    build, expected = REFUSED_PODS[case]
    message = refusal(lambda: drivers.create(drivers.driver("orders"), build(drivers)))
    assert "icefall-vap-default-executors" in message and expected in message, message


def test_a_driver_runs_and_removes_its_own_executors_and_nothing_else(drivers: Drivers) -> None:
    orders, admin = drivers.driver("orders"), drivers.admin
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    with_secret = changed(
        drivers.executor("orders", 2), volumes=[{"name": "s", "secret": {"secretName": "orders-kafka"}}]
    )
    # As Spark builds it, the executor mounts its table's Spark RPC secret, which no spec references.
    mounted = [v["secret"]["secretName"] for v in with_secret["spec"]["volumes"] if "secret" in v]
    assert mounted == [spark_auth_secret_name("orders"), "orders-kafka"]
    drivers.create(orders, with_secret, dry_run=False)
    drivers.create(admin, drivers.executor("clicks", 3), dry_run=False)
    assert {p["metadata"]["name"] for p in orders.call("GET", pods)["items"]} >= {
        "orders-ingest-exec-2",
        "clicks-ingest-exec-3",
    }
    neighbour = f"{pods}/clicks-ingest-exec-3"
    assert "may change or delete only its own executor pods" in refusal(
        lambda: orders.call("DELETE", neighbour)
    )
    assert "may change or delete only its own" in refusal(
        lambda: orders.call("DELETE", pods, query=[("labelSelector", "icefall.dev/streamingtable=clicks")])
    )
    patch = {"metadata": {"labels": {"hacked": "yes"}}}
    assert "cannot patch resource" in refusal(
        lambda: orders.call("PATCH", neighbour, patch, content_type="application/merge-patch+json")
    )
    orders.call("DELETE", pods, query=[("labelSelector", "icefall.dev/streamingtable=orders")])
    assert admin.get(f"{pods}/orders-ingest-exec-2") is None or admin.get(f"{pods}/orders-ingest-exec-2")[
        "metadata"].get("deletionTimestamp")  # fmt: skip
    assert admin.get(neighbour) is not None
    for kind, body in (
        ("persistentvolumeclaims", {"metadata": {"name": "x"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        ("services", {"metadata": {"name": "x"}, "spec": {"ports": [{"port": 80}]}}),
        ("configmaps", {"metadata": {"name": "x"}, "data": {}}),
    ):  # fmt: skip
        path = f"/api/v1/namespaces/{NAMESPACE}/{kind}"
        assert f'cannot create resource "{kind}"' in refusal(lambda p=path, b=body: orders.call("POST", p, b))


def test_what_the_pod_policy_allows_a_table_its_executors_may_have(
    kube: KubeAPIServer, admin: JsonApi
) -> None:
    """The wider release's podPolicy allows the node's network, hostPath and the Secrets shared-*: so may
    the executor pods of its namespace's drivers (what spec.pods.executor could have given them)."""
    wide = admitted_drivers(kube, admin, WIDE)
    volumes = [
        {"name": "host", "hostPath": {"path": "/var/data"}},
        {"name": "s", "secret": {"secretName": "shared-ca"}},
    ]
    pod = changed(wide.executor("orders"), hostNetwork=True, volumes=volumes)
    assert wide.create(wide.driver("orders"), pod)["metadata"]["name"] == "orders-ingest-exec-1"
    other = changed(
        wide.executor("orders"), volumes=[{"name": "s", "secret": {"secretName": "clicks-kafka"}}]
    )
    assert "not clicks-kafka" in refusal(lambda: wide.create(wide.driver("orders"), other))


def test_the_purge_jobs_pod_is_the_job_controllers_not_a_drivers(drivers: Drivers) -> None:
    """deletionPolicy Delete's purge Job runs under the driver's ServiceAccount, but Kubernetes' Job
    controller creates its pod: the executors policy leaves it alone, so the pod the operator's Job
    renders is admitted from the Job controller's identity, and refused from the driver's own token."""
    st = streaming_table_from_object(table("orders"))
    job = purge_job(
        st, namespace=NAMESPACE, uid="uid-orders", image=drivers.image, settings=OperatorSettings(),
        table_uuid="u-1", dead_letter_table_uuid=None, active_seconds=600,
    )  # fmt: skip
    template = job["spec"]["template"]
    labels = {**template["metadata"]["labels"], JOB_NAME_LABEL: job["metadata"]["name"]}
    pod = {"metadata": {"name": "orders-purge-x1", "labels": labels}, "spec": template["spec"]}
    assert pod["spec"]["serviceAccountName"] == "icefall-orders-driver"
    accounts = "/api/v1/namespaces/kube-system/serviceaccounts"
    if drivers.admin.get(f"{accounts}/job-controller") is None:  # RBAC's bootstrap policy binds its role
        drivers.admin.call("POST", accounts, {"metadata": {"name": "job-controller"}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    token = drivers.admin.call("POST", f"{accounts}/job-controller/token", request)["status"]["token"]
    job_controller = as_client(drivers.kube, token=token)
    assert drivers.create(job_controller, pod)["metadata"]["name"] == "orders-purge-x1"
    message = refusal(lambda: drivers.create(drivers.driver("orders"), pod))
    assert "icefall-vap-default-executors" in message and "may create only its own executor pods" in message
