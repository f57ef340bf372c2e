"""`icefall validate`, `--output json` and the documented exit codes: what scripts and CI pipelines rely on.

Proves:
- every StreamingTable under examples/ is valid (exit 0), and those that name a catalog are valid for a
  cluster too (`--cluster`); a Helm values file is not a StreamingTable (exit 2);
- every manifest the real API server refuses at admission (the REJECTED cases of
  tests/integration/test_crd_admission.py, which runs them against kube-apiserver) is refused by
  `icefall validate` too, offline, with exit code 2 and the field's path;
- a refusal names the field and the fix, in text and in JSON; a manifest without a catalog is valid with a
  note, and refused with `--cluster`;
- every command that reads a manifest exits 2 on an invalid one, as validate does;
- `icefall --help` lists the exit codes the commands use, each with what it means;
- `status --output json` and `verify --output json` print data (camelCase keys) and keep their exit codes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall import cli
from icefall.audit.report import AuditReport, PartitionAudit, report_json
from icefall.commands import table as table_commands
from icefall.commands.common import EXIT_INVALID
from icefall.commands.run import EXIT_DATA_LOSS, EXIT_LEASE, EXIT_SOURCE_CHANGED
from icefall.controller.leader import EXIT_LEADERSHIP_LOST
from icefall.plan.purge import EXIT_REFUSED

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ADMISSION = ROOT / "tests" / "integration" / "test_crd_admission.py"


def streaming_table_examples() -> list[Path]:
    return [
        path
        for path in sorted(EXAMPLES.rglob("*.yaml"))
        if any(
            isinstance(d, dict) and d.get("kind") == "StreamingTable"
            for d in yaml.safe_load_all(path.read_text())
        )
    ]


def test_every_example_is_valid_and_the_cluster_ones_for_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    examples = streaming_table_examples()
    assert len(examples) >= 7
    assert cli.main(["validate", *(arg for path in examples for arg in ("-f", str(path)))]) == 0
    capsys.readouterr()
    with_catalog = [p for p in examples if "catalog:" in p.read_text()]
    assert with_catalog
    for path in with_catalog:
        assert cli.main(["validate", "--cluster", "-f", str(path)]) == 0, capsys.readouterr().out
    assert cli.main(["validate", "-f", str(EXAMPLES / "cluster-values.yaml")]) == EXIT_INVALID


def _admission_cases() -> list[tuple[str, Any, list[str]]]:
    spec = importlib.util.spec_from_file_location("crd_admission_cases", ADMISSION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases: list[tuple[str, Any, list[str]]] = module.REJECTED
    global _EXAMPLE  # noqa: PLW0603 (the module's example builder, for the cases' mutations)
    _EXAMPLE = module.example
    return cases


_EXAMPLE: Any = None
REJECTED = _admission_cases()


@pytest.mark.parametrize(("name", "mutate", "expected"), REJECTED, ids=[case[0][:24] for case in REJECTED])
def test_what_admission_refuses_validate_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, mutate: Any, expected: list[str]
) -> None:
    obj = _EXAMPLE(name)
    mutate(obj)
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(obj))
    assert cli.main(["validate", "-f", str(path)]) == EXIT_INVALID, f"{name} was accepted"
    out = capsys.readouterr().out
    # The field the API server names is named here too (its first dotted path, without list indexes), or
    # for a cross-field rule, the field beside it (half mutual TLS: clientKey is missing, not clientCert).
    found = re.match(r"\.?([a-zA-Z.]+)", expected[0])
    assert found is not None
    field = found.group(1).rstrip(".")
    paths = re.sub(r"\[\d+\]", "", out)
    assert field in paths or f"{field.rpartition('.')[0]}." in paths, out
    assert "hunter2" not in out


def test_a_refusal_names_the_field_and_the_fix_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = yaml.safe_load((EXAMPLES / "orders.yaml").read_text())
    obj["spec"]["deletionPolicy"] = "Keep"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(obj))
    assert cli.main(["validate", "-f", str(path)]) == EXIT_INVALID
    out = capsys.readouterr().out
    assert f"{path}: INVALID" in out and "spec.deletionPolicy: 'Keep' is not allowed; use one of" in out
    assert cli.main(["validate", "-o", "json", "-f", str(path), "-f", str(EXAMPLES / "orders.yaml")]) == 2
    bad, good = json.loads(capsys.readouterr().out)
    assert bad["valid"] is False and bad["name"] is None
    assert bad["problems"][0]["path"] == "spec.deletionPolicy" and "Retain" in bad["problems"][0]["message"]
    assert good == {
        "file": str(EXAMPLES / "orders.yaml"),
        "name": "orders",
        "valid": True,
        "problems": [],
        "notes": [good["notes"][0]],
    }
    assert "spec.table.catalog is not set" in good["notes"][0]


def test_a_table_without_a_catalog_is_refused_for_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "--cluster", "-f", str(EXAMPLES / "orders.yaml")]) == EXIT_INVALID
    assert "spec.table.catalog: is required in a cluster" in capsys.readouterr().out
    # A Delta table is named by its location, never a catalog: in a cluster it must be an object store (the
    # example's is the embedded warehouse, on the pod's own disk); the problem names the field and the fix.
    assert cli.main(["validate", "--cluster", "-f", str(EXAMPLES / "delta-orders.yaml")]) == EXIT_INVALID
    said = capsys.readouterr().out
    assert "spec.table.location: a Delta table in a cluster needs an object-store location" in said
    assert "spec.table.catalog" not in said


def test_every_command_that_reads_a_manifest_exits_2_on_an_invalid_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: icefall.dev/v1alpha1\nkind: StreamingTable\nmetadata: {name: x}\nspec: {}\n")
    for command in ("run", "status", "verify", "reset-offsets", "read"):
        with pytest.raises(SystemExit) as stopped:
            cli.main([command, "-f", str(path)])
        assert stopped.value.code == EXIT_INVALID, command
        assert "spec.source: is required" in capsys.readouterr().err


def test_help_lists_the_exit_codes_the_commands_use() -> None:
    epilog = cli.build_parser().epilog or ""
    codes: dict[int, str] = {}
    for line in epilog.splitlines()[1:]:
        if found := re.match(r"  (\d)  (.*)", line):
            current = int(found.group(1))
            codes[current] = found.group(2)
        else:
            codes[current] += " " + line.strip()
    assert codes[0].startswith("done") and codes[1].startswith("failed")
    assert "invalid" in codes[EXIT_INVALID]
    assert "commit Lease" in codes[EXIT_LEASE] and "leader Lease" in codes[EXIT_LEADERSHIP_LOST]
    assert "reset-offsets" in codes[EXIT_SOURCE_CHANGED]
    assert "onDataLoss is Halt" in codes[EXIT_DATA_LOSS] and "purge: refused" in codes[EXIT_REFUSED]


STATUS = {
    "table": "shop.orders",
    "snapshotId": 7,
    "epoch": 2,
    "partitions": [{"partition": 0, "committed": 30, "high": 40, "lag": 10}],
    "lagRecords": 10,
    "freshnessSeconds": 3.5,
    "lostRecords": 0,
    "problem": None,
}


@pytest.mark.parametrize("problem", [None, "topic 'orders' was deleted and created again"])
def test_status_prints_json_and_exits_4_when_the_topic_changed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], problem: str | None
) -> None:
    monkeypatch.setattr(table_commands, "table_status", lambda args: {**STATUS, "problem": problem})
    code = table_commands.show_status(argparse.Namespace(output="json"))
    assert code == (0 if problem is None else EXIT_SOURCE_CHANGED)
    assert json.loads(capsys.readouterr().out) == {**STATUS, "problem": problem}
    table_commands.show_status(argparse.Namespace(output="text"))
    text = capsys.readouterr().out
    assert "lag 10 records, freshness 3.5s" in text
    assert ("INGESTION STOPPED" in text) == (problem is not None)


def test_verify_json_is_the_report_in_camel_case_with_ok_per_partition() -> None:
    partition = PartitionAudit(
        partition=0, start=0, committed=10, low_watermark=0, high_watermark=10, expected=10, in_table=9,
        in_dlq=0, in_table_and_dlq=0, duplicates=0, duplicate_rows=0, missing=1, filtered=0, unexpected=0,
        lost_to_retention=0, unverified=0, missing_examples=(4,),
    )  # fmt: skip
    report = AuditReport("shop.orders", None, "orders", 5, False, False, (partition,))
    data = report_json(report)
    assert data["ok"] is False and data["snapshotId"] == 5 and data["dlqTable"] is None
    (row,) = data["partitions"]
    assert row["ok"] is False and row["missing"] == 1 and row["missingExamples"] == [4]
    assert json.loads(json.dumps(data)) == data
    assert cli.build_parser().parse_args(["verify", "-f", "t.yaml", "-o", "json"]).output == "json"
