"""Runs inside a pod of the icefall image for hack/kind/test_kind.py: audits a StreamingTable's table against
its topic (what `icefall verify` does) until ingestion has caught up, printing one JSON line per attempt.

Usage: python table_probe.py MANIFEST TIMEOUT_SECONDS   (secrets from the ICEFALL_CATALOG_* variables, as
`icefall run -f` reads them). Exit 0 once every partition's committed offset is its high watermark and the
audit is clean (no duplicates, gaps or unexpected rows); 1 when the timeout passes first. It reaches Kafka,
the catalog and the object store only over the cluster's network, under the manifest's own addresses.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from icefall.api import load_manifest
from icefall.catalog import CatalogConfig
from icefall.cli import verify_table

EVERY_SECONDS = 5


def attempt(manifest: Path) -> dict[str, Any]:
    st = load_manifest(manifest)
    config = CatalogConfig.for_table(st.spec)
    try:
        report = verify_table(st, config, ingesting=True)
    except Exception as error:  # the table not created yet, the catalog not answering: try again
        return {"error": config.mask(f"{type(error).__name__}: {error}")}
    parts = report.partitions
    return {
        "ok": report.ok,
        "caught_up": bool(parts) and all(p.committed == p.high_watermark for p in parts),
        "rows": sum(p.in_table for p in parts),
        "dead_letters": sum(p.in_dlq for p in parts),
        "records": sum(p.expected for p in parts),
        "report": report.render(),
    }


def main(manifest: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        outcome = attempt(manifest)
        print(json.dumps(outcome), flush=True)
        if outcome.get("caught_up") and outcome.get("ok"):
            return 0
        if time.monotonic() > deadline:
            return 1
        time.sleep(EVERY_SECONDS)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2])))
