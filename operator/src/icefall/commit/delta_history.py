"""Time travel in a Delta table's log (`icefall read --snapshot/--as-of` of a Delta table): which versions
the log can still rebuild, when each was committed, and which version a time means. Pure: the log's
listing comes in (`DeltaLog.history`).

- **A version can be rebuilt** from a checkpoint at or below it and every commit after that checkpoint up
  to it, or from all commits since version 0. Delta's log cleanup (`delta.logRetentionDuration`, after a
  checkpoint) removes older commit files: those versions are gone (`earliest`).
- **When a version was committed** is what Delta's own time travel (`timestampAsOf`) and DESCRIBE HISTORY
  use: the modification time of its commit file, made strictly increasing (a commit whose file is not
  newer than its predecessor's counts as 1 ms after it, Delta's `monotonizeCommitTimestamps`). Not the
  `commitInfo.timestamp` inside the file (the writer's clock, which Delta ignores for time travel).
- **A time** means the newest version committed at or before it (Delta's rule); a time after the newest
  commit means the newest version (as an Iceberg table's `--as-of` gives `main`'s head, where Delta's
  `timestampAsOf` refuses it); a time before the oldest version the log keeps is refused.

Not done: in-commit timestamps (`delta.enableInCommitTimestamps`, the `commitInfo.inCommitTimestamp` Delta
then uses instead of file times): Icefall's commits write none, so a table is never in that mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime


class VersionNotKeptError(LookupError):
    """The version asked for does not exist, or the log no longer keeps it (the message says which)."""


@dataclass(frozen=True)
class DeltaHistory:
    """A table's log as listed: each commit file's version and modification time, the checkpoints."""

    commit_file_ms: Mapping[int, int]
    checkpoints: frozenset[int] = frozenset()

    @property
    def latest(self) -> int:
        """The newest version (-1: no table)."""
        return max([*self.commit_file_ms, *self.checkpoints], default=-1)

    @property
    def earliest(self) -> int | None:
        """The oldest version the log can rebuild (None: no table)."""
        latest = self.latest
        run_start = latest + 1  # the oldest commit of the unbroken run of commits up to the newest
        while run_start - 1 in self.commit_file_ms:
            run_start -= 1
        starts = {*self.checkpoints, *({0} & set(self.commit_file_ms))}
        usable = [v for v in starts if run_start - 1 <= v <= latest]
        return min(usable, default=None)

    def committed_ms(self) -> dict[int, int]:
        """When each version the log can rebuild was committed, as Delta's time travel counts it (module
        docstring); a version whose commit file log cleanup removed (a checkpoint's) has none."""
        earliest = self.earliest
        times: dict[int, int] = {}
        previous: int | None = None
        for version in sorted(self.commit_file_ms):
            stamp = self.commit_file_ms[version]
            if previous is not None and stamp <= previous:
                stamp = previous + 1
            previous = stamp
            if earliest is not None and version >= earliest:
                times[version] = stamp
        return times

    def _kept(self) -> tuple[int, int]:
        """The oldest and newest versions the log can rebuild; VersionNotKeptError if none."""
        earliest, latest = self.earliest, self.latest
        if latest < 0:
            raise VersionNotKeptError("there is no table yet (an empty _delta_log)")
        if earliest is None:
            raise VersionNotKeptError(
                f"the log cannot rebuild any version: commits are missing below version {latest} and no "
                "checkpoint covers them"
            )
        return earliest, latest

    def check(self, version: int) -> int:
        """`version`, if the log can rebuild it; else VersionNotKeptError saying why."""
        earliest, latest = self._kept()
        if version > latest or version < 0:
            raise VersionNotKeptError(f"there is no version {version}: versions run from 0 to {latest}")
        if version < earliest:
            raise VersionNotKeptError(
                f"version {version} is no longer in the log: log cleanup (delta.logRetentionDuration) "
                f"removed it; the log keeps versions {earliest} to {latest}"
            )
        return version

    def version_at(self, moment_ms: int) -> int:
        """The newest version committed at or before `moment_ms` (after the newest commit: the newest
        version); VersionNotKeptError for a time before the oldest version the log keeps."""
        self._kept()
        times = self.committed_ms()
        if not times:
            raise VersionNotKeptError("the log keeps no commit file, so no version has a commit time")
        before = [v for v, stamp in times.items() if stamp <= moment_ms]
        if before:
            return max(before)
        oldest = min(times)
        cleaned = (
            " (older versions were removed by log cleanup, delta.logRetentionDuration)" if oldest else ""
        )
        raise VersionNotKeptError(
            f"no version was committed at or before {iso(moment_ms)}: the oldest the log keeps, version "
            f"{oldest}, was committed {iso(times[oldest])}{cleaned}"
        )


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
