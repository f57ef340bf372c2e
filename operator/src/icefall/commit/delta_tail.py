"""The tail of a Delta log: its newest complete checkpoint and the commits after it, from a listing of the
`_delta_log` folder that starts at a known checkpoint (commit/DESIGN.md, "Checkpoints and log cleanup").
Pure: the listing comes in.

Why: a snapshot needs only the newest checkpoint and the commits after it. Listing the whole folder costs one
LIST per 1000 files and grows with the log; a listing that starts after a checkpoint known to exist
(`_last_checkpoint`, or the one this process read last; S3's `start-after`, the zero-padded names sort by
version) costs as much as the tail, which checkpoints keep short.

`tail_of(listed, floor)` says whether such a listing stands on its own: it must hold a complete checkpoint
at or after `floor` (the one at `floor` itself, or a newer one), and the commits after that checkpoint must
run without a gap to the newest. Log cleanup never deletes the newest checkpoint nor a commit after it, so
a listing that fails this was started at a checkpoint since removed (a stale `_last_checkpoint`, or a
checkpoint this process knew that cleanup removed once a newer one existed): the caller lists from further
back. A listing from the start (`floor` None) always stands.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
#: A classic checkpoint (`N.checkpoint.parquet`) or a part of a multi-part one (`N.checkpoint.o.p.parquet`).
CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?\.parquet$")
LAST_CHECKPOINT = "_last_checkpoint"


@dataclass(frozen=True)
class LogTail:
    """The newest complete checkpoint listed (None: none) with its file names, and the commit files after it
    (version → modification time, ms; without a checkpoint: every commit listed)."""

    checkpoint: int | None = None
    checkpoint_files: tuple[str, ...] = ()
    commits: Mapping[int, int] = field(default_factory=dict)

    @property
    def latest(self) -> int:
        """The newest version (-1: no table)."""
        return max([*self.commits, -1 if self.checkpoint is None else self.checkpoint])


def complete_checkpoints(names: Mapping[str, int] | list[str]) -> dict[int, tuple[str, ...]]:
    """The complete checkpoints among `names` (version → its files): a classic one, or a multi-part one
    with every part (a part missing: still being written, or torn; readers must ignore it)."""
    parts: dict[tuple[int, int], set[int]] = {}
    files: dict[tuple[int, int], list[str]] = {}
    for name in names:
        if (match := CHECKPOINT_FILE.match(name)) is None:
            continue
        version = int(match.group(1))
        total = int(match.group(3) or 1)
        parts.setdefault((version, total), set()).add(int(match.group(2) or 1))
        files.setdefault((version, total), []).append(name)
    found: dict[int, tuple[str, ...]] = {}
    for (version, total), present in parts.items():
        if present == set(range(1, total + 1)) and version not in found:
            found[version] = tuple(sorted(files[(version, total)]))
    return found


def tail_of(listed: Mapping[str, int], floor: int | None) -> LogTail | None:
    """The tail a listing of `_delta_log` (name → modification time, ms) gives, the listing having started
    at version `floor` (None: at the start); None when it does not stand on its own (module doc)."""
    checkpoints = complete_checkpoints(listed)
    newest = max(checkpoints, default=None)
    commits = {
        int(m.group(1)): ms for name, ms in listed.items() if (m := COMMIT_FILE.match(name)) is not None
    }
    if newest is None:
        return LogTail(commits=commits) if floor is None else None
    after = {v: ms for v, ms in commits.items() if v > newest}
    if floor is not None and (
        newest < floor or sorted(after) != list(range(newest + 1, newest + 1 + len(after)))
    ):
        return None
    return LogTail(newest, checkpoints[newest], after)


def last_checkpoint_version(text: bytes) -> int | None:
    """The version `_last_checkpoint` names (None: unreadable, which readers treat as absent)."""
    import json

    try:
        version = json.loads(text).get("version")
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, int) and version >= 0 else None
