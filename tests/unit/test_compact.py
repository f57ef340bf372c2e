"""`spec.compaction` / `spec.retention`, `policy_from_spec`, path spelling, and the maintenance loop's rules.

Proves: the new spec sections default as documented and refuse what cannot be honoured (an orphan window
below one hour, minReplicas above maxReplicas, retention on a column that is not time-partitioned) with the
field's path and the fix; `policy_from_spec` converts seconds to milliseconds and finds the retention
partition field; local paths compare equal whatever their spelling, and a Hadoop checksum sidecar follows
its file; the runner claims the first item whose work Lease is free, releases it, and returns failures
instead of raising; a compaction pod whose Spark JVM exited by itself (OOM-killed) ends with exit 1;
in-process maintenance waits for its interval and never runs while ingestion is
behind; compaction pods may get/update their work Leases and create none (the operator does).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from icefall.api import ManifestError, streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.commit.lease import LeaseTimeoutError
from icefall.compact.runner import EmbeddedMaintenance, MaintenanceRunner, StepResult
from icefall.compact.view import ManifestCache, canonical_path, checksum_owner, to_local_path
from icefall.compact.worker import ItemResult, Outcome
from icefall.plan.maintenance import policy_from_spec, work_key
from icefall.plan.maintenance_items import (
    DAY_MS,
    ApplyDeletes,
    ExpireSnapshots,
    MaintenancePolicy,
    RemoveOrphans,
    TimeTransform,
    WorkItem,
)
from icefall.plan.names import TableIdentity, TableLeases, table_leases
from icefall.plan.rbac import compaction_rules

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {
    "apiVersion": "icefall.dev/v1alpha1",
    "kind": "StreamingTable",
    "metadata": {"name": "orders"},
    "spec": {
        "source": {"bootstrapServers": "127.0.0.1:9092", "topic": "orders"},
        "format": {
            "schema": [
                {"name": "id", "type": "long", "required": True},
                {"name": "region", "type": "string"},
                {"name": "ts", "type": "timestamptz", "required": True},
            ]
        },
        "table": {"partitioning": [{"field": "ts", "transform": "hour"}, {"field": "region"}]},
    },
}


def with_spec(**sections: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(sections)
    return doc


def problems_of(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ManifestError) as caught:
        streaming_table_from_object(doc)
    return {p.path: p.message for p in caught.value.problems}


def test_compaction_defaults() -> None:
    compaction = streaming_table_from_object(with_spec()).spec.compaction
    assert compaction.enabled is True
    assert (compaction.min_replicas, compaction.max_replicas) == (0, 2)
    assert compaction.target_file_size_bytes is None
    assert compaction.orphan_min_age_seconds == 3 * 86400
    assert compaction.min_snapshots_to_keep == 1
    assert streaming_table_from_object(with_spec()).spec.retention is None


def test_orphan_window_below_an_hour_is_refused_naming_the_field() -> None:
    problems = problems_of(with_spec(compaction={"orphanMinAgeSeconds": 600}))
    assert list(problems) == ["spec.compaction.orphanMinAgeSeconds"]
    assert "at least 3600" in problems["spec.compaction.orphanMinAgeSeconds"]
    streaming_table_from_object(with_spec(compaction={"orphanMinAgeSeconds": 3600}))


def test_replica_range() -> None:
    problems = problems_of(with_spec(compaction={"minReplicas": 3, "maxReplicas": 1}))
    assert "raise maxReplicas" in problems["spec.compaction.minReplicas"]
    assert "spec.compaction.maxReplicas" in problems_of(with_spec(compaction={"maxReplicas": 101}))


@pytest.mark.parametrize(
    ("field", "why"),
    [("region", "partitioned by identity, not by time"), ("id", "not in spec.table.partitioning")],
)
def test_retention_needs_a_time_partitioned_column(field: str, why: str) -> None:
    problems = problems_of(with_spec(retention={"field": field, "maxAgeSeconds": 86400}))
    message = problems["spec.retention.field"]
    assert why in message and "transform: day" in message


def test_retention_age_has_a_floor() -> None:
    assert "spec.retention.maxAgeSeconds" in problems_of(
        with_spec(retention={"field": "ts", "maxAgeSeconds": 60})
    )


def test_policy_from_spec() -> None:
    st = streaming_table_from_object(
        with_spec(
            compaction={
                "targetFileSizeBytes": 64 * 1024 * 1024,
                "maxSnapshotAgeSeconds": 3600,
                "minSnapshotsToKeep": 3,
                "orphanMinAgeSeconds": 7200,
                "rewriteDeletedPercent": 25,
            },
            retention={"field": "ts", "maxAgeSeconds": 7 * 86400},
        )
    )
    policy = policy_from_spec(st.spec)
    assert policy.target_file_size_bytes == 64 * 1024 * 1024
    assert policy.snapshot_max_age_ms == 3_600_000 and policy.snapshot_min_keep == 3
    assert policy.orphan_min_age_ms == 7_200_000
    assert policy.deleted_fraction_threshold == 0.25
    assert policy_from_spec(streaming_table_from_object(with_spec()).spec).deleted_fraction_threshold == 0.1
    assert policy.retention is not None
    assert policy.retention.partition_field == "ts_hour"
    assert policy.retention.transform is TimeTransform.HOUR
    assert policy.retention.source_column == "ts"
    assert policy.retention.max_age_ms == 7 * DAY_MS
    assert policy_from_spec(streaming_table_from_object(with_spec()).spec).retention is None


@pytest.mark.parametrize("spelling", ["file:/w/t/a.parquet", "file:///w/t/a.parquet", "/w/t/a.parquet"])
def test_local_paths_have_one_spelling(spelling: str) -> None:
    assert canonical_path(spelling) == "file:///w/t/a.parquet"
    assert to_local_path(spelling) == "/w/t/a.parquet"


def test_other_schemes_are_kept() -> None:
    assert canonical_path("s3://bucket/w/a.parquet") == "s3://bucket/w/a.parquet"
    assert canonical_path("gs://bucket/w/a.parquet") == "gs://bucket/w/a.parquet"
    assert to_local_path("s3://bucket/w/a.parquet") is None


@pytest.mark.parametrize("scheme", ["s3a", "s3n", "S3A"])
def test_hadoop_spellings_of_s3_are_s3(scheme: str) -> None:
    assert canonical_path(f"{scheme}://bucket/w/a.parquet") == "s3://bucket/w/a.parquet"


def test_a_file_listed_under_another_scheme_or_bucket_is_a_mismatch() -> None:
    from icefall.compact.view import _scheme_mismatch
    from icefall.plan.table_view import StorageObject

    def listed(path: str) -> StorageObject:
        return StorageObject(path=path, size_bytes=1, modified_ms=0)

    referenced = {"s3://bucket/w/data/a.parquet", "s3://bucket/w/metadata/v1.json"}
    same = [listed("s3://bucket/w/data/a.parquet"), listed("s3://bucket/w/data/orphan.parquet")]
    assert _scheme_mismatch(referenced, same) is None
    other = [listed("gs://bucket/w/data/a.parquet")]
    assert _scheme_mismatch(referenced, other) == (
        "s3://bucket/w/data/a.parquet",
        "gs://bucket/w/data/a.parquet",
    )
    moved = [listed("s3://copy/w/data/a.parquet")]
    assert _scheme_mismatch(referenced, moved) is not None


def test_checksum_sidecar_belongs_to_its_file() -> None:
    assert checksum_owner("file:///w/t/data/.a.parquet.crc") == "file:///w/t/data/a.parquet"
    assert checksum_owner("file:///w/t/data/a.parquet") is None
    assert checksum_owner("file:///w/t/data/.crc") is None


# ------------------------------------------------------------------------------------------ the runner


class FakeLease:
    def __init__(self, name: str, taken: set[str], log: list[str]) -> None:
        self.name, self.taken, self.log = name, taken, log

    def acquire(self, timeout: float | None = None) -> int:
        if self.name in self.taken:
            raise LeaseTimeoutError(self.name)
        self.log.append(f"acquire {self.name}")
        return 1

    def renew(self) -> None:
        pass

    def release(self, *, forget: bool = False) -> None:
        self.log.append(f"{'release+forget' if forget else 'release'} {self.name}")


class PlannedRunner(MaintenanceRunner):
    def __init__(self, work: Sequence[WorkItem], runner: Any, taken: set[str], log: list[str]) -> None:
        super().__init__(
            spark=None,  # type: ignore[arg-type]
            catalog=CatalogConfig.embedded(Path("/nonexistent")),
            identifier=("ns", "t"),
            policy=MaintenancePolicy(),
            leases=lambda name: FakeLease(name, taken, log),  # type: ignore[arg-type, return-value]
            table_leases=LEASES,
            runner=runner,
        )
        self.work = tuple(work)

    def plan(self, now_ms: int | None = None) -> tuple[WorkItem, ...]:
        return self.work


LEASES = TableLeases(TableIdentity(catalog="", catalog_uri="", namespace="ns", table="t"))


def lease_of(item: WorkItem) -> str:
    return LEASES.work_for(work_key(item))


EXPIRY = ExpireSnapshots(older_than_ms=0, retain_last=1, keep_ids=(2,), expire_ids=(1,))
ORPHANS = RemoveOrphans(older_than_ms=0, paths=("file:///w/x",))


def test_runner_claims_the_first_free_item_and_releases_it() -> None:
    log: list[str] = []
    ran: list[WorkItem] = []

    def run(spark: Any, catalog: Any, identifier: Any, item: WorkItem) -> ItemResult:
        ran.append(item)
        return ItemResult(type(item).__name__, Outcome.DONE, "ok", 0.1)

    runner = PlannedRunner([EXPIRY, ORPHANS], run, {lease_of(EXPIRY)}, log)
    step = runner.step()
    assert ran == [ORPHANS] and step.item == ORPHANS and step.busy == 1 and step.ran
    key = lease_of(ORPHANS)
    assert log == [f"acquire {key}", f"release {key}"]


def test_runner_returns_failures_and_still_releases() -> None:
    log: list[str] = []

    def fail(spark: Any, catalog: Any, identifier: Any, item: WorkItem) -> ItemResult:
        raise RuntimeError("validation failed: a file is gone")

    step = PlannedRunner([EXPIRY], fail, set(), log).step()
    assert step.item == EXPIRY and step.result is None
    assert step.error is not None and "validation failed" in step.error
    assert log[-1] == f"release {lease_of(EXPIRY)}"


def test_runner_stopped_with_sparks_jvm_says_so_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """A SIGTERM to the whole process group ends Spark's JVM under an item in flight: its Py4J error
    cannot even be turned into text (it asks the JVM). The round ends quietly and still releases."""

    class JvmGoneError(Exception):
        def __str__(self) -> str:
            raise ConnectionRefusedError(111, "Connection refused")

    def jvm_gone(spark: Any, catalog: Any, identifier: Any, item: WorkItem) -> ItemResult:
        raise JvmGoneError()

    log: list[str] = []
    runner = PlannedRunner([EXPIRY], jvm_gone, set(), log)
    exited = SimpleNamespace(poll=lambda: -15)
    runner.spark = SimpleNamespace(sparkContext=SimpleNamespace(_gateway=SimpleNamespace(proc=exited)))  # type: ignore[assignment]
    with caplog.at_level(logging.INFO):
        step = runner.step()
    assert step.item == EXPIRY and step.error == "Spark's JVM stopped"
    assert log[-1] == f"release {lease_of(EXPIRY)}"
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_runner_with_nothing_to_do() -> None:
    step = PlannedRunner([], None, set(), []).step()
    assert step == StepResult(planned=0)


def test_run_loop_sleeps_when_idle_and_stops() -> None:
    pauses: list[float] = []
    rounds = iter([False, False, True, True])
    runner = PlannedRunner([], None, set(), [])
    runner.run(lambda: next(rounds), idle_seconds=7, wait=pauses.append)
    assert pauses == [7]


DELETES = ApplyDeletes((), ("file:///w/a.parquet",), ("file:///w/a-deletes.parquet",), 10, 3, 100, "deletes")
CONFLICT = "ValidationException: Cannot commit, found new position delete for replaced data file: a.parquet"


def test_a_rewrite_lost_to_deletes_is_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def run(spark: Any, catalog: Any, identifier: Any, item: WorkItem) -> ItemResult:
        raise RuntimeError(CONFLICT)

    runner = PlannedRunner([DELETES], run, set(), [])
    with caplog.at_level(logging.INFO):
        assert runner.step().error == f"RuntimeError: {CONFLICT}"
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert "ApplyDeletes lost to ingestion's deletes (1 in a row); planned again" in caplog.text


def test_a_rewrite_that_keeps_losing_to_deletes_runs_holding_the_yield_lease() -> None:
    """Two refusals for new deletes in a row: the third attempt holds `icefall-t-yield` (ingestion waits), is
    tried once more if the batch in flight still beat it, and the lease is let go; success resets the count;
    other failures neither count nor take the lease."""
    log: list[str] = []
    outcomes = iter([CONFLICT, CONFLICT, CONFLICT, None, "disk full", None])

    def run(spark: Any, catalog: Any, identifier: Any, item: WorkItem) -> ItemResult:
        log.append("run")
        error = next(outcomes)
        if error is not None:
            raise RuntimeError(error)
        return ItemResult("ApplyDeletes", Outcome.DONE, "ok", 0.1)

    runner = PlannedRunner([DELETES], run, set(), log)
    key, lease, barrier = work_key(DELETES), lease_of(DELETES), LEASES.rewrite_yield
    assert runner.step().error and runner.step().error  # two conflicts, no yield lease yet
    assert f"acquire {barrier}" not in log and runner.conflicts == {key: 2}
    log.clear()
    third = runner.step()
    assert third.error is None and third.result is not None
    assert log == [
        f"acquire {lease}",
        f"acquire {barrier}",
        "run",
        "run",
        f"release {barrier}",
        f"release {lease}",
    ]
    assert runner.conflicts == {}
    log.clear()
    assert runner.step().error == "RuntimeError: disk full" and runner.conflicts == {}
    assert f"acquire {barrier}" not in log


def test_a_yield_lease_held_by_another_rewrite_is_not_waited_for() -> None:
    log: list[str] = []
    runner = PlannedRunner(
        [DELETES],
        lambda *_: ItemResult("ApplyDeletes", Outcome.DONE, "ok", 0.1),
        {LEASES.rewrite_yield},
        log,
    )
    runner.conflicts[work_key(DELETES)] = 5
    assert runner.step().result is not None and runner.conflicts == {}


class Report:
    def __init__(self, lag: int, freshness_seconds: float) -> None:
        self.lag, self.freshness_seconds = lag, freshness_seconds


def test_embedded_maintenance_waits_for_interval_and_for_ingestion() -> None:
    now = [100.0]
    steps: list[int] = []

    class Counting(PlannedRunner):
        def step(self, now_ms: int | None = None) -> StepResult:
            steps.append(1)
            return StepResult(0)

    embedded = EmbeddedMaintenance(
        Counting([], None, set(), []),
        interval_seconds=30,
        freshness_target_seconds=10,
        clock=lambda: now[0],
    )
    assert embedded.between_batches(Report(lag=500, freshness_seconds=8)) is None  # behind: wait
    assert embedded.between_batches(Report(lag=500, freshness_seconds=2)) is not None  # fresh enough
    now[0] += 10
    assert embedded.between_batches(None) is None  # interval not over
    now[0] += 25
    assert embedded.between_batches(None) is not None  # idle and due
    assert len(steps) == 2


def test_embedded_maintenance_on_its_thread_never_holds_up_the_batches() -> None:
    """`icefall run`'s shape: `offer` after each batch returns at once while an item runs; the thread takes
    the latest report when it is free again; `stop` waits for the item in flight."""
    running, release = threading.Event(), threading.Event()
    seen: list[object] = []

    class Slow(PlannedRunner):
        def step(self, now_ms: int | None = None) -> StepResult:
            seen.append(threading.current_thread().name)
            running.set()
            release.wait(10)
            return StepResult(1)

    embedded = EmbeddedMaintenance(Slow([], None, set(), []), interval_seconds=0, freshness_target_seconds=10)
    embedded.start()
    embedded.offer(None)
    assert running.wait(10)
    started = time.monotonic()
    for lag in (500, 0):  # two more batches while the item runs
        embedded.offer(Report(lag=lag, freshness_seconds=1))
    assert time.monotonic() - started < 1, "offer waited for the item in flight"
    assert not embedded.stop(timeout=0.2), "stop returned while the item was still running"
    release.set()
    assert embedded.stop(timeout=10)
    assert seen == ["icefall-maintenance"]  # stopped before a second step


def test_manifest_cache_reads_each_file_once_and_forgets_what_metadata_dropped() -> None:
    reads: list[str] = []

    class Manifest:
        def __init__(self, path: str) -> None:
            self.manifest_path = path

        def fetch_manifest_entry(self, io: object, discard_deleted: bool = True) -> list[str]:
            reads.append(self.manifest_path)
            return [f"{self.manifest_path}-entry"]

    class Snapshot:
        def __init__(self, manifest_list: str, manifests: list[Manifest]) -> None:
            self.manifest_list, self._manifests = manifest_list, manifests

        def manifests(self, io: object) -> list[Manifest]:
            reads.append(self.manifest_list)
            return self._manifests

    cache = ManifestCache()
    m1 = Manifest("m1")
    first = Snapshot("list-1", [m1])
    for _ in range(2):
        assert [m.manifest_path for m in cache.manifests(first, None)] == ["m1"]  # type: ignore[arg-type]
        assert cache.live_entries(m1, None) == ["m1-entry"]  # type: ignore[arg-type]
    assert reads == ["list-1", "m1"] and cache.files_read == 2
    cache.keep_only(["list-2"], ["m2"])  # list-1 expired, m1 rewritten away
    cache.manifests(first, None)  # type: ignore[arg-type]
    assert reads[-1] == "list-1" and cache.files_read == 3


def test_compaction_pods_may_use_their_own_tables_work_and_yield_leases_only() -> None:
    st = streaming_table_from_object(with_spec())
    leases = table_leases(st)
    rules = [r for r in compaction_rules(st) if r["resources"] == ["leases"]]
    (pool,) = rules  # every rule names its Leases: no `create`, which RBAC cannot restrict by name
    assert pool["resourceNames"] == [*leases.work, leases.rewrite_yield]
    assert pool["verbs"] == ["get", "update"]  # the operator creates them; released ones are kept
    assert leases.commit not in pool["resourceNames"]
    assert not any("list" in r["verbs"] or "watch" in r["verbs"] for r in compaction_rules(st))


def test_the_compaction_deployment_command_parses() -> None:
    from icefall.cli import _compact, build_parser
    from icefall.plan.workloads import COMPACT_COMMAND

    argv = [part.format(namespace="data", name="orders") for part in COMPACT_COMMAND[1:]]
    args = build_parser().parse_args(argv)
    assert args.func is _compact
    assert (args.namespace, args.name, args.file, args.once) == ("data", "orders", None, False)


def test_a_compaction_pod_whose_spark_jvm_exits_by_itself_ends_non_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The kernel OOM-killed the pod's JVM: the loop ends (exit 1, one line) so its container restarts,
    instead of planning forever with no Spark to run an item."""
    from icefall.compact.runner import Rounds, serve

    class JVM:
        exit_code: int | None = None

        def poll(self) -> int | None:
            return self.exit_code

    jvm = JVM()
    spark: Any = SimpleNamespace(sparkContext=SimpleNamespace(_gateway=SimpleNamespace(proc=jvm)))

    class Idle(Rounds):
        label = "shop.orders"
        rounds = 0

        def step(self, now_ms: int | None = None) -> StepResult:
            self.rounds += 1
            if self.rounds == 3:
                jvm.exit_code = 137
            return StepResult(0)

    runner = Idle()
    assert serve(runner, idle_seconds=0.01, spark=spark) == 1
    assert runner.rounds == 3
    assert "Spark's JVM exited by itself" in capsys.readouterr().out
