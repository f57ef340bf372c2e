"""`spec.pods`: the pod templates a StreamingTable may give its pods, as the models and the CRD check them.

Proves: a full template validates and round-trips through YAML; what the operator sets itself (env
names, volume names, mount paths, labels, `icefall.dev/` annotations) is refused with the field's path
and the fix, by the models and by the CRD's CEL rules (which reuse the models' lists); a mount naming a
volume the template lacks, duplicate names, a request above its limit, a bad quantity, an executor with
ServiceAccount annotations or too little memory, an env var with two sources, and a volume without
exactly one source are refused, each naming its field; quantities parse as Kubernetes reads them; the
CRD keeps affinity terms and volume sources as written (preserve-unknown-fields) with typed names, and
bounds every list a CEL rule runs over.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from icefall.api import ManifestError, PodTemplates, parse_manifest, parse_quantity
from icefall.api.crd import build_crd
from icefall.api.pods import (
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUME_NAMES,
)

pytestmark = pytest.mark.unit

MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: orders}
spec:
  source: {bootstrapServers: "kafka:9092", topic: orders}
  format: {schema: [{name: id, type: long}]}
  pods:
    common:
      imagePullSecrets: [{name: registry}]
      nodeSelector: {pool: data}
      tolerations: [{key: dedicated, operator: Equal, value: data, effect: NoSchedule}]
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]
      priorityClassName: data-high
      labels: {team: data}
      annotations: {example.com/owner: data}
      env:
        - {name: AWS_REGION, value: eu-west-1}
        - {name: API_TOKEN, valueFrom: {secretKeyRef: {name: api, key: token}}}
        - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
      volumes:
        - {name: certs, secret: {secretName: kafka-ca}}
      volumeMounts:
        - {name: certs, mountPath: /etc/certs, readOnly: true}
    driver:
      hostNetwork: true
      serviceAccountAnnotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/ingest"}
      resources: {requests: {cpu: "2", memory: 4Gi}, limits: {memory: 4Gi}}
    executor:
      resources: {requests: {cpu: 500m}, limits: {memory: 3Gi, nvidia.com/gpu: "1"}}
    compaction:
      volumes: [{name: scratch, emptyDir: {sizeLimit: 8Gi}}]
      volumeMounts: [{name: scratch, mountPath: /scratch}, {name: certs, mountPath: /certs}]
"""


def with_pods(pods: dict[str, Any]) -> str:
    import yaml

    body = yaml.safe_load(MANIFEST)
    body["spec"]["pods"] = pods
    return yaml.safe_dump(body)


def problems(pods: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(with_pods(pods))
    return {p.path: p.message for p in caught.value.problems}


def test_a_full_template_validates_and_round_trips() -> None:
    st = parse_manifest(MANIFEST)
    pods = st.spec.pods
    assert pods.common.env[1].value_from is not None
    assert pods.common.volumes[0].model_extra == {"secret": {"secretName": "kafka-ca"}}
    assert pods.driver.host_network is True and pods.executor.host_network is None
    dumped = pods.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    assert PodTemplates.model_validate(dumped) == pods
    assert dumped["common"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


@pytest.mark.parametrize(
    ("pods", "path", "words"),
    [
        ({"driver": {"env": [{"name": "ICEFALL_SPARK_CONF", "value": "{}"}]}}, "spec.pods.driver.env[0].name",
         "ICEFALL_SPARK_CONF is set by the operator; pick another name"),
        ({"common": {"env": [{"name": "ICEFALL_POD_IP", "value": "x"}]}}, "spec.pods.common.env[0].name",
         "ICEFALL_POD_IP is set by the operator"),
        ({"executor": {"env": [{"name": "HOME", "value": "/home"}]}}, "spec.pods.executor.env[0].name",
         "HOME is set by the operator"),
        ({"common": {"env": [{"name": "ICEFALL_KAFKA_PASSWORD", "value": "x"}]}},
         "spec.pods.common.env[0].name", "ICEFALL_KAFKA_PASSWORD is set by the operator"),
        ({"common": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}, "spec.pods.common.volumes[0].name",
         "'tmp' is a volume of the operator or of Spark; pick another name"),
        ({"common": {"volumes": [{"name": "spark-conf-volume-exec", "emptyDir": {}}]}},
         "spec.pods.common.volumes[0].name", "pick another name"),
        ({"common": {"volumes": [{"name": "x", "emptyDir": {}}],
                     "volumeMounts": [{"name": "x", "mountPath": "/var/data/spark-local/"}]}},
         "spec.pods.common.volumeMounts[0].mountPath", "mount elsewhere"),
        ({"driver": {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}},
         "spec.pods.driver.volumeMounts[0].name",
         "no volume 'data'; add it to common.volumes or driver.volumes"),
        ({"common": {"labels": {"app.kubernetes.io/instance": "x"}}},
         "spec.pods.common.labels['app.kubernetes.io/instance']", "is set by the operator; use another key"),
        ({"driver": {"annotations": {"icefall.dev/restart": "now"}}},
         "spec.pods.driver.annotations['icefall.dev/restart']", "is set by the operator"),
        ({"executor": {"serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "x"}}},
         "spec.pods.executor.serviceAccountAnnotations", "executors run as the driver's ServiceAccount"),
        ({"executor": {"resources": {"requests": {"memory": "512Mi"}}}},
         "spec.pods.executor.resources.requests.memory",
         "too little for a Spark executor; give at least 896Mi"),
        ({"common": {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}},
         "spec.pods.common.resources.requests.cpu", "4 is more than limits.cpu (2); lower it"),
        ({"common": {"resources": {"limits": {"memory": "2GB"}}}},
         "spec.pods.common.resources.limits.memory", "write a Kubernetes quantity such as 500m"),
        ({"common": {"resources": {"limits": {"memory": 2}}}},
         "spec.pods.common.resources.limits.memory", "expected a string"),
        ({"common": {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}},
         "spec.pods.common.env[0].valueFrom", "set value or valueFrom, not both"),
        ({"common": {"env": [{"name": "A", "valueFrom": {}}]}}, "spec.pods.common.env[0].valueFrom",
         "set exactly one of secretKeyRef"),
        ({"common": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}},
         "spec.pods.common.env[1]", "A appears twice; keep one"),
        ({"common": {"volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]}},
         "spec.pods.common.volumes[0]", "exactly one source object"),
        ({"common": {"hostNetwork": "maybe"}}, "spec.pods.common.hostNetwork", "expected true or false"),
        ({"compaction": {"tolerations": [{"operator": "Maybe"}]}},
         "spec.pods.compaction.tolerations[0].operator", "use one of Exists, Equal"),
        ({"common": {"nodeSelecter": {"a": "b"}}}, "spec.pods.common.nodeSelecter",
         "did you mean 'nodeSelector'"),
    ],
)  # fmt: skip
def test_refusals_name_the_field_and_the_fix(pods: dict[str, Any], path: str, words: str) -> None:
    found = problems(pods)
    assert path in found, found
    assert words in found[path], found[path]


def test_a_role_may_mount_a_common_volume_and_replace_an_inherited_name() -> None:
    st = parse_manifest(
        with_pods(
            {
                "common": {"volumes": [{"name": "certs", "secret": {"secretName": "a"}}]},
                "executor": {"volumeMounts": [{"name": "certs", "mountPath": "/certs"}]},
                "driver": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]},
            }
        )
    )
    assert st.spec.pods.executor.volume_mounts[0].name == "certs"


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", "0.5"), ("2", "2"), ("1.5", "1.5"), ("4Gi", str(4 * 2**30)), ("512Mi", str(512 * 2**20)),
     ("1e3", "1000"), ("2k", "2000"), ("1M", "1000000"), (".5", "0.5")],
)  # fmt: skip
def test_quantities_parse_as_kubernetes_reads_them(text: str, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("text", ["", "-1", "2GB", "1.2.3", "Gi", "1 Gi"])
def test_what_is_not_a_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


# --- the CRD ----------------------------------------------------------------------------------------------


def pods_schema() -> dict[str, Any]:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema: dict[str, Any] = spec["properties"]["pods"]
    return schema


def rules(node: dict[str, Any]) -> str:
    return " ".join(r["rule"] for r in node.get("x-kubernetes-validations", []))


def test_the_crd_refuses_what_the_operator_sets_with_the_models_lists() -> None:
    schema = pods_schema()
    assert "!has(self.executor.serviceAccountAnnotations)" in rules(schema)
    for role in ("common", "driver", "executor", "compaction"):
        template = schema["properties"][role]["properties"]
        env = template["env"]
        volumes = template["volumes"]
        mounts = template["volumeMounts"]
        for name in (*RESERVED_ENV_NAMES, *RESERVED_ENV_PREFIXES):
            assert f"'{name}'" in rules(env["items"]), name
        for name in RESERVED_VOLUME_NAMES:
            assert f"'{name}'" in rules(volumes["items"]), name
        for path in RESERVED_MOUNT_PATHS:
            assert f"'{path}'" in rules(mounts["items"]), path
        for bounded in (env, volumes, mounts, template["tolerations"], template["imagePullSecrets"]):
            assert bounded["maxItems"] <= 128  # keeps the CEL cost of per-item rules small
        assert re.fullmatch(env["items"]["properties"]["name"]["pattern"], "AWS_REGION")


def test_the_crd_keeps_affinity_terms_and_volume_sources_as_written() -> None:
    template = pods_schema()["properties"]["common"]["properties"]
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        node = template["affinity"]["properties"][kind]
        assert node == {**node, "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert "kept as written" in template["affinity"]["description"]
    volume = template["volumes"]["items"]
    assert volume["x-kubernetes-preserve-unknown-fields"] is True
    assert volume["required"] == ["name"] and volume["properties"]["name"]["pattern"].startswith("^[a-z0-9]")
    assert "kept as written" in volume["description"]
    quantity = template["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["type"] == "string" and re.fullmatch(quantity["pattern"], "4Gi")
    assert not re.fullmatch(quantity["pattern"], "4GB")
