"""Z-order values of rows: the order the compaction pods' merge writes a Delta table's rows in when the
table has a sort order (`spec.table.sortOrder`; commit/DESIGN.md, "Compaction pods for Delta tables on S3").

`zorder_values(columns)` gives each row one unsigned 64-bit value over `columns` (one Arrow array per sort
column, all of one length): each column's values are ranked among these rows (dense ranks, ascending,
nulls last — any type Arrow orders: numbers, strings, binary, dates, timestamps, decimals, booleans; NaN
after every number, before null), each rank is scaled to fill `bits` bits (a column with d distinct
values uses the top ceil(log2 d) of them, so every column splits its own range in halves at each level,
however few values it has), and the bits of the columns are interleaved, most significant first, the
first column's bit leading each level. `zorder_indices(columns)` is the stable sort of the rows by it.

Guarantees: equal values give equal buckets (ties never split); one column gives exactly the plain sort by
it (nulls last, ties in input order) while it has at most 2**bits distinct values (2**32 by default);
rows whose ranks share their top t bits in every column are contiguous in the order (the Z-curve's
locality: with two columns of 8 values each, every 16 consecutive rows of 64 form one 4 x 4 quadrant).
Not guaranteed: that the values of different calls compare (ranks are of these rows only); with more
distinct values than 2**bits, adjacent values share a bucket (kept in input order within it); columns
beyond the 64th get no bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

#: Bits per column: 64 shared by the columns, at most 32 each (a merge holds far fewer than 2**32 rows);
#: fewer when no column has that many distinct values (the order is the same, the work less).
MAX_BITS = 32
WORD_BITS = 64


def default_bits(columns: int) -> int:
    """The bits each of `columns` sort columns gets in a 64-bit value."""
    return max(1, min(MAX_BITS, WORD_BITS // max(1, columns)))


def dense_ranks(column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, int]:
    """Each value's dense rank among `column`'s (0-based, ascending, nulls last) and the bits the largest
    rank needs (at least 1)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if len(column) == 0:
        return pa.array([], pa.uint64()), 1
    ranks = pc.subtract(
        pc.rank(column, sort_keys=[("", "ascending", "at_end")], tiebreaker="dense").cast(pa.uint64()),
        pa.scalar(1, pa.uint64()),
    )
    return ranks, max(1, int(pc.max(ranks).as_py()).bit_length())


def zorder_values(columns: Sequence[pa.Array | pa.ChunkedArray], *, bits: int | None = None) -> pa.Array:
    """The Z-value of each row over `columns` (module doc); `bits` per column (default: as many as the
    column with the most distinct values needs, at most `default_bits`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    used = list(columns)[:WORD_BITS]
    if not used:
        raise ValueError("a Z-order needs at least one column")
    lengths = {len(c) for c in used}
    if len(lengths) != 1:
        raise ValueError(f"the columns of a Z-order differ in length: {sorted(lengths)}")
    ranked = [dense_ranks(c) for c in used]
    width = min(default_bits(len(used)), max(n for _, n in ranked)) if bits is None else bits
    if not 1 <= width * len(used) <= WORD_BITS:
        raise ValueError(f"{len(used)} columns of {width} bits do not fit in {WORD_BITS} bits")
    # Each rank scaled to fill `width` bits; a column with more values than that loses its low bits.
    buckets = [
        (pc.shift_left(r, pa.scalar(width - n, pa.uint64())), width - n)
        if n <= width
        else (pc.shift_right(r, pa.scalar(n - width, pa.uint64())), 0)
        for r, n in ranked
    ]
    one = pa.scalar(1, pa.uint64())
    value = pa.repeat(pa.scalar(0, pa.uint64()), lengths.pop())
    for level in range(width - 1, -1, -1):  # most significant first
        for i, (bucket, zeros) in enumerate(buckets):
            if level < zeros:
                continue  # below a scaled column's ranks: always 0
            bit = pc.bit_wise_and(pc.shift_right(bucket, pa.scalar(level, pa.uint64())), one)
            position = level * len(used) + (len(used) - 1 - i)  # the first column leads each level
            value = pc.bit_wise_or(value, pc.shift_left(bit, pa.scalar(position, pa.uint64())))
    return value


def zorder_indices(columns: Sequence[pa.Array | pa.ChunkedArray], *, bits: int | None = None) -> pa.Array:
    """The row indices in Z-order over `columns`: a stable sort by `zorder_values` (ties in input order)."""
    import pyarrow.compute as pc

    return pc.sort_indices(zorder_values(columns, bits=bits))
