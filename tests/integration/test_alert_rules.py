"""The chart's PrometheusRule against the real promtool (hack/build-go-tools.sh promtool) and helm.

Proves:
- the rendered rule groups pass `promtool check rules`, with the default values and with another objective;
- `promtool test rules` passes tests/promtool/icefall-rules.test.yaml on them: each alert fires on series
  that should fire it (labels and rendered annotations compared) and stays silent on healthy ones;
- every alert of the chart is exercised by that file, carries a severity, and its `runbook_url` points at a
  section of docs/runbooks.md that exists;
- every series the rules read is one the code's registries define, or one the rules record themselves.
Not proved: that a deployment scrapes every process whose series a rule reads (see docs/runbooks.md), or
how Alertmanager routes the alerts.
A missing promtool or helm fails the test (they are built by hack/build-go-tools.sh, never skipped).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.devstack.dashboards import defined_metric_names, promql_metric_names
from icefall.devstack.tools import tool_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "icefall"
TESTS = ROOT / "tests" / "promtool" / "icefall-rules.test.yaml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
ENABLED = ("--set", "metrics.prometheusRule.enabled=true")


def _tool(variable: str, name: str) -> str:
    path = tool_dir(variable) / name
    assert path.is_file() and os.access(path, os.X_OK), f"{path} is missing: run hack/build-go-tools.sh"
    return str(path)


def _run(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _rule(tmp_path: Path, *values: str) -> dict[str, Any]:
    home = tmp_path / "helm-home"
    home.mkdir(exist_ok=True)
    result = subprocess.run(
        [_tool("ICEFALL_HELM_BIN", "helm"), "template", "icefall", str(CHART), "--namespace", "ops", *values],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HOME": str(home)},
    )
    assert result.returncode == 0, result.stderr
    rules = [doc for doc in yaml.safe_load_all(result.stdout) if doc and doc["kind"] == "PrometheusRule"]
    assert len(rules) == 1, f"{len(rules)} PrometheusRule"
    return rules[0]


def _write_rules(rule: dict[str, Any], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def _alerts(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def test_rules_pass_promtool_check_and_unit_tests(tmp_path: Path) -> None:
    promtool = _tool("ICEFALL_PROMTOOL_BIN", "promtool")
    rules = _write_rules(_rule(tmp_path, *ENABLED), tmp_path / "default")
    checked = _run(promtool, "check", "rules", str(rules))
    assert "SUCCESS" in checked.stdout, checked.stdout
    shutil.copy(TESTS, rules.parent / TESTS.name)
    tested = _run(promtool, "test", "rules", TESTS.name, cwd=rules.parent)
    assert "SUCCESS" in tested.stdout and "FAILED" not in tested.stdout, tested.stdout


def test_unit_tests_have_teeth(tmp_path: Path) -> None:
    """A wrong expectation fails `promtool test rules`: it compares what fires, not only that it runs."""
    promtool = _tool("ICEFALL_PROMTOOL_BIN", "promtool")
    rules = _write_rules(_rule(tmp_path, *ENABLED), tmp_path / "teeth")
    text = TESTS.read_text()
    assert "{severity: warning, table: shop.late}" in text
    (rules.parent / TESTS.name).write_text(
        text.replace("{severity: warning, table: shop.late}", "{severity: warning, table: shop.ok}")
    )
    failed = _run(promtool, "test", "rules", TESTS.name, cwd=rules.parent, check=False)
    assert failed.returncode != 0 and "FAILED" in failed.stdout + failed.stderr


def test_another_objective_renders_valid_rules(tmp_path: Path) -> None:
    promtool = _tool("ICEFALL_PROMTOOL_BIN", "promtool")
    rule = _rule(tmp_path, *ENABLED, "--set-json", "metrics.prometheusRule.freshnessObjective=0.999")
    burn = next(a for a in _alerts(rule) if a["alert"] == "IcefallFreshnessBudgetBurn")
    assert "14.4 * (1 - 0.999)" in burn["expr"]
    _run(promtool, "check", "rules", str(_write_rules(rule, tmp_path / "objective")))


def test_every_alert_is_tested_and_has_a_runbook_section(tmp_path: Path) -> None:
    rule = _rule(tmp_path, *ENABLED)
    alerts = _alerts(rule)
    names = {a["alert"] for a in alerts}
    assert names == {
        "IcefallFreshnessBudgetBurn",
        "IcefallFreshnessBudgetBurnSlow",
        "IcefallLagGrowing",
        "IcefallDeadLetters",
        "IcefallIngestionNotCommitting",
        "IcefallCompactionBacklogGrowing",
        "IcefallOperatorNotReconciling",
        "IcefallDataLost",
        "IcefallTableDegraded",
        "IcefallSchemaChangeRefused",
        "IcefallDriverRestarting",
    }
    tested = {
        t["alertname"] for test in yaml.safe_load(TESTS.read_text())["tests"] for t in test["alert_rule_test"]
    }
    assert names <= tested, f"no promtool test for {sorted(names - tested)}"
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for alert in alerts:
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("https://") and "#" in url, url
        assert url.split("#", 1)[1] in anchors, f"{alert['alert']}: no section {url} in docs/runbooks.md"
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]


def test_rules_read_only_metrics_the_code_defines(tmp_path: Path) -> None:
    rules = [r for group in _rule(tmp_path, *ENABLED)["spec"]["groups"] for r in group["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    defined = defined_metric_names()
    for rule in rules:
        names = promql_metric_names(rule["expr"])
        assert names, rule["expr"]
        assert names <= defined | recorded, f"{sorted(names - defined - recorded)} in {rule['expr']!r}"


def test_rule_needs_metrics_and_is_off_by_default(tmp_path: Path) -> None:
    home = tmp_path / "helm-home"
    home.mkdir()
    helm = _tool("ICEFALL_HELM_BIN", "helm")
    env = {**os.environ, "HOME": str(home)}
    out = subprocess.run(
        [helm, "template", "icefall", str(CHART)], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "kind: PrometheusRule" not in out
    refused = subprocess.run(
        [helm, "template", "icefall", str(CHART), *ENABLED, "--set", "metrics.enabled=false"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert refused.returncode != 0 and "needs metrics.enabled" in refused.stderr, refused.stderr
