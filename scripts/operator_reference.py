"""Write the provider's generated parameter reference into the docs site (``--check``: fail if stale).

    python scripts/operator_reference.py [--check]

The reference sits between ``<!-- provider-reference:begin -->`` and ``<!-- provider-reference:end -->``
of ``docs/reference/operators.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_cdc.airflow.reference import reference
from airflow_cdc.readme import replace_section, write_or_check

ROOT = Path(__file__).resolve().parents[1]
PAGE = Path("docs") / "reference" / "operators.md"
BEGIN, END = "<!-- provider-reference:begin -->", "<!-- provider-reference:end -->"


def rendered(page: str) -> str:
    return replace_section(page, BEGIN, END, reference())


def main(argv: list[str]) -> int:
    stale = f"{PAGE} provider reference is stale: run python scripts/operator_reference.py"
    return write_or_check(ROOT / PAGE, rendered, "--check" in argv, stale)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
