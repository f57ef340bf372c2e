"""The `icefall` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from icefall import __version__
from icefall.commands.common import (
    HELP_EXIT_CODES,
    catalog_for,
    load_table,
    outages_for,
    pod_holder,
    pod_spark,
    state_dir,
)
from icefall.commands.delta import ingest_delta_pod, run_delta
from icefall.commands.read import READ_FORMATS, TABLE_ROWS, read_rows
from icefall.commands.run import (
    EXIT_DATA_LOSS,
    commit_lease,
    ingest_until_stopped,
    stop_on_signals,
    stop_spark,
)
from icefall.commands.table import reset_offsets, show_status
from icefall.commands.validate import validate as validate_manifests
from icefall.commands.verify import verify as verify_command


def _run(args: argparse.Namespace) -> int:
    from icefall.commit.lease import FileLease, local_process_holder
    from icefall.plan.leases import YIELD_LEASE_SECONDS
    from icefall.plan.names import table_leases
    from icefall.plan.spark_conf import embedded_conf
    from icefall.runtime import metrics
    from icefall.spark.session import build_spark_session

    st = load_table(args)
    state = state_dir(args)
    if st.spec.table.format.value == "delta":
        return run_delta(args, st, state)
    catalog = catalog_for(st, state)
    metrics.serve(args.metrics_port)
    stop = stop_on_signals()
    # The catalog's tables exist before Spark's JdbcCatalog looks at them; a catalog down now is waited for.
    if not outages_for(st, catalog).retrying(catalog.pyiceberg, stop.is_set):
        return 1
    print(
        f"[run] {st.metadata.name}: {', '.join(st.spec.source.topic_names) or st.spec.source.topics_text} -> "
        f"{'.'.join(st.table_identifier)}",
        flush=True,
    )
    print("[run] starting local Spark ...", flush=True)
    maintain = st.spec.compaction.enabled and not st.spec.suspend and not args.no_maintenance
    conf = embedded_conf(st, master=args.master, maintain=maintain)
    spark = build_spark_session([catalog], extra_conf=conf)
    holder = local_process_holder()
    names = table_leases(st)
    lease = commit_lease(lambda name: FileLease.in_dir(state / "leases", name, holder), names)
    yield_to = FileLease.in_dir(
        state / "leases", names.rewrite_yield, holder, duration_seconds=YIELD_LEASE_SECONDS
    )
    if not maintain:
        return ingest_until_stopped(st, catalog, spark, lease, args, stop=stop, yield_to=yield_to)
    from icefall.compact.runner import embedded_maintenance

    maintenance = embedded_maintenance(st, catalog, spark, state / "leases")
    maintenance.start()
    return ingest_until_stopped(
        st, catalog, spark, lease, args, maintenance=maintenance, stop=stop, yield_to=yield_to
    )


def _from_api(namespace: str, name: str) -> tuple[Any, Any]:
    """The pods' view: an API client and the StreamingTable `namespace/name`, which must name a catalog
    (a Delta table: its location, `plan.children.cluster_table_problem`)."""
    from icefall.api import ManifestError, streaming_table_from_object
    from icefall.controller.handlers import api_client
    from icefall.controller.kube import Kube

    api = api_client()
    try:
        st = streaming_table_from_object(Kube(api).get_streaming_table(namespace, name))
    except ManifestError as error:
        raise SystemExit(f"StreamingTable {namespace}/{name} is not valid:\n{error}") from None
    if st.spec.table.catalog is None and st.spec.table.format.value != "delta":  # a Delta table: its location
        raise SystemExit("spec.table.catalog is required in a cluster: the embedded catalog is pod-local")
    return api, st


def _ingest(args: argparse.Namespace) -> int:
    """The driver pod's entry point: the StreamingTable from the API, the commit lease as a Lease object."""
    from icefall.commit.kube_lease import KubernetesLease
    from icefall.controller.kube import Kube
    from icefall.ingest.table_meter import TableMeter
    from icefall.ingest.writer_status import WriterStatusReporter
    from icefall.plan.leases import YIELD_LEASE_SECONDS
    from icefall.plan.names import table_leases
    from icefall.plan.spark_conf import DEFAULT_MASTER

    api, st = _from_api(args.namespace, args.name)
    if st.spec.table.format.value == "delta":
        return ingest_delta_pod(args, api, st)
    catalog = catalog_for(st, state_dir(args, in_cluster=True))
    stop = stop_on_signals()
    # The table's figures, backlog and uuid, read with this pod's credentials: the operator reads no table.
    meter = TableMeter(st, catalog)
    report_to = WriterStatusReporter(Kube(api), args.namespace, args.name, meter=meter)
    at_start = outages_for(st, catalog)
    at_start.listener = report_to.waiting  # a catalog unreachable from the start is in status too
    if not at_start.retrying(catalog.pyiceberg, stop.is_set):
        return 1
    from icefall.commands.reset_request import apply_reset_request
    from icefall.commands.table import iceberg_target

    target = iceberg_target(st, catalog.pyiceberg())
    apply_reset_request(st, target, Kube(api), now=datetime.now(UTC))  # before the first batch
    print(
        f"[ingest] {st.metadata.name}: "
        f"{', '.join(st.spec.source.topic_names) or st.spec.source.topics_text} -> "
        f"{'.'.join(st.table_identifier)}",
        flush=True,
    )
    from icefall.runtime import metrics

    metrics.serve(args.metrics_port, required=False)
    spark = pod_spark([catalog], st.metadata.name, "ingest", DEFAULT_MASTER)
    holder = pod_holder()
    names = table_leases(st)
    lease = commit_lease(lambda name: KubernetesLease(api, args.namespace, name, holder), names)
    yield_to = KubernetesLease(
        api, args.namespace, names.rewrite_yield, holder, duration_seconds=YIELD_LEASE_SECONDS
    )
    meter.start()
    try:
        return ingest_until_stopped(
            st, catalog, spark, lease, args, stop=stop, yield_to=yield_to, report_to=report_to
        )
    finally:
        meter.stop()


def _compact(args: argparse.Namespace) -> int:
    """The compaction pods' entry point (`--namespace/--name`: the StreamingTable from the API, work Leases
    in Kubernetes) and its local twin (`-f`: a manifest, work Leases as files in `--state-dir`)."""
    from icefall.compact.runner import file_leases, serve, tables_runner

    if bool(args.file) == bool(args.namespace and args.name):
        raise SystemExit("give either -f <manifest> or --namespace and --name")
    state = state_dir(args, in_cluster=not args.file)
    if args.file:
        st = load_table(args)
        leases = file_leases(state / "leases")
    else:
        from icefall.commit.kube_lease import KubernetesLease
        from icefall.plan.leases import WORK_LEASE_SECONDS

        api, st = _from_api(args.namespace, args.name)
        holder = pod_holder()

        def leases(name: str) -> Any:
            return KubernetesLease(api, args.namespace, name, holder, duration_seconds=WORK_LEASE_SECONDS)

    if st.spec.table.format.value == "delta":  # no catalog, no Spark: Icefall's own merge and VACUUM
        from icefall.commands.delta import compact_delta

        return compact_delta(args, st, leases)
    if not st.spec.compaction.enabled or st.spec.suspend:
        print(f"[compact] {st.metadata.name}: compaction is disabled or suspended; nothing to do", flush=True)
        return 0
    from icefall.runtime import metrics

    metrics.serve(args.metrics_port, required=bool(args.file))  # a pod: see metrics.serve
    catalog = catalog_for(st, state)
    catalog.pyiceberg()
    spark = pod_spark([catalog], st.metadata.name, "compact", args.master)
    try:
        runner = tables_runner(st, catalog, spark, leases)  # every table it writes, taking turns
        return serve(runner, once=args.once, idle_seconds=args.idle_seconds, spark=spark)
    finally:
        stop_spark(spark)


def _purge(args: argparse.Namespace) -> int:
    """The purge Job's entry point (`--namespace/--name`: the StreamingTable from the API) and its local
    twin (`-f`): drop the table and its dead-letter table if they are the recorded ones (commands.purge)."""
    from icefall.commands.purge import purge

    if bool(args.file) == bool(args.namespace and args.name):
        raise SystemExit("give either -f <manifest> or --namespace and --name")
    if args.file:
        st = load_table(args)
    else:
        _, st = _from_api(args.namespace, args.name)
    state = state_dir(args, in_cluster=not args.file)
    if st.spec.table.format.value == "delta":  # its folder, without a catalog
        from icefall.commands.common import delta_location
        from icefall.commands.purge import purge_delta

        return purge_delta(st, delta_location(st, state), args, _last_words)
    return purge(args, st, catalog_for(st, state).pyiceberg(make_folders=False), _last_words)


def _operator(args: argparse.Namespace) -> int:
    import kopf

    import icefall.controller.handlers  # noqa: F401  (registers the handlers)
    from icefall.runtime import metrics

    if args.namespace and args.all_namespaces:
        raise SystemExit("give --namespace or --all-namespaces, not both")
    from icefall.controller.logs import configure_logging

    configure_logging(args.log_level, json_lines=args.log_format == "json")
    metrics.serve(args.metrics_port)
    namespaces = args.namespace or []
    election = None
    if args.leader_elect:
        from icefall.controller.handlers import api_client
        from icefall.controller.leader import LeaderElection, StandbyHealth

        lease_namespace = (
            args.leader_election_namespace
            or os.environ.get("ICEFALL_POD_NAMESPACE")
            or (namespaces[0] if namespaces else "default")
        )
        election = LeaderElection(api_client(), lease_namespace, duration_seconds=args.leader_lease_seconds)
        standby = StandbyHealth(args.liveness)  # a follower is alive, not broken
        try:
            election.acquire()
        finally:
            standby.stop()
        election.start_renewing()
    else:
        from icefall.controller import metrics as operator_metrics

        operator_metrics.LEADER.set(1)  # alone, this process is the one that reconciles
    try:
        kopf.run(
            standalone=True,
            namespaces=namespaces,
            clusterwide=not namespaces,
            liveness_endpoint=args.liveness,
        )
    finally:
        if election is not None:
            election.release()
    return 0


def _reset_offsets(args: argparse.Namespace) -> int:
    """-f: reset here (`commands.table`); --namespace/--name: ask the driver in the cluster."""
    if args.namespace or args.name:
        from icefall.commands.reset_request import request_reset

        return request_reset(args)
    return reset_offsets(args)


STATE_DIR_HELP = (
    "embedded catalog, warehouse, leases (default: $ICEFALL_STATE_DIR, else .icefall; "
    "compact --namespace/--name: <tmp>/icefall)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icefall",
        description="Kafka topics in, compacted Apache Iceberg tables out, exactly once.",
        epilog=HELP_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"icefall {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # The order here is the order `icefall --help` lists them in.
    _add_run(commands)
    _add_compact(commands)
    _add_ingest(commands)
    _add_operator(commands)
    _add_purge(commands)
    _add_table_tools(commands)
    _add_read(commands)
    _add_validate(commands)
    return parser


def _table_command(commands: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A subcommand that reads one StreamingTable manifest."""
    command: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
    command.add_argument("-f", "--file", required=True, help="the StreamingTable manifest (YAML)")
    command.add_argument("--state-dir", help=STATE_DIR_HELP)
    command.add_argument("--bootstrap-servers", help="override spec.source.bootstrapServers")
    return command


def _add_run(commands: Any) -> None:
    """`icefall run`: local ingestion."""
    run = _table_command(commands, "run", "ingest the topic into the table on local Spark (embedded default)")
    run.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    run.add_argument("--until-caught-up", action="store_true", help="stop once the table has caught up")
    run.add_argument(
        "--max-seconds", type=float, default=0, help="stop after this long (0: run until Ctrl-C)"
    )
    run.add_argument("--lease-timeout", type=float, default=60, help="seconds to wait for the commit lease")
    run.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics here (0: off)")
    run.add_argument("--no-maintenance", action="store_true", help="no in-process compaction between batches")
    run.set_defaults(func=_run)


def _add_compact(commands: Any) -> None:
    """`icefall compact`: the maintenance worker."""
    compact = commands.add_parser("compact", help="compaction and maintenance worker (the compaction pods)")
    compact.add_argument("-f", "--file", help="a StreamingTable manifest (local mode, file Leases)")
    compact.add_argument("--namespace", help="namespace of the StreamingTable (in a cluster)")
    compact.add_argument("--name", help="name of the StreamingTable (in a cluster)")
    compact.add_argument("--state-dir", help=STATE_DIR_HELP)
    compact.add_argument("--bootstrap-servers", help="override spec.source.bootstrapServers")
    compact.add_argument("--master", default="local[2]", help="Spark master unless the pod's conf sets it")
    compact.add_argument("--once", action="store_true", help="one round (at most one item), then exit")
    compact.add_argument("--idle-seconds", type=float, default=30, help="pause when there is nothing to do")
    compact.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics (0: off)")
    compact.set_defaults(func=_compact)


def _add_ingest(commands: Any) -> None:
    """`icefall ingest`: the driver pod's command."""
    ingest = commands.add_parser("ingest", help="the driver pod: ingest the StreamingTable read from the API")
    ingest.add_argument("--namespace", required=True, help="namespace of the StreamingTable")
    ingest.add_argument("--name", required=True, help="name of the StreamingTable")
    ingest.add_argument("--state-dir", help="scratch space (default: $ICEFALL_STATE_DIR, else <tmp>/icefall)")
    ingest.add_argument("--lease-timeout", type=float, default=None, help="seconds to wait for the lease")
    ingest.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics (0: off)")
    ingest.set_defaults(func=_ingest, until_caught_up=False, max_seconds=0)


def _add_operator(commands: Any) -> None:
    """`icefall operator`: the Kubernetes operator."""
    operator = commands.add_parser("operator", help="run the Kubernetes operator (kopf)")
    operator.add_argument(
        "--namespace", action="append", help="watch this namespace (repeatable; default: all namespaces)"
    )
    operator.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    operator.add_argument(
        "--liveness", help="serve kopf's liveness probe here, e.g. http://0.0.0.0:8080/healthz"
    )
    operator.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics (0: off)")
    operator.add_argument(
        "--log-level", default="info", type=str.lower, choices=["debug", "info", "warning", "error"]
    )
    operator.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="json: one JSON object per line"
    )
    operator.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reconcile only while holding the Lease icefall-operator-leader (default: on)",
    )
    operator.add_argument(
        "--leader-election-namespace",
        help="namespace of the leader Lease (default: $ICEFALL_POD_NAMESPACE, else the first --namespace)",
    )
    operator.add_argument(
        "--leader-lease-seconds", type=int, default=15, help="leader Lease duration (renewed every third)"
    )
    operator.set_defaults(func=_operator)


def _add_purge(commands: Any) -> None:
    """`icefall purge`: deletionPolicy Delete's Job."""
    purge = commands.add_parser(
        "purge", help="drop the table, its dead-letter and route tables if each is the recorded one (uuid)"
    )
    purge.add_argument("-f", "--file", help="a StreamingTable manifest (local mode)")
    purge.add_argument("--namespace", help="namespace of the StreamingTable (in a cluster)")
    purge.add_argument("--name", help="name of the StreamingTable (in a cluster)")
    purge.add_argument("--state-dir", help=STATE_DIR_HELP)
    purge.add_argument("--table-uuid", required=True, help="drop the table only if its table-uuid is this")
    purge.add_argument(
        "--route-table-uuid",
        action="append",
        metavar="TABLE=UUID",
        help="drop this route table (namespace.name) only if its table-uuid is UUID; repeat per route",
    )
    purge.add_argument(
        "--dead-letter-table-uuid", help="drop the dead-letter table only if its table-uuid is this"
    )
    purge.set_defaults(func=_purge, bootstrap_servers=None)


def _add_table_tools(commands: Any) -> None:
    """`icefall reset-offsets`, `status` and `verify`."""
    reset = commands.add_parser(
        "reset-offsets",
        help="after the topic was recreated or truncated: go on from its current records (-f: here; "
        "--namespace/--name: ask the table's driver in a cluster)",
    )
    reset.add_argument("-f", "--file", help="the StreamingTable manifest (YAML): reset from here")
    reset.add_argument("--namespace", help="namespace of a StreamingTable in a cluster (with --name)")
    reset.add_argument("--name", help="name of a StreamingTable in a cluster: its driver resets, once")
    reset.add_argument("--state-dir", help=STATE_DIR_HELP)
    reset.add_argument("--bootstrap-servers", help="override spec.source.bootstrapServers")
    reset.add_argument(
        "--to",
        choices=["earliest", "latest"],
        default="earliest",
        help="earliest: every record the topic holds now (default); latest: only records written from now",
    )
    reset.set_defaults(func=_reset_offsets)
    status = _table_command(commands, "status", "print committed offsets, lag and freshness")
    _output_option(status)
    status.set_defaults(func=show_status)
    verify = _table_command(
        commands, "verify", "audit the table against the topic: duplicates, gaps, dead letters"
    )
    _output_option(verify)
    verify.add_argument(
        "--ingesting",
        action="store_true",
        help="ingestion is running: dead letters past the commit are pending",
    )
    verify.set_defaults(func=verify_command)


def _output_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-o", "--output", choices=["text", "json"], default="text", help="text (default) or json, for scripts"
    )


def _add_validate(commands: Any) -> None:
    """`icefall validate`: offline manifest checks."""
    validate = commands.add_parser(
        "validate",
        help="check StreamingTable manifests offline, as the API server's schema and CEL rules do (exit 2: "
        "invalid)",
    )
    validate.add_argument(
        "-f", "--file", action="append", required=True, help="a StreamingTable manifest (YAML; repeatable)"
    )
    validate.add_argument(
        "--cluster",
        action="store_true",
        help="also refuse what the operator refuses in a cluster (no spec.table.catalog, pod problems)",
    )
    _output_option(validate)
    validate.set_defaults(func=validate_manifests)


def _add_read(commands: Any) -> None:
    """`icefall read`: a fresh read."""
    read = _table_command(
        commands,
        "read",
        "read the table plus the topic's records after its last commit, up to now (a fresh read)",
    )
    read.add_argument("--sql", help='Spark SQL over the result, exposed as view t ("SELECT ... FROM t")')
    read.add_argument(
        "--table",
        metavar="NAMESPACE.NAME",
        help="routed: spec.table (default), a route's table or a table spec.dynamicRoute created",
    )
    when = read.add_mutually_exclusive_group()
    when.add_argument(
        "--snapshot",
        type=int,
        help="start from this snapshot of main (default: its head); format delta: this version",
    )
    when.add_argument(
        "--as-of",
        help="start from the snapshot main was at then (ISO 8601; no zone: UTC); format delta: the newest "
        "version committed at or before then",
    )
    read.add_argument(
        "--format", choices=READ_FORMATS, default="table", help="output format (default: table)"
    )
    read.add_argument("--output", help="write the rows here (default: stdout; parquet needs it)")
    read.add_argument(
        "--limit", type=int, help=f"at most this many rows (table format: {TABLE_ROWS} by default)"
    )
    read.set_defaults(func=read_rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from pyiceberg.exceptions import NoSuchTableError

    from icefall.catalog import CatalogCredentialsRefusedError
    from icefall.catalog.refusal import refusal
    from icefall.commit.errors import LayoutChangedError
    from icefall.ingest.planning import DataLossHaltedError
    from icefall.kafka.admin import KafkaCredentialsRefusedError, KafkaUnavailableError, TopicNotFoundError
    from icefall.kafka.registry import MissingRegistrySecretError, RegistryError
    from icefall.kafka.security import MissingSecretError
    from icefall.spark.session import SparkJarsMissingError

    one_line = (
        SparkJarsMissingError,
        KafkaUnavailableError,
        TopicNotFoundError,
        RegistryError,  # refused credentials, no such subject, a latest schema of another format
        MissingRegistrySecretError,
        MissingSecretError,  # a credential spec.source.security references is not set
        CatalogCredentialsRefusedError,  # names the catalog and the secretProperties to check
        LayoutChangedError,  # a Delta table's partitioning is not the spec's
    )
    try:
        return int(args.func(args))
    except (CatalogCredentialsRefusedError, KafkaCredentialsRefusedError) as error:
        # In a pod, the operator reads the reason in the termination message (plan.conditions.driver_refusal).
        catalog = isinstance(error, CatalogCredentialsRefusedError)
        _last_words(f"{'Catalog' if catalog else 'Kafka'}CredentialsRefused: {error}")
        raise SystemExit(f"icefall: {error}") from None
    except DataLossHaltedError as error:
        # One line naming the partitions, the lost offsets and the fix; a code of its own; in a pod, the
        # termination message the operator turns into the reason DataLossHalted (plan.conditions).
        _last_words(f"DataLossHalted: {error}")
        print(f"icefall: {error}", file=sys.stderr, flush=True)
        return EXIT_DATA_LOSS
    except one_line as error:
        raise SystemExit(f"icefall: {error}") from None
    except NoSuchTableError as error:
        raise SystemExit(f"icefall: the table does not exist yet (nothing was ingested): {error}") from None
    except Exception as error:
        from icefall.ingest.outages import classify

        refused = refusal(error)  # refused later than when the client was opened (a revoked token)
        if refused is not None:
            line = f"the catalog refused the credentials ({refused})"
            _last_words(f"CatalogCredentialsRefused: {line}")
            raise SystemExit(f"icefall: {line}") from None
        found = classify(error)  # commands without an address book of their own: the client's words
        if found is None:
            raise
        raise SystemExit(f"icefall: cannot reach {found.service.display_name} ({found.reason})") from None


def _last_words(line: str) -> None:
    """`line` into the container's termination message, when there is one (in a pod)."""
    from icefall.runtime.failpoints import last_words

    last_words(line)


if __name__ == "__main__":
    sys.exit(main())
