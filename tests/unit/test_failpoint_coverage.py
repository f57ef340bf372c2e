"""The failpoint registry and the code agree, and every failpoint is named by a test.

Proves: each name in `failpoints.POINTS` occurs at a call site in the package (a literal
`"main.before-commit"`, or a per-table one `f"{role}.before-commit"`, which stands for `main.` and `dlq.`),
every such call site names a registered point, and each registered point is named in a test module other
than the failpoint unit tests (the module arming it checks it fired: the kill tests look for its
"failpoint <name> triggered" line, the in-process ones for its effect). Not proved: that a test naming a
point really reaches it at run time — each of those tests asserts that itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from icefall.runtime import failpoints

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "src" / "icefall"
SCOPES = "main|dlq|dlq-topic|lease|route"
# In the package: a string literal that is a whole name. In tests: a name anywhere (in specs too).
# A per-table point is `f"{role}.<point>"`; every point's name has a hyphen (`{path}.lock` is no point).
IN_CODE = re.compile(rf'"((?:{SCOPES})\.[a-z][a-z-]*|\{{[\w.]+\}}\.[a-z]+-[a-z-]+)"')
IN_TESTS = re.compile(rf"(?<![\w.-])((?:{SCOPES})\.[a-z][a-z-]*)")
NOT_USERS = {"test_failpoints.py", "test_failpoint_coverage.py"}


def names_in(text: str, pattern: re.Pattern[str] = IN_CODE) -> set[str]:
    """The failpoint names a source text spells, per-table f-strings expanded to both tables."""
    found: set[str] = set()
    for name in pattern.findall(text):
        if name.startswith("{"):
            point = name[name.index("}") + 2 :]
            found |= {f"{table}.{point}" for table in get_args(failpoints.TableRole)}
        else:
            found.add(name)
    return found


def test_every_registered_point_is_in_the_code_and_nothing_else() -> None:
    in_code: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "failpoints.py":
            continue
        for name in names_in(path.read_text()):
            in_code.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    assert set(failpoints.POINTS) - set(in_code) == set(), "registered, but no call site"
    assert set(in_code) - set(failpoints.POINTS) == set(), "a call site of an unregistered name"


def test_every_point_is_named_by_a_test() -> None:
    named: set[str] = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name not in NOT_USERS:
            named |= names_in(path.read_text(), IN_TESTS) & set(failpoints.POINTS)
    assert sorted(set(failpoints.POINTS) - named) == []
