"""The two passes over a StreamingTable: `apply` (spec changes, driver Pod events, resync) and `observe`
(the status timer). Both plan the same way (`icefall.plan`, pure); only `apply` acts. See
docs/controller-flow.md for the flow and its states.

Both passes:
1. Parse the body. A body the models refuse becomes `Ready=False`/`Degraded=True` with reason InvalidSpec
   (the admission schema makes that rare); nothing else is touched. A StreamingTable being deleted is left
   to `controller.deletion` (nothing is created for it here).
2. Contest: when an older StreamingTable names the same catalog table (`plan.claims`), this one runs no
   driver and no compaction and reports TableClaimedByOther. Grants: when it references a Secret that is
   missing or not granted to StreamingTables (`plan.grants`; the labels read by `apply`, metadata only),
   it runs no pod at all and reports SecretNotAllowed.
3. Compaction replicas from the backlog the table's driver reported (`status.writer`; the operator reads
   no table and no topic itself: `plan.table_status`), by `plan.scaling`, scale-down damped by
   `SCALE_DOWN_COOLDOWN_SECONDS` → `desired_children`. A `spec.pods` that breaks the pod policy
   (`plan.pod_policy`, `Config.pod_policy`) renders nothing instead (`withheld_children`): Degraded
   PodPolicyViolation, nothing applied, no driver Pod created; a running driver keeps the spec it started
   with.
4. Observe the `<st>-ingest` Pod; `plan.driver.decide` with the history kept in the
   `icefall.dev/driver-history` annotation.
5. Derive the status (`controller.status`) and write it when `should_write_status` says so; export the
   table's figures and conditions (`controller.metrics`, every pass).

`apply` also, between those steps: server-side applies `applied` (accounts first), creates `created` with
their secret value (random bytes made here; an existing one is left as it is) and deletes `absent` (after
3), each child only when its rendering changed or it is due for repair (`plan.applying`); creates
or deletes the driver Pod as decided (a Pod created again after a failure counts in
`icefall_driver_restarts_total`, once the create took place) and stores the new history (after 4); and
returns the Events of transitions (the driver's, a new claim, Degraded set or cleared).

Guarantees: idempotent (a second pass on the same observations changes nothing and emits no Event); the
driver Pod has a fixed name, so at most one exists whatever runs concurrently or crashes in between;
deleting the Pod carries its uid, so a decision about an old Pod never deletes a new one; `observe` writes
nothing but status (no child, pod or annotation, no Event but an invalid body's), so it is cheap enough to
run often, and the next `apply` acts on the same decision.

Not guaranteed: that the history annotation survives a user's edit of it (a malformed history reads as
none: the driver restarts without backoff).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from icefall import __version__
from icefall.api import ManifestError, StreamingTable, streaming_table_from_object
from icefall.api.pod_policy import PodPolicy, pod_policy_from_json
from icefall.controller import metrics, status
from icefall.controller.kube import Kube
from icefall.controller.status import Ref, StatusMemory
from icefall.plan.applying import ABSENT, REPAIR_SECONDS, Applied, child_key, due, manifest_digest
from icefall.plan.children import (
    Children,
    cluster_table_problem,
    desired_children,
    upkeep_in_pods,
    withheld_children,
)
from icefall.plan.claims import Claim, claim_from_object, claimed_by_other
from icefall.plan.conditions import Issue
from icefall.plan.driver import (
    MAX_BACKOFF_SECONDS,
    Action,
    DriverDecision,
    DriverHistory,
    DriverPod,
    DriverState,
    Event,
    EventReason,
    EventType,
    decide,
    driver_pod_from_object,
)
from icefall.plan.grants import secret_refusals, secret_uses
from icefall.plan.isolation import SPARK_AUTH_BYTES, SPARK_AUTH_KEY
from icefall.plan.names import ANNOTATION_DRIVER_HISTORY, driver_pod_name
from icefall.plan.pod_policy import policy_issue, violations
from icefall.plan.purge import PURGE_DEADLINE_SECONDS
from icefall.plan.scaling import compaction_replicas, damped_replicas
from icefall.plan.settings import OperatorSettings
from icefall.plan.table_status import acknowledged_loss, reported_backlog

#: The image of this release, as the chart names it by default (image.repository:appVersion); the chart
#: always sets ICEFALL_IMAGE, so this is for an operator started without it.
DEFAULT_IMAGE = f"ghcr.io/icefall-dev/icefall:{__version__}"
SCALE_DOWN_COOLDOWN_SECONDS = 300.0
#: JSON of the chart's `podPolicy` (`icefall.api.pod_policy`); unset: the default, restrictive policy.
POD_POLICY_ENV = "ICEFALL_POD_POLICY"


@dataclass(frozen=True)
class Config:
    """What the operator process was started with (environment, not per table)."""

    image: str = DEFAULT_IMAGE
    settings: OperatorSettings = field(default_factory=OperatorSettings)
    #: The cap of a failed driver's restart backoff (plan/driver.py); lowered by the chaos run.
    driver_max_backoff_seconds: float = MAX_BACKOFF_SECONDS
    #: How long an unchanged child goes without being applied again (`icefall.plan.applying`).
    repair_seconds: float = REPAIR_SECONDS
    #: How long a `deletionPolicy: Delete` deletion waits for its purge Job (`icefall.plan.purge`).
    purge_deadline_seconds: float = PURGE_DEADLINE_SECONDS
    #: What a table's `spec.pods` may use (not part of the settings: it renders nothing, so a change of it
    #: restarts no driver).
    pod_policy: PodPolicy = field(default_factory=PodPolicy)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """`ICEFALL_IMAGE`, `ICEFALL_DRIVER_MAX_BACKOFF_SECONDS`, `ICEFALL_REPAIR_SECONDS`,
        `ICEFALL_PURGE_DEADLINE_SECONDS`, `ICEFALL_POD_POLICY` and the settings of
        `icefall.plan.settings.SETTINGS_ENV`; defaults otherwise."""
        env = os.environ if env is None else env
        cap = float(env.get("ICEFALL_DRIVER_MAX_BACKOFF_SECONDS", MAX_BACKOFF_SECONDS))
        policy = env.get(POD_POLICY_ENV)
        return cls(
            image=env.get("ICEFALL_IMAGE", DEFAULT_IMAGE),
            settings=OperatorSettings.from_environ(env),
            driver_max_backoff_seconds=cap,
            repair_seconds=float(env.get("ICEFALL_REPAIR_SECONDS", REPAIR_SECONDS)),
            purge_deadline_seconds=float(env.get("ICEFALL_PURGE_DEADLINE_SECONDS", PURGE_DEADLINE_SECONDS)),
            pod_policy=pod_policy_from_json(policy, origin=POD_POLICY_ENV) if policy else PodPolicy(),
        )


@dataclass(frozen=True)
class Outcome:
    events: tuple[Event, ...] = ()
    requeue_seconds: float | None = None
    status_written: bool = False


@dataclass(frozen=True)
class Context:
    """What every pass over a table uses: the API, the process's configuration and memory, the clock, and
    where driver Pods are read: `pods(namespace, name)`, the operator's watch of them (None: a GET)."""

    kube: Kube
    config: Config
    memory: StatusMemory
    now: datetime
    pods: Callable[[str, str], dict[str, Any] | None] | None = None


@dataclass(frozen=True)
class _Plan:
    """What a pass wants, before it looks at the driver Pod."""

    ref: Ref
    st: StreamingTable
    owner: Claim | None  # the older StreamingTable claiming the same catalog table
    issues: tuple[Issue, ...]  # the pass's own (a pod policy violation)
    replicas: int
    children: Children
    problems: tuple[str, ...]
    refusals: tuple[str, ...] = ()  # referenced Secrets it may not use (`plan.grants`): no pod at all
    #: spec.pods breaks the pod policy: nothing is applied and no driver Pod is created.
    withheld: bool = False


@dataclass(frozen=True)
class _Driver:
    """The driver Pod as observed, the history it was judged with, and the decision."""

    name: str
    pod: DriverPod | None
    history: DriverHistory
    decision: DriverDecision


def observe(body: Mapping[str, Any], ctx: Context, claims: Sequence[Claim] = ()) -> Outcome:
    """The status-only pass (the status timer): plan as `apply` does, write status, act on nothing.
    `claims`: the other StreamingTables naming the same catalog table."""
    planned = _plan(body, ctx, claims, check_secrets=False)
    if isinstance(planned, Outcome):
        return planned
    driver = _driver(planned, ctx)
    derived = _derive(planned, driver, ctx)
    written = _finish(planned, derived, ctx)
    return Outcome((), driver.decision.requeue_seconds, written)


def apply(body: Mapping[str, Any], ctx: Context, claims: Sequence[Claim] = ()) -> Outcome:
    """The full pass (spec changes, driver Pod events, resync): see the module docstring."""
    planned = _plan(body, ctx, claims, check_secrets=True)
    if isinstance(planned, Outcome):
        return planned
    _apply_children(planned, ctx)
    driver = _driver(planned, ctx)
    _act_on_driver(planned, driver, ctx)
    derived = _derive(planned, driver, ctx)
    events = [*driver.decision.events, *derived.events]
    degraded = status.degraded_transition(planned.st, planned.ref.uid, derived.conditions, ctx.memory)
    if degraded is not None:
        events.append(degraded)
    written = _finish(planned, derived, ctx)
    return Outcome(tuple(events), driver.decision.requeue_seconds, written)


def _plan(
    body: Mapping[str, Any], ctx: Context, claims: Sequence[Claim], *, check_secrets: bool
) -> _Plan | Outcome:
    """Steps 1-3 of the module docstring; an `Outcome` when the pass ends there. `check_secrets`: read
    the referenced Secrets' labels now (else the last `apply` pass's finding)."""
    meta = body.get("metadata") or {}
    ref = Ref.of(body)
    if meta.get("deletionTimestamp"):
        return Outcome()  # controller.deletion owns a StreamingTable being deleted
    try:
        st = streaming_table_from_object(body)
    except ManifestError as error:
        written, conditions = status.write_invalid(body, ctx.kube, str(error), ctx.now)
        metrics.record_conditions(ref.namespace, ref.name, conditions)
        message = f"the StreamingTable cannot be read: {error}"
        return Outcome((Event(EventReason.SPEC_CHANGED, message, EventType.WARNING),), None, written)
    owner = _claimed_by(body, st, claims)
    refusals = _secret_refusals(st, ref, ctx, check=check_secrets)
    idle = owner is not None or bool(refusals)  # no pod at all
    replicas = 0 if idle else _compaction_replicas(st, ref.uid, ctx)
    broken = violations(ctx.config.pod_policy, st)
    issues: tuple[Issue, ...] = ()
    if broken:  # render no pod: the driver and compaction keep the last spec the policy allowed
        issues = (policy_issue(broken),)
        children = withheld_children(st, image=ctx.config.image, operator_settings=ctx.config.settings)
    else:
        children = desired_children(
            st,
            namespace=ref.namespace,
            uid=ref.uid,
            generation=st.metadata.generation or 0,
            image=ctx.config.image,
            operator_settings=ctx.config.settings,
            compaction_replicas=replicas,
            owns_leases=owner is None,
        )
    problems = [str(p) for p in children.problems]
    if (unrunnable := cluster_table_problem(st, spark_master=children.spark_master)) is not None:
        problems.append(": ".join(unrunnable))
    return _Plan(ref, st, owner, issues, replicas, children, tuple(problems), refusals, bool(broken))


def _apply_children(planned: _Plan, ctx: Context) -> None:
    """Remember the compaction replicas set; server-side apply the children (accounts first), delete the
    ones that must not exist: each only when `icefall.plan.applying.due`."""
    ref, memory, repair = planned.ref, ctx.memory, ctx.config.repair_seconds
    memory.scaled(ref.uid, planned.replicas, ctx.now)
    for manifest in planned.children.applied:
        key, wanted = child_key(manifest), manifest_digest(manifest)
        if due(memory.applied(ref.uid, key), wanted, ctx.now, repair):
            ctx.kube.apply(manifest)
            memory.did_apply(ref.uid, key, Applied(wanted, ctx.now))
    for manifest in planned.children.created:
        key, wanted = child_key(manifest), manifest_digest(manifest)
        if due(memory.applied(ref.uid, key), wanted, ctx.now, repair):
            ctx.kube.create(with_secret_value(manifest))  # False when it exists: never replaced
            memory.did_apply(ref.uid, key, Applied(wanted, ctx.now))
    for absent in planned.children.absent:
        key = (absent.kind, absent.name)
        if due(memory.applied(ref.uid, key), ABSENT, ctx.now, repair):
            ctx.kube.delete(absent.kind, ref.namespace, absent.name)
            memory.did_apply(ref.uid, key, Applied(ABSENT, ctx.now))


def with_secret_value(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A `Children.created` Secret with its value: `SPARK_AUTH_BYTES` random bytes, made here, sent once."""
    value = base64.b64encode(secrets.token_bytes(SPARK_AUTH_BYTES)).decode()
    return {**manifest, "data": {SPARK_AUTH_KEY: value}}


def _driver(planned: _Plan, ctx: Context) -> _Driver:
    """Step 4: the driver Pod as it is, and what to do about it."""
    st, children = planned.st, planned.children
    name = (
        str(children.driver_pod["metadata"]["name"])
        if children.driver_pod
        else driver_pod_name(st.metadata.name)
    )
    namespace = planned.ref.namespace
    found = ctx.pods(namespace, name) if ctx.pods is not None else ctx.kube.get("Pod", namespace, name)
    pod = driver_pod_from_object(found) if found is not None else None
    history = _history(st)
    decision = decide(
        pod,
        desired_hash=None if st.spec.suspend else children.spec_hash,
        history=history,
        now=ctx.now,
        hold=bool(planned.problems) or planned.withheld,
        claimed_by=planned.owner.ref if planned.owner is not None else None,
        refused="; ".join(planned.refusals) or None,
        max_backoff_seconds=ctx.config.driver_max_backoff_seconds,
    )
    if planned.withheld and decision.action is Action.CREATE:
        why = "no driver is started while spec.pods breaks the pod policy (see Degraded)"
        decision = DriverDecision(Action.KEEP, history, DriverState.NOT_WANTED, why)
    return _Driver(name, pod, history, decision)


def _act_on_driver(planned: _Plan, driver: _Driver, ctx: Context) -> None:
    """Create or delete the driver Pod as decided (a delete carries the observed uid); store the history."""
    ref, decision = planned.ref, driver.decision
    if decision.action is Action.CREATE and planned.children.driver_pod is not None:
        created = ctx.kube.create(planned.children.driver_pod)
        if created and decision.history.failures:  # a restart after a failure, not a first start
            metrics.count_driver_restart(ref.namespace, ref.name)
    elif decision.action is Action.DELETE and driver.pod is not None:
        ctx.kube.delete("Pod", ref.namespace, driver.name, uid=driver.pod.uid)
    if decision.history != driver.history:
        text = json.dumps(decision.history.to_dict(), sort_keys=True, separators=(",", ":"))
        ctx.kube.patch_annotations(ref.namespace, ref.name, {ANNOTATION_DRIVER_HISTORY: text})


def _derive(planned: _Plan, driver: _Driver, ctx: Context) -> status.Derived:
    """Step 5: the status this pass derives."""
    return status.derive(
        planned.st,
        driver.decision,
        problems=planned.problems,
        owner=planned.owner,
        now=ctx.now,
        refusals=planned.refusals,
        issues=planned.issues,
    )


def _finish(planned: _Plan, derived: status.Derived, ctx: Context) -> bool:
    """Step 5: the table's metrics, and its status when due; True when status was written."""
    ref, st = planned.ref, planned.st
    target = st.spec.freshness.target_seconds
    metrics.record_table(
        ref.namespace, ref.name, derived.summary, planned.replicas, target,
        acknowledged_loss=acknowledged_loss(st.metadata.annotations),
        stored_loss=derived.status.data_loss_records, conditions=derived.conditions,
    )  # fmt: skip
    return status.write(ctx.kube, ctx.memory, ref, previous=st.status, new=derived.status, now=ctx.now)


def _claimed_by(body: Mapping[str, Any], st: StreamingTable, claims: Sequence[Claim]) -> Claim | None:
    me = claim_from_object(body)
    if st.spec.table.catalog is None or me is None:
        return None
    return claimed_by_other(me, [c for c in claims if c.uid != me.uid])


def _secret_refusals(st: StreamingTable, ref: Ref, ctx: Context, *, check: bool) -> tuple[str, ...]:
    """Why `st` may not use the Secrets it references (`plan.grants`; empty: it may). Read from the API
    (each Secret's labels, metadata only) when `check` or never read before, else remembered."""
    remembered = ctx.memory.refusals(ref.uid)
    if remembered is not None and not check:
        return remembered
    refusals = tuple(secret_refusals_of(ctx.kube, st, ref.namespace))
    ctx.memory.refused(ref.uid, refusals)
    return refusals


def secret_refusals_of(kube: Kube, st: StreamingTable, namespace: str) -> list[str]:
    """`plan.grants.secret_refusals` of `st`, each referenced Secret's labels read now (metadata only). A
    Secret the operator may not `get` is refused too, saying so (its Role lacks the chart's rule)."""
    uses = secret_uses(st.spec)
    labels: dict[str, dict[str, str] | None] = {}
    forbidden = []
    for name in sorted({use.secret for use in uses}):
        try:
            labels[name] = kube.secret_labels(namespace, name)
        except ApiException as error:
            if error.status != 403:
                raise
            forbidden.append(
                f"Secret {name!r}: the operator may not read its labels (403); its Role needs `get` on "
                "secrets in this namespace (charts/icefall/templates/rbac.yaml grants it)"
            )
    checked = [use for use in uses if use.secret in labels]
    return [*forbidden, *secret_refusals(checked, labels, namespace)]


def _compaction_replicas(st: StreamingTable, uid: str, ctx: Context) -> int:
    """Replicas from the backlog the driver reported (`status.writer`); without a recent report, the last
    count set (or minReplicas)."""
    spec = st.spec.compaction
    last = ctx.memory.replicas(uid)
    if not spec.enabled or not upkeep_in_pods(st):
        return 0
    backlog = reported_backlog(st.status.writer if st.status else None, ctx.now)
    if backlog is None:
        wanted = last[0] if last is not None else spec.min_replicas
        return min(max(wanted, spec.min_replicas), spec.max_replicas)
    wanted = compaction_replicas(backlog, spec.min_replicas, spec.max_replicas)
    return damped_replicas(
        wanted,
        last[0] if last is not None else None,
        last[1].timestamp() if last is not None else None,
        ctx.now.timestamp(),
        cooldown_seconds=SCALE_DOWN_COOLDOWN_SECONDS,
    )


def _history(st: StreamingTable) -> DriverHistory:
    text = st.metadata.annotations.get(ANNOTATION_DRIVER_HISTORY)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    return DriverHistory.from_dict(data if isinstance(data, dict) else None)
