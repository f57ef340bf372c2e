"""Markdown pieces the generated references share: table cells that survive any text, code spans, and
the values and constraints of a JSON schema node in words.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Patterns longer than this are named, not shown: they are for the API server, not for reading.
LONGEST_SHOWN_PATTERN = 100


def cell(text: str) -> str:
    """`text` as one Markdown table cell: pipes escaped, paragraphs apart, lines joined."""
    paragraphs = [" ".join(p.split()) for p in text.replace("|", "\\|").split("\n\n")]
    return "<br><br>".join(p for p in paragraphs if p)


def code(text: str) -> str:
    """`text` as a code span, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def value(data: Any) -> str:
    """A default or an enum value as YAML users write it (compact JSON; strings bare)."""
    if isinstance(data, str):
        return code(data) if data else '`""`'
    return code(json.dumps(data, separators=(", ", ": "), ensure_ascii=False))


def constraints(node: Mapping[str, Any]) -> list[str]:
    """The validation keywords of one schema node, as short sentences."""
    said: list[str] = []
    if "enum" in node:
        said.append("One of: " + ", ".join(value(v) for v in node["enum"]) + ".")
    if "const" in node:
        said.append(f"Always {value(node['const'])}.")
    said += _bounds(node, "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "Range", "")
    said += _bounds(node, "minLength", "maxLength", None, None, "Length", " characters")
    said += _bounds(node, "minItems", "maxItems", None, None, "Items", "")
    said += _bounds(node, "minProperties", "maxProperties", None, None, "Keys", "")
    if "pattern" in node:
        pattern = str(node["pattern"])
        shown = code(pattern) if len(pattern) <= LONGEST_SHOWN_PATTERN else "a pattern (see the schema)"
        said.append(f"Matches {shown}.")
    if "format" in node:
        said.append(f"Format {code(str(node['format']))}.")
    return said


def _bounds(  # noqa: PLR0917 (one call per keyword family)
    node: Mapping[str, Any],
    low: str,
    high: str,
    low_exclusive: str | None,
    high_exclusive: str | None,
    what: str,
    unit: str,
) -> list[str]:
    """E.g. "Range: 1 to 3600.", "Length: at most 253 characters.", "Items: at least 1."."""
    lowest = node.get(low)
    highest = node.get(high)
    above = node.get(low_exclusive) if low_exclusive else None
    below = node.get(high_exclusive) if high_exclusive else None
    if lowest is not None and lowest == highest:
        text = f"exactly {lowest}"
    elif lowest is not None and highest is not None:
        text = f"{lowest} to {highest}"
    else:
        parts = []
        if lowest is not None:
            parts.append(f"at least {lowest}")
        if above is not None:
            parts.append(f"above {above}")
        if highest is not None:
            parts.append(f"at most {highest}")
        if below is not None:
            parts.append(f"below {below}")
        text = " and ".join(parts)
    return [f"{what}: {text}{unit}."] if text else []
