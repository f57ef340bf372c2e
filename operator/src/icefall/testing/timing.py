"""Per-test wall time, CPU time and the stack components each test started: `pytest --test-report=PATH`.

CPU is the whole process tree's: the pytest process (an xdist worker, or the only process), its children
alive at either end of the test (Kafka, Spark's JVM, `icefall run` subprocesses) and what the children that
ended during the test used (their parents' `cutime`/`cstime` once reaped). A long-lived child's CPU counts
for the test during which it was spent, so a shared broker's work is billed to the tests that used it.
Components are the session- and module-scoped fixtures set up for a test: the first test that needs the
broker pays for its start, and the report says so.

With pytest-xdist each worker measures its own tests and sends the figures with the test's teardown report
(`user_properties`); the controller writes the one report. Not guaranteed: daemons that left the tree
(re-parented to init) are not counted, and on a loaded machine wall times include waiting for a core.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

TIMING_KEY = "icefall_timing"
SHOWN_LINES = 40  # of the report, at the end of the run: the summary and the slowest modules
_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU of `root` (default: this process), its live descendants and the children they
    reaped."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None:
            continue
        # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15), counted from state = 0
        parents[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(value) for value in fields[11:15])
    total = 0
    for pid, used in ticks.items():
        ancestor = pid
        while ancestor not in (root, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            total += used
    return total / _TICKS


@dataclass
class _Running:
    wall: float
    cpu: float
    components: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Timing:
    nodeid: str
    outcome: str
    wall: float
    cpu: float
    components: tuple[str, ...]
    worker: str


class TimingPlugin:
    def __init__(self, report: Path | None) -> None:
        self.report = report
        self.current: _Running | None = None
        self.results: list[Timing] = []
        self.outcomes: dict[str, str] = {}
        self.started = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.current = _Running(time.monotonic(), tree_cpu_seconds())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Iterator[None]:
        yield
        if self.current is not None and fixturedef.scope in ("session", "module"):
            self.current.components.append(fixturedef.argname)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when != "teardown" or self.current is None:
            return report
        running, self.current = self.current, None
        figures = {
            "wall": round(time.monotonic() - running.wall, 2),
            "cpu": round(tree_cpu_seconds() - running.cpu, 2),
            "components": running.components,
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        report.user_properties.append((TIMING_KEY, figures))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.outcomes[report.nodeid] = report.outcome
        elif report.failed:
            self.outcomes[report.nodeid] = "error"
        elif report.skipped:
            self.outcomes[report.nodeid] = "skipped"
        for key, value in report.user_properties:
            if key == TIMING_KEY:
                figures = cast(dict[str, Any], value)
                self.results.append(
                    Timing(
                        report.nodeid,
                        self.outcomes.pop(report.nodeid, report.outcome),
                        float(figures["wall"]),
                        float(figures["cpu"]),
                        tuple(figures["components"]),
                        str(figures["worker"]),
                    )
                )

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        """The report is written, and its summary and slowest modules shown, before pytest's last line."""
        if self.report is None or hasattr(config, "workerinput") or not self.results:
            return
        text = render(self.results, time.monotonic() - self.started)
        self.report.parent.mkdir(parents=True, exist_ok=True)
        self.report.write_text(text)
        shown = text.split("\n## Tests")[0].splitlines()[2:SHOWN_LINES]
        terminalreporter.write_sep("=", f"test report (all of it: {self.report})")
        for line in shown:
            terminalreporter.write_line(line)


def render(results: list[Timing], elapsed: float) -> str:
    """A Markdown report: totals, then per module and per test, slowest first."""
    wall = sum(result.wall for result in results)
    cpu = sum(result.cpu for result in results)
    workers = sorted({result.worker for result in results})
    lines = [
        "# Test report",
        "",
        f"{len(results)} tests on {len(workers)} worker(s) in {elapsed:.0f} s: tests' wall time "
        f"{wall:.0f} s, CPU {cpu:.0f} s ({cpu / elapsed if elapsed else 0:.2f} cores busy on average).",
        "",
        "## Modules",
        "",
        "| module | tests | wall s | CPU s |",
        "|---|--:|--:|--:|",
    ]
    modules: dict[str, list[Timing]] = defaultdict(list)
    for result in results:
        modules[result.nodeid.split("::")[0]].append(result)
    for module, tests in sorted(modules.items(), key=lambda kv: -sum(t.wall for t in kv[1])):
        module_wall = sum(t.wall for t in tests)
        module_cpu = sum(t.cpu for t in tests)
        lines.append(f"| {module} | {len(tests)} | {module_wall:.1f} | {module_cpu:.1f} |")
    lines += [
        "",
        "## Tests",
        "",
        "| test | outcome | wall s | CPU s | worker | started |",
        "|---|---|--:|--:|---|---|",
    ]
    for result in sorted(results, key=lambda r: -r.wall):
        started = ", ".join(result.components)
        lines.append(
            f"| {result.nodeid} | {result.outcome} | {result.wall:.1f} | {result.cpu:.1f} | {result.worker} "
            f"| {started} |"
        )
    return "\n".join(lines) + "\n"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--test-report",
        metavar="PATH",
        default=None,
        help="write each test's wall time, CPU time (its process tree) and the components it started",
    )


def pytest_configure(config: pytest.Config) -> None:
    report = config.getoption("--test-report")
    config.pluginmanager.register(TimingPlugin(Path(report) if report else None), "icefall-timing")
