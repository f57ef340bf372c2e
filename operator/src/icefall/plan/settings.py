"""The operator's settings: cluster-wide choices of whoever runs the operator (the Helm chart's values,
passed as `ICEFALL_*` env vars), applied to every table. Pure: parsing only, no I/O.

Guarantees: `OperatorSettings.from_environ` reads exactly the variables of `SETTINGS_ENV`, and a value
that does not parse or validate raises a ValueError naming its variable (never echoing a JSON document).
Not guaranteed: that the chart sets every variable (tests/integration/test_chart.py checks it renders them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from icefall.api import (
    ManifestError,
    PodTemplate,
    PodTemplates,
    ResourceRequirements,
    pod_templates_from_object,
)

Manifest = dict[str, Any]

#: `local`, `local[N]` or `local[*]`: Spark inside the driver pod.
LOCAL_MASTER = re.compile(r"^local(\[(\*|[1-9][0-9]{0,2})\])?$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


# --- operator settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """Container resources; `None` leaves that request or limit unset."""

    cpu_request: str | None = None
    memory_request: str | None = None
    cpu_limit: str | None = None
    memory_limit: str | None = None

    def manifest(self) -> Manifest:
        requests = {k: v for k, v in (("cpu", self.cpu_request), ("memory", self.memory_request)) if v}
        limits = {k: v for k, v in (("cpu", self.cpu_limit), ("memory", self.memory_limit)) if v}
        return {**({"requests": requests} if requests else {}), **({"limits": limits} if limits else {})}

    def template(self) -> PodTemplate:
        """These resources as the lowest layer of a pod template (`icefall.plan.pods.effective`)."""
        return PodTemplate(resources=ResourceRequirements.model_validate(self.manifest()))


@dataclass(frozen=True)
class OperatorSettings:
    """Cluster-wide choices of whoever runs the operator (Helm values), applied to every table.

    Changing any of them changes every table's spec hash, so drivers roll once to pick them up.
    """

    #: `kubernetes` (Spark on Kubernetes, executors as pods) or `local`, `local[N]`, `local[*]` (Spark
    #: inside the driver pod; for small clusters). A table may override it with `icefall.dev/spark-master`.
    spark_master: str = "kubernetes"
    image_pull_policy: str = "IfNotPresent"
    run_as_user: int = 10001  # the image's `icefall` user (spark_images/Dockerfile)
    run_as_group: int = 10001
    driver_resources: Resources = Resources("1", "2Gi", None, "2Gi")
    #: JVM heap of the driver (`spark.driver.memory`); must leave room for Python in the container.
    driver_jvm_memory: str = "1g"
    executor_cores: int = 1
    executor_memory: str = "2g"
    executor_request_cores: str | None = None
    executor_limit_cores: str | None = None
    min_executors: int = 0
    max_executors: int = 4
    executor_idle_timeout_seconds: int = 60
    compaction_resources: Resources = Resources("500m", "2Gi", None, "2Gi")
    tmp_size_limit: str = "1Gi"
    spark_local_size_limit: str = "16Gi"
    termination_grace_period_seconds: int = 60
    #: What every table's pods get (the chart's `pods`), under each table's own `spec.pods`.
    pod_template: PodTemplates = field(default_factory=PodTemplates)
    #: Where host-network pods' metrics ports are drawn from (inclusive; `icefall.plan.pods`).
    host_network_ports: tuple[int, int] = (20000, 29999)
    #: Render each table's NetworkPolicy (`icefall.plan.isolation`; the chart's `networkPolicy.enabled`).
    network_policy: bool = True
    #: The namespace whose pods may scrape the table pods' `metrics` port ("": none may).
    metrics_namespace: str = "monitoring"
    #: Let table pods fall back to the node's AWS instance role (the chart's
    #: `cloudIdentity.allowNodeIdentity`). Off: every table pod runs with `AWS_EC2_METADATA_DISABLED=true`
    #: (`icefall.plan.env.NODE_IDENTITY_OFF`), so a table without keys or a pod identity of its own cannot
    #: borrow the node's credentials.
    allow_node_identity: bool = False

    def __post_init__(self) -> None:
        if self.spark_master != "kubernetes" and not LOCAL_MASTER.match(self.spark_master):
            raise ValueError(
                f"spark_master {self.spark_master!r}: use kubernetes, local, local[N] or local[*]"
            )
        if not 0 <= self.min_executors <= self.max_executors or self.max_executors < 1:
            raise ValueError(
                f"executors: need 0 <= min ({self.min_executors}) <= max ({self.max_executors}), max >= 1"
            )
        if self.executor_cores < 1 or self.termination_grace_period_seconds < 0:
            raise ValueError("executor_cores must be >= 1 and termination_grace_period_seconds >= 0")
        if self.metrics_namespace and not _NAMESPACE.match(self.metrics_namespace):
            raise ValueError(f"metrics_namespace {self.metrics_namespace!r}: not a namespace name")
        first, last = self.host_network_ports
        if not 1024 <= first < last <= 65535:
            raise ValueError(
                f"host_network_ports {first}-{last}: need 1024 <= first < last <= 65535 (two ports at least: "
                "a table's driver and compaction pods each get one)"
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> OperatorSettings:
        """The settings the operator's environment gives (`SETTINGS_ENV`, set by the Helm chart's values);
        defaults for the rest. A value that does not parse names its variable."""
        values: dict[str, Any] = {}
        for name, variable in SETTINGS_ENV.items():
            raw = environ.get(variable)
            if raw is None or raw == "":
                continue
            parse = _SETTINGS_PARSERS.get(name, str)
            try:
                values[name] = parse(raw)
            except ValueError as error:
                shown = variable if name == "pod_template" else f"{variable}={raw!r}"  # not a JSON document
                raise ValueError(f"{shown}: {error}") from None
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"operator settings from the environment: {error}") from None


def _whole_number(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("expected a whole number") from None


def _boolean(raw: str) -> bool:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ValueError("expected true or false")


def _port_range(raw: str) -> tuple[int, int]:
    first, dash, last = raw.partition("-")
    try:
        if dash:
            return int(first), int(last)
    except ValueError:
        pass
    raise ValueError("expected a port range FIRST-LAST, e.g. 20000-29999")


def _pod_template(raw: str) -> PodTemplates:
    """JSON of the shape of `spec.pods` (the chart's `pods`), validated like a table's."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error}); give an object like the chart's pods value") from None
    try:
        return pod_templates_from_object(data, origin="the chart's pods")
    except ManifestError as error:
        raise ValueError("; ".join(map(str, error.problems))) from None


#: OperatorSettings field → the operator's environment variable that sets it (charts/icefall: `spark.*`,
#: `pods`, `hostNetworkPorts`, `networkPolicy`,
#: `cloudIdentity.allowNodeIdentity`).
SETTINGS_ENV = {
    "spark_master": "ICEFALL_SPARK_MASTER",
    "image_pull_policy": "ICEFALL_IMAGE_PULL_POLICY",
    "driver_jvm_memory": "ICEFALL_DRIVER_JVM_MEMORY",
    "executor_cores": "ICEFALL_EXECUTOR_CORES",
    "executor_memory": "ICEFALL_EXECUTOR_MEMORY",
    "min_executors": "ICEFALL_MIN_EXECUTORS",
    "max_executors": "ICEFALL_MAX_EXECUTORS",
    "executor_idle_timeout_seconds": "ICEFALL_EXECUTOR_IDLE_TIMEOUT_SECONDS",
    "pod_template": "ICEFALL_POD_TEMPLATE",
    "host_network_ports": "ICEFALL_HOST_NETWORK_PORTS",
    "network_policy": "ICEFALL_NETWORK_POLICY",
    "metrics_namespace": "ICEFALL_METRICS_NAMESPACE",
    "allow_node_identity": "ICEFALL_ALLOW_NODE_IDENTITY",
}
#: How a variable's text becomes the field's value (str when not listed); a ValueError says what is wrong.
_SETTINGS_PARSERS: dict[str, Callable[[str], Any]] = {
    "executor_cores": _whole_number,
    "min_executors": _whole_number,
    "max_executors": _whole_number,
    "executor_idle_timeout_seconds": _whole_number,
    "pod_template": _pod_template,
    "host_network_ports": _port_range,
    "network_policy": _boolean,
    "allow_node_identity": _boolean,
}
