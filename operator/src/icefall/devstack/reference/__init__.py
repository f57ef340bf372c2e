"""The generated references under docs/reference/: the StreamingTable fields (`crd`, from the models'
CRD schema), the `icefall` commands and exit codes (`cli`, from the argparse parser) and the chart's
values (`helm`, from charts/icefall/values.schema.json and values.yaml).

Regenerate all three with `make docs` (`python -m icefall.devstack.reference`, run at the repository's
root); tests/unit/test_reference_docs.py fails, naming `make docs`, when a checked-in file differs from
what `generate` returns. Development tooling: the wheel leaves this package out.

Guarantees: `generate` is deterministic and reads only the code and the chart's two values files.
"""

from __future__ import annotations

import json
from pathlib import Path

FOLDER = Path("docs") / "reference"
CRD_REFERENCE = FOLDER / "streamingtable.md"
CLI_REFERENCE = FOLDER / "cli.md"
HELM_REFERENCE = FOLDER / "helm-values.md"
CHART = Path("charts") / "icefall"


def generate(root: Path) -> dict[Path, str]:
    """Each reference's path (relative to the repository) and text, from the checkout at `root`."""
    from icefall.api.crd import build_crd
    from icefall.cli import build_parser
    from icefall.devstack.reference import cli, crd, helm

    schema = json.loads((root / CHART / "values.schema.json").read_text())
    return {
        CRD_REFERENCE: crd.render(build_crd()),
        CLI_REFERENCE: cli.render(build_parser()),
        HELM_REFERENCE: helm.render(schema, (root / CHART / "values.yaml").read_text()),
    }
