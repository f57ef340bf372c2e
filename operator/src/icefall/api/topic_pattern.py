"""`spec.source.topicPattern`: which topic names a pattern selects, and which patterns are refused.

Matching (`selects`): the whole name must match, as in Kafka's own pattern subscription (the Java consumer's
`subscribe(Pattern)`, Kafka Connect's `topics.regex`: `Matcher.matches()`); checked with Python's
`re.fullmatch`, so a pattern uses the syntax Java and Python share (classes, alternation, groups, quantifiers,
`(?i)`). Kafka's internal topics (`KAFKA_INTERNAL_TOPICS`) never match; another name starting with '_' (a
tool's internal topic, such as a schema registry's `_schemas`) matches only a pattern that starts with a
literal '_': a pattern such as `.*` does not take them by accident.

Refused (`pattern_problem`, a message for `spec.source.topicPattern`): a pattern that does not compile, one
longer than `MAX_PATTERN_LENGTH`, backreferences, and nested quantifiers (a group repeated without bound
that repeats inside: `(a+)+`, `(\\w*)*`, `(x{2,}){3,}`), the cheap-to-detect cause of exponential
backtracking; a bounded outer repeat (`([a-z]+-){2}`) is allowed. Not detected: overlapping alternatives
under a repeat (`(a|a)*`); a topic name has at most 249 characters and the pattern runs only when the topic
list is read (`icefall.kafka.topic_set`), which bounds what such a pattern costs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Longest pattern accepted (a bound for the CRD and for the cost of the checks below).
MAX_PATTERN_LENGTH = 256

#: Kafka's own internal topics (broker state no table wants): never selected by a pattern.
KAFKA_INTERNAL_TOPICS = frozenset({
    "__consumer_offsets",
    "__transaction_state",
    "__share_group_state",
    "__remote_log_metadata",
})  # fmt: skip

_BACKREFERENCE = "backreferences are not allowed in a pattern; remove them"
_NESTED = (
    "nested quantifiers ({where!r}: a group repeated without bound that repeats inside) can take "
    "exponential time; write the group without the inner quantifier or without the outer one"
)

_QUANTIFIER = re.compile(r"\*|\+|\?|\{(\d*)(,?)(\d*)\}")


def compiled(pattern: str) -> re.Pattern[str]:
    """`pattern` compiled (it passed `pattern_problem`)."""
    return re.compile(pattern)


def selects(pattern: re.Pattern[str], topic: str) -> bool:
    """Whether `pattern` selects `topic` (module doc: whole-name match, internal topics left out)."""
    if topic in KAFKA_INTERNAL_TOPICS:
        return False
    if topic.startswith("_") and not pattern.pattern.startswith(("_", "\\_")):
        return False
    return pattern.fullmatch(topic) is not None


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with `pattern` as a topic pattern, and the fix; None if nothing."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"at most {MAX_PATTERN_LENGTH} characters; shorten the pattern"
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as error:
        return f"not a valid regular expression ({error}); fix it (the whole topic name must match)"
    return costly_problem(pattern)


@dataclass
class _Group:
    repeats: bool = False  # a quantifier that repeats (*, +, {n,} or {n,m} with m > 1) applies inside


def costly_problem(pattern: str) -> str | None:
    """Backreferences and nested quantifiers (module doc), found by one scan of a pattern that compiles:
    what makes a regex from a spec take exponential time, wherever it runs (also `dynamicRoute.pattern`)."""
    groups = [_Group()]
    closed: _Group | None = None  # the group that ended just before this position, if any
    i = 0
    while i < len(pattern):
        char = pattern[i]
        after_group, closed = closed, None
        if char == "\\":
            if pattern[i + 1 : i + 2].isdigit() and pattern[i + 1] != "0":
                return _BACKREFERENCE
            i += 2
            continue
        if char == "[":
            i = _class_end(pattern, i)
            continue
        if char == "(":
            if pattern.startswith("(?P=", i):
                return _BACKREFERENCE
            groups.append(_Group())
        elif char == ")":
            closed = groups.pop()
            groups[-1].repeats |= closed.repeats
        elif (quantifier := _QUANTIFIER.match(pattern, i)) is not None:
            repeats, unbounded = _repeats(quantifier)
            if repeats:
                if unbounded and after_group is not None and after_group.repeats:
                    return _NESTED.format(where=pattern[: quantifier.end()][-40:])
                groups[-1].repeats = True
            i = quantifier.end()
            continue
        i += 1
    return None


def _repeats(quantifier: re.Match[str]) -> tuple[bool, bool]:
    """Whether the quantifier repeats (matches more than once), and whether without bound."""
    text = quantifier.group(0)
    if text in ("*", "+"):
        return True, True
    if text == "?":
        return False, False
    low, comma, high = quantifier.groups()
    if not comma:
        return int(low or 0) > 1, False
    return not high or int(high) > 1, not high


def _class_end(pattern: str, start: int) -> int:
    """The index after the character class that opens at `start` (`[...]`, `[^]...]`, escapes inside)."""
    i = start + 1
    if pattern[i : i + 1] == "^":
        i += 1
    if pattern[i : i + 1] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1
