"""The chart's pod-template values (`pods`, `hostNetworkPorts`, `hostNetwork`) without helm.

Proves: values.yaml's defaults reach the operator as its default settings (ICEFALL_POD_TEMPLATE and
ICEFALL_HOST_NETWORK_PORTS as the deployment renders them); values.schema.json accepts a pod template
the operator accepts and refuses, at `helm install` time, what the operator would refuse at start (names
the operator sets, executor ServiceAccount annotations, unknown fields, unquoted quantities, privileged
ports); its pod-template schema names exactly the model's fields and reserved names; the operator's
Deployment passes every operator setting as env and runs on the host network (with ClusterFirstWithHostNet
DNS) only when `hostNetwork` is true; the examples of docs/pod-templates.md are valid (the table's needs
exactly the example's podPolicy).

The schema is checked with a small draft-07 validator below covering the keywords the chart uses (it
fails on any other keyword); tests/integration/test_chart.py renders the chart with helm itself.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.api import (
    EnvVar,
    PodTemplate,
    PodTemplates,
    ResourceRequirements,
    Toleration,
    VolumeMount,
    parse_manifest,
)
from icefall.api.pod_policy import PodPolicy
from icefall.api.pods import (
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUME_NAMES,
    Affinity,
)
from icefall.plan.pod_policy import violations
from icefall.plan.settings import SETTINGS_ENV, OperatorSettings

pytestmark = pytest.mark.unit

CHART = Path(__file__).resolve().parents[2] / "charts" / "icefall"
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
DEPLOYMENT = (CHART / "templates" / "deployment.yaml").read_text()

_ANNOTATIONS = {"$schema", "title", "description", "definitions"}
_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float),
}  # fmt: skip


def errors(value: Any, node: dict[str, Any], path: str = "") -> list[str]:
    """Where `value` breaks the draft-07 `node` (of SCHEMA), as `/json/pointer: keyword`."""
    found: list[str] = []
    for key, want in node.items():
        if key in _ANNOTATIONS or key == "then":
            continue
        if key == "additionalProperties":
            if "properties" not in node and isinstance(value, dict):  # a map; else see "properties"
                found += _keyword("properties", {}, value, node, path)
            continue
        if key == "$ref":
            target: Any = SCHEMA
            for part in want.removeprefix("#/").split("/"):
                target = target[part]
            found += errors(value, target, path)
        elif key == "type":
            kinds = want if isinstance(want, list) else [want]
            if not any(_is(value, kind) for kind in kinds):
                found.append(f"{path}: type")
        elif key == "if":
            if not errors(value, want, path) and "then" in node:
                found += errors(value, node["then"], path)
        elif key == "allOf":
            for part in want:
                found += errors(value, part, path)
        elif key == "not":
            if not errors(value, want, path):
                found.append(f"{path}: not")
        else:
            found += _keyword(key, want, value, node, path)
    return found


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[kind])


def _keyword(key: str, want: Any, value: Any, node: dict[str, Any], path: str) -> list[str]:
    if key == "properties":
        if not isinstance(value, dict):
            return []
        out = [e for k, v in value.items() if k in want for e in errors(v, want[k], f"{path}/{k}")]
        extra = node.get("additionalProperties", True)
        for k, v in value.items():
            if k not in want and extra is False:
                out.append(f"{path}/{k}: additionalProperties")
            elif k not in want and isinstance(extra, dict):
                out += errors(v, extra, f"{path}/{k}")
        return out
    if key == "required":
        return [f"{path}/{k}: required" for k in want if isinstance(value, dict) and k not in value]
    if key == "items":
        return (
            [e for i, v in enumerate(value) for e in errors(v, want, f"{path}/{i}")]
            if isinstance(value, list)
            else []
        )
    checks: dict[str, Callable[[], bool]] = {
        "pattern": lambda: not isinstance(value, str) or re.search(want, value) is not None,
        "enum": lambda: value in want,
        "const": lambda: value == want,
        "minimum": lambda: not _is(value, "number") or value >= want,
        "maximum": lambda: not _is(value, "number") or value <= want,
        "exclusiveMinimum": lambda: not _is(value, "number") or value > want,
        "exclusiveMaximum": lambda: not _is(value, "number") or value < want,
        "minLength": lambda: not isinstance(value, str) or len(value) >= want,
        "maxLength": lambda: not isinstance(value, str) or len(value) <= want,
        "minProperties": lambda: not isinstance(value, dict) or len(value) >= want,
        "maxProperties": lambda: not isinstance(value, dict) or len(value) <= want,
        "maxItems": lambda: not isinstance(value, list) or len(value) <= want,
    }
    if key not in checks:
        raise AssertionError(f"the test's validator does not know {key!r} (at {path or '/'}); teach it")
    return [] if checks[key]() else [f"{path}: {key}"]


def with_values(**changes: Any) -> dict[str, Any]:
    values = copy.deepcopy(VALUES)
    values.update(changes)
    return values


def chart_env(values: dict[str, Any]) -> dict[str, str]:
    """ICEFALL_POD_TEMPLATE, ICEFALL_HOST_NETWORK_PORTS and the network policy settings as
    templates/deployment.yaml renders them."""
    ports = values["hostNetworkPorts"]
    return {
        "ICEFALL_POD_TEMPLATE": json.dumps(values["pods"]),
        "ICEFALL_HOST_NETWORK_PORTS": f"{int(ports['first'])}-{int(ports['last'])}",
        "ICEFALL_NETWORK_POLICY": str(values["networkPolicy"]["enabled"]).lower(),
        "ICEFALL_METRICS_NAMESPACE": values["networkPolicy"]["metricsNamespace"],
        "ICEFALL_ALLOW_NODE_IDENTITY": str(values["cloudIdentity"]["allowNodeIdentity"]).lower(),
    }


POD_VALUES: dict[str, Any] = {
    "common": {
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"pool": "data"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "data", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "priorityClassName": "data",
        "labels": {"team": "data"},
        "env": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "volumes": [{"name": "certs", "secret": {"secretName": "ca"}}],
        "volumeMounts": [{"name": "certs", "mountPath": "/etc/certs", "readOnly": True}],
        "hostNetwork": True,
    },
    "driver": {
        "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"},
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
    },
    "executor": {"resources": {"limits": {"memory": "3Gi"}}},
    "compaction": {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}]},
}


def test_the_default_values_give_the_operators_default_settings() -> None:
    assert errors(VALUES, SCHEMA) == []
    assert VALUES["hostNetwork"] is False
    assert OperatorSettings.from_environ(chart_env(VALUES)) == OperatorSettings()


def test_the_schema_accepts_a_template_the_operator_accepts() -> None:
    values = with_values(pods=POD_VALUES, hostNetworkPorts={"first": 30000, "last": 30999}, hostNetwork=True)
    assert errors(values, SCHEMA) == []
    settings = OperatorSettings.from_environ(chart_env(values))
    assert settings.pod_template == PodTemplates.model_validate(POD_VALUES)
    assert settings.host_network_ports == (30000, 30999)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"pods": {"driver": {"env": [{"name": "ICEFALL_SPARK_CONF", "value": "x"}]}}},
         "/pods/driver/env/0/name"),
        ({"pods": {"common": {"env": [{"name": "ICEFALL_POD_IP", "value": "x"}]}}},
         "/pods/common/env/0/name"),
        ({"pods": {"common": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}}, "/pods/common/volumes/0/name"),
        ({"pods": {"common": {"volumeMounts": [{"name": "x", "mountPath": "/tmp"}]}}},
         "/pods/common/volumeMounts/0/mountPath"),
        ({"pods": {"executor": {"serviceAccountAnnotations": {"a": "b"}}}}, "/pods/executor"),
        ({"pods": {"common": {"nodeSelecter": {}}}}, "/pods/common/nodeSelecter"),
        ({"pods": {"driver": {"resources": {"limits": {"cpu": 2}}}}}, "/pods/driver/resources/limits/cpu"),
        ({"pods": {"driver": {"resources": {"limits": {"memory": "2GB"}}}}},
         "/pods/driver/resources/limits/memory"),
        ({"pods": {"common": {"hostNetwork": "maybe"}}}, "/pods/common/hostNetwork"),
        ({"pods": {"gpu": {}}}, "/pods/gpu"),
        ({"hostNetworkPorts": {"first": 80, "last": 90}}, "/hostNetworkPorts/first"),
        ({"hostNetwork": "true"}, "/hostNetwork"),
    ],
)  # fmt: skip
def test_the_schema_refuses_what_the_operator_would_refuse_at_start(
    change: dict[str, Any], where: str
) -> None:
    found = errors(with_values(**change), SCHEMA)
    assert any(e.startswith(f"{where}:") for e in found), found
    if "pods" in change:
        with pytest.raises(ValueError, match="ICEFALL_POD_TEMPLATE"):
            OperatorSettings.from_environ({"ICEFALL_POD_TEMPLATE": json.dumps(change["pods"])})


def _aliases(model: Any) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def test_the_schemas_pod_template_names_the_models_fields_and_reserved_names() -> None:
    definition = SCHEMA["definitions"]["podTemplate"]["properties"]
    assert set(definition) == _aliases(PodTemplate)
    assert set(definition["env"]["items"]["properties"]) == _aliases(EnvVar)
    assert set(definition["volumeMounts"]["items"]["properties"]) == _aliases(VolumeMount)
    assert set(definition["tolerations"]["items"]["properties"]) == _aliases(Toleration)
    assert set(definition["resources"]["properties"]) == _aliases(ResourceRequirements)
    assert set(definition["affinity"]["properties"]) == _aliases(Affinity)
    assert set(SCHEMA["properties"]["pods"]["properties"]) == _aliases(PodTemplates)
    name = definition["env"]["items"]["properties"]["name"]
    assert name["allOf"][0]["not"]["enum"] == list(RESERVED_ENV_NAMES)
    assert all(prefix in name["allOf"][1]["not"]["pattern"] for prefix in RESERVED_ENV_PREFIXES)
    volume = definition["volumes"]["items"]["properties"]["name"]
    assert volume["allOf"][0]["not"]["enum"] == list(RESERVED_VOLUME_NAMES)
    paths = definition["volumeMounts"]["items"]["properties"]["mountPath"]["not"]["enum"]
    assert set(paths) == {variant for p in RESERVED_MOUNT_PATHS for variant in (p, f"{p}/")}


def test_the_deployment_passes_every_setting_and_honours_host_network() -> None:
    for variable in SETTINGS_ENV.values():
        assert f"- name: {variable}\n" in DEPLOYMENT, variable
    assert 'value: {{ include "icefall.podTemplates" . | quote }}' in DEPLOYMENT  # pods + cloudIdentity
    host = re.search(r"\{\{- if \.Values\.hostNetwork \}\}\n(.*?)\{\{- end \}\}", DEPLOYMENT, re.S)
    assert host is not None
    assert yaml.safe_load(host.group(1)) == {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}


def test_the_docs_examples_are_valid() -> None:
    doc = (CHART.parents[1] / "docs" / "pod-templates.md").read_text()
    table, chart = re.findall(r"```yaml\n(.*?)```", doc, re.S)
    assert parse_manifest(table).spec.pods.driver.service_account_annotations
    values = with_values(**yaml.safe_load(chart))
    assert errors(values, SCHEMA) == []
    assert OperatorSettings.from_environ(chart_env(values)).pod_template.driver.resources is not None
    # The table example needs the example's podPolicy, and nothing more.
    example = parse_manifest(table)
    assert violations(PodPolicy.model_validate(values["podPolicy"]), example) == []
    assert violations(PodPolicy(), example)
