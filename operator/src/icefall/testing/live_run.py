"""A running `icefall run` process, as a user starts it, for tests that break the world around it; and
`icefall run --until-caught-up` to its end (`run_until_caught_up`), killed at failpoints in turn
(`killed_at_each`).

`LiveRun` starts `icefall run -f <manifest>` (local Spark unless `master` says otherwise, no maintenance)
with its output in a log file, waits on conditions while checking that the process stays up (a fault must
never end it), and stops it with SIGTERM as a user would. Guarantees: `stop()` ends the process (SIGKILL
after 90 s, then fails the test); call it in a `finally`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.runtime import failpoints
from icefall.testing.streams import NAMESPACE, Broker, watermarks


class LiveRun:
    """`icefall run` on `it.<name>` of `config`'s catalog, reading `topic` of `kafka`; state in `state`."""

    def __init__(
        self,
        manifest: Path,
        *,
        config: CatalogConfig,
        kafka: Broker,
        name: str,
        topic: str,
        state: Path,
        env: Mapping[str, str] | None = None,
        master: str = "local[1]",
    ) -> None:
        self.config, self.kafka, self.name, self.topic = config, kafka, name, topic
        self.manifest, self.state = manifest, state
        self.log = state.parent / f"{name}-run.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "icefall.cli", "run", "-f", str(manifest), "--state-dir", str(state),
                 "--no-maintenance", "--master", master],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            )  # fmt: skip

    def committed(self) -> Mapping[int, int]:
        return read_committed(self.config.pyiceberg().load_table((NAMESPACE, self.name))).offsets

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.text()[-4000:]

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 300) -> None:
        """Poll `check` (an exception counts as not yet) until True; the process must stay up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"icefall run exited ({self.proc.returncode}):\n{self.tail()}"
            try:
                if check():
                    return
            except Exception:  # the table may not exist yet; a server may be down on purpose
                pass
            time.sleep(0.2)
        raise AssertionError(f"not {what} after {timeout:.0f}s; log:\n{self.tail()}")

    def wait_ingesting(self) -> None:
        """Until the table holds a first commit of records."""
        self.wait_for("committing", lambda: sum(self.committed().values()) > 0, 400)

    def wait_caught_up(self, timeout: float = 300) -> None:
        self.wait_for(
            "caught up", lambda: dict(self.committed()) == watermarks(self.kafka, self.topic), timeout
        )

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"icefall run did not stop on SIGTERM:\n{self.tail()}") from None


def run_until_caught_up(
    manifest: Path,
    state: Path,
    failpoint: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    maintenance: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`icefall run -f manifest --until-caught-up` to its end (local[1] Spark, no maintenance unless
    `maintenance`), with the failpoint spec `failpoint` armed (`ICEFALL_FAILPOINTS`, e.g.
    `route.after-commit=exit@3`) if given; `env`: more environment (e.g. object-store credentials)."""
    environment = {k: v for k, v in os.environ.items() if k != failpoints.ENV_VAR} | dict(env or {})
    environment.update({failpoints.ENV_VAR: failpoint} if failpoint else {})
    return subprocess.run(
        [sys.executable, "-m", "icefall.cli", "run", "-f", str(manifest), "--state-dir", str(state),
         "--until-caught-up", "--lease-timeout", "5", "--master", "local[1]",
         *([] if maintenance else ["--no-maintenance"])],
        env=environment, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip


def killed_at_each(manifest: Path, state: Path, specs: tuple[str, ...]) -> list[str]:
    """`run_until_caught_up` once per failpoint spec of `specs` (each `point=exit...`), asserting that each
    run exited at its point; their logs (stderr), in order."""
    logs = []
    for spec in specs:
        done = run_until_caught_up(manifest, state, spec)
        point = spec.partition("=")[0]
        assert done.returncode == failpoints.EXIT_STATUS, f"{spec}: {done.returncode}\n{done.stderr[-3000:]}"
        assert f"failpoint {point} triggered" in done.stderr, done.stderr[-3000:]
        logs.append(done.stderr)
    return logs
