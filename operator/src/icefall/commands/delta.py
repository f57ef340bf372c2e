"""`icefall run`, the driver pod's `icefall ingest` and `icefall verify` of a Delta Lake table
(`spec.table.format: delta`): no catalog, the table at its location (`delta_location`), its Spark session a
Delta table's (`icefall.spark.session.delta_conf`), its upkeep in-process beside the batches
(`icefall.compact.delta`, Delta's own commands; on S3 the compaction pods' own merge, checkpoints and
VACUUM, `icefall.compact.delta_pods`, which the pods run too, `compact_delta`); the writer is
`icefall.ingest.delta_sink`, the audit `icefall.audit.delta`. In a cluster (`ingest_delta_pod`) the table is
on an object store (the operator holds any other: `icefall.plan.children.cluster_table_problem`), the
commit Lease a Kubernetes Lease, and the status report's figures come from the Delta log
(`icefall.ingest.delta_meter`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from icefall.api import TableFormat
from icefall.commands.common import delta_location
from icefall.commands.run import commit_lease, stop_on_signals


def run_delta(args: argparse.Namespace, st: Any, state: Any) -> int:
    """`icefall run` of a Delta table (`spec.table.format: delta`): its own writer, no catalog
    (`icefall.ingest.delta_sink`); OPTIMIZE, checkpoints and VACUUM on a thread beside the batches unless
    `spec.compaction.enabled` is false, the table suspended or `--no-maintenance` given."""
    from icefall.commands.run import ingest_delta_until_stopped
    from icefall.commit.delta_storage import is_object_store, store_name
    from icefall.commit.lease import FileLease, local_process_holder
    from icefall.plan.names import table_leases
    from icefall.plan.spark_conf import embedded_conf
    from icefall.runtime import metrics
    from icefall.spark.session import build_spark_session

    location = delta_location(st, state)
    metrics.serve(args.metrics_port)
    stop = stop_on_signals()
    print(
        f"[run] {st.metadata.name}: {', '.join(st.spec.source.topic_names)} -> delta table {location}",
        flush=True,
    )
    print("[run] starting local Spark ...", flush=True)
    maintain = st.spec.compaction.enabled and not st.spec.suspend and not args.no_maintenance
    on_s3 = is_object_store(location)  # S3, GCS or Azure
    if maintain and on_s3:  # Delta Spark's commits there are not put-if-absent (commit/DESIGN.md)
        print(
            f"[run] upkeep on {store_name(location)}: Icefall's merge, checkpoints, log cleanup and VACUUM, "
            "as the compaction pods"
        )
    spark = build_spark_session(
        [],
        extra_conf=embedded_conf(st, master=args.master, maintain=maintain and not on_s3),
        table_format=st.spec.table.format,
    )
    names = table_leases(st)
    lease = commit_lease(lambda name: FileLease.in_dir(state / "leases", name, local_process_holder()), names)
    maintenance = None
    if maintain:
        maintenance = (
            delta_pod_maintenance(st, location, state) if on_s3 else delta_maintenance(st, location, spark)
        )
    if maintenance is not None:
        maintenance.start()
    return ingest_delta_until_stopped(st, location, spark, lease, args, stop=stop, maintenance=maintenance)


def ingest_delta_pod(args: argparse.Namespace, api: Any, st: Any) -> int:
    """The driver pod's `icefall ingest` of a Delta table: `ingest_delta_until_stopped` at
    `spec.table.location` with the commit Lease as a Kubernetes Lease held under the pod's name, the pod's
    Spark conf in a Delta table's session, and the report into the StreamingTable's status (lag and
    freshness per batch, the table's figures from its log, the merges due as the compaction backlog). The
    upkeep is the compaction pods' (`compact_delta`). An offset reset request is applied before the first
    batch (`commands.reset_request`), an object store down at start waited out."""
    from icefall.commands.common import pod_holder, pod_spark
    from icefall.commands.run import ingest_delta_until_stopped
    from icefall.commit.kube_lease import KubernetesLease
    from icefall.controller.kube import Kube
    from icefall.ingest.delta_meter import DeltaMeter
    from icefall.ingest.writer_status import WriterStatusReporter
    from icefall.plan.names import table_leases
    from icefall.plan.spark_conf import DEFAULT_MASTER
    from icefall.runtime import metrics

    location = str(st.spec.table.location)
    stop = stop_on_signals()
    meter = DeltaMeter(st, location)
    report_to = WriterStatusReporter(Kube(api), args.namespace, args.name, meter=meter)
    if not reset_when_reachable(st, location, Kube(api), stop.is_set, listener=report_to.waiting):
        return 1
    print(
        f"[ingest] {st.metadata.name}: {', '.join(st.spec.source.topic_names)} -> delta table {location}",
        flush=True,
    )
    metrics.serve(args.metrics_port, required=False)
    spark = pod_spark([], st.metadata.name, "ingest", DEFAULT_MASTER, TableFormat.DELTA)
    holder = pod_holder()
    lease = commit_lease(lambda name: KubernetesLease(api, args.namespace, name, holder), table_leases(st))
    meter.start()
    try:
        return ingest_delta_until_stopped(st, location, spark, lease, args, stop=stop, report_to=report_to)
    finally:
        meter.stop()


def reset_when_reachable(
    st: Any, location: str, kube: Any, should_stop: Callable[[], bool], *, listener: Any = None
) -> bool:
    """The driver pod's offset reset request applied to the Delta table at `location` before the first batch
    (`commands.reset_request`), an object store that is down meanwhile waited out as the batches do; False:
    stopped before the store answered."""
    from icefall.commands.reset_request import apply_reset_request
    from icefall.commands.table import delta_target
    from icefall.ingest.delta_sink import delta_services
    from icefall.ingest.outages import Outages

    outages = Outages(".".join(st.table_identifier), delta_services(st.spec, location))
    outages.listener = listener
    return outages.retrying(
        lambda: apply_reset_request(st, delta_target(st, location), kube, now=datetime.now(UTC)), should_stop
    )


def compact_delta(args: argparse.Namespace, st: Any, leases: Any) -> int:
    """`icefall compact` of a Delta table in an object store (S3, GCS, Azure; the compaction pods, `-f`
    locally): Icefall's own merge and VACUUM (`icefall.compact.delta_pods`), work Leases from `leases`, no
    Spark and no catalog. A local table is the `icefall run` upkeep's (Delta's own commands): none here."""
    from icefall.commit.delta_storage import is_object_store
    from icefall.compact.delta_pods import DeltaPodRunner
    from icefall.compact.runner import serve
    from icefall.plan.delta_maintenance import delta_policy_from_spec
    from icefall.plan.names import table_leases
    from icefall.runtime import metrics

    location = st.spec.table.location
    name = st.metadata.name
    if location is None or not is_object_store(str(location)):
        print(f"[compact] {name}: a local Delta table's upkeep runs beside its batches in `icefall run`")
        return 0
    if not st.spec.compaction.enabled or st.spec.suspend:
        print(f"[compact] {name}: compaction is disabled or suspended; nothing to do", flush=True)
        return 0
    metrics.serve(args.metrics_port, required=bool(args.file))  # a pod: see metrics.serve
    runner = DeltaPodRunner(
        str(location), delta_policy_from_spec(st.spec), leases, table_leases=table_leases(st), label=name
    )
    return serve(runner, once=args.once, idle_seconds=args.idle_seconds)


def delta_maintenance(st: Any, location: str, spark: Any) -> Any:
    """`icefall run`'s upkeep of a Delta table: one item per pause, `spec.compaction.embeddedIntervalSeconds`
    apart, on a thread of its own (`icefall.compact.runner.EmbeddedMaintenance`)."""
    from icefall.compact.delta import DeltaMaintenance
    from icefall.compact.runner import EmbeddedMaintenance
    from icefall.plan.delta_maintenance import delta_policy_from_spec

    runner = DeltaMaintenance(spark, location, delta_policy_from_spec(st.spec), label=location)
    return EmbeddedMaintenance(
        runner,
        interval_seconds=st.spec.compaction.embedded_interval_seconds,
        freshness_target_seconds=st.spec.freshness.target_seconds,
    )


def delta_pod_maintenance(st: Any, location: str, state: Any) -> Any:
    """`icefall run`'s upkeep of a Delta table in an object store: the compaction pods'
    (`icefall.compact.delta_pods`), work Leases as files in `state`, one item per pause as
    `delta_maintenance`."""
    from icefall.compact.delta_pods import DeltaPodRunner
    from icefall.compact.runner import EmbeddedMaintenance, file_leases
    from icefall.plan.delta_maintenance import delta_policy_from_spec
    from icefall.plan.names import table_leases

    runner = DeltaPodRunner(
        location,
        delta_policy_from_spec(st.spec),
        file_leases(state / "leases"),
        table_leases=table_leases(st),
        label=location,
    )
    return EmbeddedMaintenance(
        runner,
        interval_seconds=st.spec.compaction.embedded_interval_seconds,
        freshness_target_seconds=st.spec.freshness.target_seconds,
    )


def verify_delta_table(st: Any, state: Any, *, ingesting: bool = False, spark: Any = None) -> Any:
    """`icefall verify` of a Delta table (at `delta_location`): read with delta-rs, by content
    (`icefall.audit.delta`; a keyed table by key, `audit_delta_keyed`). `spark`: by default a local Delta
    table's session, started after the table is found."""
    from icefall.audit import AuditError
    from icefall.audit.delta import DeltaContent, audit_delta_table
    from icefall.commit.delta import DeltaLog
    from icefall.kafka.security import librdkafka_config, spark_kafka_options

    location = delta_location(st, state)
    try:
        import deltalake  # noqa: F401 - the independent reader (a development dependency so far)
    except ImportError:
        needs = "icefall verify of a Delta table reads it with delta-rs: pip install deltalake"
        raise SystemExit(needs) from None
    if not DeltaLog(location).snapshot().exists:  # said before Spark starts
        raise AuditError(f"no Delta table at {location} (no _delta_log)")
    if spark is None:
        from icefall.plan.spark_conf import tool_conf
        from icefall.spark.session import build_spark_session

        print("[verify] starting local Spark to decode the topic's records ...", flush=True)
        spark = build_spark_session(
            [], extra_conf=tool_conf(st.metadata.name, "verify"), table_format=TableFormat.DELTA
        )
    security = st.spec.source.security
    if st.spec.key:  # the latest row per key against the topic's last change per key
        from icefall.audit.delta import audit_delta_keyed

        return audit_delta_keyed(spark, st, location, security_options=spark_kafka_options(security))
    from icefall.ingest.delta_dead_letters import dead_letter_location

    return audit_delta_table(
        location,
        st.spec.source.bootstrap_servers,
        dead_letter=dead_letter_location(st, location),
        kafka_config=librdkafka_config(security),
        content=DeltaContent(spark, st.spec, security_options=spark_kafka_options(security)),
        filter_configured=bool(st.spec.transforms.filter),
        ingesting=ingesting,
    )
