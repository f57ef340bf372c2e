"""The pod policy (`api.pod_policy`, `plan.pod_policy`): what a StreamingTable's spec.pods may use.

Proves: the default policy refuses each thing of issue 41's list (hostPath and other volume types,
hostNetwork, a Secret the table does not reference elsewhere as a volume, projected source, CSI secret or
variable, every reserved variable, a mount outside /mnt/ or climbing out of it, annotations,
ServiceAccount annotations, tolerations with and without a key, node selectors, node affinity keys,
priority classes) with the field and the fix, in every part (common, driver, executor, compaction);
it allows a spec.pods without any of those and the Secrets the spec references; a policy that lists
something allows it (patterns by prefix); privilege, capabilities, hostPID and hostIPC cannot be written
in spec.pods at all; the policy parses from ICEFALL_POD_POLICY and names a wrong field; the operator's
Config reads it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from icefall.api import ConditionReason, ManifestError, StreamingTable, streaming_table_from_object
from icefall.api.pod_policy import DEFAULT_RESERVED_ENV, PodPolicy, first_match, pod_policy_from_json, under
from icefall.controller.reconcile import POD_POLICY_ENV, Config
from icefall.plan.pod_policy import policy_issue, referenced_secrets, violations

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {
    "apiVersion": "icefall.dev/v1alpha1",
    "kind": "StreamingTable",
    "metadata": {"name": "orders", "namespace": "shop"},
    "spec": {
        "source": {
            "bootstrapServers": "kafka:9092",
            "topic": "orders",
            "security": {
                "protocol": "SASL_SSL",
                "saslMechanism": "PLAIN",
                "username": {"secretKeyRef": {"name": "kafka-user", "key": "u"}},
                "password": {"secretKeyRef": {"name": "kafka-password", "key": "p"}},
            },
        },
        "format": {"schema": [{"name": "id", "type": "long"}]},
        "table": {
            "catalog": {
                "name": "lake",
                "type": "rest",
                "uri": "http://rest:8181",
                "secretProperties": {"token": {"secretKeyRef": {"name": "catalog", "key": "t"}}},
            }
        },
    },
}


def table(pods: dict[str, Any]) -> StreamingTable:
    body = copy.deepcopy(BASE)
    body["spec"]["pods"] = pods
    return streaming_table_from_object(body)


def refused(pods: dict[str, Any], policy: PodPolicy | None = None) -> dict[str, str]:
    return {p.path: p.message for p in violations(policy or PodPolicy(), table(pods))}


def test_a_table_without_spec_pods_and_with_harmless_ones_passes_the_default_policy() -> None:
    assert refused({}) == {}
    harmless = {
        "common": {
            "labels": {"team": "payments"},
            "imagePullSecrets": [{"name": "registry"}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "4Gi"}},
            "env": [
                {"name": "AWS_REGION", "value": "eu-west-1"},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "kafka-password", "key": "p"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "volumes": [
                {"name": "ca", "secret": {"secretName": "kafka-user"}},
                {"name": "conf", "configMap": {"name": "settings"}},
                {"name": "both", "projected": {"sources": [{"secret": {"name": "catalog"}}]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "info", "downwardAPI": {"items": []}},
            ],
            "volumeMounts": [{"name": "ca", "mountPath": "/mnt/ca"}, {"name": "conf", "mountPath": "/mnt"}],
        },
        "driver": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
    }
    assert refused(harmless) == {}
    assert referenced_secrets(table({})) == {"kafka-user", "kafka-password", "catalog"}


@pytest.mark.parametrize("part", ["common", "driver", "executor", "compaction"])
def test_host_network_and_host_volumes_are_refused_in_every_part(part: str) -> None:
    pods = {
        part: {
            "hostNetwork": True,
            "volumes": [
                {"name": "root", "hostPath": {"path": "/"}},
                {"name": "db", "persistentVolumeClaim": {}},
            ],
        }
    }
    assert refused(pods) == {
        f"spec.pods.{part}.hostNetwork": "host networking is not allowed by the pod policy "
        "(podPolicy.hostNetwork); remove it",
        f"spec.pods.{part}.volumes[0]": "volume type hostPath is not allowed by the pod policy "
        "(podPolicy.volumeTypes: configMap, downwardAPI, emptyDir, projected, secret); use another",
        f"spec.pods.{part}.volumes[1]": "volume type persistentVolumeClaim is not allowed by the pod policy "
        "(podPolicy.volumeTypes: configMap, downwardAPI, emptyDir, projected, secret); use another",
    }


def test_secrets_the_table_does_not_reference_are_refused_wherever_named() -> None:
    pods = {
        "driver": {
            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "payroll", "key": "k"}}}],
            "volumes": [
                {"name": "a", "secret": {"secretName": "payroll"}},
                {
                    "name": "b",
                    "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "hr"}}]},
                },
                {"name": "c", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "vault"}}},
            ],
        }
    }
    found = refused(pods, PodPolicy(volume_types=("secret", "projected", "csi")))
    assert set(found) == {
        "spec.pods.driver.env[0].valueFrom.secretKeyRef.name",
        "spec.pods.driver.volumes[0].secret.secretName",
        "spec.pods.driver.volumes[1].projected.sources[1].secret.name",
        "spec.pods.driver.volumes[2].csi.nodePublishSecretRef.name",
    }
    assert found["spec.pods.driver.volumes[0].secret.secretName"].startswith(
        "Secret payroll is neither referenced elsewhere in this StreamingTable's spec (spec.source, "
    )
    assert refused(pods, PodPolicy(volume_types=("*",), secrets=("payroll", "hr", "vau*"))) == {}


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("JAVA_TOOL_OPTIONS", "JAVA_*"),
        ("_JAVA_OPTIONS", "_JAVA_OPTIONS"),
        ("JDK_JAVA_OPTIONS", "JDK_JAVA_OPTIONS"),
        ("CLASSPATH", "CLASSPATH"),
        ("PATH", "PATH"),
        ("PYSPARK_SUBMIT_ARGS", "PYSPARK_*"),
        ("SPARK_DIST_CLASSPATH", "SPARK_*"),
        ("LD_PRELOAD", "LD_*"),
        ("PYTHONPATH", "PYTHON*"),
        ("PYTHONSTARTUP", "PYTHON*"),
        ("ICEFALL_FAILPOINTS", "ICEFALL_*"),
        ("KUBERNETES_SERVICE_HOST", "KUBERNETES_*"),
        ("HADOOP_CONF_DIR", "HADOOP_*"),
        ("GLIBC_TUNABLES", "GLIBC_TUNABLES"),
    ],
)
def test_reserved_variables_are_refused(name: str, pattern: str) -> None:
    found = refused({"executor": {"env": [{"name": "OK", "value": "1"}, {"name": name, "value": "x"}]}})
    assert found == {
        "spec.pods.executor.env[1].name": f"{name} is reserved by the pod policy (podPolicy.reservedEnv: "
        f"{pattern}); remove it"
    }


@pytest.mark.parametrize(
    "path", ["/opt/icefall/lib", "/etc/ld.so.preload", "/mnt/../opt", "/mntx", "/usr/lib/x.so"]
)
def test_mounts_outside_the_allowed_folders_are_refused(path: str) -> None:
    pods = {
        "driver": {
            "volumes": [{"name": "code", "configMap": {"name": "evil"}}],
            "volumeMounts": [{"name": "code", "mountPath": path}],
        }
    }
    assert refused(pods) == {
        "spec.pods.driver.volumeMounts[0].mountPath": f"{path} is outside the folders the pod policy allows "
        "(podPolicy.mountPaths: /mnt/); mount under one"
    }
    # Anywhere allowed: still never a `..` step.
    assert bool(refused(pods, PodPolicy(mount_paths=("/",)))) == (".." in path)


def test_annotations_tolerations_node_labels_and_priority_are_allow_listed() -> None:
    affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}
        ],
    }
    pods = {
        "compaction": {
            "annotations": {"prometheus.io/scrape": "true"},
            "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/admin"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}, {"operator": "Exists"}],
            "nodeSelector": {"pool": "data"},
            "affinity": {"nodeAffinity": affinity},
            "priorityClassName": "system-node-critical",
        }
    }
    found = refused(pods)
    at = "spec.pods.compaction"
    assert found == {
        f"{at}.annotations[prometheus.io/scrape]": "annotation prometheus.io/scrape is not allowed by "
        "the pod policy (podPolicy.annotations); remove it",
        f"{at}.serviceAccountAnnotations[eks.amazonaws.com/role-arn]": "ServiceAccount annotation "
        "eks.amazonaws.com/role-arn is not allowed by the pod policy (podPolicy.serviceAccountAnnotations); "
        "remove it",
        f"{at}.tolerations[0]": "a toleration of dedicated is not allowed by the pod policy "
        "(podPolicy.tolerations); remove it",
        f"{at}.tolerations[1]": "a toleration of every taint is not allowed by the pod policy "
        "(podPolicy.tolerations); remove it",
        f"{at}.nodeSelector[pool]": "node label pool is not allowed by the pod policy "
        "(podPolicy.nodeSelector); remove it",
        f"{at}.affinity.nodeAffinity": "node label zone is not allowed by the pod policy "
        "(podPolicy.nodeSelector); remove it",
        f"{at}.priorityClassName": "priority class system-node-critical is not allowed by the pod policy "
        "(podPolicy.priorityClasses); remove it",
    }
    # Affinity keys are each reported (the dict above keeps the last of two on one path).
    keys = [
        p.message for p in violations(PodPolicy(), table(pods)) if p.path == f"{at}.affinity.nodeAffinity"
    ]
    assert [m.split()[2] for m in keys] == ["metadata.name", "zone"]
    wide = PodPolicy(
        annotations=("prometheus.io/*",),
        service_account_annotations=("eks.amazonaws.com/role-arn",),
        tolerations=("dedicated",),
        node_selector=("pool", "zone", "metadata.name"),
        priority_classes=("system-node-critical",),
    )
    assert refused(pods, wide) == {f"{at}.tolerations[1]": found[f"{at}.tolerations[1]"]}
    assert refused(pods, wide.model_copy(update={"tolerations": ("*",)})) == {}


def test_a_policy_that_allows_them_allows_them() -> None:
    pods = {
        "driver": {
            "hostNetwork": True,
            "env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-Xss4m"}],
            "volumes": [{"name": "host", "hostPath": {"path": "/data"}}],
            "volumeMounts": [{"name": "host", "mountPath": "/data/in"}],
        }
    }
    policy = PodPolicy(
        host_network=True,
        volume_types=("hostPath",),
        mount_paths=("/data",),
        reserved_env=tuple(p for p in DEFAULT_RESERVED_ENV if p != "JAVA_*"),
    )
    assert refused(pods, policy) == {}


@pytest.mark.parametrize("field", ["securityContext", "hostPID", "hostIPC", "privileged", "capabilities"])
def test_privilege_cannot_be_written_in_spec_pods_at_all(field: str) -> None:
    with pytest.raises(ManifestError, match=f"spec.pods.driver.{field}: unknown field"):
        table({"driver": {field: True}})


def test_patterns_and_folders() -> None:
    assert first_match(("JAVA_*", "PATH"), "JAVA_HOME") == "JAVA_*"
    assert first_match(("JAVA_*", "PATH"), "PATHS") is None
    assert first_match(("*",), "") == "*"
    assert under(("/mnt/",), "/mnt") and under(("/mnt",), "/mnt/a/b") and not under(("/mnt/",), "/mnt2")
    assert not under(("/mnt/",), "/mnt/a/../../etc")


def test_the_policy_parses_from_the_operators_environment() -> None:
    policy = pod_policy_from_json('{"hostNetwork": true, "secrets": ["shared-*"]}', origin=POD_POLICY_ENV)
    assert policy == PodPolicy(host_network=True, secrets=("shared-*",))
    assert Config.from_env({POD_POLICY_ENV: '{"tolerations": ["*"]}'}).pod_policy.tolerations == ("*",)
    assert Config.from_env({}).pod_policy == PodPolicy()
    for text, message in (
        ('{"hostNetwork": "yes"}', "podPolicy.hostNetwork"),
        ('{"reservedEnv": ["A*B"]}', "'*' may only end a pattern"),
        ('{"mountPaths": ["/mnt/../opt"]}', "podPolicy.mountPaths"),
        ('{"privileged": true}', "podPolicy.privileged: unknown field"),
        ("not json", "not JSON"),
    ):
        with pytest.raises(ValueError, match=message) as error:
            Config.from_env({POD_POLICY_ENV: text})
        assert str(error.value).startswith(POD_POLICY_ENV)


def test_the_issue_says_why_no_pod_is_made() -> None:
    issue = policy_issue(violations(PodPolicy(), table({"driver": {"hostNetwork": True}})))
    assert issue.reason is ConditionReason.POD_POLICY_VIOLATION
    assert "no pod of this table is created or changed" in issue.message
    assert "spec.pods.driver.hostNetwork: host networking is not allowed" in issue.message
