"""The Kubernetes objects a StreamingTable owns, as plain manifests (dicts). Pure: no client, no I/O.

`desired_children` turns a StreamingTable, the operator's settings and the image into (names:
`icefall.plan.names`; each kind rendered by its own module):

| object | name | rendered by | purpose |
|---|---|---|---|
| ServiceAccount, Role, RoleBinding | `icefall-<st>-driver` | `rbac` | the driver and its executors |
| ServiceAccount, Role, RoleBinding | `icefall-<st>-compact` | `rbac` | the compaction pods |
| Lease (commit, yield, work) | `icefall-<table>-<id>-…` | `lease_objects` | the Leases the pods take |
| ConfigMap | `<st>-ingest-executor` | `workloads` | Spark executors' pod template (Kubernetes master only) |
| Pod | `<st>-ingest` | `workloads` | the PySpark driver, `icefall ingest` (absent while suspended) |
| Deployment | `<st>-compact` | `workloads` | `icefall compact` (0 replicas while suspended) |
| Secret | `icefall-<st>-spark-auth` | `isolation` | the Spark RPC secret (Kubernetes master) |
| NetworkPolicy | `icefall-<st>-ingress` | `isolation` | who may reach the table's pods (operator setting) |

Their Spark configuration comes from `icefall.plan.spark_conf`, their credentials from `icefall.plan.env`.

Guarantees:
- Deterministic: the same inputs give the same manifests, byte for byte once serialised with sorted keys.
- Every child carries the metadata of `icefall.plan.metadata` (labels, the submission id, an owner reference).
- `icefall.dev/spec-hash` (`spec_hash`) changes exactly when something the driver is built from changes:
  the spec minus the fields listed in `NON_RESTART_FIELDS`, the image, the operator settings, the Spark
  master, and the `icefall.dev/restart` and `icefall.dev/reset-offsets` annotations (a reset request that
  cannot be read is a problem). Status, labels, other annotations, `spec.suspend` and
  `spec.deletionPolicy` never change it. A spec field added later restarts the driver by default (the
  list names what does *not* restart, so forgetting it is the safe mistake); fields at their defaults are
  left out, so an operator upgrade that adds a defaulted field does not roll every driver.
- No secret value is ever in a manifest (the Spark RPC Secret is rendered without one: the act layer
  creates it with random bytes, `Children.created`), and no free-form spec value (consumer or catalog
  properties, URIs, transforms) is copied into any manifest: the entry points read the StreamingTable from
  the API. The one exception is `spec.pods` (and the operator's chart-wide `pods`), which is pod content
  by definition.

Not guaranteed: that rotating a Secret's value restarts anything (set the `icefall.dev/restart` annotation
to a new value for that). What cannot be honoured (`SecretRef.env` references, an unusable Spark master
annotation, executor memory below Spark's least) is reported in `Children.problems`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from icefall.api import PodTemplates, Problem, StreamingTable
from icefall.plan import isolation, lease_objects, names, pods, rbac, spark_conf, workloads
from icefall.plan.env import secret_env_vars
from icefall.plan.metadata import ChildMeta
from icefall.plan.offset_reset import FIELD as RESET_FIELD
from icefall.plan.offset_reset import reset_request_problem
from icefall.plan.settings import OperatorSettings, Resources
from icefall.plan.workloads import PodPlan

Manifest = dict[str, Any]

#: Any new value restarts the driver and the compaction pods (like `kubectl rollout restart`).
ANNOTATION_RESTART = "icefall.dev/restart"
#: Spec fields whose change must NOT restart the driver. Everything else does (safe by default).
NON_RESTART_FIELDS = frozenset({"suspend", "deletion_policy"})
#: Operator settings whose change must NOT restart the driver (they shape no pod).
NON_RESTART_SETTINGS = frozenset({"network_policy", "metrics_namespace"})


# --- the spec hash ----------------------------------------------------------------------------------------


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
    reset = st.metadata.annotations.get(names.ANNOTATION_RESET_OFFSETS)
    if reset is not None:  # only when set: an operator upgrade must not roll every driver
        payload["resetOffsets"] = reset
    return names.digest(json.dumps(payload, sort_keys=True, separators=(",", ":")))[:16]


def _settings_payload(settings: OperatorSettings) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    for setting in dataclasses.fields(settings):
        if setting.name in NON_RESTART_SETTINGS:
            continue
        value = getattr(settings, setting.name)
        if isinstance(value, PodTemplates):
            value = value.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        elif isinstance(value, Resources):
            value = dataclasses.asdict(value)
        payload[setting.name] = value
    return payload


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
    - `created`: create these when absent, never update them: the act layer adds their secret value
      (`icefall.plan.isolation.spark_auth_secret`), which nothing reads back.
    - `absent`: objects that must not exist in this configuration; delete them if found.
    - `problems`: what could not be honoured (Degraded, reason InvalidSpec).
    """

    spec_hash: str
    spark_master: str
    applied: tuple[Manifest, ...]
    driver_pod: Manifest | None
    absent: tuple[ObjectRef, ...] = ()
    problems: tuple[Problem, ...] = field(default=())
    created: tuple[Manifest, ...] = ()

    def get(self, kind: str, name: str) -> Manifest:
        """The applied manifest of that kind and name (KeyError if none)."""
        for manifest in (*self.applied, *([self.driver_pod] if self.driver_pod else [])):
            if manifest["kind"] == kind and manifest["metadata"]["name"] == name:
                return manifest
        raise KeyError(f"{kind}/{name}")


def desired_children(
    st: StreamingTable,
    *,
    namespace: str,
    uid: str,
    generation: int,
    image: str,
    operator_settings: OperatorSettings,
    compaction_replicas: int = 0,
    owns_leases: bool = True,
) -> Children:
    """Render every child of `st` (see the module docstring). `compaction_replicas` comes from
    `icefall.plan.scaling`; suspend overrides it with 0. `owns_leases`: False while an older StreamingTable
    claims the same catalog table (`icefall.plan.claims`): the table's Leases are that one's children."""
    if not uid:
        raise ValueError("the StreamingTable's uid is needed for owner references")
    if compaction_replicas < 0:
        raise ValueError(f"compaction_replicas must be >= 0, got {compaction_replicas}")
    settings = operator_settings
    master, problems = spark_conf.spark_master(st, settings)
    on_kubernetes = master == spark_conf.KUBERNETES_MASTER
    digest = spec_hash(st, image=image, settings=settings, master=master)
    kafka_env, catalog_env, secret_problems = secret_env_vars(st.spec)
    problems += secret_problems
    if (reset_problem := reset_request_problem(st.metadata.annotations)) is not None:
        problems.append(Problem(RESET_FIELD, reset_problem))
    plans = workloads.pod_plans(st, settings, namespace=namespace)
    executor_conf, executor_problems = spark_conf.executor_conf(plans[pods.EXECUTOR].template)
    if on_kubernetes:
        problems += executor_problems
    meta = ChildMeta(st.metadata.name, namespace, uid, generation, digest)

    applied, absent = _accounts_and_executor_template(meta, st, settings, plans, on_kubernetes=on_kubernetes)
    if settings.network_policy:
        applied.append(isolation.network_policy(meta, metrics_namespace=settings.metrics_namespace))
    else:
        policy = names.network_policy_name(meta.name)
        absent.append(ObjectRef("networking.k8s.io/v1", "NetworkPolicy", policy))
    if owns_leases:
        applied += lease_objects.lease_children(meta, st)
    applied.append(
        workloads.compaction_deployment(
            meta, settings, image=image, spark_conf=spark_conf.compaction_conf(),
            replicas=compaction_replicas if upkeep_in_pods(st) and not st.spec.suspend else 0,
            secrets=catalog_env,
            pod=plans[pods.COMPACTION],
        )
    )  # fmt: skip
    driver = None
    if not st.spec.suspend:
        conf = spark_conf.driver_conf(
            st, settings, namespace=namespace, master=master, image=image, digest=digest,
            host_network=plans[pods.DRIVER].host_network, executor=executor_conf,
        )  # fmt: skip
        driver = workloads.driver_pod(
            meta, settings, image=image, spark_conf=conf, secrets=[*kafka_env, *catalog_env],
            executor_template=names.executor_template_name(meta.name) if on_kubernetes else None,
            pod=plans[pods.DRIVER],
        )  # fmt: skip
    return Children(
        spec_hash=digest,
        spark_master=master,
        applied=tuple(applied),
        driver_pod=driver,
        absent=tuple(absent),
        problems=tuple(problems),
        created=(isolation.spark_auth_secret(meta),) if on_kubernetes else (),
    )


def withheld_children(st: StreamingTable, *, image: str, operator_settings: OperatorSettings) -> Children:
    """What a table whose `spec.pods` the pod policy refuses (`icefall.plan.pod_policy`) gets: nothing to
    apply, no driver Pod, nothing to delete; only the spec hash its spec would have (so a driver running an
    older spec is recognised as such, and kept)."""
    master, _ = spark_conf.spark_master(st, operator_settings)
    digest = spec_hash(st, image=image, settings=operator_settings, master=master)
    return Children(spec_hash=digest, spark_master=master, applied=(), driver_pod=None)


def _accounts_and_executor_template(
    meta: ChildMeta,
    st: StreamingTable,
    settings: OperatorSettings,
    plans: Mapping[str, PodPlan],
    *,
    on_kubernetes: bool,
) -> tuple[list[Manifest], list[ObjectRef]]:
    """The ServiceAccounts with their RBAC, and the executors' pod template (or that it must be absent)."""
    driver, compaction = plans[pods.DRIVER].template, plans[pods.COMPACTION].template
    applied: list[Manifest] = [
        *rbac.account(
            meta,
            names.driver_account_name(meta.name),
            names.COMPONENT_INGEST,
            rbac.driver_rules(st, executors=on_kubernetes),
            driver.service_account_annotations,
        ),
        *rbac.account(
            meta,
            names.compaction_account_name(meta.name),
            names.COMPONENT_COMPACT,
            rbac.compaction_rules(st),
            compaction.service_account_annotations,
        ),
    ]
    if on_kubernetes:
        return [*applied, workloads.executor_template(meta, settings, plans[pods.EXECUTOR])], []
    return applied, [ObjectRef("v1", "ConfigMap", names.executor_template_name(meta.name))]


def upkeep_in_pods(st: StreamingTable) -> bool:
    """Whether compaction pods tidy `st`'s table: an Iceberg table's always; a Delta table's in an object
    store (S3, GCS, Azure), with
    Icefall's own merge and VACUUM committed by put-if-absent (`icefall.compact.delta_pods`; Delta Spark's
    OPTIMIZE and VACUUM commit unconditionally there, commit/DESIGN.md). A Delta table elsewhere is held in
    a cluster anyway (`cluster_table_problem`); its Deployment stays at 0 and `Compacting` says why."""
    if st.spec.table.format.value != "delta":
        return True
    return (st.spec.table.location or "").startswith(DELTA_SHARED_SCHEMES)


#: The Delta locations every pod of a cluster reaches and the Delta writer commits to with put-if-absent
#: (`icefall.commit.delta_storage.OBJECT_STORE_SCHEMES`; a unit test keeps the two equal).
DELTA_SHARED_SCHEMES = ("s3://", "s3a://", "gs://", "abfs://", "abfss://")


def cluster_table_problem(st: StreamingTable, *, spark_master: str) -> tuple[str, str] | None:
    """What keeps the operator from running `st`'s table in a cluster at all (its driver is then held):
    (field, message), else None. `spark_master`: the driver's (`Children.spark_master`)."""
    if st.spec.table.format.value == "delta":
        return _delta_problem(st, spark_master)
    if st.spec.table.catalog is None:
        return (
            "spec.table.catalog",
            "is required in a cluster: without it each pod would write its own embedded catalog; name a sql "
            "or rest catalog (see examples/)",
        )
    return None


def _delta_problem(st: StreamingTable, spark_master: str) -> tuple[str, str] | None:
    """A Delta table needs no catalog, but a location every pod reaches, and Spark inside the driver pod:
    the Delta writer stages each batch's files on the driver's local disk (commit/DESIGN.md)."""
    location = st.spec.table.location
    shared = (
        "s3://<bucket>/<path>, gs://<bucket>/<path> or abfss://<container>@<account>.dfs.core.windows.net/"
        "<path> (credentials from the environment, e.g. spec.pods.driver.env with valueFrom.secretKeyRef)"
    )
    if location is None:
        return (
            "spec.table.location",
            f"a Delta table in a cluster needs an object-store location: set spec.table.location to "
            f"{shared}; without it the table would be on the driver pod's own disk, which no other pod sees "
            "and a new driver pod does not have",
        )
    if not location.startswith(DELTA_SHARED_SCHEMES):
        return (
            "spec.table.location",
            f"{location!r} is a local path, and pods share no disk: a Delta table in a cluster lives in an "
            f"object store, set it to {shared}",
        )
    if spark_master == spark_conf.KUBERNETES_MASTER:  # only when annotated so (`DELTA_DEFAULT_MASTER`)
        annotation = spark_conf.ANNOTATION_SPARK_MASTER
        return (
            f"metadata.annotations[{annotation}]",
            "is kubernetes, but executor pods cannot write a Delta table: the Delta writer stages each "
            "batch's files on the driver's local disk; remove the annotation, or set it to local[*] (Spark "
            "inside the driver pod)",
        )
    return None
