"""`deletionPolicy: Delete`, decided: the purge Job, and when the deletion may end. Pure: the Job, its pods
and the clock are arguments.

The operator never drops a table itself: it holds no table credential. It runs `icefall purge` in a Job
of the table's namespace, as the table's own pods run: the driver's ServiceAccount, the catalog's
`secretKeyRef` variables (the purge talks to the catalog and its storage only, not to Kafka or the schema
registry), the driver's pod template, the restricted security context and the operator's image. The
command drops the table, its dead-letter table and each route's table (`spec.routes`) only when each
one's Iceberg `table-uuid` is the one the driver recorded for this StreamingTable (`status.writer.tableUuid`,
`deadLetterTableUuid`, and each route table's in `status.writer.tables`, `route_table_uuids`; a route table
without one is kept). The tables the dynamic route made (`spec.dynamicRoute`) are found by the purge in the
catalog by their owner property (`icefall.dynamic-route-of`: a table without it is never dropped) and
dropped when their uuid is the one recorded, or none is (the status list is bounded: up to 100 tables);
another table reached by the same
name (one created again, or the same catalog under another name or URI) is kept, and so is a table whose
uuid another StreamingTable recorded too.

`purge_step` decides each pass of the finalizer, in this order:

| situation | step |
|---|---|
| no table-uuid recorded (the driver never reported the table it writes) | KEEP |
| another StreamingTable recorded the same table-uuid | KEEP_FOR_OWNER |
| a Secret not granted (`icefall.plan.grants`), a spec.pods the pod policy refuses: no pod | KEEP |
| the Job completed | DROPPED |
| the Job failed (the refusal is in its pod's termination message) | FAILED |
| `deadline_seconds` passed since the deletion began | TIMED_OUT (the Job, if any, is deleted) |
| no Job yet | CREATE |
| else | WAIT |

Every step but CREATE and WAIT ends the deletion: the finalizer goes, with an Event saying what happened
and, when the table was kept, what to do. A deletion never hangs on a table it cannot drop.

Not guaranteed: that a Job that started just before the deadline did not drop the table after it (the
operator deletes the Job, which stops its pod); that the catalog has not swapped the table between the
purge's uuid check and its drop (pyiceberg drops by name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from icefall.api import StreamingTable
from icefall.plan import names, pods, spark_conf, workloads
from icefall.plan.children import spec_hash
from icefall.plan.env import secret_env_vars
from icefall.plan.metadata import ChildMeta
from icefall.plan.routing import dynamic_candidate
from icefall.plan.settings import OperatorSettings

Manifest = dict[str, Any]

#: How long a deletion waits for its purge Job, counted from the StreamingTable's deletionTimestamp.
PURGE_DEADLINE_SECONDS = 600.0
#: `icefall purge`'s exit code when a table is not the one recorded: the Job fails at once (no retry).
EXIT_REFUSED = 5
PURGE_CONTAINER = "purge"
PURGE_COMMAND = ("icefall", "purge", "--namespace", "{namespace}", "--name", "{name}")
#: The label Kubernetes puts on a Job's pods.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


class PurgeStep(StrEnum):
    KEEP = "Keep"
    KEEP_FOR_OWNER = "KeepForOwner"
    CREATE = "Create"
    WAIT = "Wait"
    DROPPED = "Dropped"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"


@dataclass(frozen=True)
class JobState:
    """A purge Job's outcome so far: finished (complete or failed) or not, and its failure's words."""

    complete: bool = False
    failed: bool = False
    message: str = ""


def job_state(job: Mapping[str, Any] | None) -> JobState | None:
    """The state of a Job object (None: no Job)."""
    if job is None:
        return None
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []}

    def true(kind: str) -> bool:
        return str((conditions.get(kind) or {}).get("status")) == "True"

    failed = conditions.get("Failed") or {}
    message = f"{failed.get('reason', '')}: {failed.get('message', '')}".strip(": ") if true("Failed") else ""
    return JobState(complete=true("Complete"), failed=true("Failed"), message=message)


def last_words(job_pods: Sequence[Mapping[str, Any]]) -> str:
    """The termination message of the newest of a Job's pods that has one ("" when none has)."""
    newest = sorted(job_pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp", "")))
    for pod in reversed(newest):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            message = ((status.get("state") or {}).get("terminated") or {}).get("message")
            if message:
                return str(message).strip()
    return ""


def purge_step(
    *,
    table_uuid: str | None,
    uuid_owners: Sequence[str],
    refusals: Sequence[str],
    job: JobState | None,
    elapsed_seconds: float,
    deadline_seconds: float = PURGE_DEADLINE_SECONDS,
) -> PurgeStep:
    """The next step of a `Delete` deletion (module doc). `uuid_owners`: the other StreamingTables that
    recorded `table_uuid`; `elapsed_seconds`: since the deletion began."""
    if not table_uuid:
        return PurgeStep.KEEP
    if uuid_owners:
        return PurgeStep.KEEP_FOR_OWNER
    if refusals:
        return PurgeStep.KEEP
    if job is not None and job.complete:
        return PurgeStep.DROPPED
    if job is not None and job.failed:
        return PurgeStep.FAILED
    if elapsed_seconds >= deadline_seconds:
        return PurgeStep.TIMED_OUT
    return PurgeStep.CREATE if job is None else PurgeStep.WAIT


def route_table_uuids(st: StreamingTable) -> dict[str, str]:
    """The table-uuid the driver recorded for each route table of `st` (`status.writer.tables`), by its
    dotted identifier, and for each table its dynamic route made that the report lists; a route table it
    has not reported is left out (and kept)."""
    report = st.status.writer if st.status else None
    routes = {".".join(identifier) for identifier in st.route_identifiers}
    found = report.tables if report is not None else []
    return {
        t.table: t.table_uuid
        for t in found
        if t.table_uuid and (t.table in routes or dynamic_candidate(st, t.table.split(".")))
    }


def purge_command(
    namespace: str,
    name: str,
    table_uuid: str,
    dead_letter_table_uuid: str | None,
    routes: Mapping[str, str] | None = None,
) -> list[str]:
    """`icefall purge` for the StreamingTable `namespace/name` and the table-uuids recorded for it (`routes`:
    each route table's, by its dotted identifier)."""
    args = [part.format(namespace=namespace, name=name) for part in PURGE_COMMAND]
    args += ["--table-uuid", table_uuid]
    if dead_letter_table_uuid:
        args += ["--dead-letter-table-uuid", dead_letter_table_uuid]
    for table, uuid in sorted((routes or {}).items()):
        args += ["--route-table-uuid", f"{table}={uuid}"]
    return args


def purge_job(
    st: StreamingTable,
    *,
    namespace: str,
    uid: str,
    image: str,
    settings: OperatorSettings,
    table_uuid: str,
    dead_letter_table_uuid: str | None,
    active_seconds: float,
) -> Manifest:
    """The purge Job of `st` (module doc), owned by it; Kubernetes stops it after `active_seconds`."""
    master, _ = spark_conf.spark_master(st, settings)
    digest = spec_hash(st, image=image, settings=settings, master=master)
    meta = ChildMeta(st.metadata.name, namespace, uid, st.metadata.generation or 0, digest)
    plan = workloads.pod_plans(st, settings, namespace=namespace)[pods.DRIVER]
    args = purge_command(
        namespace, st.metadata.name, table_uuid, dead_letter_table_uuid, route_table_uuids(st)
    )
    catalog_secrets = secret_env_vars(st.spec)[1]
    spec = workloads.purge_pod_spec(meta, settings, image=image, args=args, secrets=catalog_secrets, pod=plan)
    template: Manifest = {"labels": pods.pod_labels(plan.template, meta.labels(names.COMPONENT_PURGE))}
    if plan.template.annotations:
        template["annotations"] = dict(plan.template.annotations)
    refused = {"containerName": PURGE_CONTAINER, "operator": "In", "values": [EXIT_REFUSED]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta.metadata(names.purge_job_name(st.metadata.name), names.COMPONENT_PURGE),
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": max(int(active_seconds), 1),
            # A table that is not the recorded one is refused every time: fail at once.
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": refused}]},
            "template": {"metadata": template, "spec": spec},
        },
    }
