"""`icefall validate -f FILE...`: check StreamingTable manifests offline, before `kubectl apply` or a commit.

Each file is read as `icefall run` reads it (`icefall.api.load_manifest`: strict YAML, no duplicate keys, the
one StreamingTable document of the file) and validated by the pydantic models the CRD is generated from.
The models hold every check of the CRD's schema (types, enums, ranges, patterns, lengths) and of its CEL
rules (`icefall.api.crd_rules` mirrors the models' cross-field checks), and more (see `icefall.api.crd`:
checks that need the whole schema). A field set to null, which the models read as unset and the API
server refuses, is refused here too. tests/unit/test_cli_validate.py runs every case the real API server
refuses in tests/integration/test_crd_admission.py through this command.

With `--cluster`, also what the operator refuses although the API server accepts it: a table without
`spec.table.catalog` (the embedded catalog is pod-local), a Delta table whose `spec.table.location` is not
an object store or whose Spark master is Kubernetes (`plan.children.cluster_table_problem`), and the problems
the operator's rendering of the pods finds with its default settings (`plan.children`).

A Delta table at a local `spec.table.location` that exists already: `spec.format.schema` against the
table's schema (its `_delta_log`, read from the disk; `icefall.catalog.delta_schema`): what the table cannot
follow is a problem of `spec.format.schema`, what the next batch will change a note.

Guarantees: no network, no cluster, no credential read; every problem is one line `<field path>: <what is
wrong and what to do>`; exit code 0 when every file is valid, `EXIT_INVALID` (2) when one is not.
Not checked: the transition rules, which compare with the stored object (identity fields such as
spec.source.topic, spec.table.* cannot change: `self == oldSelf`), what depends on the cluster (the
Secrets a table references, the operator's pod policy and settings when they differ from the chart's
defaults), and an existing table's schema against the spec but for a local Delta table's (an Iceberg
table's is in its catalog; a `transforms.select`'s columns need Spark).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from icefall.commands.common import EXIT_INVALID

if TYPE_CHECKING:
    from icefall.api import StreamingTable


@dataclass(frozen=True)
class Checked:
    """The outcome for one file: the table it declares (when it parses) and its problems."""

    file: str
    name: str | None = None
    problems: tuple[tuple[str, str], ...] = ()  # (field path, what to do)
    notes: tuple[str, ...] = field(default=())

    @property
    def valid(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "name": self.name,
            "valid": self.valid,
            "problems": [{"path": path, "message": message} for path, message in self.problems],
            "notes": list(self.notes),
        }

    def render(self) -> str:
        if self.valid:
            lines = [f"{self.file}: valid (StreamingTable {self.name})"]
        else:
            lines = [f"{self.file}: INVALID"]
            lines += [
                f"  - {path}: {message}" if path else f"  - {message}" for path, message in self.problems
            ]
        return "\n".join([*lines, *(f"  note: {note}" for note in self.notes)])


def check_file(path: Path, *, cluster: bool = False) -> Checked:
    """Validate one manifest (see the module docstring)."""
    from icefall.api import ManifestError, load_manifest

    nulls = _nulls(path)
    try:
        st = load_manifest(path)
    except ManifestError as error:
        return Checked(str(path), problems=(*((p.path, p.message) for p in error.problems), *nulls))
    name = st.metadata.name
    problems = [*nulls, *(_cluster_problems(st) if cluster else [])]
    notes: list[str] = []
    schema_problems, schema_notes = _delta_schema(st)
    problems += schema_problems
    notes += schema_notes
    if not cluster and st.spec.table.catalog is None and st.spec.table.format.value != "delta":  # by location
        notes.append(
            "spec.table.catalog is not set: fine for `icefall run` (the embedded catalog), refused by the "
            "operator in a cluster (check with --cluster)"
        )
    return Checked(str(path), name, tuple(problems), tuple(notes))


def _delta_schema(st: StreamingTable) -> tuple[list[tuple[str, str]], list[str]]:
    """A local Delta table that exists: what of `spec.format.schema` it cannot follow (problems), and what
    its next batch changes (notes). Nothing for any other table (module doc)."""
    from icefall.api import TableFormat, to_spark_schema_json
    from icefall.commit.delta_storage import is_object_store

    spec = st.spec
    location = spec.table.location
    if spec.table.format is not TableFormat.DELTA or location is None or is_object_store(location):
        return [], []
    if not spec.format.schema_known or spec.transforms.select:
        return [], []
    from icefall.catalog.delta_schema import plan_delta_schema, spec_schema_against
    from icefall.commit.delta import DeltaLog

    try:
        table = DeltaLog(location).snapshot().schema_string
    except (OSError, ValueError) as error:  # unreadable: the run says why
        return [], [f"the Delta table at {location} could not be read ({error}); its schema is not checked"]
    if table is None:
        return [], []
    wanted = spec_schema_against(table, to_spark_schema_json(spec.format.schema_fields))
    plan = plan_delta_schema(
        table, wanted, source="spec.format.schema", relax_required=spec.format.type.uses_registry
    )
    problems = [("spec.format.schema", f"the Delta table at {location}: {line}") for line in plan.refused]
    notes = (
        [f"the Delta table at {location} changes with the next batch: {plan.describe()}"]
        if plan.changes
        else []
    )
    return problems, notes


def _nulls(path: Path) -> list[tuple[str, str]]:
    """Fields set to null in the file's StreamingTable. The models read null as "not set", but the API
    server refuses it under server-side apply (the CRD's schema makes no field nullable), and a client-side
    apply drops it silently: either way the file does not mean what it says."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    except (OSError, yaml.YAMLError):
        return []  # load_manifest says why
    tables = [d for d in documents if isinstance(d, dict) and d.get("kind") == "StreamingTable"]
    found: list[tuple[str, str]] = []

    def walk(value: Any, where: str) -> None:
        if value is None:
            found.append((where, "is null, which the API server refuses; remove the line (or give a value)"))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{where}[{index}]")

    if len(tables) == 1:
        walk(tables[0], "")
    return found


def _cluster_problems(st: StreamingTable) -> list[tuple[str, str]]:
    from icefall.plan.children import cluster_table_problem, desired_children
    from icefall.plan.settings import OperatorSettings

    children = desired_children(
        st,
        namespace=st.metadata.namespace or "default",
        uid="icefall-validate",
        generation=1,
        image="icefall",
        operator_settings=OperatorSettings(),
    )
    problems: list[tuple[str, str]] = []
    if (unrunnable := cluster_table_problem(st, spark_master=children.spark_master)) is not None:
        problems.append(unrunnable)
    problems += [(p.path, p.message) for p in children.problems]
    return problems


def validate(args: argparse.Namespace) -> int:
    """`icefall validate`: print each file's outcome (text or JSON); the exit code."""
    results = [check_file(Path(name), cluster=args.cluster) for name in args.file]
    if args.output == "json":
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print("\n".join(r.render() for r in results))
    return 0 if all(r.valid for r in results) else EXIT_INVALID
