"""Least squares over the raw runs of bench/plan_once.py: CPU-s = design + per commit * commits + per
record * records, the commit and record terms shared by every design.

    python bench/plan_once_fit.py RESULTS.md [RESULTS.md ...] [--exclude icefall-c1]

A drain's CPU depends on how many batches the backlog was cut into (which the machine's load changes)
more than on the design, so designs are compared at the same commits and records: each design's fixed
term, with its standard error. A design whose cost per record differs (C1 only) breaks the shared terms:
exclude it. Pure Python (the bench's venv has no numpy).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

RUN = re.compile(r"^\| \d+ \| ([a-z0-9-]+) \| ([\d,]+) \| [\d.]+ \| ([\d.]+) \| [\d.]+ \| [\d,]+ \| (\d+) \|")


def solve(matrix: list[list[float]]) -> list[list[float]]:
    """Gauss-Jordan on an augmented matrix, in place; returns it reduced."""
    n = len(matrix)
    for i in range(n):
        pivot = max(range(i, n), key=lambda r: abs(matrix[r][i]))
        matrix[i], matrix[pivot] = matrix[pivot], matrix[i]
        scale = matrix[i][i]
        matrix[i] = [a / scale for a in matrix[i]]
        for r in range(n):
            if r != i:
                f = matrix[r][i]
                matrix[r] = [a - f * b for a, b in zip(matrix[r], matrix[i], strict=True)]
    return matrix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--exclude", default="", help="comma-separated designs left out")
    args = parser.parse_args()
    excluded = set(filter(None, args.exclude.split(",")))
    runs = [
        (m[1], int(m[2].replace(",", "")), float(m[3]), int(m[4]))
        for path in args.results
        for line in path.read_text().splitlines()
        if (m := RUN.match(line)) and m[1] not in excluded
    ]
    designs = sorted({r[0] for r in runs})
    xs = [[float(d == k) for k in designs] + [commits, n / 1e6] for d, n, _, commits in runs]
    ys = [cpu for _, _, cpu, _ in runs]
    k = len(xs[0])
    gram = [[sum(x[i] * x[j] for x in xs) for j in range(k)] for i in range(k)]
    reduced = solve(
        [[*row, sum(x[i] * y for x, y in zip(xs, ys, strict=True))] for i, row in enumerate(gram)]
    )
    coef = [row[k] for row in reduced]
    inverse = solve([row + [float(i == j) for j in range(k)] for i, row in enumerate(gram)])
    resid = [y - sum(c * v for c, v in zip(coef, x, strict=True)) for x, y in zip(xs, ys, strict=True)]
    sd = (sum(e * e for e in resid) / max(1, len(xs) - k)) ** 0.5
    se = [sd * inverse[i][k + i] ** 0.5 for i in range(k)]
    per_commit, per_million = coef[-2], coef[-1]
    print(f"{len(runs)} runs, residual sd {sd:.2f} CPU-s")
    print(
        f"per commit {per_commit:.2f} ± {se[-2]:.2f} CPU-s; per 1M records {per_million:.2f} ± {se[-1]:.2f}"
    )
    print("| design | runs | fixed CPU-s (± se) | 200,000 in 1 commit | 1,000,000 in 4 commits |")
    print("|---|--:|--:|--:|--:|")
    for i, design in enumerate(designs):
        runs_of = sum(1 for r in runs if r[0] == design)
        small = coef[i] + per_commit + 0.2 * per_million
        large = coef[i] + 4 * per_commit + per_million
        print(f"| {design} | {runs_of} | {coef[i]:.2f} ± {se[i]:.2f} | {small:.2f} | {large:.2f} |")


if __name__ == "__main__":
    main()
