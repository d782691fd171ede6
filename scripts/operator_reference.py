"""Write the provider's generated parameter reference into the README (``--check``: fail if stale).

    python scripts/operator_reference.py [--check]

The reference sits between ``<!-- provider-reference:begin -->`` and ``<!-- provider-reference:end -->``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_cdc.airflow.reference import reference
from airflow_cdc.readme import replace_section, write_or_check

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- provider-reference:begin -->", "<!-- provider-reference:end -->"


def rendered_readme(readme: str) -> str:
    return replace_section(readme, BEGIN, END, reference())


def main(argv: list[str]) -> int:
    stale = "README.md provider reference is stale: run python scripts/operator_reference.py"
    return write_or_check(ROOT / "README.md", rendered_readme, "--check" in argv, stale)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
