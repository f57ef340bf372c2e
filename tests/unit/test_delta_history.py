"""Time travel in a Delta table's log (`icefall.commit.delta_history`), without Spark: which versions the
log can rebuild (from version 0, or from a checkpoint after log cleanup), when each was committed (the
commit files' times made strictly increasing, as Delta counts them), which version a time means (the newest
at or before it; after the newest commit, the newest), and the one-line refusals `icefall read` prints
before Spark starts: a version that never was, one log cleanup removed, a time before the oldest kept
version, a `--table` a Delta table does not have. Reading the rows of an older version:
tests/integration/test_delta_tables.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from icefall.commit.batch import Batch
from icefall.commit.delta import DeltaLog, commit_batch, create_table
from icefall.commit.delta_history import DeltaHistory, VersionNotKeptError

pytestmark = pytest.mark.unit

SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


def test_every_version_is_kept_until_log_cleanup_then_from_the_checkpoint_on() -> None:
    whole = DeltaHistory({0: 100, 1: 200, 2: 300})
    assert (whole.earliest, whole.latest) == (0, 2)
    assert whole.check(0) == 0
    # Cleanup after a checkpoint at 2 removed commits 0 and 1 (and may keep 2's file or not).
    for commits in ({2: 300, 3: 400, 4: 500}, {3: 400, 4: 500}):
        cleaned = DeltaHistory(commits, frozenset({2}))
        assert (cleaned.earliest, cleaned.latest) == (2, 4)
        assert cleaned.check(2) == 2
        with pytest.raises(VersionNotKeptError, match=r"version 1 is no longer in the log: log cleanup"):
            cleaned.check(1)
    # An older checkpoint whose commits after it are gone cannot rebuild anything before the newer one.
    assert DeltaHistory({5: 1, 6: 2}, frozenset({1, 4})).earliest == 4
    with pytest.raises(VersionNotKeptError, match=r"there is no version 3: versions run from 0 to 2"):
        whole.check(3)
    with pytest.raises(VersionNotKeptError, match=r"no version -1"):
        whole.check(-1)
    with pytest.raises(VersionNotKeptError, match="no table yet"):
        DeltaHistory({}).check(0)


def test_commit_times_increase_strictly_as_delta_counts_them() -> None:
    # Version 2's file is older than version 1's (another writer's clock, a copied log): 1 ms after it.
    history = DeltaHistory({0: 1000, 1: 5000, 2: 4000, 3: 5000, 4: 9000})
    assert history.committed_ms() == {0: 1000, 1: 5000, 2: 5001, 3: 5002, 4: 9000}
    # Versions the log no longer rebuilds have no time (nor does one whose commit file cleanup removed).
    assert DeltaHistory({1: 10, 3: 30, 4: 40}, frozenset({3})).committed_ms() == {3: 30, 4: 40}
    assert DeltaHistory({3: 30}, frozenset({2})).committed_ms() == {3: 30}


def test_a_time_means_the_newest_version_committed_at_or_before_it() -> None:
    history = DeltaHistory({0: 1000, 1: 2000, 2: 3000})
    assert history.version_at(2000) == 1
    assert history.version_at(2999) == 1
    assert history.version_at(1000) == 0
    assert history.version_at(10**13) == 2  # after the newest commit: the newest version
    with pytest.raises(VersionNotKeptError, match=r"oldest the log keeps, version 0, was committed 1970"):
        history.version_at(999)
    cleaned = DeltaHistory({3: 3000, 4: 4000}, frozenset({3}))
    with pytest.raises(VersionNotKeptError, match=r"version 3, .* removed by log cleanup"):
        cleaned.version_at(2500)


def test_the_log_lists_its_commit_times_and_rebuilds_an_older_versions_offsets(tmp_path: Path) -> None:
    log = DeltaLog(str(tmp_path))
    planned = create_table(log, SCHEMA, epoch=1)
    first = commit_batch(log, planned, Batch(topic="t", start={0: 0}, end={0: 5}, topic_id="tid"), 1, [])
    commit_batch(log, log.snapshot(), Batch(topic="t", start={0: 5}, end={0: 9}, topic_id="tid"), 1, [])
    for version, seconds in ((0, 1_000), (1, 2_000), (2, 3_000)):
        os.utime(log.log_dir / f"{version:020d}.json", (seconds, seconds))
    history = log.history()
    assert history.committed_ms() == {0: 1_000_000, 1: 2_000_000, 2: 3_000_000}
    assert history.version_at(2_500_000) == first == 1
    assert log.snapshot(first).committed.offsets == {0: 5}
    assert log.snapshot(first).version == 1
    assert log.snapshot().committed.offsets == {0: 9}


MANIFEST = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: orders}}
spec:
  source: {{bootstrapServers: "127.0.0.1:1", topic: orders}}
  format: {{type: json, schema: [{{name: id, type: long}}]}}
  table: {{format: delta, location: "{location}"}}
"""


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--snapshot", "7"], "there is no version 7: versions run from 0 to 1"),
        (
            ["--as-of", "2001-01-01T00:00:00"],
            "no version was committed at or before 2001-01-01T00:00:00.000Z",
        ),
        (
            ["--table", "default.other"],
            "a Delta table has no routes, so --table can only name default.orders",
        ),
    ],
)
def test_icefall_read_of_a_delta_table_refuses_in_one_line_before_spark_starts(
    tmp_path: Path, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from icefall.cli import main

    location = tmp_path / "orders"
    log = DeltaLog(str(location))
    commit_batch(
        log, create_table(log, SCHEMA, epoch=1), Batch(topic="orders", start={0: 0}, end={0: 1}), 1, []
    )
    manifest = tmp_path / "t.yaml"
    manifest.write_text(MANIFEST.format(location=location))
    with pytest.raises(SystemExit) as ended:
        main(["read", "-f", str(manifest), "--state-dir", str(tmp_path / "state"), *flags])
    message = str(ended.value)
    assert message.startswith("icefall: ") and "\n" not in message and said in message, message
    assert "starting local Spark" not in capsys.readouterr().err
