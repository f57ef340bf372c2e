"""A stack server started from a thread outlives that thread.

Proves: `ManagedProcess.start()` called from a short-lived thread (as `make chaos` restarts a killed
service from its fault loop) gives a process that keeps running after the thread ends. The parent-death
signal follows the thread that forked the child, so without the spawner thread the restarted server was
SIGKILLed as soon as its fault loop ended (a chaos run's REST catalog, 2026-11-28).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from icefall.devstack.procs import ManagedProcess

pytestmark = pytest.mark.integration


def test_a_process_started_from_a_thread_outlives_the_thread(tmp_path: Path) -> None:
    process = ManagedProcess("sleeper", [shutil.which("sleep") or "sleep", "60"], tmp_path / "sleeper.log")
    starter = threading.Thread(target=process.start, name="short-lived")
    try:
        starter.start()
        starter.join()
        time.sleep(1.0)  # the death signal, if any, is delivered at once when the thread exits
        assert process.running(), "the process died with the thread that started it"
    finally:
        process.stop()
