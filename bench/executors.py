"""Spark executors as pods: one backlog drained by a StreamingTable's driver Pod with 1, then 2 executors.

    .venv/bin/python bench/executors.py [--executors 1,2,1,2] [--records N] [--warmup-records N]
                                        [--partitions N] [--size small|1k] [--out FILE]
    (or: make bench-executors BENCH_ARGS="...")

The e2e's cluster on this machine (`icefall.devstack.cluster.LocalCluster`: kube-apiserver + etcd, the
controller-manager, the scheduler, the kubelet on containerd running the image hack/build-image.sh builds),
one Kafka broker, MinIO and the PostgreSQL catalog (executors are containers: they reach the table only
over the network). The operator runs as a process with its default Spark master, `kubernetes`: the driver
Pod's Spark creates its executors as Pods through the API server, as in a cluster.

For each executor count N (`--executors`: 1, 2, 1, 2 by default, so each count is measured twice,
interleaved with the other, against this machine's swings), in a namespace of its own (a fresh topic,
catalog database and bucket): the operator with `ICEFALL_MIN_EXECUTORS` = `ICEFALL_MAX_EXECUTORS` = N (N
executors for the whole run, none released idle), the table without compaction (its pods would compete
with the executors for 2 cores), a warm-up backlog committed first (JVMs started, JIT warm), then
`--records` bench events produced as fast as the client goes and timed from the first record produced to
the commit that completes them, the same drain measurement as `bench/compare.py`'s. CPU (user + system)
of each pod's processes: its container's process tree on the host (`/proc`), sampled every 0.5 s, read at
that commit. The backlog is then audited by content (`compare.audit_rows`: every event exactly once, each
field equal to the event produced). Nothing asserts on time; the report is `--out` (default
bench/results/executors.md).

What this can show on a 2-core machine (stated in the report): the executors' CPU per record (flat from 1
to 2 executors: the work divides cleanly), how the tasks split between executors, and the driver's CPU per
batch, which executors do not share. Not wall throughput on a cluster: the driver, the broker, the catalog,
the object store and the cluster's own processes share the same 2 cores with the executors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import compare
from common import TreeMonitor, bench_records, load_average, machine_basics, machine_section, write_results
from kubernetes import config

from icefall.api.crd import CRD_NAME
from icefall.devstack.cluster import LocalCluster, image_refs
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.plan.names import driver_pod_name
from icefall.testing.e2e import Kubectl, Operator, make_lake, wait_for
from icefall.testing.kubeapi import JsonApi

RESULTS = compare.RESULTS / "executors.md"
REPO = Path(__file__).resolve().parents[1]
NAME = "bench-events"
GROUP_PATH = "/apis/icefall.dev/v1alpha1"
EXECUTOR_ROLE = "spark-role=executor"
FINISHED_TASK = re.compile(r"Finished task \S+ in stage \S+ \(TID \d+\)")
MIB = 2**20
Obj = dict[str, Any]


def say(line: str) -> None:
    print(f"[executors] {time.strftime('%H:%M:%S')} {line}", flush=True)


@dataclass
class Stack:
    broker: KafkaBroker
    postgres: PostgresServer
    store: ObjectStore
    cluster: LocalCluster
    rest: JsonApi
    kubectl: Kubectl
    state: Path
    args: argparse.Namespace


@dataclass
class PodCpu:
    name: str
    cpu_s: float  # over the drain
    peak_rss: int  # over the drain
    tasks: int  # tasks finished over the whole run (its log), executors only


@dataclass
class Drain:
    executors: int
    records: int
    drain_s: float
    commits: int
    driver: PodCpu
    pods: list[PodCpu]  # the executors
    replaced: bool  # an executor pod was not the same at the end as at the start of the drain
    audit: str

    @property
    def executor_cpu(self) -> float:
        return sum(p.cpu_s for p in self.pods)


@contextlib.contextmanager
def stack(args: argparse.Namespace) -> Iterator[Stack]:
    """Everything started once for the whole run, stopped in reverse order."""
    with contextlib.ExitStack() as stop:
        # Entered first, so removed last: after the node has stopped its containers and unmounted their roots.
        state = Path(stop.enter_context(tempfile.TemporaryDirectory(prefix="icefall-executors-")))
        say("starting Kafka, PostgreSQL, MinIO and the cluster (API server, controllers, kubelet) ...")
        broker = KafkaBroker(state / "kafka", heap="1g").start()
        stop.callback(broker.stop)
        postgres = PostgresServer(state / "postgres").start()
        stop.callback(postgres.stop)
        store = ObjectStore(state / "objectstore").start()
        stop.callback(store.stop)
        cluster = LocalCluster(state / "cluster", image_refs()).start()
        stop.callback(cluster.stop)
        api = config.new_client_from_config(config_file=str(cluster.api.kubeconfig))  # type: ignore[no-untyped-call]
        (state / "kubectl-home").mkdir()
        kubectl = Kubectl(cluster.api.kubeconfig, home=state / "kubectl-home")
        kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        wait_for(
            "the CRD to be Established",
            lambda: kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=30s",
                            check=False).strip().endswith("condition met"),
            timeout=60,
        )  # fmt: skip
        yield Stack(broker, postgres, store, cluster, JsonApi(api), kubectl, state, args)


def manifest(bootstrap: str, topic: str, namespace: str, catalog: Obj) -> Obj:
    """compare.py's Icefall table (the bench events, day(ts), dead letters on, 10 s target) in the lake,
    without compaction."""
    return {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "source": {
                "bootstrapServers": bootstrap,
                "topic": topic,
                "startingPosition": {"type": "earliest"},
            },
            "format": {"type": "json", "schema": compare.EVENT_SCHEMA},
            "table": {
                "namespace": compare.TABLE[0],
                "name": compare.TABLE[1],
                "catalog": catalog,
                "partitioning": [{"field": "ts", "transform": "day"}],
            },
            "freshness": {"targetSeconds": 10},
            # Ingestion alone: compaction pods would take the executors' CPU on this 2-core machine.
            "compaction": {"enabled": False},
        },
    }


def pods(s: Stack, namespace: str, selector: str) -> list[Obj]:
    """Running pods of `namespace` matching `selector`, not being deleted."""
    found: list[Obj] = s.rest.call(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", selector)]
    )["items"]
    return [
        p
        for p in found
        if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") == "Running"
    ]


def host_pid(s: Stack, pod: Obj) -> int:
    """The host pid of the pod's (only) container's first process."""
    (status,) = pod["status"]["containerStatuses"]
    pid = s.cluster.node.container_pid(status["containerID"])
    if pid is None:
        raise RuntimeError(f"no process for pod {pod['metadata']['name']} ({status['containerID']})")
    return pid


def drain(s: Stack, executors: int, round_: int) -> Drain:
    """The drain measurement with `executors` executor pods (see the module's docstring), the run's
    `round_`-th."""
    args = s.args
    namespace, topic = f"bench-executors-{round_}-{executors}", f"executors-{round_}-{executors}"
    _, words, seed, _ = compare.GROWTH_SIZES[args.size]
    s.kubectl("create", "namespace", namespace)
    lake = make_lake(namespace, s.rest, s.postgres, s.store)
    s.broker.create_topic(topic, partitions=args.partitions)
    operator = Operator(
        s.cluster.api,
        namespace,
        s.state / f"operator-{round_}-{executors}.log",
        env={
            "ICEFALL_IMAGE": s.cluster.images.icefall,
            "ICEFALL_POD_TEMPLATE": json.dumps({"common": s.cluster.pod_template()}),
            **lake.variables,
            "ICEFALL_SPARK_MASTER": "kubernetes",
            "ICEFALL_MIN_EXECUTORS": str(executors),
            "ICEFALL_MAX_EXECUTORS": str(executors),
            "ICEFALL_EXECUTOR_IDLE_TIMEOUT_SECONDS": "3600",
        },
    )
    operator.start()
    monitors: dict[str, TreeMonitor] = {}
    try:
        compare.preload(s.broker.bootstrap, topic, args.warmup_records, words, seed + 100,
                        records=bench_records(seed + 100, words, compare.WARMUP_FIRST_ID))  # fmt: skip
        st = manifest(s.broker.bootstrap, topic, namespace, lake.block)
        s.rest.call("POST", f"{GROUP_PATH}/namespaces/{namespace}/streamingtables", st)
        say(f"{executors} executor(s): table applied with a warm-up of {args.warmup_records:,} records ...")

        def commits() -> list[compare.Commit]:
            return compare.table_commits(lake.catalog)

        def explain() -> str:
            return f"--- operator\n{operator.tail()}\n--- pods\n{s.kubectl('-n', namespace, 'get', 'pods')}"

        wait_for(
            "the warm-up to be committed",
            lambda: (c := commits()) and c[-1].total_records >= args.warmup_records,
            timeout=args.timeout,
            every=1,
            details=explain,
        )
        running = wait_for(
            f"{executors} running executor pods",
            lambda: len(found := pods(s, namespace, EXECUTOR_ROLE)) == executors and found,
            timeout=args.timeout,
            every=1,
            details=explain,
        )
        (driver,) = [p for p in pods(s, namespace, "") if p["metadata"]["name"] == driver_pod_name(NAME)]
        for pod in [driver, *running]:
            monitors[pod["metadata"]["name"]] = TreeMonitor(host_pid(s, pod)).start()
        before = len(commits())
        say(f"{executors} executor(s): warm; producing {args.records:,} {args.size} records ...")
        started = time.time()
        cpu_start = {name: m.sample().cpu for name, m in monitors.items()}
        compare.preload(s.broker.bootstrap, topic, args.records, words, seed)
        done = wait_for(
            "the backlog to be committed",
            lambda: (c := commits()) and c[-1].total_records >= args.warmup_records + args.records and c,
            timeout=args.timeout,
            every=1,
            details=explain,
        )
        committed_at = done[-1].visible_ms / 1000
        after = {p["metadata"]["name"] for p in pods(s, namespace, EXECUTOR_ROLE)}
        logs = {
            p["metadata"]["name"]: s.cluster.node.pod_log(namespace, p["metadata"]["name"]) for p in running
        }
        cpu = {name: m.cpu_at(committed_at) - cpu_start[name] for name, m in monitors.items()}
        audit = compare.audit_rows(compare.committed_backlog(lake.catalog), args.records, seed, words)
    finally:
        for monitor in monitors.values():
            monitor.stop()
        operator.stop()
        s.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    usage = {
        name: PodCpu(name, cpu[name], monitors[name].peak_rss, len(FINISHED_TASK.findall(logs.get(name, ""))))
        for name in monitors
    }
    result = Drain(
        executors=executors,
        records=args.records,
        drain_s=committed_at - started,
        commits=len(done) - before,
        driver=usage.pop(driver_pod_name(NAME)),
        pods=list(usage.values()),
        replaced=after != set(usage),
        audit=audit,
    )
    say(f"{executors} executor(s): {result.records / result.drain_s:,.0f} records/s, executors "
        f"{result.records / result.executor_cpu:,.0f} records per CPU-s, driver {result.driver.cpu_s:.1f} "
        f"CPU-s over {result.commits} commits, audit: {audit}")  # fmt: skip
    # The next count starts alone: the namespace's pods gone (the namespace controller deletes them).
    wait_for(
        f"namespace {namespace}'s pods to be gone", lambda: not pods(s, namespace, ""), timeout=300, every=2
    )
    return result


def render(args: argparse.Namespace, results: list[Drain], facts: dict[str, str], started: str) -> str:
    label = compare.GROWTH_SIZES[args.size][0]
    lines = [
        "# Spark executors as pods: 1, then 2 (issue #34, item 4)",
        "",
        f"`bench/executors.py {' '.join(args.argv)}` started {started}. The module's docstring says how each "
        "figure is measured. Each row: a StreamingTable's driver Pod (client-mode Spark, `k8s://` the API "
        "server) with N executor pods (containers of the image, created by Spark), "
        f"{args.records:,} {label} events on {args.partitions} partitions drained after a warm-up of "
        f"{args.warmup_records:,}; a 10 s freshness target; the PostgreSQL catalog, files in MinIO.",
        "",
        "**Read with care**: all of it shares one 2-core machine (the driver, N executor JVMs, Kafka, "
        "PostgreSQL, MinIO, the API server, etcd, the kubelet), so wall records/s says little about a "
        "cluster; CPU-seconds per record and the split of tasks are what carries over.",
        "",
        "| executors | records/s | executors' CPU-s | records per executor CPU-s | per executor: CPU-s, "
        "tasks, peak RSS | driver CPU-s | driver CPU-s per commit | records per CPU-s (driver + executors) "
        "| commits | exactly once |",
        "|--:|--:|--:|--:|---|--:|--:|--:|--:|---|",
    ]
    for r in results:
        each = "; ".join(f"{p.cpu_s:.1f} s, {p.tasks} tasks, {p.peak_rss / MIB:,.0f} MiB" for p in r.pods)
        replaced = " (an executor was replaced)" if r.replaced else ""
        lines.append(
            f"| {r.executors} | {r.records / r.drain_s:,.0f} | {r.executor_cpu:.1f} | "
            f"{r.records / r.executor_cpu:,.0f} | {each}{replaced} | {r.driver.cpu_s:.1f} | "
            f"{r.driver.cpu_s / max(r.commits, 1):.2f} | "
            f"{r.records / (r.executor_cpu + r.driver.cpu_s):,.0f} | {r.commits} | {r.audit} |"
        )
    return "\n".join([*lines, "", *machine_section(facts)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--executors", default="1,2,1,2", help="executor counts, comma-separated, in this order"
    )
    parser.add_argument("--records", type=int, default=300_000, help="the measured backlog")
    # As many as the backlog: each executor JVM compiles the same hot code, and with a shorter warm-up
    # (50,000) that compilation doubled 2 executors' CPU per record (bench/results/scale.md, §3).
    parser.add_argument("--warmup-records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=6, help="the topic's (tasks per batch)")
    parser.add_argument("--size", default="small", choices=sorted(compare.GROWTH_SIZES))
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for a phase")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    counts = [int(n) for n in compare.comma_list(args.executors)]
    if not counts or min(counts) < 1:
        parser.error(f"--executors: positive whole numbers, comma-separated; got {args.executors!r}")
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    facts = machine_basics()
    facts["Load average at start (1/5/15 min)"] = load_average()
    with stack(args) as s:
        results = [drain(s, n, i) for i, n in enumerate(counts, 1)]
    facts["Load average at end (1/5/15 min)"] = load_average()
    write_results(args.out, render(args, results, facts, started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
