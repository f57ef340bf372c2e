"""Every Icefall process's Spark configuration, on top of the session's base. Pure: no client, no I/O.

The session's base (`icefall.spark.session.spark_conf`: jars, SQL extensions, catalogs, redaction, loopback
binding of a local master, the FAIR pools file) is the same for every process. This module is the one
producer of what differs per process:

| process | conf |
|---|---|
| the driver pod (`icefall ingest`) | `driver_conf`, rendered into the pod as `ICEFALL_SPARK_CONF` |
| the compaction pods (`icefall compact`) | `compaction_conf`, rendered the same way |
| a pod's entry point | `in_pod`: the rendered conf, its master as the API server's in-cluster address |
| `icefall run` | `embedded_conf`: local master, FAIR scheduling with in-process maintenance |
| `icefall verify` / `icefall read` | `tool_conf`: the application name |

Spark master: the driver runs Spark on Kubernetes (`k8s://https://kubernetes.default.svc`, dynamic
allocation, executors from the same image) unless the operator setting `spark_master` or, per table, the
annotation `icefall.dev/spark-master` says `local`, `local[N]` or `local[*]`: then Spark runs inside the
driver pod only, no executor RBAC or pod template is created, and nothing else changes. An annotation (not
a spec field) because where Spark runs is a placement choice of whoever operates the cluster, not part of
the table's contract, and it keeps the v1alpha1 API free of a field we may want to shape differently later.

Shuffle partitions (`spark.sql.shuffle.partitions`, what a keyed table's MERGE and a sorted write shuffle
into): twice the cores the job can use (`shuffle_partitions`), so skew is spread and adaptive execution
coalesces the small ones: `maxExecutors x spark.executor.cores` on Kubernetes, N for `local[N]`, the
machine's cores for `local[*]` (counted by the session, `icefall.spark.session`, the only place that can).

A table's own Spark settings (`spec.spark.conf`, allow-listed by `icefall.api.spark`) come last in the
conf of its ingestion session, in the driver pod (`driver_conf`) and in `icefall run` (`embedded_conf`), so
they win over everything derived here. The compaction pods do not take them (they serve the table's
maintenance only; `icefall run`'s in-process maintenance shares the ingestion session, and so does).

RPC between the driver and its executors (Kubernetes master only) is authenticated and encrypted with the
table's own secret, read from a file in both pods (`icefall.plan.isolation.spark_auth_conf`); the image's
executor entry point gives the executor JVM the `k8s://` master Spark needs to read that file before it
has the driver's conf (`icefall.spark.entrypoint`). A local master has no executors to talk to.

Host network (see `icefall.plan.pods`): the driver fixes no port (Spark picks free ones and tells the
executors); executors bind their block manager to a free port and never read another executor's shuffle
files from the local disk (pods of one node share its address).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal

from icefall.api import PodTemplate, Problem, StreamingTable, parse_quantity
from icefall.api.pods import MIN_EXECUTOR_MEMORY_MIB
from icefall.plan import names
from icefall.plan.env import ENV_POD_IP, ENV_POD_NAME, spark_conf_from
from icefall.plan.isolation import spark_auth_conf
from icefall.plan.settings import LOCAL_MASTER, OperatorSettings

#: Per-table Spark master override: `kubernetes`, `local`, `local[N]` or `local[*]`.
ANNOTATION_SPARK_MASTER = "icefall.dev/spark-master"
KUBERNETES_MASTER = "k8s://https://kubernetes.default.svc"
#: The master of a process whose conf names none (`icefall run` and the CLI's tools, by default).
DEFAULT_MASTER = "local[2]"
SPARK_LOCAL_DIR = "/var/data/spark-local"
#: Where the driver pod mounts the executors' pod template (`icefall.plan.workloads`).
EXECUTOR_TEMPLATE_DIR = "/etc/icefall/spark"
EXECUTOR_TEMPLATE_KEY = "executor-pod-template.json"
EXECUTOR_CONTAINER = "spark-kubernetes-executor"
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
#: Spark's least memory overhead of an executor (MiB) and its share of the container.
MIN_OVERHEAD_MIB = 384
OVERHEAD_FRACTION = Decimal("0.1")
MIB = 2**20


#: Shuffle partitions per core the job can use (`shuffle_partitions`).
SHUFFLE_PARTITIONS_PER_CORE = 2
_LOCAL_CORES = re.compile(r"^local\[([0-9]+)\]$")


def shuffle_partitions(master: str, *, cores: int) -> int:
    """`spark.sql.shuffle.partitions` for a job on `master`: twice the cores it can use. `cores`: the
    executors' cores on a cluster master, the machine's for `local[*]` (`local` is one core, `local[N]` N,
    whatever `cores` says)."""
    if master == "local":
        cores = 1
    elif (match := _LOCAL_CORES.match(master)) is not None:
        cores = int(match.group(1))
    return SHUFFLE_PARTITIONS_PER_CORE * max(cores, 1)


#: A Delta table's driver without the annotation: Spark inside its pod, whatever the operator's default (the
#: Delta writer stages a batch's files on the driver's disk, so executor pods cannot write them).
DELTA_DEFAULT_MASTER = "local[*]"


def spark_master(st: StreamingTable, settings: OperatorSettings) -> tuple[str, list[Problem]]:
    """The Spark master URL for this table's driver, and a problem if the annotation cannot be used."""
    default = DELTA_DEFAULT_MASTER if st.spec.table.format.value == "delta" else settings.spark_master
    wanted = st.metadata.annotations.get(ANNOTATION_SPARK_MASTER, default)
    problems: list[Problem] = []
    if wanted != "kubernetes" and not LOCAL_MASTER.match(wanted):
        problems.append(
            Problem(
                f"metadata.annotations[{ANNOTATION_SPARK_MASTER}]",
                f"{wanted!r} is not a Spark master; use kubernetes, local, local[N] or local[*] "
                f"(using the default {default!r})",
            )
        )
        wanted = default
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


# --- the operator's pods ----------------------------------------------------------------------------------


def driver_conf(
    st: StreamingTable,
    settings: OperatorSettings,
    *,
    namespace: str,
    master: str,
    image: str,
    digest: str,
    host_network: bool,
    executor: Mapping[str, str],
) -> dict[str, str]:
    """Spark configuration of the driver pod; Kubernetes keys only with that master. On the host network
    (`host_network`: the driver's) the driver fixes no port; `executor` (`executor_conf` of the executors'
    pod template) comes after Icefall's keys, and the table's `spec.spark.conf` last: each wins over what
    comes before. A local master's shuffle partitions are left to the session (it counts the pod's cores)."""
    conf = {
        "spark.master": master,
        "spark.app.name": names.spark_app_name(st.metadata.name),
        "spark.driver.memory": settings.driver_jvm_memory,
        "spark.local.dir": SPARK_LOCAL_DIR,
    }
    if master != KUBERNETES_MASTER:
        return conf | st.spec.spark.conf
    conf |= _kubernetes_conf(st, settings, namespace=namespace, image=image, digest=digest)
    cores = settings.max_executors * settings.executor_cores
    conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions(master, cores=cores))
    if not host_network:
        conf |= {
            "spark.driver.port": str(DRIVER_PORT),
            "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        }
    return conf | dict(executor) | st.spec.spark.conf


def _kubernetes_conf(
    st: StreamingTable, settings: OperatorSettings, *, namespace: str, image: str, digest: str
) -> dict[str, str]:
    name = st.metadata.name
    account = names.driver_account_name(name)
    executor_labels = {**names.labels(name, names.COMPONENT_INGEST), names.LABEL_SPEC_HASH: digest}
    conf = {
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.driver.pod.name": f"$({ENV_POD_NAME})",  # executors are owned by the driver pod
        "spark.driver.host": f"$({ENV_POD_IP})",
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.container.image.pullPolicy": settings.image_pull_policy,
        "spark.kubernetes.authenticate.driver.serviceAccountName": account,
        "spark.kubernetes.authenticate.executor.serviceAccountName": account,
        "spark.kubernetes.executor.podNamePrefix": names.driver_pod_name(name),
        "spark.kubernetes.executor.podTemplateFile": f"{EXECUTOR_TEMPLATE_DIR}/{EXECUTOR_TEMPLATE_KEY}",
        "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
        "spark.kubernetes.executor.deleteOnTermination": "true",
        # The driver's Role grants pods only (`icefall.plan.rbac.driver_rules`): no executor ConfigMap
        # (executors get their conf from the driver), no PVC listing or clean-up, no Service clean-up.
        "spark.kubernetes.executor.disableConfigMap": "true",
        "spark.kubernetes.driver.ownPersistentVolumeClaim": "false",
        "spark.kubernetes.driver.reusePersistentVolumeClaim": "false",
        "spark.kubernetes.driver.service.deleteOnTermination": "false",
        **spark_auth_conf(),
        **_dynamic_allocation(settings),
    }
    if settings.executor_request_cores:
        conf["spark.kubernetes.executor.request.cores"] = settings.executor_request_cores
    if settings.executor_limit_cores:
        conf["spark.kubernetes.executor.limit.cores"] = settings.executor_limit_cores
    for key, value in executor_labels.items():
        conf[f"spark.kubernetes.executor.label.{key}"] = value
    return conf


def _dynamic_allocation(settings: OperatorSettings) -> dict[str, str]:
    return {
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


def executor_conf(template: PodTemplate) -> tuple[dict[str, str], list[Problem]]:
    """What the executors' pod template asks of Spark: cpu and memory (Spark sets those on the container
    itself) and the host-network settings (see the module docstring)."""
    conf: dict[str, str] = {}
    problems: list[Problem] = []
    if template.host_network:
        conf["spark.blockManager.port"] = "0"
        conf["spark.shuffle.readHostLocalDisk"] = "false"
    resources = template.resources
    if resources is None:
        return conf, problems
    if "cpu" in resources.requests:
        conf["spark.kubernetes.executor.request.cores"] = resources.requests["cpu"]
    if "cpu" in resources.limits:
        conf["spark.kubernetes.executor.limit.cores"] = resources.limits["cpu"]
    memory = resources.limits.get("memory") or resources.requests.get("memory")
    if memory is None:
        return conf, problems
    total = int(parse_quantity(memory) // MIB)
    if total < MIN_EXECUTOR_MEMORY_MIB:
        problems.append(
            Problem(
                "spec.pods.executor.resources",
                f"executor memory {memory} (with the operator's pod defaults) is below "
                f"{MIN_EXECUTOR_MEMORY_MIB}Mi; using the operator's executor memory instead",
            )
        )
        return conf, problems
    overhead = max(MIN_OVERHEAD_MIB, int(total * OVERHEAD_FRACTION))
    conf["spark.executor.memory"] = f"{total - overhead}m"
    conf["spark.executor.memoryOverhead"] = f"{overhead}m"
    return conf, problems


def compaction_conf() -> dict[str, str]:
    """Spark configuration of the compaction pods: Spark inside the pod, on its scratch volume."""
    return {"spark.master": "local[*]", "spark.local.dir": SPARK_LOCAL_DIR}


def in_pod(environ: Mapping[str, str], table: str, *, role: str, master: str) -> dict[str, str]:
    """The conf the entry point of a pod of the StreamingTable `table` starts Spark with in `role`
    (`ingest`, `compact`): what the operator rendered into its environment (its application name and
    `master` where it names none), with `KUBERNETES_MASTER` as the in-cluster address."""
    conf = spark_conf_from(environ)
    conf["spark.master"] = in_cluster_master(conf.get("spark.master", master), environ)
    conf.setdefault("spark.app.name", names.spark_app_name(table, role))
    return conf


# --- processes outside the operator's pods ----------------------------------------------------------------


def embedded_conf(st: StreamingTable, *, master: str, maintain: bool) -> dict[str, str]:
    """`icefall run` of the StreamingTable `st`: local Spark; with in-process maintenance (`maintain`)
    its jobs, in a pool of their own, share the cores with the batches' jobs (Spark's FAIR scheduler); the
    table's `spec.spark.conf` last."""
    conf = {"spark.master": master, "spark.app.name": names.spark_app_name(st.metadata.name)}
    if maintain:
        conf["spark.scheduler.mode"] = "FAIR"
    return conf | st.spec.spark.conf


def tool_conf(table: str, tool: str) -> dict[str, str]:
    """A CLI tool (`verify`, `read`) reading the StreamingTable `table`'s table with local Spark."""
    return {"spark.app.name": names.spark_app_name(table, tool)}
