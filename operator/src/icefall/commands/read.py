"""`icefall read`: a union read (`icefall.ingest.union_read`) written as a text table, CSV, JSON lines
or Parquet.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from icefall.commands.common import catalog_for, load_table, state_dir, unreachable_is_one_line

READ_FORMATS = ("table", "csv", "jsonl", "parquet")


def read_rows(args: argparse.Namespace) -> int:
    """The table plus the topic after its snapshot up to a cut taken now (`icefall.ingest.union_read`):
    the cut to stderr, the rows to stdout or --output."""
    from icefall.ingest.union_read import ReadError, read_identifier, union_read

    if args.format == "parquet" and not args.output:
        raise SystemExit("--format parquet needs --output PATH")
    as_of = None
    if args.as_of:
        from datetime import datetime

        try:
            as_of = datetime.fromisoformat(args.as_of)
        except ValueError:
            raise SystemExit(f"--as-of {args.as_of!r} is not an ISO 8601 time") from None
    st = load_table(args)
    if st.spec.table.format.value == "delta":  # at its location, without a catalog
        return _read_delta(args, st, as_of)
    try:
        identifier = read_identifier(st, args.table)
    except ReadError as error:
        raise SystemExit(f"icefall: {error}") from None
    config = catalog_for(st, state_dir(args))
    with unreachable_is_one_line(st, config):
        config.pyiceberg().load_table(identifier)  # NoSuchTableError before Spark starts
        from icefall.plan.spark_conf import tool_conf
        from icefall.spark.session import build_spark_session

        print("[read] starting local Spark ...", file=sys.stderr, flush=True)
        spark = build_spark_session([config], extra_conf=tool_conf(st.metadata.name, "read"))
        try:
            result = union_read(
                st, config, snapshot_id=args.snapshot, as_of=as_of, spark=spark, table_name=args.table
            )
        except ReadError as error:
            raise SystemExit(f"icefall: {error}") from None
        with result:
            _write_result(args, spark, result)
    return 0


def _read_delta(args: argparse.Namespace, st: Any, as_of: Any) -> int:
    """`read_rows` of a Delta table (`icefall.ingest.delta_read`): its newest version, or `--snapshot`'s
    version, or the one committed at or before `--as-of`, plus the topic."""
    from icefall.api import TableFormat
    from icefall.commands.common import delta_location
    from icefall.ingest.delta_read import delta_union_read, delta_version
    from icefall.ingest.union_read import ReadError
    from icefall.plan.spark_conf import tool_conf
    from icefall.spark.session import build_spark_session

    own = ".".join(st.table_identifier)
    if args.table is not None and args.table != own:
        # --table picks among a routed table's destinations; a Delta table has no routes (refused).
        raise SystemExit(
            f"icefall: --table {args.table!r} is not a table {st.metadata.name} writes: a Delta table "
            f"has no routes, so --table can only name {own} (or leave it out); the dead-letter table is "
            "no union read (read it at its location with Spark or delta-rs, as `icefall verify` does)"
        )
    location = delta_location(st, state_dir(args))
    try:  # said before Spark starts
        version = delta_version(location, version=args.snapshot, as_of=as_of)
    except ReadError as error:
        raise SystemExit(f"icefall: {error}") from None
    print("[read] starting local Spark ...", file=sys.stderr, flush=True)
    conf = tool_conf(st.metadata.name, "read")
    spark = build_spark_session([], extra_conf=conf, table_format=TableFormat.DELTA)
    try:
        result = delta_union_read(st, location, spark=spark, version=version)
    except ReadError as error:
        raise SystemExit(f"icefall: {error}") from None
    with result:
        _write_result(args, spark, result)
    return 0


def _write_result(args: argparse.Namespace, spark: Any, result: Any) -> None:
    """The cut to stderr; the rows (through --sql, cut to --limit) as --format to stdout or --output."""
    for line in result.cut.render():
        print(line, file=sys.stderr, flush=True)
    frame = result.frame
    if args.sql:
        frame.createOrReplaceTempView("t")
        frame = spark.sql(args.sql)
    limit = args.limit if args.limit is not None else (TABLE_ROWS if args.format == "table" else None)
    if limit is not None:
        frame = frame.limit(limit)
    write_rows(frame, args.format, args.output)


TABLE_ROWS = 20  # rows `--format table` shows without --limit


def write_rows(frame: Any, form: str, output: str | None) -> None:
    """`frame`'s rows as `form` (READ_FORMATS) to `output`, else stdout."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name
    from pyspark.sql.types import ArrayType, MapType, StructType

    if form == "jsonl":
        _emit([*frame.toJSON().collect()], output)
    elif form == "table":
        _emit(table_text(frame.toArrow()), output)
    elif form == "csv":
        import pyarrow.csv as pacsv

        nested = (ArrayType, MapType, StructType)
        columns = [F.col(f"`{f.name}`") for f in frame.schema.fields]
        flat = frame.select(*[
            F.to_json(c).alias(f.name) if isinstance(f.dataType, nested) else c
            for f, c in zip(frame.schema.fields, columns, strict=True)
        ])  # fmt: skip
        pacsv.write_csv(flat.toArrow(), output if output else sys.stdout.buffer)
    else:
        import pyarrow.parquet as pq

        pq.write_table(frame.toArrow(), output)


def table_text(rows: Any) -> list[str]:
    """An Arrow table as aligned text: a header, a rule, one line per row."""
    names = list(rows.column_names)
    cells = [[_cell(v) for v in row.values()] for row in rows.to_pylist()]
    widths = [max([len(n), *(len(r[i]) for r in cells)]) for i, n in enumerate(names)]
    lines = [" | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.append(f"({len(cells)} rows)")
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def _emit(lines: Sequence[str], output: str | None) -> None:
    if output:
        Path(output).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return
    for line in lines:
        print(line)
    sys.stdout.flush()
