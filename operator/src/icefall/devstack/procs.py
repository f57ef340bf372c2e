"""Child processes for the local stack: started on loopback, logged to a file, never left behind.

Guarantees: every process is started in its own session with a parent-death signal, so it is ended when
the process that started it dies, even by SIGKILL; `stop()` terminates and then kills. Not guaranteed:
ports are picked free just before use, so another program could take one in between (start fails loudly).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
#: Options added to every server JVM of the stack (Kafka, the REST catalog, the schema registry): the tests
#: set C1-only compilation (`icefall.testing.plugin`), which starts them for about half the CPU; `make demo`
#: and the benches leave it unset, so a benchmark's broker keeps C2.
STACK_JAVA_OPTIONS = "ICEFALL_STACK_JAVA_OPTIONS"


class StartError(RuntimeError):
    """A component did not become ready; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def java(*options: str) -> list[str]:
    """`java` with `options`, then those of `STACK_JAVA_OPTIONS` (a later option wins)."""
    return [shutil.which("java") or "java", *options, *shlex.split(os.environ.get(STACK_JAVA_OPTIONS, ""))]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # SIGKILL, not SIGTERM: an orphaned kube-apiserver whose etcd is gone takes a minute to shut down.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@functools.cache
def _spawner() -> concurrent.futures.ThreadPoolExecutor:
    """One thread, kept until the process exits, that forks the servers other threads start."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="devstack-spawner")


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


class ManagedProcess:
    """One long-running child process whose output goes to `log_path`.

    `stop()` sends `stop_signal` to the process group first (SIGTERM unless the program shuts down
    cleanly on another one, like PostgreSQL's fast shutdown on SIGINT).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
    ):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(os.environ if env is None else env)
        self.stop_signal = stop_signal
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:

            def popen() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 (only prctl runs before exec)
                )

            # The death signal follows the THREAD that forked the child: a server (re)started from a
            # short-lived thread (a chaos run's fault loop) would be SIGKILLed when that thread ends. Such
            # starts are forked from one thread that lives as long as the process.
            if threading.current_thread() is threading.main_thread():
                self._proc = popen()
            else:
                self._proc = _spawner().submit(popen).result()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The code it exited with by itself; None while it runs, or once `stop()` or `kill()` ended it."""
        return None if self._proc is None else self._proc.poll()

    def wait_ready(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `check` until True; fail with the log tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.running():
                code = self._proc.returncode if self._proc else None
                raise StartError(
                    f"{self.name} exited with code {code} before {what}; last log lines "
                    f"({self.log_path}):\n{tail(self.log_path)}"
                )
            try:
                if check():
                    return
            except Exception as exc:  # readiness probes fail in many ways until the service is up
                last_error = exc
            time.sleep(0.2)
        self.stop()
        raise StartError(
            f"{self.name} was not {what} after {timeout:.0f}s (last probe error: {last_error!r}); "
            f"last log lines ({self.log_path}):\n{tail(self.log_path)}"
        )

    def kill(self) -> None:
        """SIGKILL to the process group, then reap it: a crash, no clean shutdown (fault tests)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self, grace: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, self.stop_signal)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def run_checked(argv: Sequence[str], log_path: Path, what: str, timeout: float = 120) -> None:
    """Run a short command to completion; on failure raise StartError with its output."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if result.returncode != 0:
        raise StartError(f"{what} failed with code {result.returncode}:\n{tail(log_path)}")


class LoopbackServer:
    """A stack server on a free 127.0.0.1 port, its data (`data_dir`) and log in its own `workdir`.

    A subclass's `start()` calls `_claim()` first: the first time that gives it a fresh folder and port, and
    after a `stop()` the same ones again, so a restart (the end of an outage a test made) finds its data on
    the same address. Not guaranteed: that the port is still free for a restart (it fails loudly if not)."""

    what = "the server"  # names it in errors
    log_name = "server.log"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self._proc: ManagedProcess | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(endpoint={self.endpoint!r}, workdir={str(self.workdir)!r})"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / self.log_name

    def _claim(self) -> None:
        if self._proc is not None:
            raise RuntimeError(f"{self.what} is already running")
        if self.port == 0:
            if self.workdir.exists():
                shutil.rmtree(self.workdir)
            self.data_dir.mkdir(parents=True)
            self.port = free_port()

    def stop(self) -> None:
        """Stop the server; its port and data are kept for the next `start()`."""
        if self._proc is None:
            return
        self._proc.stop()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the server (a crash); its port and data are kept for the next `start()`."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None
