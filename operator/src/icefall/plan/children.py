"""The Kubernetes objects a StreamingTable owns, as plain manifests (dicts). Pure: no client, no I/O.

`desired_children` turns a StreamingTable, the operator's settings and the image into:

| object | name | purpose |
|---|---|---|
| ServiceAccount, Role, RoleBinding | `icefall-<st>-driver` | the driver: its executors, its commit Lease |
| ServiceAccount, Role, RoleBinding | `icefall-<st>-compact` | the compaction pods: the commit Lease |
| ConfigMap | `<st>-ingest-executor` | pod template for Spark executors (Kubernetes master only) |
| Pod | `<st>-ingest` | the PySpark driver running `icefall ingest` (absent while suspended) |
| Deployment | `<st>-compact` | compaction pods running `icefall compact` (0 replicas while suspended) |

Guarantees:
- Deterministic: the same inputs give the same manifests, byte for byte once serialised with sorted keys.
  Names are at most 63 characters (a hash of the table name replaces its tail when needed).
- Every child carries the `app.kubernetes.io/*` labels, `icefall.dev/streamingtable`, the submission id
  `icefall.dev/spec-hash`, and a controller owner reference to the StreamingTable (blockOwnerDeletion).
- `icefall.dev/spec-hash` (`spec_hash`) changes exactly when something the driver is built from changes:
  the spec minus the fields listed in `NON_RESTART_FIELDS`, the image, the operator settings, the Spark
  master, and the `icefall.dev/restart` annotation. Status, labels, other annotations, `spec.suspend` and
  `spec.deletionPolicy` never change it. A spec field added later restarts the driver by default (the
  list names what does *not* restart, so forgetting it is the safe mistake); fields at their defaults are
  left out, so an operator upgrade that adds a defaulted field does not roll every driver.
- No secret value is ever in a manifest: credentials reach the pods only as `secretKeyRef` env vars
  (`secret_env_vars` names them), and no free-form spec value (consumer or catalog properties, URIs,
  transforms) is copied into any manifest: the entry points read the StreamingTable from the API. The one
  exception is `spec.pods` (and the operator's chart-wide `pods`), which is pod content by definition:
  its env values, labels, annotations, volumes and scheduling go to the pods as written (`icefall.plan.pods`
  merges the layers and applies them after the operator's own, which they cannot replace).
- Pods satisfy the `restricted` Pod Security Standard: non-root, RuntimeDefault seccomp, no privilege
  escalation, all capabilities dropped, read-only root filesystem with emptyDirs for /tmp and Spark's
  local directories. Spark executors get the same through the pod template ConfigMap. A pod template that
  asks for `hostNetwork` (or a volume type such as hostPath) leaves the standard, as the cluster allows.
- Each of the driver, executor and compaction pods gets its role's effective pod template; the driver's
  and compaction's ServiceAccounts get its `serviceAccountAnnotations` (executors run as the driver's).
- RBAC is namespaced and minimal; see `driver_rules` and `compaction_rules` for what and why.

Not guaranteed: that the referenced Secrets exist (a missing one keeps the pod in CreateContainerConfigError,
which the driver state machine reports), and that rotating a Secret's value restarts anything (set the
`icefall.dev/restart` annotation to a new value for that). `SecretRef.env` references cannot be honoured in a
cluster; they are reported in `Children.problems` and left out.

Spark master: the driver runs Spark on Kubernetes (`k8s://https://kubernetes.default.svc`, dynamic
allocation, executors from the same image) unless the operator setting `spark_master` or, per table, the
annotation `icefall.dev/spark-master` says `local`, `local[N]` or `local[*]`: then Spark runs inside the
driver pod only, no executor RBAC or pod template is created, and nothing else changes. An annotation (not
a spec field) because where Spark runs is a placement choice of whoever operates the cluster, not part of
the table's contract, and it keeps the v1alpha1 API free of a field we may want to shape differently later.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from icefall.api import (
    API_VERSION,
    KIND,
    PodTemplate,
    PodTemplates,
    Problem,
    ResourceRequirements,
    SecretRef,
    StreamingTable,
    StreamingTableSpec,
)
from icefall.plan import pods
from icefall.plan.leases import commit_lease_name, rewrite_yield_name
from icefall.plan.settings import LOCAL_MASTER, OperatorSettings, Resources

Manifest = dict[str, Any]

# --- labels, annotations, names ---------------------------------------------------------------------------

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_STREAMINGTABLE = "icefall.dev/streamingtable"
LABEL_SPEC_HASH = "icefall.dev/spec-hash"
APP_NAME = "icefall"
MANAGED_BY = "icefall-operator"
COMPONENT_INGEST = "ingest"
COMPONENT_COMPACT = "compact"

#: The generation of the StreamingTable a child was rendered from (intent, recorded before launching).
ANNOTATION_GENERATION = "icefall.dev/generation"
#: Per-table Spark master override: `kubernetes`, `local`, `local[N]` or `local[*]`.
ANNOTATION_SPARK_MASTER = "icefall.dev/spark-master"
#: Any new value restarts the driver and the compaction pods (like `kubectl rollout restart`).
ANNOTATION_RESTART = "icefall.dev/restart"

MAX_NAME_LENGTH = 63

# --- the entry points and their environment ---------------------------------------------------------------

#: The port the driver and compaction pods serve Prometheus metrics on, named `metrics` in their containers
#: (the chart's PodMonitor scrapes that name). On the host network each table's pods get their own port
#: instead (`icefall.plan.pods.host_network_port`); `command` passes it as `--metrics-port`.
POD_METRICS_PORT = 9090
#: The driver's command; `{namespace}` and `{name}` name the StreamingTable it reads from the API.
INGEST_COMMAND: tuple[str, ...] = ("icefall", "ingest", "--namespace", "{namespace}", "--name", "{name}")
#: The compaction pods' command.
COMPACT_COMMAND: tuple[str, ...] = ("icefall", "compact", "--namespace", "{namespace}", "--name", "{name}")

#: JSON object of Spark configuration (str → str) the entry point passes to its SparkSession; it holds
#: `$(ICEFALL_POD_NAME)` / `$(ICEFALL_POD_IP)` references that the kubelet expands.
ENV_SPARK_CONF = "ICEFALL_SPARK_CONF"
ENV_POD_NAME = "ICEFALL_POD_NAME"
ENV_POD_NAMESPACE = "ICEFALL_POD_NAMESPACE"
ENV_POD_IP = "ICEFALL_POD_IP"

KUBERNETES_MASTER = "k8s://https://kubernetes.default.svc"
SPARK_LOCAL_DIR = "/var/data/spark-local"
TMP_DIR = "/tmp"
EXECUTOR_TEMPLATE_DIR = "/etc/icefall/spark"
EXECUTOR_TEMPLATE_KEY = "executor-pod-template.json"
EXECUTOR_CONTAINER = "spark-kubernetes-executor"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079

#: Spec fields whose change must NOT restart the driver. Everything else does (safe by default).
NON_RESTART_FIELDS = frozenset({"suspend", "deletion_policy"})


def child_name(prefix: str, table: str, suffix: str) -> str:
    """`<prefix><table><suffix>`, at most 63 characters: a long table name keeps its head plus a hash."""
    name = f"{prefix}{table}{suffix}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = _digest(table)[:8]
    room = MAX_NAME_LENGTH - len(prefix) - len(suffix) - len(digest) - 1
    if room < 1:
        raise ValueError(f"no room for a table name in {prefix!r}...{suffix!r}")
    return f"{prefix}{table[:room].rstrip('-.')}-{digest}{suffix}"


def driver_pod_name(table: str) -> str:
    return child_name("", table, "-ingest")


def executor_template_name(table: str) -> str:
    return child_name("", table, "-ingest-executor")


def compaction_name(table: str) -> str:
    return child_name("", table, "-compact")


def driver_account_name(table: str) -> str:
    """Name of the driver's ServiceAccount, Role and RoleBinding."""
    return child_name("icefall-", table, "-driver")


def compaction_account_name(table: str) -> str:
    """Name of the compaction pods' ServiceAccount, Role and RoleBinding."""
    return child_name("icefall-", table, "-compact")


def command(template: Sequence[str], *, namespace: str, name: str, metrics_port: int) -> list[str]:
    """The entry point's command line for this table, serving metrics on `metrics_port`."""
    return [
        *(part.format(namespace=namespace, name=name) for part in template),
        f"--metrics-port={metrics_port}",
    ]


def _metrics_port(port: int, *, host_network: bool) -> Manifest:
    """The `metrics` port; on the host network also the node's port (which the API server would default)."""
    return {
        "name": "metrics",
        "containerPort": port,
        "protocol": "TCP",
        **({"hostPort": port} if host_network else {}),
    }


# --- secrets ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretEnv:
    """One credential handed to a pod: env var `name` from key `key` of Secret `secret`."""

    path: str  # the spec field, e.g. spec.source.security.password
    name: str
    secret: str
    key: str

    def manifest(self) -> Manifest:
        return {"name": self.name, "valueFrom": {"secretKeyRef": {"name": self.secret, "key": self.key}}}


_KAFKA_SECRET_FIELDS = ("username", "password", "ca_cert", "client_cert", "client_key")


def kafka_secret_env_name(attr: str) -> str:
    """The env var carrying `spec.source.security.<attr>` (snake_case attribute) in the operator's pods."""
    return f"ICEFALL_KAFKA_{attr.upper()}"


def registry_secret_env_name(attr: str) -> str:
    """The env var carrying `spec.format.registry.<attr>` (username, password) in the operator's pods."""
    return f"ICEFALL_REGISTRY_{attr.upper()}"


def secret_env_vars(spec: StreamingTableSpec) -> tuple[list[SecretEnv], list[SecretEnv], list[Problem]]:
    """Env vars carrying the spec's secret references: (Kafka and schema registry ones, catalog ones,
    problems).

    The entry points call this with the spec they read, so both sides agree on the names:
    `ICEFALL_KAFKA_<FIELD>` for `spec.source.security.<field>`, `ICEFALL_REGISTRY_<FIELD>` for
    `spec.format.registry.<field>` (the ingestion driver's, with the Kafka ones) and
    `ICEFALL_CATALOG_<KEY>` for `spec.table.catalog.secretProperties[<key>]` (non-alphanumerics become
    `_`; keys that collide after that all get a hash suffix). `env` references are problems: only
    `icefall run` can honour them.
    """
    problems: list[Problem] = []
    kafka: list[SecretEnv] = []
    security = spec.source.security
    for attr in _KAFKA_SECRET_FIELDS:
        ref: SecretRef | None = getattr(security, attr)
        path = f"spec.source.security.{_camel(attr)}"
        if ref is not None:
            env = _secret_env(ref, path, kafka_secret_env_name(attr), problems)
            if env is not None:
                kafka.append(env)
    registry = spec.format.registry
    for attr in ("username", "password"):
        registry_ref: SecretRef | None = getattr(registry, attr) if registry is not None else None
        if registry_ref is not None:
            path = f"spec.format.registry.{attr}"
            env = _secret_env(registry_ref, path, registry_secret_env_name(attr), problems)
            if env is not None:
                kafka.append(env)
    catalog: list[SecretEnv] = []
    if spec.table.catalog is not None:
        properties = spec.table.catalog.secret_properties
        plain = {key: re.sub(r"[^A-Za-z0-9]", "_", key).upper() for key in properties}
        seen: dict[str, int] = {}
        for slug in plain.values():
            seen[slug] = seen.get(slug, 0) + 1
        for key in sorted(properties):
            slug = plain[key] if seen[plain[key]] == 1 else f"{plain[key]}_{_digest(key)[:6].upper()}"
            path = f"spec.table.catalog.secretProperties[{key}]"
            env = _secret_env(properties[key], path, f"ICEFALL_CATALOG_{slug}", problems)
            if env is not None:
                catalog.append(env)
    return kafka, catalog, problems


def _secret_env(ref: SecretRef, path: str, name: str, problems: list[Problem]) -> SecretEnv | None:
    if ref.secret_key_ref is None:
        problems.append(
            Problem(
                path,
                f"env reference {ref.env!r} works only with `icefall run`; in a cluster reference a Secret: "
                "{secretKeyRef: {name: <secret>, key: <key>}}",
            )
        )
        return None
    return SecretEnv(path, name, ref.secret_key_ref.name, ref.secret_key_ref.key)


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.title() for part in rest)


# --- the spec hash ----------------------------------------------------------------------------------------


def spark_master(st: StreamingTable, settings: OperatorSettings) -> tuple[str, list[Problem]]:
    """The Spark master URL for this table's driver, and a problem if the annotation cannot be used."""
    wanted = st.metadata.annotations.get(ANNOTATION_SPARK_MASTER, settings.spark_master)
    problems: list[Problem] = []
    if wanted != "kubernetes" and not LOCAL_MASTER.match(wanted):
        problems.append(
            Problem(
                f"metadata.annotations[{ANNOTATION_SPARK_MASTER}]",
                f"{wanted!r} is not a Spark master; use kubernetes, local, local[N] or local[*] "
                f"(using the operator default {settings.spark_master!r})",
            )
        )
        wanted = settings.spark_master
    if wanted == "kubernetes":
        return KUBERNETES_MASTER, problems
    return ("local[*]" if wanted == "local" else wanted), problems


def in_cluster_master(master: str, environ: Mapping[str, str]) -> str:
    """The master the driver process hands Spark: `KUBERNETES_MASTER` becomes the API server's address as
    the kubelet gives every container (`KUBERNETES_SERVICE_HOST`/`_PORT`), which is what Spark documents for
    a client-mode driver inside a pod and needs no cluster DNS; any other master, or no such variables,
    stays as it is."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if master != KUBERNETES_MASTER or not host:
        return master
    address = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return f"k8s://https://{address}:{port or 443}"


def spec_hash(st: StreamingTable, *, image: str, settings: OperatorSettings, master: str) -> str:
    """The submission id: a stable hash of everything a restart of the driver would pick up."""
    restart_worthy = st.spec.model_dump(
        mode="json", by_alias=True, exclude_defaults=True, exclude=set(NON_RESTART_FIELDS)
    )
    payload = {
        "spec": restart_worthy,
        "image": image,
        "master": master,
        "settings": _settings_payload(settings),
        "restart": st.metadata.annotations.get(ANNOTATION_RESTART),
    }
    return _digest(json.dumps(payload, sort_keys=True, separators=(",", ":")))[:16]


def _settings_payload(settings: OperatorSettings) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    for setting in dataclasses.fields(settings):
        value = getattr(settings, setting.name)
        if isinstance(value, PodTemplates):
            value = value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        elif isinstance(value, Resources):
            value = dataclasses.asdict(value)
        payload[setting.name] = value
    return payload


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- RBAC -------------------------------------------------------------------------------------------------


def _lease_rules(lease: str) -> list[Manifest]:
    # `create` is checked before the object (and so its name) exists: RBAC cannot restrict it by name.
    return [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]


def _read_self_rule(name: str) -> Manifest:
    group = API_VERSION.split("/")[0]
    return {"apiGroups": [group], "resources": ["streamingtables"], "resourceNames": [name], "verbs": ["get"]}


def driver_rules(st: StreamingTable, *, executors: bool) -> list[Manifest]:
    """What the ingestion driver may do in its namespace.

    - read its own StreamingTable (the entry point reads the spec from the API);
    - get/update its commit Lease by name, and create Leases (unrestrictable by name);
    - a keyed table's driver: get the table's yield Lease by name (it waits while a rewrite holds it);
    - with executors (Kubernetes master): what Spark's scheduler backend does to executor pods and the
      objects it makes for them: pods (create, watch, label for decommissioning, delete one or by label),
      configmaps (the executor config map), persistentvolumeclaims (on-demand executor volumes) and
      services (Spark's clean-up of services labelled with its app id).
    Nothing cluster-scoped, no Secrets (credentials arrive as env vars), no wildcards.
    """
    rules = [_read_self_rule(st.metadata.name), *_lease_rules(commit_lease_name(st.table_name))]
    if st.spec.key:  # a keyed table's batches wait while a rewrite holds the yield Lease (only read)
        rules.append(
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [rewrite_yield_name(st.table_name)],
                "verbs": ["get"],
            }
        )
    if executors:
        managed = ["create", "get", "list", "delete", "deletecollection"]
        rules += [
            {"apiGroups": [""], "resources": ["pods"], "verbs": [*managed, "watch", "patch"]},
            {
                "apiGroups": [""],
                "resources": ["configmaps", "persistentvolumeclaims", "services"],
                "verbs": managed,
            },
        ]
    return rules


def compaction_rules(st: StreamingTable) -> list[Manifest]:
    """Compaction reads its StreamingTable and claims work items with work Leases.

    Work Leases are named `icefall-<table>-work-<hash of the item>` (`icefall.plan.maintenance.work_key`):
    names not known in advance, so get/update/delete cannot be restricted by resourceNames; they cover the
    Leases of this namespace (delete: a released work Lease is removed, see `Lease.release(forget=True)`).
    The commit Lease rules stay for a worker that must pause ingestion.
    """
    work_leases = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "update", "delete"],
    }
    return [_read_self_rule(st.metadata.name), *_lease_rules(commit_lease_name(st.table_name)), work_leases]


# --- the result -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class Children:
    """What should exist for one StreamingTable.

    - `applied`: server-side apply these, in order (accounts before the pods that use them).
    - `driver_pod`: the driver Pod to create when `icefall.plan.driver.decide` says Create; never applied
      over a running pod (pods are immutable), None while suspended.
    - `absent`: objects that must not exist in this configuration; delete them if found.
    - `problems`: what could not be honoured (Degraded, reason InvalidSpec).
    """

    spec_hash: str
    spark_master: str
    applied: tuple[Manifest, ...]
    driver_pod: Manifest | None
    absent: tuple[ObjectRef, ...] = ()
    problems: tuple[Problem, ...] = field(default=())

    def get(self, kind: str, name: str) -> Manifest:
        """The applied manifest of that kind and name (KeyError if none)."""
        for manifest in (*self.applied, *([self.driver_pod] if self.driver_pod else [])):
            if manifest["kind"] == kind and manifest["metadata"]["name"] == name:
                return manifest
        raise KeyError(f"{kind}/{name}")


@dataclass(frozen=True)
class PodPlan:
    """One role's pods (`icefall.plan.pods` DRIVER, EXECUTOR, COMPACTION): the effective pod template
    (operator defaults, chart, table) and the port its entry point serves metrics on."""

    template: PodTemplate
    metrics_port: int

    @property
    def host_network(self) -> bool:
        return bool(self.template.host_network)


def pod_plans(st: StreamingTable, settings: OperatorSettings, *, namespace: str) -> dict[str, PodPlan]:
    """The effective pod template and metrics port of each role of `st`'s pods."""
    bases = {
        pods.DRIVER: settings.driver_resources.template(),
        pods.EXECUTOR: PodTemplate(),  # executors' cpu and memory come from the Spark settings
        pods.COMPACTION: settings.compaction_resources.template(),
    }
    plans: dict[str, PodPlan] = {}
    for role, base in bases.items():
        template = pods.effective(role, base=base, chart=settings.pod_template, table=st.spec.pods)
        port = POD_METRICS_PORT
        if template.host_network:
            port = pods.host_network_port(namespace, st.metadata.name, role, settings.host_network_ports)
        plans[role] = PodPlan(template, port)
    return plans


def desired_children(
    st: StreamingTable,
    *,
    namespace: str,
    uid: str,
    generation: int,
    image: str,
    operator_settings: OperatorSettings,
    compaction_replicas: int = 0,
) -> Children:
    """Render every child of `st` (see the module docstring). `compaction_replicas` comes from
    `icefall.plan.scaling`; suspend overrides it with 0."""
    if not uid:
        raise ValueError("the StreamingTable's uid is needed for owner references")
    if compaction_replicas < 0:
        raise ValueError(f"compaction_replicas must be >= 0, got {compaction_replicas}")
    settings = operator_settings
    name = st.metadata.name
    master, problems = spark_master(st, settings)
    on_kubernetes = master == KUBERNETES_MASTER
    digest = spec_hash(st, image=image, settings=settings, master=master)
    kafka_env, catalog_env, secret_problems = secret_env_vars(st.spec)
    problems += secret_problems
    plans = pod_plans(st, settings, namespace=namespace)
    executor_conf, executor_problems = pods.executor_spark_conf(plans[pods.EXECUTOR].template)
    if on_kubernetes:
        problems += executor_problems
    r = _Renderer(st, namespace=namespace, uid=uid, generation=generation, digest=digest, settings=settings)

    applied, absent = _accounts_and_executor_template(r, st, plans, on_kubernetes=on_kubernetes)
    template = executor_template_name(name)
    replicas = 0 if st.spec.suspend else compaction_replicas
    applied.append(
        r.compaction(
            compaction_name(name), image=image, account=compaction_account_name(name), replicas=replicas,
            secrets=catalog_env, pod=plans[pods.COMPACTION],
        )
    )  # fmt: skip
    driver = None
    if not st.spec.suspend:
        conf = _driver_spark_conf(
            st, namespace=namespace, master=master, image=image, settings=settings, digest=digest,
            driver_host_network=plans[pods.DRIVER].host_network, executor_conf=executor_conf,
        )  # fmt: skip
        driver = r.driver_pod(
            driver_pod_name(name), image=image, account=driver_account_name(name), spark_conf=conf,
            secrets=[*kafka_env, *catalog_env], template=template if on_kubernetes else None,
            pod=plans[pods.DRIVER],
        )  # fmt: skip
    return Children(
        spec_hash=digest,
        spark_master=master,
        applied=tuple(applied),
        driver_pod=driver,
        absent=tuple(absent),
        problems=tuple(problems),
    )


def _accounts_and_executor_template(
    r: _Renderer, st: StreamingTable, plans: Mapping[str, PodPlan], *, on_kubernetes: bool
) -> tuple[list[Manifest], list[ObjectRef]]:
    """The ServiceAccounts with their RBAC, and the executors' pod template (or that it must be absent)."""
    name = st.metadata.name
    driver_rbac = driver_rules(st, executors=on_kubernetes)
    applied: list[Manifest] = [
        *r.rbac(driver_account_name(name), COMPONENT_INGEST, driver_rbac, plans[pods.DRIVER]),
        *r.rbac(
            compaction_account_name(name), COMPONENT_COMPACT, compaction_rules(st), plans[pods.COMPACTION]
        ),
    ]
    template = executor_template_name(name)
    if on_kubernetes:
        return [*applied, r.executor_template(template, plans[pods.EXECUTOR])], []
    return applied, [ObjectRef("v1", "ConfigMap", template)]


def _driver_spark_conf(
    st: StreamingTable,
    *,
    namespace: str,
    master: str,
    image: str,
    settings: OperatorSettings,
    digest: str,
    driver_host_network: bool,
    executor_conf: Mapping[str, str],
) -> dict[str, str]:
    """Spark configuration of the driver (`ICEFALL_SPARK_CONF`); Kubernetes keys only with that master.
    On the host network the driver fixes no port (see `icefall.plan.pods`); `executor_conf` (from the
    executors' pod template) comes last and wins."""
    conf = {
        "spark.master": master,
        "spark.app.name": f"icefall-{st.metadata.name}",
        "spark.driver.memory": settings.driver_jvm_memory,
        "spark.local.dir": SPARK_LOCAL_DIR,
    }
    if master != KUBERNETES_MASTER:
        return conf
    conf |= _kubernetes_spark_conf(st, namespace=namespace, image=image, settings=settings, digest=digest)
    if not driver_host_network:
        conf |= {
            "spark.driver.port": str(DRIVER_PORT),
            "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        }
    return conf | dict(executor_conf)


def _kubernetes_spark_conf(
    st: StreamingTable, *, namespace: str, image: str, settings: OperatorSettings, digest: str
) -> dict[str, str]:
    name = st.metadata.name
    account = driver_account_name(name)
    executor_labels = {**_labels(name, COMPONENT_INGEST), LABEL_SPEC_HASH: digest}
    conf = {
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.driver.pod.name": f"$({ENV_POD_NAME})",  # executors are owned by the driver pod
        "spark.driver.host": f"$({ENV_POD_IP})",
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.container.image.pullPolicy": settings.image_pull_policy,
        "spark.kubernetes.authenticate.driver.serviceAccountName": account,
        "spark.kubernetes.authenticate.executor.serviceAccountName": account,
        "spark.kubernetes.executor.podNamePrefix": driver_pod_name(name),
        "spark.kubernetes.executor.podTemplateFile": f"{EXECUTOR_TEMPLATE_DIR}/{EXECUTOR_TEMPLATE_KEY}",
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
        "spark.kubernetes.executor.deleteOnTermination": "true",
        "spark.executor.cores": str(settings.executor_cores),
        "spark.executor.memory": settings.executor_memory,
        "spark.dynamicAllocation.enabled": "true",
        # No external shuffle service on Kubernetes: track shuffle files to release executors safely. A
        # batch never reads another batch's shuffle files, yet Spark keeps an executor that holds some
        # forever by default (seen in e2e: idle executors never left); the idle timeout releases them too.
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.timeout": f"{settings.executor_idle_timeout_seconds}s",
        "spark.dynamicAllocation.minExecutors": str(settings.min_executors),
        "spark.dynamicAllocation.initialExecutors": str(settings.min_executors),
        "spark.dynamicAllocation.maxExecutors": str(settings.max_executors),
        "spark.dynamicAllocation.executorIdleTimeout": f"{settings.executor_idle_timeout_seconds}s",
    }
    if settings.executor_request_cores:
        conf["spark.kubernetes.executor.request.cores"] = settings.executor_request_cores
    if settings.executor_limit_cores:
        conf["spark.kubernetes.executor.limit.cores"] = settings.executor_limit_cores
    for key, value in executor_labels.items():
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    return conf


def _labels(name: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_STREAMINGTABLE: name,
    }


def selector_labels(name: str, component: str) -> dict[str, str]:
    """The immutable subset of labels used in selectors (never the spec hash)."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_COMPONENT: component}


def _pod_security_context(settings: OperatorSettings) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_group,
        "fsGroup": settings.run_as_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


_CONTAINER_SECURITY_CONTEXT: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _scratch_volumes(settings: OperatorSettings) -> tuple[list[Manifest], list[Manifest]]:
    volumes = [
        {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size_limit}},
        {"name": "spark-local", "emptyDir": {"sizeLimit": settings.spark_local_size_limit}},
    ]
    mounts = [{"name": "tmp", "mountPath": TMP_DIR}, {"name": "spark-local", "mountPath": SPARK_LOCAL_DIR}]
    return volumes, mounts


def _downward_env() -> list[Manifest]:
    def field_ref(name: str, path: str) -> Manifest:
        return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    return [
        field_ref(ENV_POD_NAME, "metadata.name"),
        field_ref(ENV_POD_NAMESPACE, "metadata.namespace"),
        field_ref(ENV_POD_IP, "status.podIP"),
        {"name": "HOME", "value": TMP_DIR},
    ]


class _Renderer:
    def __init__(
        self,
        st: StreamingTable,
        *,
        namespace: str,
        uid: str,
        generation: int,
        digest: str,
        settings: OperatorSettings,
    ) -> None:
        self.name = st.metadata.name
        self.namespace = namespace
        self.digest = digest
        self.generation = generation
        self.settings = settings
        self.owner = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def labels(self, component: str) -> dict[str, str]:
        return {**_labels(self.name, component), LABEL_SPEC_HASH: self.digest}

    def metadata(self, name: str, component: str) -> Manifest:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": self.labels(component),
            "annotations": {ANNOTATION_GENERATION: str(self.generation)},
            "ownerReferences": [dict(self.owner)],
        }

    def pod_metadata(self, name: str, component: str, template: PodTemplate) -> Manifest:
        """A pod's metadata: the operator's, over the template's labels and annotations."""
        metadata = self.metadata(name, component)
        metadata["labels"] = pods.pod_labels(template, metadata["labels"])
        metadata["annotations"] = pods.pod_annotations(template, metadata["annotations"])
        return metadata

    def rbac(self, name: str, component: str, rules: list[Manifest], pod: PodPlan) -> list[Manifest]:
        account = self.metadata(name, component)
        account["annotations"] = {**pod.template.service_account_annotations, **account["annotations"]}
        return [
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": account,
                # Pods opt in (the driver needs the API; compaction needs the Lease).
                "automountServiceAccountToken": False,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": self.metadata(name, component),
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": self.metadata(name, component),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": self.namespace}],
            },
        ]

    def executor_template(self, name: str, pod: PodPlan) -> Manifest:
        """Spark executors' pod template: the restricted security settings Spark cannot set by conf, and the
        executors' pod template (cpu and memory excepted: Spark sets those from its conf)."""
        template = pod.template
        container: Manifest = {
            "name": EXECUTOR_CONTAINER,
            "securityContext": dict(_CONTAINER_SECURITY_CONTEXT),
            # Executors fetch the driver's added files and jars into their working folder; the root is
            # read-only.
            "workingDir": TMP_DIR,
            "volumeMounts": [{"name": "tmp", "mountPath": TMP_DIR}],
        }
        pods.apply_to_container(container, template, resources=False)
        other = pods.resources_manifest(
            template.resources or ResourceRequirements(), leave_out=("cpu", "memory")
        )
        if other:  # cpu and memory are Spark's (spark.executor.memory, spark.kubernetes.executor.*.cores)
            container["resources"] = other
        spec: Manifest = {
            "automountServiceAccountToken": False,  # executors never call the API
            "enableServiceLinks": False,
            "securityContext": _pod_security_context(self.settings),
            "containers": [container],
            # Spark adds its own emptyDir local dirs (spark-local-dir-*) next to this one.
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": self.settings.tmp_size_limit}}],
        }
        pods.apply_to_pod_spec(spec, template)
        metadata = {
            k: v for k, v in (("labels", template.labels), ("annotations", template.annotations)) if v
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            **({"metadata": metadata} if metadata else {}),
            "spec": spec,
        }
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.metadata(name, COMPONENT_INGEST),
            "data": {EXECUTOR_TEMPLATE_KEY: json.dumps(body, sort_keys=True, indent=2)},
        }

    def container(
        self,
        name: str,
        *,
        image: str,
        args: list[str],
        env: list[Manifest],
        mounts: list[Manifest],
        pod: PodPlan,
    ) -> Manifest:
        """A driver or compaction container: the operator's env and mounts, then the template's; the
        `metrics` port."""
        container: Manifest = {
            "name": name,
            "image": image,
            "imagePullPolicy": self.settings.image_pull_policy,
            "command": args,
            "env": env,
            "resources": {},
            "securityContext": dict(_CONTAINER_SECURITY_CONTEXT),
            "volumeMounts": mounts,
            "ports": [_metrics_port(pod.metrics_port, host_network=pod.host_network)],
        }
        pods.apply_to_container(container, pod.template)
        return container

    def driver_pod(
        self,
        name: str,
        *,
        image: str,
        account: str,
        spark_conf: dict[str, str],
        secrets: list[SecretEnv],
        template: str | None,
        pod: PodPlan,
    ) -> Manifest:
        volumes, mounts = _scratch_volumes(self.settings)
        env = [
            *_downward_env(),  # before ICEFALL_SPARK_CONF: the kubelet expands $(...) from earlier vars only
            {"name": ENV_SPARK_CONF, "value": json.dumps(spark_conf, sort_keys=True, separators=(",", ":"))},
            *(s.manifest() for s in secrets),
        ]
        if template is not None:
            volumes.append({"name": "executor-template", "configMap": {"name": template}})
            mounts.append({"name": "executor-template", "mountPath": EXECUTOR_TEMPLATE_DIR, "readOnly": True})
        args = command(
            INGEST_COMMAND, namespace=self.namespace, name=self.name, metrics_port=pod.metrics_port
        )
        container = self.container("ingest", image=image, args=args, env=env, mounts=mounts, pod=pod)
        if template is not None and not pod.host_network:  # on the host network Spark picks free ports
            container["ports"] += [
                {"name": "spark-driver", "containerPort": DRIVER_PORT, "protocol": "TCP"},
                {"name": "block-manager", "containerPort": BLOCK_MANAGER_PORT, "protocol": "TCP"},
            ]
        spec: Manifest = {
            "serviceAccountName": account,
            "automountServiceAccountToken": True,  # Spark and the commit Lease use the API
            "enableServiceLinks": False,
            # The operator restarts a failed driver itself, with backoff (icefall.plan.driver).
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": self.settings.termination_grace_period_seconds,
            "securityContext": _pod_security_context(self.settings),
            "containers": [container],
            "volumes": volumes,
        }
        pods.apply_to_pod_spec(spec, pod.template)
        metadata = self.pod_metadata(name, COMPONENT_INGEST, pod.template)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def compaction(
        self, name: str, *, image: str, account: str, replicas: int, secrets: list[SecretEnv], pod: PodPlan
    ) -> Manifest:
        volumes, mounts = _scratch_volumes(self.settings)
        conf = {"spark.master": "local[*]", "spark.local.dir": SPARK_LOCAL_DIR}
        env = [
            *_downward_env(),
            {"name": ENV_SPARK_CONF, "value": json.dumps(conf, sort_keys=True, separators=(",", ":"))},
            *(s.manifest() for s in secrets),
        ]
        args = command(
            COMPACT_COMMAND, namespace=self.namespace, name=self.name, metrics_port=pod.metrics_port
        )
        container = self.container("compact", image=image, args=args, env=env, mounts=mounts, pod=pod)
        spec: Manifest = {
            "serviceAccountName": account,
            "automountServiceAccountToken": True,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": self.settings.termination_grace_period_seconds,
            "securityContext": _pod_security_context(self.settings),
            "containers": [container],
            "volumes": volumes,
        }
        pods.apply_to_pod_spec(spec, pod.template)
        # The spec hash in the template's labels rolls the pods when the spec changes.
        metadata: Manifest = {"labels": pods.pod_labels(pod.template, self.labels(COMPONENT_COMPACT))}
        if pod.template.annotations:
            metadata["annotations"] = dict(pod.template.annotations)
        deployment: Manifest = {
            "replicas": replicas,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": selector_labels(self.name, COMPONENT_COMPACT)},
            "template": {"metadata": metadata, "spec": spec},
        }
        if pod.host_network:  # a new pod would want the node port the old one holds: replace, then start
            deployment["strategy"] = {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            }
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.metadata(name, COMPONENT_COMPACT),
            "spec": deployment,
        }
