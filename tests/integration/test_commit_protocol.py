"""The commit protocol puts every batch into the table exactly once, on every catalog and storage it supports.

Proves, with pyiceberg as the writer (standing in for Spark), each test against three real catalogs: a
SQLite `SqlCatalog` on a local folder, a `SqlCatalog` on PostgreSQL and Iceberg's REST server (on
PostgreSQL), the last two with their files in the S3 object store (MinIO), so the compare-and-swap is the
one each catalog enforces (a row lock, the REST server's `assert-ref-snapshot-id`):
- in every metadata version of the table, the rows visible on `main` are exactly the records below the
  `icefall.offsets` recorded in that same version (data and offsets move in one metadata commit);
- of two writers planning from the same head, exactly one wins; the loser gets StaleHeadError — also when
  the competing commit lands inside its commit window — and no record is ever in the table twice;
- a writer with an older lease epoch is refused even when its compare-and-swap would succeed;
- a batch that does not start at the committed offsets (unless it acknowledges a gap Kafka's retention
  made, from exactly the committed offset), or comes from another topic, is refused;
- an empty table gets its first commit (through an empty genesis snapshot);
- a process killed after staging, or after committing, leaves nothing to repair: the next run cleans or
  ignores the leftover branch and resumes from the table;
- a stage holding more than one snapshot (a writer that ran twice) is refused, and a committed stage
  cannot be committed again: `main` never holds a staged snapshot twice;
- a commit whose outcome is unknown (the catalog's answer was lost) is recognised when it did land, and
  reported when it did not;
- maintenance commits (rewrites, property changes, snapshot expiry) keep the committed state;
- a maintenance commit (a delete here; Spark's rewrites in test_commit_over_maintenance.py) landing between
  staging and commit does not refuse the batch: it is re-staged on top, once, even when another maintenance
  commit wins the commit window, and for an empty batch too; but anything that is not maintenance in
  between (an ingestion commit, a foreign append, a hand-edited `icefall.offsets`) still refuses it, and so
  does maintenance the batch cannot be re-staged over (a schema change): MaintenanceConflictError;
- pipelining: a batch appended to the branch on top of one whose commit has not run yet (`next_stage`)
  lands after it, whether it was appended before that commit or inside its commit window; it is refused
  if the batch below it never lands, or lands re-staged over maintenance as another snapshot;
- and, as a canary for why all this exists: a plain pyiceberg append silently rebases onto a moved head.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.snapshots import ancestors_of

from icefall.commit import (
    STAGE_PREFIX,
    Batch,
    CommittedState,
    FencedError,
    MaintenanceConflictError,
    OffsetGapError,
    Stage,
    StageError,
    StaleHeadError,
    TopicMismatchError,
    abandon_stage,
    commit_staged,
    commit_staged_outcome,
    next_stage,
    prepare_stage,
    read_committed,
    stage_branch_name,
    staged_on,
    state_from_properties,
    sweep_stages,
)
from icefall.commit.protocol import GENESIS_PROPERTY, RESTAGED_FROM_PROPERTY
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.rest_catalog import RESTCatalogServer
from icefall.runtime import failpoints

pytestmark = pytest.mark.integration

TOPIC = "orders"
IDENTIFIER = "lake.orders"
SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("value", pa.string()),
    ]
)


CATALOGS = ["sqlite-local", "postgres-s3", "rest-s3"]


@pytest.fixture(params=CATALOGS)
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    """A fresh namespace `lake` on each catalog and storage the protocol must hold on: a SQLite catalog on a
    local folder (the embedded default), a JDBC catalog on PostgreSQL and Iceberg's REST server (itself on
    PostgreSQL), both with their files in the S3 object store."""
    if request.param == "sqlite-local":
        (tmp_path / "warehouse").mkdir()
        props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}"}
        props["warehouse"] = (tmp_path / "warehouse").as_uri()
    else:
        store: ObjectStore = request.getfixturevalue("object_store")
        store.create_bucket("protocol")
        if request.param == "postgres-s3":
            postgres: PostgresServer = request.getfixturevalue("postgres")
            props = {"type": "sql", "uri": postgres.sqlalchemy_uri}
            props["warehouse"] = f"s3://protocol/{tmp_path.name}"
        else:
            rest: RESTCatalogServer = request.getfixturevalue("rest_catalog_s3")
            props = {"type": "rest", "uri": rest.uri}
        props.update(store.properties())
    catalog = load_catalog("icefall", **props)
    catalog.create_namespace("lake")
    catalog.properties_for_child = props  # type: ignore[attr-defined]
    yield catalog
    for identifier in catalog.list_tables("lake"):
        catalog.purge_table(identifier)
    catalog.drop_namespace("lake")


@pytest.fixture
def table(catalog: Catalog) -> Table:
    return catalog.create_table(IDENTIFIER, SCHEMA)


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


# --- a tiny ingestion loop: the topic is implicit, record (p, o) has value f"p{p}-o{o}" ---------------------


def plan(state: CommittedState, sizes: Mapping[int, int], topic: str = TOPIC) -> Batch:
    start = {p: state.offsets.get(p, 0) for p in sizes}
    return Batch(
        topic,
        start=start,
        end={p: start[p] + n for p, n in sizes.items()},
        max_event_time_ms=1_000 + sum(start.values()),
        max_produce_time_ms=2_000 + sum(start.values()),
    )


def records(batch: Batch) -> pa.Table:
    keys = [(p, o) for p in sorted(batch.start) for o in range(batch.start[p], batch.end[p])]
    return pa.Table.from_pylist(
        [{"partition": p, "offset": o, "value": f"p{p}-o{o}"} for p, o in keys], schema=SCHEMA
    )


def stage_batch(
    table: Table, writer: str, attempt: int | str, sizes: Mapping[int, int]
) -> tuple[Stage, Batch]:
    stage = prepare_stage(table, stage_branch_name(writer, attempt))
    batch = plan(stage.base, sizes)
    table.append(records(batch), branch=stage.branch)
    return stage, batch


def ingest(table: Table, writer: str, attempt: int | str, sizes: Mapping[int, int], epoch: int) -> int:
    stage, batch = stage_batch(table, writer, attempt, sizes)
    return commit_staged(table, stage, batch, epoch)


def keys_on_main(table: Table, snapshot_id: int | None = None) -> list[tuple[int, int]]:
    table.refresh()
    scan = table.scan(snapshot_id=snapshot_id) if snapshot_id is not None else table.scan()
    rows = scan.to_arrow().select(["partition", "offset"]).to_pylist()
    return sorted((r["partition"], r["offset"]) for r in rows)


def expected_keys(offsets: Mapping[int, int]) -> list[tuple[int, int]]:
    return sorted((p, o) for p, end in offsets.items() for o in range(end))


def assert_exactly_once(table: Table, offsets: Mapping[int, int]) -> None:
    """The table holds every record below `offsets` once, nothing else, and says so in its properties."""
    state = read_committed(table)
    assert dict(state.offsets) == dict(offsets)
    keys = keys_on_main(table)
    assert len(keys) == len(set(keys)), "a record is in the table twice"
    assert keys == expected_keys(offsets)


def main_lineage(table: Table) -> list[int]:
    table.refresh()
    meta = table.metadata
    return [s.snapshot_id for s in ancestors_of(meta.current_snapshot(), meta)]


def stage_branches(table: Table) -> list[str]:
    """Staging branches that hold a snapshot `main` never had: a branch a commit left on `main` (for the
    writer's next batch) holds nothing of its own."""
    on_main = set(main_lineage(table))
    return sorted(
        name
        for name, ref in table.metadata.refs.items()
        if name.startswith(STAGE_PREFIX) and ref.snapshot_id not in on_main
    )


# --- tests -----------------------------------------------------------------------------------------------


def test_offsets_and_epoch_land_in_the_same_metadata_commit_as_the_data(table: Table) -> None:
    first = ingest(table, "w", 1, {0: 3, 1: 2}, epoch=1)
    second = ingest(table, "w", 2, {0: 2, 2: 4}, epoch=1)

    state = read_committed(table)
    assert state == CommittedState(
        snapshot_id=second,
        topic=TOPIC,
        offsets={0: 5, 1: 2, 2: 4},
        epoch=1,
        max_event_time_ms=1_003,
        max_produce_time_ms=2_003,
        start_offsets={0: 0, 1: 0, 2: 0},  # where each partition was first read, for the audit
    )
    assert main_lineage(table)[:2] == [second, first]
    assert stage_branches(table) == []

    # Every metadata version ever written: what main shows is exactly what the offsets in that version say.
    meta = table.metadata
    versions = [entry.metadata_file for entry in meta.metadata_log] + [table.metadata_location]
    seen_heads = set()
    for location in versions:
        version = FromInputFile.table_metadata(table.io.new_input(location))
        head = version.current_snapshot_id
        committed = state_from_properties(version.properties, head)
        visible = keys_on_main(table, head) if head is not None else []
        assert visible == expected_keys(committed.offsets), location
        seen_heads.add(head)
    assert {first, second} <= seen_heads


def test_a_batch_costs_two_catalog_commits_once_the_writers_branch_exists(
    catalog: Catalog, table: Table
) -> None:
    """The commit leaves the writer's branch at main's new head: the next batch is staged there without a
    commit of its own, so a batch is the writer's append plus the compare-and-swap."""

    def versions() -> int:
        table.refresh()
        return len(table.metadata.metadata_log)

    ingest(table, "w", 1, {0: 2}, epoch=1)  # the first batch also creates the branch
    branch = stage_branch_name("w", 1)
    for _ in range(3):
        before = versions()
        head = ingest(table, "w", 1, {0: 2, 1: 1}, epoch=1)
        assert versions() - before == 2
        assert table.metadata.refs[branch].snapshot_id == head == main_lineage(table)[0]
    assert_exactly_once(table, {0: 8, 1: 3})

    # Maintenance moves main past the branch: the next stage points it at main's head again (one commit).
    maintenance(catalog, "partition = 1")("none")
    before = versions()
    stage = prepare_stage(table, branch)
    assert versions() - before == 1
    assert stage.base.snapshot_id == table.metadata.refs[branch].snapshot_id == main_lineage(table)[0]

    # A re-stage over maintenance leaves the branch at the re-staged head as well.
    stage, batch = stage_batch(table, "w", 1, {0: 1})
    with failpoints.armed("main.after-stage", maintenance(catalog, "offset = 0")):
        outcome = commit_staged_outcome(table, stage, batch, epoch=1)
    assert outcome.restaged
    assert table.refresh().metadata.refs[branch].snapshot_id == outcome.snapshot_id == main_lineage(table)[0]
    assert keys_on_main(table) == expected_keys({0: 9})[1:]  # the deletes took partition 1 and (0, 0)


def test_a_writer_may_drop_its_branch_with_the_commit(table: Table) -> None:
    stage, batch = stage_batch(table, "w", 1, {0: 2})
    commit_staged(table, stage, batch, epoch=1, keep_branch=False)
    assert stage.branch not in table.refresh().metadata.refs
    assert_exactly_once(table, {0: 2})


def test_of_two_writers_planning_from_one_head_exactly_one_wins(table: Table) -> None:
    ingest(table, "a", 0, {0: 2}, epoch=1)
    stage_a, batch_a = stage_batch(table, "a", 1, {0: 3, 1: 1})
    stage_b, batch_b = stage_batch(table, "b", 1, {0: 3, 1: 1})  # same head, same offsets, same records
    assert stage_a.base == stage_b.base

    commit_staged(table, stage_a, batch_a, epoch=1)
    with pytest.raises(StaleHeadError):
        commit_staged(table, stage_b, batch_b, epoch=1)
    assert_exactly_once(table, {0: 5, 1: 1})

    # The loser abandons its stage, re-plans from the table and carries on where the winner stopped.
    assert abandon_stage(table, stage_b.branch)
    ingest(table, "b", 2, {0: 3, 1: 1}, epoch=1)
    assert_exactly_once(table, {0: 8, 1: 2})
    assert stage_branches(table) == []


def test_a_competing_commit_inside_the_commit_window_makes_the_loser_fail(table: Table) -> None:
    """The check before the commit passes; the catalog's compare-and-swap is what refuses."""
    stage_a, batch_a = stage_batch(table, "a", 1, {0: 4})
    stage_b, batch_b = stage_batch(table, "b", 1, {0: 4})

    def commit_a_first(name: str) -> None:
        failpoints.disarm(name)
        commit_staged(table, stage_a, batch_a, epoch=1)

    failpoints.arm("main.before-commit", commit_a_first)
    with pytest.raises(StaleHeadError):
        commit_staged(table, stage_b, batch_b, epoch=1)
    assert_exactly_once(table, {0: 4})
    assert stage_branches(table) == [stage_b.branch]  # refused: nothing changed, the stage is still there


def test_an_unrelated_metadata_change_in_the_commit_window_does_not_refuse_the_commit(table: Table) -> None:
    stage, batch = stage_batch(table, "a", 1, {0: 2})

    def change_something_else(name: str) -> None:
        failpoints.disarm(name)
        other = table.catalog.load_table(IDENTIFIER)
        other.transaction().set_properties({"owner": "data-team"}).commit_transaction()
        prepare_stage(other, stage_branch_name("b", 1))  # another writer's branch: a metadata change too

    with failpoints.armed("main.before-commit", change_something_else):
        commit_staged(table, stage, batch, epoch=1)
    assert_exactly_once(table, {0: 2})
    assert table.metadata.properties["owner"] == "data-team"


def test_a_stale_epoch_is_fenced_even_when_the_cas_would_pass(table: Table) -> None:
    ingest(table, "new", 1, {0: 2}, epoch=3)
    stage, batch = stage_batch(table, "old", 1, {0: 2})  # planned from the current head: the CAS would pass
    before = table.refresh().metadata_location
    with pytest.raises(FencedError):
        commit_staged(table, stage, batch, epoch=2)
    assert table.refresh().metadata_location == before
    assert read_committed(table).epoch == 3
    assert_exactly_once(table, {0: 2})

    # The same epoch continues; a newer one takes over and from then on fences epoch 3.
    commit_staged(table, stage, batch, epoch=3)
    ingest(table, "newer", 1, {0: 1}, epoch=4)
    with pytest.raises(FencedError):
        ingest(table, "new", 2, {0: 1}, epoch=3)
    assert_exactly_once(table, {0: 5})


def test_a_batch_must_start_where_the_table_stopped(table: Table) -> None:
    ingest(table, "w", 1, {0: 5}, epoch=1)
    head = read_committed(table)

    for wrong_start in (4, 6):  # an overlap would duplicate records, a gap would lose them
        stage = prepare_stage(table, stage_branch_name("w", f"bad{wrong_start}"))
        batch = Batch(TOPIC, start={0: wrong_start}, end={0: wrong_start + 2})
        table.append(records(batch), branch=stage.branch)
        with pytest.raises(OffsetGapError):
            commit_staged(table, stage, batch, epoch=1)

    stage = prepare_stage(table, stage_branch_name("w", "other-topic"))
    batch = plan(stage.base, {0: 1}, topic="payments")
    table.append(records(batch), branch=stage.branch)
    with pytest.raises(TopicMismatchError):
        commit_staged(table, stage, batch, epoch=1)

    # A gap Kafka's retention made is accepted only when acknowledged, from the committed offset.
    stage = prepare_stage(table, stage_branch_name("w", "retention"))
    batch = Batch(TOPIC, start={0: 7}, end={0: 8}, retention_gaps={0: 4})
    table.append(records(batch), branch=stage.branch)
    with pytest.raises(OffsetGapError, match="retention gap from 4"):
        commit_staged(table, stage, batch, epoch=1)

    assert read_committed(table) == head
    assert_exactly_once(table, {0: 5})
    stage = prepare_stage(table, stage_branch_name("w", "retention"))
    batch = Batch(TOPIC, start={0: 7}, end={0: 8}, retention_gaps={0: 5})
    table.append(records(batch), branch=stage.branch)
    commit_staged(table, stage, batch, epoch=1)
    assert read_committed(table).offsets == {0: 8}
    assert keys_on_main(table) == [*expected_keys({0: 5}), (0, 7)]

    # A partition the table has never seen may start anywhere (Kafka retention may have moved its start).
    stage = prepare_stage(table, stage_branch_name("w", 2))
    batch = Batch(TOPIC, start={0: 8, 1: 10}, end={0: 8, 1: 12})  # partition 0: nothing to read
    table.append(records(batch), branch=stage.branch)
    commit_staged(table, stage, batch, epoch=1)
    assert read_committed(table).offsets == {0: 8, 1: 12}
    assert keys_on_main(table) == [*expected_keys({0: 5}), (0, 7), (1, 10), (1, 11)]


def test_malformed_batches_are_rejected_before_any_io() -> None:
    with pytest.raises(ValueError):
        Batch("", {0: 0}, {0: 1})
    with pytest.raises(ValueError):
        Batch(TOPIC, {0: 0}, {1: 1})
    with pytest.raises(ValueError):
        Batch(TOPIC, {0: 5}, {0: 4})
    with pytest.raises(ValueError):
        Batch(TOPIC, {0: 5}, {0: 6}, retention_gaps={0: 6})


def test_the_first_commit_on_an_empty_table(table: Table) -> None:
    assert table.metadata.current_snapshot_id is None
    assert read_committed(table) == CommittedState(snapshot_id=None)

    stage = prepare_stage(table, stage_branch_name("w", 1))
    genesis = table.metadata.snapshot_by_id(stage.base.snapshot_id)  # type: ignore[arg-type]
    assert genesis is not None and genesis.parent_snapshot_id is None
    assert genesis.summary is not None and genesis.summary[GENESIS_PROPERTY] == "true"
    assert keys_on_main(table) == []

    batch = plan(stage.base, {0: 3})
    table.append(records(batch), branch=stage.branch)
    committed = commit_staged(table, stage, batch, epoch=1)
    assert main_lineage(table) == [committed, genesis.snapshot_id]
    assert_exactly_once(table, {0: 3})


CHILD = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from icefall.commit import Batch, commit_staged, prepare_stage, stage_branch_name

    args = json.loads(sys.argv[1])
    catalog = load_catalog("icefall", **args["catalog"])
    table = catalog.load_table(args["table"])
    stage = prepare_stage(table, stage_branch_name("child", 1))
    start = stage.base.offsets.get(0, 0)
    batch = Batch(args["topic"], start={0: start}, end={0: start + args["n"]})
    rows = [{"partition": 0, "offset": o, "value": f"p0-o{o}"} for o in range(start, start + args["n"])]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()), branch=stage.branch)
    commit_staged(table, stage, batch, epoch=1)
    print("survived")
    """
)


def run_child(catalog: Catalog, failpoint_spec: str, n: int) -> subprocess.CompletedProcess[str]:
    args = {
        "catalog": catalog.properties_for_child,  # type: ignore[attr-defined]
        "table": IDENTIFIER,
        "topic": TOPIC,
        "n": n,
    }
    # PYTHONPATH (set by the test plugin): this checkout's code, not the editable install's.
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.environ["PYTHONPATH"],
        failpoints.ENV_VAR: failpoint_spec,
    }
    return subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("point", ["main.after-stage", "main.before-commit"])
def test_a_process_killed_after_staging_leaves_nothing_to_repair(
    catalog: Catalog, table: Table, point: str
) -> None:
    ingest(table, "w", 1, {0: 2}, epoch=1)
    before = read_committed(table)

    child = run_child(catalog, f"{point}=exit", n=3)
    assert child.returncode == failpoints.EXIT_STATUS, child.stderr
    assert "survived" not in child.stdout

    assert read_committed(table) == before
    assert_exactly_once(table, {0: 2})
    [leftover] = stage_branches(table)

    # Ignored: a new attempt commits without looking at it; the leftover can never reach main.
    ingest(table, "w", 2, {0: 3}, epoch=1)
    assert_exactly_once(table, {0: 5})
    leftover_head = table.metadata.refs[leftover].snapshot_id
    assert leftover_head not in main_lineage(table)
    # Cleaned: the next lease holder sweeps it, and the snapshot only it referenced, away.
    # (with w's branches, which their commits left on main: they hold nothing of their own)
    assert sweep_stages(table) == sorted([leftover, stage_branch_name("w", 1), stage_branch_name("w", 2)])
    assert table.refresh().metadata.snapshot_by_id(leftover_head) is None
    assert_exactly_once(table, {0: 5})


def test_a_process_killed_after_committing_resumes_after_its_batch(catalog: Catalog, table: Table) -> None:
    ingest(table, "w", 1, {0: 2}, epoch=1)

    child = run_child(catalog, "main.after-commit=exit", n=3)
    assert child.returncode == failpoints.EXIT_STATUS, child.stderr
    assert "survived" not in child.stdout

    assert_exactly_once(table, {0: 5})  # the commit is complete: the restart re-reads it, not Kafka
    assert stage_branches(table) == []
    ingest(table, "w", 2, {0: 1}, epoch=1)
    assert_exactly_once(table, {0: 6})


def test_main_never_holds_a_staged_snapshot_twice(table: Table) -> None:
    ingest(table, "w", 0, {0: 1}, epoch=1)

    # A writer that ran twice (a retried Spark job) left two snapshots on its stage: refused as a whole.
    stage, batch = stage_batch(table, "w", 1, {0: 2})
    table.append(records(batch), branch=stage.branch)
    with pytest.raises(StageError, match="exactly one snapshot"):
        commit_staged(table, stage, batch, epoch=1)
    # Nothing written yet: refused too (an empty batch must still be staged as an empty append).
    empty_stage = prepare_stage(table, stage_branch_name("w", 2))
    with pytest.raises(StageError, match="nothing staged"):
        commit_staged(table, empty_stage, plan(empty_stage.base, {0: 0}), epoch=1)
    assert_exactly_once(table, {0: 1})

    # A committed stage cannot be committed again: main moved on past its base with it.
    assert sweep_stages(table) == sorted([stage_branch_name("w", 0), stage.branch, empty_stage.branch])
    stage, batch = stage_batch(table, "w", 3, {0: 2})
    committed = commit_staged(table, stage, batch, epoch=1)
    with pytest.raises(StaleHeadError):
        commit_staged(table, stage, batch, epoch=1)
    lineage = main_lineage(table)
    assert lineage.count(committed) == 1
    assert len(lineage) == len(set(lineage))
    assert_exactly_once(table, {0: 3})

    # A leftover branch of the same name (a crashed attempt that wrote) is dropped and made anew, not reused.
    stage, batch = stage_batch(table, "w", 4, {0: 2})
    leftover = table.metadata.refs[stage.branch].snapshot_id
    stage, batch = stage_batch(table, "w", 4, {0: 2})
    assert table.metadata.snapshot_by_id(leftover) is None
    commit_staged(table, stage, batch, epoch=1)
    assert_exactly_once(table, {0: 5})


def test_abandoning_a_stage_drops_its_branch_and_snapshot_only(table: Table) -> None:
    ingest(table, "w", 0, {0: 1}, epoch=1)
    lineage = main_lineage(table)
    stage, _ = stage_batch(table, "w", 1, {0: 2})
    staged = table.metadata.refs[stage.branch].snapshot_id
    kept, _ = stage_batch(table, "other", 1, {0: 2})

    assert abandon_stage(table, stage.branch)
    assert not abandon_stage(table, stage.branch)
    table.refresh()
    assert stage.branch not in table.metadata.refs
    assert table.metadata.snapshot_by_id(staged) is None
    assert main_lineage(table) == lineage
    assert sweep_stages(table, keep=[kept.branch]) == [stage_branch_name("w", 0)]  # at main's head
    assert stage_branches(table) == [kept.branch]


class FlakyCatalog(SqlCatalog):
    """A real SQLite catalog whose next commit fails with an error of unknown outcome, before or after."""

    fail: str | None = None

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> CommitTableResponse:
        fail, self.fail = self.fail, None
        if fail == "before":
            raise ConnectionError("catalog unreachable")
        response = super().commit_table(table, requirements, updates)
        if fail == "after":
            raise ConnectionError("catalog answer lost")
        return response


def test_a_commit_of_unknown_outcome_is_resolved_by_reading_the_table(tmp_path: Path) -> None:
    (tmp_path / "warehouse").mkdir()
    catalog = FlakyCatalog(
        "icefall", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri()
    )
    catalog.create_namespace("lake")
    table = catalog.create_table(IDENTIFIER, SCHEMA)

    stage, batch = stage_batch(table, "w", 1, {0: 2})
    catalog.fail = "after"
    committed = commit_staged(table, stage, batch, epoch=1)  # landed: reported as the success it is
    assert read_committed(table).snapshot_id == committed

    stage, batch = stage_batch(table, "w", 2, {0: 2})
    catalog.fail = "before"
    with pytest.raises(ConnectionError):
        commit_staged(table, stage, batch, epoch=1)
    assert_exactly_once(table, {0: 2})
    commit_staged(table, stage, batch, epoch=1)  # nothing landed, the stage is intact: it can be retried
    assert_exactly_once(table, {0: 4})


def test_maintenance_commits_keep_the_committed_state(table: Table) -> None:
    ingest(table, "w", 1, {0: 3}, epoch=2)
    ingest(table, "w", 2, {0: 2, 1: 2}, epoch=2)
    committed = read_committed(table)

    # A rewrite of all files (what compaction commits), an unrelated property, then expiry of history.
    table.overwrite(table.scan().to_arrow())
    table.transaction().set_properties({"write.target-file-size-bytes": "134217728"}).commit_transaction()
    sweep_stages(table)  # the writer's branches keep their snapshots (an idle writer drops its own)
    table.maintenance.expire_snapshots().older_than(datetime.now() + timedelta(seconds=1)).commit()
    table.refresh()
    assert len(table.metadata.snapshots) == 1

    after = read_committed(table)
    assert after.snapshot_id == table.metadata.current_snapshot_id != committed.snapshot_id
    assert {**after.__dict__, "snapshot_id": None} == {**committed.__dict__, "snapshot_id": None}
    ingest(table, "w", 3, {1: 1}, epoch=2)
    assert_exactly_once(table, {0: 5, 1: 3})


def maintenance(catalog: Catalog, delete: str) -> Any:
    """A failpoint action: another process deletes rows matching `delete` on main (a retention delete)."""

    def act(name: str) -> None:
        failpoints.disarm(name)
        other = catalog.load_table(IDENTIFIER)
        before = other.metadata.current_snapshot_id
        other.delete(delete)
        other.refresh()
        assert other.metadata.current_snapshot_id != before, "the maintenance delete committed nothing"

    return act


def test_a_maintenance_commit_before_the_commit_is_restaged_over(catalog: Catalog, table: Table) -> None:
    ingest(table, "w", 1, {0: 4, 1: 2}, epoch=1)
    stage, batch = stage_batch(table, "w", 2, {0: 3, 1: 1})
    staged = table.metadata.refs[stage.branch].snapshot_id

    with failpoints.armed("main.after-stage", maintenance(catalog, "partition = 1")):
        outcome = commit_staged_outcome(table, stage, batch, epoch=1)

    assert outcome.restaged and len(outcome.restaged_over) >= 1
    meta = table.refresh().metadata
    head = meta.snapshot_by_id(outcome.snapshot_id)
    assert head is not None and head.summary is not None
    assert head.parent_snapshot_id == outcome.restaged_over[-1]
    assert head.summary[RESTAGED_FROM_PROPERTY] == str(staged)
    assert head.summary["added-records"] == "4"
    assert meta.snapshot_by_id(staged) is None  # only the dropped branch reached it
    assert stage_branches(table) == []
    # The delete took partition 1's first two rows; the batch landed whole on top of it, exactly once.
    assert keys_on_main(table) == sorted([*expected_keys({0: 7}), (1, 2)])
    assert read_committed(table).offsets == {0: 7, 1: 3}
    ingest(table, "w", 3, {1: 1}, epoch=1)
    assert keys_on_main(table) == sorted([*expected_keys({0: 7}), (1, 2), (1, 3)])


def test_the_deleted_keys_a_batch_remembers_land_with_its_offsets(catalog: Catalog, table: Table) -> None:
    """cdc with sequenceBy: the deleted keys file, written through the table's FileIO (local or S3), is
    named by the commit that lands the batch, kept by a batch that names none, through a re-stage too."""
    from dataclasses import replace

    from icefall.compact.view import read_table_view
    from icefall.ingest import deleted_keys

    keys = pa.table({"id": pa.array([7, 9], pa.int64()), "_sequence": pa.array([["5"], ["6"]])})
    path = deleted_keys.store(table, keys)
    stage, batch = stage_batch(table, "w", 1, {0: 2})
    commit_staged(table, stage, replace(batch, deleted_keys=path), epoch=1)
    assert read_committed(table).deleted_keys == path
    assert deleted_keys.load(table, path) == keys
    assert path in read_table_view(table).referenced_paths  # orphan removal keeps it

    ingest(table, "w", 2, {0: 1}, epoch=1)  # names no new file: the set stays
    assert read_committed(table).deleted_keys == path
    newer = deleted_keys.store(table, keys.slice(0, 1))
    stage, batch = stage_batch(table, "w", 3, {0: 1})
    with failpoints.armed("main.after-stage", maintenance(catalog, "partition = 0")):
        outcome = commit_staged_outcome(table, stage, replace(batch, deleted_keys=newer), epoch=1)
    assert outcome.restaged
    assert read_committed(table).deleted_keys == newer
    assert deleted_keys.load(table, newer) == keys.slice(0, 1)


def test_a_second_maintenance_commit_in_the_commit_window_is_restaged_over_too(
    catalog: Catalog, table: Table
) -> None:
    """The re-stage's compare-and-swap loses to a commit landing after the re-check: it is derived again."""
    ingest(table, "w", 1, {0: 4, 1: 2, 2: 2}, epoch=1)
    stage, batch = stage_batch(table, "w", 2, {0: 2})
    failpoints.arm("main.after-stage", maintenance(catalog, "partition = 1"))
    failpoints.arm("main.before-commit", maintenance(catalog, "partition = 2"))
    outcome = commit_staged_outcome(table, stage, batch, epoch=1)
    assert len(outcome.restaged_over) >= 2  # re-derived over both deletes after the first swap lost
    assert keys_on_main(table) == expected_keys({0: 6})
    assert read_committed(table).offsets == {0: 6, 1: 2, 2: 2}
    assert stage_branches(table) == []


def test_an_empty_batch_is_restaged_over_maintenance(catalog: Catalog, table: Table) -> None:
    ingest(table, "w", 1, {0: 3}, epoch=1)
    stage = prepare_stage(table, stage_branch_name("w", 2))
    batch = Batch(TOPIC, start={0: 3, 1: 0}, end={0: 3, 1: 0})  # pins partition 1, no rows
    with table.transaction() as tx, tx.update_snapshot(branch=stage.branch).fast_append():
        pass
    with failpoints.armed("main.after-stage", maintenance(catalog, "offset = 0")):
        outcome = commit_staged_outcome(table, stage, batch, epoch=1)
    assert outcome.restaged
    assert keys_on_main(table) == [(0, 1), (0, 2)]
    assert read_committed(table).offsets == {0: 3, 1: 0}


def test_only_maintenance_in_between_is_restaged_over(catalog: Catalog, table: Table) -> None:
    ingest(table, "w", 1, {0: 4}, epoch=2)

    # Another writer's ingestion commit after the maintenance: the batch overlaps it, refused.
    stage, batch = stage_batch(table, "w", 2, {0: 2})
    other = catalog.load_table(IDENTIFIER)
    other.delete("offset = 0")
    ingest(other, "other", 1, {0: 1}, epoch=2)
    with pytest.raises(StaleHeadError) as refused:
        commit_staged(table, stage, batch, epoch=2)
    assert not isinstance(refused.value, MaintenanceConflictError)
    assert_rows = expected_keys({0: 5})[1:]
    assert keys_on_main(table) == assert_rows
    abandon_stage(table, stage.branch)

    # A foreign append (not an ingestion commit: icefall.offsets unchanged) is not maintenance either.
    stage, batch = stage_batch(table, "w", 3, {0: 2})
    other.refresh().append(records(Batch(TOPIC, {3: 0}, {3: 1})))
    with pytest.raises(StaleHeadError, match="appended rows"):
        commit_staged(table, stage, batch, epoch=2)
    abandon_stage(table, stage.branch)
    assert read_committed(table).offsets == {0: 5}

    # icefall.offsets edited by hand alongside a maintenance commit: the stage's view is stale.
    stage, batch = stage_batch(table, "w", 4, {0: 2})
    with other.refresh().transaction() as tx:
        tx.set_properties({"icefall.offsets": json.dumps({"0": 7})})
        tx.delete("partition = 3")
    with pytest.raises(StaleHeadError, match="properties changed"):
        commit_staged(table, stage, batch, epoch=2)
    abandon_stage(table, stage.branch)

    # A newer writer's epoch still fences, maintenance or not.
    other.refresh().transaction().set_properties(
        {"icefall.offsets": json.dumps({"0": 5})}
    ).commit_transaction()
    stage, batch = stage_batch(table, "w", 5, {0: 2})
    with failpoints.armed("main.after-stage", maintenance(catalog, "offset = 1")), pytest.raises(FencedError):
        commit_staged(table, stage, batch, epoch=1)
    assert keys_on_main(table) == expected_keys({0: 5})[2:]
    assert read_committed(table).offsets == {0: 5}


def test_maintenance_the_batch_cannot_be_restaged_over_is_a_maintenance_conflict(
    catalog: Catalog, table: Table
) -> None:
    from pyiceberg.types import StringType

    ingest(table, "w", 1, {0: 3}, epoch=1)
    stage, batch = stage_batch(table, "w", 2, {0: 2})
    other = catalog.load_table(IDENTIFIER)
    other.update_schema().add_column("note", StringType()).commit()
    other.refresh().delete("offset = 0")
    with pytest.raises(MaintenanceConflictError, match="schema changed"):
        commit_staged(table, stage, batch, epoch=1)
    assert read_committed(table).offsets == {0: 3}
    assert keys_on_main(table) == [(0, 1), (0, 2)]
    assert stage_branches(table) == [stage.branch]  # refused: nothing changed


def stacked_batches(table: Table) -> tuple[Stage, Batch, Stage, Batch]:
    """Batch A staged on the writer's branch, then batch B appended on top of it before A is committed,
    as a pipelining writer does: (A's stage with its snapshot recorded, A, B's stage, B)."""
    ingest(table, "w", "stage", {0: 2, 1: 1}, epoch=1)
    stage = prepare_stage(table, stage_branch_name("w", "stage"))
    a = plan(stage.base, {0: 3, 1: 1})
    table.append(records(a), branch=stage.branch)
    stage = staged_on(table, stage)
    after = next_stage(stage, a, epoch=1)
    b = plan(after.base, {0: 1, 1: 2})
    assert b.start == a.end
    table.append(records(b), branch=stage.branch)
    return stage, a, after, b


def test_a_batch_stacked_on_one_being_committed_lands_after_it(table: Table) -> None:
    stage, a, after, b = stacked_batches(table)
    with pytest.raises(StaleHeadError):
        commit_staged(table, after, b, epoch=1)  # A is not on main yet: B cannot go first
    assert commit_staged(table, stage, a, epoch=1) == stage.staged
    assert_exactly_once(table, a.end)
    # The branch still holds B on top of A, and the state A's commit gave the table is B's planned base.
    assert table.metadata.refs[stage.branch].snapshot_id != stage.staged
    assert read_committed(table) == after.base
    commit_staged(table, after, b, epoch=1)
    assert_exactly_once(table, b.end)


def test_a_batch_stacked_inside_the_commit_window_does_not_refuse_the_commit(
    catalog: Catalog, table: Table
) -> None:
    """The next batch's append lands between the check and the swap of the batch below it: the catalog
    refuses the swap (the branch moved), the check finds the branch still holding the staged snapshot
    under the new one, and the swap is made again."""
    ingest(table, "w", "stage", {0: 2}, epoch=1)
    stage = prepare_stage(table, stage_branch_name("w", "stage"))
    a = plan(stage.base, {0: 2})
    table.append(records(a), branch=stage.branch)
    stage = staged_on(table, stage)
    after = next_stage(stage, a, epoch=1)
    b = plan(after.base, {0: 3})

    def stack(name: str) -> None:
        failpoints.disarm(name)
        catalog.load_table(IDENTIFIER).append(records(b), branch=stage.branch)

    with failpoints.armed("main.before-commit", stack):
        assert commit_staged(table, stage, a, epoch=1) == stage.staged
    assert failpoints.hits("main.before-commit") >= 2  # the first swap was refused
    assert_exactly_once(table, a.end)
    commit_staged(table, after, b, epoch=1)
    assert_exactly_once(table, b.end)


def test_a_batch_stacked_on_one_that_never_lands_is_refused(table: Table) -> None:
    stage, a, after, b = stacked_batches(table)
    ingest(table, "x", 1, {0: 3, 1: 1}, epoch=1)  # another writer commits A's offsets first
    for staged, batch in ((stage, a), (after, b)):
        with pytest.raises(StaleHeadError):
            commit_staged(table, staged, batch, epoch=1)
    assert_exactly_once(table, a.end)
    assert abandon_stage(table, stage.branch)
    assert stage_branches(table) == []


def test_a_batch_stacked_on_one_restaged_over_maintenance_is_refused(catalog: Catalog, table: Table) -> None:
    """A lands re-staged as a new snapshot; B sits on A's staged snapshot, which main never holds: B's
    commit is refused (the writer plans it again), and dropping the branch drops both staged snapshots."""
    stage, a, after, b = stacked_batches(table)
    with failpoints.armed("main.after-stage", maintenance(catalog, "partition = 1")):
        outcome = commit_staged_outcome(table, stage, a, epoch=1)
    assert outcome.restaged
    meta = table.refresh().metadata
    assert meta.refs[stage.branch].snapshot_id != outcome.snapshot_id  # B is left where it was, on A
    with pytest.raises(StaleHeadError):
        commit_staged(table, after, b, epoch=1)
    assert read_committed(table).offsets == a.end
    # The delete took partition 1's rows before A, and A landed whole on top of it.
    assert keys_on_main(table) == sorted([*expected_keys({0: 5}), (1, 1)])
    assert abandon_stage(table, stage.branch)
    meta = table.refresh().metadata
    assert meta.snapshot_by_id(stage.staged) is None
    assert stage_branches(table) == []


def test_canary_a_plain_pyiceberg_append_rebases_onto_a_moved_head(catalog: Catalog, table: Table) -> None:
    """Why the protocol exists: pyiceberg's retry lands a write planned on an old head without complaint.

    If this starts failing, pyiceberg stopped rebasing; the protocol stays correct, but DESIGN.md's
    rationale should be updated.
    """
    table.append(records(Batch(TOPIC, {0: 0}, {0: 2})))
    stale = catalog.load_table(IDENTIFIER)
    table.append(records(Batch(TOPIC, {0: 2}, {0: 4})))
    stale.append(records(Batch(TOPIC, {0: 2}, {0: 4})))  # planned from the old head: should have failed
    keys = keys_on_main(table)
    assert len(keys) == 6 and len(set(keys)) == 4
