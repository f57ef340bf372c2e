"""`python -m icefall.devstack.reference [ROOT]` (`make docs`): write docs/reference/*.md under ROOT (default:
the current folder, the repository's root)."""

from __future__ import annotations

import sys
from pathlib import Path

from icefall.devstack.reference import generate


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path.cwd()
    for path, text in generate(root).items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
