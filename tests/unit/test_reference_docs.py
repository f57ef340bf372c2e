"""The generated references under docs/reference/ and the links of the hand-written docs.

Proves:
- each checked-in reference is what `icefall.devstack.reference` generates from the code now (the
  StreamingTable CRD schema, the CLI's parser, the chart's values schema and values.yaml); the failure names
  the file and `make docs`;
- the CLI reference shows every subcommand and option of a parser, and every `EXIT_*` constant of the
  runtime code is in its exit-code table with the constant's value;
- the CRD reference shows every field of the served schema, or points at an identical subtree it shows;
  puts each CEL rule's message on the field its `fieldPath` names; reads a messageExpression as text;
- the Helm reference shows every value of the schema, with values.yaml's `# --` comments and defaults,
  and its examples as YAML;
- every relative link in README.md, CHANGELOG.md and docs/ (the generated references included) names a
  file that exists, and a heading that exists when it names one.
Not proved: that the hand-written docs say what the code does (each claim's own tests do that).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.api.crd import build_crd
from icefall.cli import build_parser
from icefall.devstack.reference import CLI_REFERENCE, CRD_REFERENCE, HELM_REFERENCE, generate
from icefall.devstack.reference import cli as cli_reference
from icefall.devstack.reference import crd as crd_reference
from icefall.devstack.reference import helm as helm_reference

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "src" / "icefall"
SOURCES = {
    CRD_REFERENCE: "the models in operator/src/icefall/api",
    CLI_REFERENCE: "icefall.cli's parser or the exit codes",
    HELM_REFERENCE: "charts/icefall/values.schema.json or values.yaml",
}


@pytest.fixture(scope="module")
def generated() -> dict[Path, str]:
    return generate(ROOT)


@pytest.mark.parametrize("path", sorted(SOURCES), ids=str)
def test_checked_in_reference_is_the_generated_one(generated: Mapping[Path, str], path: Path) -> None:
    checked_in = ROOT / path
    assert checked_in.exists() and checked_in.read_text() == generated[path], (
        f"{path} is out of date with {SOURCES[path]}; run `make docs` and commit the result"
    )


# --- the CLI --------------------------------------------------------------------------------------------


def test_every_subcommand_and_option_is_in_the_cli_reference() -> None:
    parser = build_parser()
    text = cli_reference.render(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                assert f"## icefall {name}\n" in text
                for option in sub._actions:
                    for flag in option.option_strings:
                        if flag not in ("-h", "--help") and not flag.startswith("--no-"):
                            assert flag in text, (name, flag)


def test_a_new_option_and_command_appear_with_their_default_and_help() -> None:
    parser = argparse.ArgumentParser(prog="icefall", description="Test.")
    commands = parser.add_subparsers(dest="command")
    command = commands.add_parser("frobnicate", help="frobnicate the table")
    command.add_argument("--rate", type=int, default=7, help="how many per second")
    command.add_argument("--mode", choices=["a", "b"], required=True, help="which way")
    text = cli_reference.render(parser)
    assert "| [`icefall frobnicate`](#icefall-frobnicate) | frobnicate the table |" in text
    assert "icefall frobnicate [--rate RATE] --mode {a,b}" in text
    assert "| `--rate RATE` |  | `7` | how many per second |" in text
    assert "| `--mode {a,b}` | yes |  | which way |" in text


def test_every_exit_code_constant_is_documented_with_its_value() -> None:
    documented = {e.constant: e.code for e in cli_reference.EXIT_CODES if e.constant}
    found = set(cli_reference.exit_constants(PACKAGE))
    assert found, "no EXIT_* constants found: the scan is broken"
    missing = found - set(documented)
    assert not missing, (
        f"exit codes without documentation: {sorted(missing)}; add them to "
        "icefall.devstack.reference.cli.EXIT_CODES and run `make docs`"
    )
    for constant, code in documented.items():
        module, name = constant.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) == code, constant


def test_exit_constants_are_found_in_module_level_assignments(tmp_path: Path) -> None:
    package = tmp_path / "icefall"
    (package / "commands").mkdir(parents=True)
    (package / "devstack").mkdir()
    (package / "commands" / "x.py").write_text("EXIT_A = 6\nEXIT_B: int = 7\ndef f():\n    EXIT_C = 8\n")
    (package / "devstack" / "y.py").write_text("EXIT_D = 9\n")
    assert list(cli_reference.exit_constants(package)) == [
        "icefall.commands.x.EXIT_A",
        "icefall.commands.x.EXIT_B",
    ]


# --- the CRD --------------------------------------------------------------------------------------------


def schema_paths(node: Mapping[str, Any], path: str) -> Iterator[str]:
    """Every field path of a structural schema, written as the reference writes them."""
    for name, child in (node.get("properties") or {}).items():
        yield f"{path}.{name}"
        yield from schema_paths(child, f"{path}.{name}")
    items = node.get("items")
    if isinstance(items, Mapping):
        yield from schema_paths(items, f"{path}[]")
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        yield from schema_paths(extra, f"{path}.<key>")


def test_every_field_of_the_crd_is_shown_or_pointed_at() -> None:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    walk = crd_reference._Walk()
    for part in ("spec", "status"):
        walk.node(part, root["properties"][part], required=False, ancestors=())
    pointed = [path for path, row in walk.rows.items() if row.same_as is not None]
    assert any("pods.driver" in p for p in pointed) and any(".fields" in p for p in pointed)
    for part in ("spec", "status"):
        for path in schema_paths(root["properties"][part], part):
            assert path in walk.rows or any(
                path.startswith(p + ".") or path.startswith(p + "[]") for p in pointed
            ), path


def small_crd(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"kind": "Thing", "shortNames": ["th"]},
            "versions": [
                {
                    "name": "v1",
                    "additionalPrinterColumns": [],
                    "schema": {
                        "openAPIV3Schema": {"properties": {"spec": spec, "status": {"type": "object"}}}
                    },
                }
            ],
        }
    }


def test_crd_rules_sit_on_the_field_they_name_and_repeats_point_at_the_first() -> None:
    ref = {"type": "object", "properties": {"name": {"type": "string"}, "key": {"type": "string"}}}
    spec = {
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.a.user != ''", "message": "a needs a user", "fieldPath": ".a.user"},
            {"rule": "x", "messageExpression": "self.mode + ' is not allowed here'", "fieldPath": ".mode"},
        ],
        "properties": {
            "mode": {"type": "string", "enum": ["x", "y"], "default": "x", "description": "The mode."},
            "a": {"type": "object", "description": "Part a.", "properties": {"user": ref, "count": {
                "type": "integer", "minimum": 1, "maximum": 9, "description": "How many."}}},
            "b": {"type": "object", "description": "Part b.", "properties": {"user": ref, "count": {
                "type": "integer", "minimum": 1, "maximum": 9, "description": "How many."}}},
        },
    }  # fmt: skip
    text = crd_reference.render(small_crd(spec))
    assert (
        "| `mode` | string | `x` | The mode. One of: `x`, `y`. Checked: `mode` is not allowed here. |" in text
    )
    section_a = text.split("## spec.a\n", 1)[1]
    assert "| `user` | object |  | Checked: a needs a user. |" in section_a
    assert "| `count` | integer |  | How many. Range: 1 to 9. |" in section_a
    assert "| `b` | object |  | Part b. The same fields as `spec.a`. |" in text
    assert "## spec.b" not in text and "b.count" not in text


def test_a_ternary_message_expression_reads_as_its_two_messages() -> None:
    rule = {
        "messageExpression": "has(self.p) ? 'protocol ' + self.p + ' needs a user' : 'user is only for SASL'"
    }
    assert crd_reference.rule_message(rule) == "protocol `p` needs a user. Or: user is only for SASL."
    listed = {"messageExpression": "['a', 'b'].filter(k, k in self.m)[0] + ' is reserved'"}
    assert crd_reference.rule_message(listed) == "`<value>` is reserved."


# --- the chart's values -------------------------------------------------------------------------------


def test_every_value_of_the_chart_schema_is_in_the_helm_reference(generated: Mapping[Path, str]) -> None:
    schema = json.loads((ROOT / "charts" / "icefall" / "values.schema.json").read_text())
    text = generated[HELM_REFERENCE]

    def paths(node: Mapping[str, Any], path: str) -> Iterator[str]:
        for name, child in (node.get("properties") or {}).items():
            here = f"{path}.{name}" if path else name
            yield here
            if "$ref" not in child:
                yield from paths(child, here)

    for path in paths(schema, ""):
        assert f"| `{path}` |" in text, path
    for name, definition in schema.get("definitions", {}).items():
        if definition.get("properties"):
            assert f"## {name}\n" in text, name


def test_values_comments_defaults_and_examples() -> None:
    values = (
        "# A file comment, not a value's.\n"
        "# -- How many.\n# On two lines.\nreplicas: 1\n"
        "outer:\n  # -- Inner.\n  inner: x\n  plain: 2\n"
        "# -- A map. Example:\n#   outer:\n#     inner: y\nthing: {}\n"
    )
    described, examples = helm_reference.comments(values)
    assert described == {"replicas": "How many. On two lines.", "outer.inner": "Inner.", "thing": "A map."}
    assert examples == {"thing": "outer:\n  inner: y\n"}
    schema = {
        "type": "object",
        "required": ["replicas"],
        "definitions": {"port": {"type": "integer", "minimum": 1024}},
        "properties": {
            "replicas": {"type": "integer", "minimum": 0},
            "outer": {"type": "object", "properties": {
                "inner": {"type": "string"}, "plain": {"$ref": "#/definitions/port"}}},
            "thing": {"type": "object", "additionalProperties": {"type": "string"},
                      "description": "Schema's words."},
        },
    }  # fmt: skip
    text = helm_reference.render(schema, values)
    assert "| `replicas` | integer, **required** | `1` | How many. On two lines. Range: at least 0. |" in text
    assert "| `outer.plain` | integer | `2` | Range: at least 1024. |" in text
    assert "| `thing` | map[string]string | `{}` | A map. |" in text
    assert "```yaml\nouter:\n  inner: y\n```" in text
    yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])


# --- links ----------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_\[\]()]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose(path: Path) -> str:
    """The Markdown of `path` without code blocks and code spans (a `](x)` in code is no link)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.sub(r"``.+?``|`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_name_files_and_headings_that_exist(document: Path) -> None:
    text = prose(document)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (document.parent / file).resolve() if file else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, f"{document.relative_to(ROOT)}: " + "; ".join(broken)
