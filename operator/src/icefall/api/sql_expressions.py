"""The Spark SQL of a spec (`spec.transforms.select` and `.filter`), confined to the record.

`expression_problem(text)` reads an expression with a small strict tokenizer (no JVM: the operator checks
it) and returns why it may not run, or None. An expression may use literals, columns, operators, lambdas
and calls of the functions in `ALLOWED_FUNCTIONS`: pure functions of the record's own values (string, math,
date and time, conditional, cast, array/map/struct accessors and higher-order functions, hashing, JSON and
CSV parsing of a column). Refused, each naming what was found:
- any other function: `reflect`, `java_method`, `try_reflect` (they call Java), `input_file_name`,
  `from_avro`/`from_protobuf`/`xpath` (they read files or URLs), `current_user`, `version` and other
  session facts, aggregates, window functions and generators (not record-local), UDF names, and
  qualified names (`catalog.db.fn(...)`, `builtin.reflect(...)`), quoted ones included;
- queries: `SELECT`, `FROM` (except inside `extract`, `substring`, `trim`, `overlay` and `IS DISTINCT
  FROM`), `TABLE`, `VALUES`, `WITH`, `LATERAL`;
- file reads by path (`` text.`/etc/passwd` ``, a backquoted name that is a path or a URL);
- comments, `;`, parameter markers and characters Spark's grammar has no use for in an expression, and a
  backslash before a quote inside a string (raw and escaped string literals would end it differently).

Not guaranteed: that Spark accepts the expression (syntax and types are checked when the pipeline starts)
or that it is cheap (a regular expression or `sequence` can still be slow or large: on the table's own
driver only).
"""

from __future__ import annotations

from dataclasses import dataclass

SECURITY_DOC = "docs/security.md"
RECORD_LOCAL = f"transforms may only use record-local functions (see {SECURITY_DOC})"

#: Pure functions of a record's own values (Spark 4.1's built-in names), by family.
ALLOWED_FUNCTIONS = frozenset(
    {
        # math and bits
        *("abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "bin", "bround", "cbrt"),
        *("ceil", "ceiling", "conv", "cos", "cosh", "cot", "csc", "degrees", "e", "exp", "expm1"),
        *("factorial", "floor", "greatest", "hex", "hypot", "least", "ln", "log", "log10", "log1p", "log2"),
        *("mod", "negative", "nanvl", "pi", "pmod", "positive", "pow", "power", "radians", "rint", "round"),
        *("sec", "sign", "signum", "sin", "sinh", "sqrt", "tan", "tanh", "unhex", "width_bucket", "div"),
        *("bit_count", "bit_get", "getbit", "shiftleft", "shiftright", "shiftrightunsigned", "isnan"),
        *("try_add", "try_divide", "try_mod", "try_multiply", "try_subtract", "nullifzero", "zeroifnull"),
        *("rand", "randn", "random", "uniform", "randstr", "uuid"),
        # strings
        *("ascii", "base64", "unbase64", "bit_length", "btrim", "char", "char_length", "character_length"),
        *("chr", "concat", "concat_ws", "contains", "decode", "encode", "elt", "endswith", "startswith"),
        *("find_in_set", "format_number", "format_string", "printf", "initcap", "instr", "lcase", "ucase"),
        *("lower", "upper", "left", "right", "len", "length", "levenshtein", "locate", "lpad", "rpad"),
        *("ltrim", "rtrim", "trim", "luhn_check", "mask", "octet_length", "overlay", "position", "quote"),
        *("regexp", "regexp_count", "regexp_extract", "regexp_extract_all", "regexp_instr", "regexp_like"),
        *("regexp_replace", "regexp_substr", "repeat", "replace", "reverse", "rlike", "like", "ilike"),
        *("sentences", "soundex", "space", "split", "split_part", "substr", "substring", "substring_index"),
        *("translate", "to_binary", "try_to_binary", "to_char", "to_varchar", "to_number", "try_to_number"),
        *("is_valid_utf8", "make_valid_utf8", "validate_utf8", "try_validate_utf8", "url_decode"),
        *("url_encode", "try_url_decode", "parse_url", "try_parse_url", "str_to_map", "collate", "collation"),
        # hashing and encryption of a value
        *("crc32", "hash", "md5", "sha", "sha1", "sha2", "xxhash64", "aes_encrypt", "aes_decrypt"),
        "try_aes_decrypt",
        # dates and times
        *("add_months", "convert_timezone", "curdate", "current_date", "current_time", "current_timestamp"),
        *("current_timezone", "date_add", "date_diff", "date_format", "date_from_unix_date", "date_part"),
        *("date_sub", "date_trunc", "dateadd", "datediff", "datepart", "day", "dayname", "dayofmonth"),
        *("dayofweek", "dayofyear", "extract", "from_unixtime", "from_utc_timestamp", "hour", "last_day"),
        *("localtimestamp", "make_date", "make_dt_interval", "make_interval", "make_time", "make_timestamp"),
        *("make_timestamp_ltz", "make_timestamp_ntz", "make_ym_interval", "minute", "month", "monthname"),
        *("months_between", "next_day", "now", "quarter", "second", "time_diff", "time_trunc"),
        *("timestamp_micros", "timestamp_millis", "timestamp_seconds", "to_date", "to_time", "to_timestamp"),
        *("to_timestamp_ltz", "to_timestamp_ntz", "to_unix_timestamp", "to_utc_timestamp", "trunc"),
        *("try_make_interval", "try_make_timestamp", "try_make_timestamp_ltz", "try_make_timestamp_ntz"),
        *("try_to_date", "try_to_time", "try_to_timestamp", "unix_date", "unix_micros", "unix_millis"),
        *("unix_seconds", "unix_timestamp", "weekday", "weekofyear", "year"),
        # conditionals and nulls
        *("coalesce", "if", "ifnull", "isnotnull", "isnull", "nullif", "nvl", "nvl2", "equal_null"),
        # casts and types
        *("cast", "try_cast", "bigint", "binary", "boolean", "date", "decimal", "double", "float", "int"),
        *("smallint", "string", "timestamp", "tinyint", "time", "typeof"),
        # arrays, maps, structs and their higher-order functions
        *("array", "array_append", "array_compact", "array_contains", "array_distinct", "array_except"),
        *("array_insert", "array_intersect", "array_join", "array_max", "array_min", "array_position"),
        *("array_prepend", "array_remove", "array_repeat", "array_size", "array_sort", "array_union"),
        *("arrays_overlap", "arrays_zip", "cardinality", "element_at", "try_element_at", "exists"),
        *("filter", "flatten", "forall", "get", "map", "map_concat", "map_contains_key", "map_entries"),
        *("map_filter", "map_from_arrays", "map_from_entries", "map_keys", "map_values", "map_zip_with"),
        *("named_struct", "sequence", "shuffle", "size", "slice", "sort_array", "struct", "transform"),
        *("transform_keys", "transform_values", "zip_with", "aggregate", "reduce"),
        # JSON, CSV and variant values held in a column
        *("from_json", "get_json_object", "json_array_length", "json_object_keys", "schema_of_json"),
        *("to_json", "from_csv", "schema_of_csv", "to_csv", "parse_json", "try_parse_json", "variant_get"),
        *("try_variant_get", "is_variant_null", "schema_of_variant", "to_variant_object"),
    }
)
#: Words that may stand before `(` without calling a function: operators, CASE parts, type names.
_KEYWORDS = frozenset(
    {
        *("and", "or", "not", "in", "is", "between", "when", "then", "else", "case", "end", "distinct"),
        *("escape", "div", "as", "for", "placing", "both", "leading", "trailing", "interval", "null"),
        "from",  # allowed only where `_check_query_word` says
        *("varchar", "dec", "numeric", "character"),
    }
)
#: Words that may stand before `(` only after LIKE (`x LIKE ANY ('a%', 'b%')`); elsewhere they aggregate.
_QUANTIFIERS = frozenset({"any", "some", "all"})
_LIKES = frozenset({"like", "ilike", "rlike"})
#: Words that start a query (a subquery reads other tables) or a join of generated rows.
_QUERY_WORDS = frozenset({"select", "from", "table", "values", "with", "lateral"})
#: Functions whose parentheses may hold FROM (`extract(year FROM ts)`, `trim(BOTH 'x' FROM s)`).
_FROM_FUNCTIONS = frozenset({"extract", "substring", "substr", "trim", "overlay"})
#: Spark's data sources, which as a qualifier of a backquoted path would read files (`` text.`/path` ``).
_DATA_SOURCES = frozenset(
    {"text", "parquet", "json", "csv", "orc", "avro", "binaryfile", "xml", "jdbc", "delta", "iceberg", "file"}
)
_PUNCTUATION = frozenset("+-*/%&|^~!<>=()[],.:")
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class _Token:
    kind: str  # word | backquoted (a name) | dquoted (a string, or a name under ANSI rules) | string | punct
    text: str  # a word as written, a quoted name's content, a punctuation character


class ExpressionError(ValueError):
    """Why an expression may not run (the message names what was found)."""


def expression_problem(text: str) -> str | None:
    """Why the Spark SQL expression `text` may not run as a transform, or None (module docstring)."""
    try:
        _check(_tokens(text))
    except ExpressionError as error:
        return str(error)
    return None


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif text.startswith(("--", "/*"), i):
            raise ExpressionError("comments are not allowed in a transform; remove them")
        elif char in _WORD_CHARS:
            end = i
            while end < len(text) and text[end] in _WORD_CHARS:
                end += 1
            tokens.append(_Token("word", text[i:end]))
            i = end
        elif char in "'\"":
            end = _string_end(text, i)
            kind = "dquoted" if char == '"' else "string"
            tokens.append(_Token(kind, text[i + 1 : end - 1]))
            i = end
        elif char == "`":
            end = text.find("`", i + 1)
            while end != -1 and text.startswith("``", end):
                end = text.find("`", end + 2)
            if end == -1:
                raise ExpressionError("a backquoted name is not closed; close it with `")
            tokens.append(_Token("backquoted", text[i + 1 : end].replace("``", "`")))
            i = end + 1
        elif char in _PUNCTUATION:
            tokens.append(_Token("punct", char))
            i += 1
        elif char == ";":
            raise ExpressionError("';' ends a statement: a transform is one expression; remove it")
        else:
            raise ExpressionError(
                f"{char!r} is not allowed in a transform expression: write names with letters, digits and _, "
                "or quote them with backticks"
            )
    return tokens


def _string_end(text: str, start: int) -> int:
    """The index after the string literal opening at `start` (backslash escapes, as Spark reads them)."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            if i + 1 < len(text) and text[i + 1] == quote:
                raise ExpressionError(
                    "a backslash before a quote inside a string is ambiguous (a raw string ends there); "
                    "use the other quote character around the string"
                )
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1
    raise ExpressionError(f"a string is not closed; close it with {quote}")


def _check(tokens: list[_Token]) -> None:
    calls: list[str] = []  # the function (or "") of each open parenthesis, innermost last
    for i, token in enumerate(tokens):
        before = tokens[i - 1] if i > 0 else None
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.kind == "backquoted" and _is_path(token.text, before, tokens[i - 2] if i > 1 else None):
            raise ExpressionError(
                f"`{token.text}` reads files by path: transforms read the record's columns only "
                f"(see {SECURITY_DOC})"
            )
        if token.kind == "word" and token.text.lower() in _QUERY_WORDS:
            _check_query_word(token.text, before, calls)
        if after is not None and after.text == "(" and after.kind == "punct" and token.kind != "punct":
            calls.append(_called(token, before))
        elif token.kind == "punct" and token.text == "(":
            if before is None or before.kind == "punct":
                calls.append("")
        elif token.kind == "punct" and token.text == ")" and calls:
            calls.pop()


def _called(token: _Token, before: _Token | None) -> str:
    """The function a name followed by `(` calls ("" for a keyword); raises when it is not allowed."""
    name = token.text.lower()
    if token.kind == "word" and name in _KEYWORDS:
        return ""
    if token.kind == "word" and name in _QUANTIFIERS and before is not None and before.text.lower() in _LIKES:
        return ""
    if token.kind == "string":
        return ""  # a literal before "(" is a syntax error, not a call
    if before is not None and before.kind == "punct" and before.text == ".":
        raise ExpressionError(
            f"function {token.text} is called by a qualified name (catalog.schema.function): transforms may "
            f"only call record-local functions, by their plain names (see {SECURITY_DOC})"
        )
    if name not in ALLOWED_FUNCTIONS:
        raise ExpressionError(f"function {token.text} is not allowed: {RECORD_LOCAL}")
    return name


def _check_query_word(word: str, before: _Token | None, calls: list[str]) -> None:
    lowered = word.lower()
    if lowered == "from":
        if before is not None and before.kind == "word" and before.text.lower() == "distinct":
            return  # a IS [NOT] DISTINCT FROM b
        if calls and calls[-1] in _FROM_FUNCTIONS:
            return  # extract(year FROM ts), trim(BOTH 'x' FROM s), substring(s FROM 2 FOR 3)
    raise ExpressionError(
        f"{word.upper()} is not allowed: a transform is an expression over the record, not a query of "
        f"other tables (see {SECURITY_DOC})"
    )


def _is_path(name: str, before: _Token | None, qualifier: _Token | None) -> bool:
    """A backquoted name that is a path or URL, or holds a '/' and is qualified by a data source
    (`` text.`data/x.txt` ``)."""
    if name.startswith("/") or "://" in name:
        return True
    return (
        "/" in name
        and before is not None
        and before.text == "."
        and qualifier is not None
        and qualifier.kind == "word"
        and qualifier.text.lower() in _DATA_SOURCES
    )
