"""What the `icefall` subcommands share: where local state lives, loading the manifest, the catalog it
names, an unreachable service reported in one line instead of a traceback, and what a pod's entry point
needs (its Lease holder identity, its SparkSession from the conf the operator rendered).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_DIR_VARIABLE = "ICEFALL_STATE_DIR"

#: A command line or manifest that cannot be used (argparse's own usage errors exit 2 as well).
EXIT_INVALID = 2
#: `icefall --help` lists them; each command's own codes are defined beside it (`commands.run`,
#: `plan.purge`, `controller.leader`).
HELP_EXIT_CODES = """exit codes:
  0  done; status: the table follows its topic; verify: nothing wrong found; validate: every file valid
  1  failed: a service could not be reached or refused the credentials, the table does not exist,
     verify found a problem (duplicates, gaps, wrong rows), or an unexpected error (a traceback)
  2  the command line or a manifest is invalid (validate: which field and how to fix it)
  3  run, ingest: another writer holds or took the table's commit Lease
     operator: this replica lost its leader Lease (Kubernetes restarts it as a follower)
  4  run, ingest, status: the topic was deleted and created again, or truncated below the committed
     offsets: decide, then `icefall reset-offsets` (nothing is skipped or read twice meanwhile)
  5  run, ingest: Kafka's retention deleted records before they were ingested and
     spec.source.onDataLoss is Halt; purge: refused (the table is not the one recorded)"""


def state_dir(args: argparse.Namespace, *, in_cluster: bool = False) -> Path:
    """--state-dir, else $ICEFALL_STATE_DIR, else `.icefall` here (local commands) or `<tmp>/icefall`
    (the pods' commands: their root filesystem is read-only, /tmp is an emptyDir)."""
    chosen = args.state_dir or os.environ.get(STATE_DIR_VARIABLE)
    if not chosen:
        chosen = str(Path(tempfile.gettempdir()) / "icefall") if in_cluster else ".icefall"
    return Path(chosen).resolve()


def pod_holder() -> str:
    """A Lease holder identity: the pod's name when the operator's pod spec gives it."""
    import socket

    from icefall.plan.env import ENV_POD_NAME

    return os.environ.get(ENV_POD_NAME) or f"{socket.gethostname()}-{os.getpid()}"


def pod_spark(catalogs: list[Any], table: str, role: str, master: str, table_format: Any = None) -> Any:
    """The SparkSession a pod of the StreamingTable `table` runs in `role`, with the Spark conf the operator
    rendered into its environment (`master` where it names none); `table_format` delta: a Delta table's
    session (`icefall.spark.session.delta_conf`)."""
    from icefall.api import TableFormat
    from icefall.plan.spark_conf import in_pod
    from icefall.spark.session import build_spark_session

    conf = in_pod(os.environ, table, role=role, master=master)
    return build_spark_session(catalogs, extra_conf=conf, table_format=table_format or TableFormat.ICEBERG)


def catalog_for(st: Any, state_dir: Path) -> Any:
    """`spec.table.catalog` (secrets from the environment), or the embedded catalog in `state_dir`."""
    from icefall.catalog import CatalogConfig, CatalogConfigError

    try:
        return CatalogConfig.for_table(st.spec, state_dir=state_dir)
    except CatalogConfigError as error:
        raise SystemExit(str(error)) from None


def load_table(args: argparse.Namespace) -> Any:
    from icefall.api import ManifestError, load_manifest

    try:
        st = load_manifest(Path(args.file))
    except ManifestError as error:
        print(f"{args.file} is not a valid StreamingTable:\n{error}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_INVALID) from None
    if args.bootstrap_servers:
        source = st.spec.source.model_copy(update={"bootstrap_servers": args.bootstrap_servers})
        st = st.model_copy(update={"spec": st.spec.model_copy(update={"source": source})})
    return st


def outages_for(st: Any, catalog: Any) -> Any:
    from icefall.ingest.outages import Outages, service_addresses

    label = ".".join(st.table_identifier)
    registry = st.spec.format.registry.url if st.spec.format.registry else None
    source = st.spec.source
    return Outages(
        label,
        service_addresses(
            source.bootstrap_servers,
            ", ".join(source.topic_names) or source.first_topic,
            catalog,
            registry=registry,
        ),
    )


@contextlib.contextmanager
def unreachable_is_one_line(st: Any, catalog: Any) -> Iterator[None]:
    """An unreachable Kafka, catalog, object store or schema registry ends the command with one line naming
    it and where (exit 1), not a traceback; any other error passes through."""
    from icefall.ingest.outages import classify

    try:
        yield
    except Exception as error:
        found = classify(error)
        if found is None:
            raise
        describe = outages_for(st, catalog).describe(found)
        raise SystemExit(f"icefall: {describe} ({found.reason})") from None


def delta_location(st: Any, state: Any) -> str:
    """`spec.table.location`, else the embedded warehouse in `state` plus namespace/table."""
    from icefall.ingest.delta_sink import default_location

    table = st.spec.table
    if table.location is not None:
        return str(table.location)
    return default_location(state / "warehouse", table.namespace, st.table_identifier[-1])
