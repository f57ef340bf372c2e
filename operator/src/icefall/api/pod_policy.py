"""The pod policy: what a StreamingTable's `spec.pods` may ask of the cluster, set by whoever installs the
operator (the chart's `podPolicy`, passed to the operator as JSON in `ICEFALL_POD_POLICY`).

A table's author may not be a cluster admin: without a policy, `spec.pods` would let them run the table's
pods with the node's network, read any Secret of the namespace, change how the operator's processes start
(`JAVA_TOOL_OPTIONS`, `LD_PRELOAD`, ...) or land on any node. The policy names what is allowed; everything
else is refused. The defaults allow none of that: no host network, only the volume types of the
`restricted` Pod Security Standard that read no storage of others (configMap, downwardAPI, emptyDir,
projected, secret), mounts under /mnt/ only, no reserved variable, and empty allow-lists of annotations,
ServiceAccount annotations, tolerations, node labels and priority classes.

A pattern is a name, or a prefix followed by `*` (`JAVA_*`, `prometheus.io/*`; `*` alone matches
everything). Mount paths are folders: `/mnt/` allows `/mnt` and everything under it.

Not here: the policy is enforced by `icefall.plan.pod_policy` (the operator) and by the chart's
ValidatingAdmissionPolicy (the API server); it never limits the chart's own `pods` (whoever installs the
chart sets both). Privilege, added capabilities, hostPID and hostIPC need no setting: `spec.pods` has no
field for them, and the operator sets the `restricted` security context itself.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field, StrictBool, ValidationError, field_validator

from icefall.api.base import ApiModel
from icefall.api.manifest import problems_from_validation_error

DEFAULT_VOLUME_TYPES = ("configMap", "downwardAPI", "emptyDir", "projected", "secret")
DEFAULT_MOUNT_PATHS = ("/mnt/",)
#: Variables that change how the JVM, Python, Spark, the dynamic linker, the Kubernetes and Hadoop clients
#: or the operator's own entry points start or behave.
DEFAULT_RESERVED_ENV = (
    *("JAVA_*", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "PATH"),
    *("PYSPARK_*", "SPARK_*", "LD_*", "PYTHON*", "ICEFALL_*"),
    *("KUBERNETES_*", "HADOOP_*", "GLIBC_TUNABLES"),
)

Pattern = Annotated[str, Field(min_length=1, max_length=317)]
MAX_PATTERNS = 256


def first_match(patterns: tuple[str, ...], value: str) -> str | None:
    """The first of `patterns` that `value` matches (`NAME` exactly, `PREFIX*` by prefix), else None."""
    for pattern in patterns:
        if value == pattern or (pattern.endswith("*") and value.startswith(pattern[:-1])):
            return pattern
    return None


def under(folders: tuple[str, ...], path: str) -> bool:
    """Whether `path` is one of `folders` or lies under one, without a `..` step."""
    if "/../" in path + "/":
        return False
    return any(
        (path + "/").startswith(folder if folder.endswith("/") else folder + "/") for folder in folders
    )


def _patterns(values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        if "*" in value[:-1]:
            raise ValueError(f"{value!r}: '*' may only end a pattern (e.g. JAVA_*)")
    return values


def _patterns_field(description: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
    found: tuple[str, ...] = Field(default=default, max_length=MAX_PATTERNS, description=description)
    return found


class PodPolicy(ApiModel):
    """What `spec.pods` may use (module docstring). Each field allows; nothing is allowed unless listed."""

    host_network: StrictBool = Field(default=False, description="Allow `hostNetwork: true`.")
    volume_types: tuple[Pattern, ...] = _patterns_field(
        "Volume sources allowed (configMap, secret, persistentVolumeClaim, csi, hostPath, ...).",
        DEFAULT_VOLUME_TYPES,
    )
    mount_paths: tuple[Pattern, ...] = _patterns_field(
        "Folders under which volumes may be mounted (absolute paths).", DEFAULT_MOUNT_PATHS
    )
    secrets: tuple[Pattern, ...] = _patterns_field(
        "Secrets every table may use in spec.pods (volumes, env), besides those its spec references in "
        "spec.source, spec.format.registry and spec.table.catalog.secretProperties."
    )
    reserved_env: tuple[Pattern, ...] = _patterns_field(
        "Variable names (or NAME* prefixes) spec.pods may not set.", DEFAULT_RESERVED_ENV
    )
    annotations: tuple[Pattern, ...] = _patterns_field("Pod annotation keys allowed.")
    service_account_annotations: tuple[Pattern, ...] = _patterns_field(
        "ServiceAccount annotation keys allowed (e.g. eks.amazonaws.com/role-arn)."
    )
    tolerations: tuple[Pattern, ...] = _patterns_field(
        "Taint keys that may be tolerated; `*` also allows a toleration without a key (every taint)."
    )
    node_selector: tuple[Pattern, ...] = _patterns_field(
        "Node label keys allowed in nodeSelector and in node affinity terms."
    )
    priority_classes: tuple[Pattern, ...] = _patterns_field("PriorityClass names allowed.")

    @field_validator(
        "volume_types",
        "secrets",
        "reserved_env",
        "annotations",
        "service_account_annotations",
        "tolerations",
        "node_selector",
        "priority_classes",
    )
    @classmethod
    def _check_patterns(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return _patterns(values)

    @field_validator("mount_paths")
    @classmethod
    def _check_folders(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not value.startswith("/") or "*" in value or "/../" in value + "/":
                raise ValueError(f"{value!r}: write an absolute folder such as /mnt/ (no '*', no '..')")
        return values


def pod_policy_from_json(text: str, *, origin: str) -> PodPolicy:
    """The policy in `text` (JSON of the chart's `podPolicy`); a ValueError names `origin` and each wrong
    field, never echoing the document."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{origin}: not JSON ({error}); give an object like the chart's podPolicy") from None
    try:
        return PodPolicy.model_validate(data)
    except ValidationError as error:
        problems = problems_from_validation_error(error, model=PodPolicy, prefix=("podPolicy",))
        raise ValueError(f"{origin}: " + "; ".join(map(str, problems))) from None
