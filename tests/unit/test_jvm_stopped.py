"""`jvm_stopped`: whether the Spark JVM has exited, so an error raised while a SIGTERM to the process group
stops it reads as the stop, not as a failure of the work.

Proves, with a real child process standing in for the JVM:
- a running JVM is not stopped, at once, when the error says nothing about the connection;
- a JVM that stopped answering (a lost connection, also one raised while handling another error), or whose
  shutdown hooks stopped the pool a call ran on, is given time to finish exiting, and then counts as stopped;
- a JVM that has exited counts as stopped whatever the error.
"""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest
from py4j.protocol import Py4JNetworkError

from icefall.spark.session import jvm_stopped

pytestmark = pytest.mark.unit


def session_of(process: subprocess.Popen[bytes]) -> Any:
    return SimpleNamespace(sparkContext=SimpleNamespace(_gateway=SimpleNamespace(proc=process)))


def chained_lost_connection() -> BaseException:
    try:
        try:
            raise RuntimeError("the task failed")
        except RuntimeError:
            raise Py4JNetworkError("Answer from Java side is empty") from None
    except Py4JNetworkError:
        try:
            raise ValueError("while handling it")
        except ValueError as error:
            return error


def test_a_running_jvm_is_not_stopped_and_is_not_waited_for() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = time.monotonic()
        assert not jvm_stopped(session_of(process), RuntimeError("a real failure"))
        assert time.monotonic() - started < 1
    finally:
        process.kill()
        process.wait()


POOL_TERMINATED = RuntimeError(
    "An error occurred while calling o452.commit.\n: java.util.concurrent.RejectedExecutionException: Task "
    "rejected from java.util.concurrent.ThreadPoolExecutor@5b734817[Terminated, pool size = 0]"
)


@pytest.mark.parametrize(
    "error", [ConnectionRefusedError(111, "refused"), chained_lost_connection(), POOL_TERMINATED]
)
def test_a_jvm_that_stopped_answering_is_given_time_to_exit(error: BaseException) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    try:
        assert jvm_stopped(session_of(process), error)
    finally:
        process.kill()
        process.wait()


def test_an_exited_jvm_is_stopped() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert jvm_stopped(session_of(process))
    assert not jvm_stopped(None)
