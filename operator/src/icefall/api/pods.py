"""`spec.pods`: what a cluster needs on the pods the operator runs for a table (pull secrets, scheduling,
resources, host network, extra env and volumes, metadata, ServiceAccount annotations).

`PodTemplates` holds a `common` part, applied to every pod of the table, and one part per role: `driver`
(the ingestion driver pod), `executor` (Spark's executor pods, through their pod template) and `compaction`
(the compaction Deployment's pods). The operator's Helm chart gives defaults of the same shape (the
operator's `ICEFALL_POD_TEMPLATE`); `icefall.plan.pods` merges the layers and says what wins.

Guarantees:
- Nothing here can replace what the operator itself sets: env names it sets (`ICEFALL_SPARK_CONF`,
  `ICEFALL_POD_*`, the credential variables, `HOME`), its volume names and mount paths, its labels and its
  `icefall.dev/` annotations are refused, each with the field and the fix.
- Every volume mount names a volume of the same `PodTemplates` (its `common` part or the same role), so a
  layer that validates never leaves a mount dangling, whatever it is merged with.
- Quantities follow Kubernetes' syntax; a request above its limit in one template is refused.
- Executors run as the driver's ServiceAccount: `executor.serviceAccountAnnotations` is refused.

Not guaranteed here: the parts kept free-form (`affinity` terms, volume sources) are checked by the API
server when the pod is created, not when the StreamingTable is applied; the scheduler decides whether
node selectors, tolerations and priority classes can be met.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from icefall.api.base import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    LABEL_VALUE_PATTERN,
    MOUNT_PATH_PATTERN,
    QUALIFIED_NAME_PATTERN,
    QUANTITY_PATTERN,
    SECRET_KEY_PATTERN,
    ApiModel,
    Loc,
    ProblemCollector,
)

#: Env vars the operator sets in its pods (`AWS_EC2_METADATA_DISABLED`: `icefall.plan.env.NODE_IDENTITY_OFF`),
#: and the prefixes of the ones it derives from the spec.
RESERVED_ENV_NAMES = ("ICEFALL_SPARK_CONF", "HOME", "AWS_EC2_METADATA_DISABLED")
RESERVED_ENV_PREFIXES = ("ICEFALL_POD_", "ICEFALL_KAFKA_", "ICEFALL_CATALOG_", "ICEFALL_REGISTRY_")
#: Volumes the operator (and Spark, `spark-*`) adds, and where it mounts them (`/opt/spark/conf`: Spark's
#: own executor configuration).
RESERVED_VOLUME_NAMES = ("tmp", "spark-local", "executor-template")
RESERVED_VOLUME_PREFIX = "spark-"
RESERVED_MOUNT_PATHS = ("/tmp", "/var/data/spark-local", "/etc/icefall/spark", "/opt/spark/conf")
#: Labels the operator sets on every child (selectors rely on them) and its annotation prefix.
RESERVED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
)
RESERVED_PREFIX = "icefall.dev/"

MAX_ENV = 128
MAX_VOLUMES = 64
MAX_TOLERATIONS = 64

Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": "1e-9", "u": "1e-6", "m": "1e-3", "": "1", "k": "1e3", "M": "1e6", "G": "1e9", "T": "1e12"}
_DECIMAL |= {"P": "1e15", "E": "1e18"}


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity as a number (`500m` → 0.5, `2Gi` → 2147483648); ValueError if not one."""
    if not re.fullmatch(QUANTITY_PATTERN, text):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")
    match = re.fullmatch(r"([0-9.]+)([eE].*|[A-Za-z]*)", text)
    assert match is not None  # the pattern above guarantees it
    number, suffix = match.groups()
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number + suffix)
        if suffix in _BINARY:
            return Decimal(number) * _BINARY[suffix]
        return Decimal(number) * Decimal(_DECIMAL[suffix])
    except (InvalidOperation, KeyError):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)") from None


def reserved_env(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def reserved_volume(name: str) -> bool:
    return name in RESERVED_VOLUME_NAMES or name.startswith(RESERVED_VOLUME_PREFIX)


def reserved_mount_path(path: str) -> bool:
    return (path.rstrip("/") or "/") in RESERVED_MOUNT_PATHS


class KeySelector(ApiModel):
    """One key of a Secret or ConfigMap in the StreamingTable's namespace."""

    name: str = Field(
        description="Name of the Secret or ConfigMap.",
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
    )
    key: str = Field(description="The key.", min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)
    optional: bool | None = Field(default=None, description="Start the pod even when the key is missing.")


class FieldSelector(ApiModel):
    """A field of the pod (Kubernetes' downward API)."""

    field_path: str = Field(
        description="e.g. metadata.name, metadata.labels['x'], spec.nodeName, status.hostIP.",
        min_length=1,
        max_length=256,
    )
    api_version: str | None = Field(default=None, description="Version of fieldPath's schema; default v1.")


class ResourceFieldSelector(ApiModel):
    """A resource request or limit of the container (Kubernetes' downward API)."""

    resource: str = Field(
        description="e.g. limits.memory, requests.cpu.",
        min_length=1,
        max_length=256,
        pattern=r"^(limits|requests)\.[A-Za-z0-9./_-]+$",
    )
    container_name: str | None = Field(
        default=None,
        description="Default: the container itself.",
        max_length=63,
        pattern=DNS1123_LABEL_PATTERN,
    )
    divisor: Quantity | None = Field(default=None, description="Unit of the value, e.g. 1Mi; default 1.")


class EnvVarSource(ApiModel):
    """Where an env var's value comes from: exactly one of the four."""

    secret_key_ref: KeySelector | None = Field(
        default=None, description="A key of a Secret: how to pass credentials (never inline in value)."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A resource request or limit of the container."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        given = [name for name, value in self if value is not None]
        if len(given) != 1:
            problems = ProblemCollector()
            problems.add((), "set exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef")
            problems.raise_if_any()
        return self


class EnvVar(ApiModel):
    """An extra env var of the pod's container."""

    name: str = Field(
        description=(
            "Variable name. Names the operator sets are refused: ICEFALL_SPARK_CONF, HOME, and those "
            "starting with ICEFALL_POD_, ICEFALL_KAFKA_, ICEFALL_CATALOG_ or ICEFALL_REGISTRY_."
        ),
        min_length=1,
        max_length=256,
        pattern=ENV_NAME_PATTERN,
    )
    value: str | None = Field(
        default=None,
        max_length=32768,
        description="The value, as written (may use $(VAR) of earlier variables). Never a secret: use "
        "valueFrom.secretKeyRef.",
    )
    value_from: EnvVarSource | None = Field(default=None, description="Where the value comes from instead.")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if reserved_env(name):
            raise ValueError(
                f"{name} is set by the operator; pick another name (not ICEFALL_SPARK_CONF, HOME, or "
                "ICEFALL_POD_*, ICEFALL_KAFKA_*, ICEFALL_CATALOG_*, ICEFALL_REGISTRY_*)"
            )
        return name

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            problems = ProblemCollector()
            problems.add(("valueFrom",), "set value or valueFrom, not both")
            problems.raise_if_any()
        return self


class Volume(ApiModel):
    """An extra volume: `name` plus one Kubernetes volume source, written as in a pod (e.g.
    `secret: {secretName: certs}`, `configMap: {name: x}`, `emptyDir: {}`, `persistentVolumeClaim:
    {claimName: x}`, `csi: {...}`). The source is kept as written and checked by the API server when the pod
    is created (a full schema of every volume source would not fit the CRD)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(
        description=(
            "Volume name, referenced by volumeMounts. tmp, spark-local, executor-template and names starting "
            "with spark- are the operator's and Spark's."
        ),
        min_length=1,
        max_length=63,
        pattern=DNS1123_LABEL_PATTERN,
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if reserved_volume(name):
            raise ValueError(
                f"{name!r} is a volume of the operator or of Spark; pick another name (not tmp, spark-local, "
                "executor-template or spark-*)"
            )
        return name

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        extra = self.model_extra or {}
        if len(extra) != 1 or not all(isinstance(source, dict) for source in extra.values()):
            problems = ProblemCollector()
            problems.add(
                (),
                "a volume needs its name and exactly one source object (e.g. secret: {secretName: x}), "
                f"got {sorted(extra) or 'none'}",
            )
            problems.raise_if_any()
        return self


class VolumeMount(ApiModel):
    """Where a volume appears in the container."""

    name: str = Field(
        description="A volume of this template (common or the same role).",
        min_length=1,
        max_length=63,
        pattern=DNS1123_LABEL_PATTERN,
    )
    mount_path: str = Field(
        description=(
            "Absolute path in the container. /tmp, /var/data/spark-local, /etc/icefall/spark and "
            "/opt/spark/conf are the operator's and Spark's."
        ),
        min_length=2,
        max_length=1024,
        pattern=MOUNT_PATH_PATTERN,
    )
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: str | None = Field(
        default=None, description="A path inside the volume to mount instead of its root.", max_length=1024
    )

    @field_validator("mount_path")
    @classmethod
    def _not_reserved(cls, path: str) -> str:
        if reserved_mount_path(path):
            raise ValueError(
                f"{path} is where the operator or Spark mounts its own volume; mount elsewhere (not /tmp, "
                "/var/data/spark-local, /etc/icefall/spark or /opt/spark/conf)"
            )
        return path


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(ApiModel):
    """Lets the pod run on nodes with a matching taint (as in a pod spec)."""

    key: str | None = Field(
        default=None,
        description="Taint key; empty with operator Exists: every taint.",
        max_length=317,
        pattern=QUALIFIED_NAME_PATTERN,
    )
    operator: TolerationOperator | None = Field(default=None, description="Exists or Equal (default).")
    value: str | None = Field(default=None, description="Taint value, with Equal.", max_length=63)
    effect: TaintEffect | None = Field(
        default=None, description="NoSchedule, PreferNoSchedule or NoExecute; empty: all."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="With NoExecute: how long the pod stays after the taint appears."
    )


class Affinity(ApiModel):
    """Node and pod (anti-)affinity, each written as in a pod spec. The terms are kept as written and
    checked by the API server when the pod is created (their schema is larger than the rest of the CRD)."""

    node_affinity: dict[str, Any] | None = Field(
        default=None, description="Kubernetes NodeAffinity (requiredDuringScheduling..., preferred...)."
    )
    pod_affinity: dict[str, Any] | None = Field(default=None, description="Kubernetes PodAffinity.")
    pod_anti_affinity: dict[str, Any] | None = Field(
        default=None, description="Kubernetes PodAntiAffinity, e.g. to spread a table's pods over nodes."
    )


class ImagePullSecret(ApiModel):
    """A Secret of type kubernetes.io/dockerconfigjson in the StreamingTable's namespace."""

    name: str = Field(
        description="Name of the Secret.", min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN
    )


class ResourceRequirements(ApiModel):
    """Container resources: resource name (cpu, memory, ephemeral-storage, nvidia.com/gpu, ...) → quantity
    (quote plain numbers in YAML: "2"). For executors, cpu and memory become Spark settings: see
    `spec.pods.executor`."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="What the scheduler reserves, e.g. {cpu: 500m, memory: 2Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="The most the container may use, e.g. {memory: 2Gi}."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ResourceRequirements:
        problems = ProblemCollector()
        for part in ("requests", "limits"):
            for name in getattr(self, part):
                if not re.fullmatch(QUALIFIED_NAME_PATTERN, name) or len(name) > 317:
                    problems.add((part, name), "not a resource name (cpu, memory, vendor.com/name, ...)")
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                problems.add(("requests", name), f"{request} is more than limits.{name} ({limit}); lower it")
        problems.raise_if_any()
        return self


class PodTemplate(ApiModel):
    """What to add to one kind of pod. Unset fields inherit from the layer below (see `PodTemplates`)."""

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        description="Extra pod labels. The operator's own (app.kubernetes.io/name, instance, component, "
        "managed-by, icefall.dev/*) cannot be set.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Extra pod annotations; keys under icefall.dev/ are the operator's."
    )
    service_account_annotations: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Annotations of the table's ServiceAccounts (driver: icefall-<name>-driver, also used by the "
            "executors; compaction: icefall-<name>-compact), e.g. eks.amazonaws.com/role-arn (IRSA) or "
            "iam.gke.io/gcp-service-account (GKE Workload Identity). Not in executor."
        ),
    )
    image_pull_secrets: list[ImagePullSecret] = Field(
        default_factory=list, max_length=16, description="Secrets to pull the image with."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pod must run on, e.g. {pool: ingest}."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_TOLERATIONS, description="Taints the pod tolerates."
    )
    affinity: Affinity | None = Field(
        default=None,
        description=(
            "Node and pod (anti-)affinity, as in a pod spec. The terms are kept as written and checked by "
            "the API server when the pod is created."
        ),
    )
    priority_class_name: str | None = Field(
        default=None,
        description="PriorityClass of the pod.",
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN_PATTERN,
    )
    host_network: bool | None = Field(
        default=None,
        description=(
            "Run in the node's network namespace (with dnsPolicy ClusterFirstWithHostNet), where pod "
            "networks are unavailable. Spark then picks free ports, and the metrics port is derived from "
            "the table within the operator's host-network port range (a pod that would collide on a node "
            "is not scheduled there). Default false."
        ),
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description="Container resources, merged per resource name over the layer below (operator "
        "defaults: driver 1 CPU / 2Gi, compaction 500m / 2Gi; executors: the operator's Spark settings).",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Extra env vars; one with the name of an inherited one replaces it.",
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="Extra volumes; one with the name of an inherited one replaces it.",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="Where the container mounts volumes; one at the path of an inherited one replaces it.",
    )

    @model_validator(mode="after")
    def _keys(self) -> PodTemplate:
        problems = ProblemCollector()
        for part in ("labels", "annotations", "serviceAccountAnnotations", "nodeSelector"):
            for key in getattr(self, _snake(part)):
                if not re.fullmatch(QUALIFIED_NAME_PATTERN, key) or len(key) > 317:
                    problems.add((part, key), "not a key: [dns.prefix/]name of letters, digits, -, _, .")
                elif _operator_key(part, key):
                    problems.add((part, key), f"{key} is set by the operator; use another key")
        problems.extend((), _duplicates(self))
        problems.raise_if_any()
        return self


def _operator_key(part: str, key: str) -> bool:
    if part == "nodeSelector":
        return False
    return key.startswith(RESERVED_PREFIX) or (part == "labels" and key in RESERVED_LABELS)


def _snake(camel: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), camel)


def _duplicates(template: PodTemplate) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    for part, items, key in (
        ("env", template.env, "name"),
        ("volumes", template.volumes, "name"),
        ("volumeMounts", template.volume_mounts, "mount_path"),
        ("imagePullSecrets", template.image_pull_secrets, "name"),
    ):
        seen: set[str] = set()
        for i, item in enumerate(items):
            value = getattr(item, key)
            if value in seen:
                out.append(((part, i), f"{value} appears twice; keep one"))
            seen.add(value)
    return out


ROLES = ("driver", "executor", "compaction")


class PodTemplates(ApiModel):
    """Additions to the pods the operator runs for this table, over the operator's defaults (Helm values
    `pods`). Layers, lowest first: the operator's built-in resources, the chart's common then role part,
    this table's common then role part. Maps (labels, annotations, nodeSelector, resources per resource
    name, affinity per kind) merge, a higher layer winning per key; lists append, except that an env var,
    volume or image pull secret with the name of an inherited one, or a mount at its path, replaces it;
    tolerations append; priorityClassName and hostNetwork are replaced. A resource request inherited above
    a limit set higher up is lowered to that limit."""

    common: PodTemplate = Field(default_factory=PodTemplate, description="Applies to every pod of the table.")
    driver: PodTemplate = Field(
        default_factory=PodTemplate, description="The ingestion driver pod (<name>-ingest); wins over common."
    )
    executor: PodTemplate = Field(
        default_factory=PodTemplate,
        description=(
            "Spark's executor pods (Kubernetes Spark master only), through their pod template; wins over "
            "common. Spark sets the executors' cpu and memory itself: requests.cpu and limits.cpu become "
            "spark.kubernetes.executor.request.cores and limit.cores; memory (the limit, else the request; "
            "at least 896Mi) becomes the executor's heap plus overhead (max(384Mi, 10%)), which Spark "
            "sets as request and limit. Other resources (ephemeral-storage, GPUs) go to the container as "
            "written. Executors use the driver's ServiceAccount: no serviceAccountAnnotations here."
        ),
    )
    compaction: PodTemplate = Field(
        default_factory=PodTemplate,
        description="The compaction Deployment's pods (<name>-compact); wins over common.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> PodTemplates:
        problems = ProblemCollector()
        if self.executor.service_account_annotations:
            problems.add(
                ("executor", "serviceAccountAnnotations"),
                "executors run as the driver's ServiceAccount; set these in driver (or common) instead",
            )
        problems.extend(("executor", "resources"), executor_memory_problems(self.executor.resources))
        for role in ("common", *ROLES):
            template: PodTemplate = getattr(self, role)
            known = {v.name for v in (*self.common.volumes, *template.volumes)}
            for i, mount in enumerate(template.volume_mounts):
                if mount.name not in known:
                    where = "common.volumes" if role == "common" else f"common.volumes or {role}.volumes"
                    problems.add(
                        (role, "volumeMounts", i, "name"),
                        f"no volume {mount.name!r}; add it to {where}, or fix the name",
                    )
        problems.raise_if_any()
        return self

    def role(self, role: str) -> PodTemplate:
        """The part for `role` (driver, executor or compaction)."""
        if role not in ROLES:
            raise ValueError(f"unknown pod role {role!r}; one of {', '.join(ROLES)}")
        template: PodTemplate = getattr(self, role)
        return template


#: The least executor memory: Spark needs a heap of at least ~450 MiB; overhead is at least 384 MiB.
MIN_EXECUTOR_MEMORY_MIB = 896


def executor_memory_problems(resources: ResourceRequirements | None) -> list[tuple[Loc, str]]:
    """Spark gives executors one memory figure (the limit, else the request) of at least
    `MIN_EXECUTOR_MEMORY_MIB`; paths relative to `resources`."""
    if resources is None:
        return []
    part = "limits" if "memory" in resources.limits else "requests"
    given = getattr(resources, part).get("memory")
    if given is None or parse_quantity(given) >= MIN_EXECUTOR_MEMORY_MIB * 2**20:
        return []
    return [
        (
            (part, "memory"),
            f"{given} is too little for a Spark executor; give at least {MIN_EXECUTOR_MEMORY_MIB}Mi",
        )
    ]
