"""The chaos run's report (bench/results/chaos.md by default) and its `icefall verify` runs.

Written even when the run fails: the result line says why; the sections say what was made (kills per
component and crash point, the measured faults, the infrastructure and resource faults by kind with their
recovery p50/p99, the keyed and Delta tables' audits) and what is not covered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import chaos_delta as delta
from . import chaos_keyed as keyed

if TYPE_CHECKING:
    from .chaos_audit import Audit
    from .chaos_run import Chaos


def run_verify(manifest: Path, variables: dict[str, str], workdir: Path) -> str:
    """`icefall verify -f` on the table (its own audit, with Spark): its last lines and exit status."""
    done = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "verify", "-f", str(manifest)],
        env={**os.environ, **variables, "SPARK_LOCAL_IP": "127.0.0.1"}, cwd=workdir,
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.strip()][-6:]
    return f"exit {done.returncode}: " + " / ".join(lines)


def _result(failure: BaseException | None) -> str:
    if failure is None:
        return "passed"
    first = (str(failure).splitlines() or [""])[0][:300]
    return f"FAILED: {type(failure).__name__}: {first}"


def write_report(
    chaos: Chaos,
    outcome: Audit | None,
    verify: str,
    failure: BaseException | None,
    *,
    path: Path,
    seed: int,
    kills: int,
) -> None:
    """The run's report to `path`, written even when the run failed (`failure`)."""
    elapsed = time.monotonic() - chaos.started
    tally = chaos.tally
    total = tally.total()
    lines = [
        "# Chaos run",
        "",
        "`make chaos` (e2e/chaos_run.py): random kills and outages on the whole system while edge-case "
        "records arrive, then an audit by content that uses none of the ingestion code (the topic, "
        "read_committed, decoded by a reference decoder, against the Iceberg tables read by pyiceberg and "
        "the Delta table read by delta-rs). The "
        "driver and compaction pods are containers of the image on the e2e's one-node cluster (the real "
        "kubelet on containerd); the operator is a process.",
        "",
        f"- seed {seed}, kills asked {kills}, kills observed {total}; duration {elapsed / 60:.1f} min "
        f"({elapsed / max(total, 1):.0f} s per kill)",
        f"- result: {_result(failure)}",
    ]
    if outcome is not None:
        lines += [
            f"- records: {outcome.records} ({outcome.good} good, {outcome.bad} malformed); table rows "
            f"{outcome.rows}, dead-letter rows {outcome.dead_rows}",
            "",
            "| duplicates | missing | wrong values |",
            "|---:|---:|---:|",
            f"| {outcome.duplicates} | {outcome.missing} | {outcome.wrong} |",
        ]
        if outcome.examples:
            lines += ["", "First problems:", "", *[f"- {e}" for e in outcome.examples]]
    lines += ["", f"`icefall verify`: {verify}", "", "## Kills per component", "",
              "| component | kills | asked |", "|---|---:|---:|"]  # fmt: skip
    lines += [f"| {c} | {tally.by_component[c]} | {chaos.quota[c]} |" for c in chaos.quota]
    split = ", ".join(f"{t} {c} {n}" for (t, c), n in sorted(tally.by_table.items()))
    lines += ["", f"Driver and compaction kills per table (they share the quotas): {split or 'none'}."]
    lines += ["", "## Kills per crash point", "", "| component | crash point | kills |", "|---|---|---:|"]
    lines += [f"| {c} | {p} | {n} |" for (c, p), n in sorted(tally.by_point.items())]
    drawn = ", ".join(f"{p} {n}" for p, n in sorted(tally.draws.items()))
    other = ", ".join(
        f"{c} exit {code}{f' ({reason})' if reason else ''}: {n}"
        for (c, code, reason), n in sorted(tally.other_exits.items())
    )
    lines += [
        "",
        "What the ended driver and compaction containers had drawn (`ICEFALL_FAILPOINTS_CHAOS`; a point "
        f"a process never reached is not a kill; unknown: its log was gone): {drawn or 'none'}.",
        f"Container exits that were not kills of this run (spec rolls, fenced writers): {other or 'none'}.",
        f"Pod watch gaps (expired and listed again): {chaos.pods.gaps}.",
        "",
        "## Faults",
        "",
        "| fault | converged after | what happened |",
        "|---|---:|---|",
    ]
    for fault in chaos.faults:
        after = f"{fault.converged_after:.0f} s" if fault.converged_after is not None else "did not"
        lines.append(f"| {fault.name} | {after} | {fault.note} |")
    lines += [
        "",
        "Converged: every table committed every record that was in its topic when the fault ended.",
        "",
    ]
    if chaos.infra is not None:
        lines += chaos.infra.report({c: tally.by_component[c] for c in chaos.quota})
        exits = chaos.operator_exits
        lines.append(f"The operator exited on its own {exits} times (its leader Lease ran out in an API "
                     "server outage) and was started again, as its Deployment would.")  # fmt: skip
        lines.append("")
    lines += keyed.report(chaos.keyed_audit, chaos.keyed_verify, chaos.keyed, tally.by_table)
    lines += delta.report(chaos.delta_audit, chaos.delta_verify, tally.by_table)
    lines += [
        "## Records produced, by kind",
        "",
        ", ".join(f"{kind} {n}" for kind, n in sorted(chaos.kinds.items())),
        "",
        "## Not covered",
        "",
        "Kills of the kubelet and containerd; a disk-backed emptyDir past its `sizeLimit` (a kubelet "
        "eviction, not ENOSPC: the spill disk fault is a small tmpfs); the operator has no failpoints, so "
        "its kills are all at random moments; orphan removal by the compaction pods (its safety window is at "
        "least an hour; the orphan race runs it from the run), so `main.before-orphan-delete` is never "
        "reached; the dead-letter topic is not audited (at-least-once by design); NaN/Infinity, lone "
        "surrogates, nested structs and maps, and decimal rounding are not in the data (see "
        "e2e/chaos_data.py).",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    print(f"[chaos] report written to {path}", flush=True)
