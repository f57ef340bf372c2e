"""Operator benchmark: what `icefall operator` costs the API server, CPU and memory with N StreamingTables,
and how fast it reacts to a new table and to a spec change.

    .venv/bin/python bench/operator_scale.py [--tables 10,100,300] [--window 180]
    (or: make bench-operator BENCH_ARGS="--tables 10,100 --window 120")

(Not `bench/operator.py`: a script of that name shadows the standard library's `operator` module, which
`collections` imports, so Python could not even start it.)

Starts a real kube-apiserver + etcd (devstack, loopback; no scheduler, no kubelet, no controller-manager, so
driver Pods stay Pending and nothing garbage-collects), a real Kafka broker (devstack) and the operator as
a user runs it: `python -m icefall.cli operator --namespace icefall-bench` in a subprocess, with this
checkout's `operator/src` first on PYTHONPATH and its timers at their defaults (the environment is passed
through, so ICEFALL_RESYNC_SECONDS and friends given to this script reach it). All tables live in the one
namespace `icefall-bench`; each is `examples/orders.yaml` with its own 1-partition topic on the broker and
one shared SQLite catalog file (the Iceberg tables are never created: the status pass finds none).

For each size N (ascending, cumulative: the tables of a size stay for the next one):
1. tables are created until N exist; reported: the seconds until every table has its children (a Pod and a
   Deployment with an owner reference to the table);
2. `--settle` seconds pass, then 30 s intervals until one has no write to a StreamingTable object itself
   (status excluded; kopf writes its handler bookkeeping there, so a write means handlers still run; at
   most `--settle-max`), then a quiet window of `--window` seconds in which this script makes no API
   request: `apiserver_request_total` is read from the API server's `/metrics` before and after (the scrape
   is a non-resource request, so it is not counted). Counted: resource requests only, WATCH excluded (a
   watch is counted when it ends, not by what it carries). The API server's own requests (its identity
   Lease, the `kubernetes` Service's endpoints) are measured the same way in a `--baseline` window before
   the operator starts and subtracted; the raw figure is shown too. Over the same window, the operator
   process's CPU (utime + stime from /proc/<pid>/stat) and RSS (VmRSS sampled every 5 s, and VmHWM, the
   peak since start, from /proc/<pid>/status);
3. `--probes` times: one more StreamingTable is created and the time until its children exist is taken
   (polling every 0.1 s by the `icefall.dev/streamingtable=<name>` label, owner reference checked); then
   `spec.batch.maxRecords` of another existing table is patched and the time until its driver Pod (the Pod it
   owns) carries a new `icefall.dev/spec-hash` label is taken. A Pending Pod with no node is deleted at
   once by the API server, so this is the operator's own reaction, not a Pod's shutdown. A probe that
   takes longer than `--probe-timeout` is reported as timed out.

The operator is only driven through its CLI, the CRD and the API server, so the script runs against any
checkout. Results go to bench/results/operator.md (or `--out`) and stdout, rewritten after each size (a
size that fails is reported as such). Nothing here asserts; the issue's targets are marked met or not.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, cast

import yaml
from common import cpu_seconds, load_average, machine_basics, machine_section, proc_stat, write_results
from confluent_kafka.admin import AdminClient, NewTopic
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.devstack.procs import ManagedProcess, free_port
from icefall.devstack.tools import tool_dir

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "orders.yaml"
RESULTS = ROOT / "bench" / "results" / "operator.md"
NAMESPACE = "icefall-bench"
GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
TABLES = f"{PLURAL}.{GROUP}"  # as `scrape_requests` names the resource
LABEL_TABLE = "icefall.dev/streamingtable"
LABEL_SPEC_HASH = "icefall.dev/spec-hash"
# The targets (#31, item 4).
TARGET_REQUESTS_PER_TABLE_MINUTE = 2.0
TARGET_RSS_MIB = 300
TARGET_CHILDREN_SECONDS = 5.0
TARGET_AT_TABLES = 300
Obj = dict[str, Any]


def say(text: str) -> None:
    print(f"[bench] {time.strftime('%H:%M:%S')} {text}", flush=True)


# --- the API server's request counter -------------------------------------------------------------------


class Request(NamedTuple):
    verb: str
    resource: str  # "pods", "deployments.apps", "streamingtables.icefall.dev/status", ...
    code: str


def scrape_requests(kube: KubeAPIServer) -> Counter[Request]:
    """`apiserver_request_total` of resource requests, WATCH excluded, summed over scope and version."""
    request = urllib.request.Request(f"{kube.url}/metrics")
    request.add_header("Authorization", f"Bearer {kube.admin_token}")
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        text = response.read().decode()
    wanted = "\n".join(line for line in text.splitlines() if "apiserver_request_total" in line)
    counts: Counter[Request] = Counter()
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total" or not labels.get("resource"):
                continue
            if labels.get("verb", "").startswith("WATCH"):
                continue
            group = labels.get("group", "")
            resource = labels["resource"] + (f".{group}" if group else "")
            if labels.get("subresource"):
                resource += f"/{labels['subresource']}"
            counts[Request(labels.get("verb", "?"), resource, labels.get("code", "?"))] += int(sample.value)
    return counts


def per_minute(counts: Counter[Request], seconds: float) -> dict[Request, float]:
    return {key: n * 60 / seconds for key, n in counts.items() if n}


def total(rates: dict[Request, float]) -> float:
    return sum(rates.values())


# --- the operator process ------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of /proc/<pid>/status, in bytes (empty when the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


def operator_cpu(pid: int) -> float:
    stat = proc_stat(pid)
    if stat is None:
        raise RuntimeError(f"the operator (pid {pid}) is gone")
    return cpu_seconds(stat)


def start_operator(kube: KubeAPIServer, log: Path) -> tuple[ManagedProcess, str]:
    """The operator as a user runs it, from this checkout; returns it and the `icefall` it imports."""
    health = free_port()
    src = str(ROOT / "operator" / "src")
    env = {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig),
        "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
    }
    imported = subprocess.run(
        [sys.executable, "-c", "import icefall; print(icefall.__file__)"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    command = [
        sys.executable, "-m", "icefall.cli", "operator", "--namespace", NAMESPACE,
        f"--metrics-port={free_port()}", f"--liveness=http://127.0.0.1:{health}/healthz",
    ]  # fmt: skip
    process = ManagedProcess("icefall-operator", command, log, env=env).start()

    def alive() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=3) as response:
            return bool(response.status == 200)

    process.wait_ready(alive, 120, "serving its liveness probe")
    return process, imported


def log_lines(log: Path, *words: str) -> int:
    text = log.read_text(errors="replace") if log.exists() else ""
    return sum(1 for line in text.splitlines() if any(w in line for w in words))


# --- the cluster ---------------------------------------------------------------------------------------


class Cluster:
    """The few API calls this script makes (none of them during a measuring window)."""

    def __init__(self, kube: KubeAPIServer, lake: Path, bootstrap: str) -> None:
        api = config.new_client_from_config(config_file=str(kube.kubeconfig))  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.lake = lake
        self.bootstrap = bootstrap
        self.template: Obj = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
        self.uids: dict[str, str] = {}  # table name → uid, in creation order

    def create_topics(self, names: list[str]) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names])
        for future in futures.values():
            future.result(60)

    def create_table(self, name: str) -> None:
        obj: Obj = yaml.safe_load(yaml.safe_dump(self.template))
        obj["metadata"] = {"name": name, "namespace": NAMESPACE}
        obj["spec"]["source"]["bootstrapServers"] = self.bootstrap
        obj["spec"]["source"]["topic"] = name
        obj["spec"]["table"]["name"] = name.replace("-", "_")
        obj["spec"]["table"]["catalog"] = {
            "name": "lake",
            "type": "sql",
            "uri": f"sqlite:///{self.lake / 'catalog.db'}",
            "warehouse": f"file://{self.lake / 'warehouse'}",
        }
        created = self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, obj)
        self.uids[name] = cast(Obj, created)["metadata"]["uid"]

    def patch_max_records(self, name: str, value: int) -> None:
        patch = {"spec": {"batch": {"maxRecords": value}}}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name, patch)

    def tables_with_children(self) -> set[str]:
        """Names of the tables that own a Pod and a Deployment (two namespace-wide lists)."""
        by_uid = {uid: name for name, uid in self.uids.items()}

        def owners(items: list[Any]) -> set[str]:
            return {
                by_uid[ref.uid]
                for item in items
                for ref in item.metadata.owner_references or []
                if ref.uid in by_uid
            }

        pods = self.core.list_namespaced_pod(NAMESPACE).items
        deployments = self.apps.list_namespaced_deployment(NAMESPACE).items
        return owners(pods) & owners(deployments)

    def owned(self, name: str, kind: str) -> list[Any]:
        """The Pods or Deployments labelled for table `name` and owned by it."""
        selector = f"{LABEL_TABLE}={name}"
        if kind == "pod":
            return owned_by(
                self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items, self.uids[name]
            )
        deployments = self.apps.list_namespaced_deployment(NAMESPACE, label_selector=selector).items
        return owned_by(deployments, self.uids[name])

    def driver_hash(self, name: str) -> str | None:
        pods = self.owned(name, "pod")
        return (pods[0].metadata.labels or {}).get(LABEL_SPEC_HASH) if len(pods) == 1 else None


def owned_by(items: list[Any], uid: str) -> list[Any]:
    return [i for i in items if any(r.uid == uid for r in i.metadata.owner_references or [])]


def install_crd(kube: KubeAPIServer) -> None:
    install_crds(kube, ROOT / "crds", NAMESPACE)


def poll(what: str, probe: Callable[[], object], timeout: float, interval: float = 0.1) -> float:
    """Seconds until `probe()` is truthy, polled every `interval`; infinity (said) after `timeout`."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout:
            say(f"  no {what} after {timeout:.0f} s: counted as a timeout")
            return math.inf
        time.sleep(interval)
    return time.monotonic() - start


# --- one size ------------------------------------------------------------------------------------------


@dataclass
class Window:
    seconds: float
    requests: Counter[Request]
    cpu: float
    rss_samples: list[int]
    hwm: int
    load: str


@dataclass
class Size:
    tables: int
    added: int = 0
    ready_seconds: float = float("nan")  # first create of this size → every table has children
    settle_seconds: float = float("nan")
    settle_capped: bool = False
    window: Window | None = None
    new_table: list[float] = field(default_factory=list)
    spec_change: list[float] = field(default_factory=list)
    failure: str = ""


def quiet_window(kube: KubeAPIServer, seconds: float, pid: int | None, what: str) -> Window:
    """Only /metrics scrapes and /proc reads from here; progress every 30 s."""
    say(f"{what}: quiet window of {seconds:.0f} s (no API requests from this script) ...")
    load_start = load_average()
    before = scrape_requests(kube)
    start = time.monotonic()
    cpu_start = operator_cpu(pid) if pid else 0.0
    rss: list[int] = []
    next_note = start + 30
    while (now := time.monotonic()) < start + seconds:
        if pid:
            operator_cpu(pid)  # fails at once if the operator died
            rss.append(proc_status(pid).get("VmRSS", 0))
        if now >= next_note:
            say(f"  ... {now - start:.0f} / {seconds:.0f} s")
            next_note += 30
        time.sleep(min(5.0, start + seconds - now))
    cpu = (operator_cpu(pid) - cpu_start) if pid else 0.0
    elapsed = time.monotonic() - start
    after = scrape_requests(kube)
    hwm = proc_status(pid).get("VmHWM", 0) if pid else 0
    if pid:
        rss.append(proc_status(pid).get("VmRSS", 0))
    return Window(elapsed, after - before, cpu, rss, hwm, f"{load_start} → {load_average()}")


def grow(cluster: Cluster, size: Size, timeout: float) -> None:
    """Create tables until `size.tables` exist; wait until all have children."""
    names = [f"t-{i:04d}" for i in range(len(cluster.uids), size.tables)]
    size.added = len(names)
    if names:
        cluster.create_topics(names)
    say(f"{size.tables} tables: creating {len(names)} StreamingTables ...")
    start = time.monotonic()
    for name in names:
        cluster.create_table(name)
    say(f"  created in {time.monotonic() - start:.1f} s; waiting for every table's Pod and Deployment ...")
    deadline = start + timeout
    while len(done := cluster.tables_with_children()) < len(cluster.uids):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(done)} of {len(cluster.uids)} tables had children after {timeout:.0f} s"
            )
        time.sleep(1)
    size.ready_seconds = time.monotonic() - start
    say(f"  every table has its children {size.ready_seconds:.1f} s after the first create")


def probe_new_table(cluster: Cluster, size: Size, k: int, timeout: float) -> None:
    name = f"p{size.tables}-{k}"
    cluster.create_topics([name])
    cluster.create_table(name)
    seconds = poll(
        f"Pod and Deployment of {name}",
        lambda: cluster.owned(name, "pod") and cluster.owned(name, "deployment"),
        timeout,
    )
    size.new_table.append(seconds)
    say(f"  new table {name}: children after {size.new_table[-1]:.2f} s")


def probe_spec_change(cluster: Cluster, size: Size, k: int, timeout: float) -> None:
    name = list(cluster.uids)[size.tables // 10 + k]  # a table of an earlier size: steady, not probed yet
    old = cluster.driver_hash(name)
    if old is None:
        raise RuntimeError(f"{name} has no single driver Pod with a {LABEL_SPEC_HASH} label")
    cluster.patch_max_records(name, 500_000 + size.tables * 10 + k)
    seconds = poll(
        f"driver Pod of {name} with a new spec hash",
        lambda: cluster.driver_hash(name) not in (None, old),
        timeout,
    )
    size.spec_change.append(seconds)
    say(f"  spec change on {name}: driver Pod with the new spec hash after {size.spec_change[-1]:.2f} s")


def table_writes(counts: Counter[Request]) -> int:
    """Writes to StreamingTable objects themselves (not their status): handlers still being processed."""
    return sum(n for key, n in counts.items() if key.resource == TABLES and key.verb not in ("GET", "LIST"))


def settle(args: argparse.Namespace, kube: KubeAPIServer, size: Size) -> None:
    """At least `--settle` seconds, then until a 30 s interval has no write to a StreamingTable object."""
    say(f"{size.tables} tables: settling for {args.settle:.0f} s, then until the tables are not written ...")
    start = time.monotonic()
    time.sleep(args.settle)
    while True:
        before = scrape_requests(kube)
        time.sleep(30)
        writes = table_writes(scrape_requests(kube) - before)
        size.settle_seconds = time.monotonic() - start
        if writes == 0:
            return
        if size.settle_seconds > args.settle_max:
            size.settle_capped = True
            say(f"  still {writes} writes to StreamingTables per 30 s; measuring anyway (--settle-max)")
            return
        say(f"  {writes} writes to StreamingTables in the last 30 s; settling on ...")


def measure(args: argparse.Namespace, cluster: Cluster, kube: KubeAPIServer, pid: int, size: Size) -> None:
    grow(cluster, size, timeout=max(180.0, size.added * 3.0))
    settle(args, kube, size)
    size.window = quiet_window(kube, args.window, pid, f"{size.tables} tables")
    rate = total(per_minute(size.window.requests, size.window.seconds))
    say(f"  {rate:,.0f} requests/min in the window (raw), {size.window.cpu:.1f} CPU-s")
    for k in range(args.probes):
        time.sleep(args.probe_gap)
        probe_new_table(cluster, size, k, args.probe_timeout)
        time.sleep(args.probe_gap)
        probe_spec_change(cluster, size, k, args.probe_timeout)


# --- results -------------------------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    median, worst = statistics.median(values), max(values)
    shown = [f"{v:.2f}" if math.isfinite(v) else "timed out" for v in (median, worst)]
    return f"{shown[0]} / {shown[1]} s" + (
        f" ({sum(map(math.isinf, values))} timed out)" if math.isinf(worst) else ""
    )


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**not met**")


@dataclass
class Run:
    args: argparse.Namespace
    facts: dict[str, str]
    commit: str
    operator_commit: str
    imported: str = ""
    baseline: Window | None = None
    sizes: list[Size] = field(default_factory=list)
    log_errors: int = 0
    log_tracebacks: int = 0


def net_rates(run: Run, window: Window) -> dict[str, float]:
    """Requests per minute by "VERB resource" in `window`, minus the API server's own (the baseline)."""
    by: dict[str, float] = {}
    for key, rate in per_minute(window.requests, window.seconds).items():
        by[f"{key.verb} {key.resource}"] = by.get(f"{key.verb} {key.resource}", 0.0) + rate
    if run.baseline is not None:
        for key, rate in per_minute(run.baseline.requests, run.baseline.seconds).items():
            by[f"{key.verb} {key.resource}"] = by.get(f"{key.verb} {key.resource}", 0.0) - rate
    return by


def render(run: Run) -> str:
    args = run.args
    measured = [s for s in run.sizes if s.window is not None]
    base = total(per_minute(run.baseline.requests, run.baseline.seconds)) if run.baseline else 0.0
    lines = [
        "# Operator benchmark",
        "",
        f"`bench/operator_scale.py --tables {args.tables} --window {args.window:g} --settle {args.settle:g} "
        f"--baseline {args.baseline:g} --probes {args.probes}` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, checkout {run.commit} (the operator's code, "
        f"`operator/src`, last changed in {run.operator_commit}); the operator imported `{run.imported}`.",
        "",
        "What is measured and how: the docstring of `bench/operator_scale.py`. A real kube-apiserver "
        "+ etcd and nothing else of a cluster: no scheduler, kubelet or controller-manager, so every "
        "driver Pod stays Pending (never scheduled, never running Spark), compaction Deployments get no "
        "ReplicaSets, and nothing garbage-collects. All tables in one namespace; each with its own "
        "1-partition Kafka topic on a real broker, all in one SQLite catalog where their Iceberg tables "
        "do not exist. The operator runs with its defaults (timers, leader election, log level) as a "
        "user gets them. One run on a shared 2-core machine under `nice -n 10`; the load averages show "
        "what else ran.",
        "",
        "## Summary",
        "",
        "| | " + " | ".join(f"{s.tables} tables" for s in measured) + " |",
        "|---|" + "---|" * len(measured),
    ]

    def row(label: str, value: Any) -> str:
        return f"| {label} | " + " | ".join(str(value(s)) for s in measured) + " |"

    def window(s: Size) -> Window:
        assert s.window is not None
        return s.window

    def net(s: Size) -> float:
        return total(per_minute(window(s).requests, window(s).seconds)) - base

    lines += [
        row("time until every table had its children (tables added)",
            lambda s: f"{s.ready_seconds:.1f} s ({s.added})"),
        row("settled before the window (until no writes to the tables)",
            lambda s: f"{s.settle_seconds:.0f} s" + (" (**cap: not steady**)" if s.settle_capped else "")),
        row("API requests/min, operator (raw minus the API server's own)",
            lambda s: f"{net(s):,.0f} ({net(s) + base:,.0f} - {base:,.0f})"),
        row("**API requests per table per minute**", lambda s: f"**{net(s) / s.tables:.1f}**"),
        row("operator CPU-seconds per minute", lambda s: f"{window(s).cpu * 60 / window(s).seconds:.1f}"),
        row("operator RSS in the window (mean / max sample)",
            lambda s: f"{mib(statistics.mean(window(s).rss_samples))} / {mib(max(window(s).rss_samples))}"),
        row("operator peak RSS since start (VmHWM)", lambda s: mib(window(s).hwm)),
        row("new table → its Pod and Deployment exist (median / max)", lambda s: spread(s.new_table)),
        row("spec change → driver Pod with the new spec hash (median / max)",
            lambda s: spread(s.spec_change)),
        row("window (load average start → end)", lambda s: f"{window(s).seconds:.0f} s ({window(s).load})"),
    ]  # fmt: skip
    lines += ["", *targets(measured, net), ""]
    for s in measured:
        rates = sorted(net_rates(run, window(s)).items(), key=lambda kv: -kv[1])
        lines += [
            f"## Where the requests go at {s.tables} tables",
            "",
            "Per minute in the window, minus the API server's own; top entries (verb and resource).",
            "",
            "| verb resource | per minute | per table per minute |",
            "|---|--:|--:|",
            *(f"| {k} | {r:,.1f} | {r / s.tables:.2f} |" for k, r in rates[: args.top] if r >= 0.05),
            "",
        ]
        codes: dict[str, float] = {}
        for key, r in per_minute(window(s).requests, window(s).seconds).items():
            codes[key.code] = codes.get(key.code, 0.0) + r
        lines += [
            "Response codes (raw, per minute): "
            + ", ".join(f"{c}: {r:,.1f}" for c, r in sorted(codes.items())),
            "",
        ]
    if run.baseline is not None:
        own = per_minute(run.baseline.requests, run.baseline.seconds)
        lines += [
            f"## The API server's own requests (baseline, {run.baseline.seconds:.0f} s before the operator "
            "started)",
            "",
            "| verb resource code | per minute |",
            "|---|--:|",
            *(f"| {k.verb} {k.resource} {k.code} | {r:.1f} |" for k, r in sorted(own.items())),
            "",
        ]
    failed = [s for s in run.sizes if s.failure]
    if failed or run.log_tracebacks or run.log_errors:
        lines += ["## Problems", ""]
        lines += [f"- {s.tables} tables: {s.failure}" for s in failed]
        lines += [
            f"- the operator's log: {run.log_errors} lines with ERROR, {run.log_tracebacks} with Traceback",
            "",
        ]
    return "\n".join([*lines, *machine_section(run.facts)])


def targets(measured: list[Size], net: Any) -> list[str]:
    """The issue's targets, judged on what was measured (at the largest size when 300 was not reached)."""
    if not measured:
        return ["No size was measured."]
    largest = measured[-1]
    per_table = [net(s) / s.tables for s in measured]
    fit = ""
    if len(measured) >= 2:
        slope, intercept = statistics.linear_regression(
            [s.tables for s in measured], [net(s) for s in measured]
        )
        fit = f"; a straight line through them: {intercept:,.0f} + {slope:.2f} x tables per minute"
    at = f"at {largest.tables} tables" + ("" if largest.tables >= TARGET_AT_TABLES else " (300 not measured)")
    assert largest.window is not None
    rss = max(largest.window.rss_samples)
    children = max(largest.new_table) if largest.new_table else None
    shown = "n/a" if children is None else f"{children:.2f} s (max of {len(largest.new_table)})"
    shown = shown.replace("inf s", "timed out")
    children_ok = (
        None if children is None or largest.tables < TARGET_AT_TABLES else children <= TARGET_CHILDREN_SECONDS
    )
    return [
        "## The issue's targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| API requests grow linearly with tables, <= {TARGET_REQUESTS_PER_TABLE_MINUTE:g} per table per "
        f"minute | {' / '.join(f'{p:.1f}' for p in per_table)} per table per minute{fit} "
        f"| {verdict(all(p <= TARGET_REQUESTS_PER_TABLE_MINUTE for p in per_table))} |",
        f"| operator RSS <= {TARGET_RSS_MIB} MiB at 300 tables | {mib(rss)} (max sample) {at} "
        f"| {verdict(rss <= TARGET_RSS_MIB * 2**20) if largest.tables >= TARGET_AT_TABLES else 'n/a'} |",
        f"| children of a new table within {TARGET_CHILDREN_SECONDS:g} s at 300 tables "
        f"| {shown} {at} "
        f"| {verdict(children_ok)} |",
    ]  # fmt: skip


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def machine(kube_version: str) -> dict[str, str]:
    basics = machine_basics()
    kafka_jar = sorted(tool_dir("ICEFALL_KAFKA_JARS").glob("kafka-server-[0-9]*.jar"))
    return {
        "CPU": basics["CPU"],
        "Memory": basics["Memory"],
        "Load average at start (1/5/15 min)": load_average(),
        "Nice": str(os.nice(0)),
        "OS": basics["OS"],
        "Python": basics["Python"],
        "kube-apiserver": kube_version,
        "Kafka broker": kafka_jar[0].stem.replace("kafka-server-", "") if kafka_jar else "unknown",
    }


# --- the run -------------------------------------------------------------------------------------------


def run_sizes(args: argparse.Namespace, run: Run, state: Path) -> None:
    """Start everything, measure each size; every process started here is stopped on the way out."""
    with ExitStack() as stack:
        say("starting kube-apiserver + etcd ...")
        kube = KubeAPIServer(state / "kube")
        stack.callback(kube.stop)
        kube.start()
        say("starting Kafka ...")
        broker = KafkaBroker(state / "kafka", heap="512m")
        stack.callback(broker.stop)
        broker.start()
        install_crd(kube)
        lake = state / "lake"
        lake.mkdir()
        cluster = Cluster(kube, lake, broker.bootstrap)
        run.baseline = quiet_window(kube, args.baseline, None, "baseline (no operator yet)")
        log = state / "operator.log"
        if args.keep_log:
            stack.callback(lambda: log.exists() and shutil.copy(log, args.out.with_suffix(".log")))
        say("starting the operator ...")
        operator, run.imported = start_operator(kube, log)
        stack.callback(operator.stop)  # runs before the copy below (last in, first out)
        assert operator.pid is not None
        for n in args.sizes:
            size = Size(n)
            run.sizes.append(size)
            try:
                measure(args, cluster, kube, operator.pid, size)
            except Exception as error:
                size.failure = f"{type(error).__name__}: {error}"
                say(f"{n} tables FAILED: {size.failure}")
                break
            finally:
                run.log_errors = log_lines(log, " ERROR ", "[ERROR")
                run.log_tracebacks = log_lines(log, "Traceback")
                write_results(args.out, render(run))
        say("stopping the operator, Kafka, kube-apiserver and etcd ...")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tables", default="10,100,300", help="sizes, ascending (default 10,100,300)")
    parser.add_argument("--window", type=float, default=180, help="quiet window per size, s (default 180)")
    parser.add_argument("--settle", type=float, default=60, help="wait before the window, s (default 60)")
    parser.add_argument(
        "--settle-max", type=float, default=600, help="at most this long for the tables to be left alone, s"
    )
    parser.add_argument("--baseline", type=float, default=60, help="the API server alone, s (default 60)")
    parser.add_argument("--probes", type=int, default=3, help="new tables and spec changes per size (3)")
    parser.add_argument("--probe-gap", type=float, default=3, help="pause before each probe, s (default 3)")
    parser.add_argument("--probe-timeout", type=float, default=120, help="a probe times out after, s (120)")
    parser.add_argument("--top", type=int, default=12, help="entries of each request breakdown (default 12)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the markdown")
    parser.add_argument("--keep-log", action="store_true", help="copy the operator's log beside --out")
    args = parser.parse_args(argv)
    args.sizes = sorted({int(n) for n in args.tables.split(",")})
    if not args.sizes or args.sizes[0] < 1:
        parser.error("--tables: positive sizes, e.g. 10,100,300")
    kube_bin = tool_dir("ICEFALL_KUBE_BIN") / "kube-apiserver"
    kube_version = subprocess.run(
        [str(kube_bin), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--", "operator/src") != "unknown":  # "unknown": no output, no changes
        commit += " with uncommitted changes to operator/src"
    run = Run(args, machine(kube_version), commit, git("log", "-1", "--format=%h", "--", "operator/src"))
    with tempfile.TemporaryDirectory(prefix="icefall-bench-operator-") as tmp:
        try:
            run_sizes(args, run, Path(tmp))
        except KeyboardInterrupt:
            say("interrupted: the results hold the sizes measured so far")
    write_results(args.out, render(run))
    return 0 if run.sizes and not any(s.failure for s in run.sizes) else 1


if __name__ == "__main__":
    sys.exit(main())
