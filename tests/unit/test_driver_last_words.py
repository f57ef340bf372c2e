"""A driver stopped by a recreated or truncated topic says so in its last words (`commands.run.run_ingestor`):
`TopicRecreated: <line>` or `OffsetsAheadOfTopic: <line>` in the termination-message file and the exit code
EXIT_SOURCE_CHANGED. The operator reads no topic itself: these words are how the table's condition names it
(`plan.conditions.driver_refusal`, tests/unit/test_plan_conditions.py). Outside a pod (no file) nothing is
written. The ingestor is a stub: only its stop is exercised."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from icefall.commands.run import EXIT_SOURCE_CHANGED, run_ingestor
from icefall.ingest.planning import SourceChangedError
from icefall.runtime import failpoints

pytestmark = pytest.mark.unit


class Outages:
    def retrying(self, step: Any, should_stop: Any) -> bool:
        step()
        return True


class StoppedIngestor:
    def __init__(self, error: SourceChangedError) -> None:
        self.outages, self.error = Outages(), error

    def start(self, lease_timeout: float) -> None:
        pass

    def run(self, should_stop: Any, progress: Any) -> None:
        raise self.error


class Progress:
    def should_stop(self) -> bool:
        return False


@pytest.mark.parametrize(("recreated", "reason"), [(True, "TopicRecreated"), (False, "OffsetsAheadOfTopic")])
def test_a_changed_topic_is_the_drivers_last_words(
    recreated: bool, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")  # the kubelet creates it; the driver never does
    monkeypatch.setattr(failpoints, "TERMINATION_MESSAGE_FILE", str(log))
    error = SourceChangedError(
        "shop.orders: topic 'orders' ... run `icefall reset-offsets`", recreated=recreated
    )
    args = argparse.Namespace(lease_timeout=1.0)
    assert run_ingestor(StoppedIngestor(error), Progress(), args) == EXIT_SOURCE_CHANGED  # type: ignore[arg-type]
    assert log.read_text() == f"{reason}: {error}\n"


def test_outside_a_pod_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "termination-log"
    monkeypatch.setattr(failpoints, "TERMINATION_MESSAGE_FILE", str(missing))
    error = SourceChangedError("shop.orders: gone", recreated=True)
    args = argparse.Namespace(lease_timeout=1.0)
    assert run_ingestor(StoppedIngestor(error), Progress(), args) == EXIT_SOURCE_CHANGED  # type: ignore[arg-type]
    assert not missing.exists()
