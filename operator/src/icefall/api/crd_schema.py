"""The pydantic models' JSON schema as a Kubernetes structural schema (the CRD's `openAPIV3Schema`).

- `$ref`s are inlined; a property's own description wins over the referenced model's docstring.
- `anyOf [X, null]` becomes X: an optional field is simply absent (no field is `nullable`, so `has()` in
  CEL means "set"). An explicit `null` is pruned on create/update (the models read the same default);
  server-side apply refuses it instead.
- `title` and `additionalProperties: false` are dropped: unknown fields are pruned by the API server, or
  refused by server-side apply and by clients asking for strict field validation (kubectl's default);
  maps keep `additionalProperties: <value schema>`; a free-form map or object (`dict[str, Any]`, a model
  with `extra="allow"`: the affinity terms and volume sources of `spec.pods`, whose full Kubernetes schemas
  would outweigh the rest of the CRD) becomes `x-kubernetes-preserve-unknown-fields: true`, beside any
  declared properties; a `const` becomes a one-value `enum`.
  Any keyword the conversion does not know makes it fail rather than emit something unchecked.
- Defaults: every scalar default of the models. An object field whose default is the model with its own
  defaults gets `default: {}`, so the API server fills in the nested defaults (`kubectl get -o yaml` shows
  the effective freshness target, starting position, ...). `None` and empty list/map defaults are left
  out: absent means the same. `elementRequired`/`valueRequired` get no server default because they only
  apply to lists and maps, and would otherwise be stored on every column.
- The recursive schema-field model is spelled out to `TYPED_SCHEMA_DEPTH` levels (top-level columns are
  level 1), not to `MAX_NESTING_DEPTH`: each level multiplies the nodes by four (fields, element, key,
  value), so eight levels would be ~22,000 copies and tens of megabytes, far over what etcd stores and
  what `kubectl explain` can load. Below that depth the parts are `x-kubernetes-preserve-unknown-fields`:
  kept as written, so the models (run by the operator and by `icefall run`) still see and check them.
- Column `type` strings get a pattern that mirrors the model's type parser (`TYPE_PATTERN`).
- The CEL rules of `icefall.api.crd_rules` go on the nodes and properties they name.

Guarantees: pure and deterministic; every property has a description.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from icefall.api.crd_rules import MODEL_RULES, PROPERTY_RULES, Rule
from icefall.api.schema import NESTED_TYPES, PRIMITIVE_TYPES

#: Levels of the recursive schema-field model spelled out in the CRD; deeper parts are kept unchecked.
TYPED_SCHEMA_DEPTH = 3
_RECURSIVE_MODELS = frozenset({"SchemaField", "TypeSpec"})
#: Fields without a server-side default (see the module docstring), as (model, property).
_NO_SERVER_DEFAULT = frozenset(
    {(model, field) for model in _RECURSIVE_MODELS for field in ("elementRequired", "valueRequired")}
)

# A type string as `icefall.api.schema.parse_type` accepts it for a spec (no `time`). Looser than the
# model on numbers (decimal precision and scale, fixed length), which the model checks.
_SPEC_TYPE_NAMES = [t for t in (*PRIMITIVE_TYPES, *NESTED_TYPES) if t != "time"]
TYPE_PATTERN = (
    r"^\s*("
    + "|".join(sorted(_SPEC_TYPE_NAMES, key=lambda t: (-len(t), t)))
    + r"|decimal\(\s*[0-9]+\s*,\s*[0-9]+\s*\)|fixed\[\s*[0-9]+\s*\])\s*$"
)
#: Patterns the models check in validators rather than declare, as (model, property) → pattern.
_EXTRA_PATTERNS: Mapping[tuple[str, str], str] = {
    ("SchemaField", "type"): TYPE_PATTERN,
    ("TypeSpec", "type"): TYPE_PATTERN,
}

# Keywords copied as they are (besides `x-kubernetes-*` extensions); any other keyword is an error.
_KEPT = frozenset(
    {
        "description",
        "type",
        "default",
        "enum",
        "format",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
    }
)
_FORMATS = frozenset({"date-time", "date", "int32", "int64", "byte", "duration"})


class _DefaultsFromFactories(GenerateJsonSchema):
    """Reports `default_factory` defaults too: a model instance as the fields that differ from its defaults
    (so `{}` for a plain `Model()`), a non-empty collection as itself; `None` and empty collections as no
    default at all."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        default = super().get_default_value(schema)
        factory = schema.get("default_factory")
        if default is NoDefault and factory is not None and not schema.get("default_factory_takes_data"):
            default = factory()  # type: ignore[call-arg]
        if isinstance(default, BaseModel):
            return default.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        if default is None or (isinstance(default, list | dict | tuple | set) and not default):
            return NoDefault
        return default


def _description(text: str) -> str:
    """Docstrings wrap lines inside paragraphs; join them, keep paragraph breaks."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


@dataclass
class _Converter:
    defs: Mapping[str, Any]
    used_rules: set[str | tuple[str, str]]

    def convert(self, node: Mapping[str, Any], *, model: str | None = None, depth: int = 0) -> dict[str, Any]:  # noqa: C901, PLR0912 (one branch per JSON Schema keyword)
        """Convert one schema node; `model` names the model whose definition `node` is (for rules)."""
        node = dict(node)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            if name in _RECURSIVE_MODELS:
                depth += 1
                if depth > TYPED_SCHEMA_DEPTH:
                    return self._unchecked(node.get("description") or self.defs[name].get("description", ""))
            # The property's own keywords (description, default) win over the definition's.
            return self.convert({**self.defs[name], **node}, model=name, depth=depth)
        if "anyOf" in node:
            choices = [c for c in node.pop("anyOf") if c != {"type": "null"}]
            if len(choices) != 1:
                raise ValueError(f"only 'X or null' unions can become a structural schema, got {choices}")
            return self.convert({**choices[0], **node}, model=model, depth=depth)
        if node.get("default", NoDefault) is None:
            del node["default"]
        if "const" in node:
            node["enum"] = [node.pop("const")]
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "$defs"):  # $defs: already inlined where referenced
                continue
            if key == "properties":
                out[key] = {
                    prop: self._property(model, prop, schema, depth) for prop, schema in value.items()
                }
            elif key == "items":
                out[key] = self.convert(value, depth=depth)
            elif key == "additionalProperties":
                if isinstance(value, dict) and value:
                    out[key] = self.convert(value, depth=depth)
                elif value is True or value == {}:  # free-form: kept as written (see the module docstring)
                    out["x-kubernetes-preserve-unknown-fields"] = True
                elif value is not False:
                    raise ValueError(f"additionalProperties: {value!r} has no structural form")
            elif key == "format":
                if value in _FORMATS:
                    out[key] = value
            elif key == "description":
                out[key] = _description(value)
            elif key in _KEPT or (key.startswith("x-kubernetes-") and key != "x-kubernetes-validations"):
                out[key] = copy.deepcopy(value)
            else:
                raise ValueError(f"JSON schema keyword {key!r} has no structural CRD form (model {model})")
        if "type" not in out:
            raise ValueError(f"schema without a type (model {model}): {node}")
        rules = self._rules(model, depth)
        if rules:
            out["x-kubernetes-validations"] = [r.to_dict() for r in rules]
        return out

    def _property(
        self, model: str | None, prop: str, schema: Mapping[str, Any], depth: int
    ) -> dict[str, Any]:
        converted = self.convert(schema, depth=depth)
        if model is None:
            return converted
        if (model, prop) in _NO_SERVER_DEFAULT:
            converted.pop("default", None)
        if (pattern := _EXTRA_PATTERNS.get((model, prop))) is not None:
            converted["pattern"] = pattern
        if rules := PROPERTY_RULES.get((model, prop)):
            self.used_rules.add((model, prop))
            converted.setdefault("x-kubernetes-validations", []).extend(r.to_dict() for r in rules)
        return converted

    def _rules(self, model: str | None, depth: int) -> tuple[Rule, ...]:
        if model is None or model not in MODEL_RULES:
            return ()
        if model == "SchemaField" and depth != 1:
            return ()  # see "Not guaranteed" in the module docstring
        self.used_rules.add(model)
        return MODEL_RULES[model]

    @staticmethod
    def _unchecked(description: str) -> dict[str, Any]:
        note = (
            f"From nesting level {TYPED_SCHEMA_DEPTH + 1} on, the API server stores this as written "
            "and the operator checks it."
        )
        return {
            "type": "object",
            "description": f"{_description(description)} {note}".strip(),
            "x-kubernetes-preserve-unknown-fields": True,
        }


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema as a Kubernetes structural schema, with the CEL rules of `icefall.api.crd_rules`.

    Raises `ValueError` for what has no structural form (unions other than "X or null", unknown keywords).
    """
    return convert(model)[0]


def convert(model: type[BaseModel]) -> tuple[dict[str, Any], set[str | tuple[str, str]]]:
    """`structural_schema`, and which rules of `icefall.api.crd_rules` it placed."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_DefaultsFromFactories)
    converter = _Converter(defs=raw.get("$defs", {}), used_rules=set())
    return converter.convert(raw, model=model.__name__), converter.used_rules
