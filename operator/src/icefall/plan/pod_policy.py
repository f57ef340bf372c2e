"""The pod policy (`icefall.api.pod_policy.PodPolicy`) applied to a StreamingTable's `spec.pods`. Pure: no
client, no I/O.

`violations` lists what `spec.pods` asks that the policy does not allow, each with its field and the fix:

| field | allowed when |
|---|---|
| `hostNetwork: true` | `hostNetwork` |
| a volume's source type | listed in `volumeTypes` |
| a Secret (`SECRET_FIELDS`) | the spec references it elsewhere, or `secrets` lists it |
| `volumeMounts[].mountPath` | under a folder of `mountPaths`, no `..` |
| `env[].name` | matches no pattern of `reservedEnv` |
| `annotations`, `serviceAccountAnnotations` keys | listed in `annotations`, `serviceAccountAnnotations` |
| `tolerations[].key` | listed in `tolerations` (`*` for a toleration without a key) |
| `nodeSelector` keys, node affinity keys | listed in `nodeSelector` |
| `priorityClassName` | listed in `priorityClasses` |

The chart's ValidatingAdmissionPolicy (charts/icefall/templates/admission-policies.yaml) says the same in
CEL, with the same messages, so `kubectl apply` refuses what the operator would; the operator checks again
before it renders a pod, because the policy may have changed since the table was admitted or the chart
may ship no admission policy.

A table that breaks the policy gets `policy_issue` (Degraded and Ready False, reason PodPolicyViolation)
and `icefall.plan.children.withheld_children`: nothing is applied, no driver Pod is created, and what runs
keeps the spec it started with.

Guarantees: deterministic (parts in the order common, driver, executor, compaction; then fields in the
table above); one violation per offending item. Not guaranteed: that an allowed volume source is valid
(the API server checks it when the pod is created).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from icefall.api import ConditionReason, PodTemplate, Problem, StreamingTable, StreamingTableSpec
from icefall.api.pod_policy import PodPolicy, first_match, under
from icefall.plan.conditions import Issue
from icefall.plan.env import secret_env_vars

PARTS = ("common", "driver", "executor", "compaction")
#: Where `spec.pods` names a Secret; a Secret is allowed when the spec references it elsewhere
#: (`referenced_secrets`: spec.source, spec.format.registry, spec.table.catalog.secretProperties).
SECRET_FIELDS = (
    "volumes[].secret.secretName",
    "volumes[].projected.sources[].secret.name",
    "volumes[].csi.nodePublishSecretRef.name",
    "env[].valueFrom.secretKeyRef.name",
)

SECRET_FIX = (
    "is neither referenced elsewhere in this StreamingTable's spec (spec.source, spec.format.registry, "
    "spec.table.catalog.secretProperties) nor allowed by the pod policy (podPolicy.secrets); remove it"
)


def referenced_secrets(st: StreamingTable) -> frozenset[str]:
    """The Secrets the spec references outside `spec.pods` (the credentials the operator hands its pods)."""
    kafka, catalog, _ = secret_env_vars(st.spec)
    return frozenset(ref.secret for ref in (*kafka, *catalog))


def pod_secrets(spec: StreamingTableSpec) -> list[tuple[str, str, str]]:
    """(field, Secret, key) of every Secret `spec.pods` names (`SECRET_FIELDS`; the key is "" for a
    volume, which mounts them all): what `icefall.plan.grants` checks besides the credential references,
    so a Secret reaches a table's pods only when granted to StreamingTables, whatever the policy allows."""
    found: list[tuple[str, str, str]] = []
    for part in PARTS:
        template: PodTemplate = getattr(spec.pods, part)
        at = f"spec.pods.{part}"
        for i, volume in enumerate(template.volumes):
            for path, name in _volume_secrets(volume.model_extra or {}):
                found.append((f"{at}.volumes[{i}].{path}", name, ""))
        for i, env in enumerate(template.env):
            ref = env.value_from.secret_key_ref if env.value_from else None
            if ref is not None:
                found.append((f"{at}.env[{i}].valueFrom.secretKeyRef.name", ref.name, ref.key))
    return found


def violations(policy: PodPolicy, st: StreamingTable) -> list[Problem]:
    """What `st.spec.pods` asks that `policy` does not allow (module docstring); empty when nothing."""
    secrets = referenced_secrets(st)
    found: list[Problem] = []
    for part in PARTS:
        template: PodTemplate = getattr(st.spec.pods, part)
        found += _part(policy, f"spec.pods.{part}", template, secrets)
    return found


def policy_issue(found: list[Problem]) -> Issue:
    """The Degraded issue of a table whose `spec.pods` breaks the policy (`found`: its `violations`)."""
    return Issue(
        ConditionReason.POD_POLICY_VIOLATION,
        "spec.pods breaks the operator's pod policy (the chart's podPolicy), so no pod of this table is "
        "created or changed until it is fixed: " + "; ".join(map(str, found)),
    )


def _part(policy: PodPolicy, at: str, template: PodTemplate, secrets: frozenset[str]) -> list[Problem]:
    found: list[Problem] = []
    if template.host_network and not policy.host_network:
        found.append(Problem(f"{at}.hostNetwork", _refused("host networking", "hostNetwork")))
    for i, volume in enumerate(template.volumes):
        found += _volume(policy, f"{at}.volumes[{i}]", volume.model_extra or {}, secrets)
    for i, mount in enumerate(template.volume_mounts):
        if not under(policy.mount_paths, mount.mount_path):
            folders = ", ".join(policy.mount_paths) or "none"
            message = f"{mount.mount_path} is outside the folders the pod policy allows"
            message += f" (podPolicy.mountPaths: {folders}); mount under one"
            found.append(Problem(f"{at}.volumeMounts[{i}].mountPath", message))
    for i, env in enumerate(template.env):
        reserved = first_match(policy.reserved_env, env.name)
        if reserved is not None:
            message = f"{env.name} is reserved by the pod policy (podPolicy.reservedEnv: {reserved})"
            found.append(Problem(f"{at}.env[{i}].name", f"{message}; remove it"))
        ref = env.value_from.secret_key_ref if env.value_from else None
        if ref is not None:
            found += _secret(policy, f"{at}.env[{i}].valueFrom.secretKeyRef.name", ref.name, secrets)
    found += _scheduling(policy, at, template)
    return found


def _volume(policy: PodPolicy, at: str, sources: Mapping[str, Any], secrets: frozenset[str]) -> list[Problem]:
    """The volume's source type, and each Secret it names."""
    found: list[Problem] = []
    for kind in sources:
        if first_match(policy.volume_types, kind) is None:
            allowed = ", ".join(policy.volume_types) or "none"
            message = (
                f"volume type {kind} is not allowed by the pod policy (podPolicy.volumeTypes: {allowed})"
            )
            found.append(Problem(at, f"{message}; use another"))
    for path, name in _volume_secrets(sources):
        found += _secret(policy, f"{at}.{path}", name, secrets)
    return found


def _refused(what: str, setting: str) -> str:
    return f"{what} is not allowed by the pod policy (podPolicy.{setting}); remove it"


def _secret(policy: PodPolicy, path: str, name: str, secrets: frozenset[str]) -> list[Problem]:
    if name in secrets or first_match(policy.secrets, name) is not None:
        return []
    return [Problem(path, f"Secret {name} {SECRET_FIX}")]


def _volume_secrets(sources: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path under the volume, Secret name) of each Secret a volume source names."""
    secret = sources.get("secret")
    if isinstance(secret, dict) and isinstance(secret.get("secretName"), str):
        yield "secret.secretName", secret["secretName"]
    projected = sources.get("projected")
    if isinstance(projected, dict) and isinstance(projected.get("sources"), list):
        for j, source in enumerate(projected["sources"]):
            name = source.get("secret", {}).get("name") if isinstance(source, dict) else None
            if isinstance(name, str):
                yield f"projected.sources[{j}].secret.name", name
    csi = sources.get("csi")
    if isinstance(csi, dict) and isinstance(csi.get("nodePublishSecretRef"), dict):
        name = csi["nodePublishSecretRef"].get("name")
        if isinstance(name, str):
            yield "csi.nodePublishSecretRef.name", name


def _scheduling(policy: PodPolicy, at: str, template: PodTemplate) -> list[Problem]:
    """Annotations, ServiceAccount annotations, tolerations, node labels and the priority class."""
    found: list[Problem] = []
    for key in template.annotations:
        if first_match(policy.annotations, key) is None:
            found.append(Problem(f"{at}.annotations[{key}]", _refused(f"annotation {key}", "annotations")))
    for key in template.service_account_annotations:
        if first_match(policy.service_account_annotations, key) is None:
            message = _refused(f"ServiceAccount annotation {key}", "serviceAccountAnnotations")
            found.append(Problem(f"{at}.serviceAccountAnnotations[{key}]", message))
    for i, toleration in enumerate(template.tolerations):
        key = toleration.key or ""
        if first_match(policy.tolerations, key) is None:
            what = f"a toleration of {key}" if key else "a toleration of every taint"
            found.append(Problem(f"{at}.tolerations[{i}]", _refused(what, "tolerations")))
    for key in template.node_selector:
        if first_match(policy.node_selector, key) is None:
            found.append(Problem(f"{at}.nodeSelector[{key}]", _refused(f"node label {key}", "nodeSelector")))
    node_affinity = template.affinity.node_affinity if template.affinity else None
    for key in _affinity_keys(node_affinity or {}):
        if first_match(policy.node_selector, key) is None:
            message = _refused(f"node label {key}", "nodeSelector")
            found.append(Problem(f"{at}.affinity.nodeAffinity", message))
    name = template.priority_class_name
    if name is not None and first_match(policy.priority_classes, name) is None:
        message = _refused(f"priority class {name}", "priorityClasses")
        found.append(Problem(f"{at}.priorityClassName", message))
    return found


def _affinity_keys(node_affinity: Mapping[str, Any]) -> list[str]:
    """The node label (and field) keys of a NodeAffinity's required and preferred terms, each once."""
    terms: list[Any] = []
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, dict):
        terms += required.get("nodeSelectorTerms") or []
    for preferred in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        if isinstance(preferred, dict):
            terms.append(preferred.get("preference") or {})
    keys: list[str] = []
    for term in terms:
        if not isinstance(term, dict):
            continue
        for requirement in (*(term.get("matchExpressions") or []), *(term.get("matchFields") or [])):
            key = requirement.get("key") if isinstance(requirement, dict) else None
            if isinstance(key, str) and key not in keys:
                keys.append(key)
    return keys
