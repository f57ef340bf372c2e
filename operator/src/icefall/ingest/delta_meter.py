"""The driver's own reading of its Delta table (`spec.table.format: delta`) for its status report: what a
`TableMeter` gives the report for an Iceberg table, from the table's `_delta_log` (`icefall.commit.delta`).

- Offsets, topic id, newest produce time and records lost to retention: the `icefall.*` state of the
  latest version (the same properties as an Iceberg table's, so `TableFacts` holds them alike), from the
  newest `metaData` action replayed (below).
- The last commit: the newest version whose `commitInfo` is a batch's (`STREAMING UPDATE`, `MERGE`; not an
  epoch claim or a property change), its number as the snapshot id and its commit file's modification
  time (what Delta's own history counts) as the time.
- Files, bytes and records: the table's live `add` actions, replayed from the newest checkpoint (or version
  0) and then each commit once (versions never change): a reading costs one listing of the log's tail
  (`DeltaLog.tail`) and a GET per new version; the whole log is listed (for the commit files' times) only
  at the first reading and when a new checkpoint appears (log cleanup runs after one). Commits log cleanup
  removed before the replay read them are stood for by the checkpoint, read instead. A log without a
  checkpoint whose early commits are gone gives none of these three figures (zeros), and its state is read
  as `DeltaLog.snapshot` reads it.
- The compaction backlog of a table the compaction pods tidy (object stores, `plan.children.upkeep_in_pods`):
  the merges of small files due (`icefall.plan.delta_maintenance.delta_backlog`, the pods' own planning),
  which the operator scales the pods by; none for a table `icefall run` tidies, or while the replay is
  incomplete.
- The table's id (its Metadata action's `id`) as the report's `tableUuid`, and the Delta dead-letter
  table's as `deadLetterTableUuid` once it exists: what `deletionPolicy: Delete`'s purge checks before it
  deletes a folder (`icefall.commands.purge.purge_delta`). The dead-letter table's log is looked for at
  the first reading and again only once the writer reports a batch with dead letters (`dead_letters_seen`),
  not at every reading.

Guarantees and threading are `icefall.ingest.table_meter.Meter`'s: a failed reading never stops ingestion.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icefall.ingest.table_meter import MISSING_RETRY_SECONDS, READ_INTERVAL_SECONDS, Meter, TableReading
from icefall.plan.children import upkeep_in_pods
from icefall.plan.delta_maintenance import DeltaFile, delta_backlog, delta_policy_from_spec, partition_key
from icefall.plan.table_status import TableFacts, table_status

if TYPE_CHECKING:
    from icefall.api import StreamingTable
    from icefall.commit.delta import DeltaLog
    from icefall.commit.delta_tail import LogTail

log = logging.getLogger(__name__)

#: `commitInfo.operation` of a batch's commit (`icefall.commit.delta.commit_batch`).
BATCH_OPERATIONS = frozenset({"STREAMING UPDATE", "MERGE"})


@dataclass
class LogReplay:
    """What the commits replayed so far add up to: the live files (path → (bytes, records)) and the newest
    batch's version; `through`: the newest version replayed (-1: none)."""

    through: int = -1
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    partitions: dict[str, str] = field(default_factory=dict)  # path -> partition key, files a merge may read
    last_batch: int | None = None
    complete: bool = True  # False: a commit is missing (log cleanup), the file figures are unknown
    metadata: dict[str, Any] | None = None  # the newest metaData action replayed
    commit_ms: dict[int, int] = field(default_factory=dict)  # the log's commit files: version -> mtime (ms)
    checkpoint: int | None = None  # the newest checkpoint when the log was last listed whole

    def apply(self, version: int, actions: list[dict[str, Any]]) -> None:
        for action in actions:
            if (metadata := action.get("metaData")) is not None:
                self.metadata = metadata
            elif (added := action.get("add")) is not None:
                self.files[added["path"]] = (int(added.get("size") or 0), _records(added.get("stats")))
                self.partitions.pop(added["path"], None)
                if not added.get("deletionVector"):
                    self.partitions[added["path"]] = partition_key(added.get("partitionValues") or {})
            elif (removed := action.get("remove")) is not None:
                self.files.pop(removed["path"], None)
                self.partitions.pop(removed["path"], None)
            elif (info := action.get("commitInfo")) is not None and info.get("operation") in BATCH_OPERATIONS:
                self.last_batch = version
        self.through = version


def _records(stats: str | None) -> int:
    try:
        return int(json.loads(stats or "{}").get("numRecords") or 0)
    except (ValueError, AttributeError):
        return 0


def replay(
    log_: DeltaLog, upto: int, commits: set[int], state: LogReplay, tail: LogTail | None = None
) -> LogReplay:
    """`state` brought up to version `upto` with the commit files listed in `commits` (in place); from the
    tail's checkpoint when a commit up to it is missing (log cleanup) or nothing was read yet."""
    checkpoint = tail.checkpoint if tail is not None else None
    if tail is not None and checkpoint is not None and state.through < checkpoint:
        fresh = state.through < 0 or any(v not in commits for v in range(state.through + 1, checkpoint + 1))
        if fresh:
            _from_checkpoint(log_, state, commits, tail)
    for version in range(state.through + 1, upto + 1):
        if version not in commits:
            state.complete = False  # removed by log cleanup, and no checkpoint stands for it
            state.through = version
            continue
        try:
            actions = log_.actions(version)
        except FileNotFoundError:
            if tail is None or checkpoint is None or version > checkpoint:
                raise
            _from_checkpoint(log_, state, commits, tail)  # cleaned up meanwhile
            return replay(log_, upto, commits, state, tail)
        state.apply(version, actions)
    return state


#: How far back from a checkpoint the first reading looks for the last batch's commit.
LAST_BATCH_LOOKBACK = 100


def _from_checkpoint(log_: DeltaLog, state: LogReplay, commits: set[int], tail: LogTail) -> None:
    """`state` as of the tail's checkpoint (its live files and Metadata), the last batch kept if known, else
    looked for among the commit files at or below it (newest first, `LAST_BATCH_LOOKBACK` at most)."""
    from icefall.commit.delta_files import LogFiles

    assert tail.checkpoint is not None
    checkpoint = tail.checkpoint
    files = LogFiles.at_checkpoint(log_, checkpoint, tail.checkpoint_files)
    live = files.live.items()
    state.files = {p: (int(a.get("size") or 0), _records(a.get("stats"))) for p, a in live}
    state.partitions = {
        p: partition_key(a.get("partitionValues") or {}) for p, a in live if not a.get("deletionVector")
    }
    state.metadata, state.through, state.complete = files.metadata, checkpoint, True
    if state.last_batch is not None:
        return
    for version in range(checkpoint, max(checkpoint - LAST_BATCH_LOOKBACK, -1), -1):
        if version not in commits:
            break
        try:
            actions = log_.actions(version)
        except FileNotFoundError:
            break
        if any((a.get("commitInfo") or {}).get("operation") in BATCH_OPERATIONS for a in actions):
            state.last_batch = version
            return


def read_delta(
    log_: DeltaLog, st: StreamingTable, state: LogReplay, dead_letter_id: str | None = None
) -> TableReading | None:
    """One reading of the Delta table behind `log_` (module doc; `state`: the replay so far, advanced in
    place; `dead_letter_id`: the dead-letter table's id, if it has one yet); None while there is no
    table."""
    from icefall.commit.delta import DeltaSnapshot

    tail = log_.tail()
    latest = tail.latest
    if latest < 0:
        return None
    if state.through < 0 or tail.checkpoint != state.checkpoint:  # first reading, or cleanup may have run
        state.commit_ms, state.checkpoint = dict(log_.history().commit_file_ms), tail.checkpoint
    state.commit_ms.update(tail.commits)
    replay(log_, latest, set(state.commit_ms), state, tail)
    # The replay's newest Metadata is the latest version's when nothing was skipped; else the log's own
    # reading (from the checkpoint and the commits after it).
    done = state.complete and state.metadata is not None
    snapshot = DeltaSnapshot(latest, state.metadata) if done else log_.snapshot(latest)
    committed = snapshot.committed
    last = state.last_batch
    files = state.files.values() if state.complete else ()
    facts = TableFacts(
        offsets_by_topic={topic: dict(held.offsets) for topic, held in committed.by_topic().items()},
        topic_id=committed.topic_id,
        max_produce_time_ms=committed.max_produce_time_ms,
        lost_records=committed.lost_records,
        last_commit_ms=state.commit_ms.get(last) if last is not None else None,
        last_commit_snapshot_id=last,
        data_files=len(files),
        total_file_bytes=sum(size for size, _ in files),
        records=sum(records for _, records in files),
        snapshots=len(state.commit_ms),
        compaction_backlog=_backlog(st, state) if upkeep_in_pods(st) and state.complete else None,
    )
    table_id = str((snapshot.metadata or {}).get("id") or "")  # what a purge checks (commands.purge)
    return TableReading(
        table_id,
        dead_letter_id,
        table_status(facts),
        facts.lost_records,
        facts,
        ".".join(st.table_identifier),
    )


def _backlog(st: StreamingTable, state: LogReplay) -> int:
    files = [DeltaFile(path, state.files[path][0], key) for path, key in state.partitions.items()]
    return delta_backlog(files, delta_policy_from_spec(st.spec))


class DeltaMeter(Meter):
    """Reads the Delta table of `st` at `location` on its own thread (module doc)."""

    def __init__(
        self,
        st: StreamingTable,
        location: str,
        *,
        interval: float = READ_INTERVAL_SECONDS,
        retry: float = MISSING_RETRY_SECONDS,
    ) -> None:
        from icefall.commit.delta import DeltaLog
        from icefall.ingest.delta_dead_letters import dead_letter_location

        super().__init__(interval=interval, retry=retry)
        self.st, self.log = st, DeltaLog(location)
        self._replay = LogReplay()
        dead = dead_letter_location(st, location)
        self._dead_letters = DeltaLog(dead) if dead is not None else None
        self._dead_letter_id: str | None = None
        self._look_for_dead_letters = True  # at the first reading, then when the writer reports some

    def dead_letters_seen(self) -> None:
        self._look_for_dead_letters = True

    def read_once(self) -> TableReading | None:
        """One reading now (also kept as `latest` when there is one); None while the table is missing."""
        look = self._look_for_dead_letters and self._dead_letter_id is None
        if self._dead_letters is not None and look:  # made by the first bad record
            self._look_for_dead_letters = False
            snapshot = self._dead_letters.snapshot()
            self._dead_letter_id = (snapshot.metadata or {}).get("id") if snapshot.exists else None
        return self._keep(read_delta(self.log, self.st, self._replay, self._dead_letter_id))
