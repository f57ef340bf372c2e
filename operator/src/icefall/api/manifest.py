"""Reading a StreamingTable manifest (YAML) with errors a person can act on.

`load_manifest` is used by the local runner (`icefall run -f table.yaml`) and by tests; the operator uses
`streaming_table_from_object` on the body the API server hands it, and `problems_from_validation_error`
when it validates pieces itself.

Guarantees:
- One `ManifestError` lists every problem found, each as `<dotted camelCase path>: <what is wrong and what
  to do>`, e.g. `spec.table.partitioning[0].transform: 'hourly' is not a transform; use one of identity,
  hour, day, month, year, bucket[N], truncate[W] (did you mean 'hour'?)`.
- Manifests must use the YAML (camelCase) field names, as the API server would require; duplicate keys,
  which YAML parsers silently collapse, are an error.
- The value of a secret-bearing field never appears in an error message.

Not guaranteed: cross-field problems are found only once every field is valid on its own (pydantic runs
model-level checks after field checks), so fixing one round of errors may reveal another.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from icefall.api.base import PATTERN_HINTS, PROBLEMS_ERROR_TYPE, Loc, format_loc
from icefall.api.pods import PodTemplates
from icefall.api.spec import API_VERSION, KIND, StreamingTable


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: where (dotted camelCase path) and what to do about it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(ValueError):
    """A manifest that cannot be used; `problems` lists everything wrong with it."""

    def __init__(self, problems: Sequence[Problem], *, origin: str | None = None) -> None:
        self.problems = tuple(problems)
        self.origin = origin
        where = f" ({origin})" if origin else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid StreamingTable manifest{where}:\n{lines}")


def load_manifest(source: str | os.PathLike[str]) -> StreamingTable:
    """Read a StreamingTable from a YAML file or YAML text.

    A `Path` (or any `os.PathLike`) is read as a file; a `str` containing a newline or starting with `{` is
    YAML text; any other `str` is a file path.
    """
    if isinstance(source, str) and ("\n" in source or source.lstrip().startswith("{")):
        return parse_manifest(source)
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ManifestError(
            [Problem("", f"cannot read {path}: {exc.strerror or exc}")], origin=str(path)
        ) from exc
    return parse_manifest(text, origin=str(path))


def parse_manifest(text: str, *, origin: str = "<text>") -> StreamingTable:
    """Parse the StreamingTable of a YAML text: its one document, or the one document of kind
    StreamingTable among several (a file for `kubectl apply` may carry its Secret too)."""
    try:
        documents = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError([_yaml_problem(exc)], origin=origin) from exc
    if len(documents) > 1:
        tables = [d for d in documents if isinstance(d, dict) and d.get("kind") == "StreamingTable"]
        documents = tables or documents
    if len(documents) != 1:
        found = "no document" if not documents else f"{len(documents)} documents"
        raise ManifestError(
            [Problem("", f"expected one StreamingTable document, found {found}")], origin=origin
        )
    return streaming_table_from_object(documents[0], origin=origin)


def streaming_table_from_object(obj: Any, *, origin: str | None = None) -> StreamingTable:
    """Validate a parsed manifest or API object (a mapping) into a `StreamingTable`."""
    if not isinstance(obj, Mapping):
        raise ManifestError(
            [
                Problem(
                    "", f"expected a mapping with apiVersion, kind, metadata and spec, got {_kind_of(obj)}"
                )
            ],
            origin=origin,
        )
    problems: list[Problem] = []
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if api_version is None:
        problems.append(Problem("apiVersion", f"is required; add apiVersion: {API_VERSION}"))
    elif api_version != API_VERSION:
        problems.append(
            Problem("apiVersion", f"{_show(api_version)} is not supported; use apiVersion: {API_VERSION}")
        )
    if kind is None:
        problems.append(Problem("kind", f"is required; add kind: {KIND}"))
    elif kind != KIND:
        problems.append(
            Problem("kind", f"{_show(kind)} is not a {KIND}; this file must declare kind: {KIND}")
        )
        raise ManifestError(problems, origin=origin)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    try:
        table = StreamingTable.model_validate(body, by_alias=True, by_name=False)
    except ValidationError as exc:
        problems.extend(problems_from_validation_error(exc))
    if problems:
        raise ManifestError(_dedupe(problems), origin=origin)
    return table


def pod_templates_from_object(obj: Any, *, origin: str) -> PodTemplates:
    """Validate `obj` (the shape of `spec.pods`, e.g. the operator's chart-wide defaults) into
    `PodTemplates`; a `ManifestError` names `origin` and each problem's path under `pods`."""
    try:
        return PodTemplates.model_validate(obj)
    except ValidationError as error:
        problems = problems_from_validation_error(error, model=PodTemplates, prefix=("pods",))
        raise ManifestError(problems, origin=origin) from None


def problems_from_validation_error(
    error: ValidationError, *, model: type[BaseModel] = StreamingTable, prefix: Loc = ()
) -> list[Problem]:
    """Turn pydantic's errors into `Problem`s with dotted camelCase paths and instructions.

    `model` is the model that was validated (used to look up field descriptions, enum choices and known
    field names); `prefix` is prepended to every path.
    """
    problems: list[Problem] = []
    for err in error.errors(include_url=False):
        loc: Loc = (*prefix, *err["loc"])
        if err["type"] == PROBLEMS_ERROR_TYPE:
            for sub_loc, message in err["ctx"]["problems"]:
                problems.append(Problem(format_loc((*loc, *sub_loc)), message))
            continue
        problems.append(Problem(format_loc(loc), _describe(err, model, tuple(err["loc"]))))
    return _dedupe(problems)


# --- messages ------------------------------------------------------------------------------------------


def _describe(err: Any, model: type[BaseModel], loc: Loc) -> str:  # noqa: C901, PLR0912 (one branch per pydantic error type)
    kind: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    value = err.get("input")
    annotation, info = _annotation_at(model, loc)
    if kind == "missing":
        about = _first_sentence(info.description) if info is not None and info.description else ""
        return "is required; add it" + (f" ({about})" if about else "")
    if kind == "extra_forbidden":
        return _unknown_field(model, loc)
    if kind in ("enum", "literal_error"):
        choices = _choices(annotation) or str(ctx.get("expected", ""))
        return f"{_show(value)} is not allowed; use one of {choices}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        word = {
            "greater_than_equal": "at least",
            "greater_than": "more than",
            "less_than_equal": "at most",
            "less_than": "less than",
        }[kind]
        bound = next(iter(ctx.values()))
        return f"must be {word} {bound}, got {_show(value)}"
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"must be at least {n} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"allows at most {ctx.get('max_length')} items; remove some"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        hint = PATTERN_HINTS.get(pattern, f"it must match {pattern}")
        return f"{_show(value)} is not valid; {hint}"
    if kind == "string_type":
        return f"expected a string, got {_kind_of(value)}; quote the value"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected a whole number, got {_show(value)}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {_show(value)}"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true or false, got {_show(value)}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping of fields (key: value), got {_kind_of(value)}"
    if kind == "list_type":
        return f"expected a list (one '- item' per entry), got {_kind_of(value)}"
    if kind.startswith(("datetime", "date_")):
        return f"expected an RFC 3339 time such as 2024-01-01T00:00:00Z, got {_show(value)}"
    if kind in ("inline_secret", "value_error", "assertion_error"):
        if "message" in ctx:
            return str(ctx["message"])
        message = str(err["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        return message
    return str(err["msg"])


def _unknown_field(model: type[BaseModel], loc: Loc) -> str:
    name = loc[-1]
    parent, _ = _annotation_at(model, loc[:-1])
    parent = _unwrap(parent)
    if not (isinstance(parent, type) and issubclass(parent, BaseModel)):
        return f"unknown field {name!r}; remove it"
    known = [info.alias or field for field, info in parent.model_fields.items()]
    if isinstance(name, str) and to_camel(name) in known and to_camel(name) != name:
        return f"unknown field {name!r}; field names are camelCase: write {to_camel(name)!r}"
    import difflib

    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field {name!r}; {hint}remove it or use one of: {', '.join(known)}"


def _annotation_at(model: type[BaseModel], loc: Loc) -> tuple[Any, FieldInfo | None]:
    """The type (and field info) found by following `loc` from `model`; `(None, None)` when lost."""
    current: Any = model
    info: FieldInfo | None = None
    for item in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            if not isinstance(item, str):
                return None, None
            info = next(
                (f for n, f in current.model_fields.items() if item in (n, f.alias)),
                None,
            )
            if info is None:
                return None, None
            current = info.annotation
        elif get_origin(current) is list and isinstance(item, int):
            current, info = get_args(current)[0], None
        elif get_origin(current) is dict and item != "[key]":
            current, info = get_args(current)[1], None
        else:
            return None, None
    return current, info


def _unwrap(annotation: Any) -> Any:
    if get_origin(annotation) is typing.Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return annotation


def _choices(annotation: Any) -> str:
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return ", ".join(str(m.value) for m in annotation)
    if get_origin(annotation) is typing.Literal:
        return ", ".join(str(a) for a in get_args(annotation))
    return ""


def _first_sentence(text: str) -> str:
    sentence = text.split(". ", maxsplit=1)[0].rstrip(".")
    return sentence[:120]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _dedupe(problems: Sequence[Problem]) -> list[Problem]:
    seen: set[Problem] = set()
    out: list[Problem] = []
    for p in problems:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


# --- YAML ----------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, Hashable):
            if key in seen and key != "<<":
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}; keep only one", key_node.start_mark
                )
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> Problem:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return Problem(where, f"not valid YAML: {problem}")
